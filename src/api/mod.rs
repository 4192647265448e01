//! The library front end: an ext2/3/4 image opened in this process,
//! without FUSE and without root, through calls shaped like `std::fs`.
//!
//! | std                        | jext4                                 |
//! |----------------------------|---------------------------------------|
//! | `File::open(p)`            | `image.open_file(p)`                  |
//! | `File::create(p)`          | `image.create_file(p)`                |
//! | `OpenOptions::…open(p)`    | `image.open_with(p, OpenOptions::…)`  |
//! | `fs::read_dir(p)`          | `image.read_dir(p)`                   |
//! | `fs::metadata(p)`, …       | `image.metadata(p)`, …                |
//!
//! One file per job: `image` (opening and closing, the path operations),
//! `file` (`File`), `dir` (`ReadDir`, `DirEntry`, `Walk`), `metadata`
//! (`Metadata`, `FileType`), `options` (`ImageOptions`, `OpenOptions`,
//! `DirBuilder`), `path` (paths as bytes). Errors are `jext4::Error`
//! (`src/error.rs`), which converts into `std::io::Error` with the
//! kernel's errno, so `?` works in functions returning `io::Result`.
//!
//! The crate root re-exports all of it; the crate documentation
//! (`src/lib.rs`) is the tour, with runnable examples.

mod dir;
mod file;
mod image;
mod metadata;
mod options;
mod path;

pub use dir::{DirEntry, ReadDir, Walk};
pub use file::File;
pub use image::Image;
pub use metadata::{FileType, Metadata};
pub use options::{DirBuilder, ImageOptions, OpenOptions, VerityOptions};

/// `FS_CASEFOLD_FL` (`chattr +F`): the directory's names match whatever
/// their case ([`Image::set_flags`]).
pub const CASEFOLD_FL: u32 = 0x4000_0000;
/// `FS_PROJINHERIT_FL` (`chattr +P`): new entries of the directory take
/// its project id ([`Image::set_flags`]).
pub const PROJINHERIT_FL: u32 = 0x2000_0000;
/// `FS_JOURNAL_DATA_FL` (`chattr +j`): the file's data is logged in the
/// journal with its metadata, as with `-o data=journal`, on an image
/// opened without delayed allocation ([`Image::set_flags`]).
pub const JOURNAL_DATA_FL: u32 = 0x0000_4000;

/// Compile-time proof that an image and its files can be shared between
/// threads (std's `File` is `Send + Sync`; so are these).
const _: () = {
    const fn shareable<T: Send + Sync>() {}
    shareable::<Image>();
    shareable::<File>();
    shareable::<ReadDir>();
    shareable::<DirEntry>();
    shareable::<Walk>();
    shareable::<Metadata>();
};
