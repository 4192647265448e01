//! The library front end: an ext2/3/4 image opened in-process, without
//! FUSE and without root, addressed by paths.
//!
//! ```no_run
//! use jext4::api::Image;
//! let image = Image::open("disk.img")?;
//! image.create_dir_all("/etc/app")?;
//! image.write_file("/etc/app/config", b"key = value\n")?;
//! image.rename("/etc/app/config", "/etc/app/config.old")?;
//! assert_eq!(image.read_file("/etc/app/config.old")?, b"key = value\n");
//! image.close()?;
//! # Ok::<(), jext4::Error>(())
//! ```
//!
//! Paths are absolute or relative to the root; symbolic links are followed
//! in every component but the last (like `lstat`), at most 40 times.

use crate::error::{Error, Result};
use crate::format::superblock::ROOT_INO;
use crate::fs::{Attr, Caller, Dentry, FileKind, Fs, MountOptions, RenameFlags, SetAttr};
use std::path::Path;
use std::sync::Arc;

/// Symbolic links followed while resolving one path (Linux's MAXSYMLINKS).
const MAX_SYMLINKS: u32 = 40;

/// An open image.
pub struct Image {
    fs: Arc<Fs>,
    caller: Caller,
}

/// An open regular file of an `Image`.
pub struct File<'i> {
    image: &'i Image,
    ino: u32,
}

impl Image {
    /// Open an image file (or block device) read-write with default options.
    pub fn open(path: impl AsRef<Path>) -> Result<Image> {
        Image::open_with(path, MountOptions::default())
    }

    pub fn open_with(path: impl AsRef<Path>, options: MountOptions) -> Result<Image> {
        Ok(Image {
            fs: Fs::open(path.as_ref(), options)?,
            // New files belong to the calling process's user.
            // No umask: a mode given is the mode used, unless the
            // directory's default ACL restricts it, as it would the kernel's.
            // SAFETY: getuid/getgid have no preconditions.
            caller: Caller::new(unsafe { libc::getuid() }, unsafe { libc::getgid() }),
        })
    }

    /// An image over an engine already mounted (on any `BlockDevice`:
    /// the crash tests' recording device, an NBD export), whose
    /// operations run as `caller`. `close` unmounts it.
    pub fn from_fs(fs: Arc<Fs>, caller: Caller) -> Image {
        Image { fs, caller }
    }

    /// The engine, for callers that need inode-level operations.
    pub fn fs(&self) -> &Arc<Fs> {
        &self.fs
    }

    /// Who the image's operations run as: the calling process's user.
    pub fn caller(&self) -> Caller {
        self.caller
    }

    /// The inode `path` names; `follow_last` follows a final symlink
    /// (`stat` against `lstat`).
    pub fn inode_of(&self, path: &str, follow_last: bool) -> Result<u32> {
        self.resolve(path, follow_last)
    }

