//! The durability and atomicity oracle: does a recovered tree agree with
//! the model, given where the crash happened?
//!
//! For each lane, the crash state fixes a window of operations `low..=high`:
//! - `high`: the last op whose begin mark precedes the last entry the state
//!   includes (a later op has no write on this disk);
//! - `low`: the largest lower bound among the acknowledgements marked
//!   before the epoch's closing flush (`model` explains the bounds).
//!
//! Namespace and metadata (prefix check). jext4 has one journal: operations
//! of a lane commit in order, each in one transaction (the workloads keep
//! writes below the chunk size that would split one). So the recovered
//! lane must be exactly the model's tree after some op m in the window:
//! every name pointing at the same inode with the same kind, every inode
//! with the same size, permissions, link count, xattrs and symlink target.
//! This is stronger than POSIX and covers the checks: a rename
//! shows the old or the new name, never both or neither (no tree in the
//! model has both or neither), and whatever an acknowledgement made durable
//! is present with its name (m ≥ low). A per-directory transaction scope
//! would have to weaken this to a prefix per directory.
//!
//! File data (per sector). Data is written in place, outside the journal,
//! so versions may mix at sector granularity (torn or reordered writes of
//! an overwrite). Every 512-byte sector of every file must equal the same
//! sector of some version of that inode from the last durable one (its
//! fsync, fdatasync or sync) to `high`; bytes past a version's end count as
//! zeros. Free space is filled with a stale pattern before the run, so a
//! file showing a block its metadata points at before the data reached it
//! (data=ordered broken) or another file's old bytes matches no version.

use super::model::{
    AckScope, Durable, Entry, InodeMeta, InodeVersion, LaneModel, SECTOR_SIZE, Snapshot, parent_of,
};
use super::states::CrashState;
use crate::dev::Record;
use std::collections::HashMap;
use std::fmt::Write;

/// The 16-byte unit that fills every free sector of a crash-test image.
pub const STALE_PATTERN: &[u8; 16] = b"jext4 stale data";

/// Mismatches listed in one failure report.
const MISMATCHES_SHOWN: usize = 6;

/// Parse a workload mark: `op <lane> <op> begin|ack`.
pub fn parse_mark(text: &str) -> Option<(u32, u32, bool)> {
    let mut words = text.split_whitespace();
    if words.next()? != "op" {
        return None;
    }
    let lane = words.next()?.parse().ok()?;
    let op = words.next()?.parse().ok()?;
    let ack = match words.next()? {
        "begin" => false,
        "ack" => true,
        _ => return None,
    };
    Some((lane, op, ack))
}

pub fn begin_mark(lane: u32, op: u32) -> String {
    format!("op {lane} {op} begin")
}

pub fn ack_mark(lane: u32, op: u32) -> String {
    format!("op {lane} {op} ack")
}

/// The workload marks of a log, by position.
pub struct Marks {
    /// (log index, lane, op, is an acknowledgement)
    events: Vec<(usize, u32, u32, bool)>,
}

impl Marks {
    pub fn new(log: &[Record]) -> Self {
        let events = log
            .iter()
            .enumerate()
            .filter_map(|(index, record)| match record {
                Record::Mark(text) => {
                    parse_mark(text).map(|(lane, op, ack)| (index, lane, op, ack))
                }
                _ => None,
            })
            .collect();
        Marks { events }
    }

    /// The window of `lane` for a crash in `state`.
    pub fn window(&self, lane: &LaneModel, state: &CrashState) -> Window {
        let mut window = Window::default();
        for &(index, mark_lane, op, ack) in &self.events {
            if mark_lane != lane.lane {
                continue;
            }
            if !ack && index < state.begun_before {
                window.high = window.high.max(op);
            }
            if ack && index < state.acked_before {
                let Some(acknowledged) = lane.acks.get(&op) else {
                    continue;
                };
                // An op acknowledged has begun, even when its begin mark
                // comes after the state's last write: an fsync whose
                // changes an earlier flush had already made durable
                // returns with no write and no flush of its own, inside
                // the epoch (its effects are in the disk the state starts
                // from).
                window.high = window.high.max(op);
                let bound = acknowledged.namespace_bound;
                window.low = window.low.max(bound);
                match &acknowledged.scope {
                    AckScope::Everything => window.all_low = window.all_low.max(bound),
                    AckScope::Dirs(dirs) => {
                        for dir in dirs {
                            let low = window.dir_low.entry(dir.clone()).or_default();
                            *low = (*low).max(bound);
                        }
                    }
                }
                if let Some(ino) = acknowledged.inode {
                    let low = window.inode_low.entry(ino).or_default();
                    *low = (*low).max(bound);
                }
                match acknowledged.data {
                    Durable::Everything => window.data_all = window.data_all.max(op),
                    Durable::Inode(ino) => {
                        let bound = window.data.entry(ino).or_default();
                        *bound = (*bound).max(op);
                    }
                    Durable::Nothing => {}
                }
                window.acked.push(op);
            }
        }
        window
    }
}

