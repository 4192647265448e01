//! Helpers for the fast-commit replay tests: images where the kernel wrote
//! fast commits (with a model of what every fsync made durable), trees of
//! mounted images, the fast-commit area of an image, and a device that
//! crashes after a given number of writes.
#![allow(dead_code)]

use crate::common;
use crate::common::journal::{Mount, journal_blocks_from_debugfs, kernel_crash_image, run};
use jext4::engine::dev::{BlockDevice, MemoryDevice};
use jext4::engine::format::csum::crc32c_raw;
use jext4::engine::format::fast_commit::{RECORD_HEADER_SIZE, tag};
use jext4::engine::format::{get_u16, get_u32};
use jext4::engine::journal::format::JournalSuperblock;
use std::collections::BTreeMap;
use std::io::Write;
use std::os::unix::fs::{FileExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

/// One entry of a tree: kind ('f', 'd', 'l', 'o'ther, or 'E' for an entry
/// that could not be read), size, permission bits, CRC32C of the content.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub kind: char,
    pub size: u64,
    pub mode: u32,
    pub crc: u32,
}

pub type Tree = BTreeMap<String, Entry>;

/// Every name under `root` but lost+found. Unreadable entries are recorded,
/// not fatal: a broken replay must show up as a difference.
pub fn tree_of(root: &Path) -> Tree {
    let mut tree = Tree::new();
    let mut pending = vec![root.to_path_buf()];
    // A tree has fewer directories than this.
    for _ in 0..100_000 {
        let Some(dir) = pending.pop() else {
            break;
        };
        let entries = match std::fs::read_dir(&dir) {
            Ok(entries) => entries,
            Err(error) => {
                tree.insert(relative(root, &dir) + "/", unreadable(&error));
                continue;
            }
        };
        for entry in entries {
            let path = match entry {
                Ok(entry) => entry.path(),
                Err(error) => {
                    tree.insert(relative(root, &dir) + "/?", unreadable(&error));
                    continue;
                }
            };
            let name = relative(root, &path);
            if name == "lost+found" {
                continue;
            }
            tree.insert(name, describe(&path, &mut pending));
        }
    }
    tree
}

fn relative(root: &Path, path: &Path) -> String {
    path.strip_prefix(root)
        .unwrap()
        .to_string_lossy()
        .to_string()
}

fn unreadable(error: &std::io::Error) -> Entry {
    Entry {
        kind: 'E',
        size: error.raw_os_error().unwrap_or(-1) as u64,
        mode: 0,
        crc: 0,
    }
}

fn describe(path: &Path, pending: &mut Vec<PathBuf>) -> Entry {
    let meta = match std::fs::symlink_metadata(path) {
        Ok(meta) => meta,
        Err(error) => return unreadable(&error),
    };
    let (kind, content) = if meta.is_dir() {
        pending.push(path.to_path_buf());
        ('d', Ok(Vec::new()))
    } else if meta.file_type().is_symlink() {
        let target = std::fs::read_link(path).map(|t| t.to_string_lossy().as_bytes().to_vec());
        ('l', target)
    } else if meta.is_file() {
        ('f', std::fs::read(path))
    } else {
        ('o', Ok(Vec::new()))
    };
    match content {
        Ok(content) => Entry {
            kind,
            size: meta.len(),
            mode: meta.permissions().mode() & 0o7777,
            crc: crc32c_raw(!0, &content),
        },
        Err(error) => unreadable(&error),
    }
}

/// The tree of `image` through a kernel loop mount with `options`, or the
/// mount's error.
pub fn mounted_tree(image: &Path, options: &str) -> Result<Tree, String> {
    let mount = Mount::new(image, options)?;
    let tree = tree_of(&mount.point);
    mount.unmount();
    Ok(tree)
}

