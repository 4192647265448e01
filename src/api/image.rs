//! `Image`: an opened image, and the path operations of `std::fs` on it.
//!
//! An `Image` shares its engine with the `File`s, `ReadDir`s and
//! `DirEntry`s made from it (one `Arc<Shared>`): they own it, so they
//! carry no lifetime and can move to other threads, and the image stays
//! mounted until the last of them is gone — or until `close`, which
//! unmounts at once and leaves them failing with `Error::Closed`.

use super::dir::{ReadDir, Walk};
use super::file::File;
use super::metadata::{Metadata, timestamp};
use super::options::{DirBuilder, ImageOptions, OpenOptions, VerityOptions};
use super::path::{bytes, components, path_from_bytes};
use crate::error::{Error, Result};
use crate::format::superblock::ROOT_INO;
use crate::fs::{Attr, Caller, FileKind, Fs, RenameFlags, SetAttr, TimeSet, XattrMode};
use parking_lot::RwLock;
use std::ffi::{OsStr, OsString};
use std::io::{Read, Write};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::SystemTime;

/// Symbolic links followed while resolving one path (Linux's MAXSYMLINKS).
const MAX_SYMLINKS: u32 = 40;

/// Bytes `copy` moves per read and write.
const COPY_CHUNK_BYTES: usize = 1 << 20;

/// An ext2/3/4 image opened in this process: std's path functions
/// (`std::fs::read_dir`, `metadata`, `rename`, …) as methods.
///
/// Paths are absolute or relative to the root (there is no working
/// directory; an empty path names the root) and are bytes, as ext4's
/// names are: any `OsStr` works, UTF-8 or not. Symbolic links are
/// followed as the kernel follows them, at most 40 in one path.
///
/// The library checks no permissions (the process that can open the
/// image can change every byte of it); new inodes belong to the
/// process's user and group, and their modes lose the image's umask
/// (`ImageOptions::umask`, 0o022 by default).
///
/// `Image` is `Send + Sync`: share it between threads by reference or in
/// an `Arc`; operations on different directories run in parallel.
pub struct Image {
    pub(super) shared: Arc<Shared>,
}

/// What an image and everything opened from it share.
pub(super) struct Shared {
    pub(super) fs: Arc<Fs>,
    /// The process's credentials, without a umask: the engine-level
    /// operations (`Image::caller`) give modes exactly.
    pub(super) caller: Caller,
    /// Cleared from the modes of the inodes that the std-shaped
    /// operations create.
    umask: u16,
    /// Set by `close`; read-held by every operation of a `File` or
    /// `ReadDir`, so that none runs across the unmount.
    closed: RwLock<bool>,
    /// Held by an append from its look at the size to the end of its
    /// write, so that two appends through this image never overlap.
    pub(super) append: parking_lot::Mutex<()>,
    /// Whether dropping the last owner unmounts the engine: not for an
    /// image made over an engine someone else mounted (`from_fs`), whose
    /// mounter still uses it after the image is gone.
    unmount_on_drop: bool,
}

impl Shared {
    /// The engine, unless the image was closed; the guard keeps `close`
    /// waiting until the caller is done.
    pub(super) fn live(&self) -> Result<parking_lot::RwLockReadGuard<'_, bool>> {
        let closed = self.closed.read();
        if *closed {
            return Err(Error::Closed);
        }
        Ok(closed)
    }

    /// The caller for operations that create inodes: the umask applies.
    pub(super) fn creator(&self) -> Caller {
        Caller {
            umask: self.umask,
            ..self.caller
        }
    }

    fn close(&self) -> Result<()> {
        let mut closed = self.closed.write();
        if *closed {
            return Ok(());
        }
        *closed = true;
        self.fs.unmount()
    }
}

impl Drop for Shared {
    /// The last owner gone: unmount, logging a failure (a destructor has
    /// no one to return it to, and must not panic).
    fn drop(&mut self) {
        if *self.closed.get_mut() || !self.unmount_on_drop {
            return;
        }
        let fs = &self.fs;
        match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| fs.unmount())) {
            Ok(Ok(())) => {}
            Ok(Err(error)) => tracing::error!(%error, "unmounting the image on drop failed"),
            Err(panic) => tracing::error!(
                message = %crate::error::panic_message(&*panic),
                "unmounting the image on drop panicked"
            ),
        }
    }
}

/// The calling process's user and group, with no umask.
pub(super) fn process_caller() -> Caller {
    // SAFETY: getuid and getgid have no preconditions and cannot fail.
    Caller::new(unsafe { libc::getuid() }, unsafe { libc::getgid() })
}

impl Image {
    /// Open an image file, block device or NBD URI read-write, replaying
    /// its journal if it needs it (std's `File::open` of the image).
    ///
    /// ```
    /// # let path = std::env::temp_dir().join(format!("jext4-doc-image-open-{}.img", std::process::id()));
    /// # let made = std::process::Command::new("mke2fs").args(["-q", "-F", "-t", "ext4"]).arg(&path).arg("8M").output()?;
    /// # assert!(made.status.success(), "mke2fs: {made:?}");
    /// let image = jext4::Image::open(&path)?;
    /// image.write("/hello", "hi\n")?;
    /// image.close()?;
    /// # std::fs::remove_file(&path)?;
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn open(path: impl AsRef<Path>) -> Result<Image> {
        ImageOptions::new().open(path)
    }

    /// Open an image read-only: every change fails with
    /// `ReadOnlyFilesystem` and nothing is written.
    ///
    /// ```
    /// # let path = std::env::temp_dir().join(format!("jext4-doc-image-open-read-only-{}.img", std::process::id()));
    /// # let made = std::process::Command::new("mke2fs").args(["-q", "-F", "-t", "ext4"]).arg(&path).arg("8M").output()?;
    /// # assert!(made.status.success(), "mke2fs: {made:?}");
    /// let image = jext4::Image::open_read_only(&path)?;
    /// assert!(image.metadata("/lost+found")?.is_dir());
    /// let refused = image.write("/hello", "hi\n").unwrap_err();
    /// assert_eq!(refused.kind(), std::io::ErrorKind::ReadOnlyFilesystem);
    /// # std::fs::remove_file(&path)?;
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn open_read_only(path: impl AsRef<Path>) -> Result<Image> {
        ImageOptions::new().read_only(true).open(path)
    }

    /// A builder for the options of an image (`ImageOptions`).
    pub fn options() -> ImageOptions {
        ImageOptions::new()
    }

    /// Open the image on a block device of any kind (in memory, NBD, your
    /// own) read-write with default options.
    ///
    /// ```
    /// # let path = std::env::temp_dir().join(format!("jext4-doc-image-from-device-{}.img", std::process::id()));
    /// # let made = std::process::Command::new("mke2fs").args(["-q", "-F", "-t", "ext4"]).arg(&path).arg("8M").output()?;
    /// # assert!(made.status.success(), "mke2fs: {made:?}");
    /// // The image copied into memory: changes never reach the file.
    /// let bytes = std::fs::read(&path)?;
    /// let device = jext4::MemoryDevice::from_bytes(bytes);
    /// let image = jext4::Image::from_device(Box::new(device))?;
    /// image.write("/scratch", "in memory only\n")?;
    /// image.close()?;
    /// assert!(!jext4::Image::open(&path)?.exists("/scratch"));
    /// # std::fs::remove_file(&path)?;
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn from_device(device: Box<dyn crate::dev::BlockDevice>) -> Result<Image> {
        ImageOptions::new().open_device(device)
    }

