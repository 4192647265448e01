//! An image tree onto the host (`jext4 cp -a IMAGE:SRC DEST`).
//!
//! The walk reads the image through the engine and writes the host with
//! ordinary system calls. What the host refuses a user who is not root —
//! owners, device nodes, `trusted.*` and `security.*` attributes — is
//! left out and said once per kind in the report, not per entry; the rest
//! of the entry is copied. Directories get their modes, xattrs and times
//! after everything inside them is written (a read-only directory must
//! first be filled, and filling one changes its mtime).

use super::{CopyOptions, Failure, Notes, Progress, Report, clamp, host, imagepath, is_fatal};
use crate::api::Image;
use crate::error::Error;
use crate::fs::{Attr, FileKind, Fs, SeekWhence};
use std::collections::HashMap;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// The bytes read from the image at a time.
const COPY_BUFFER_BYTES: usize = 1 << 20;

/// Copy `source` in `image` (a directory with everything under it, or one
/// entry; a final symlink is copied as a symlink) to `dest` on the host:
/// `dest` is the new entry's own path, its parent must exist.
pub fn copy_out(
    image: &Image,
    source: &str,
    dest: &Path,
    options: &CopyOptions,
    progress: &Progress,
) -> Result<Report, Failure> {
    let fs = image.fs();
    let failure = |error| Failure {
        path: source.to_string(),
        error,
    };
    let ino = image.inode_of(source, false).map_err(failure)?;
    let attr = fs.getattr(ino).map_err(failure)?;
    let mut exporter = Exporter {
        fs,
        options,
        progress,
        notes: Notes::default(),
        links: HashMap::new(),
        directories: Vec::new(),
        root: host::is_root(),
    };
    let mut pending = vec![(
        attr,
        imagepath::trim_slashes(source).to_string(),
        dest.to_path_buf(),
    )];
    // Depth first, without recursion: a deep tree cannot exhaust the stack.
    while let Some((attr, image_path, host_path)) = pending.pop() {
        let done = exporter.entry(&attr, &host_path);
        match done {
            Ok(()) if attr.kind == FileKind::Directory => {
                exporter
                    .children(attr.ino, &image_path, &host_path, &mut pending)
                    .map_err(|error| Failure {
                        path: image_path.clone(),
                        error,
                    })?;
                exporter.directories.push((attr, host_path));
            }
            Ok(()) => {}
            Err(error) if is_fatal(&error) && !matches!(error, Error::Io(_)) => {
                return Err(Failure {
                    path: image_path,
                    error,
                });
            }
            // A host error (no space, permission) fails this entry only.
            Err(error) => exporter.notes.skip(host_path, "cannot create", error),
        }
    }
    exporter.finish_directories();
    Ok(exporter.notes.into_report(progress))
}

struct Exporter<'a> {
    fs: &'a Fs,
    options: &'a CopyOptions,
    progress: &'a Progress,
    notes: Notes,
    /// Host paths of inodes with several links, by image inode.
    links: HashMap<u32, PathBuf>,
    directories: Vec<(Attr, PathBuf)>,
    root: bool,
}