/// Print how two trees differ (at most a few lines).
pub fn tree_difference(expected: &Tree, actual: &Tree) -> String {
    let mut lines = Vec::new();
    for (name, entry) in expected {
        match actual.get(name) {
            None => lines.push(format!("missing {name} {entry:?}")),
            Some(other) if other != entry => {
                lines.push(format!("differs {name}: {entry:?} vs {other:?}"))
            }
            _ => {}
        }
    }
    for name in actual.keys().filter(|name| !expected.contains_key(*name)) {
        lines.push(format!("extra {name} {:?}", actual[name]));
    }
    lines.truncate(12);
    lines.join("\n")
}

// ---------------------------------------------------------------------------
// Workloads the kernel turns into fast commits.

/// What every fsync of a workload made durable: path → content (None for
/// a directory).
#[derive(Debug, Default)]
pub struct Durable {
    pub files: BTreeMap<String, Option<Vec<u8>>>,
}

impl Durable {
    /// Every durable name is in `tree` with its content.
    pub fn missing_from(&self, tree: &Tree) -> Vec<String> {
        self.files
            .iter()
            .filter(|(name, content)| match (tree.get(*name), content) {
                (Some(entry), Some(content)) => {
                    entry.kind != 'f' || entry.crc != crc32c_raw(!0, content)
                }
                (Some(entry), None) => entry.kind != 'd',
                (None, _) => true,
            })
            .map(|(name, _)| name.clone())
            .collect()
    }
}

/// Runs filesystem operations under `root/d`, each followed by an fsync,
/// and keeps a model of what became durable: names to inodes (hard links
/// share one), inodes to contents.
pub struct Workload {
    root: PathBuf,
    names: BTreeMap<String, Option<usize>>,
    contents: Vec<Vec<u8>>,
}

fn pattern(seed: usize, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| ((i * 31 + seed * 7) % 251) as u8)
        .collect()
}

impl Workload {
    fn path(&self, name: &str) -> PathBuf {
        self.root.join(name)
    }

    fn fsync(&self, name: &str) {
        std::fs::File::open(self.path(name))
            .unwrap()
            .sync_all()
            .unwrap();
    }

    fn content_of(&mut self, name: &str) -> &mut Vec<u8> {
        let id = self.names[name].expect("a file");
        &mut self.contents[id]
    }

    /// The model: every durable name with its content.
    pub fn durable(&self) -> Durable {
        let files = self
            .names
            .iter()
            .map(|(name, id)| (name.clone(), id.map(|id| self.contents[id].clone())))
            .collect();
        Durable { files }
    }

    fn new_file(&mut self, name: &str, content: Vec<u8>) {
        self.contents.push(content);
        self.names
            .insert(name.into(), Some(self.contents.len() - 1));
    }

    /// Create or replace `name` with `content`, mode 0640, and fsync it.
    pub fn write(&mut self, name: &str, content: Vec<u8>) {
        let mut file = std::fs::File::create(self.path(name)).unwrap();
        file.write_all(&content).unwrap();
        file.set_permissions(std::fs::Permissions::from_mode(0o640))
            .unwrap();
        file.sync_all().unwrap();
        self.new_file(name, content);
    }

    pub fn append(&mut self, name: &str, more: &[u8]) {
        let mut file = std::fs::OpenOptions::new()
            .append(true)
            .open(self.path(name))
            .unwrap();
        file.write_all(more).unwrap();
        file.sync_all().unwrap();
        self.content_of(name).extend_from_slice(more);
    }

    pub fn truncate(&mut self, name: &str, len: usize) {
        let file = std::fs::OpenOptions::new()
            .write(true)
            .open(self.path(name))
            .unwrap();
        file.set_len(len as u64).unwrap();
        file.sync_all().unwrap();
        self.content_of(name).resize(len, 0);
    }

    pub fn overwrite(&mut self, name: &str, offset: usize, bytes: &[u8]) {
        let file = std::fs::OpenOptions::new()
            .write(true)
            .open(self.path(name))
            .unwrap();
        file.write_all_at(bytes, offset as u64).unwrap();
        file.sync_all().unwrap();
        self.content_of(name)[offset..offset + bytes.len()].copy_from_slice(bytes);
    }