    /// An image over an engine already mounted (on the crash tests'
    /// recording device, say), whose operations run as `caller`
    /// (`caller.umask` becomes the image's umask). `close` unmounts the
    /// engine; dropping the image leaves it mounted for whoever mounted
    /// it (the crash driver goes on with the same engine).
    #[doc(hidden)]
    pub fn from_fs(fs: Arc<Fs>, caller: Caller) -> Image {
        let mut image =
            Image::from_parts(fs, Caller { umask: 0, ..caller }, u32::from(caller.umask));
        Arc::get_mut(&mut image.shared)
            .expect("a new image has one owner")
            .unmount_on_drop = false;
        image
    }

    pub(super) fn from_parts(fs: Arc<Fs>, caller: Caller, umask: u32) -> Image {
        debug_assert_eq!(caller.umask, 0, "the engine-level caller has no umask");
        Image {
            shared: Arc::new(Shared {
                fs,
                caller,
                umask: (umask & 0o777) as u16,
                closed: RwLock::new(false),
                append: parking_lot::Mutex::new(()),
                unmount_on_drop: true,
            }),
        }
    }

    /// Write everything out, mark the filesystem clean and release the
    /// image: what was written is durable when this returns `Ok`, and
    /// the image needs no journal replay. `File`s still open fail with
    /// `Error::Closed` from here on. Dropping the image does the same,
    /// once its last file is dropped, but can only log a failure.
    ///
    /// ```
    /// use std::io::Write;
    /// # let path = std::env::temp_dir().join(format!("jext4-doc-image-close-{}.img", std::process::id()));
    /// # let made = std::process::Command::new("mke2fs").args(["-q", "-F", "-t", "ext4"]).arg(&path).arg("8M").output()?;
    /// # assert!(made.status.success(), "mke2fs: {made:?}");
    /// let image = jext4::Image::open(&path)?;
    /// let mut file = image.create_file("/kept")?;
    /// file.write_all(b"durable")?;
    /// image.close()?;
    /// // Files of a closed image fail with `Error::Closed` (EBADF).
    /// assert!(matches!(file.metadata(), Err(jext4::Error::Closed)));
    /// drop(file);
    /// assert_eq!(jext4::Image::open(&path)?.read("/kept")?, b"durable");
    /// # std::fs::remove_file(&path)?;
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn close(self) -> Result<()> {
        self.shared.close()
    }

    /// Make everything written so far durable (`sync(2)`).
    ///
    /// ```
    /// # let path = std::env::temp_dir().join(format!("jext4-doc-image-sync-{}.img", std::process::id()));
    /// # let made = std::process::Command::new("mke2fs").args(["-q", "-F", "-t", "ext4"]).arg(&path).arg("8M").output()?;
    /// # assert!(made.status.success(), "mke2fs: {made:?}");
    /// let image = jext4::Image::open(&path)?;
    /// image.write("/a", "one\n")?;
    /// image.write("/b", "two\n")?;
    /// image.sync()?; // both durable from here, even if the process dies next
    /// # std::fs::remove_file(&path)?;
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn sync(&self) -> Result<()> {
        self.fs().sync()
    }

    /// `fsync(2)` of the directory at `path`: the names created, renamed,
    /// linked and removed in it, and the files it names that changed, are
    /// durable on return (on images without fast commits everything is,
    /// as `sync`).
    ///
    /// ```
    /// # let path = std::env::temp_dir().join(format!("jext4-doc-image-sync-dir-{}.img", std::process::id()));
    /// # let made = std::process::Command::new("mke2fs").args(["-q", "-F", "-t", "ext4"]).arg(&path).arg("8M").output()?;
    /// # assert!(made.status.success(), "mke2fs: {made:?}");
    /// let image = jext4::Image::open(&path)?;
    /// image.create_dir("/spool")?;
    /// image.write("/spool/job-1", "print me\n")?;
    /// image.sync_dir("/spool")?; // the new name is durable
    /// # std::fs::remove_file(&path)?;
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn sync_dir(&self, path: impl AsRef<Path>) -> Result<()> {
        let ino = self.resolve(bytes(path.as_ref()), true)?;
        if self.fs().getattr(ino)?.kind != FileKind::Directory {
            return Err(Error::NotDirectory);
        }
        self.fs().fsync_dir(ino)
    }

    // ----- Files -----

    /// Open an existing file for reading (std's `File::open`).
    ///
    /// ```
    /// use std::io::Read;
    /// # let path = std::env::temp_dir().join(format!("jext4-doc-image-open-file-{}.img", std::process::id()));
    /// # let made = std::process::Command::new("mke2fs").args(["-q", "-F", "-t", "ext4"]).arg(&path).arg("8M").output()?;
    /// # assert!(made.status.success(), "mke2fs: {made:?}");
    /// let image = jext4::Image::open(&path)?;
    /// image.write("/hostname", "example\n")?;
    /// let mut text = String::new();
    /// image.open_file("/hostname")?.read_to_string(&mut text)?;
    /// assert_eq!(text, "example\n");
    /// # std::fs::remove_file(&path)?;
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn open_file(&self, path: impl AsRef<Path>) -> Result<File> {
        self.open_with(path, OpenOptions::new().read(true))
    }

    /// Create a file, or empty the one there, for writing (std's
    /// `File::create`): mode 0o666 less the umask.
    ///
    /// ```
    /// use std::io::Write;
    /// use std::os::unix::fs::PermissionsExt;
    /// # let path = std::env::temp_dir().join(format!("jext4-doc-image-create-file-{}.img", std::process::id()));
    /// # let made = std::process::Command::new("mke2fs").args(["-q", "-F", "-t", "ext4"]).arg(&path).arg("8M").output()?;
    /// # assert!(made.status.success(), "mke2fs: {made:?}");
    /// let image = jext4::Image::open(&path)?;
    /// let mut file = image.create_file("/notes.txt")?;
    /// file.write_all(b"first line\n")?;
    /// assert_eq!(file.metadata()?.permissions().mode(), 0o644);
    /// # std::fs::remove_file(&path)?;
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn create_file(&self, path: impl AsRef<Path>) -> Result<File> {
        self.open_with(
            path,
            OpenOptions::new().write(true).create(true).truncate(true),
        )
    }

    /// Open a file as `options` say (std's `OpenOptions::open`), with
    /// `open(2)`'s errors: `NotFound`, `AlreadyExists` (`create_new`),
    /// `IsADirectory` (a directory opened for writing), `InvalidInput`
    /// (an option combination std refuses), `FilesystemLoop`.
    ///
    /// ```
    /// use std::io::Write;
    /// use std::os::unix::fs::OpenOptionsExt;
    /// use jext4::OpenOptions;
    /// # let path = std::env::temp_dir().join(format!("jext4-doc-image-open-with-{}.img", std::process::id()));
    /// # let made = std::process::Command::new("mke2fs").args(["-q", "-F", "-t", "ext4"]).arg(&path).arg("8M").output()?;
    /// # assert!(made.status.success(), "mke2fs: {made:?}");
    /// let image = jext4::Image::open(&path)?;
    /// let mut log = image.open_with("/app.log", OpenOptions::new().append(true).create(true).mode(0o640))?;
    /// log.write_all(b"started\n")?;
    /// let again = image.open_with("/app.log", OpenOptions::new().write(true).create_new(true));
    /// assert_eq!(again.unwrap_err().kind(), std::io::ErrorKind::AlreadyExists);
    /// # std::fs::remove_file(&path)?;
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn open_with(&self, path: impl AsRef<Path>, options: &OpenOptions) -> Result<File> {
        File::open(self, bytes(path.as_ref()), options)
    }

