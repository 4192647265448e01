//! A bounded walk over everything a mounted filesystem holds, followed by a
//! few changes: the driver of the corrupt-image tests (`tests/fuzz_corrupt.rs`
//! and the `cargo fuzz` target under `fuzz/`).
//!
//! The walk goes through the public operations only, as a FUSE client
//! would: readdir of every directory (resuming from cookies), lookup,
//! getattr, readlink, listxattr and getxattr of every entry, a full read of
//! every regular file (SEEK_DATA past the first part of large ones). Then,
//! unless the filesystem is read-only, it changes things: create, write,
//! mkdir, symlink, link, rename, unlink of an open file, setxattr, chmod,
//! truncate, fallocate, rmdir — in the root, the largest directories and
//! the first directories and files it met, so that damaged structures are
//! also changed, not only read. Lookups are sampled (at most 256 names per
//! directory) so that a large directory without an index costs linear work.
//!
//! On a damaged image every one of these may fail; none may panic or loop.
//! Everything is bounded by a [`Budget`], and the walk itself holds no
//! recursion: a directory cycle made by corruption is cut by the set of
//! directories already listed.

use super::{Caller, Dentry, FileKind, Fs, RenameFlags, SeekWhence, XattrMode};
use crate::error::{Error, Location};
use crate::format::superblock::ROOT_INO;
use std::collections::HashSet;
use std::hash::{Hash, Hasher};

/// Limits of one `exercise` call.
#[derive(Debug, Clone, Copy)]
pub struct Budget {
    /// Directory entries looked at, over all directories.
    pub entries: u64,
    /// File bytes read, over all files.
    pub read_bytes: u64,
    /// Bytes read of one file before the rest is sampled by SEEK_DATA.
    pub read_bytes_per_file: u64,
    /// Try changes after the read-only walk.
    pub changes: bool,
}

impl Default for Budget {
    fn default() -> Self {
        Budget {
            entries: 50_000,
            read_bytes: 64 << 20,
            read_bytes_per_file: 256 << 10,
            changes: true,
        }
    }
}

/// What one `exercise` call saw.
#[derive(Debug, Clone, Default)]
pub struct Stats {
    pub directories: u64,
    pub regular_files: u64,
    pub symlinks: u64,
    pub special_files: u64,
    pub entries: u64,
    pub bytes_read: u64,
    pub xattrs: u64,
    /// Operations of the read-only walk that failed.
    pub read_errors: u64,
    /// Operations of the change phase that failed (many failures are
    /// ordinary there: a name exists, the filesystem turned read-only).
    pub change_errors: u64,
    pub changes_done: u64,
    /// Failures that reported corruption (`Error::Corrupt`), both phases.
    pub corruption_errors: u64,
    /// Where the first of them was found.
    pub first_corruption: Option<Location>,
    /// Read-phase failures other than corruption and I/O errors, as
    /// "operation: error" (the first few): on a damaged image these are
    /// the suspicious ones.
    pub other_read_errors: Vec<String>,
    /// Change-phase failures as "operation: error" (the first few).
    pub change_error_list: Vec<String>,
    /// Things that worked but answered inconsistently (a file read back
    /// different from what was just written), as sentences.
    pub inconsistencies: Vec<String>,
    /// A hash of everything the read-only walk returned: names, kinds,
    /// attributes except atime, link targets, contents, attributes. Two
    /// images holding the same tree give the same digest.
    pub digest: u64,
    /// The walk stopped early because a budget ran out.
    pub budget_exhausted: bool,
}

const OTHER_ERRORS_KEPT: usize = 16;
/// Entries asked of one readdir call: small, so that listings resume from
/// cookies many times.
const READDIR_BATCH: usize = 64;
const READ_CHUNK: u64 = 64 << 10;
/// SEEK_DATA hops sampled past the per-file byte budget.
const SEEK_HOPS_MAX: u32 = 64;
const CHANGE_DIRS_MAX: usize = 4;
/// Names looked up per directory, sampled evenly over its listing: every
/// name of a large directory without an index (dir_index off, or damaged
/// away) would cost a scan of the whole directory each, quadratic work.
const LOOKUPS_PER_DIRECTORY: usize = 256;
/// The walk after the changes looks at this much only: the changes sit
/// near the root.
const AFTER_CHANGES_ENTRIES: u64 = 400;
const AFTER_CHANGES_READ_BYTES: u64 = 1 << 20;
const CHANGE_FILES_MAX: usize = 4;

