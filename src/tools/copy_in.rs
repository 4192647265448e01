//! A host tree into an image (`jext4 cp -a SRC IMAGE:DEST`).
//!
//! Several threads walk the source, one directory at a time each: a
//! thread takes a directory off a shared stack, creates its entries in
//! the image (files with their data, symlinks, devices, FIFOs, and the
//! subdirectories, which go on the stack), and takes the next. Each
//! engine operation is a journal handle in its directory's transaction,
//! so threads in different directories take different locks; nothing
//! here commits — the journal commits on its interval and when it fills,
//! and closing the image commits the rest once.
//!
//! What must wait for the walk: entries with several hard links (one
//! inode, all names: created once and linked, after every name is
//! known), and directories' times, modes and xattrs (creating a child
//! changes its directory's mtime, and a default ACL set early would be
//! inherited by children that do not have it in the source).

use super::{
    CopyOptions, Failure, Notes, Progress, Report, clamp, host, imagepath, is_fatal, privileged,
    timestamp,
};
use crate::api::Image;
use crate::error::Error;
use crate::format::inode::Timestamp;
use crate::fs::{Attr, Caller, FileKind, Fs, SetAttr, TimeSet, XattrMode};
use std::fs::Metadata;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Condvar, Mutex};

/// The file data read and written at a time, per thread: large enough
/// that a big file costs few engine calls, small enough that memory stays
/// bounded whatever the thread count.
const COPY_BUFFER_BYTES: usize = 1 << 20;

/// Copy `source` (a directory with everything under it, or one entry) to
/// `dest` in `image`: `dest` is the new entry's own path, its parent must
/// exist. An existing entry of the same kind is overwritten (a file's
/// data replaced, a directory merged into), as `cp` does, so that running
/// the same copy again completes one that was interrupted.
pub fn copy_in(
    image: &Image,
    source: &Path,
    dest: &str,
    options: &CopyOptions,
    progress: &Progress,
) -> Result<Report, Failure> {
    let copier = Copier::new(image, options, progress);
    let failure = |error| Failure {
        path: dest.to_string(),
        error,
    };
    // The root has no parent to make it in: it is its own "." there, which
    // makes the copy merge into it (`cp -a DIR/. IMAGE:/`).
    let (parent, name) = match imagepath::trim_slashes(dest) {
        "/" => (crate::format::superblock::ROOT_INO, &b"."[..]),
        _ => image.parent_and_name(dest).map_err(failure)?,
    };
    let meta = match std::fs::symlink_metadata(source) {
        Ok(meta) => meta,
        Err(error) => {
            copier
                .notes
                .skip(source.to_path_buf(), "cannot stat", error.into());
            return Ok(copier.notes.into_report(progress));
        }
    };
    let top = Entry {
        parent,
        parent_default_acl: copier.has_default_acl(parent),
        name: name.to_vec(),
        host: source.to_path_buf(),
        image_path: imagepath::trim_slashes(dest).to_string(),
        meta,
    };
    if top.meta.is_dir() {
        if let Some(job) = copier.directory(&top)? {
            copier.walk(job)?;
        }
    } else {
        // One entry given by name: its other links are not in the copy.
        copier.single(&top, &mut vec![0; COPY_BUFFER_BYTES])?;
    }
    copier.link_deferred()?;
    copier.finish_directories()?;
    Ok(copier.notes.into_report(progress))
}

/// One source entry and where it goes.
struct Entry {
    parent: u32,
    /// The parent has a default ACL: without `preserve`, new entries get
    /// the mode asked for, masked by the ACL, not less the umask (as the
    /// kernel does), and keep it.
    parent_default_acl: bool,
    name: Vec<u8>,
    host: PathBuf,
    /// For messages.
    image_path: String,
    meta: Metadata,
}

/// A directory whose entries are still to copy.
struct DirJob {
    ino: u32,
    default_acl: bool,
    host: PathBuf,
    image_path: String,
}

