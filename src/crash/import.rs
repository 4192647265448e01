//! The import workload: `jext4 cp -a` — the library's `copy_in` — of a
//! small host tree into the image, crashed anywhere.
//!
//! One import is hundreds of engine operations from several threads, many
//! transactions per entry, so the model's prefix check (one operation, one
//! transaction) cannot follow it. This oracle judges every entry instead,
//! against the host tree it came from:
//! - every name under `/import` is one of the source's, of its kind; a
//!   regular file holds a prefix of its source's bytes (file data reaches
//!   the disk before the metadata that shows it), or — when the import runs
//!   again over an older copy — the older copy's bytes, whole; a symlink
//!   the source's target; modes and xattrs the source's (a directory is
//!   writable by its owner until its own mode is set at the end);
//! - names of one inode are names of one inode in the source (hard links),
//!   and an inode's link count is its number of names;
//! - every entry the copy reported done before a sync returned is there,
//!   with all its bytes: the copy reports an entry once its data is
//!   written, and the sync's commit made it durable (the syncs stand in for
//!   the commit interval, which the recordings keep out of the way);
//! - once the final sync returned, the tree is the source's, exactly;
//! - copying again onto the recovered image completes it, as running the
//!   same `cp -a` again does: the tree is the source's (the runner then
//!   checks it with `e2fsck -fn`).
//!
//! The host trees live in a scratch directory for as long as the scenario.

use super::driver::{FsSource, Lane};
use super::model::{InodeMeta, InodeVersion, Snapshot, TreeSource, read_subtree};
use super::rng::Rng;
use super::tools::{Scratch, StdSource};
use crate::api::Image;
use crate::fs::{Caller, FileKind, Fs};
use crate::tools::{CopyOptions, Progress, copy_in};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::os::unix::fs::{FileExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

/// Where the copy goes, under the image's root (outside lane 0's model).
pub const IMPORT_DIR: &str = "import";

/// Mark after the copy's final sync returned: the whole tree is durable.
const COMPLETE_MARK: &str = "import complete";

/// Mark prefix after an intermediate sync returned, with the number of
/// entries reported done before it began.
const SYNCED_MARK: &str = "import synced";

/// Files larger than the copy's 1 MiB buffer, per tree: with the rest
/// (under 3 MiB), two versions of the tree fit the 16 MiB image at 4 KiB
/// blocks, beside its 4 MiB journal.
const LARGE_FILES_MAX: usize = 2;

/// Entries between two syncs of the recorded copy.
const SYNC_EVERY_ENTRIES: usize = 10;

/// What the recorded copy does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Plan {
    /// A fresh copy of the tree with `threads` threads.
    Fresh { threads: usize },
    /// The tree's second version copied over its first (in setup).
    Again,
}

/// The host trees of one scenario and what the copy reported.
pub struct ImportOracle {
    plan: Plan,
    trees: Result<Trees, String>,
    /// Image paths (relative to `/import`) the copy reported done, in
    /// order; written while recording, read while checking.
    done: Mutex<Vec<String>>,
}

struct Trees {
    /// Removes the trees when the scenario ends.
    _scratch: Scratch,
    /// The tree the recorded copy writes, as read back from the host.
    latest_dir: PathBuf,
    latest: Snapshot,
    /// The first version (copied in setup), for `Plan::Again`.
    older_dir: Option<PathBuf>,
    older: Option<Snapshot>,
}

impl ImportOracle {
    pub fn new(plan: Plan, seed: u64) -> ImportOracle {
        ImportOracle {
            plan,
            trees: Trees::build(plan, seed),
            done: Mutex::new(Vec::new()),
        }
    }

    fn trees(&self) -> Result<&Trees, String> {
        self.trees
            .as_ref()
            .map_err(|error| format!("building the source tree: {error}"))
    }

    /// Setup: for `Plan::Again`, the first version copied in (not
    /// recorded). Always: the destination directory.
    pub fn setup(&self, lane: &mut Lane) {
        let _ = lane.mkdir(IMPORT_DIR);
        let result = self.trees().and_then(|trees| match &trees.older_dir {
            Some(older) => copy(lane.engine(), older, 2, None),
            None => Ok(()),
        });
        if let Err(error) = result {
            lane.fatal.get_or_insert(format!("import setup: {error}"));
        }
    }