/// Walk everything on `fs` within `budget`, then (if writable and the
/// budget says so) change a few things. Never fails: what goes wrong is
/// counted in the returned [`Stats`].
pub fn exercise(fs: &Fs, budget: Budget) -> Stats {
    let mut walk = Walk::read_tree(fs, budget);
    if budget.changes && !fs.is_read_only() {
        walk.change_things();
        // Read back what the changes left, without changing more.
        let after = Walk::read_tree(
            fs,
            Budget {
                entries: budget.entries.min(AFTER_CHANGES_ENTRIES),
                read_bytes: budget.read_bytes.min(AFTER_CHANGES_READ_BYTES),
                ..budget
            },
        );
        walk.stats.corruption_errors += after.stats.corruption_errors;
        if walk.stats.first_corruption.is_none() {
            walk.stats.first_corruption = after.stats.first_corruption;
        }
        walk.stats.change_errors += after.stats.read_errors;
        walk.stats
            .inconsistencies
            .extend(after.stats.inconsistencies);
    }
    walk.stats
}

/// A fast, deterministic hash for the digest (FxHash's mixing step): the
/// walk hashes every byte it reads, and SipHash would cost more than the
/// reads themselves.
#[derive(Default)]
struct Digest(u64);

impl Hasher for Digest {
    fn write(&mut self, bytes: &[u8]) {
        let mut chunks = bytes.chunks_exact(8);
        for chunk in &mut chunks {
            self.write_u64(u64::from_le_bytes(chunk.try_into().unwrap()));
        }
        for &byte in chunks.remainder() {
            self.write_u64(byte as u64);
        }
    }

    fn write_u64(&mut self, word: u64) {
        self.0 = (self.0.rotate_left(5) ^ word).wrapping_mul(0x517c_c1b7_2722_0a95);
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

/// Whether the walk looks an entry's name up, and whether the answer must
/// be that entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum LookUp {
    No,
    Yes,
    /// The listing holds the name more than once.
    Ambiguous,
}

/// A directory entry met by the walk, kept for the change phase.
struct Met {
    parent: u32,
    name: Vec<u8>,
    ino: u32,
}

struct Walk<'a> {
    fs: &'a Fs,
    budget: Budget,
    stats: Stats,
    hasher: Digest,
    directories: Vec<Met>,
    files: Vec<Met>,
    symlinks: Vec<Met>,
    /// Directories that listed nothing but "." and "..".
    empty: HashSet<u32>,
    /// Entries listed per directory, largest first once the walk ends.
    sizes: Vec<(usize, u32)>,
}

impl<'a> Walk<'a> {
    /// Note a read-phase result; `Some` on success.
    fn read_ok<T>(&mut self, operation: &str, result: Result<T, Error>) -> Option<T> {
        match result {
            Ok(value) => Some(value),
            Err(error) => {
                self.stats.read_errors += 1;
                match &error {
                    Error::Corrupt { location, .. } => self.note_corruption(*location),
                    Error::Io(_) => {}
                    _ if self.stats.other_read_errors.len() < OTHER_ERRORS_KEPT => self
                        .stats
                        .other_read_errors
                        .push(format!("{operation}: {error}")),
                    _ => {}
                }
                error.errno().hash(&mut self.hasher);
                None
            }
        }
    }

    fn note_corruption(&mut self, location: Location) {
        self.stats.corruption_errors += 1;
        self.stats.first_corruption.get_or_insert(location);
    }

    /// Note a change-phase result; `Some` on success.
    fn change_ok<T>(&mut self, operation: &str, result: Result<T, Error>) -> Option<T> {
        match result {
            Ok(value) => {
                self.stats.changes_done += 1;
                Some(value)
            }
            Err(error) => {
                self.stats.change_errors += 1;
                if let Error::Corrupt { location, .. } = &error {
                    self.note_corruption(*location);
                }
                if self.stats.change_error_list.len() < OTHER_ERRORS_KEPT {
                    let text = format!("{operation}: {error}");
                    self.stats.change_error_list.push(text);
                }
                None
            }
        }
    }

