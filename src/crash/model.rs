//! The reference model: what the filesystem looked like after every
//! operation of a workload, and what each acknowledgement promised.
//!
//! A workload runs in lanes (one per thread; a single-threaded workload has
//! one lane rooted at `/`). Each lane owns a subtree and numbers its
//! operations 1, 2, …; op 0 is the state after setup. After every operation
//! the lane re-reads the subtrees the operation touched from the live
//! filesystem — the model records what the filesystem *said*, so that
//! out-of-space, short writes and other outcomes need no prediction — and
//! keeps, per path, the history of what the name pointed at (kind, inode)
//! and, per inode, the history of its metadata (kind, size, permissions,
//! link count, xattrs, symlink target) and its bytes. Times and block
//! counts are not compared.
//!
//! Acknowledgements (`Persist`) become lower bounds:
//! - `sync` at op j: every op up to j is durable, with every inode's data;
//! - `fsync` of inode i at op j: the last op before j that changed i's
//!   metadata or a name of i is durable (hence, journaled in order, every op
//!   before it), and i's bytes as of j;
//! - `fdatasync` of i: the last op before j that changed i's size or
//!   created it; i's bytes as of j;
//! - `fsync` of directory d: the last op before j that changed an entry
//!   of d.
//!
//! A change of bytes alone bounds nothing but those bytes: an overwrite in
//! place needs no commit, so the ops before it need not be durable. (When
//! it filled a hole, the allocation must be committed — the data bound
//! catches that: the hole would read as zeros, not the acknowledged bytes.)

use crate::fs::FileKind;
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

pub const PAGE_SIZE: usize = 4096;
pub const SECTOR_SIZE: usize = 512;

/// Entries one subtree read visits at most (a corrupt tree must not make
/// the check run away).
const MAX_TREE_ENTRIES: usize = 200_000;

/// What a name points at.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub kind: FileKind,
    pub ino: u32,
}

/// The compared metadata of an inode.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InodeMeta {
    pub kind: FileKind,
    /// File and symlink sizes (0 for directories, whose size is layout).
    pub size: u64,
    pub perm: u16,
    pub nlink: u32,
    pub xattrs: Xattrs,
    pub target: Vec<u8>,
}

/// A file's bytes in pages that versions share when they are equal.
#[derive(Debug, Clone, Default)]
pub struct Content {
    len: u64,
    pages: Vec<Arc<[u8]>>,
}

impl Content {
    /// `bytes` as pages, reusing `previous`'s pages where they are equal.
    pub fn new(bytes: &[u8], previous: Option<&Content>) -> Content {
        let pages = bytes
            .chunks(PAGE_SIZE)
            .enumerate()
            .map(|(index, chunk)| {
                let mut page = chunk.to_vec();
                page.resize(PAGE_SIZE, 0);
                match previous.and_then(|content| content.pages.get(index)) {
                    Some(old) if **old == *page => Arc::clone(old),
                    _ => page.into(),
                }
            })
            .collect();
        Content {
            len: bytes.len() as u64,
            pages,
        }
    }

    pub fn len(&self) -> u64 {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Sector `index`, or None past the end (where a file reads zeros).
    pub fn sector(&self, index: u64) -> Option<&[u8]> {
        let at = index as usize * SECTOR_SIZE;
        let page = self.pages.get(at / PAGE_SIZE)?;
        let start = at % PAGE_SIZE;
        Some(&page[start..start + SECTOR_SIZE])
    }

    /// The bytes, `len` long.
    pub fn bytes(&self) -> Vec<u8> {
        let mut bytes: Vec<u8> = self
            .pages
            .iter()
            .flat_map(|page| page.iter().copied())
            .collect();
        bytes.truncate(self.len as usize);
        bytes
    }

    fn same_as(&self, other: &Content) -> bool {
        self.len == other.len
            && self.pages.len() == other.pages.len()
            && self
                .pages
                .iter()
                .zip(&other.pages)
                .all(|(a, b)| Arc::ptr_eq(a, b) || a == b)
    }
}

#[derive(Debug, Clone)]
pub struct InodeVersion {
    pub meta: InodeMeta,
    pub content: Content,
}

/// One tree as read: paths relative to the lane root ("" is the root).
#[derive(Debug, Default)]
pub struct Snapshot {
    pub entries: BTreeMap<String, Entry>,
    pub inodes: HashMap<u32, InodeVersion>,
}

/// Extended attributes: (name, value), sorted by name.
pub type Xattrs = Vec<(Vec<u8>, Vec<u8>)>;

/// `lstat` as a tree reader reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stat {
    pub ino: u32,
    pub kind: FileKind,
    pub size: u64,
    pub perm: u16,
    pub nlink: u32,
}

