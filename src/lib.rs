//! jext4: ext2, ext3 and ext4 images opened inside your program, with a
//! real JBD2 journal, through calls shaped like `std::fs`.
//!
//! No FUSE, no root, no loop device: an [`Image`] is an image file, block
//! device or NBD export opened in this process. Its methods are std's
//! path functions with the image as the receiver (`fs::read_dir(p)` is
//! `image.read_dir(p)`, `File::create(p)` is `image.create_file(p)`), and
//! what they hand out — [`File`], [`ReadDir`], [`DirEntry`], [`Walk`],
//! [`Metadata`] — has std's methods and traits. Every change is journaled
//! as the Linux kernel journals it, so the kernel, `e2fsck` and jext4 all
//! recover the image after a crash.
//!
//! | std                          | jext4                                  |
//! |------------------------------|----------------------------------------|
//! | `File::open(p)`              | `image.open_file(p)`                   |
//! | `File::create(p)`            | `image.create_file(p)`                 |
//! | `OpenOptions::…open(p)`      | `image.open_with(p, OpenOptions::…)`   |
//! | `fs::read_dir(p)`            | `image.read_dir(p)`                    |
//! | `fs::metadata(p)`, `fs::rename(a, b)`, … | `image.metadata(p)`, `image.rename(a, b)`, … |
//!
//! # Open an image
//!
//! [`Image::open`] opens read-write and replays the journal if a crash
//! left one to replay; [`Image::open_read_only`] writes nothing;
//! [`Image::options`] sets the cache size, the commit interval, the umask
//! and the rest ([`ImageOptions`]); [`Image::from_device`] opens any
//! [`BlockDevice`], an in-memory [`MemoryDevice`] for one.
//!
//! ```
//! use std::process::Command;
//!
//! fn main() -> std::io::Result<()> {
//!     // An empty ext4 image of 8 MiB, made by e2fsprogs.
//!     let path = std::env::temp_dir().join(format!("jext4-tour-{}.img", std::process::id()));
//!     let made = Command::new("mke2fs")
//!         .args(["-q", "-F", "-t", "ext4"])
//!         .arg(&path)
//!         .arg("8M")
//!         .output()?;
//!     assert!(made.status.success());
//!
//!     let image = jext4::Image::open(&path)?;
//!     image.create_dir_all("/etc/app")?;
//!     image.write("/etc/app/config", "key = value\n")?;
//!     image.close()?; // everything written out, the image marked clean
//! #   std::fs::remove_file(&path)?;
//!     Ok(())
//! }
//! ```
//!
//! # Read and write
//!
//! [`Image::read`], [`Image::read_to_string`] and [`Image::write`] take
//! whole files; [`Image::open_file`], [`Image::create_file`] and
//! [`Image::open_with`] (with an [`OpenOptions`]) give a [`File`], which
//! is `Read`, `Write`, `Seek` and `std::os::unix::fs::FileExt`. A `File`
//! owns a share of its image: it has no lifetime, and it and the image
//! are `Send + Sync`.
//!
//! ```
//! use std::io::{Read, Seek, SeekFrom, Write};
//! use std::os::unix::fs::FileExt;
//! # let path = std::env::temp_dir().join(format!("jext4-doc-crate-rw-{}.img", std::process::id()));
//! # let made = std::process::Command::new("mke2fs").args(["-q", "-F", "-t", "ext4"]).arg(&path).arg("8M").output()?;
//! # assert!(made.status.success(), "mke2fs: {made:?}");
//! let image = jext4::Image::open(&path)?;
//!
//! let mut log = image.open_with(
//!     "/app.log",
//!     jext4::OpenOptions::new().append(true).create(true),
//! )?;
//! log.write_all(b"started\n")?;
//! log.write_all(b"ready\n")?;
//!
//! let mut text = String::new();
//! image.open_file("/app.log")?.read_to_string(&mut text)?;
//! assert_eq!(text, "started\nready\n");
//!
//! let mut file = image.create_file("/data")?;
//! file.write_all(b"hello world")?;
//! file.seek(SeekFrom::Start(6))?;
//! file.write_all(b"there")?;
//! let mut word = [0u8; 5];
//! image.open_file("/data")?.read_exact_at(&mut word, 6)?;
//! assert_eq!(&word, b"there");
//! assert_eq!(image.read("/data")?, b"hello there");
//! # std::fs::remove_file(&path)?;
//! # Ok::<(), std::io::Error>(())
//! ```
//!
//! # Walk a directory
//!
//! [`Image::read_dir`] lists one directory, reading it as it goes (memory
//! stays bounded whatever its size); [`Image::walk`] goes through a whole
//! tree depth first. Entries give their name, path, type and
//! [`Metadata`].
//!
//! ```
//! # let path = std::env::temp_dir().join(format!("jext4-doc-crate-walk-{}.img", std::process::id()));
//! # let made = std::process::Command::new("mke2fs").args(["-q", "-F", "-t", "ext4"]).arg(&path).arg("8M").output()?;
//! # assert!(made.status.success(), "mke2fs: {made:?}");
//! let image = jext4::Image::open(&path)?;
//! image.create_dir_all("/srv/www")?;
//! image.write("/srv/www/index.html", "<h1>hi</h1>\n")?;
//!
//! for entry in image.read_dir("/srv/www")? {
//!     let entry = entry?;
//!     println!("{:?}: {} bytes", entry.file_name(), entry.metadata()?.len());
//! }
//! let mut files = Vec::new();
//! for entry in image.walk("/srv")? {
//!     let entry = entry?;
//!     if entry.file_type()?.is_file() {
//!         files.push(entry.path());
//!     }
//! }
//! assert_eq!(files, [std::path::Path::new("/srv/www/index.html")]);
//! # std::fs::remove_file(&path)?;
//! # Ok::<(), std::io::Error>(())
//! ```
//!
//! # Errors
//!
//! Every operation returns a [`Result`] whose [`Error`] is typed: match
//! on its variants ([`Error::NotFound`], [`Error::Corrupt`] with its
//! [`Location`], …), or ask for the errno the kernel would give
//! ([`Error::raw_os_error`]) and std's [`std::io::ErrorKind`] for it
//! ([`Error::kind`]). It converts into `std::io::Error`, so `?` works in
//! functions that return `io::Result`, and code that checks
//! `error.kind()` after `std::fs` reads the same after jext4.
//!
//! ```
//! use std::io::ErrorKind;
//!
//! fn config(image: &jext4::Image) -> std::io::Result<String> {
//!     match image.read_to_string("/etc/app.conf") {
//!         Err(error) if error.kind() == ErrorKind::NotFound => Ok(String::new()),
//!         other => Ok(other?),
//!     }
//! }
//! # let path = std::env::temp_dir().join(format!("jext4-doc-crate-errors-{}.img", std::process::id()));
//! # let made = std::process::Command::new("mke2fs").args(["-q", "-F", "-t", "ext4"]).arg(&path).arg("8M").output()?;
//! # assert!(made.status.success(), "mke2fs: {made:?}");
//! let image = jext4::Image::open(&path)?;
//! assert_eq!(config(&image)?, "");
//! assert!(matches!(image.remove_dir("/"), Err(jext4::Error::Invalid(_))));
//! let error = image.create_dir("/no/such/parent").unwrap_err();
//! assert_eq!(error.raw_os_error(), Some(2)); // ENOENT
//! # std::fs::remove_file(&path)?;
//! # Ok::<(), std::io::Error>(())
//! ```
//!
//! An image found damaged answers [`Error::Corrupt`] (`EUCLEAN`) and
//! turns read-only; the damage is recorded in the superblock for
//! `e2fsck`.
//!
//! # Durability
//!
//! Durable means on the disk: after a crash or a power cut, the next open
//! (by jext4, the kernel or `e2fsck`) finds it. Until something is made
//! durable it lives in memory and in the running journal transaction,
//! which is committed every 5 seconds ([`ImageOptions::commit_interval`]):
//! a crash loses at most that much, and leaves the image consistent.
//!
//! - [`File::sync_all`] (`fsync`): the file's data and attributes, and the
//!   name it was opened by, are durable when it returns. On an image with
//!   the `fast_commit` feature this writes a fast commit of its
//!   directory's changes only, not a commit of everything.
//! - [`File::sync_data`] (`fdatasync`): the data, and what is needed to
//!   read it back (the size); an overwrite of allocated blocks only
//!   flushes the data.
//! - [`Image::sync_dir`] (`fsync` of a directory): the names created,
//!   renamed, linked and removed in it, and the files it names that
//!   changed.
//! - [`Image::sync`] (`sync`): everything written so far, in one commit.
//! - [`Image::close`]: everything, and the image is marked clean: it
//!   needs no journal replay, and the call returns the error if writing
//!   out failed. Dropping the image and its last `File` does the same
//!   but can only log a failure; call `close` where the outcome matters.
//!
//! [`ImageOptions::sync`] makes every operation durable as it returns
//! (`-o sync`). An image without a journal (ext2, or ext4 made with
//! `-O ^has_journal`) is written in place: after a crash it needs
//! `e2fsck`.
//!
//! # Features
//!
//! - `cli` (default): the `jext4` command, and the three below.
//! - `fuse`: the FUSE server (`engine::fuse`; fuser and io-uring).
//! - `tar`: tar archives into and out of an image (`engine::tools::unpack`
//!   and `pack`; tar, flate2, xz2 and zstd).
//! - `crashtest`: the crash-state tooling of `jext4 crashtest`
//!   (`engine::crash`).
//!
//! The API on this page needs none of them: depend on jext4 with
//! `default-features = false` to build it alone.
//!
//! # The engine
//!
//! [`engine`] holds the layers under the API (block devices, the buffer
//! cache, the journal, the on-disk format, the filesystem operations, the
//! FUSE server, the image tools) for the `jext4` command, the benchmarks
//! and the tests. It is unstable and outside semver: anything in it may
//! change in any release.

pub mod engine;
#[deny(missing_docs)]
mod error;

#[deny(missing_docs)]
mod api;

pub use api::{
    CASEFOLD_FL, DirBuilder, DirEntry, File, FileType, Image, ImageOptions, JOURNAL_DATA_FL,
    Metadata, OpenOptions, PROJINHERIT_FL, ReadDir, VerityOptions, Walk,
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
use engine::{bytes, cache, dev, faults, format, fs, hash, journal, lock, rng, tools};
