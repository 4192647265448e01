//! jext4: a userspace ext2/ext3/ext4 filesystem with a real JBD2 journal.

pub mod engine;
mod error;

mod api;

pub use api::{
    DirBuilder, DirEntry, File, FileType, Image, ImageOptions, Metadata, OpenOptions, ReadDir, Walk,
};
pub use engine::dev::{BlockDevice, MemoryDevice};
pub use error::{Error, Location, Result};

// The layers under their old names, so that `crate::fs::…` paths inside
// the crate read as they did before `engine` gathered them. Some are
// only named by tests or by code that a feature set leaves out.
#[allow(unused_imports)]
#[cfg(feature = "crashtest")]
use engine::crash;
#[allow(unused_imports)]
#[cfg(feature = "fuse")]
use engine::fuse;
#[allow(unused_imports)]
use engine::{cache, dev, faults, format, fs, hash, journal, lock, rng, tools};
