//! jext4: a userspace ext2/ext3/ext4 filesystem with a real JBD2 journal.
//!
//! Layers, bottom up (see DESIGN.md): `dev` (block devices) → `cache`
//! (metadata buffers) → `journal` (transactions) → `format` (on-disk
//! structures) → `fs` (filesystem operations) → front ends `fuse` and `api`.

pub mod cache;
pub mod crash;
pub mod dev;
pub mod error;
#[doc(hidden)]
pub mod faults;
pub mod format;
pub mod hash;
pub mod journal;
pub mod lock;

pub use api::{
    DirBuilder, DirEntry, File, FileType, Image, ImageOptions, Metadata, OpenOptions, ReadDir, Walk,
};
pub use error::{Error, Result};
pub mod api;
pub mod fs;
pub mod fuse;
pub mod tools;