impl Exporter<'_> {
    /// The entries of image directory `ino`, queued for the walk.
    fn children(
        &self,
        ino: u32,
        image_path: &str,
        host_path: &Path,
        pending: &mut Vec<(Attr, String, PathBuf)>,
    ) -> Result<(), Error> {
        for entry in self.fs.entries(ino)?.into_iter().rev() {
            let attr = self.fs.getattr(entry.ino)?;
            let name = std::ffi::OsStr::from_bytes(&entry.name);
            pending.push((
                attr,
                imagepath::join(image_path, &name.to_string_lossy()),
                host_path.join(name),
            ));
        }
        Ok(())
    }

    /// Create one entry on the host (a directory without its final
    /// attributes).
    fn entry(&mut self, attr: &Attr, path: &Path) -> Result<(), Error> {
        if attr.kind != FileKind::Directory && self.options.preserve && attr.nlink > 1 {
            if let Some(first) = self.links.get(&attr.ino) {
                remove_non_directory(path)?;
                std::fs::hard_link(first, path)?;
                self.done(path);
                return Ok(());
            }
            self.links.insert(attr.ino, path.to_path_buf());
        }
        match attr.kind {
            FileKind::Directory => match std::fs::create_dir(path) {
                Err(error) if error.kind() == io::ErrorKind::AlreadyExists && path.is_dir() => {}
                result => result?,
            },
            FileKind::Regular => self.file(attr, path)?,
            FileKind::Symlink => {
                let target = self.fs.readlink(attr.ino)?;
                remove_non_directory(path)?;
                std::os::unix::fs::symlink(std::ffi::OsStr::from_bytes(&target), path)?;
            }
            _ => {
                remove_non_directory(path)?;
                let type_bits = mode_type(attr.kind);
                let rdev = libc::makedev(
                    libc::major(attr.rdev as libc::dev_t),
                    libc::minor(attr.rdev as libc::dev_t),
                );
                match host::mknod(path, type_bits | 0o600, rdev) {
                    Err(error) if error.raw_os_error() == Some(libc::EPERM) && !self.root => {
                        self.notes
                            .not_kept("device nodes (only root may create them)".into());
                        return Ok(());
                    }
                    result => result?,
                }
            }
        }
        if attr.kind != FileKind::Directory {
            self.attributes(attr, path);
        }
        self.done(path);
        Ok(())
    }

    fn done(&self, path: &Path) {
        self.progress.entry();
        if let Some(report) = &self.progress.verbose {
            report("", &path.to_string_lossy());
        }
    }

    /// A regular file's data, holes kept (SEEK_DATA in the image).
    fn file(&self, attr: &Attr, path: &Path) -> Result<(), Error> {
        let file = match std::fs::File::create(path) {
            Err(error) if error.kind() == io::ErrorKind::PermissionDenied => {
                // A read-only file from an earlier copy: replace it.
                remove_non_directory(path)?;
                std::fs::File::create(path)?
            }
            result => result?,
        };
        let mut offset = 0;
        while offset < attr.size {
            let data = match self.fs.seek(attr.ino, offset, SeekWhence::Data) {
                Ok(data) => data,
                Err(Error::Io(error)) if error.raw_os_error() == Some(libc::ENXIO) => break,
                Err(error) => return Err(error),
            };
            let hole = self.fs.seek(attr.ino, data, SeekWhence::Hole)?;
            let mut position = data;
            while position < hole {
                let want = COPY_BUFFER_BYTES.min((hole - position) as usize);
                let bytes = self.fs.read(attr.ino, position, want)?;
                if bytes.is_empty() {
                    break;
                }
                file.write_all_at(&bytes, position)?;
                position += bytes.len() as u64;
                self.progress.bytes(bytes.len() as u64);
            }
            offset = hole.max(position);
        }
        file.set_len(attr.size)?;
        Ok(())
    }

    /// Owner, mode, xattrs and times, in that order (chown clears set-id
    /// bits; the times last, as every other change moves them).
    fn attributes(&self, attr: &Attr, path: &Path) {
        if !self.options.preserve {
            if attr.kind != FileKind::Symlink {
                let mode = (attr.perm & 0o777 & !self.options.umask) as u32;
                self.host_step(
                    "modes",
                    std::fs::set_permissions(path, PermissionsExt::from_mode(mode)),
                );
            }
            return;
        }
        let (uid, gid) = self.options.owner.unwrap_or((attr.uid, attr.gid));
        match host::lchown(path, uid, gid) {
            Err(error) if error.raw_os_error() == Some(libc::EPERM) && !self.root => self
                .notes
                .not_kept("owners (only root may give files away)".into()),
            result => self.host_step("owners", result),
        }
        if attr.kind != FileKind::Symlink {
            let mode = std::fs::Permissions::from_mode(attr.perm as u32);
            self.host_step("modes", std::fs::set_permissions(path, mode));
        }
        self.xattrs(attr.ino, path);
        let limit = self.options.clamp_time;
        let atime = clamp((attr.atime.sec, attr.atime.nsec), limit);
        let mtime = clamp((attr.mtime.sec, attr.mtime.nsec), limit);
        self.host_step("times", host::set_times(path, atime, mtime));
    }

    /// Every xattr of the image entry the host takes.
    fn xattrs(&self, ino: u32, path: &Path) {
        let names = match self.fs.listxattr(ino) {
            Ok(names) => names,
            Err(Error::NotSupported) => return,
            Err(error) => {
                self.notes
                    .not_kept(format!("extended attributes: {}", super::describe(&error)));
                return;
            }
        };
        for name in names {
            let value = match self.fs.getxattr(ino, &name) {
                Ok(value) => value,
                Err(_) => continue, // removed meanwhile
            };
            if let Err(error) = host::set_xattr(path, &name, &value) {
                let namespace = String::from_utf8_lossy(&name)
                    .split('.')
                    .next()
                    .unwrap_or("")
                    .to_string();
                self.notes.not_kept(format!(
                    "{namespace}.* extended attributes: {}",
                    super::strerror(error.raw_os_error().unwrap_or(libc::EIO))
                ));
            }
        }
    }

    /// A host step that failed for a reason other than privilege: said
    /// once per kind.
    fn host_step(&self, what: &str, result: io::Result<()>) {
        if let Err(error) = result {
            self.notes.not_kept(format!(
                "{what}: {}",
                super::strerror(error.raw_os_error().unwrap_or(libc::EIO))
            ));
        }
    }

    /// Directories' attributes, deepest first.
    fn finish_directories(&mut self) {
        let directories = std::mem::take(&mut self.directories);
        for (attr, path) in directories.iter().rev() {
            self.attributes(attr, path);
        }
    }
}

/// Make room for a new non-directory at `path`: a file, symlink or node
/// there goes, as `cp --remove-destination` would after a failed open.
fn remove_non_directory(path: &Path) -> io::Result<()> {
    match std::fs::symlink_metadata(path) {
        Ok(meta) if meta.is_dir() => Err(io::Error::from_raw_os_error(libc::EISDIR)),
        Ok(_) => std::fs::remove_file(path),
        Err(error) if error.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(error) => Err(error),
    }
}

/// The S_IFMT bits of a special file's kind.
fn mode_type(kind: FileKind) -> u32 {
    match kind {
        FileKind::CharDevice => libc::S_IFCHR,
        FileKind::BlockDevice => libc::S_IFBLK,
        FileKind::Fifo => libc::S_IFIFO,
        _ => libc::S_IFSOCK,
    }
}