    /// The read-only walk from the root.
    fn read_tree(fs: &'a Fs, budget: Budget) -> Self {
        let mut walk = Walk {
            fs,
            budget,
            stats: Stats::default(),
            hasher: Digest::default(),
            directories: Vec::new(),
            files: Vec::new(),
            symlinks: Vec::new(),
            empty: HashSet::new(),
            sizes: Vec::new(),
        };
        walk.visit_all();
        walk.sizes.sort_by(|a, b| b.cmp(a));
        walk.stats.digest = walk.hasher.finish();
        walk
    }

    fn visit_all(&mut self) {
        let mut pending = vec![ROOT_INO];
        let mut listed: HashSet<u32> = HashSet::new();
        let mut files_read: HashSet<u32> = HashSet::new();
        while let Some(dir) = pending.pop() {
            if !listed.insert(dir) {
                continue;
            }
            self.stats.directories += 1;
            let entries = self.list(dir);
            if entries.iter().all(|e| e.name == b"." || e.name == b"..") {
                self.empty.insert(dir);
            }
            self.sizes.push((entries.len(), dir));
            let lookup_every = entries.len().div_ceil(LOOKUPS_PER_DIRECTORY).max(1);
            // Damage can give two entries one name; a lookup then finds
            // one of them, which is no inconsistency of the engine's.
            let mut seen_names = HashSet::new();
            let duplicated: HashSet<Vec<u8>> = entries
                .iter()
                .filter(|entry| !seen_names.insert(&entry.name))
                .map(|entry| entry.name.clone())
                .collect();
            for (index, entry) in entries.into_iter().enumerate() {
                if self.stats.entries >= self.budget.entries {
                    self.stats.budget_exhausted = true;
                    return;
                }
                self.stats.entries += 1;
                let look_up = match index % lookup_every == 0 {
                    false => LookUp::No,
                    true if duplicated.contains(&entry.name) => LookUp::Ambiguous,
                    true => LookUp::Yes,
                };
                self.visit(dir, &entry, look_up, &mut pending, &mut files_read);
            }
        }
    }

    /// Every entry of directory `dir`, in batches resumed from cookies.
    fn list(&mut self, dir: u32) -> Vec<Dentry> {
        let mut entries: Vec<Dentry> = Vec::new();
        let mut cookie = 0;
        let mut cookies_seen = HashSet::new();
        loop {
            let mut batch = Vec::new();
            let result = self.fs.readdir(dir, cookie, &mut |entry| {
                batch.push(entry);
                batch.len() < READDIR_BATCH
            });
            let failed = self.read_ok("readdir", result).is_none();
            let Some(last) = batch.last() else { break };
            let next = last.next;
            entries.append(&mut batch);
            let room = self.budget.entries.saturating_sub(self.stats.entries);
            if failed || entries.len() as u64 > room {
                break;
            }
            if !cookies_seen.insert(next) {
                self.stats
                    .inconsistencies
                    .push(format!("readdir of {dir} returned cookie {next} twice"));
                break;
            }
            cookie = next;
        }
        entries
    }