    // ----- Directories -----

    /// The entries of a directory, without `.` and `..`, as an iterator
    /// that reads the directory as it goes (a few dozen entries at a
    /// time, whatever the directory's size).
    ///
    /// ```
    /// use std::ffi::OsString;
    /// # let path = std::env::temp_dir().join(format!("jext4-doc-image-read-dir-{}.img", std::process::id()));
    /// # let made = std::process::Command::new("mke2fs").args(["-q", "-F", "-t", "ext4"]).arg(&path).arg("8M").output()?;
    /// # assert!(made.status.success(), "mke2fs: {made:?}");
    /// let image = jext4::Image::open(&path)?;
    /// image.create_dir_all("/etc/app")?;
    /// image.write("/etc/hostname", "example\n")?;
    /// let mut names = Vec::new();
    /// for entry in image.read_dir("/etc")? {
    ///     let entry = entry?;
    ///     names.push((entry.file_name(), entry.file_type()?.is_dir()));
    /// }
    /// names.sort();
    /// assert_eq!(names, [(OsString::from("app"), true), (OsString::from("hostname"), false)]);
    /// # std::fs::remove_file(&path)?;
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn read_dir(&self, path: impl AsRef<Path>) -> Result<ReadDir> {
        let path = path.as_ref();
        let ino = self.resolve(bytes(path), true)?;
        if self.fs().getattr(ino)?.kind != FileKind::Directory {
            return Err(Error::NotDirectory);
        }
        Ok(ReadDir::new(self.shared.clone(), ino, path.to_path_buf()))
    }

    /// Every entry under the directory at `path`, depth first, each
    /// directory's entry before the entries in it. Symbolic links are
    /// listed, not followed. Memory grows with the depth of the tree,
    /// not its width.
    ///
    /// ```
    /// use std::path::Path;
    /// # let path = std::env::temp_dir().join(format!("jext4-doc-image-walk-{}.img", std::process::id()));
    /// # let made = std::process::Command::new("mke2fs").args(["-q", "-F", "-t", "ext4"]).arg(&path).arg("8M").output()?;
    /// # assert!(made.status.success(), "mke2fs: {made:?}");
    /// let image = jext4::Image::open(&path)?;
    /// image.create_dir_all("/a/b")?;
    /// image.write("/a/b/c", "")?;
    /// let mut paths = Vec::new();
    /// for entry in image.walk("/a")? {
    ///     paths.push(entry?.path());
    /// }
    /// assert_eq!(paths, [Path::new("/a/b"), Path::new("/a/b/c")]);
    /// # std::fs::remove_file(&path)?;
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn walk(&self, path: impl AsRef<Path>) -> Result<Walk> {
        Ok(Walk::new(self.read_dir(path)?))
    }

    /// Create a directory, mode 0o777 less the umask (std's
    /// `fs::create_dir`): `AlreadyExists` if the name exists, `NotFound`
    /// if its parent does not.
    ///
    /// ```
    /// # let path = std::env::temp_dir().join(format!("jext4-doc-image-create-dir-{}.img", std::process::id()));
    /// # let made = std::process::Command::new("mke2fs").args(["-q", "-F", "-t", "ext4"]).arg(&path).arg("8M").output()?;
    /// # assert!(made.status.success(), "mke2fs: {made:?}");
    /// let image = jext4::Image::open(&path)?;
    /// image.create_dir("/srv")?;
    /// assert!(image.metadata("/srv")?.is_dir());
    /// let again = image.create_dir("/srv").unwrap_err();
    /// assert_eq!(again.kind(), std::io::ErrorKind::AlreadyExists);
    /// let orphan = image.create_dir("/no/such/parent").unwrap_err();
    /// assert_eq!(orphan.kind(), std::io::ErrorKind::NotFound);
    /// # std::fs::remove_file(&path)?;
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn create_dir(&self, path: impl AsRef<Path>) -> Result<()> {
        self.create_dir_with(path, &DirBuilder::new())
    }

    /// Create a directory and every missing parent (std's
    /// `fs::create_dir_all`): a directory that exists already is fine,
    /// anything else there is `AlreadyExists` (or `NotADirectory` on the
    /// way).
    ///
    /// ```
    /// # let path = std::env::temp_dir().join(format!("jext4-doc-image-create-dir-all-{}.img", std::process::id()));
    /// # let made = std::process::Command::new("mke2fs").args(["-q", "-F", "-t", "ext4"]).arg(&path).arg("8M").output()?;
    /// # assert!(made.status.success(), "mke2fs: {made:?}");
    /// let image = jext4::Image::open(&path)?;
    /// image.create_dir_all("/var/lib/app")?;
    /// image.create_dir_all("/var/lib/app")?; // there already: fine
    /// assert!(image.metadata("/var/lib")?.is_dir());
    /// # std::fs::remove_file(&path)?;
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn create_dir_all(&self, path: impl AsRef<Path>) -> Result<()> {
        self.create_dir_with(path, DirBuilder::new().recursive(true))
    }

    /// Create a directory as `builder` says (std's `DirBuilder::create`).
    ///
    /// ```
    /// use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
    /// # let path = std::env::temp_dir().join(format!("jext4-doc-image-create-dir-with-{}.img", std::process::id()));
    /// # let made = std::process::Command::new("mke2fs").args(["-q", "-F", "-t", "ext4"]).arg(&path).arg("8M").output()?;
    /// # assert!(made.status.success(), "mke2fs: {made:?}");
    /// let image = jext4::Image::open(&path)?;
    /// image.create_dir_with("/srv/private", jext4::DirBuilder::new().recursive(true).mode(0o700))?;
    /// assert_eq!(image.metadata("/srv/private")?.permissions().mode(), 0o700);
    /// # std::fs::remove_file(&path)?;
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn create_dir_with(&self, path: impl AsRef<Path>, builder: &DirBuilder) -> Result<()> {
        let path = path.as_ref();
        let mode = (builder.mode & 0o7777) as u16;
        if !builder.recursive {
            return self.mkdir(path, mode);
        }
        // std's create_dir_all, without its recursion: find the deepest
        // ancestor that exists, then create the rest downwards.
        let mut missing = Vec::new();
        for ancestor in path.ancestors() {
            if bytes(ancestor).iter().all(|&b| b == b'/') {
                break;
            }
            match self.mkdir(ancestor, mode) {
                Ok(()) => break,
                Err(Error::NotFound) => missing.push(ancestor),
                Err(_) if self.is_dir(ancestor) => break,
                Err(error) => return Err(error),
            }
        }
        for ancestor in missing.into_iter().rev() {
            match self.mkdir(ancestor, mode) {
                Ok(()) => {}
                Err(_) if self.is_dir(ancestor) => {}
                Err(error) => return Err(error),
            }
        }
        Ok(())
    }

