//! `File`: an open file of an image, shaped like `std::fs::File`.
//!
//! A `File` owns a share of its image (no lifetime: it can be stored,
//! returned and sent to another thread) and keeps the inode open in the
//! engine, so that a name removed while it is open frees the inode only
//! when the file is dropped, as unlink(2) of an open file does.
//!
//! Its position is its own, as a descriptor's is: `Read`, `Write` and
//! `Seek` move it, under a lock that also serialises `&File` readers and
//! writers (the kernel's `f_pos_lock`); `FileExt::read_at`/`write_at`
//! leave it alone and run in parallel.

use super::Image;
use super::image::Shared;
use super::metadata::Metadata;
use super::options::OpenOptions;
use crate::error::{Error, Result};
use crate::fs::{FileKind, SetAttr};
use parking_lot::Mutex;
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::os::unix::fs::PermissionsExt;
use std::sync::Arc;

/// An open file of an `Image` (std's `File`): `Read`, `Write`, `Seek`
/// and `std::os::unix::fs::FileExt`, for `File` and `&File`.
///
/// Made by `Image::open_file`, `Image::create_file` and
/// `Image::open_with`. `Send + Sync`.
///
/// ```
/// use std::io::{Seek, SeekFrom, Write};
/// use std::os::unix::fs::FileExt;
/// # let path = std::env::temp_dir().join(format!("jext4-doc-file-{}.img", std::process::id()));
/// # let made = std::process::Command::new("mke2fs").args(["-q", "-F", "-t", "ext4"]).arg(&path).arg("8M").output()?;
/// # assert!(made.status.success(), "mke2fs: {made:?}");
/// let image = jext4::Image::open(&path)?;
/// let mut file = image.create_file("/data")?;
/// file.write_all(b"hello world")?;
/// file.seek(SeekFrom::Start(6))?;
/// file.write_all(b"there")?;
/// file.sync_all()?; // durable from here
/// let mut word = [0u8; 5];
/// image.open_file("/data")?.read_exact_at(&mut word, 0)?;
/// assert_eq!(&word, b"hello");
/// # std::fs::remove_file(&path)?;
/// # Ok::<(), std::io::Error>(())
/// ```
pub struct File {
    shared: Arc<Shared>,
    ino: u32,
    kind: FileKind,
    readable: bool,
    writable: bool,
    append: bool,
    /// The offset `Read`, `Write` and `Seek` use.
    position: Mutex<u64>,
}

/// EBADF, as a read of a write-only descriptor (or the reverse) gives.
fn bad_descriptor() -> io::Error {
    io::Error::from_raw_os_error(libc::EBADF)
}

impl File {
    /// `open(2)` of `path` in `image` as `options` say.
    pub(super) fn open(image: &Image, path: &[u8], options: &OpenOptions) -> Result<File> {
        options.check()?;
        let no_follow = options.custom_flags & libc::O_NOFOLLOW != 0;
        let exclusive =
            options.create_new || (options.create && options.custom_flags & libc::O_EXCL != 0);
        let ino = if options.create || exclusive {
            image_create(image, path, options, exclusive, no_follow)?
        } else {
            let ino = image.resolve(path, !no_follow)?;
            if no_follow && image.fs().getattr(ino)?.kind == FileKind::Symlink {
                return Err(Error::TooManySymlinks);
            }
            ino
        };
        let fs = image.fs();
        let attr = fs.open_file(ino)?;
        let file = File {
            shared: image.shared.clone(),
            ino,
            kind: attr.kind,
            readable: options.read,
            writable: options.writes(),
            append: options.append,
            position: Mutex::new(0),
        };
        // From here on, dropping `file` releases the inode.
        match attr.kind {
            FileKind::Regular => {}
            FileKind::Directory if file.writable => return Err(Error::IsDirectory),
            FileKind::Directory => {}
            // A device, fifo or socket has nothing behind it here.
            _ => return Err(Error::NotSupported),
        }
        let truncate = options.truncate && file.writable && !options.create_new;
        fs.check_open(ino, file.writable, options.append, truncate)?;
        if truncate {
            fs.truncate(ino, 0, image.shared.caller)?;
        }
        Ok(file)
    }

    /// The inode number of the file.
    pub fn ino(&self) -> u64 {
        u64::from(self.ino)
    }

    /// The file's attributes now (`fstat(2)`; std's `File::metadata`).
    ///
    /// ```
    /// # let path = std::env::temp_dir().join(format!("jext4-doc-file-metadata-{}.img", std::process::id()));
    /// # let made = std::process::Command::new("mke2fs").args(["-q", "-F", "-t", "ext4"]).arg(&path).arg("8M").output()?;
    /// # assert!(made.status.success(), "mke2fs: {made:?}");
    /// let image = jext4::Image::open(&path)?;
    /// use std::io::Write;
    /// let mut file = image.create_file("/growing")?;
    /// file.write_all(b"12345")?;
    /// assert_eq!(file.metadata()?.len(), 5);
    /// # std::fs::remove_file(&path)?;
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn metadata(&self) -> Result<Metadata> {
        let _live = self.shared.live()?;
        Ok(self.shared.fs.getattr(self.ino)?.into())
    }