/// Read access to a filesystem by absolute path: the live engine, a
/// recovered one, or a kernel mount.
pub trait TreeSource {
    /// `lstat`; None when the path does not exist.
    fn stat(&self, path: &str) -> Result<Option<Stat>, String>;
    /// Names in a directory, without "." and "..".
    fn list(&self, path: &str) -> Result<Vec<String>, String>;
    fn read(&self, path: &str, size: u64) -> Result<Vec<u8>, String>;
    fn read_link(&self, path: &str) -> Result<Vec<u8>, String>;
    /// Every extended attribute, sorted by name.
    fn xattrs(&self, path: &str) -> Result<Xattrs, String>;
}

/// `root` joined with the relative path `rel` ("" is `root` itself).
pub fn join(root: &str, rel: &str) -> String {
    match (root.trim_end_matches('/'), rel) {
        ("", "") => "/".to_string(),
        (root, "") => root.to_string(),
        (root, rel) => format!("{root}/{rel}"),
    }
}

/// The relative path of `rel`'s directory; None for the lane root.
pub fn parent_of(rel: &str) -> Option<&str> {
    if rel.is_empty() {
        return None;
    }
    Some(rel.rfind('/').map_or("", |at| &rel[..at]))
}

/// Read the subtree at `rel` under `root`, skipping the `exclude`d
/// subtrees (other lanes'). A missing `rel` reads as an empty snapshot.
pub fn read_subtree(
    source: &dyn TreeSource,
    root: &str,
    rel: &str,
    exclude: &[String],
) -> Result<Snapshot, String> {
    let mut snapshot = Snapshot::default();
    let mut pending = vec![rel.to_string()];
    while let Some(path) = pending.pop() {
        if snapshot.entries.len() >= MAX_TREE_ENTRIES {
            return Err(format!("more than {MAX_TREE_ENTRIES} entries under {root}"));
        }
        let absolute = join(root, &path);
        let Some(stat) = source.stat(&absolute)? else {
            continue;
        };
        if stat.kind == FileKind::Directory {
            for name in source.list(&absolute)? {
                let child = if path.is_empty() {
                    name
                } else {
                    format!("{path}/{name}")
                };
                if !exclude.contains(&child) {
                    pending.push(child);
                }
            }
        }
        if let std::collections::hash_map::Entry::Vacant(slot) = snapshot.inodes.entry(stat.ino) {
            slot.insert(read_inode(source, &absolute, &stat)?);
        }
        snapshot.entries.insert(
            path,
            Entry {
                kind: stat.kind,
                ino: stat.ino,
            },
        );
    }
    Ok(snapshot)
}

/// One path's entry and inode, without its children.
pub fn read_node(source: &dyn TreeSource, root: &str, rel: &str) -> Result<Snapshot, String> {
    let mut snapshot = Snapshot::default();
    let absolute = join(root, rel);
    if let Some(stat) = source.stat(&absolute)? {
        let version = read_inode(source, &absolute, &stat)?;
        snapshot.inodes.insert(stat.ino, version);
        let entry = Entry {
            kind: stat.kind,
            ino: stat.ino,
        };
        snapshot.entries.insert(rel.to_string(), entry);
    }
    Ok(snapshot)
}

fn read_inode(source: &dyn TreeSource, path: &str, stat: &Stat) -> Result<InodeVersion, String> {
    let (size, bytes, target) = match stat.kind {
        FileKind::Regular => (stat.size, source.read(path, stat.size)?, Vec::new()),
        FileKind::Symlink => (stat.size, Vec::new(), source.read_link(path)?),
        _ => (0, Vec::new(), Vec::new()),
    };
    if stat.kind == FileKind::Regular && bytes.len() as u64 != size {
        return Err(format!("{path}: read {} bytes of {size}", bytes.len()));
    }
    Ok(InodeVersion {
        meta: InodeMeta {
            kind: stat.kind,
            size,
            perm: stat.perm,
            nlink: stat.nlink,
            xattrs: source.xattrs(path)?,
            target,
        },
        content: Content::new(&bytes, None),
    })
}