    pub fn link(&mut self, from: &str, to: &str) {
        std::fs::hard_link(self.path(from), self.path(to)).unwrap();
        self.fsync(to);
        let id = self.names[from];
        self.names.insert(to.into(), id);
    }

    /// Rename within a directory, then fsync the file.
    pub fn rename(&mut self, from: &str, to: &str) {
        std::fs::rename(self.path(from), self.path(to)).unwrap();
        self.fsync(to);
        let id = self.names.remove(from).expect("a name");
        self.names.insert(to.into(), id);
    }

    /// Unlink; durable with the next fsync of any file (a fast commit
    /// carries every pending name change).
    pub fn unlink(&mut self, name: &str) {
        std::fs::remove_file(self.path(name)).unwrap();
        self.names.remove(name);
    }

    pub fn mkdir(&mut self, name: &str) {
        std::fs::create_dir(self.path(name)).unwrap();
        self.names.insert(name.into(), None);
    }

    pub fn rmdir(&mut self, name: &str) {
        std::fs::remove_dir(self.path(name)).unwrap();
        self.names.remove(name);
    }

    /// A file written at every other 4 KiB block: many extents, an extent
    /// tree with index levels.
    pub fn fragmented(&mut self, name: &str, pieces: usize) {
        let file = std::fs::File::create(self.path(name)).unwrap();
        let mut content = Vec::new();
        for piece in 0..pieces {
            let bytes = pattern(piece, 1024);
            let offset = piece * 8192;
            file.write_all_at(&bytes, offset as u64).unwrap();
            content.resize(offset, 0);
            content.extend_from_slice(&bytes);
        }
        file.sync_all().unwrap();
        self.new_file(name, content);
    }

    /// Allocated-but-unwritten blocks, partly written.
    pub fn preallocated(&mut self, name: &str) {
        let file = std::fs::File::create(self.path(name)).unwrap();
        let (code, text) = run(
            "fallocate",
            &["-l", "65536", self.path(name).to_str().unwrap()],
        );
        assert_eq!(code, 0, "fallocate: {text}");
        let bytes = pattern(99, 5000);
        file.write_all_at(&bytes, 10_000).unwrap();
        file.sync_all().unwrap();
        let mut content = vec![0u8; 65536];
        content[10_000..15_000].copy_from_slice(&bytes);
        self.new_file(name, content);
    }
}

/// The operations the fast-commit tests run: creates, writes, appends,
/// truncates, links, unlinks, renames within a directory, rename over an
/// existing file, directories made and removed, a directory that grows,
/// a fragmented file, preallocated blocks. Every one ends with an fsync.
pub fn mixed_workload(work: &mut Workload, many: usize) {
    work.write("a", pattern(1, 3000));
    work.write("b", pattern(2, 5000));
    work.append("a", &pattern(3, 2000));
    work.link("b", "b2");
    work.unlink("old");
    work.write("after-unlink", pattern(4, 777));
    work.rename("a", "a-renamed");
    work.truncate("b", 1000);
    work.write("new", pattern(5, 1500));
    work.rename("new", "keep");
    work.mkdir("sub");
    work.write("sub/x", pattern(6, 10));
    work.mkdir("gone");
    work.write("y", pattern(7, 1));
    work.rmdir("gone");
    work.write("z", pattern(8, 1));
    work.fragmented("frag", 40);
    work.append("frag", &pattern(9, 2000));
    work.link("frag", "frag-link");
    work.preallocated("prealloc");
    work.write("big", pattern(10, 1 << 20));
    work.truncate("big", 300_000);
    work.overwrite("stay", 2, b"OVER");
    // Long names: the new directory grows past one block (and becomes an
    // htree) within the fast commits.
    work.mkdir("many");
    for index in 0..many {
        let name = format!("many/{index:03}-{}", "n".repeat(196));
        work.write(&name, pattern(index, index * 37 + 1));
    }
}