    /// The recorded copy: a sync every `SYNC_EVERY_ENTRIES` entries, and
    /// one at the end, each marked once it returned.
    pub fn run(self: &Arc<Self>, lane: &mut Lane) {
        let threads = match self.plan {
            Plan::Fresh { threads } => threads,
            Plan::Again => 1,
        };
        let fs = lane.engine();
        let device = lane.device();
        let oracle = Arc::clone(self);
        let (sync_fs, sync_device) = (Arc::clone(&fs), Arc::clone(&device));
        let on_done = move |_: &str, dest: &str| {
            let count = {
                let mut done = oracle.done.lock().unwrap();
                done.push(relative(dest).to_string());
                done.len()
            };
            // A failed sync fails the final one too, which is checked.
            if count % SYNC_EVERY_ENTRIES == 0 && sync_fs.sync().is_ok() {
                sync_device.mark(format!("{SYNCED_MARK} {count}"));
            }
        };
        let result = self.trees().and_then(|trees| {
            copy(
                Arc::clone(&fs),
                &trees.latest_dir,
                threads,
                Some(Box::new(on_done)),
            )?;
            fs.sync().map_err(|error| format!("final sync: {error}"))
        });
        match result {
            Ok(()) => device.mark(COMPLETE_MARK.to_string()),
            Err(error) => {
                lane.fatal.get_or_insert(format!("import: {error}"));
            }
        }
    }

    /// Check a recovered tree; `marks` are the workload marks a crash
    /// state's acknowledgements cover (those before its closing flush).
    pub fn check(&self, tree: &dyn TreeSource, marks: &[&str]) -> Result<(), String> {
        let trees = self.trees()?;
        let actual = read_subtree(tree, &format!("/{IMPORT_DIR}"), "", &[])?;
        if marks.contains(&COMPLETE_MARK) {
            return trees.same_as_latest(&actual);
        }
        trees.plausible(&actual)?;
        let synced = marks
            .iter()
            .filter_map(|mark| mark.strip_prefix(SYNCED_MARK))
            .filter_map(|count| count.trim().parse::<usize>().ok())
            .max()
            .unwrap_or(0);
        let done = self.done.lock().unwrap();
        for path in done.iter().take(synced) {
            trees.durable(&actual, path)?;
        }
        Ok(())
    }

    /// Copy the tree again onto a recovered image and check that the copy
    /// completed it.
    pub fn resume(&self, fs: &Arc<Fs>) -> Result<(), String> {
        let trees = self.trees()?;
        copy(Arc::clone(fs), &trees.latest_dir, 2, None).map_err(|e| format!("resuming: {e}"))?;
        fs.sync()
            .map_err(|error| format!("resuming: sync: {error}"))?;
        let actual = read_subtree(&FsSource(fs), &format!("/{IMPORT_DIR}"), "", &[])?;
        trees
            .same_as_latest(&actual)
            .map_err(|error| format!("after copying again: {error}"))
    }
}

/// `cp -a SOURCE/. IMAGE:/import` through the library; anything skipped
/// or not kept is a failure here (the host tree is ours and readable).
fn copy(
    fs: Arc<Fs>,
    source: &Path,
    threads: usize,
    verbose: Option<crate::tools::Verbose>,
) -> Result<(), String> {
    let image = Image::from_fs(fs, Caller::ROOT);
    let options = CopyOptions {
        threads,
        ..CopyOptions::default()
    };
    let progress = Progress {
        verbose,
        ..Progress::default()
    };
    let dest = format!("/{IMPORT_DIR}");
    let report = copy_in(&image, source, &dest, &options, &progress).map_err(|e| e.to_string())?;
    if let Some(skipped) = report.skipped.first() {
        return Err(format!("skipped: {skipped}"));
    }
    if let Some(what) = report.not_kept.first() {
        return Err(format!("not kept: {what}"));
    }
    Ok(())
}

/// An image path as the copy reports it, relative to `/import`.
fn relative(dest: &str) -> &str {
    let inside = dest.trim_start_matches('/');
    let inside = inside.strip_prefix(IMPORT_DIR).unwrap_or(inside);
    inside.trim_start_matches('/')
}