    fn mkdir(&self, path: &Path, mode: u16) -> Result<()> {
        let (parent, name) = self.parent_of(bytes(path))?;
        self.fs().mkdir(parent, name, mode, self.shared.creator())?;
        Ok(())
    }

    fn is_dir(&self, path: &Path) -> bool {
        matches!(self.metadata(path), Ok(metadata) if metadata.is_dir())
    }

    /// Remove an empty directory (`rmdir(2)`): `DirectoryNotEmpty`,
    /// `NotADirectory`, `NotFound`.
    ///
    /// ```
    /// # let path = std::env::temp_dir().join(format!("jext4-doc-image-remove-dir-{}.img", std::process::id()));
    /// # let made = std::process::Command::new("mke2fs").args(["-q", "-F", "-t", "ext4"]).arg(&path).arg("8M").output()?;
    /// # assert!(made.status.success(), "mke2fs: {made:?}");
    /// let image = jext4::Image::open(&path)?;
    /// image.create_dir_all("/a/b")?;
    /// let busy = image.remove_dir("/a").unwrap_err();
    /// assert_eq!(busy.kind(), std::io::ErrorKind::DirectoryNotEmpty);
    /// image.remove_dir("/a/b")?;
    /// image.remove_dir("/a")?;
    /// assert!(!image.exists("/a"));
    /// # std::fs::remove_file(&path)?;
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn remove_dir(&self, path: impl AsRef<Path>) -> Result<()> {
        let (parent, name) = self.parent_of(bytes(path.as_ref()))?;
        self.fs().rmdir(parent, name, self.shared.caller)
    }

    /// Remove a directory and everything under it (std's
    /// `fs::remove_dir_all`): a symbolic link at `path` is removed
    /// itself, never followed. Iterative, so a deep tree cannot exhaust
    /// the stack.
    ///
    /// ```
    /// # let path = std::env::temp_dir().join(format!("jext4-doc-image-remove-dir-all-{}.img", std::process::id()));
    /// # let made = std::process::Command::new("mke2fs").args(["-q", "-F", "-t", "ext4"]).arg(&path).arg("8M").output()?;
    /// # assert!(made.status.success(), "mke2fs: {made:?}");
    /// let image = jext4::Image::open(&path)?;
    /// image.create_dir_all("/tmp/build/objects")?;
    /// image.write("/tmp/build/objects/main.o", "\x7fELF")?;
    /// image.remove_dir_all("/tmp/build")?;
    /// assert!(!image.exists("/tmp/build"));
    /// assert!(image.exists("/tmp"));
    /// # std::fs::remove_file(&path)?;
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn remove_dir_all(&self, path: impl AsRef<Path>) -> Result<()> {
        let (parent, name) = self.parent_of(bytes(path.as_ref()))?;
        let top = self.fs().lookup(parent, name)?;
        match top.kind {
            FileKind::Directory => {}
            FileKind::Symlink => return self.fs().unlink(parent, name, self.shared.caller),
            _ => return Err(Error::NotDirectory),
        }
        let fs = self.fs();
        let caller = self.shared.caller;
        // Directories still to empty, deepest last; each is (parent,
        // name, inode) so that it can be removed once empty.
        let mut pending = vec![(parent, name.to_vec(), top.ino)];
        while let Some((dir_parent, dir_name, dir)) = pending.pop() {
            let mut subdirectories = Vec::new();
            let mut files = Vec::new();
            for entry in fs.entries(dir)? {
                if entry.kind == FileKind::Directory {
                    subdirectories.push((dir, entry.name, entry.ino));
                } else {
                    files.push(entry.name);
                }
            }
            for name in files {
                fs.unlink(dir, &name, caller)?;
            }
            if subdirectories.is_empty() {
                fs.rmdir(dir_parent, &dir_name, caller)?;
            } else {
                // Come back to this directory once its children are gone.
                pending.push((dir_parent, dir_name, dir));
                pending.extend(subdirectories);
            }
        }
        Ok(())
    }

    // ----- Names -----

    /// Remove a name that is not a directory (`unlink(2)`): an open
    /// `File` of it keeps working until dropped.
    ///
    /// ```
    /// # let path = std::env::temp_dir().join(format!("jext4-doc-image-remove-file-{}.img", std::process::id()));
    /// # let made = std::process::Command::new("mke2fs").args(["-q", "-F", "-t", "ext4"]).arg(&path).arg("8M").output()?;
    /// # assert!(made.status.success(), "mke2fs: {made:?}");
    /// let image = jext4::Image::open(&path)?;
    /// use std::io::Read;
    /// image.write("/scratch", "temporary\n")?;
    /// let mut open = image.open_file("/scratch")?;
    /// image.remove_file("/scratch")?;
    /// assert!(!image.exists("/scratch"));
    /// let mut text = String::new();
    /// open.read_to_string(&mut text)?; // still readable until dropped
    /// assert_eq!(text, "temporary\n");
    /// # std::fs::remove_file(&path)?;
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn remove_file(&self, path: impl AsRef<Path>) -> Result<()> {
        let (parent, name) = self.parent_of(bytes(path.as_ref()))?;
        self.fs().unlink(parent, name, self.shared.caller)
    }

    /// Rename `from` to `to`, replacing what `to` names if it is
    /// compatible (`rename(2)`; std's `fs::rename`): atomic, and durable
    /// with the next sync of either directory.
    ///
    /// ```
    /// # let path = std::env::temp_dir().join(format!("jext4-doc-image-rename-{}.img", std::process::id()));
    /// # let made = std::process::Command::new("mke2fs").args(["-q", "-F", "-t", "ext4"]).arg(&path).arg("8M").output()?;
    /// # assert!(made.status.success(), "mke2fs: {made:?}");
    /// let image = jext4::Image::open(&path)?;
    /// image.write("/config", "version 1\n")?;
    /// image.write("/config.new", "version 2\n")?;
    /// image.rename("/config.new", "/config")?; // replaces it, atomically
    /// assert_eq!(image.read_to_string("/config")?, "version 2\n");
    /// assert!(!image.exists("/config.new"));
    /// # std::fs::remove_file(&path)?;
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn rename(&self, from: impl AsRef<Path>, to: impl AsRef<Path>) -> Result<()> {
        let (old_parent, old_name) = self.parent_of(bytes(from.as_ref()))?;
        let (new_parent, new_name) = self.parent_of(bytes(to.as_ref()))?;
        self.fs().rename(
            old_parent,
            old_name,
            new_parent,
            new_name,
            RenameFlags::default(),
            self.shared.caller,
        )
    }