/// Which of a lane's ops a crash state must reflect.
#[derive(Debug, Clone, Default)]
pub struct Window {
    pub low: u32,
    pub high: u32,
    /// Per-directory transactions: the op up to which every directory's
    /// ops are durable (a sync), and per directory (relative path) and per
    /// inode the op up to which theirs are.
    pub all_low: u32,
    pub dir_low: HashMap<String, u32>,
    pub inode_low: HashMap<u32, u32>,
    /// Per inode, the op whose version of the bytes is durable.
    pub data: HashMap<u32, u32>,
    /// Op as of which every inode's bytes are durable (a sync).
    pub data_all: u32,
    /// Acknowledged ops, for reports.
    pub acked: Vec<u32>,
    /// Delayed allocation: a file's size is as of its last write-out,
    /// which later metadata changes do not wait for (the kernel's
    /// i_disksize). Where the rest of a file matches the model as of op
    /// m, its size may then be one it had before m, back across data
    /// writes only (`LaneModel::lagging_sizes`); `check_data` also holds
    /// it to the versions from its durable one on.
    pub sizes_lag: bool,
    /// data=journal: a write's bytes are logged with its metadata, so a
    /// file is one of its versions whole (`check_data`), not a mix of
    /// them sector by sector.
    pub data_atomic: bool,
}

/// Whether recovered inode `ino`'s metadata is `expected`, the model's as
/// of op `at` — its size one of `lagging_sizes` where sizes lag.
fn meta_matches(
    (lane, window): (&LaneModel, &Window),
    (ino, at): (u32, u32),
    expected: Option<&InodeMeta>,
    actual: &InodeMeta,
) -> bool {
    match expected {
        Some(expected)
            if window.sizes_lag
                && actual.kind == crate::fs::FileKind::Regular
                && actual.size != expected.size =>
        {
            InodeMeta {
                size: actual.size,
                ..expected.clone()
            } == *actual
                && lane.lagging_sizes(ino, at).contains(&actual.size)
        }
        expected => expected == Some(actual),
    }
}

fn describe_entry(entry: Option<&Entry>) -> String {
    match entry {
        Some(entry) => format!("{:?} inode {}", entry.kind, entry.ino),
        None => "absent".into(),
    }
}

fn describe_meta(meta: Option<&InodeMeta>) -> String {
    match meta {
        Some(meta) => {
            let mut text = format!(
                "{:?} size {} mode {:o} links {}",
                meta.kind, meta.size, meta.perm, meta.nlink
            );
            for (name, value) in &meta.xattrs {
                let _ = write!(
                    text,
                    " {}=<{} bytes>",
                    String::from_utf8_lossy(name),
                    value.len()
                );
            }
            if !meta.target.is_empty() {
                let shown = &meta.target[..meta.target.len().min(24)];
                let _ = write!(text, " -> {:?}", String::from_utf8_lossy(shown));
            }
            text
        }
        None => "no such inode".into(),
    }
}

/// How the recovered namespace may relate to the model's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ordering {
    /// One journal: the lane's tree after one op of the window.
    Prefix,
    /// Per-directory transactions: each directory's entries after an op of
    /// its own window, ops across directories atomic (see
    /// `check_namespace_per_directory`).
    PerDirectory,
}

/// Check `actual` (the lane's recovered subtree) against the model.
pub fn check_lane(
    lane: &LaneModel,
    window: &Window,
    actual: &Snapshot,
    ordering: Ordering,
) -> Result<(), String> {
    if window.low > window.high {
        return Err(format!(
            "lane {}: acknowledged op {} is later than the last op begun ({}): the marks are wrong",
            lane.lane, window.low, window.high
        ));
    }
    match ordering {
        Ordering::Prefix => check_namespace(lane, window, actual)?,
        Ordering::PerDirectory => check_namespace_per_directory(lane, window, actual)?,
    }
    check_data(lane, window, actual)
}