/// What `path` is in a snapshot: its entry's inode version and inode.
fn node<'s>(snapshot: &'s Snapshot, path: &str) -> Option<(&'s InodeVersion, u32)> {
    let entry = snapshot.entries.get(path)?;
    Some((snapshot.inodes.get(&entry.ino)?, entry.ino))
}

impl Trees {
    fn build(plan: Plan, seed: u64) -> Result<Trees, String> {
        let scratch = Scratch::new()?;
        let shape = shape(seed);
        let latest_dir = scratch.path("latest");
        let version = match plan {
            Plan::Fresh { .. } => 1,
            Plan::Again => 2,
        };
        make_tree(&latest_dir, &shape, seed, version).map_err(|e| e.to_string())?;
        let latest = read_subtree(&StdSource(&latest_dir), "/", "", &[])?;
        let (older_dir, older) = match plan {
            Plan::Fresh { .. } => (None, None),
            Plan::Again => {
                let dir = scratch.path("older");
                make_tree(&dir, &shape, seed, 1).map_err(|e| e.to_string())?;
                let snapshot = read_subtree(&StdSource(&dir), "/", "", &[])?;
                (Some(dir), Some(snapshot))
            }
        };
        Ok(Trees {
            _scratch: scratch,
            latest_dir,
            latest,
            older_dir,
            older,
        })
    }

    /// The versions `path` may show: the latest, then the older.
    fn versions(&self, path: &str) -> Vec<(&InodeVersion, u32)> {
        let older = self.older.as_ref().and_then(|older| node(older, path));
        node(&self.latest, path).into_iter().chain(older).collect()
    }

    /// Every entry is a state some moment of the copy leaves.
    fn plausible(&self, actual: &Snapshot) -> Result<(), String> {
        // Image inode -> the source inode of each of its names.
        let mut sources: HashMap<u32, HashSet<u32>> = HashMap::new();
        let mut names: HashMap<u32, u32> = HashMap::new();
        for (path, entry) in &actual.entries {
            let shown = &actual.inodes[&entry.ino];
            let versions = self.versions(path);
            if versions.is_empty() {
                return Err(format!("/{IMPORT_DIR}/{path}: not in the source"));
            }
            if let Some(what) = not_allowed(path, &versions, shown) {
                return Err(format!(
                    "/{IMPORT_DIR}/{path}: {} ({what}) matches no moment of the copy of {}",
                    describe(shown),
                    describe(versions[0].0)
                ));
            }
            sources.entry(entry.ino).or_default().insert(versions[0].1);
            *names.entry(entry.ino).or_default() += 1;
        }
        for (ino, source) in &sources {
            let shown = &actual.inodes[ino].meta;
            if source.len() > 1 {
                return Err(format!(
                    "image inode {ino} has names of {} different source inodes",
                    source.len()
                ));
            }
            if shown.kind != FileKind::Directory && shown.nlink != names[ino] {
                return Err(format!(
                    "image inode {ino}: {} links, {} names",
                    shown.nlink, names[ino]
                ));
            }
        }
        Ok(())
    }

    /// An entry reported done before an acknowledged sync: there, with
    /// its kind and all its bytes.
    fn durable(&self, actual: &Snapshot, path: &str) -> Result<(), String> {
        let (want, _) = node(&self.latest, path)
            .ok_or_else(|| format!("the copy reported {path}, which the source lacks"))?;
        let Some((shown, _)) = node(actual, path) else {
            return Err(format!(
                "/{IMPORT_DIR}/{path}: gone, though done before an acknowledged sync"
            ));
        };
        let whole = shown.meta.kind == want.meta.kind
            && shown.meta.target == want.meta.target
            && shown.content.bytes() == want.content.bytes();
        if !whole {
            return Err(format!(
                "/{IMPORT_DIR}/{path}: {} after an acknowledged sync, want {}",
                describe(shown),
                describe(want)
            ));
        }
        Ok(())
    }

