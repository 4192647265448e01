//! What the next fast commit must record: the logical changes made since
//! the last fast or full commit, each tagged with its transaction (the
//! kernel's fast-commit queues, `ext4_fc_track_*`).
//!
//! The tracker is the journal's change observer (`journal::change`): every
//! handle reports its changes here, under the locks of the operation that
//! made them, and the commit thread reports every full commit. It keeps
//! - the inodes changed, each with the logical ranges whose mapping
//!   changed (physical blocks are looked up when the fast commit is
//!   written, as the kernel does);
//! - the name changes, in order: CREAT for the first name of an inode
//!   allocated since (replay builds the inode from its record first), LINK
//!   and UNLINK otherwise;
//! - whether something fast commits cannot express happened, and in which
//!   transaction: fast commits fall back to full commits until that
//!   transaction is committed in full. Each reason is counted.
//!
//! A fast commit takes everything queued (`take`) with the journal's
//! updates locked (no handle running: no operation is half-way), so it
//! records a consistent cut; what changes after waits for the next one. A full commit of transaction T drops what was
//! changed in T or before (`ChangeObserver::committed`): the log holds it.
//!
//! One queue for the whole filesystem today; per-directory transactions
//! (DESIGN §2, tier 3) will key the same entries by the directory that owns
//! them — a name change by its parent, an inode by the directory it was
//! last named in — and take one directory's entries at a time.
//!
//! Bounded: past `capacity_bytes` of estimated records (the area's size)
//! the tracker marks the transaction ineligible and forgets its entries:
//! they could not be written anyway.
//!
//! Lock: `state` is a leaf lock (taken under an operation's locks by
//! `changed`, under the journal state by `committed`).

use crate::format::fast_commit::RECORD_HEADER_SIZE;
use crate::format::superblock::Geometry;
use crate::journal::Journal;
use crate::journal::change::{Change, ChangeObserver, Ineligible};
use crate::journal::format::tid_gt;
use parking_lot::Mutex;
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

/// Record bytes an inode costs at most (INODE with a 256-byte inode).
const INODE_RECORD_BYTES: usize = RECORD_HEADER_SIZE + 4 + 256;
/// One range record.
const RANGE_RECORD_BYTES: usize = RECORD_HEADER_SIZE + 16;
/// A name record before its name.
const DENTRY_RECORD_BYTES: usize = RECORD_HEADER_SIZE + 8;

/// How a name changed (the record it becomes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum DentryOp {
    Create,
    Link,
    Unlink,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct DentryUpdate {
    pub op: DentryOp,
    pub parent: u32,
    pub ino: u32,
    pub name: Vec<u8>,
    tid: u32,
}

/// An inode changed since the last commit.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct PendingInode {
    /// Logical ranges `[start, end)` whose mapping changed, sorted, apart.
    pub ranges: Vec<(u64, u64)>,
    /// Data was written past its old size (`Change::Extended`).
    pub extended: bool,
    /// The newest transaction that changed it.
    tid: u32,
}

/// What one fast commit records.
#[derive(Debug, Default)]
pub(crate) struct Snapshot {
    pub inodes: BTreeMap<u32, PendingInode>,
    pub dentries: Vec<DentryUpdate>,
}

impl Snapshot {
    pub fn is_empty(&self) -> bool {
        self.inodes.is_empty() && self.dentries.is_empty()
    }
}

#[derive(Default)]
struct State {
    inodes: BTreeMap<u32, PendingInode>,
    dentries: Vec<DentryUpdate>,
    /// Inodes allocated and not named yet: their first LINK is a CREAT.
    unnamed: HashMap<u32, u32>,
    /// Fast commits cannot describe transactions up to this one.
    ineligible_until: Option<u32>,
    /// Estimated record bytes queued.
    bytes: usize,
}

/// Counters for `jext4 stats`.
#[derive(Debug, Default, Clone, Copy)]
pub struct FastCommitStats {
    /// fsyncs that wrote a fast commit.
    pub commits: u64,
    /// Record bytes written (HEAD, records, TAIL; not the padding).
    pub record_bytes: u64,
    /// Device flushes the fast commits issued.
    pub flushes: u64,
    /// fsyncs that needed a full commit instead.
    pub fallbacks: u64,
    /// Ineligible changes, per `Ineligible::ALL`.
    pub ineligible: [u64; Ineligible::ALL.len()],
}