/// Mismatch counts per op of the window (a difference array).
struct Tally {
    low: u32,
    diff: Vec<i64>,
}

impl Tally {
    fn new(low: u32, high: u32) -> Self {
        Tally {
            low,
            diff: vec![0; (high - low + 2) as usize],
        }
    }

    fn add(&mut self, from: u32, to: u32) {
        self.diff[(from - self.low) as usize] += 1;
        self.diff[(to - self.low + 1) as usize] -= 1;
    }

    /// The op with the fewest mismatches, and their number.
    fn best(&self) -> (u32, i64) {
        let mut running = 0;
        let mut best = (self.low, i64::MAX);
        for (offset, delta) in self.diff[..self.diff.len() - 1].iter().enumerate() {
            running += delta;
            // Ties go to the latest op: the likeliest crash point.
            if running <= best.1 {
                best = (self.low + offset as u32, running);
            }
        }
        best
    }
}

fn check_namespace(lane: &LaneModel, window: &Window, actual: &Snapshot) -> Result<(), String> {
    let (low, high) = (window.low, window.high);
    let mut tally = Tally::new(low, high);
    for (path, history) in lane.paths() {
        for (from, to, expected) in history.segments(low, high) {
            if expected != actual.entries.get(path) {
                tally.add(from, to);
            }
        }
    }
    for path in actual.entries.keys() {
        if lane.path(path).is_none() {
            tally.add(low, high);
        }
    }
    for (ino, version) in &actual.inodes {
        match lane.inode(*ino) {
            Some(history) => {
                for (from, to, expected) in history.segments(low, high) {
                    let meta = expected.map(|v| &v.meta);
                    if !meta_matches((lane, window), (*ino, from), meta, &version.meta) {
                        tally.add(from, to);
                    }
                }
            }
            None => tally.add(low, high),
        }
    }
    let (best, mismatches) = tally.best();
    if mismatches == 0 {
        return Ok(());
    }
    Err(explain_namespace(lane, window, actual, best))
}

/// Ops a directory's entries may be as of: a sorted set within the window.
type Cuts = std::collections::BTreeSet<u32>;

/// Nodes the search for per-directory cuts visits at most.
const CUT_SEARCH_BUDGET: usize = 100_000;

/// The per-directory check. With per-directory transactions each
/// directory commits its own operations in order, so the recovered tree
/// is no longer one op's tree: each directory d's entries must be the
/// model's after some op m_d of its own window (from the largest bound of
/// the acknowledgements covering d, or of a sync, to the last op begun),
/// every op that changed names in several directories (a rename, a link
/// across them) must be on the same side of every one of their cuts —
/// atomic —, and every inode's metadata must be one of its versions from
/// its own bound (fsync, fdatasync, sync) on. What a directory's cut says
/// of the others' is left to e2fsck (link counts).
fn check_namespace_per_directory(
    lane: &LaneModel,
    window: &Window,
    actual: &Snapshot,
) -> Result<(), String> {
    let high = window.high;
    let mut cuts: HashMap<String, Cuts> = HashMap::new();
    let low_of = |dir: &str| {
        window
            .all_low
            .max(window.dir_low.get(dir).copied().unwrap_or(0))
    };
    let mut restrict = |dir: &str, keep: &dyn Fn(u32) -> bool| {
        let set = cuts
            .entry(dir.to_string())
            .or_insert_with(|| (low_of(dir)..=high).collect());
        set.retain(|&op| keep(op));
    };
    for (path, history) in lane.paths() {
        let Some(dir) = parent_of(path) else {
            continue; // the lane's root: the same throughout
        };
        let found = actual.entries.get(path);
        restrict(dir, &|op| history.at(op) == found);
    }
    for path in actual.entries.keys() {
        if lane.path(path).is_none()
            && let Some(dir) = parent_of(path)
        {
            restrict(dir, &|_| false);
        }
    }
    for (dir, set) in &cuts {
        if set.is_empty() {
            return Err(explain_directory(lane, window, actual, dir, low_of(dir)));
        }
    }
    check_inodes(lane, window, actual)?;
    let spanning = lane.spanning_ops(window.all_low, high);
    let mut budget = CUT_SEARCH_BUDGET;
    if !solve_cuts(&mut cuts, &spanning, &mut budget) {
        let ops: Vec<String> = spanning
            .iter()
            .map(|(op, dirs)| format!("op {op} {} in {dirs:?}", lane.ops[*op as usize].what))
            .collect();
        return Err(format!(
            "lane {} ({}): each directory matches some op of its window, but no choice keeps \
             every operation across directories atomic ({}; acknowledged: {}): {}",
            lane.lane,
            lane.root,
            if budget == 0 {
                "search gave up"
            } else {
                "none exists"
            },
            describe_acks(lane, window),
            ops.join("; ")
        ));
    }
    Ok(())
}

