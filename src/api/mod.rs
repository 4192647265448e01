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
//! ```no_run
//! use std::io::{self, Read, Write};
//! fn main() -> io::Result<()> {
//!     let image = jext4::Image::open("disk.img")?;
//!     image.create_dir_all("/etc/app")?;
//!     image.write("/etc/app/config", b"key = value\n")?;
//!     image.rename("/etc/app/config", "/etc/app/config.old")?;
//!     assert_eq!(image.read("/etc/app/config.old")?, b"key = value\n");
//!     let mut log = image.open_with(
//!         "/etc/app/log",
//!         jext4::OpenOptions::new().append(true).create(true),
//!     )?;
//!     log.write_all(b"started\n")?;
//!     log.sync_data()?; // durable from here
//!     for entry in image.read_dir("/etc/app")? {
//!         let entry = entry?;
//!         println!("{:?}: {} bytes", entry.file_name(), entry.metadata()?.len());
//!     }
//!     let mut text = String::new();
//!     image.open_file("/etc/app/log")?.read_to_string(&mut text)?;
//!     match image.metadata("/etc/missing") {
//!         Err(error) if error.kind() == io::ErrorKind::NotFound => {}
//!         other => panic!("{:?}", other.map(|_| ())),
//!     }
//!     drop(log);
//!     image.close()?; // clean: no journal replay needed
//!     Ok(())
//! }
//! ```

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
pub use options::{DirBuilder, ImageOptions, OpenOptions};

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