    /// A new name `link` for the file `original` (std's `fs::hard_link`;
    /// a symbolic link at `original` is linked itself).
    ///
    /// ```
    /// # let path = std::env::temp_dir().join(format!("jext4-doc-image-hard-link-{}.img", std::process::id()));
    /// # let made = std::process::Command::new("mke2fs").args(["-q", "-F", "-t", "ext4"]).arg(&path).arg("8M").output()?;
    /// # assert!(made.status.success(), "mke2fs: {made:?}");
    /// let image = jext4::Image::open(&path)?;
    /// image.write("/original", "shared\n")?;
    /// image.hard_link("/original", "/second-name")?;
    /// assert_eq!(image.metadata("/original")?.nlink(), 2);
    /// assert_eq!(image.metadata("/second-name")?.ino(), image.metadata("/original")?.ino());
    /// # std::fs::remove_file(&path)?;
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn hard_link(&self, original: impl AsRef<Path>, link: impl AsRef<Path>) -> Result<()> {
        let ino = self.resolve(bytes(original.as_ref()), false)?;
        let (parent, name) = self.parent_of(bytes(link.as_ref()))?;
        self.fs().link(ino, parent, name, self.shared.caller)?;
        Ok(())
    }

    /// A symbolic link at `link` that points to `original`
    /// (`std::os::unix::fs::symlink`); `original` is stored as given,
    /// never resolved.
    ///
    /// ```
    /// # let path = std::env::temp_dir().join(format!("jext4-doc-image-symlink-{}.img", std::process::id()));
    /// # let made = std::process::Command::new("mke2fs").args(["-q", "-F", "-t", "ext4"]).arg(&path).arg("8M").output()?;
    /// # assert!(made.status.success(), "mke2fs: {made:?}");
    /// let image = jext4::Image::open(&path)?;
    /// image.create_dir("/releases")?;
    /// image.write("/releases/v2", "2.0\n")?;
    /// image.symlink("releases/v2", "/current")?; // stored as given, relative
    /// assert_eq!(image.read_to_string("/current")?, "2.0\n");
    /// # std::fs::remove_file(&path)?;
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn symlink(&self, original: impl AsRef<Path>, link: impl AsRef<Path>) -> Result<()> {
        let (parent, name) = self.parent_of(bytes(link.as_ref()))?;
        let target = bytes(original.as_ref());
        self.fs()
            .symlink(parent, name, target, self.shared.creator())?;
        Ok(())
    }

    /// The target of the symbolic link at `path` (std's `fs::read_link`):
    /// `InvalidInput` if it is not a link.
    ///
    /// ```
    /// # let path = std::env::temp_dir().join(format!("jext4-doc-image-read-link-{}.img", std::process::id()));
    /// # let made = std::process::Command::new("mke2fs").args(["-q", "-F", "-t", "ext4"]).arg(&path).arg("8M").output()?;
    /// # assert!(made.status.success(), "mke2fs: {made:?}");
    /// let image = jext4::Image::open(&path)?;
    /// image.symlink("/etc/hostname", "/hostname")?;
    /// assert_eq!(image.read_link("/hostname")?, std::path::Path::new("/etc/hostname"));
    /// image.write("/plain", "")?;
    /// let refused = image.read_link("/plain").unwrap_err();
    /// assert_eq!(refused.kind(), std::io::ErrorKind::InvalidInput);
    /// # std::fs::remove_file(&path)?;
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn read_link(&self, path: impl AsRef<Path>) -> Result<PathBuf> {
        let ino = self.resolve(bytes(path.as_ref()), false)?;
        Ok(path_from_bytes(self.fs().readlink(ino)?))
    }

    // ----- Whole files -----

    /// A file's whole contents (std's `fs::read`).
    ///
    /// ```
    /// # let path = std::env::temp_dir().join(format!("jext4-doc-image-read-{}.img", std::process::id()));
    /// # let made = std::process::Command::new("mke2fs").args(["-q", "-F", "-t", "ext4"]).arg(&path).arg("8M").output()?;
    /// # assert!(made.status.success(), "mke2fs: {made:?}");
    /// let image = jext4::Image::open(&path)?;
    /// image.write("/blob", [0u8, 1, 2, 255])?;
    /// assert_eq!(image.read("/blob")?, [0, 1, 2, 255]);
    /// # std::fs::remove_file(&path)?;
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn read(&self, path: impl AsRef<Path>) -> Result<Vec<u8>> {
        let mut file = self.open_file(path)?;
        let mut contents = Vec::with_capacity(file.metadata()?.len() as usize);
        file.read_to_end(&mut contents)?;
        Ok(contents)
    }

    /// A file's whole contents as text (std's `fs::read_to_string`):
    /// `InvalidData` if they are not UTF-8.
    ///
    /// ```
    /// # let path = std::env::temp_dir().join(format!("jext4-doc-image-read-to-string-{}.img", std::process::id()));
    /// # let made = std::process::Command::new("mke2fs").args(["-q", "-F", "-t", "ext4"]).arg(&path).arg("8M").output()?;
    /// # assert!(made.status.success(), "mke2fs: {made:?}");
    /// let image = jext4::Image::open(&path)?;
    /// image.write("/greeting", "hello\n")?;
    /// assert_eq!(image.read_to_string("/greeting")?, "hello\n");
    /// image.write("/binary", [0xffu8, 0xfe])?;
    /// let refused = image.read_to_string("/binary").unwrap_err();
    /// assert_eq!(refused.kind(), std::io::ErrorKind::InvalidData);
    /// # std::fs::remove_file(&path)?;
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn read_to_string(&self, path: impl AsRef<Path>) -> Result<String> {
        String::from_utf8(self.read(path)?)
            .map_err(|error| Error::Io(std::io::Error::new(std::io::ErrorKind::InvalidData, error)))
    }

    /// Create or empty a file and write `contents` into it (std's
    /// `fs::write`).
    ///
    /// ```
    /// # let path = std::env::temp_dir().join(format!("jext4-doc-image-write-{}.img", std::process::id()));
    /// # let made = std::process::Command::new("mke2fs").args(["-q", "-F", "-t", "ext4"]).arg(&path).arg("8M").output()?;
    /// # assert!(made.status.success(), "mke2fs: {made:?}");
    /// let image = jext4::Image::open(&path)?;
    /// image.write("/motd", "welcome\n")?;
    /// image.write("/motd", "welcome back\n")?; // emptied and written again
    /// assert_eq!(image.read_to_string("/motd")?, "welcome back\n");
    /// # std::fs::remove_file(&path)?;
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn write(&self, path: impl AsRef<Path>, contents: impl AsRef<[u8]>) -> Result<()> {
        self.create_file(path)?.write_all(contents.as_ref())?;
        Ok(())
    }

    /// Copy a regular file's contents and permission bits to `to`,
    /// created or emptied (std's `fs::copy`); returns the bytes copied.
    ///
    /// ```
    /// # let path = std::env::temp_dir().join(format!("jext4-doc-image-copy-{}.img", std::process::id()));
    /// # let made = std::process::Command::new("mke2fs").args(["-q", "-F", "-t", "ext4"]).arg(&path).arg("8M").output()?;
    /// # assert!(made.status.success(), "mke2fs: {made:?}");
    /// let image = jext4::Image::open(&path)?;
    /// use std::os::unix::fs::PermissionsExt;
    /// image.write("/script", "#!/bin/sh\necho hi\n")?;
    /// image.set_permissions("/script", std::fs::Permissions::from_mode(0o755))?;
    /// assert_eq!(image.copy("/script", "/script.bak")?, 18);
    /// assert_eq!(image.read("/script.bak")?, image.read("/script")?);
    /// assert_eq!(image.metadata("/script.bak")?.permissions().mode() & 0o777, 0o755);
    /// # std::fs::remove_file(&path)?;
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn copy(&self, from: impl AsRef<Path>, to: impl AsRef<Path>) -> Result<u64> {
        let mut source = self.open_file(from)?;
        let metadata = source.metadata()?;
        if !metadata.is_file() {
            return Err(Error::Invalid(
                "the source path is neither a regular file nor a symlink to a regular file".into(),
            ));
        }
        let permissions = metadata.permissions();
        let mut options = OpenOptions::new();
        options.write(true).create(true).truncate(true);
        std::os::unix::fs::OpenOptionsExt::mode(&mut options, permissions.mode());
        let mut destination = self.open_with(to, &options)?;
        let mut buffer = vec![0u8; COPY_CHUNK_BYTES];
        let mut copied = 0u64;
        loop {
            let got = source.read(&mut buffer)?;
            if got == 0 {
                break;
            }
            destination.write_all(&buffer[..got])?;
            copied += got as u64;
        }
        destination.set_permissions(permissions)?;
        Ok(copied)
    }