    /// The tree is the latest source's: names, kinds, modes, link counts,
    /// bytes, targets, xattrs, and the same hard-link groups.
    fn same_as_latest(&self, actual: &Snapshot) -> Result<(), String> {
        let wanted: Vec<&String> = self.latest.entries.keys().collect();
        let shown: Vec<&String> = actual.entries.keys().collect();
        if wanted != shown {
            let missing: Vec<_> = wanted.iter().filter(|p| !shown.contains(p)).collect();
            let extra: Vec<_> = shown.iter().filter(|p| !wanted.contains(p)).collect();
            return Err(format!(
                "the tree differs from the source: missing {missing:?}, extra {extra:?}"
            ));
        }
        let mut inode_pairs = BTreeMap::new();
        for (path, entry) in &self.latest.entries {
            let (want, _) = node(&self.latest, path).expect("read from the host");
            let (got, ino) = node(actual, path).expect("the same names");
            if want.meta != got.meta || want.content.bytes() != got.content.bytes() {
                return Err(format!(
                    "/{IMPORT_DIR}/{path}: {}, want {}",
                    describe(got),
                    describe(want)
                ));
            }
            if let Some(other) = inode_pairs.insert(entry.ino, ino)
                && other != ino
            {
                return Err(format!("/{IMPORT_DIR}/{path}: hard link split"));
            }
        }
        Ok(())
    }
}

/// Why `shown` is no state some moment of the copy leaves at `path`,
/// given the versions it copies (the latest first, then the one it
/// overwrites): a prefix of the latest bytes or the older bytes whole,
/// a target, a mode and xattrs of either. None when it is one.
fn not_allowed(
    path: &str,
    versions: &[(&InodeVersion, u32)],
    shown: &InodeVersion,
) -> Option<&'static str> {
    let got = &shown.meta;
    let any = |test: &dyn Fn(&InodeMeta) -> bool| versions.iter().any(|(v, _)| test(&v.meta));
    let kind_ok = any(&|meta| meta.kind == got.kind);
    let target_ok = any(&|meta| meta.target == got.target);
    // The setup made the destination directory 0755.
    let perm_ok =
        any(&|meta| perm_allowed(meta, got.perm)) || (path.is_empty() && got.perm == 0o755);
    let xattrs_ok = got
        .xattrs
        .iter()
        .all(|pair| any(&|meta| meta.xattrs.contains(pair)));
    let bytes = shown.content.bytes();
    let latest = versions[0].0.content.bytes();
    let data_ok = latest.starts_with(&bytes)
        || versions
            .get(1)
            .is_some_and(|(older, _)| older.content.bytes() == bytes);
    [
        (kind_ok, "kind"),
        (target_ok, "symlink target"),
        (perm_ok, "mode"),
        (xattrs_ok, "xattrs"),
        (data_ok, "bytes"),
    ]
    .into_iter()
    .find_map(|(ok, what)| (!ok).then_some(what))
}

/// A directory is made writable by its owner until its own mode is set
/// at the end, and inherits a set-group-id parent's bit meanwhile.
fn perm_allowed(source: &InodeMeta, perm: u16) -> bool {
    perm == source.perm
        || (source.kind == FileKind::Directory
            && (perm == source.perm | 0o700 || perm == source.perm | 0o2700))
}

fn describe(version: &InodeVersion) -> String {
    let meta = &version.meta;
    format!(
        "{:?} mode {:o}, {} links, {} bytes, {} xattrs",
        meta.kind,
        meta.perm,
        meta.nlink,
        meta.size,
        meta.xattrs.len()
    )
}

/// One entry of the source tree, the same in both versions.
enum Node {
    Dir(String),
    File(String),
    /// A file holed at the start and the end.
    Sparse(String),
    Symlink(String),
    Fifo(String),
    /// Names of one inode (the first is created, the others linked).
    Links(Vec<String>),
}