    /// The directory that holds `path`'s last component, and that
    /// component ("/a/b/" gives a's inode and "b").
    pub fn parent_and_name<'p>(&self, path: &'p str) -> Result<(u32, &'p [u8])> {
        self.parent_of(path)
    }

    /// Split a path into its parent directory's inode and its last name.
    fn parent_of<'p>(&self, path: &'p str) -> Result<(u32, &'p [u8])> {
        let trimmed = path.trim_end_matches('/');
        let (dir, name) = match trimmed.rfind('/') {
            Some(at) => (&trimmed[..at], &trimmed[at + 1..]),
            None => ("", trimmed),
        };
        if name.is_empty() || name == "." || name == ".." {
            return Err(Error::Invalid(format!("'{path}' does not name an entry")));
        }
        Ok((self.resolve(dir, true)?, name.as_bytes()))
    }

    /// The inode a path names; `follow_last` follows a final symlink.
    fn resolve(&self, path: &str, follow_last: bool) -> Result<u32> {
        let mut pending: Vec<Vec<u8>> = components(path.as_bytes());
        pending.reverse();
        let mut current = ROOT_INO;
        let mut links = 0;
        while let Some(name) = pending.pop() {
            let attr = self.fs.lookup(current, &name)?;
            let last = pending.is_empty();
            if attr.kind == FileKind::Symlink && (!last || follow_last) {
                links += 1;
                if links > MAX_SYMLINKS {
                    return Err(Error::InvalidMove);
                }
                let target = self.fs.readlink(attr.ino)?;
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

    pub fn metadata(&self, path: &str) -> Result<Attr> {
        self.fs.getattr(self.resolve(path, true)?)
    }

    pub fn symlink_metadata(&self, path: &str) -> Result<Attr> {
        self.fs.getattr(self.resolve(path, false)?)
    }

    pub fn create_dir(&self, path: &str, mode: u16) -> Result<Attr> {
        let (parent, name) = self.parent_of(path)?;
        self.fs.mkdir(parent, name, mode, self.caller)
    }

    /// Create a directory and every missing parent (mode 0755).
    pub fn create_dir_all(&self, path: &str) -> Result<()> {
        let mut current = ROOT_INO;
        for name in components(path.as_bytes()) {
            current = match self.fs.lookup(current, &name) {
                Ok(attr) if attr.kind == FileKind::Directory => attr.ino,
                Ok(_) => return Err(Error::Exists),
                Err(Error::NotFound) => self.fs.mkdir(current, &name, 0o755, self.caller)?.ino,
                Err(error) => return Err(error),
            };
        }
        Ok(())
    }

    /// Create (or truncate) a file and write `data` into it.
    pub fn write_file(&self, path: &str, data: &[u8]) -> Result<()> {
        let file = self.create(path, 0o644)?;
        file.set_len(0)?;
        file.write_at(0, data)?;
        Ok(())
    }

    pub fn read_file(&self, path: &str) -> Result<Vec<u8>> {
        let file = self.open_file(path)?;
        let size = file.metadata()?.size;
        file.read_at(0, size as usize)
    }

    /// Open an existing regular file.
    pub fn open_file(&self, path: &str) -> Result<File<'_>> {
        let ino = self.resolve(path, true)?;
        let attr = self.fs.open_file(ino)?;
        if attr.kind != FileKind::Regular {
            self.fs.release_file(ino)?;
            return Err(if attr.kind == FileKind::Directory {
                Error::IsDirectory
            } else {
                Error::Invalid("not a regular file".into())
            });
        }
        Ok(File { image: self, ino })
    }

    /// Open a file, creating it with `mode` if it does not exist.
    pub fn create(&self, path: &str, mode: u16) -> Result<File<'_>> {
        let (parent, name) = self.parent_of(path)?;
        match self.fs.create(parent, name, mode, self.caller) {
            Ok(attr) => {
                self.fs.open_file(attr.ino)?;
                Ok(File {
                    image: self,
                    ino: attr.ino,
                })
            }
            Err(Error::Exists) => self.open_file(path),
            Err(error) => Err(error),
        }
    }

    pub fn symlink(&self, target: &str, path: &str) -> Result<Attr> {
        let (parent, name) = self.parent_of(path)?;
        self.fs
            .symlink(parent, name, target.as_bytes(), self.caller)
    }

    pub fn read_link(&self, path: &str) -> Result<Vec<u8>> {
        self.fs.readlink(self.resolve(path, false)?)
    }

    pub fn hard_link(&self, existing: &str, new: &str) -> Result<Attr> {
        let ino = self.resolve(existing, false)?;
        let (parent, name) = self.parent_of(new)?;
        self.fs.link(ino, parent, name, self.caller)
    }

    pub fn rename(&self, from: &str, to: &str) -> Result<()> {
        let (old_parent, old_name) = self.parent_of(from)?;
        let (new_parent, new_name) = self.parent_of(to)?;
        self.fs.rename(
            old_parent,
            old_name,
            new_parent,
            new_name,
            RenameFlags::default(),
            self.caller,
        )
    }

    pub fn remove_file(&self, path: &str) -> Result<()> {
        let (parent, name) = self.parent_of(path)?;
        self.fs.unlink(parent, name, self.caller)
    }

    pub fn remove_dir(&self, path: &str) -> Result<()> {
        let (parent, name) = self.parent_of(path)?;
        self.fs.rmdir(parent, name, self.caller)
    }

    /// Remove a directory and everything under it (like
    /// `std::fs::remove_dir_all`; symbolic links are removed, not
    /// followed). Iterative, so a deep tree cannot exhaust the stack.
    pub fn remove_dir_all(&self, path: &str) -> Result<()> {
        let (parent, name) = self.parent_of(path)?;
        let top = self.fs.lookup(parent, name)?;
        if top.kind != FileKind::Directory {
            return Err(Error::NotDirectory);
        }
        // Directories still to empty, deepest last; each entry is (parent,
        // name, inode) so that it can be removed once empty.
        let mut pending = vec![(parent, name.to_vec(), top.ino)];
        while let Some((dir_parent, dir_name, dir)) = pending.pop() {
            let mut subdirectories = Vec::new();
            for entry in self.fs.entries(dir)? {
                if entry.kind == FileKind::Directory {
                    subdirectories.push((dir, entry.name, entry.ino));
                } else {
                    self.fs.unlink(dir, &entry.name, self.caller)?;
                }
            }
            if subdirectories.is_empty() {
                self.fs.rmdir(dir_parent, &dir_name, self.caller)?;
            } else {
                // Come back to this directory once its children are gone.
                pending.push((dir_parent, dir_name, dir));
                pending.extend(subdirectories);
            }
        }
        Ok(())
    }

    /// Names in a directory, without "." and "..".
    pub fn read_dir(&self, path: &str) -> Result<Vec<Dentry>> {
        let ino = self.resolve(path, true)?;
        self.fs.entries(ino)
    }

    pub fn set_attr(&self, path: &str, changes: &SetAttr) -> Result<Attr> {
        self.fs
            .setattr(self.resolve(path, false)?, changes, self.caller)
    }

    pub fn set_xattr(&self, path: &str, name: &str, value: &[u8]) -> Result<()> {
        let ino = self.resolve(path, false)?;
        self.fs.setxattr(
            ino,
            name.as_bytes(),
            value,
            crate::fs::XattrMode::Any,
            self.caller,
        )
    }

    pub fn get_xattr(&self, path: &str, name: &str) -> Result<Vec<u8>> {
        self.fs
            .getxattr(self.resolve(path, false)?, name.as_bytes())
    }

    /// Names of every extended attribute of `path` (not following a final
    /// symlink), with their namespace prefixes.
    pub fn list_xattr(&self, path: &str) -> Result<Vec<Vec<u8>>> {
        self.fs.listxattr(self.resolve(path, false)?)
    }

    pub fn remove_xattr(&self, path: &str, name: &str) -> Result<()> {
        let ino = self.resolve(path, false)?;
        self.fs.removexattr(ino, name.as_bytes(), self.caller)
    }

    /// Make everything written so far durable.
    pub fn sync(&self) -> Result<()> {
        self.fs.sync()
    }

    /// fsync(2) of the directory at `path`: the names created, renamed,
    /// linked and removed in it, and the files it names that changed, are
    /// durable on return (`Fs::fsync_dir`; on images without fast commits
    /// everything is, as `sync`).
    pub fn sync_dir(&self, path: &str) -> Result<()> {
        let ino = self.resolve(path, true)?;
        if self.fs.getattr(ino)?.kind != FileKind::Directory {
            return Err(Error::NotDirectory);
        }
        self.fs.fsync_dir(ino)
    }

    /// Write everything, mark the filesystem clean and release the image.
    pub fn close(self) -> Result<()> {
        self.fs.unmount()
    }
}