    // ----- Attributes -----

    /// The attributes of what `path` names, following a final symbolic
    /// link (`stat(2)`; std's `fs::metadata`).
    ///
    /// ```
    /// use std::os::unix::fs::PermissionsExt;
    /// # let path = std::env::temp_dir().join(format!("jext4-doc-image-metadata-{}.img", std::process::id()));
    /// # let made = std::process::Command::new("mke2fs").args(["-q", "-F", "-t", "ext4"]).arg(&path).arg("8M").output()?;
    /// # assert!(made.status.success(), "mke2fs: {made:?}");
    /// let image = jext4::Image::open(&path)?;
    /// image.write("/data", "12345")?;
    /// let metadata = image.metadata("/data")?;
    /// assert!(metadata.is_file());
    /// assert_eq!(metadata.len(), 5);
    /// assert_eq!(metadata.permissions().mode(), 0o644);
    /// image.symlink("/data", "/link")?;
    /// assert!(image.metadata("/link")?.is_file()); // followed
    /// assert!(image.symlink_metadata("/link")?.is_symlink());
    /// # std::fs::remove_file(&path)?;
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn metadata(&self, path: impl AsRef<Path>) -> Result<Metadata> {
        Ok(self
            .fs()
            .getattr(self.resolve(bytes(path.as_ref()), true)?)?
            .into())
    }

    /// The attributes of `path` itself, a symbolic link included
    /// (`lstat(2)`; std's `fs::symlink_metadata`).
    ///
    /// ```
    /// # let path = std::env::temp_dir().join(format!("jext4-doc-image-symlink-metadata-{}.img", std::process::id()));
    /// # let made = std::process::Command::new("mke2fs").args(["-q", "-F", "-t", "ext4"]).arg(&path).arg("8M").output()?;
    /// # assert!(made.status.success(), "mke2fs: {made:?}");
    /// let image = jext4::Image::open(&path)?;
    /// image.symlink("/nowhere", "/dangling")?;
    /// assert!(image.symlink_metadata("/dangling")?.is_symlink());
    /// assert!(image.metadata("/dangling").is_err()); // nothing to follow to
    /// # std::fs::remove_file(&path)?;
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn symlink_metadata(&self, path: impl AsRef<Path>) -> Result<Metadata> {
        Ok(self
            .fs()
            .getattr(self.resolve(bytes(path.as_ref()), false)?)?
            .into())
    }

    /// Whether `path` names something, following symbolic links (std's
    /// `Path::exists`): any error counts as no.
    ///
    /// ```
    /// # let path = std::env::temp_dir().join(format!("jext4-doc-image-exists-{}.img", std::process::id()));
    /// # let made = std::process::Command::new("mke2fs").args(["-q", "-F", "-t", "ext4"]).arg(&path).arg("8M").output()?;
    /// # assert!(made.status.success(), "mke2fs: {made:?}");
    /// let image = jext4::Image::open(&path)?;
    /// assert!(image.exists("/lost+found"));
    /// assert!(!image.exists("/missing"));
    /// # std::fs::remove_file(&path)?;
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn exists(&self, path: impl AsRef<Path>) -> bool {
        self.metadata(path).is_ok()
    }

    /// Whether `path` names something (std's `fs::exists`): `Ok(false)`
    /// when it or a directory on the way is missing, an error when the
    /// answer is unknown (a loop of links, an I/O error).
    ///
    /// ```
    /// # let path = std::env::temp_dir().join(format!("jext4-doc-image-try-exists-{}.img", std::process::id()));
    /// # let made = std::process::Command::new("mke2fs").args(["-q", "-F", "-t", "ext4"]).arg(&path).arg("8M").output()?;
    /// # assert!(made.status.success(), "mke2fs: {made:?}");
    /// let image = jext4::Image::open(&path)?;
    /// assert!(image.try_exists("/lost+found")?);
    /// assert!(!image.try_exists("/missing/too")?);
    /// image.symlink("/loop", "/loop")?; // a link to itself: the answer is unknown
    /// assert!(image.try_exists("/loop").is_err());
    /// # std::fs::remove_file(&path)?;
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn try_exists(&self, path: impl AsRef<Path>) -> Result<bool> {
        match self.metadata(path) {
            Ok(_) => Ok(true),
            Err(Error::NotFound) => Ok(false),
            Err(error) => Err(error),
        }
    }

    /// Set the permission bits (with setuid, setgid, sticky) of what
    /// `path` names, following symbolic links (std's
    /// `fs::set_permissions`).
    ///
    /// ```
    /// # let path = std::env::temp_dir().join(format!("jext4-doc-image-set-permissions-{}.img", std::process::id()));
    /// # let made = std::process::Command::new("mke2fs").args(["-q", "-F", "-t", "ext4"]).arg(&path).arg("8M").output()?;
    /// # assert!(made.status.success(), "mke2fs: {made:?}");
    /// let image = jext4::Image::open(&path)?;
    /// use std::os::unix::fs::PermissionsExt;
    /// image.write("/secret", "key\n")?;
    /// image.set_permissions("/secret", std::fs::Permissions::from_mode(0o600))?;
    /// assert_eq!(image.metadata("/secret")?.permissions().mode() & 0o7777, 0o600);
    /// # std::fs::remove_file(&path)?;
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn set_permissions(
        &self,
        path: impl AsRef<Path>,
        permissions: std::fs::Permissions,
    ) -> Result<()> {
        let changes = SetAttr {
            mode: Some((permissions.mode() & 0o7777) as u16),
            ..SetAttr::default()
        };
        self.set_attr_following(path.as_ref(), &changes)
    }

    /// Change the owner and group of what `path` names, following
    /// symbolic links (`std::os::unix::fs::chown`); `None` leaves one as
    /// it is. A non-root owner loses setuid and setgid, as chown(2) does.
    ///
    /// ```
    /// # let path = std::env::temp_dir().join(format!("jext4-doc-image-set-owner-{}.img", std::process::id()));
    /// # let made = std::process::Command::new("mke2fs").args(["-q", "-F", "-t", "ext4"]).arg(&path).arg("8M").output()?;
    /// # assert!(made.status.success(), "mke2fs: {made:?}");
    /// let image = jext4::Image::open(&path)?;
    /// image.write("/owned", "")?;
    /// let before = image.metadata("/owned")?;
    /// // Ownership as it is (any user may do that); as root, any uid and gid.
    /// image.set_owner("/owned", Some(before.uid()), None)?;
    /// assert_eq!(image.metadata("/owned")?.gid(), before.gid());
    /// # std::fs::remove_file(&path)?;
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn set_owner(
        &self,
        path: impl AsRef<Path>,
        uid: Option<u32>,
        gid: Option<u32>,
    ) -> Result<()> {
        let changes = SetAttr {
            uid,
            gid,
            ..SetAttr::default()
        };
        self.set_attr_following(path.as_ref(), &changes)
    }