/// Values of one thing over the ops: `changes[k] = (op, value from op on)`.
#[derive(Debug, Clone)]
pub struct History<T> {
    changes: Vec<(u32, Option<T>)>,
}

impl<T> Default for History<T> {
    fn default() -> Self {
        History {
            changes: Vec::new(),
        }
    }
}

impl<T> History<T> {
    /// The value after op `op`.
    pub fn at(&self, op: u32) -> Option<&T> {
        let after = self.changes.partition_point(|(from, _)| *from <= op);
        after
            .checked_sub(1)
            .and_then(|index| self.changes[index].1.as_ref())
    }

    pub fn latest(&self) -> Option<&T> {
        self.changes.last().and_then(|(_, value)| value.as_ref())
    }

    fn set(&mut self, op: u32, value: Option<T>) {
        debug_assert!(self.changes.last().is_none_or(|(last, _)| *last <= op));
        match self.changes.last_mut() {
            Some((last, slot)) if *last == op => *slot = value,
            _ => self.changes.push((op, value)),
        }
    }

    /// The constant stretches of `low..=high`: (first op, last op, value).
    pub fn segments(&self, low: u32, high: u32) -> Vec<(u32, u32, Option<&T>)> {
        debug_assert!(low <= high);
        let mut segments = vec![(low, high, self.at(low))];
        for (from, value) in &self.changes {
            if *from > low && *from <= high {
                segments.last_mut().expect("one segment").1 = from - 1;
                segments.push((*from, high, value.as_ref()));
            }
        }
        segments
    }

    /// Ops at which the value changed, with the values, from `low` on.
    pub fn changes_from(&self, low: u32) -> impl Iterator<Item = (u32, Option<&T>)> {
        self.changes
            .iter()
            .filter(move |(from, _)| *from >= low)
            .map(|(from, value)| (*from, value.as_ref()))
    }
}

/// A name changed: in directory `parent` (at relative path
/// `parent_path`), from inode `old` to `new`.
#[derive(Debug, Clone)]
struct NameChange {
    parent: Option<u32>,
    parent_path: String,
    old: Option<u32>,
    new: Option<u32>,
}

/// An inode changed: its metadata (`size` when its size did), or else
/// only its bytes.
#[derive(Debug, Clone)]
struct InodeChange {
    ino: u32,
    meta: bool,
    size: bool,
    created: bool,
}

#[derive(Debug, Clone, Default)]
pub struct OpInfo {
    pub what: String,
    /// A write of file data: with delayed allocation the size it set may
    /// lag behind later operations until the file is written out.
    pub data_write: bool,
    names: Vec<NameChange>,
    inodes: Vec<InodeChange>,
}

/// What an operation's successful return promised.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Persist {
    Sync,
    Fsync(u32),
    Fdatasync(u32),
    FsyncDir(u32),
}

/// Whose bytes an acknowledgement made durable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Durable {
    Nothing,
    Everything,
    Inode(u32),
}

/// Whose operations an acknowledgement made durable, up to its bound.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AckScope {
    /// Every directory's (sync).
    Everything,
    /// These directories' (relative paths): where the synced inode has
    /// its names, and those the bounding op changed names in. A
    /// per-directory transaction commits those directories' operations
    /// in order; other directories' may be left behind.
    Dirs(Vec<String>),
}

#[derive(Debug, Clone)]
pub struct Ack {
    pub op: u32,
    pub persist: Persist,
    /// Every op up to this one is durable (one journal for everything);
    /// with per-directory transactions, every op up to this one of the
    /// directories of `scope`.
    pub namespace_bound: u32,
    pub scope: AckScope,
    /// The inode whose metadata is durable as of `namespace_bound` or
    /// later (fsync, fdatasync).
    pub inode: Option<u32>,
    pub data: Durable,
}

pub struct LaneModel {
    pub lane: u32,
    /// Absolute path of the lane's subtree.
    pub root: String,
    /// Subtrees (relative) that belong to other lanes.
    pub exclude: Vec<String>,
    /// `ops[0]` is the state after setup.
    pub ops: Vec<OpInfo>,
    paths: BTreeMap<String, History<Entry>>,
    inodes: HashMap<u32, History<Arc<InodeVersion>>>,
    pub acks: HashMap<u32, Ack>,
}