    fn visit(
        &mut self,
        dir: u32,
        entry: &Dentry,
        look_up: LookUp,
        pending: &mut Vec<u32>,
        files_read: &mut HashSet<u32>,
    ) {
        entry.name.hash(&mut self.hasher);
        entry.ino.hash(&mut self.hasher);
        if entry.name == b"." || entry.name == b".." {
            return;
        }
        if look_up != LookUp::No {
            let looked_up = self.fs.lookup(dir, &entry.name);
            if let Some(attr) = self.read_ok("lookup", looked_up)
                && attr.ino != entry.ino
                && look_up == LookUp::Yes
            {
                self.stats.inconsistencies.push(format!(
                    "lookup of {:?} in {dir} gave inode {} but readdir {}",
                    String::from_utf8_lossy(&entry.name),
                    attr.ino,
                    entry.ino
                ));
            }
        }
        let attr = self.fs.getattr(entry.ino);
        let Some(attr) = self.read_ok("getattr", attr) else {
            return;
        };
        (attr.kind as u8, attr.perm, attr.nlink, attr.uid, attr.gid).hash(&mut self.hasher);
        (attr.size, attr.blocks, attr.rdev).hash(&mut self.hasher);
        for time in [attr.mtime, attr.ctime] {
            (time.sec, time.nsec).hash(&mut self.hasher);
        }
        self.read_xattrs(entry.ino);
        let met = Met {
            parent: dir,
            name: entry.name.clone(),
            ino: entry.ino,
        };
        match attr.kind {
            FileKind::Directory => {
                pending.push(entry.ino);
                self.directories.push(met);
            }
            FileKind::Regular => {
                self.stats.regular_files += 1;
                if files_read.insert(entry.ino) {
                    self.read_file(entry.ino, attr.size);
                }
                self.files.push(met);
            }
            FileKind::Symlink => {
                self.stats.symlinks += 1;
                let target = self.fs.readlink(entry.ino);
                if let Some(target) = self.read_ok("readlink", target) {
                    target.hash(&mut self.hasher);
                }
                self.symlinks.push(met);
            }
            _ => self.stats.special_files += 1,
        }
    }

    fn read_xattrs(&mut self, ino: u32) {
        let Some(names) = self.read_ok("listxattr", self.fs.listxattr(ino)) else {
            return;
        };
        for name in names {
            self.stats.xattrs += 1;
            name.hash(&mut self.hasher);
            let value = self.fs.getxattr(ino, &name);
            if let Some(value) = self.read_ok("getxattr", value) {
                value.hash(&mut self.hasher);
            }
        }
    }

    /// Read the file from the start up to the per-file budget, then sample
    /// the data runs after that through SEEK_DATA / SEEK_HOLE.
    fn read_file(&mut self, ino: u32, size: u64) {
        let head = size.min(self.budget.read_bytes_per_file);
        let mut position = 0;
        while position < head {
            if !self.read_chunk(ino, position, READ_CHUNK.min(head - position)) {
                return;
            }
            position += READ_CHUNK;
        }
        let mut hops = 0;
        while position < size && hops < SEEK_HOPS_MAX {
            hops += 1;
            let data = match self.fs.seek(ino, position, SeekWhence::Data) {
                Err(Error::Io(error)) if error.raw_os_error() == Some(libc::ENXIO) => return,
                data => data,
            };
            let Some(data) = self.read_ok("seek data", data) else {
                return;
            };
            if data < position {
                self.stats.inconsistencies.push(format!(
                    "SEEK_DATA from {position} in inode {ino} went back to {data}"
                ));
                return;
            }
            if !self.read_chunk(ino, data, READ_CHUNK) {
                return;
            }
            let hole = self.fs.seek(ino, data, SeekWhence::Hole);
            let Some(hole) = self.read_ok("seek hole", hole) else {
                return;
            };
            position = hole.max(data + READ_CHUNK);
        }
    }

    /// Read one chunk; false when the file or the budget says stop.
    fn read_chunk(&mut self, ino: u32, offset: u64, length: u64) -> bool {
        if self.stats.bytes_read >= self.budget.read_bytes {
            self.stats.budget_exhausted = true;
            return false;
        }
        let data = self.fs.read(ino, offset, length as usize);
        let Some(data) = self.read_ok("read", data) else {
            return false;
        };
        if data.len() as u64 > length {
            self.stats.inconsistencies.push(format!(
                "read of {length} bytes from inode {ino} returned {}",
                data.len()
            ));
        }
        self.stats.bytes_read += data.len() as u64;
        offset.hash(&mut self.hasher);
        data.hash(&mut self.hasher);
        !data.is_empty()
    }
}

// ---------------------------------------------------------------------------
// The change phase.

const ROOT: Caller = Caller::ROOT;