    /// Set the access and modification times, to the nanosecond, of what
    /// `path` names, following symbolic links (`utimensat(2)`); the
    /// change time becomes now.
    ///
    /// ```
    /// # let path = std::env::temp_dir().join(format!("jext4-doc-image-set-times-{}.img", std::process::id()));
    /// # let made = std::process::Command::new("mke2fs").args(["-q", "-F", "-t", "ext4"]).arg(&path).arg("8M").output()?;
    /// # assert!(made.status.success(), "mke2fs: {made:?}");
    /// let image = jext4::Image::open(&path)?;
    /// use std::time::{Duration, SystemTime};
    /// image.write("/dated", "")?;
    /// let when = SystemTime::UNIX_EPOCH + Duration::new(1_700_000_000, 123_456_789);
    /// image.set_times("/dated", when, when)?;
    /// assert_eq!(image.metadata("/dated")?.modified()?, when); // to the nanosecond
    /// # std::fs::remove_file(&path)?;
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn set_times(
        &self,
        path: impl AsRef<Path>,
        accessed: SystemTime,
        modified: SystemTime,
    ) -> Result<()> {
        let changes = SetAttr {
            atime: Some(TimeSet::At(timestamp(accessed))),
            mtime: Some(TimeSet::At(timestamp(modified))),
            ..SetAttr::default()
        };
        self.set_attr_following(path.as_ref(), &changes)
    }

    fn set_attr_following(&self, path: &Path, changes: &SetAttr) -> Result<()> {
        let ino = self.resolve(bytes(path), true)?;
        self.fs().setattr(ino, changes, self.shared.caller)?;
        Ok(())
    }

    // ----- Extended attributes -----
    // Of `path` itself, a final symbolic link not followed (the `xattr`
    // crate's `get`/`set`, `lgetxattr(2)`). Names carry their namespace:
    // "user.", "trusted.", "security.", "system.posix_acl_access".

    /// The value of extended attribute `name`, `None` if it has none.
    ///
    /// ```
    /// # let path = std::env::temp_dir().join(format!("jext4-doc-image-xattr-{}.img", std::process::id()));
    /// # let made = std::process::Command::new("mke2fs").args(["-q", "-F", "-t", "ext4"]).arg(&path).arg("8M").output()?;
    /// # assert!(made.status.success(), "mke2fs: {made:?}");
    /// let image = jext4::Image::open(&path)?;
    /// image.write("/tagged", "")?;
    /// assert_eq!(image.xattr("/tagged", "user.colour")?, None);
    /// image.set_xattr("/tagged", "user.colour", "blue")?;
    /// assert_eq!(image.xattr("/tagged", "user.colour")?.as_deref(), Some(&b"blue"[..]));
    /// # std::fs::remove_file(&path)?;
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn xattr(
        &self,
        path: impl AsRef<Path>,
        name: impl AsRef<OsStr>,
    ) -> Result<Option<Vec<u8>>> {
        let ino = self.resolve(bytes(path.as_ref()), false)?;
        match self.fs().getxattr(ino, name.as_ref().as_bytes()) {
            Ok(value) => Ok(Some(value)),
            Err(Error::NoAttribute) => Ok(None),
            Err(error) => Err(error),
        }
    }

    /// Set extended attribute `name` to `value`, creating or replacing it.
    ///
    /// ```
    /// # let path = std::env::temp_dir().join(format!("jext4-doc-image-set-xattr-{}.img", std::process::id()));
    /// # let made = std::process::Command::new("mke2fs").args(["-q", "-F", "-t", "ext4"]).arg(&path).arg("8M").output()?;
    /// # assert!(made.status.success(), "mke2fs: {made:?}");
    /// let image = jext4::Image::open(&path)?;
    /// image.write("/checked", "data\n")?;
    /// image.set_xattr("/checked", "user.sha256", "5e8f…")?;
    /// image.set_xattr("/checked", "user.sha256", "6c3d…")?; // replaced
    /// assert_eq!(image.xattr("/checked", "user.sha256")?.as_deref(), Some("6c3d…".as_bytes()));
    /// # std::fs::remove_file(&path)?;
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn set_xattr(
        &self,
        path: impl AsRef<Path>,
        name: impl AsRef<OsStr>,
        value: impl AsRef<[u8]>,
    ) -> Result<()> {
        let ino = self.resolve(bytes(path.as_ref()), false)?;
        let name = name.as_ref().as_bytes();
        self.fs().setxattr(
            ino,
            name,
            value.as_ref(),
            XattrMode::Any,
            self.shared.caller,
        )
    }

    /// The names of every extended attribute of `path`, with their
    /// namespace prefixes.
    ///
    /// ```
    /// # let path = std::env::temp_dir().join(format!("jext4-doc-image-list-xattr-{}.img", std::process::id()));
    /// # let made = std::process::Command::new("mke2fs").args(["-q", "-F", "-t", "ext4"]).arg(&path).arg("8M").output()?;
    /// # assert!(made.status.success(), "mke2fs: {made:?}");
    /// let image = jext4::Image::open(&path)?;
    /// image.write("/labelled", "")?;
    /// image.set_xattr("/labelled", "user.a", "1")?;
    /// image.set_xattr("/labelled", "user.b", "2")?;
    /// let mut names = image.list_xattr("/labelled")?;
    /// names.sort();
    /// assert_eq!(names, ["user.a", "user.b"]);
    /// # std::fs::remove_file(&path)?;
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn list_xattr(&self, path: impl AsRef<Path>) -> Result<Vec<OsString>> {
        let ino = self.resolve(bytes(path.as_ref()), false)?;
        let names = self.fs().listxattr(ino)?;
        Ok(names.into_iter().map(OsString::from_vec).collect())
    }

    /// Remove extended attribute `name`: `Err` with ENODATA (kind
    /// `Uncategorized`) if there is none.
    ///
    /// ```
    /// # let path = std::env::temp_dir().join(format!("jext4-doc-image-remove-xattr-{}.img", std::process::id()));
    /// # let made = std::process::Command::new("mke2fs").args(["-q", "-F", "-t", "ext4"]).arg(&path).arg("8M").output()?;
    /// # assert!(made.status.success(), "mke2fs: {made:?}");
    /// let image = jext4::Image::open(&path)?;
    /// image.write("/marked", "")?;
    /// image.set_xattr("/marked", "user.flag", "")?;
    /// image.remove_xattr("/marked", "user.flag")?;
    /// assert_eq!(image.xattr("/marked", "user.flag")?, None);
    /// assert!(image.remove_xattr("/marked", "user.flag").is_err()); // ENODATA
    /// # std::fs::remove_file(&path)?;
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn remove_xattr(&self, path: impl AsRef<Path>, name: impl AsRef<OsStr>) -> Result<()> {
        let ino = self.resolve(bytes(path.as_ref()), false)?;
        let name = name.as_ref().as_bytes();
        self.fs().removexattr(ino, name, self.shared.caller)
    }