impl LaneModel {
    pub fn new(lane: u32, root: &str, exclude: Vec<String>, initial: Snapshot) -> Self {
        let mut model = LaneModel {
            lane,
            root: root.to_string(),
            exclude,
            ops: vec![OpInfo {
                what: "setup".into(),
                ..OpInfo::default()
            }],
            paths: BTreeMap::new(),
            inodes: HashMap::new(),
            acks: HashMap::new(),
        };
        model.finish(0, vec![(String::new(), initial)]);
        model
    }

    /// Number an operation about to start.
    pub fn begin(&mut self, what: String) -> u32 {
        self.ops.push(OpInfo {
            what,
            ..OpInfo::default()
        });
        (self.ops.len() - 1) as u32
    }

    /// Op `op` writes file data (`OpInfo::data_write`).
    pub fn mark_data_write(&mut self, op: u32) {
        self.ops[op as usize].data_write = true;
    }

    /// The sizes inode `ino` may show, with delayed allocation, where the
    /// rest of it is as of op `at`: its size then, and those it had before
    /// back to its last size change that was not a data write (a truncate,
    /// a fallocate, its creation: each writes the file out first).
    pub fn lagging_sizes(&self, ino: u32, at: u32) -> Vec<u64> {
        let Some(history) = self.inodes.get(&ino) else {
            return Vec::new();
        };
        let changes: Vec<&(u32, Option<Arc<InodeVersion>>)> = history
            .changes
            .iter()
            .filter(|(from, _)| *from <= at)
            .collect();
        let mut sizes = Vec::new();
        // From the newest version back: the one before each change counts
        // while the change was a data write or left the size alone.
        for pair in changes.windows(2).rev() {
            let ((_, before), (from, after)) = (pair[0], pair[1]);
            let Some(after) = after else { break };
            if sizes.is_empty() {
                sizes.push(after.meta.size);
            }
            let Some(before) = before else { break };
            let resized = before.meta.size != after.meta.size;
            if resized && !self.ops[*from as usize].data_write {
                break;
            }
            sizes.push(before.meta.size);
        }
        if sizes.is_empty()
            && let Some((_, Some(only))) = changes.last()
        {
            sizes.push(only.meta.size);
        }
        sizes
    }

    pub fn last_op(&self) -> u32 {
        (self.ops.len() - 1) as u32
    }

    pub fn paths(&self) -> impl Iterator<Item = (&String, &History<Entry>)> {
        self.paths.iter()
    }

    pub fn path(&self, rel: &str) -> Option<&History<Entry>> {
        self.paths.get(rel)
    }

    pub fn inode(&self, ino: u32) -> Option<&History<Arc<InodeVersion>>> {
        self.inodes.get(&ino)
    }

    /// Record op `op`'s effect: each touched subtree as re-read.
    pub fn finish(&mut self, op: u32, touched: Vec<(String, Snapshot)>) {
        for (rel, snapshot) in touched {
            self.update_names(op, &rel, &snapshot);
            for (ino, version) in snapshot.inodes {
                self.update_inode(op, ino, version);
            }
        }
    }

    /// Record op `op`'s effect on inodes only (a node re-read without its
    /// children: its name did not change).
    pub fn finish_inodes(&mut self, op: u32, snapshot: Snapshot) {
        for (ino, version) in snapshot.inodes {
            self.update_inode(op, ino, version);
        }
    }

    fn update_names(&mut self, op: u32, rel: &str, snapshot: &Snapshot) {
        let under =
            |path: &str| rel.is_empty() || path == rel || path.starts_with(&format!("{rel}/"));
        let gone: Vec<String> = self
            .paths
            .iter()
            .filter(|(path, history)| {
                under(path) && history.latest().is_some() && !snapshot.entries.contains_key(*path)
            })
            .map(|(path, _)| path.clone())
            .collect();
        for path in gone {
            self.set_name(op, &path, None);
        }
        for (path, entry) in &snapshot.entries {
            self.set_name(op, path, Some(entry.clone()));
        }
    }