/// Why an entry failed: its source (reported, skipped) or the image.
enum EntryError {
    Source(&'static str, std::io::Error),
    Image(Error),
}

impl From<Error> for EntryError {
    fn from(error: Error) -> Self {
        EntryError::Image(error)
    }
}

/// The shared stack of directories and how many threads are busy with
/// one (the walk is over when the stack is empty and none is).
#[derive(Default)]
struct Stack {
    jobs: Vec<DirJob>,
    busy: usize,
}

struct Copier<'a> {
    fs: &'a Fs,
    options: &'a CopyOptions,
    progress: &'a Progress,
    notes: Notes,
    /// The caller of engine operations that create nothing of their own.
    caller: Caller,
    stack: Mutex<Stack>,
    wake: Condvar,
    /// Set when an error stopped the copy: threads take no more work.
    stop: AtomicBool,
    fatal: Mutex<Option<Failure>>,
    /// Entries with more than one link, created after the walk.
    linked: Mutex<Vec<Entry>>,
    /// Directories whose attributes are set after the walk.
    directories: Mutex<Vec<(u32, Entry)>>,
}

impl<'a> Copier<'a> {
    fn new(image: &'a Image, options: &'a CopyOptions, progress: &'a Progress) -> Copier<'a> {
        Copier {
            fs: image.fs(),
            options,
            progress,
            notes: Notes::default(),
            caller: privileged(image.caller()),
            stack: Mutex::new(Stack::default()),
            wake: Condvar::new(),
            stop: AtomicBool::new(false),
            fatal: Mutex::new(None),
            linked: Mutex::new(Vec::new()),
            directories: Mutex::new(Vec::new()),
        }
    }

    /// The walk: `threads` workers until the stack is empty and nobody
    /// is busy, or an error stopped it.
    fn walk(&self, first: DirJob) -> Result<(), Failure> {
        self.stack.lock().unwrap().jobs.push(first);
        std::thread::scope(|scope| {
            for _ in 0..self.options.threads.max(1) {
                scope.spawn(|| self.worker());
            }
        });
        match self.fatal.lock().unwrap().take() {
            Some(failure) => Err(failure),
            None => Ok(()),
        }
    }

    fn worker(&self) {
        let mut buffer = vec![0u8; COPY_BUFFER_BYTES];
        while let Some(job) = self.next_job() {
            let result = self.copy_directory(&job, &mut buffer);
            if let Err(failure) = result {
                self.stop.store(true, Ordering::Release);
                self.fatal.lock().unwrap().get_or_insert(failure);
            }
            let mut stack = self.stack.lock().unwrap();
            stack.busy -= 1;
            if stack.busy == 0 && stack.jobs.is_empty() {
                self.wake.notify_all();
            }
        }
        self.wake.notify_all();
    }

    /// The next directory to copy, or None once the walk is over.
    fn next_job(&self) -> Option<DirJob> {
        let mut stack = self.stack.lock().unwrap();
        loop {
            if self.stop.load(Ordering::Acquire) {
                return None;
            }
            if let Some(job) = stack.jobs.pop() {
                stack.busy += 1;
                return Some(job);
            }
            if stack.busy == 0 {
                return None;
            }
            stack = self.wake.wait(stack).unwrap();
        }
    }

    fn push(&self, job: DirJob) {
        self.stack.lock().unwrap().jobs.push(job);
        self.wake.notify_one();
    }

    /// Every entry of one source directory into the image directory.
    fn copy_directory(&self, job: &DirJob, buffer: &mut [u8]) -> Result<(), Failure> {
        let entries = match std::fs::read_dir(&job.host) {
            Ok(entries) => entries,
            Err(error) => {
                self.notes
                    .skip(job.host.clone(), "cannot open directory", error.into());
                return Ok(());
            }
        };
        for dirent in entries {
            if self.stop.load(Ordering::Acquire) {
                return Ok(());
            }
            let dirent = match dirent {
                Ok(dirent) => dirent,
                Err(error) => {
                    self.notes
                        .skip(job.host.clone(), "cannot read directory", error.into());
                    return Ok(());
                }
            };
            let host = dirent.path();
            let meta = match std::fs::symlink_metadata(&host) {
                Ok(meta) => meta,
                Err(error) => {
                    self.notes.skip(host, "cannot stat", error.into());
                    continue;
                }
            };
            let name = dirent.file_name();
            let entry = Entry {
                parent: job.ino,
                parent_default_acl: job.default_acl,
                image_path: imagepath::join(&job.image_path, &name.to_string_lossy()),
                name: name.as_bytes().to_vec(),
                host,
                meta,
            };
            if entry.meta.is_dir() {
                if let Some(child) = self.directory(&entry)? {
                    self.push(child);
                }
            } else if self.options.preserve && entry.meta.nlink() > 1 {
                self.linked.lock().unwrap().push(entry);
            } else {
                self.single(&entry, buffer)?;
            }
        }
        Ok(())
    }

    /// Sort out an entry's error: a source's or a per-entry image error
    /// is reported and skipped, one the image cannot go on after stops.
    fn settle(&self, entry: &Entry, result: Result<(), EntryError>) -> Result<(), Failure> {
        match result {
            Ok(()) => Ok(()),
            Err(EntryError::Source(action, error)) => {
                self.notes.skip(entry.host.clone(), action, error.into());
                Ok(())
            }
            Err(EntryError::Image(error)) if is_fatal(&error) => Err(Failure {
                path: entry.image_path.clone(),
                error,
            }),
            Err(EntryError::Image(error)) => {
                let action = match error {
                    Error::IsDirectory => "cannot overwrite directory with non-directory",
                    Error::NotDirectory => "cannot overwrite non-directory with directory",
                    _ => "cannot create",
                };
                self.notes.skip(entry.host.clone(), action, error);
                Ok(())
            }
        }
    }

    /// Create (or reuse) the directory for `entry`; its attributes wait
    /// for the end of the walk. None when it could not be made.
    fn directory(&self, entry: &Entry) -> Result<Option<DirJob>, Failure> {
        let made = self.make_directory(entry);
        match made {
            Ok(ino) => {
                self.progress.entry();
                self.verbose(entry);
                let job = DirJob {
                    ino,
                    default_acl: self.has_default_acl(ino),
                    host: entry.host.clone(),
                    image_path: entry.image_path.clone(),
                };
                let kept = Entry {
                    parent: entry.parent,
                    parent_default_acl: entry.parent_default_acl,
                    name: entry.name.clone(),
                    host: entry.host.clone(),
                    image_path: entry.image_path.clone(),
                    meta: entry.meta.clone(),
                };
                self.directories.lock().unwrap().push((ino, kept));
                Ok(Some(job))
            }
            Err(error) => self.settle(entry, Err(error.into())).map(|()| None),
        }
    }

    fn make_directory(&self, entry: &Entry) -> Result<u32, Error> {
        // Writable by us until its own mode is set at the end (the
        // library checks no permissions; the mode is only what it shows).
        let mode = match self.keeps_created_mode(entry) {
            true => self.new_mode(entry),
            false => self.new_mode(entry) | 0o700,
        };
        match self
            .fs
            .mkdir(entry.parent, &entry.name, mode, self.owner_of(&entry.meta))
        {
            Ok(attr) => Ok(attr.ino),
            Err(Error::Exists) => {
                let existing = self.fs.lookup(entry.parent, &entry.name)?;
                match existing.kind {
                    FileKind::Directory => Ok(existing.ino),
                    _ => Err(Error::NotDirectory),
                }
            }
            Err(error) => Err(error),
        }
    }

    /// Copy one entry that is not a directory, with its attributes.
    fn single(&self, entry: &Entry, buffer: &mut [u8]) -> Result<(), Failure> {
        let result = self.create(entry, buffer).and_then(|attr| {
            self.progress.entry();
            self.verbose(entry);
            self.finish(attr.ino, attr.kind, entry)
        });
        self.settle(entry, result)
    }

    /// The new node for `entry`, with its data; an existing entry of the
    /// same name is overwritten (a regular file in place, anything else
    /// removed first), never a directory.
    fn create(&self, entry: &Entry, buffer: &mut [u8]) -> Result<Attr, EntryError> {
        let meta = &entry.meta;
        let kind = meta.file_type();
        let target = match kind.is_symlink() {
            true => Some(
                std::fs::read_link(&entry.host)
                    .map_err(|error| EntryError::Source("cannot read symbolic link", error))?,
            ),
            false => None,
        };
        let caller = self.owner_of(meta);
        let made = |fs: &Fs| match &target {
            Some(target) => fs.symlink(
                entry.parent,
                &entry.name,
                target.as_os_str().as_bytes(),
                caller,
            ),
            None if kind.is_file() => {
                fs.create(entry.parent, &entry.name, self.new_mode(entry), caller)
            }
            None => fs.mknod(
                entry.parent,
                &entry.name,
                (meta.mode() & 0o170000) as u16 | self.new_mode(entry),
                meta.rdev(),
                caller,
            ),
        };
        let attr = match made(self.fs) {
            Err(Error::Exists) => {
                let existing = self.fs.lookup(entry.parent, &entry.name)?;
                match existing.kind {
                    FileKind::Directory => return Err(Error::IsDirectory.into()),
                    FileKind::Regular if kind.is_file() => {
                        self.fs.truncate(existing.ino, 0, self.caller)?;
                        existing
                    }
                    _ => {
                        self.fs.unlink(entry.parent, &entry.name, self.caller)?;
                        made(self.fs)?
                    }
                }
            }
            made => made?,
        };
        if kind.is_file() {
            self.copy_data(attr.ino, entry, buffer)?;
        }
        Ok(attr)
    }

    /// A regular file's bytes, range by range of data: holes in the
    /// source (SEEK_HOLE) stay holes in the image.
    fn copy_data(&self, ino: u32, entry: &Entry, buffer: &mut [u8]) -> Result<(), EntryError> {
        let size = entry.meta.len();
        if size == 0 {
            return Ok(());
        }
        let file = std::fs::File::open(&entry.host)
            .map_err(|error| EntryError::Source("cannot open", error))?;
        let sparse = entry.meta.blocks() * 512 < size;
        let ranges = match sparse {
            true => host::data_ranges(&file, size)
                .map_err(|error| EntryError::Source("cannot read", error))?,
            false => vec![(0, size)],
        };
        for (start, end) in ranges {
            let mut position = start;
            while position < end {
                let want = buffer.len().min((end - position) as usize);
                let read = file
                    .read_at(&mut buffer[..want], position)
                    .map_err(|error| EntryError::Source("error reading", error))?;
                if read == 0 {
                    break; // the file shrank meanwhile: copy what is there
                }
                let written = self.fs.write(ino, position, &buffer[..read], self.caller)?;
                if written < read {
                    return Err(Error::NoSpace.into());
                }
                position += read as u64;
                self.progress.bytes(read as u64);
            }
        }
        if sparse {
            // A hole at the end: the size says where the file ends.
            self.fs.truncate(ino, size, self.caller)?;
        }
        Ok(())
    }

    /// Owner, mode, times and xattrs of a new entry, as the options say.
    fn finish(&self, ino: u32, kind: FileKind, entry: &Entry) -> Result<(), EntryError> {
        let changes = self.attributes(kind, entry);
        if changes_anything(&changes) {
            self.fs.setattr(ino, &changes, self.caller)?;
        }
        // After the owner: chown takes file capabilities away.
        if self.options.preserve {
            self.copy_xattrs(ino, entry)?;
        }
        Ok(())
    }

    /// The setattr that gives a new entry its source's attributes.
    fn attributes(&self, kind: FileKind, entry: &Entry) -> SetAttr {
        let meta = &entry.meta;
        let mut changes = SetAttr::default();
        let limit = self.options.clamp_time;
        if self.options.preserve {
            if kind != FileKind::Symlink {
                changes.mode = Some((meta.mode() & 0o7777) as u16);
            }
            let (uid, gid) = self.options.owner.unwrap_or((meta.uid(), meta.gid()));
            changes.uid = Some(uid);
            changes.gid = Some(gid);
            let atime = clamp((meta.atime(), meta.atime_nsec() as u32), limit);
            let mtime = clamp((meta.mtime(), meta.mtime_nsec() as u32), limit);
            changes.atime = Some(TimeSet::At(timestamp(atime)));
            changes.mtime = Some(TimeSet::At(timestamp(mtime)));
        } else if let Some(limit) = limit {
            let now = Timestamp::now();
            let now = timestamp(clamp((now.sec, now.nsec), Some(limit)));
            changes.atime = Some(TimeSet::At(now));
            changes.mtime = Some(TimeSet::At(now));
        }
        if let Some(limit) = limit {
            let now = Timestamp::now();
            changes.ctime = Some(timestamp(clamp((now.sec, now.nsec), Some(limit))));
        }
        if kind == FileKind::Directory && !self.options.preserve && !self.keeps_created_mode(entry)
        {
            changes.mode = Some(self.new_mode(entry));
        }
        changes
    }

    /// Every xattr of the source entry (user., trusted., security.,
    /// system.posix_acl_*). One the image refuses is said once and the
    /// copy goes on (as cp -a on a filesystem without xattrs).
    fn copy_xattrs(&self, ino: u32, entry: &Entry) -> Result<(), EntryError> {
        let attributes = host::xattrs(&entry.host)
            .map_err(|error| EntryError::Source("cannot read attributes of", error))?;
        if entry.parent_default_acl {
            self.drop_inherited_acls(ino, &attributes)?;
        }
        for (name, value) in attributes {
            match self
                .fs
                .setxattr(ino, &name, &value, XattrMode::Any, self.caller)
            {
                Ok(()) => {}
                Err(error) if is_fatal(&error) && !matches!(error, Error::NoSpace) => {
                    return Err(error.into());
                }
                Err(error) => self.notes.not_kept(format!(
                    "extended attribute {}: {}",
                    String::from_utf8_lossy(&name),
                    super::describe(&error)
                )),
            }
        }
        Ok(())
    }

    /// ACLs the new inode inherited from its directory's default ACL and
    /// the source has not: `cp -a` gives the copy the source's ACLs, so
    /// none where the source has none.
    fn drop_inherited_acls(
        &self,
        ino: u32,
        source: &[(Vec<u8>, Vec<u8>)],
    ) -> Result<(), EntryError> {
        for acl in [&b"system.posix_acl_access"[..], b"system.posix_acl_default"] {
            if source.iter().any(|(name, _)| name == acl) {
                continue;
            }
            match self.fs.removexattr(ino, acl, self.caller) {
                Ok(()) | Err(Error::NoAttribute) => {}
                Err(error) => return Err(error.into()),
            }
        }
        Ok(())
    }

    /// The entries with several links: each inode once, every name a
    /// link to it.
    fn link_deferred(&self) -> Result<(), Failure> {
        let mut linked = std::mem::take(&mut *self.linked.lock().unwrap());
        linked.sort_by_key(|entry| (entry.meta.dev(), entry.meta.ino()));
        let mut buffer = vec![0u8; COPY_BUFFER_BYTES];
        let mut first: Option<((u64, u64), u32)> = None;
        for entry in &linked {
            let key = (entry.meta.dev(), entry.meta.ino());
            let result = match first {
                Some((seen, ino)) if seen == key => self.link(ino, entry),
                _ => self.create(entry, &mut buffer).and_then(|attr| {
                    first = Some((key, attr.ino));
                    self.finish(attr.ino, attr.kind, entry)
                }),
            };
            if result.is_ok() {
                self.progress.entry();
                self.verbose(entry);
            }
            self.settle(entry, result)?;
        }
        Ok(())
    }

    /// Another name for `ino`, replacing what the name held.
    fn link(&self, ino: u32, entry: &Entry) -> Result<(), EntryError> {
        match self.fs.link(ino, entry.parent, &entry.name, self.caller) {
            Err(Error::Exists) => {
                let existing = self.fs.lookup(entry.parent, &entry.name)?;
                if existing.ino == ino {
                    return Ok(());
                }
                if existing.kind == FileKind::Directory {
                    return Err(Error::IsDirectory.into());
                }
                self.fs.unlink(entry.parent, &entry.name, self.caller)?;
                self.fs.link(ino, entry.parent, &entry.name, self.caller)?;
                Ok(())
            }
            result => result.map(|_| ()).map_err(EntryError::Image),
        }
    }

    /// Directories' xattrs, then their modes, owners and times, now that
    /// nothing more is created in them.
    fn finish_directories(&self) -> Result<(), Failure> {
        let directories = std::mem::take(&mut *self.directories.lock().unwrap());
        for (ino, entry) in directories.iter().rev() {
            let mut result = Ok(());
            if self.options.preserve {
                result = self.copy_xattrs(*ino, entry);
            }
            let changes = self.attributes(FileKind::Directory, entry);
            let result = result.and_then(|()| {
                self.fs
                    .setattr(*ino, &changes, self.caller)
                    .map(|_| ())
                    .map_err(EntryError::Image)
            });
            self.settle(entry, result)?;
        }
        Ok(())
    }

    /// The mode a new entry is created with: the source's, or without
    /// preserving, its permission bits less the umask — or, under a
    /// default ACL, as they are: the engine masks them with the ACL, as
    /// the kernel does instead of applying the umask.
    fn new_mode(&self, entry: &Entry) -> u16 {
        let mode = entry.meta.mode();
        match (self.options.preserve, entry.parent_default_acl) {
            (true, _) => (mode & 0o7777) as u16,
            (false, true) => (mode & 0o777) as u16,
            (false, false) => (mode & 0o777) as u16 & !self.options.umask,
        }
    }

    /// Without `preserve`, a directory made under a default ACL keeps the
    /// mode the engine gave it (masked by the ACL, which the ACL it
    /// inherits records): made as asked, not writable-first.
    fn keeps_created_mode(&self, entry: &Entry) -> bool {
        !self.options.preserve && entry.parent_default_acl
    }

    /// Whether the image directory `ino` has a default ACL.
    fn has_default_acl(&self, ino: u32) -> bool {
        self.fs.getxattr(ino, b"system.posix_acl_default").is_ok()
    }

    /// The caller whose ids a new entry gets.
    fn owner_of(&self, meta: &Metadata) -> Caller {
        let (uid, gid) = match (self.options.owner, self.options.preserve) {
            (Some(owner), _) => owner,
            (None, true) => (meta.uid(), meta.gid()),
            (None, false) => (self.caller.uid, self.caller.gid),
        };
        Caller {
            uid,
            gid,
            ..self.caller
        }
    }

    fn verbose(&self, entry: &Entry) {
        if let Some(report) = &self.progress.verbose {
            report(&entry.host.to_string_lossy(), &entry.image_path);
        }
    }
}

fn changes_anything(changes: &SetAttr) -> bool {
    changes.mode.is_some()
        || changes.uid.is_some()
        || changes.gid.is_some()
        || changes.atime.is_some()
        || changes.mtime.is_some()
        || changes.ctime.is_some()
}
