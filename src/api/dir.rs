//! Directory listings: `ReadDir` (std's `fs::read_dir` iterator),
//! `DirEntry`, and `Walk`, a depth-first walk of a tree.
//!
//! A listing reads the directory a batch of entries at a time, resuming
//! from the engine's readdir cookie (the position after the last entry
//! taken, as a FUSE readdir resumes), so that memory stays bounded
//! whatever the directory's size. Names added or removed while a listing
//! runs may or may not appear, as with readdir(3); none appears twice.

use super::image::Shared;
use super::metadata::{FileType, Metadata};
use crate::error::Error;
use crate::fs::{Dentry, FileKind};
use std::collections::VecDeque;
use std::ffi::{OsStr, OsString};
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Entries a listing holds between two reads of the directory.
const READ_DIR_BATCH_ENTRIES: usize = 128;

/// The entries of one directory, without `.` and `..` (std's `ReadDir`):
/// an `Iterator<Item = io::Result<DirEntry>>` made by `Image::read_dir`.
/// It owns a share of the image: no lifetime, `Send`.
pub struct ReadDir {
    shared: Arc<Shared>,
    ino: u32,
    /// The path the listing was asked for; entries' paths extend it.
    base: Arc<Path>,
    batch: VecDeque<Dentry>,
    /// Where the next read of the directory starts.
    cookie: u64,
    /// The directory's end was read (the batch may still hold entries).
    ended: bool,
    /// An error to hand out once the batch before it is out.
    failed: Option<Error>,
}

impl ReadDir {
    pub(super) fn new(shared: Arc<Shared>, ino: u32, base: PathBuf) -> ReadDir {
        ReadDir {
            shared,
            ino,
            base: base.into(),
            batch: VecDeque::with_capacity(READ_DIR_BATCH_ENTRIES),
            cookie: 0,
            ended: false,
            failed: None,
        }
    }

    /// Read the next batch from `cookie`.
    fn fill(&mut self) {
        debug_assert!(self.batch.is_empty() && !self.ended);
        let live = match self.shared.live() {
            Ok(live) => live,
            Err(error) => {
                self.ended = true;
                self.failed = Some(error);
                return;
            }
        };
        let batch = &mut self.batch;
        let cookie = &mut self.cookie;
        let mut refused = false;
        let result = self.shared.fs.readdir(self.ino, *cookie, &mut |entry| {
            if batch.len() >= READ_DIR_BATCH_ENTRIES {
                // Not taken: the next read starts with it.
                refused = true;
                return false;
            }
            *cookie = entry.next;
            if entry.name != b"." && entry.name != b".." {
                batch.push_back(entry);
            }
            true
        });
        drop(live);
        match result {
            Ok(()) => self.ended = !refused,
            Err(error) => {
                self.ended = true;
                self.failed = Some(error);
            }
        }
    }
}

impl Iterator for ReadDir {
    type Item = io::Result<DirEntry>;

    fn next(&mut self) -> Option<io::Result<DirEntry>> {
        // A batch can hold only "." and "..": read on until an entry or the end.
        while self.batch.is_empty() && !self.ended {
            self.fill();
        }
        match self.batch.pop_front() {
            Some(entry) => Some(Ok(DirEntry {
                shared: self.shared.clone(),
                base: self.base.clone(),
                entry,
            })),
            None => self.failed.take().map(|error| Err(error.into())),
        }
    }
}

impl std::fmt::Debug for ReadDir {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReadDir")
            .field("path", &self.base)
            .field("ino", &self.ino)
            .finish()
    }
}

/// One entry of a directory listing (std's `DirEntry`).
pub struct DirEntry {
    shared: Arc<Shared>,
    base: Arc<Path>,
    entry: Dentry,
}

impl DirEntry {
    /// The entry's name, bytes as on disk.
    ///
    /// ```
    /// # let path = std::env::temp_dir().join(format!("jext4-doc-dir-entry-{}.img", std::process::id()));
    /// # let made = std::process::Command::new("mke2fs").args(["-q", "-F", "-t", "ext4"]).arg(&path).arg("8M").output()?;
    /// # assert!(made.status.success(), "mke2fs: {made:?}");
    /// let image = jext4::Image::open(&path)?;
    /// image.create_dir("/etc")?;
    /// image.write("/etc/hosts", "127.0.0.1 localhost\n")?;
    /// let entry = image.read_dir("/etc")?.next().expect("one entry")?;
    /// assert_eq!(entry.file_name(), "hosts");
    /// assert_eq!(entry.path(), std::path::Path::new("/etc/hosts"));
    /// assert!(entry.file_type()?.is_file());
    /// assert_eq!(entry.metadata()?.len(), 20);
    /// assert_eq!(entry.ino(), image.metadata("/etc/hosts")?.ino());
    /// # std::fs::remove_file(&path)?;
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn file_name(&self) -> OsString {
        OsStr::from_bytes(&self.entry.name).to_os_string()
    }

    /// The path of the listing joined with the name.
    pub fn path(&self) -> PathBuf {
        self.base.join(OsStr::from_bytes(&self.entry.name))
    }

    /// The entry's type, from the directory entry itself (no inode read;
    /// a symbolic link is a link, not what it points to).
    pub fn file_type(&self) -> io::Result<FileType> {
        Ok(FileType(self.entry.kind))
    }

    /// The attributes of the inode the entry names, a symbolic link not
    /// followed (std's `DirEntry::metadata`).
    pub fn metadata(&self) -> io::Result<Metadata> {
        let _live = self.shared.live()?;
        Ok(self.shared.fs.getattr(self.entry.ino)?.into())
    }

    /// The inode number the entry names (`DirEntryExt::ino`).
    pub fn ino(&self) -> u64 {
        u64::from(self.entry.ino)
    }
}

impl std::fmt::Debug for DirEntry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("DirEntry").field(&self.path()).finish()
    }
}

/// A depth-first walk of a tree (`Image::walk`): every entry under the
/// starting directory, a directory's entry before its contents. Symbolic
/// links are not followed. An error (a directory that cannot be listed)
/// is handed out in its place and the walk goes on.
pub struct Walk {
    /// The listings open, outermost first: one per level of depth.
    stack: Vec<ReadDir>,
    /// A directory just handed out, to list before its next sibling.
    descend: Option<DirEntry>,
}

impl Walk {
    pub(super) fn new(top: ReadDir) -> Walk {
        Walk {
            stack: vec![top],
            descend: None,
        }
    }
}

impl Iterator for Walk {
    type Item = io::Result<DirEntry>;

    fn next(&mut self) -> Option<io::Result<DirEntry>> {
        if let Some(directory) = self.descend.take() {
            let base = directory.path();
            self.stack
                .push(ReadDir::new(directory.shared, directory.entry.ino, base));
        }
        loop {
            let listing = self.stack.last_mut()?;
            match listing.next() {
                None => {
                    self.stack.pop();
                }
                Some(Ok(entry)) => {
                    if entry.entry.kind == FileKind::Directory {
                        self.descend = Some(DirEntry {
                            shared: entry.shared.clone(),
                            base: entry.base.clone(),
                            entry: entry.entry.clone(),
                        });
                    }
                    return Some(Ok(entry));
                }
                Some(Err(error)) => return Some(Err(error)),
            }
        }
    }
}

impl std::fmt::Debug for Walk {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Walk")
            .field("depth", &self.stack.len())
            .finish()
    }
}