/// Every recovered inode is one of its versions from its bound on.
fn check_inodes(lane: &LaneModel, window: &Window, actual: &Snapshot) -> Result<(), String> {
    for (ino, version) in &actual.inodes {
        let low = window
            .all_low
            .max(window.inode_low.get(ino).copied().unwrap_or(0));
        let matches = lane.inode(*ino).is_some_and(|history| {
            history
                .segments(low.min(window.high), window.high)
                .iter()
                .any(|(from, _, expected)| {
                    let meta = expected.map(|v| &v.meta);
                    meta_matches((lane, window), (*ino, *from), meta, &version.meta)
                })
        });
        if !matches {
            let expected = lane.inode(*ino).and_then(|history| history.at(window.high));
            return Err(format!(
                "lane {} ({}): inode {ino} is none of its versions of ops {low}..={} \
                 (acknowledged: {}): latest {}, found {}",
                lane.lane,
                lane.root,
                window.high,
                describe_acks(lane, window),
                describe_meta(expected.map(|v| &v.meta)),
                describe_meta(Some(&version.meta))
            ));
        }
    }
    Ok(())
}

/// Choose, for each directory, a cut among `cuts` so that every op of
/// `spanning` is before all of its directories' cuts or after all of them:
/// propagation, then a bounded search over the ops left open.
fn solve_cuts(
    cuts: &mut HashMap<String, Cuts>,
    spanning: &[(u32, Vec<String>)],
    budget: &mut usize,
) -> bool {
    if *budget == 0 {
        return false;
    }
    *budget -= 1;
    // Each round decides at least one op or stops.
    loop {
        let mut open = None;
        let mut changed = false;
        for (op, dirs) in spanning {
            let sets: Vec<&Cuts> = dirs.iter().filter_map(|dir| cuts.get(dir)).collect();
            let before = sets.iter().all(|set| set.iter().any(|&cut| cut < *op));
            let after = sets.iter().all(|set| set.iter().any(|&cut| cut >= *op));
            match (before, after) {
                (false, false) => return false,
                (true, true) => {
                    open.get_or_insert((*op, dirs));
                }
                (before, _) => {
                    for dir in dirs {
                        if let Some(set) = cuts.get_mut(dir) {
                            let size = set.len();
                            set.retain(|&cut| (cut < *op) == before);
                            changed |= set.len() != size;
                        }
                    }
                }
            }
        }
        if changed {
            continue;
        }
        let Some((op, dirs)) = open else {
            return true;
        };
        for before in [false, true] {
            let mut trial = cuts.clone();
            for dir in dirs {
                if let Some(set) = trial.get_mut(dir) {
                    set.retain(|&cut| (cut < op) == before);
                }
            }
            if trial.values().all(|set| !set.is_empty()) && solve_cuts(&mut trial, spanning, budget)
            {
                *cuts = trial;
                return true;
            }
        }
        return false;
    }
}

/// Why directory `dir`'s entries match no op of its window.
fn explain_directory(
    lane: &LaneModel,
    window: &Window,
    actual: &Snapshot,
    dir: &str,
    low: u32,
) -> String {
    let in_dir = |path: &str| parent_of(path) == Some(dir);
    let mut lines = Vec::new();
    for (path, history) in lane.paths().filter(|(path, _)| in_dir(path)) {
        let expected = history.at(window.high);
        if expected != actual.entries.get(path) {
            lines.push(format!(
                "  /{path}: after op {} {}, found {}",
                window.high,
                describe_entry(expected),
                describe_entry(actual.entries.get(path))
            ));
        }
    }
    for (path, entry) in actual.entries.iter().filter(|(path, _)| in_dir(path)) {
        if lane.path(path).is_none() {
            lines.push(format!(
                "  /{path}: never existed, found {}",
                describe_entry(Some(entry))
            ));
        }
    }
    lines.truncate(MISMATCHES_SHOWN);
    format!(
        "lane {} ({}): directory /{dir} is no state of ops {low}..={} (acknowledged: {}):\n{}",
        lane.lane,
        lane.root,
        window.high,
        describe_acks(lane, window),
        lines.join("\n")
    )
}