pub(crate) struct Tracker {
    /// Inodes below this (but the root) are the filesystem's own (journal,
    /// resize, orphan file): never recorded, as in the kernel.
    first_ino: u32,
    capacity_bytes: usize,
    state: Mutex<State>,
    commits: AtomicU64,
    record_bytes: AtomicU64,
    flushes: AtomicU64,
    fallbacks: AtomicU64,
    ineligible: [AtomicU64; Ineligible::ALL.len()],
}

impl Tracker {
    /// A tracker for a mount whose journal writes fast commits, registered
    /// as the journal's change observer; None when it writes none.
    pub fn attach(geo: &Geometry, journal: &Journal) -> Option<Arc<Tracker>> {
        let (first, end) = journal.fast_commit_area()?;
        let capacity_bytes = (end - first) as usize * geo.block_size as usize;
        let tracker = Arc::new(Tracker::new(geo.first_ino, capacity_bytes));
        journal.set_change_observer(Arc::clone(&tracker) as Arc<dyn ChangeObserver>);
        Some(tracker)
    }

    pub fn new(first_ino: u32, capacity_bytes: usize) -> Tracker {
        Tracker {
            first_ino,
            capacity_bytes,
            state: Mutex::new(State::default()),
            commits: AtomicU64::new(0),
            record_bytes: AtomicU64::new(0),
            flushes: AtomicU64::new(0),
            fallbacks: AtomicU64::new(0),
            ineligible: std::array::from_fn(|_| AtomicU64::new(0)),
        }
    }

    /// Whether a fast commit may describe transaction `tid`: nothing
    /// ineligible happened in it. (A mark of an earlier transaction is
    /// cleared by that transaction's full commit, which every fast commit
    /// waits for.)
    pub fn eligible(&self, tid: u32) -> bool {
        self.state
            .lock()
            .ineligible_until
            .is_none_or(|until| tid_gt(tid, until))
    }

    /// Take everything queued for one fast commit of transaction `tid`.
    /// None when `tid` is ineligible (nothing is taken then).
    pub fn take(&self, tid: u32) -> Option<Snapshot> {
        let mut state = self.state.lock();
        if state
            .ineligible_until
            .is_some_and(|until| !tid_gt(tid, until))
        {
            return None;
        }
        debug_assert!(
            state.inodes.values().all(|inode| !tid_gt(inode.tid, tid)),
            "a change newer than the running transaction"
        );
        state.bytes = 0;
        Some(Snapshot {
            inodes: std::mem::take(&mut state.inodes),
            dentries: std::mem::take(&mut state.dentries),
        })
    }

    /// Fast commits cannot describe transaction `tid` (nor, until it is
    /// committed, any before it): forget its changes and count `reason`.
    pub fn mark_ineligible(&self, tid: u32, reason: Ineligible) {
        let mut state = self.state.lock();
        self.ineligible_locked(&mut state, tid, reason);
    }

    fn ineligible_locked(&self, state: &mut State, tid: u32, reason: Ineligible) {
        self.ineligible[reason.index()].fetch_add(1, Ordering::Relaxed);
        if state
            .ineligible_until
            .is_none_or(|until| tid_gt(tid, until))
        {
            state.ineligible_until = Some(tid);
        }
        // What is queued from `tid` or before: the full commit that clears
        // the mark will hold it. (A handle still in the transaction being
        // locked down may mark it after the next one's changes came.)
        state.inodes.retain(|_, inode| tid_gt(inode.tid, tid));
        state.dentries.retain(|dentry| tid_gt(dentry.tid, tid));
        state.bytes = estimate(state);
    }

    /// A fast commit was written.
    pub fn count_commit(&self, record_bytes: u64, flushes: u32) {
        self.commits.fetch_add(1, Ordering::Relaxed);
        self.record_bytes.fetch_add(record_bytes, Ordering::Relaxed);
        self.flushes.fetch_add(flushes as u64, Ordering::Relaxed);
    }