    /// The inode flags of `path` a user may see, as `lsattr` shows them
    /// (`FS_IOC_GETFLAGS`): `FS_*_FL` bits such as
    /// [`CASEFOLD_FL`](crate::CASEFOLD_FL).
    pub fn flags(&self, path: impl AsRef<Path>) -> Result<u32> {
        let ino = self.resolve(bytes(path.as_ref()), true)?;
        self.fs().inode_flags(ino)
    }

    /// Set the inode flags of `path`, as `chattr` does (`FS_IOC_SETFLAGS`:
    /// read them with [`flags`](Self::flags), change bits, set them). jext4
    /// keeps and acts on +i (immutable) and +a (append only), which need
    /// CAP_LINUX_IMMUTABLE (EPERM otherwise), +d, +A and +S, and on
    /// directories +D, +P (project inheritance) and +F
    /// ([`CASEFOLD_FL`](crate::CASEFOLD_FL): names match whatever their
    /// case, on an image with the `casefold` feature, for an empty
    /// directory only — ENOTEMPTY otherwise), and +j
    /// ([`JOURNAL_DATA_FL`](crate::JOURNAL_DATA_FL), which needs
    /// CAP_SYS_RESOURCE: the file's data journaled; cleared, the file stays
    /// journaled until the image is opened again). A change of another flag, or
    /// a flag the kind of file cannot have, is EOPNOTSUPP.
    pub fn set_flags(&self, path: impl AsRef<Path>, flags: u32) -> Result<()> {
        let ino = self.resolve(bytes(path.as_ref()), true)?;
        self.fs().set_inode_flags(ino, flags, self.shared.caller)
    }

    /// Make the file at `path` an fs-verity file, as `FS_IOC_ENABLE_VERITY`
    /// with SHA-256 and no salt does (`fsverity enable`): its Merkle tree
    /// is built and stored past its end, and from then on it is read-only
    /// and every read is checked against the tree (a block that no longer
    /// matches is EIO). The image needs the `verity` feature (`tune2fs -O
    /// verity`), as the kernel does; a verity file again is EEXIST.
    pub fn enable_verity(&self, path: impl AsRef<Path>) -> Result<()> {
        self.enable_verity_with(path, &VerityOptions::new())
    }

    /// `enable_verity` with a Merkle block size, a salt or a signature
    /// (`VerityOptions`), as `fsverity enable --block-size --salt
    /// --signature`: `verity_digest` then gives the digest `fsverity
    /// digest` prints for the same content with the same block size and
    /// salt. Parameters the kernel refuses are EINVAL or EMSGSIZE.
    pub fn enable_verity_with(
        &self,
        path: impl AsRef<Path>,
        options: &VerityOptions,
    ) -> Result<()> {
        let ino = self.resolve(bytes(path.as_ref()), true)?;
        self.fs()
            .enable_verity_with(ino, self.shared.caller, &options.params)
    }

    /// The fs-verity digest of the file at `path` (`FS_IOC_MEASURE_VERITY`):
    /// the SHA-256 `fsverity digest` prints for the same content; ENODATA
    /// (`Error::NoAttribute`) for a file that is not a verity file.
    pub fn verity_digest(&self, path: impl AsRef<Path>) -> Result<[u8; 32]> {
        let ino = self.resolve(bytes(path.as_ref()), true)?;
        self.fs().verity_digest(ino)
    }

    // ----- The engine underneath (unstable, hidden from the docs) -----

    /// The engine, for inode-level work (the image tools, the FUSE
    /// server's tests). Not part of the stable API.
    #[doc(hidden)]
    pub fn fs(&self) -> &Arc<Fs> {
        &self.shared.fs
    }

    /// Who the engine-level operations run as: the process's user and
    /// group, without a umask (modes given are modes used).
    #[doc(hidden)]
    pub fn caller(&self) -> Caller {
        self.shared.caller
    }

    /// The inode `path` names; `follow_last` follows a final symlink
    /// (`stat` against `lstat`).
    #[doc(hidden)]
    pub fn inode_of(&self, path: impl AsRef<Path>, follow_last: bool) -> Result<u32> {
        self.resolve(bytes(path.as_ref()), follow_last)
    }

    /// The directory that holds `path`'s last component, and that
    /// component ("/a/b/" gives a's inode and "b").
    #[doc(hidden)]
    pub fn parent_and_name<'p, P: AsRef<Path> + ?Sized>(
        &self,
        path: &'p P,
    ) -> Result<(u32, &'p [u8])> {
        self.parent_of(bytes(path.as_ref()))
    }

    /// Change attributes of `path` itself (not following a final link)
    /// as the engine's `setattr` does; returns the new attributes.
    #[doc(hidden)]
    pub fn set_attr(&self, path: impl AsRef<Path>, changes: &SetAttr) -> Result<Attr> {
        let ino = self.resolve(bytes(path.as_ref()), false)?;
        self.fs().setattr(ino, changes, self.shared.caller)
    }

    // ----- Path resolution -----

    /// Split a path into its parent directory's inode and its last name.
    pub(super) fn parent_of<'p>(&self, path: &'p [u8]) -> Result<(u32, &'p [u8])> {
        let end = path.iter().rposition(|&b| b != b'/').map_or(0, |at| at + 1);
        let trimmed = &path[..end];
        let (dir, name) = match trimmed.iter().rposition(|&b| b == b'/') {
            Some(at) => (&trimmed[..at], &trimmed[at + 1..]),
            None => (&trimmed[..0], trimmed),
        };
        if name.is_empty() || name == b"." || name == b".." {
            return Err(Error::Invalid(format!(
                "'{}' does not name an entry",
                OsStr::from_bytes(path).to_string_lossy()
            )));
        }
        Ok((self.resolve(dir, true)?, name))
    }

    /// The inode a path names; `follow_last` follows a final symlink.
    pub(super) fn resolve(&self, path: &[u8], follow_last: bool) -> Result<u32> {
        let fs = self.fs();
        let mut pending: Vec<Vec<u8>> = components(path);
        pending.reverse();
        let mut current = ROOT_INO;
        let mut links = 0;
        while let Some(name) = pending.pop() {
            let attr = fs.lookup(current, &name)?;
            let last = pending.is_empty();
            if attr.kind == FileKind::Symlink && (!last || follow_last) {
                links += 1;
                if links > MAX_SYMLINKS {
                    return Err(Error::TooManySymlinks);
                }
                let target = fs.readlink(attr.ino)?;
                if target.first() == Some(&b'/') {
                    current = ROOT_INO;
                }
                pending.extend(components(&target).into_iter().rev());
                continue;
            }
            if !last && attr.kind != FileKind::Directory {
                return Err(Error::NotDirectory);
            }
            current = attr.ino;
        }
        Ok(current)
    }
}

impl std::fmt::Debug for Image {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Image")
            .field("read_only", &self.shared.fs.is_read_only())
            .field("umask", &format_args!("{:o}", self.shared.umask))
            .finish()
    }
}