/// Records that must be in the fast-commit area for the mixed workload to
/// have been replayed from fast commits: (tag, name) as `debugfs logdump`
/// prints them.
pub const MIXED_WORKLOAD_RECORDS: &[(&str, &str)] = &[
    ("ADD_ENTRY", "b2"),
    ("DEL_ENTRY", "old"),
    ("CREAT_DENTRY", "after-unlink"),
    ("ADD_ENTRY", "a-renamed"),
    ("DEL_ENTRY", "keep"),
    ("CREAT_DENTRY", "sub"),
    ("DEL_ENTRY", "gone"),
    ("ADD_ENTRY", "frag-link"),
    ("CREAT_DENTRY", "prealloc"),
    ("CREAT_DENTRY", "many"),
    ("DEL_RANGE", ""),
];

/// Whether `records` (from `debugfs_fast_commits`) has a `tag` record for
/// `name`, or of any name if it is empty (debugfs may print a stray byte
/// after a name: no closing quote).
pub fn has_record(records: &str, tag: &str, name: &str) -> bool {
    let name = format!("name \"{name}");
    records.lines().any(|line| {
        line.starts_with(&format!("tag {tag},")) && (name.len() == 6 || line.contains(&name))
    })
}

/// What the log holds besides the fast commits when the crash comes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogBefore {
    /// The transaction that created the base tree under `d/`.
    BaseTree,
    /// Only a small transaction in the root directory: the base tree was
    /// checkpointed (`fsfreeze`), so the blocks the fast commits change are
    /// mostly not in the log, and a replay written home piecemeal would
    /// leave a second recovery a different starting point.
    Unrelated,
}

/// A crash image of a fresh `mke2fs -O fast_commit` filesystem: a base
/// tree committed in full, then `workload` under `d/`, each step fsync'd,
/// with a 300 s commit interval so that the fsyncs are fast commits, then
/// `xfs_io -x -c shutdown`. Returns the crash image and what was durable
/// (paths relative to the filesystem root).
pub fn fast_commit_crash_image(
    dir: &Path,
    name: &str,
    block_size: u32,
    size_mib: u64,
    workload: impl FnOnce(&mut Workload),
) -> (PathBuf, Durable) {
    fast_commit_crash_image_after(
        dir,
        name,
        block_size,
        size_mib,
        LogBefore::BaseTree,
        workload,
    )
}

/// `fast_commit_crash_image` with a choice of what the log holds.
pub fn fast_commit_crash_image_after(
    dir: &Path,
    name: &str,
    block_size: u32,
    size_mib: u64,
    log: LogBefore,
    workload: impl FnOnce(&mut Workload),
) -> (PathBuf, Durable) {
    let block_size = block_size.to_string();
    let image = common::mkfs(
        dir,
        name,
        size_mib,
        &["-t", "ext4", "-b", &block_size, "-O", "fast_commit"],
    );
    let mut durable = Durable::default();
    let crash = kernel_crash_image(&image, "commit=300", Duration::ZERO, |root| {
        let base = root.join("d");
        std::fs::create_dir(&base).unwrap();
        for (file, content) in [
            ("old", "old\n"),
            ("keep", "keep\n"),
            ("stay", "stay here\n"),
        ] {
            std::fs::write(base.join(file), content).unwrap();
        }
        assert_eq!(run("sync", &[]).0, 0);
        if log == LogBefore::Unrelated {
            let point = root.to_str().unwrap();
            assert_eq!(run("fsfreeze", &["-f", point]).0, 0);
            assert_eq!(run("fsfreeze", &["-u", point]).0, 0);
            std::fs::write(root.join("unrelated"), "x").unwrap();
            assert_eq!(run("sync", &[]).0, 0);
        }
        let mut work = Workload {
            root: base,
            names: BTreeMap::new(),
            contents: Vec::new(),
        };
        for (file, content) in [("keep", "keep\n"), ("stay", "stay here\n")] {
            work.new_file(file, content.as_bytes().to_vec());
        }
        workload(&mut work);
        for (path, content) in work.durable().files {
            durable.files.insert(format!("d/{path}"), content);
        }
    });
    (crash, durable)
}