    /// An fsync needed a full commit.
    pub fn count_fallback(&self) {
        self.fallbacks.fetch_add(1, Ordering::Relaxed);
    }

    pub fn stats(&self) -> FastCommitStats {
        FastCommitStats {
            commits: self.commits.load(Ordering::Relaxed),
            record_bytes: self.record_bytes.load(Ordering::Relaxed),
            flushes: self.flushes.load(Ordering::Relaxed),
            fallbacks: self.fallbacks.load(Ordering::Relaxed),
            ineligible: std::array::from_fn(|index| self.ineligible[index].load(Ordering::Relaxed)),
        }
    }

    fn track(&self, state: &mut State, tid: u32, change: Change<'_>) {
        match change {
            Change::Inode { ino } => {
                if self.recorded(ino) {
                    self.pending(state, tid, ino);
                }
            }
            Change::Range { ino, start, end } => {
                if self.recorded(ino) {
                    let pending = self.pending(state, tid, ino);
                    let added = add_range(&mut pending.ranges, start, end);
                    state.bytes += added * RANGE_RECORD_BYTES;
                }
            }
            Change::Extended { ino } => {
                if self.recorded(ino) {
                    self.pending(state, tid, ino).extended = true;
                }
            }
            Change::InodeAllocated { ino } => {
                state.unnamed.insert(ino, tid);
            }
            Change::InodeFreed { ino } => self.forget_inode(state, ino),
            Change::Link {
                parent,
                ino,
                name,
                dir,
            } => {
                let created = state.unnamed.remove(&ino).is_some();
                let op = match (created, dir) {
                    (true, false) => DentryOp::Create,
                    (false, false) => DentryOp::Link,
                    (true, true) => {
                        return self.ineligible_locked(state, tid, Ineligible::DirectoryLinks);
                    }
                    // A directory that exists already gets a new name: a
                    // rename (set_parent reports a move across directories
                    // too).
                    (false, true) => {
                        return self.ineligible_locked(state, tid, Ineligible::RenameDir);
                    }
                };
                self.push_dentry(state, tid, op, parent, ino, name);
            }
            Change::Unlink {
                parent,
                ino,
                name,
                dir,
            } => {
                if dir {
                    return self.ineligible_locked(state, tid, Ineligible::DirectoryLinks);
                }
                self.push_dentry(state, tid, DentryOp::Unlink, parent, ino, name);
            }
            Change::Ineligible(reason) => self.ineligible_locked(state, tid, reason),
        }
    }

    /// The root and the filesystem's own inodes are never recorded (the
    /// root is a directory: replay rebuilds it from its names).
    fn recorded(&self, ino: u32) -> bool {
        ino >= self.first_ino
    }

    /// The queue entry of `ino`, created if needed. A change from a newer
    /// transaction forgets the older one's ranges: that transaction is
    /// committed in full before any fast commit of this one is written
    /// (the kernel's `ext4_fc_reset_inode`).
    fn pending<'s>(&self, state: &'s mut State, tid: u32, ino: u32) -> &'s mut PendingInode {
        let fresh = !state.inodes.contains_key(&ino);
        let pending = state.inodes.entry(ino).or_default();
        if fresh {
            state.bytes += INODE_RECORD_BYTES;
        } else if tid_gt(tid, pending.tid) {
            pending.ranges.clear();
            pending.extended = false;
        }
        pending.tid = tid;
        pending
    }

    fn push_dentry(
        &self,
        state: &mut State,
        tid: u32,
        op: DentryOp,
        parent: u32,
        ino: u32,
        name: &[u8],
    ) {
        state.bytes += DENTRY_RECORD_BYTES + name.len();
        if op == DentryOp::Create {
            // Its CREAT is written with the inode's record and ranges.
            state.bytes += INODE_RECORD_BYTES;
        }
        state.dentries.push(DentryUpdate {
            op,
            parent,
            ino,
            name: name.to_vec(),
            tid,
        });
    }

    /// The inode went back to the free pool: nothing about it is recorded
    /// but the name changes that led there (the kernel's `ext4_fc_del`). Its
    /// CREAT goes too — replay could not build it without its record — so
    /// the UNLINKs of those names find nothing and change nothing.
    fn forget_inode(&self, state: &mut State, ino: u32) {
        state.unnamed.remove(&ino);
        state.inodes.remove(&ino);
        state
            .dentries
            .retain(|dentry| !(dentry.ino == ino && dentry.op == DentryOp::Create));
    }
}