    /// Cut or extend the file to `size` bytes (`ftruncate(2)`; std's
    /// `File::set_len`): `InvalidInput` unless opened for writing. The
    /// position does not move.
    ///
    /// ```
    /// # let path = std::env::temp_dir().join(format!("jext4-doc-file-set-len-{}.img", std::process::id()));
    /// # let made = std::process::Command::new("mke2fs").args(["-q", "-F", "-t", "ext4"]).arg(&path).arg("8M").output()?;
    /// # assert!(made.status.success(), "mke2fs: {made:?}");
    /// let image = jext4::Image::open(&path)?;
    /// let file = image.create_file("/sparse")?;
    /// file.set_len(1 << 20)?; // a 1 MiB hole
    /// assert_eq!(image.metadata("/sparse")?.len(), 1 << 20);
    /// file.set_len(0)?;
    /// assert_eq!(image.metadata("/sparse")?.len(), 0);
    /// # std::fs::remove_file(&path)?;
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn set_len(&self, size: u64) -> Result<()> {
        if !self.writable {
            return Err(Error::Invalid(
                "set_len of a file not opened for writing".into(),
            ));
        }
        let _live = self.shared.live()?;
        self.shared.fs.truncate(self.ino, size, self.shared.caller)
    }

    /// `fsync(2)`: the file's data and metadata, and its name, are
    /// durable when this returns (a fast commit where the image has them).
    ///
    /// ```
    /// use std::io::Write;
    /// # let path = std::env::temp_dir().join(format!("jext4-doc-file-sync-all-{}.img", std::process::id()));
    /// # let made = std::process::Command::new("mke2fs").args(["-q", "-F", "-t", "ext4"]).arg(&path).arg("8M").output()?;
    /// # assert!(made.status.success(), "mke2fs: {made:?}");
    /// let image = jext4::Image::open(&path)?;
    /// let mut file = image.create_file("/ledger")?;
    /// file.write_all(b"entry 1\n")?;
    /// file.sync_all()?; // the data, its size and the name "/ledger" survive a crash
    /// # std::fs::remove_file(&path)?;
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn sync_all(&self) -> Result<()> {
        let _live = self.shared.live()?;
        if self.kind == FileKind::Directory {
            return self.shared.fs.fsync_dir(self.ino);
        }
        self.shared.fs.fsync(self.ino, false)
    }

    /// `fdatasync(2)`: the data, and the metadata needed to read it back
    /// (the size), are durable when this returns.
    ///
    /// ```
    /// # let path = std::env::temp_dir().join(format!("jext4-doc-file-sync-data-{}.img", std::process::id()));
    /// # let made = std::process::Command::new("mke2fs").args(["-q", "-F", "-t", "ext4"]).arg(&path).arg("8M").output()?;
    /// # assert!(made.status.success(), "mke2fs: {made:?}");
    /// let image = jext4::Image::open(&path)?;
    /// use std::io::Write;
    /// let mut log = image.open_with("/log", jext4::OpenOptions::new().append(true).create(true))?;
    /// log.write_all(b"committed\n")?;
    /// log.sync_data()?; // durable: a crash now keeps the line
    /// # std::fs::remove_file(&path)?;
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn sync_data(&self) -> Result<()> {
        let _live = self.shared.live()?;
        if self.kind == FileKind::Directory {
            return self.shared.fs.fsync_dir(self.ino);
        }
        self.shared.fs.fsync(self.ino, true)
    }

    /// Set the permission bits (`fchmod(2)`; std's
    /// `File::set_permissions`).
    ///
    /// ```
    /// # let path = std::env::temp_dir().join(format!("jext4-doc-file-set-permissions-{}.img", std::process::id()));
    /// # let made = std::process::Command::new("mke2fs").args(["-q", "-F", "-t", "ext4"]).arg(&path).arg("8M").output()?;
    /// # assert!(made.status.success(), "mke2fs: {made:?}");
    /// let image = jext4::Image::open(&path)?;
    /// use std::os::unix::fs::PermissionsExt;
    /// let file = image.create_file("/tool")?;
    /// file.set_permissions(std::fs::Permissions::from_mode(0o755))?;
    /// assert_eq!(file.metadata()?.permissions().mode() & 0o777, 0o755);
    /// # std::fs::remove_file(&path)?;
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn set_permissions(&self, permissions: std::fs::Permissions) -> Result<()> {
        let _live = self.shared.live()?;
        let changes = SetAttr {
            mode: Some((permissions.mode() & 0o7777) as u16),
            ..SetAttr::default()
        };
        self.shared
            .fs
            .setattr(self.ino, &changes, self.shared.caller)?;
        Ok(())
    }