/// Why the recovered tree is not the model's tree after op `best` (the
/// closest one in the window).
fn explain_namespace(lane: &LaneModel, window: &Window, actual: &Snapshot, best: u32) -> String {
    let mut lines = Vec::new();
    for (path, history) in lane.paths() {
        let expected = history.at(best);
        if expected != actual.entries.get(path) {
            lines.push(format!(
                "  /{path}: expected {}, found {}",
                describe_entry(expected),
                describe_entry(actual.entries.get(path))
            ));
        }
    }
    for (path, entry) in &actual.entries {
        if lane.path(path).is_none() {
            lines.push(format!(
                "  /{path}: never existed, found {}",
                describe_entry(Some(entry))
            ));
        }
    }
    for (ino, version) in &actual.inodes {
        let expected = lane.inode(*ino).and_then(|history| history.at(best));
        if !meta_matches(
            (lane, window),
            (*ino, best),
            expected.map(|v| &v.meta),
            &version.meta,
        ) {
            lines.push(format!(
                "  inode {ino}: expected {}, found {}",
                describe_meta(expected.map(|v| &v.meta)),
                describe_meta(Some(&version.meta))
            ));
        }
    }
    let total = lines.len();
    lines.truncate(MISMATCHES_SHOWN);
    let mut message = format!(
        "lane {} ({}): the recovered tree is no tree of ops {}..={} (acknowledged: {}); \
         closest is after op {best} ({}), {total} differences:\n{}",
        lane.lane,
        lane.root,
        window.low,
        window.high,
        describe_acks(lane, window),
        lane.ops[best as usize].what,
        lines.join("\n")
    );
    if total > MISMATCHES_SHOWN {
        let _ = write!(message, "\n  …");
    }
    message
}

fn describe_acks(lane: &LaneModel, window: &Window) -> String {
    let last: Vec<String> = window
        .acked
        .iter()
        .rev()
        .take(3)
        .map(|op| format!("op {op} {}", lane.ops[*op as usize].what))
        .collect();
    if last.is_empty() {
        "none".into()
    } else {
        last.join(", ")
    }
}

fn check_data(lane: &LaneModel, window: &Window, actual: &Snapshot) -> Result<(), String> {
    for (ino, version) in &actual.inodes {
        if version.meta.kind != crate::fs::FileKind::Regular {
            continue;
        }
        let Some(history) = lane.inode(*ino) else {
            continue; // reported by the namespace check
        };
        let floor = window
            .data
            .get(ino)
            .copied()
            .unwrap_or(0)
            .max(window.data_all);
        let mut candidates: Vec<_> = history.at(floor).into_iter().collect();
        candidates.extend(
            history
                .changes_from(floor + 1)
                .filter(|(op, _)| *op <= window.high)
                .filter_map(|(_, value)| value),
        );
        if window.sizes_lag
            && !candidates
                .iter()
                .any(|candidate| candidate.meta.size == version.meta.size)
        {
            let path = path_of(actual, *ino);
            return Err(format!(
                "lane {}: /{path} (inode {ino}) has size {}, which no version of the file \
                 from op {floor} to op {} has ({} versions)",
                lane.lane,
                version.meta.size,
                window.high,
                candidates.len()
            ));
        }
        let bytes = version.content.bytes();
        let sector_matches = |candidate: &InodeVersion, index: usize, sector: &[u8]| match candidate
            .content
            .sector(index as u64)
        {
            Some(expected) => expected[..sector.len()] == *sector,
            None => sector.iter().all(|&byte| byte == 0),
        };
        if window.data_atomic {
            let whole = candidates.iter().any(|candidate| {
                bytes
                    .chunks(SECTOR_SIZE)
                    .enumerate()
                    .all(|(index, sector)| sector_matches(candidate, index, sector))
            });
            if !whole {
                let path = path_of(actual, *ino);
                return Err(format!(
                    "lane {}: /{path} (inode {ino}) is none of its versions from op {floor} to \
                     op {} whole ({} versions): data=journal mixed an overwrite's old and new \
                     blocks",
                    lane.lane,
                    window.high,
                    candidates.len()
                ));
            }
        }
        for (index, sector) in bytes.chunks(SECTOR_SIZE).enumerate() {
            let matches = candidates
                .iter()
                .any(|candidate| sector_matches(candidate, index, sector));
            if !matches {
                let path = path_of(actual, *ino);
                return Err(format!(
                    "lane {}: /{path} (inode {ino}) bytes {}..{} match no version of the file \
                     from op {floor} to op {} ({} versions): {}",
                    lane.lane,
                    index * SECTOR_SIZE,
                    index * SECTOR_SIZE + sector.len(),
                    window.high,
                    candidates.len(),
                    classify(sector)
                ));
            }
        }
    }
    Ok(())
}