impl Walk<'_> {
    fn change_things(&mut self) {
        let fs = self.fs;
        // The root, the largest directories (htrees: inserts there split
        // leaves and index nodes), then the first ones met.
        let mut dirs: Vec<u32> = vec![ROOT_INO];
        let largest = self.sizes.iter().map(|&(_, ino)| ino).take(2);
        for dir in largest.chain(self.directories.iter().map(|met| met.ino)) {
            if dirs.len() < CHANGE_DIRS_MAX && !dirs.contains(&dir) {
                dirs.push(dir);
            }
        }
        let scratch = self.change_ok("mkdir", fs.mkdir(ROOT_INO, b"fuzz.dir", 0o755, ROOT));
        let scratch = scratch.map(|attr| attr.ino);
        for (index, &dir) in dirs.iter().enumerate() {
            self.change_dir(dir, index);
        }
        self.change_new_file(ROOT_INO, b"fuzz.file");
        let files: Vec<(u32, Vec<u8>, u32)> = self
            .files
            .iter()
            .take(CHANGE_FILES_MAX)
            .map(|met| (met.parent, met.name.clone(), met.ino))
            .collect();
        for (index, (parent, name, ino)) in files.iter().enumerate() {
            self.change_file(*ino, index);
            if let Some(scratch) = scratch {
                self.change_names(*parent, name, scratch, index);
            }
        }
        if let (Some(first), Some(second)) = (self.files.first(), self.directories.last()) {
            let first = (first.parent, first.name.clone());
            let second = (second.parent, second.name.clone());
            self.exchange_names(first, second);
        }
        if let Some(link) = self.symlinks.first() {
            let (parent, name) = (link.parent, link.name.clone());
            self.change_ok("unlink", fs.unlink(parent, &name, ROOT));
        }
        let empty = self
            .directories
            .iter()
            .rev()
            .find(|dir| self.empty.contains(&dir.ino));
        if let Some(dir) = empty {
            let (parent, name) = (dir.parent, dir.name.clone());
            self.change_ok("rmdir", fs.rmdir(parent, &name, ROOT));
        }
        // statfs reads the counters the changes kept; it cannot fail.
        let _ = fs.statfs();
        self.change_ok("sync", fs.sync());
    }

    /// Entries added to and removed from an existing directory (splits of
    /// damaged htree nodes, merges into damaged leaves).
    fn change_dir(&mut self, dir: u32, index: usize) {
        let fs = self.fs;
        for number in 0..8 {
            let name = format!("fuzz.{index}.{number}.{}", "n".repeat(number * 30));
            self.change_ok("create", fs.create(dir, name.as_bytes(), 0o644, ROOT));
        }
        let sub = format!("fuzz.sub.{index}");
        if let Some(attr) = self.change_ok("mkdir", fs.mkdir(dir, sub.as_bytes(), 0o700, ROOT)) {
            self.change_ok("symlink", fs.symlink(attr.ino, b"short", b"../x", ROOT));
            let long = vec![b'l'; 300];
            self.change_ok("symlink", fs.symlink(attr.ino, b"long", &long, ROOT));
            self.change_ok("unlink", fs.unlink(attr.ino, b"short", ROOT));
            self.change_ok("unlink", fs.unlink(attr.ino, b"long", ROOT));
            self.change_ok("rmdir", fs.rmdir(dir, sub.as_bytes(), ROOT));
        }
        for number in (0..8).step_by(2) {
            let name = format!("fuzz.{index}.{number}.{}", "n".repeat(number * 30));
            self.change_ok("unlink", fs.unlink(dir, name.as_bytes(), ROOT));
        }
    }

    /// A new file written, read back, grown, cut, unlinked while open.
    fn change_new_file(&mut self, dir: u32, name: &[u8]) {
        let fs = self.fs;
        let Some(attr) = self.change_ok("create", fs.create(dir, name, 0o644, ROOT)) else {
            return;
        };
        let ino = attr.ino;
        let data: Vec<u8> = (0..20_000u32).map(|i| (i * 7 + 3) as u8).collect();
        for offset in [0u64, 100_000, 5_000_000] {
            if self.change_ok("write", fs.write(ino, offset, &data, ROOT)) == Some(data.len()) {
                let back = fs.read(ino, offset, data.len());
                if let Some(back) = self.change_ok("read", back)
                    && back != data
                {
                    self.stats.inconsistencies.push(format!(
                        "inode {ino}: {} bytes written at {offset} read back differently",
                        data.len()
                    ));
                }
            }
        }
        self.change_ok(
            "setxattr",
            fs.setxattr(ino, b"user.fuzz", b"value", XattrMode::Any, ROOT),
        );
        let big = vec![b'x'; 400];
        self.change_ok(
            "setxattr",
            fs.setxattr(ino, b"user.fuzz.big", &big, XattrMode::Any, ROOT),
        );
        self.change_ok("truncate", fs.truncate(ino, 50_000, ROOT));
        self.change_ok("fallocate", fs.fallocate(ino, 200_000, 30_000, 0, ROOT));
        self.change_ok("link", fs.link(ino, dir, b"fuzz.file.link", ROOT));
        if self.change_ok("open_file", fs.open_file(ino)).is_some() {
            self.change_ok("unlink", fs.unlink(dir, name, ROOT));
            self.change_ok("unlink", fs.unlink(dir, b"fuzz.file.link", ROOT));
            self.change_ok("read", fs.read(ino, 0, 4096));
            self.change_ok("release_file", fs.release_file(ino));
        }
    }

    /// An existing file (possibly with damaged mapping or attributes)
    /// written, cut, grown, punched, given attributes.
    fn change_file(&mut self, ino: u32, index: usize) {
        let fs = self.fs;
        let Some(attr) = self.change_ok("getattr", fs.getattr(ino)) else {
            return;
        };
        let size = attr.size;
        match index % 4 {
            0 => {
                self.change_ok(
                    "write",
                    fs.write(ino, size / 2, b"fuzz write in the middle", ROOT),
                );
                self.change_ok("truncate", fs.truncate(ino, size / 3, ROOT));
            }
            1 => {
                self.change_ok(
                    "write",
                    fs.write(ino, size + 8192, b"fuzz append past a hole", ROOT),
                );
                let zero = crate::fs::FALLOC_FL_ZERO_RANGE;
                self.change_ok("fallocate", fs.fallocate(ino, size / 4, 10_000, zero, ROOT));
                let punch = crate::fs::FALLOC_FL_PUNCH_HOLE | crate::fs::FALLOC_FL_KEEP_SIZE;
                self.change_ok("fallocate", fs.fallocate(ino, 0, size.max(1), punch, ROOT));
            }
            2 => {
                self.change_ok("truncate", fs.truncate(ino, size + 100_000, ROOT));
                self.change_ok("truncate", fs.truncate(ino, 0, ROOT));
            }
            _ => {
                let changes = crate::fs::SetAttr {
                    mode: Some(0o640),
                    ..Default::default()
                };
                self.change_ok("setattr", fs.setattr(ino, &changes, ROOT));
                let name = b"user.fuzz.gone";
                self.change_ok(
                    "setxattr",
                    fs.setxattr(ino, name, b"x", XattrMode::Any, ROOT),
                );
                self.change_ok("removexattr", fs.removexattr(ino, name, ROOT));
            }
        }
        let value = vec![index as u8; 100 + index * 100];
        self.change_ok(
            "setxattr",
            fs.setxattr(ino, b"user.fuzz", &value, XattrMode::Any, ROOT),
        );
    }

    /// An existing name moved to the scratch directory and back, and
    /// linked there.
    fn change_names(&mut self, parent: u32, name: &[u8], scratch: u32, index: usize) {
        let fs = self.fs;
        let moved = format!("moved.{index}");
        let plain = RenameFlags::default();
        let there = fs.rename(parent, name, scratch, moved.as_bytes(), plain, ROOT);
        if self.change_ok("rename", there).is_some() {
            self.change_ok(
                "rename",
                fs.rename(scratch, moved.as_bytes(), parent, name, plain, ROOT),
            );
        }
        if let Some(attr) = self.change_ok("lookup", fs.lookup(parent, name)) {
            let link = format!("link.{index}");
            self.change_ok("link", fs.link(attr.ino, scratch, link.as_bytes(), ROOT));
        }
    }

    /// Two existing names swapped twice (RENAME_EXCHANGE), which leaves
    /// them where they were.
    fn exchange_names(&mut self, first: (u32, Vec<u8>), second: (u32, Vec<u8>)) {
        let fs = self.fs;
        let exchange = RenameFlags {
            exchange: true,
            ..RenameFlags::default()
        };
        for _ in 0..2 {
            let swapped = fs.rename(first.0, &first.1, second.0, &second.1, exchange, ROOT);
            self.change_ok("rename exchange", swapped);
        }
    }
}