/// The fast-commit records `debugfs logdump` shows (one per line, whatever
/// their tid).
pub fn debugfs_fast_commits(image: &Path) -> String {
    let (_, text) = run("debugfs", &["-c", "-R", "logdump", image.to_str().unwrap()]);
    let records: Vec<&str> = text
        .lines()
        .filter(|line| line.starts_with("tag "))
        .collect();
    records.join("\n")
}

// ---------------------------------------------------------------------------
// Judging the replays of a crash image.

/// A copy of `image` beside it, named after `suffix`.
pub fn copy_image(image: &Path, suffix: &str) -> PathBuf {
    let path = image.with_extension(format!("{suffix}.img"));
    std::fs::copy(image, &path).unwrap();
    path
}

fn fsck_clean(image: &Path) -> Result<(), String> {
    let (code, text) = common::fsck(image);
    if code == 0 { Ok(()) } else { Err(text) }
}

/// Replay copies of `crash` with the kernel (a loop mount), jext4
/// (`jext4 recover`) and e2fsck: the kernel's replay keeps every file of
/// `expected` and is e2fsck-clean; jext4's is e2fsck-clean and gives the
/// kernel's tree; e2fsck's is reported, not judged (docs/durability.md:
/// e2fsck 1.47 cannot replay fast commits). `label` prefixes every message.
pub fn replays_agree(crash: &Path, expected: &Durable, label: &str) {
    let kernel = copy_image(crash, "kernel");
    let kernel_tree = mounted_tree(&kernel, "rw").expect("the kernel mounts the crash");
    fsck_clean(&kernel)
        .unwrap_or_else(|text| panic!("{label}: e2fsck after the kernel's replay:\n{text}"));
    let missing = expected.missing_from(&kernel_tree);
    assert!(
        missing.is_empty(),
        "{label}: the kernel's replay lost {missing:?}"
    );

    let ours = copy_image(crash, "jext4");
    let report = jext4::engine::fs::recover_image(&ours)
        .unwrap()
        .expect("recovery was needed");
    assert!(report.journal.problem.is_none(), "{label}: {report:?}");
    fsck_clean(&ours).unwrap_or_else(|text| panic!("{label}: e2fsck after jext4 recover:\n{text}"));
    let our_tree = mounted_tree(&ours, "ro,noload").unwrap();
    assert_eq!(
        our_tree,
        kernel_tree,
        "{label}: jext4's replay differs from the kernel's:\n{}",
        tree_difference(&kernel_tree, &our_tree)
    );

    let theirs = copy_image(crash, "e2fsck");
    let (code, text) = run(
        "e2fsck",
        &["-E", "journal_only", "-p", theirs.to_str().unwrap()],
    );
    let their_tree = mounted_tree(&theirs, "ro,noload").unwrap_or_default();
    eprintln!(
        "{label}: {} fsync'd files checked; e2fsck -E journal_only exit {code} ({}), its tree {} \
         the kernel's, {} fsync'd files lost by it",
        expected.files.len(),
        text.lines().last().unwrap_or(""),
        if their_tree == kernel_tree {
            "matches"
        } else {
            "differs from"
        },
        expected.missing_from(&their_tree).len()
    );
}

// ---------------------------------------------------------------------------
// The fast-commit area of an image.

/// The image's fast-commit area: its blocks' byte offsets in the image.
pub struct FastCommitBlocks {
    pub block_size: usize,
    pub offsets: Vec<u64>,
}

impl FastCommitBlocks {
    pub fn of(image: &Path) -> FastCommitBlocks {
        let block_size = crate::common::journal::fs_superblock(image).block_size() as usize;
        let journal = journal_blocks_from_debugfs(image);
        let bytes = std::fs::read(image).unwrap();
        let at = journal[0] as usize * block_size;
        let superblock = JournalSuperblock::decode(&bytes[at..at + block_size]).unwrap();
        let layout = superblock
            .check(block_size as u32, journal.len() as u64)
            .unwrap();
        let (first, end) = layout.fast_commit.expect("a fast_commit journal");
        let offsets = (first..end)
            .map(|index| journal[index as usize] * block_size as u64)
            .collect();
        FastCommitBlocks {
            block_size,
            offsets,
        }
    }