impl ChangeObserver for Tracker {
    fn changed(&self, tid: u32, change: Change<'_>) {
        let mut state = self.state.lock();
        if state
            .ineligible_until
            .is_some_and(|until| !tid_gt(tid, until))
            && !matches!(change, Change::Ineligible(_))
        {
            // The full commit that clears the mark will hold this change.
            return;
        }
        self.track(&mut state, tid, change);
        if state.bytes > self.capacity_bytes {
            self.ineligible_locked(&mut state, tid, Ineligible::AreaFull);
        }
    }

    fn committed(&self, tid: u32) {
        let mut state = self.state.lock();
        state.inodes.retain(|_, inode| tid_gt(inode.tid, tid));
        state.dentries.retain(|dentry| tid_gt(dentry.tid, tid));
        state
            .unnamed
            .retain(|_, allocated_in| tid_gt(*allocated_in, tid));
        if state
            .ineligible_until
            .is_some_and(|until| !tid_gt(until, tid))
        {
            state.ineligible_until = None;
        }
        state.bytes = estimate(&state);
    }
}

/// Estimated record bytes of what is queued.
fn estimate(state: &State) -> usize {
    let inodes: usize = state
        .inodes
        .values()
        .map(|inode| INODE_RECORD_BYTES + inode.ranges.len() * RANGE_RECORD_BYTES)
        .sum();
    let dentries: usize = state
        .dentries
        .iter()
        .map(|dentry| DENTRY_RECORD_BYTES + dentry.name.len())
        .sum();
    inodes + dentries
}