    /// Read at `offset` into `buf`, up to its length; 0 at the end.
    fn read_into(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        if !self.readable {
            return Err(bad_descriptor());
        }
        let _live = self.shared.live()?;
        let data = self.shared.fs.read(self.ino, offset, buf.len())?;
        debug_assert!(data.len() <= buf.len(), "the engine read more than asked");
        buf[..data.len()].copy_from_slice(&data);
        Ok(data.len())
    }

    /// Write `buf` at `offset` (the end, for an append, which is where
    /// it returns the write ended).
    fn write_from(&self, buf: &[u8], offset: u64, append: bool) -> io::Result<(usize, u64)> {
        if !self.writable {
            return Err(bad_descriptor());
        }
        let _live = self.shared.live()?;
        let fs = &self.shared.fs;
        let _append = append.then(|| self.shared.append.lock());
        let offset = match append {
            true => fs.getattr(self.ino)?.size,
            false => offset,
        };
        let written = fs.write(self.ino, offset, buf, self.shared.caller)?;
        Ok((written, offset + written as u64))
    }

    fn read_at_position(&self, buf: &mut [u8]) -> io::Result<usize> {
        let mut position = self.position.lock();
        let got = self.read_into(buf, *position)?;
        *position += got as u64;
        Ok(got)
    }

    fn write_at_position(&self, buf: &[u8]) -> io::Result<usize> {
        let mut position = self.position.lock();
        let (written, end) = self.write_from(buf, *position, self.append)?;
        *position = end;
        Ok(written)
    }

    fn seek_position(&self, to: SeekFrom) -> io::Result<u64> {
        let mut position = self.position.lock();
        let (base, delta) = match to {
            SeekFrom::Start(offset) => (offset, 0),
            SeekFrom::Current(delta) => (*position, delta),
            SeekFrom::End(delta) => (self.metadata()?.len(), delta),
        };
        let target = base
            .checked_add_signed(delta)
            .ok_or_else(|| io::Error::from_raw_os_error(libc::EINVAL))?;
        *position = target;
        Ok(target)
    }
}

/// The inode `path` names for an open with `create`: made if missing
/// (mode from `options`, less the umask), refused if `exclusive` and
/// present.
fn image_create(
    image: &Image,
    path: &[u8],
    options: &OpenOptions,
    exclusive: bool,
    no_follow: bool,
) -> Result<u32> {
    let (parent, name) = image.parent_of(path)?;
    let fs = image.fs();
    let mode = (options.mode & 0o7777) as u16;
    match fs.lookup(parent, name) {
        Err(Error::NotFound) => match fs.create(parent, name, mode, image.shared.creator()) {
            Ok(attr) => Ok(attr.ino),
            // Made by someone else in between: open it as found.
            Err(Error::Exists) if !exclusive => image.resolve(path, !no_follow),
            Err(error) => Err(error),
        },
        Ok(_) if exclusive => Err(Error::Exists),
        Ok(attr) if attr.kind == FileKind::Symlink && no_follow => Err(Error::TooManySymlinks),
        Ok(attr) if attr.kind == FileKind::Symlink => image.resolve(path, true),
        Ok(attr) => Ok(attr.ino),
        Err(error) => Err(error),
    }
}

impl Drop for File {
    fn drop(&mut self) {
        // After `close` the unmount released every open inode.
        let Ok(_live) = self.shared.live() else {
            return;
        };
        if let Err(error) = self.shared.fs.release_file(self.ino) {
            tracing::error!(%error, ino = self.ino, "releasing a file failed");
        }
    }
}

impl std::fmt::Debug for File {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("File")
            .field("ino", &self.ino)
            .field("read", &self.readable)
            .field("write", &self.writable)
            .field("append", &self.append)
            .finish()
    }
}

impl Read for File {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.read_at_position(buf)
    }
}

impl Read for &File {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.read_at_position(buf)
    }
}

impl Write for File {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.write_at_position(buf)
    }

    /// Nothing is buffered in a `File`: written data is in the engine
    /// (durable after `sync_data` or `sync_all`).
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl Write for &File {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.write_at_position(buf)
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl Seek for File {
    fn seek(&mut self, to: SeekFrom) -> io::Result<u64> {
        self.seek_position(to)
    }
}

impl Seek for &File {
    fn seek(&mut self, to: SeekFrom) -> io::Result<u64> {
        self.seek_position(to)
    }
}

impl std::os::unix::fs::FileExt for File {
    /// `pread(2)`: the position does not move.
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        self.read_into(buf, offset)
    }

    /// `pwrite(2)` at `offset`, even in append mode; the position does
    /// not move.
    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<usize> {
        self.write_from(buf, offset, false)
            .map(|(written, _)| written)
    }
}