    /// The area's bytes, block after block.
    pub fn read(&self, image: &Path) -> Vec<u8> {
        let bytes = std::fs::read(image).unwrap();
        self.offsets
            .iter()
            .flat_map(|&offset| bytes[offset as usize..offset as usize + self.block_size].to_vec())
            .collect()
    }

    pub fn write(&self, image: &Path, area: &[u8]) {
        let file = std::fs::OpenOptions::new().write(true).open(image).unwrap();
        for (index, &offset) in self.offsets.iter().enumerate() {
            let block = &area[index * self.block_size..(index + 1) * self.block_size];
            file.write_all_at(block, offset).unwrap();
        }
    }

    /// Positions (byte offsets in `area`) of the records of the fast
    /// commits, up to the first record that does not parse: (tag, start).
    pub fn records(&self, area: &[u8]) -> Vec<(u16, usize)> {
        let mut records = Vec::new();
        for block in 0..area.len() / self.block_size {
            let base = block * self.block_size;
            let mut offset = 0;
            while offset + RECORD_HEADER_SIZE <= self.block_size {
                let record_tag = get_u16(area, base + offset);
                let len = get_u16(area, base + offset + 2) as usize;
                if record_tag == 0 || record_tag > tag::HEAD {
                    return records;
                }
                records.push((record_tag, base + offset));
                offset += RECORD_HEADER_SIZE + len;
            }
        }
        records
    }
}

/// Seal the fast commit whose TAIL is at `tail` again (after its records
/// or tid were changed): the CRC runs from `start` (the first byte of the
/// commit) to the TAIL's tid.
pub fn reseal(area: &mut [u8], start: usize, tail: usize) {
    let crc = crc32c_raw(0, &area[start..tail + 8]);
    area[tail + 8..tail + 12].copy_from_slice(&crc.to_le_bytes());
    debug_assert_eq!(get_u32(area, tail + 8), crc);
}

// ---------------------------------------------------------------------------
// A device that dies.

/// A memory device that accepts `writes_left` writes, then fails every
/// write and flush. With `tear`, the fatal write still puts its first
/// sector on the disk.
pub struct CrashingDevice {
    pub inner: MemoryDevice,
    writes_left: AtomicUsize,
    pub writes_done: AtomicUsize,
    tear: bool,
}

impl CrashingDevice {
    pub fn new(bytes: Vec<u8>, writes_left: usize, tear: bool) -> Self {
        CrashingDevice {
            inner: MemoryDevice::from_bytes(bytes),
            writes_left: AtomicUsize::new(writes_left),
            writes_done: AtomicUsize::new(0),
            tear,
        }
    }
}

impl BlockDevice for CrashingDevice {
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> std::io::Result<()> {
        self.inner.read_at(offset, buf)
    }

    fn write_at(&self, offset: u64, buf: &[u8]) -> std::io::Result<()> {
        let left = self.writes_left.load(Ordering::SeqCst);
        if left == 0 {
            // A torn primary superblock is the format's own hazard.
            if self.tear && buf.len() > 512 && offset != 1024 {
                self.inner.write_at(offset, &buf[..512])?;
            }
            return Err(std::io::Error::other("simulated crash"));
        }
        self.writes_left.store(left - 1, Ordering::SeqCst);
        self.writes_done.fetch_add(1, Ordering::SeqCst);
        self.inner.write_at(offset, buf)
    }

    fn flush(&self) -> std::io::Result<()> {
        if self.writes_left.load(Ordering::SeqCst) == 0 {
            return Err(std::io::Error::other("simulated crash"));
        }
        Ok(())
    }

    fn size_bytes(&self) -> u64 {
        self.inner.size_bytes()
    }
}