/// Merge `[start, end)` into sorted, disjoint `ranges`; returns how many
/// ranges were added (0 or 1).
fn add_range(ranges: &mut Vec<(u64, u64)>, start: u64, end: u64) -> usize {
    debug_assert!(start < end);
    let before = ranges.len();
    let mut merged = (start, end);
    // Ranges that touch or overlap the new one are folded into it.
    ranges.retain(|&(from, to)| {
        let apart = to < merged.0 || from > merged.1;
        if !apart {
            merged = (merged.0.min(from), merged.1.max(to));
        }
        apart
    });
    let at = ranges.partition_point(|&(from, _)| from < merged.0);
    ranges.insert(at, merged);
    debug_assert!(ranges.windows(2).all(|pair| pair[0].1 < pair[1].0));
    (ranges.len() > before) as usize
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tracker() -> Tracker {
        Tracker::new(11, 1 << 20)
    }

    fn unlink(parent: u32, ino: u32, name: &[u8]) -> Change<'_> {
        Change::Unlink {
            parent,
            ino,
            name,
            dir: false,
        }
    }

    fn link(parent: u32, ino: u32, name: &[u8]) -> Change<'_> {
        Change::Link {
            parent,
            ino,
            name,
            dir: false,
        }
    }

    #[test]
    fn ranges_merge_when_they_touch() {
        let mut ranges = Vec::new();
        assert_eq!(add_range(&mut ranges, 10, 20), 1);
        assert_eq!(add_range(&mut ranges, 30, 40), 1);
        assert_eq!(add_range(&mut ranges, 20, 25), 0);
        assert_eq!(ranges, vec![(10, 25), (30, 40)]);
        assert_eq!(add_range(&mut ranges, 0, 100), 0);
        assert_eq!(ranges, vec![(0, 100)]);
        assert_eq!(add_range(&mut ranges, 200, 201), 1);
        assert_eq!(ranges, vec![(0, 100), (200, 201)]);
    }

    #[test]
    fn the_first_name_of_a_new_inode_is_a_create() {
        let tracker = tracker();
        tracker.changed(5, Change::InodeAllocated { ino: 12 });
        tracker.changed(5, Change::Inode { ino: 12 });
        tracker.changed(5, link(2, 12, b"a"));
        tracker.changed(5, link(2, 12, b"b"));
        tracker.changed(5, unlink(2, 12, b"a"));
        let snapshot = tracker.take(5).unwrap();
        let ops: Vec<DentryOp> = snapshot.dentries.iter().map(|d| d.op).collect();
        assert_eq!(ops, [DentryOp::Create, DentryOp::Link, DentryOp::Unlink]);
        assert!(snapshot.inodes.contains_key(&12));
        assert!(tracker.take(5).unwrap().is_empty(), "taken once");
    }

    #[test]
    fn a_freed_inode_leaves_only_its_name_changes_without_create() {
        let tracker = tracker();
        tracker.changed(5, Change::InodeAllocated { ino: 12 });
        tracker.changed(5, link(2, 12, b"a"));
        tracker.changed(
            5,
            Change::Range {
                ino: 12,
                start: 0,
                end: 4,
            },
        );
        tracker.changed(5, unlink(2, 12, b"a"));
        tracker.changed(5, Change::InodeFreed { ino: 12 });
        let snapshot = tracker.take(5).unwrap();
        assert!(snapshot.inodes.is_empty());
        assert_eq!(snapshot.dentries.len(), 1);
        assert_eq!(snapshot.dentries[0].op, DentryOp::Unlink);
    }

    #[test]
    fn an_existing_directory_renamed_is_ineligible_until_committed() {
        let tracker = tracker();
        tracker.changed(7, Change::Inode { ino: 20 });
        tracker.changed(
            7,
            Change::Link {
                parent: 2,
                ino: 30,
                name: b"dir2",
                dir: true,
            },
        );
        assert!(!tracker.eligible(7));
        assert!(tracker.take(7).is_none());
        // Changes of the same transaction are not queued; the next one's are.
        tracker.changed(7, Change::Inode { ino: 21 });
        tracker.changed(8, Change::Inode { ino: 22 });
        // 8 is eligible (its fast commit waits for 7's full commit).
        assert!(tracker.eligible(8));
        // A late mark for 7 does not drop what 8 changed.
        tracker.changed(7, Change::Ineligible(Ineligible::Xattr));
        tracker.committed(7);
        assert!(tracker.eligible(8));
        let snapshot = tracker.take(8).unwrap();
        assert_eq!(snapshot.inodes.keys().copied().collect::<Vec<_>>(), [22]);
        assert_eq!(tracker.stats().ineligible[Ineligible::RenameDir.index()], 1);
    }

    #[test]
    fn a_full_commit_drops_what_it_holds() {
        let tracker = tracker();
        tracker.changed(3, Change::Inode { ino: 12 });
        tracker.changed(3, link(2, 13, b"x"));
        tracker.changed(4, Change::Inode { ino: 14 });
        tracker.changed(
            4,
            Change::Range {
                ino: 12,
                start: 8,
                end: 9,
            },
        );
        tracker.committed(3);
        let snapshot = tracker.take(4).unwrap();
        assert!(snapshot.dentries.is_empty());
        // 12 changed again in 4: only 4's range is left.
        assert_eq!(snapshot.inodes[&12].ranges, vec![(8, 9)]);
        assert!(snapshot.inodes.contains_key(&14));
    }

    #[test]
    fn the_filesystems_own_inodes_are_not_recorded() {
        let tracker = tracker();
        tracker.changed(3, Change::Inode { ino: 8 });
        tracker.changed(3, Change::Inode { ino: 2 });
        tracker.changed(3, Change::Inode { ino: 11 });
        let snapshot = tracker.take(3).unwrap();
        assert_eq!(snapshot.inodes.keys().copied().collect::<Vec<_>>(), [11]);
    }

    #[test]
    fn too_much_to_record_is_ineligible() {
        let tracker = Tracker::new(11, 4096);
        for ino in 12..100 {
            tracker.changed(3, Change::Inode { ino });
        }
        assert!(!tracker.eligible(3));
        assert_eq!(tracker.stats().ineligible[Ineligible::AreaFull.index()], 1);
    }
}