    fn set_name(&mut self, op: u32, path: &str, entry: Option<Entry>) {
        let history = self.paths.entry(path.to_string()).or_default();
        let old = history.latest().map(|e| e.ino);
        if history.latest() == entry.as_ref() {
            return;
        }
        let new = entry.as_ref().map(|e| e.ino);
        history.set(op, entry);
        let parent = parent_of(path)
            .and_then(|parent| self.paths.get(parent))
            .and_then(|history| history.latest())
            .map(|entry| entry.ino);
        let parent_path = parent_of(path).unwrap_or_default().to_string();
        self.ops[op as usize].names.push(NameChange {
            parent,
            parent_path,
            old,
            new,
        });
    }

    fn update_inode(&mut self, op: u32, ino: u32, mut version: InodeVersion) {
        let history = self.inodes.entry(ino).or_default();
        let change = match history.latest() {
            Some(old) => {
                version.content = Content::new(&version.content.bytes(), Some(&old.content));
                let meta = old.meta != version.meta;
                if !meta && old.content.same_as(&version.content) {
                    return;
                }
                InodeChange {
                    ino,
                    meta,
                    size: old.meta.size != version.meta.size,
                    created: false,
                }
            }
            None => InodeChange {
                ino,
                meta: true,
                size: true,
                created: true,
            },
        };
        history.set(op, Some(Arc::new(version)));
        self.ops[op as usize].inodes.push(change);
    }

    /// Op `op` returned and promised `persist`.
    pub fn acknowledge(&mut self, op: u32, persist: Persist) {
        let last = |test: &dyn Fn(&OpInfo) -> bool| -> u32 {
            (1..op)
                .rev()
                .find(|&k| test(&self.ops[k as usize]))
                .unwrap_or(0)
        };
        let (namespace_bound, data) = match persist {
            Persist::Sync => (op, Durable::Everything),
            Persist::Fsync(ino) => (
                last(&|info| {
                    info.inodes.iter().any(|c| c.ino == ino && c.meta)
                        || info
                            .names
                            .iter()
                            .any(|c| c.old == Some(ino) || c.new == Some(ino))
                }),
                Durable::Inode(ino),
            ),
            Persist::Fdatasync(ino) => (
                last(&|info| {
                    info.inodes
                        .iter()
                        .any(|c| c.ino == ino && (c.size || c.created))
                }),
                Durable::Inode(ino),
            ),
            Persist::FsyncDir(dir) => (
                last(&|info| info.names.iter().any(|c| c.parent == Some(dir))),
                Durable::Nothing,
            ),
        };
        debug_assert!(namespace_bound <= op);
        let (scope, inode) = match persist {
            Persist::Sync => (AckScope::Everything, None),
            Persist::Fsync(ino) | Persist::Fdatasync(ino) => (
                AckScope::Dirs(self.dirs_of(ino, namespace_bound)),
                Some(ino),
            ),
            Persist::FsyncDir(dir) => {
                let mut dirs = self.dirs_of(dir, namespace_bound);
                // The directory's own entries, not (only) its parent's.
                dirs.extend(self.names_of(dir));
                dirs.sort();
                dirs.dedup();
                (AckScope::Dirs(dirs), None)
            }
        };
        self.acks.insert(
            op,
            Ack {
                op,
                persist,
                namespace_bound,
                scope,
                inode,
                data,
            },
        );
    }

    /// The paths naming `ino` now.
    fn names_of(&self, ino: u32) -> Vec<String> {
        self.paths
            .iter()
            .filter(|(_, history)| history.latest().is_some_and(|entry| entry.ino == ino))
            .map(|(path, _)| path.clone())
            .collect()
    }

    /// The directories an acknowledgement about `ino` bounded by op
    /// `bound` covers: those holding its names now, and those op `bound`
    /// changed names in.
    fn dirs_of(&self, ino: u32, bound: u32) -> Vec<String> {
        let mut dirs: Vec<String> = self
            .names_of(ino)
            .iter()
            .filter_map(|path| parent_of(path).map(str::to_string))
            .collect();
        dirs.extend(
            self.ops[bound as usize]
                .names
                .iter()
                .map(|change| change.parent_path.clone()),
        );
        dirs.sort();
        dirs.dedup();
        dirs
    }