impl File<'_> {
    pub fn metadata(&self) -> Result<Attr> {
        self.image.fs.getattr(self.ino)
    }

    pub fn read_at(&self, offset: u64, size: usize) -> Result<Vec<u8>> {
        self.image.fs.read(self.ino, offset, size)
    }

    pub fn write_at(&self, offset: u64, data: &[u8]) -> Result<usize> {
        self.image
            .fs
            .write(self.ino, offset, data, self.image.caller)
    }

    pub fn set_len(&self, size: u64) -> Result<()> {
        self.image.fs.truncate(self.ino, size, self.image.caller)
    }

    /// fsync(2): this file's data and metadata are durable on return.
    pub fn sync_all(&self) -> Result<()> {
        self.image.fs.fsync(self.ino, false)
    }

    /// fdatasync(2).
    pub fn sync_data(&self) -> Result<()> {
        self.image.fs.fsync(self.ino, true)
    }
}

impl Drop for File<'_> {
    fn drop(&mut self) {
        if let Err(error) = self.image.fs.release_file(self.ino) {
            tracing::error!(%error, ino = self.ino, "releasing a file failed");
        }
    }
}

fn components(path: &[u8]) -> Vec<Vec<u8>> {
    path.split(|&b| b == b'/')
        .filter(|part| !part.is_empty() && *part != b".")
        .map(<[u8]>::to_vec)
        .collect()
}