/// The tree's entries: directories three deep, files from empty to
/// 1.3 MiB (more than one copy buffer), holes, fast and slow symlinks, a
/// FIFO and a hard-link group across directories.
fn shape(seed: u64) -> Vec<Node> {
    let mut rng = Rng::derive(seed, "import shape");
    let dirs = ["src", "src/net", "src/net/drivers", "doc", "data", "empty"];
    let mut nodes: Vec<Node> = dirs.iter().map(|dir| Node::Dir(dir.to_string())).collect();
    for dir in &dirs[..5] {
        for file in 0..rng.range(3, 7) {
            nodes.push(Node::File(format!("{dir}/file{file}")));
        }
        nodes.push(Node::Symlink(format!("{dir}/link")));
    }
    nodes.push(Node::Sparse("data/sparse".into()));
    nodes.push(Node::Fifo("src/fifo".into()));
    nodes.push(Node::Links(vec![
        "src/shared".into(),
        "doc/shared".into(),
        "src/net/drivers/shared".into(),
    ]));
    nodes
}

/// Build version `version` of the tree: the same names, other bytes,
/// sizes, targets, xattr values and some modes.
fn make_tree(root: &Path, shape: &[Node], seed: u64, version: u32) -> std::io::Result<()> {
    let mut rng = Rng::derive(seed, &format!("import version {version}"));
    let mut large = 0;
    std::fs::create_dir_all(root)?;
    std::fs::set_permissions(root, PermissionsExt::from_mode(0o755))?;
    for node in shape {
        match node {
            Node::Dir(path) => {
                let full = root.join(path);
                std::fs::create_dir_all(&full)?;
                let mode = *rng.pick(&[0o755, 0o750, 0o1777, 0o2755]);
                std::fs::set_permissions(&full, PermissionsExt::from_mode(mode))?;
            }
            Node::File(path) => make_file(root, path, seed, &mut rng, &mut large)?,
            Node::Sparse(path) => {
                let file = std::fs::File::create(root.join(path))?;
                file.set_len(rng.range(600_000, 1_000_000))?;
                let len = rng.range(1, 9000) as usize;
                file.write_all_at(&rng.bytes(len), 300_000)?;
            }
            Node::Symlink(path) => {
                let target = match rng.chance(1, 2) {
                    true => format!("file{}", rng.below(3)),
                    // Longer than the 60 bytes an inode holds.
                    false => format!(
                        "{}{}",
                        "../".repeat(12),
                        "t".repeat(rng.range(40, 90) as usize)
                    ),
                };
                std::os::unix::fs::symlink(target, root.join(path))?;
            }
            Node::Fifo(path) => {
                crate::tools::host::mknod(&root.join(path), libc::S_IFIFO | 0o640, 0)?
            }
            Node::Links(paths) => {
                let first = root.join(&paths[0]);
                make_file(root, &paths[0], seed, &mut rng, &mut large)?;
                for path in &paths[1..] {
                    std::fs::hard_link(&first, root.join(path))?;
                }
            }
        }
    }
    Ok(())
}

/// A file of random bytes with a mode and (sometimes) xattrs, one of
/// them too large for the inode. Which xattrs a file has is the same in
/// both versions (copying over a file keeps xattrs the source lacks, as
/// `cp -a` does); their values are not.
fn make_file(
    root: &Path,
    name: &str,
    seed: u64,
    rng: &mut Rng,
    large: &mut usize,
) -> std::io::Result<()> {
    let path = &root.join(name);
    let mut has = Rng::derive(seed, &format!("import xattrs of {name}"));
    let size = match rng.below(6) {
        0 => 0,
        1 | 2 => rng.range(1, 5_000),
        3 | 4 => rng.range(5_000, 40_000),
        _ if *large < LARGE_FILES_MAX => {
            *large += 1;
            rng.range(1_050_000, 1_300_000)
        }
        _ => rng.range(40_000, 100_000),
    };
    std::fs::write(path, rng.bytes(size as usize))?;
    let mode = *rng.pick(&[0o644, 0o755, 0o600, 0o4755, 0o640]);
    std::fs::set_permissions(path, PermissionsExt::from_mode(mode))?;
    // "user.big" fits a 1 KiB xattr block, not the inode.
    let xattrs = [("user.origin", 40), ("user.big", 700)];
    for (name, len) in xattrs {
        if has.chance(1, 3) {
            let len = rng.range(1, len) as usize;
            let value = rng.bytes(len);
            crate::tools::host::set_xattr(path, name.as_bytes(), &value)?;
        }
    }
    Ok(())
}