    /// The ops of `low..=high` that changed names in several directories
    /// (renames and links across directories), with those directories:
    /// each is atomic across them.
    pub fn spanning_ops(&self, low: u32, high: u32) -> Vec<(u32, Vec<String>)> {
        (low.max(1)..=high)
            .filter_map(|op| {
                let mut dirs: Vec<String> = self
                    .ops
                    .get(op as usize)?
                    .names
                    .iter()
                    .map(|change| change.parent_path.clone())
                    .collect();
                dirs.sort();
                dirs.dedup();
                (dirs.len() > 1).then_some((op, dirs))
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(bytes: &[u8]) -> InodeVersion {
        InodeVersion {
            meta: InodeMeta {
                kind: FileKind::Regular,
                size: bytes.len() as u64,
                perm: 0o644,
                nlink: 1,
                xattrs: Vec::new(),
                target: Vec::new(),
            },
            content: Content::new(bytes, None),
        }
    }

    fn snapshot(entries: &[(&str, u32, &[u8])]) -> Snapshot {
        let mut snapshot = Snapshot::default();
        for (path, ino, bytes) in entries {
            snapshot.entries.insert(
                path.to_string(),
                Entry {
                    kind: FileKind::Regular,
                    ino: *ino,
                },
            );
            snapshot.inodes.insert(*ino, file(bytes));
        }
        snapshot
    }

    #[test]
    fn history_segments() {
        let mut history = History::default();
        history.set(0, Some(1));
        history.set(3, None);
        history.set(5, Some(2));
        assert_eq!(history.at(2), Some(&1));
        assert_eq!(history.at(4), None);
        assert_eq!(
            history.segments(1, 6),
            vec![(1, 2, Some(&1)), (3, 4, None), (5, 6, Some(&2))]
        );
        assert_eq!(history.segments(4, 4), vec![(4, 4, None)]);
    }

    #[test]
    fn acknowledgements_bound_the_right_ops() {
        let mut model = LaneModel::new(0, "/", Vec::new(), snapshot(&[("a", 12, b"x")]));
        // 1: create b; 2: write a; 3: rename b -> c; then persistence
        // calls, each bounded by the last change that needs a commit.
        let op = model.begin("create b".into());
        model.finish(op, vec![("b".into(), snapshot(&[("b", 13, b"")]))]);
        let op = model.begin("write a".into());
        model.finish(op, vec![("a".into(), snapshot(&[("a", 12, b"xy")]))]);
        let op = model.begin("rename b c".into());
        model.finish(
            op,
            vec![
                ("b".into(), Snapshot::default()),
                ("c".into(), snapshot(&[("c", 13, b"")])),
            ],
        );
        // 4: overwrite a in place: bytes only, no commit needed.
        let op = model.begin("overwrite a".into());
        model.finish(op, vec![("a".into(), snapshot(&[("a", 12, b"zy")]))]);
        for (persist, bound) in [
            (Persist::Fdatasync(12), 2),
            (Persist::Fsync(12), 2),
            (Persist::Fsync(13), 3),
            (Persist::Fdatasync(13), 1),
        ] {
            let op = model.begin(format!("{persist:?}"));
            model.finish(op, Vec::new());
            model.acknowledge(op, persist);
            assert_eq!(model.acks[&op].namespace_bound, bound, "{persist:?}");
        }
        assert_eq!(model.path("b").unwrap().at(2).unwrap().ino, 13);
        assert!(model.path("b").unwrap().at(3).is_none());
        let a = model.inode(12).unwrap();
        assert_eq!(a.at(1).unwrap().content.bytes(), b"x");
        assert_eq!(a.at(2).unwrap().content.bytes(), b"xy");
    }

    #[test]
    fn content_sectors_and_sharing() {
        let bytes: Vec<u8> = (0..5000).map(|i| i as u8).collect();
        let first = Content::new(&bytes, None);
        let mut changed = bytes.clone();
        changed[4500] ^= 1;
        let second = Content::new(&changed, Some(&first));
        assert!(Arc::ptr_eq(&first.pages[0], &second.pages[0]));
        assert!(!first.same_as(&second));
        assert_eq!(second.sector(1).unwrap(), &bytes[512..1024]);
        // Past the end of the bytes but inside the last page: zeros.
        assert_eq!(first.sector(15).unwrap(), &[0u8; 512][..]);
        assert!(first.sector(16).is_none());
        assert_eq!(second.bytes(), changed);
    }
}