fn path_of(snapshot: &Snapshot, ino: u32) -> String {
    snapshot
        .entries
        .iter()
        .find(|(_, entry)| entry.ino == ino)
        .map_or_else(|| "?".into(), |(path, _)| path.clone())
}

/// What wrong bytes look like, for the report.
fn classify(sector: &[u8]) -> &'static str {
    if sector.iter().all(|&byte| byte == 0) {
        "zeros"
    } else if sector
        .windows(STALE_PATTERN.len())
        .any(|window| window == STALE_PATTERN)
    {
        "stale free-space bytes (data not written before the metadata that points at it)"
    } else {
        "other bytes (another file's data, or metadata)"
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crash::model::{Content, InodeVersion, Persist};
    use crate::fs::FileKind;

    fn snapshot(files: &[(&str, u32, &[u8])]) -> Snapshot {
        let mut snapshot = Snapshot::default();
        snapshot.entries.insert(
            String::new(),
            Entry {
                kind: FileKind::Directory,
                ino: 2,
            },
        );
        snapshot.inodes.insert(2, version(FileKind::Directory, b""));
        for (path, ino, bytes) in files {
            snapshot.entries.insert(
                path.to_string(),
                Entry {
                    kind: FileKind::Regular,
                    ino: *ino,
                },
            );
            snapshot
                .inodes
                .insert(*ino, version(FileKind::Regular, bytes));
        }
        snapshot
    }

    fn version(kind: FileKind, bytes: &[u8]) -> InodeVersion {
        InodeVersion {
            meta: InodeMeta {
                kind,
                size: if kind == FileKind::Regular {
                    bytes.len() as u64
                } else {
                    0
                },
                perm: 0o644,
                nlink: 1,
                xattrs: Vec::new(),
                target: Vec::new(),
            },
            content: Content::new(bytes, None),
        }
    }

    /// 1: create a; 2: write a; 3: fsync a; 4: rename a -> b.
    fn model() -> LaneModel {
        let mut lane = LaneModel::new(0, "/", Vec::new(), snapshot(&[]));
        let steps: Vec<(&str, Snapshot)> = vec![
            ("create a", snapshot(&[("a", 12, b"")])),
            ("write a", snapshot(&[("a", 12, &[7u8; 1000])])),
            ("fsync a", snapshot(&[("a", 12, &[7u8; 1000])])),
            ("rename a b", snapshot(&[("b", 12, &[7u8; 1000])])),
        ];
        for (what, tree) in steps {
            let op = lane.begin(what.into());
            lane.finish(op, vec![(String::new(), tree)]);
            if what == "fsync a" {
                lane.acknowledge(op, Persist::Fsync(12));
            }
        }
        lane
    }

    fn window(low: u32, high: u32, data: &[(u32, u32)]) -> Window {
        Window {
            low,
            high,
            data: data.iter().copied().collect(),
            ..Window::default()
        }
    }

    #[test]
    fn accepts_any_tree_of_the_window() {
        let lane = model();
        let before = snapshot(&[]);
        assert!(check_lane(&lane, &window(0, 4, &[]), &before, Ordering::Prefix).is_ok());
        let renamed = snapshot(&[("b", 12, &[7u8; 1000])]);
        assert!(check_lane(&lane, &window(2, 4, &[(12, 3)]), &renamed, Ordering::Prefix).is_ok());
    }

    /// Delayed allocation: the rename committed, the write's size not
    /// yet (the file was not written out). Only where sizes lag, only
    /// back across data writes — never across a truncate — and never
    /// below an fsync.
    #[test]
    fn a_size_lags_only_across_data_writes_and_never_below_an_fsync() {
        let mut lane = LaneModel::new(0, "/", Vec::new(), snapshot(&[]));
        let grown: Vec<u8> = [[7u8; 500].as_slice(), &[9u8; 300]].concat();
        let steps: Vec<(&str, Snapshot)> = vec![
            ("create a", snapshot(&[("a", 12, b"")])),
            ("write a", snapshot(&[("a", 12, &[7u8; 1000])])),
            ("write a", snapshot(&[("a", 12, &[7u8; 2000])])),
            ("truncate a", snapshot(&[("a", 12, &[7u8; 500])])),
            ("write a", snapshot(&[("a", 12, &grown)])),
            ("rename a b", snapshot(&[("b", 12, &grown)])),
        ];
        for (what, tree) in steps {
            let op = lane.begin(what.into());
            if what == "write a" {
                lane.mark_data_write(op);
            }
            lane.finish(op, vec![(String::new(), tree)]);
        }
        let lag = |window: Window| Window {
            sizes_lag: true,
            ..window
        };
        // Renamed, the last write not written out: 500 bytes.
        let lagging = snapshot(&[("b", 12, &[7u8; 500])]);
        assert!(check_lane(&lane, &window(0, 6, &[]), &lagging, Ordering::Prefix).is_err());
        assert!(check_lane(&lane, &lag(window(0, 6, &[])), &lagging, Ordering::Prefix).is_ok());
        // Not across the truncate: that is the truncate lost.
        let untruncated = snapshot(&[("b", 12, &[7u8; 2000])]);
        let error = check_lane(
            &lane,
            &lag(window(0, 6, &[])),
            &untruncated,
            Ordering::Prefix,
        );
        assert!(error.is_err(), "a lost truncate passed");
        // Not below what an fsync of the last write made durable.
        let error = check_lane(
            &lane,
            &lag(window(5, 6, &[(12, 5)])),
            &lagging,
            Ordering::Prefix,
        )
        .unwrap_err();
        assert!(error.contains("has size 500, which no version"), "{error}");
    }

    #[test]
    fn refuses_lost_acknowledged_work_and_torn_renames() {
        let lane = model();
        let lost = snapshot(&[]);
        let error =
            check_lane(&lane, &window(2, 4, &[(12, 3)]), &lost, Ordering::Prefix).unwrap_err();
        // Closest: before the rename (a missing) or after it (b missing).
        assert!(
            error.contains("expected Regular inode 12, found absent"),
            "{error}"
        );
        // Both names: no op of the model has both.
        let mut both = snapshot(&[("a", 12, &[7u8; 1000])]);
        both.entries.insert(
            "b".into(),
            Entry {
                kind: FileKind::Regular,
                ino: 12,
            },
        );
        assert!(check_lane(&lane, &window(0, 4, &[]), &both, Ordering::Prefix).is_err());
    }

    #[test]
    fn refuses_stale_and_old_bytes() {
        let lane = model();
        let mut stale = vec![7u8; 1000];
        stale[512..528].copy_from_slice(STALE_PATTERN);
        let error = check_lane(
            &lane,
            &window(2, 4, &[]),
            &snapshot(&[("a", 12, &stale)]),
            Ordering::Prefix,
        )
        .unwrap_err();
        assert!(error.contains("stale free-space bytes"), "{error}");
        // Zeros where the fsynced version had data: older than durable.
        let zeros = snapshot(&[("a", 12, &[0u8; 1000])]);
        assert!(check_lane(&lane, &window(2, 4, &[]), &zeros, Ordering::Prefix).is_ok());
        assert!(check_lane(&lane, &window(2, 4, &[(12, 3)]), &zeros, Ordering::Prefix).is_err());
    }

    /// 1: create d1/x; 2: create d2/y; 3: fsync d2/y; 4: rename d1/x d2/z.
    fn two_directories() -> LaneModel {
        let dirs = || {
            let mut tree = snapshot(&[]);
            for (path, ino) in [("d1", 20), ("d2", 21)] {
                tree.entries.insert(
                    path.into(),
                    Entry {
                        kind: FileKind::Directory,
                        ino,
                    },
                );
                tree.inodes.insert(ino, version(FileKind::Directory, b""));
            }
            tree
        };
        let mut lane = LaneModel::new(0, "/", Vec::new(), dirs());
        let with = |files: &[(&str, u32, &[u8])]| {
            let mut tree = dirs();
            let files = snapshot(files);
            tree.entries.extend(files.entries);
            tree.inodes.extend(files.inodes);
            tree
        };
        let steps: Vec<(&str, Snapshot)> = vec![
            ("create d1/x", with(&[("d1/x", 12, b"")])),
            ("create d2/y", with(&[("d1/x", 12, b""), ("d2/y", 13, b"")])),
            ("fsync d2/y", with(&[("d1/x", 12, b""), ("d2/y", 13, b"")])),
            (
                "rename d1/x d2/z",
                with(&[("d2/z", 12, b""), ("d2/y", 13, b"")]),
            ),
        ];
        for (what, tree) in steps {
            let op = lane.begin(what.into());
            lane.finish(op, vec![(String::new(), tree)]);
            if what.starts_with("fsync") {
                lane.acknowledge(op, Persist::Fsync(13));
            }
        }
        lane
    }

    fn recovered(files: &[(&str, u32)]) -> Snapshot {
        let lane = two_directories();
        let mut tree = snapshot(&[]);
        for (path, history) in lane.paths() {
            if let Some(entry) = history.at(0) {
                tree.entries.insert(path.clone(), entry.clone());
                let meta = lane.inode(entry.ino).unwrap().at(0).unwrap();
                tree.inodes.insert(entry.ino, (**meta).clone());
            }
        }
        for (path, ino) in files {
            tree.entries.insert(
                path.to_string(),
                Entry {
                    kind: FileKind::Regular,
                    ino: *ino,
                },
            );
            tree.inodes.insert(*ino, version(FileKind::Regular, b""));
        }
        tree
    }

    #[test]
    fn per_directory_allows_one_directory_ahead_of_another() {
        let lane = two_directories();
        let window = Marks::new(&[Record::Mark(ack_mark(0, 3))]).window(
            &lane,
            &CrashState {
                number: 0,
                epoch: 0,
                kind: crate::crash::states::StateKind::AtFlush,
                writes: Vec::new(),
                torn: None,
                begun_before: 0,
                acked_before: 1,
            },
        );
        let window = Window { high: 4, ..window };
        // d2/y fsynced, d1/x never was: lost, though created before.
        let tree = recovered(&[("d2/y", 13)]);
        assert!(check_lane(&lane, &window, &tree, Ordering::PerDirectory).is_ok());
        assert!(check_lane(&lane, &window, &tree, Ordering::Prefix).is_err());
        // The fsynced file is not optional.
        let tree = recovered(&[("d1/x", 12)]);
        let error = check_lane(&lane, &window, &tree, Ordering::PerDirectory).unwrap_err();
        assert!(error.contains("directory /d2"), "{error}");
        // The rename across d1 and d2: both sides or neither.
        let moved = recovered(&[("d2/z", 12), ("d2/y", 13)]);
        assert!(check_lane(&lane, &window, &moved, Ordering::PerDirectory).is_ok());
        let torn = recovered(&[("d1/x", 12), ("d2/z", 12), ("d2/y", 13)]);
        let error = check_lane(&lane, &window, &torn, Ordering::PerDirectory).unwrap_err();
        assert!(error.contains("atomic"), "{error}");
    }

    /// An fsync that began after the state's last write and returned
    /// before the epoch's flush (nothing of its own to write) is in the
    /// window: begun and acknowledged, not "later than the last op begun".
    #[test]
    fn an_op_acknowledged_without_a_write_counts_as_begun() {
        let lane = two_directories();
        let log = [Record::Mark(begin_mark(0, 3)), Record::Mark(ack_mark(0, 3))];
        let window = Marks::new(&log).window(
            &lane,
            &CrashState {
                number: 0,
                epoch: 0,
                kind: crate::crash::states::StateKind::AtFlush,
                writes: Vec::new(),
                torn: None,
                begun_before: 0,
                acked_before: 2,
            },
        );
        assert!(
            window.low <= window.high,
            "{} > {}",
            window.low,
            window.high
        );
        assert_eq!(window.high, 3);
    }

    #[test]
    fn marks_round_trip() {
        assert_eq!(parse_mark(&begin_mark(3, 17)), Some((3, 17, false)));
        assert_eq!(parse_mark(&ack_mark(0, 2)), Some((0, 2, true)));
        assert_eq!(parse_mark("op x 1 ack"), None);
        assert_eq!(parse_mark("jext4-crashtest start"), None);
    }
}
