//! What the next fast commits must record: the logical changes made since
//! the last fast or full commit, each tagged with its transaction (the
//! kernel's fast-commit queues, `ext4_fc_track_*`), held per directory
//! (`scope.rs`).
//!
//! The tracker is the journal's change observer (`journal::change`): every
//! handle reports its changes here, under the locks of the operation that
//! made them, its stop, and the commit thread every full commit. Each
//! logical transaction (`Entries`) keeps
//! - the inodes changed, each with the logical ranges whose mapping
//!   changed (physical blocks are looked up when the records are built, as
//!   the kernel does);
//! - the name changes, in order: CREAT for the first name of an inode
//!   allocated since (replay builds the inode from its record first), LINK
//!   and UNLINK otherwise.
//!
//! Beside them: whether something fast commits cannot express happened,
//! and in which JBD2 transaction — fast commits fall back to full commits
//! until that transaction is committed in full (the kernel's ineligibility,
//! for every directory); each reason is counted. And the data each inode
//! wrote in place since the last full commit (`data.rs`): a directory's
//! commit makes its own inodes' data durable, not the rest of the device's.
//!
//! A directory's commit (`commit.rs`) takes its set's running transaction
//! (`lock_down`), waits for the handles bound to it to stop (`drain`) —
//! new operations in that directory wait at `enter` meanwhile, no other
//! directory does — builds the records, and `freeze`s it; then waits for
//! its turn in the set (`wait_turn`) and queues it. A full commit of T
//! drops what was changed in T or before (`ChangeObserver::committed`).
//!
//! Bounded: past `capacity_bytes` of estimated records in one transaction
//! (the area's size) the tracker marks the JBD2 transaction ineligible and
//! forgets its entries: they could not be written anyway.
//!
//! Lock: `state` is a leaf lock (taken under an operation's locks by
//! `changed`, under the journal state by `committed`); the waits in
//! `enter` (holding only a journal handle), `lock_down`, `drain` and
//! `wait_turn` (holding nothing) sleep on `wake`.

use super::data::{DataMark, Ranges, UnflushedData, add_range};
use super::scope::{ConflictStats, Key, Scopes, TxnId};
use crate::format::fast_commit::RECORD_HEADER_SIZE;
use crate::format::superblock::Geometry;
use crate::hash::NumberMap;
use crate::journal::Journal;
use crate::journal::change::{Change, ChangeObserver, Ineligible};
use crate::journal::format::tid_gt;
use parking_lot::{Condvar, Mutex, MutexGuard};
use smallvec::SmallVec;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

/// Freed inode numbers held back from reuse at most.
const MAX_HELD_BACK: usize = 1 << 16;

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
    pub name: Name,
    tid: u32,
}

/// A tracked name: in place up to 32 bytes (most names), so that tracking
/// a create or an unlink allocates nothing for it.
pub(crate) type Name = SmallVec<[u8; 32]>;

/// An inode changed since the last commit.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct PendingInode {
    /// Logical ranges `[start, end)` whose mapping changed, sorted, apart.
    pub ranges: Ranges,
    /// Data was written past its old size (`Change::Extended`).
    pub extended: bool,
    /// The newest transaction that changed it.
    tid: u32,
}

/// What one logical transaction holds: what its commit records.
#[derive(Debug, Default)]
pub(crate) struct Entries {
    pub inodes: BTreeMap<u32, PendingInode>,
    /// In place for the few of a directory's typical commit.
    pub dentries: SmallVec<[DentryUpdate; 2]>,
    /// Inodes freed (with the transaction that freed them): no record, but
    /// a new file that gets one of these numbers depends on this
    /// transaction (`scope.rs`: its owner stays this one).
    pub freed: SmallVec<[(u32, u32); 2]>,
    /// Estimated record bytes.
    bytes: usize,
}

impl Entries {
    pub fn is_empty(&self) -> bool {
        self.inodes.is_empty() && self.dentries.is_empty() && self.freed.is_empty()
    }

    /// The inodes whose changes, records or freeing, this holds.
    pub fn inode_numbers(&self) -> impl Iterator<Item = u32> + '_ {
        self.inodes
            .keys()
            .copied()
            .chain(self.freed.iter().map(|&(ino, _)| ino))
    }

    /// The queue entry of `ino`, created if needed. A change from a newer
    /// transaction forgets the older one's ranges: that transaction is
    /// committed in full before any fast commit of this one is written
    /// (the kernel's `ext4_fc_reset_inode`).
    fn pending(&mut self, tid: u32, ino: u32) -> &mut PendingInode {
        let fresh = !self.inodes.contains_key(&ino);
        let pending = self.inodes.entry(ino).or_default();
        if fresh {
            self.bytes += INODE_RECORD_BYTES;
        } else if tid_gt(tid, pending.tid) {
            pending.ranges.clear();
            pending.extended = false;
        }
        pending.tid = tid;
        pending
    }

    fn add_range(&mut self, tid: u32, ino: u32, start: u64, end: u64) {
        let added = add_range(&mut self.pending(tid, ino).ranges, start, end);
        self.bytes += added * RANGE_RECORD_BYTES;
    }

    fn push_dentry(&mut self, tid: u32, op: DentryOp, parent: u32, ino: u32, name: &[u8]) {
        self.bytes += DENTRY_RECORD_BYTES + name.len();
        if op == DentryOp::Create {
            // Its CREAT is written with the inode's record and ranges.
            self.bytes += INODE_RECORD_BYTES;
        }
        self.dentries.push(DentryUpdate {
            op,
            parent,
            ino,
            name: Name::from_slice(name),
            tid,
        });
    }

    /// The inode went back to the free pool: nothing about it is recorded
    /// but the name changes that led there (the kernel's `ext4_fc_del`). Its
    /// CREAT goes too — replay could not build it without its record — so
    /// the UNLINKs of those names find nothing and change nothing.
    fn forget_inode(&mut self, tid: u32, ino: u32) {
        self.inodes.remove(&ino);
        self.dentries
            .retain(|dentry| !(dentry.ino == ino && dentry.op == DentryOp::Create));
        self.freed.push((ino, tid));
        self.bytes = estimate(self);
    }

    /// Drop what transaction `tid` or an earlier one changed.
    pub fn retain_after(&mut self, tid: u32) {
        self.inodes.retain(|_, inode| tid_gt(inode.tid, tid));
        self.dentries.retain(|dentry| tid_gt(dentry.tid, tid));
        self.freed
            .retain(|&mut (_, freed_in)| tid_gt(freed_in, tid));
        self.bytes = estimate(self);
    }

    /// Add `later`'s entries after these (a coalesced transaction, or this
    /// one given back ahead of what came since).
    pub fn append(&mut self, later: Entries) {
        for (ino, inode) in later.inodes {
            match self.inodes.get_mut(&ino) {
                Some(earlier) if !tid_gt(inode.tid, earlier.tid) => {
                    for (start, end) in inode.ranges {
                        add_range(&mut earlier.ranges, start, end);
                    }
                    earlier.extended |= inode.extended;
                }
                _ => {
                    self.inodes.insert(ino, inode);
                }
            }
        }
        self.dentries.extend(later.dentries);
        self.freed.extend(later.freed);
        self.bytes = estimate(self);
    }
}

/// Counters for `jext4 stats`.
#[derive(Debug, Default, Clone, Copy)]
pub struct FastCommitStats {
    /// Directory transactions committed by fast commits (several may share
    /// one write of the area: `Jbd2Stats::fast_commits`).
    pub commits: u64,
    /// fsyncs that needed a full commit instead.
    pub fallbacks: u64,
    /// Ineligible changes, per `Ineligible::ALL`.
    pub ineligible: [u64; Ineligible::ALL.len()],
    /// Conflicts between directory transactions.
    pub conflicts: ConflictStats,
    /// Builds given up after a conflict and tried again.
    pub retries: u64,
    /// Operations that waited at `enter` for their directory's commit to
    /// be built (the lock-up), and the time they spent, in microseconds.
    pub lockup_waits: u64,
    pub lockup_micros: u64,
    /// fsyncs whose data needed a flush of the whole device (an inode's
    /// written ranges past the tracker's bound).
    pub data_overflows: u64,
}

#[derive(Default)]
struct State {
    scopes: Option<Scopes>,
    /// Inodes allocated and not named yet: their first LINK is a CREAT.
    unnamed: NumberMap<u32, u32>,
    /// Fast commits cannot describe transactions up to this one.
    ineligible_until: Option<u32>,
}

impl State {
    fn scopes(&mut self) -> &mut Scopes {
        self.scopes.as_mut().expect("scopes are set at creation")
    }
}

/// What a directory's lock-down found (`Tracker::lock_down`).
pub(crate) enum LockDown {
    /// Nothing runs in the set; wait for this queue number, if any, to be
    /// durable (an earlier commit of the set holds what was changed).
    Nothing { after: Option<u64> },
    /// This transaction was taken for commit.
    Commit(TxnId),
}

/// What `Tracker::freeze` decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Freeze {
    Frozen,
    /// Another transaction's handle changed one of its inodes while it
    /// was built: given back, build again.
    Conflict,
    /// The JBD2 transaction became ineligible: given back, commit in full.
    Ineligible,
}

pub(crate) struct Tracker {
    /// Inodes below this (but the root) are the filesystem's own (journal,
    /// resize, orphan file): never recorded, as in the kernel.
    first_ino: u32,
    capacity_bytes: usize,
    state: Mutex<State>,
    /// Waiters for a directory's lock-down, drain, freeze or queue turn.
    wake: Condvar,
    data: Mutex<UnflushedData>,
    /// Inodes freed in a directory transaction not known durable yet, with
    /// the JBD2 transaction that freed them: the allocator hands them out
    /// last (`holds_back`), so that a new file does not tie its directory's
    /// commit to the freeing directory's. Per-directory scope only; at most
    /// `MAX_HELD_BACK` (past it numbers are reused, and the directories are
    /// united instead). A leaf lock.
    held_back: Mutex<NumberMap<u32, u32>>,
    global: bool,
    commits: AtomicU64,
    fallbacks: AtomicU64,
    retries: AtomicU64,
    lockup_waits: AtomicU64,
    lockup_micros: AtomicU64,
    data_overflows: AtomicU64,
    ineligible: [AtomicU64; Ineligible::ALL.len()],
}

impl Tracker {
    /// A tracker for a mount whose journal writes fast commits, registered
    /// as the journal's change observer; None when it writes none.
    /// `global`: one scope for every directory (`-o fast_commit=global`).
    pub fn attach(geo: &Geometry, journal: &Journal, global: bool) -> Option<Arc<Tracker>> {
        let (first, end) = journal.fast_commit_area()?;
        let capacity_bytes = (end - first) as usize * geo.block_size as usize;
        let tracker = Arc::new(Tracker::new(geo.first_ino, capacity_bytes, global));
        journal.set_change_observer(Arc::clone(&tracker) as Arc<dyn ChangeObserver>);
        Some(tracker)
    }

    pub fn new(first_ino: u32, capacity_bytes: usize, global: bool) -> Tracker {
        Tracker {
            first_ino,
            capacity_bytes,
            state: Mutex::new(State {
                scopes: Some(Scopes::new(global)),
                ..State::default()
            }),
            wake: Condvar::new(),
            data: Mutex::new(UnflushedData::default()),
            held_back: Mutex::new(NumberMap::default()),
            global,
            commits: AtomicU64::new(0),
            fallbacks: AtomicU64::new(0),
            retries: AtomicU64::new(0),
            lockup_waits: AtomicU64::new(0),
            lockup_micros: AtomicU64::new(0),
            data_overflows: AtomicU64::new(0),
            ineligible: std::array::from_fn(|_| AtomicU64::new(0)),
        }
    }

    /// Whether a fast commit may describe transaction `tid`: nothing
    /// ineligible happened in it. (A mark of an earlier transaction is
    /// cleared by that transaction's full commit, which every fast commit
    /// waits for.)
    pub fn eligible(&self, tid: u32) -> bool {
        is_eligible(&self.state.lock(), tid)
    }

    /// Fast commits cannot describe transaction `tid` (nor, until it is
    /// committed, any before it): forget its changes and count `reason`.
    pub fn mark_ineligible(&self, tid: u32, reason: Ineligible) {
        let mut state = self.state.lock();
        self.ineligible_locked(&mut state, tid, reason);
    }

    fn ineligible_locked(&self, state: &mut State, tid: u32, reason: Ineligible) {
        self.ineligible[reason.index()].fetch_add(1, Ordering::Relaxed);
        match state.ineligible_until {
            // Marked up to `tid` or later already: that mark dropped the
            // changes of `tid` and before, and `changed` tracks none since
            // (the full commit that clears the mark holds them). Entries a
            // committer puts back are trimmed the same way (`put_back`),
            // and no fast commit is written before that full commit.
            // Scanning every transaction on each mark was a fifth of an
            // untar's instructions: every mkdir marks one.
            Some(until) if !tid_gt(tid, until) => return,
            _ => state.ineligible_until = Some(tid),
        }
        // What is queued from `tid` or before: the full commit that clears
        // the mark will hold it. (A handle still in the transaction being
        // locked down may mark it after the next one's changes came.)
        state.scopes().retain_after(tid);
    }

    // -----------------------------------------------------------------
    // Operations: entering a directory's transaction.

    /// `handle` (an operation's, just started) enters the transaction of
    /// the directories `keys` — united first if several — waiting while
    /// that set's commit is being built, unless `nested` (the handle is
    /// already inside an operation: it must not wait for a drain that
    /// waits for it).
    pub fn enter(&self, handle: u64, keys: &[Key], nested: bool) {
        debug_assert!(
            crate::lock::held_ranks()
                .iter()
                .all(|&rank| rank == crate::lock::Rank::Handle),
            "entering a directory transaction under a filesystem lock"
        );
        let mut state = self.state.lock();
        if nested || state.scopes().is_bound(handle) {
            return;
        }
        let mut waited: Option<Instant> = None;
        // Each round waits for one set's build to end.
        loop {
            let root = state.scopes().unite(keys);
            if !state.scopes().building(root) {
                state.scopes().enter(handle, root);
                break;
            }
            waited.get_or_insert_with(Instant::now);
            self.sleep(&mut state);
        }
        if let Some(since) = waited {
            self.lockup_waits.fetch_add(1, Ordering::Relaxed);
            self.lockup_micros
                .fetch_add(since.elapsed().as_micros() as u64, Ordering::Relaxed);
        }
    }

    /// The directory key an operation on inode `ino` through a descriptor
    /// enters (see `scope.rs`).
    pub fn key_of(&self, ino: u32, is_dir: bool) -> Key {
        self.state.lock().scopes().key_of(ino, is_dir)
    }

    /// A lookup found `ino` in `dir`: its directory, unless it has one.
    pub fn learn_home(&self, ino: u32, dir: u32) {
        if ino >= self.first_ino {
            self.state.lock().scopes().learn_home(ino, dir);
        }
    }

    // -----------------------------------------------------------------
    // A directory's commit.

    /// Take the running transaction of `key`'s set for commit, waiting
    /// while another is being built in it or its frozen ones wait for
    /// their turn.
    pub fn lock_down(&self, key: Key) -> LockDown {
        crate::lock::assert_none_held("locking a directory transaction down");
        let mut state = self.state.lock();
        // Each round waits for one change of the set's commits.
        loop {
            match state.scopes().take(key) {
                Ok(Some(txn)) => return LockDown::Commit(txn),
                Ok(None) => {
                    return LockDown::Nothing {
                        after: state.scopes().last_queued(key),
                    };
                }
                Err(()) => self.sleep(&mut state),
            }
        }
    }

    /// Sleep on `wake` until a notify. The tracker's lock is a plain one
    /// (not `lock.rs`'s), so the `/dev/fuse` worker's hook is called here:
    /// another worker reads while this one waits (`fuse/turns.rs`).
    fn sleep(&self, state: &mut MutexGuard<'_, State>) {
        crate::lock::before_blocking();
        self.wake.wait(state);
    }

    /// Wait until no handle is bound to `txn`, then take its entries.
    pub fn drain(&self, txn: TxnId) -> Entries {
        let mut state = self.state.lock();
        while state.scopes().txn(txn).updates > 0 {
            self.sleep(&mut state);
        }
        state.scopes().drained(txn)
    }

    /// The records of `txn` were built from `entries` (the fast commit is
    /// of JBD2 transaction `tid`): freeze it, or give it back.
    pub fn freeze(&self, txn: TxnId, entries: Entries, tid: u32) -> Freeze {
        let mut state = self.state.lock();
        let verdict = if !is_eligible(&state, tid) {
            state.scopes().put_back(txn, entries);
            Freeze::Ineligible
        } else if state.scopes().freeze(txn, entries) {
            Freeze::Frozen
        } else {
            self.retries.fetch_add(1, Ordering::Relaxed);
            Freeze::Conflict
        };
        self.wake.notify_all();
        verdict
    }

    /// Give a taken transaction back to its set (an error, a fallback),
    /// without what a mark in force says the full commit will hold: kept,
    /// it would count in the size of the transaction it goes back to until
    /// that full commit, and could make the next fsyncs fall back as "too
    /// big for the area" (a repeated mark no longer scans, see
    /// `ineligible_locked`).
    pub fn put_back(&self, txn: TxnId, mut entries: Entries) {
        let mut state = self.state.lock();
        if let Some(until) = state.ineligible_until {
            entries.retain_after(until);
        }
        state.scopes().put_back(txn, entries);
        self.wake.notify_all();
    }

    /// Wait until `txn` is the first frozen transaction of its set, so
    /// that it is queued before any later one of the set. Returns whether
    /// JBD2 transaction `tid` is still eligible then (checked under the
    /// same lock a failed commit marks it under before it gives up its
    /// turn).
    pub fn wait_turn(&self, txn: TxnId, tid: u32) -> bool {
        let mut state = self.state.lock();
        while !state.scopes().is_turn(txn) {
            self.sleep(&mut state);
        }
        is_eligible(&state, tid)
    }

    /// `txn` is in the journal's queue as `seq`.
    pub fn queued(&self, txn: TxnId, seq: u64) {
        let mut state = self.state.lock();
        state.scopes().queued(txn, seq);
        self.wake.notify_all();
    }

    /// `txn`, queued as `durable` (None: it will never be written, a full
    /// commit covers it), is done.
    pub fn retire(&self, txn: TxnId, durable: Option<u64>) {
        let mut state = self.state.lock();
        let inodes = state.scopes().retire(txn, durable);
        self.wake.notify_all();
        drop(state);
        if durable.is_some() {
            // Their freeing is durable: the numbers may go to new files.
            let mut held_back = self.held_back.lock();
            for ino in inodes {
                held_back.remove(&ino);
            }
        }
    }

    /// Whether free inode `ino` was freed by a directory transaction not
    /// known durable (the allocator hands it out last).
    pub fn holds_back(&self, ino: u32) -> bool {
        self.held_back.lock().contains_key(&ino)
    }

    // -----------------------------------------------------------------
    // Data written in place.

    /// `ino`'s data went to device bytes `offset..offset + len` in
    /// transaction `tid` (not durable until a barrier names them or a full
    /// commit of `tid` ends).
    pub fn wrote_data(&self, tid: u32, ino: u32, offset: u64, len: u64) {
        self.data.lock().wrote(tid, ino, offset, len);
    }

    /// The device byte ranges `inodes` wrote since the last full commit,
    /// merged; None when one of them wrote more pieces than are remembered
    /// (then only a flush of the whole device will do).
    pub fn data_ranges(&self, inodes: impl IntoIterator<Item = u32>) -> Option<Vec<(u64, u64)>> {
        let ranges = self.data.lock().ranges(inodes);
        if ranges.is_none() {
            self.data_overflows.fetch_add(1, Ordering::Relaxed);
        }
        ranges
    }

    /// `data_ranges` of `inodes` with the mark of the writes they hold
    /// (`forget_durable_data`).
    pub fn data_ranges_marked(&self, inodes: &[u32]) -> Option<(Vec<(u64, u64)>, DataMark)> {
        let marked = self.data.lock().ranges_marked(inodes);
        if marked.is_none() {
            self.data_overflows.fetch_add(1, Ordering::Relaxed);
        }
        marked
    }

    /// A barrier over the ranges read with `mark` is durable: the inodes
    /// that wrote nothing since have no data left to make durable.
    pub fn forget_durable_data(&self, mark: &DataMark) {
        self.data.lock().forget_durable(mark);
    }

    // -----------------------------------------------------------------
    // Counters.

    /// A directory transaction was committed by a fast commit.
    pub fn count_commit(&self) {
        self.commits.fetch_add(1, Ordering::Relaxed);
    }

    /// An fsync needed a full commit.
    pub fn count_fallback(&self) {
        self.fallbacks.fetch_add(1, Ordering::Relaxed);
    }

    pub fn stats(&self) -> FastCommitStats {
        let conflicts = self.state.lock().scopes().conflicts;
        FastCommitStats {
            commits: self.commits.load(Ordering::Relaxed),
            fallbacks: self.fallbacks.load(Ordering::Relaxed),
            ineligible: std::array::from_fn(|index| self.ineligible[index].load(Ordering::Relaxed)),
            conflicts,
            retries: self.retries.load(Ordering::Relaxed),
            lockup_waits: self.lockup_waits.load(Ordering::Relaxed),
            lockup_micros: self.lockup_micros.load(Ordering::Relaxed),
            data_overflows: self.data_overflows.load(Ordering::Relaxed),
        }
    }

    /// The root and the filesystem's own inodes are never recorded (the
    /// root is a directory: replay rebuilds it from its names).
    fn recorded(&self, ino: u32) -> bool {
        ino >= self.first_ino
    }

    fn track(&self, state: &mut State, handle: u64, tid: u32, change: Change<'_>) {
        match change {
            Change::Inode { ino } | Change::Extended { ino } | Change::Range { ino, .. }
                if !self.recorded(ino) => {}
            Change::Inode { ino } => {
                let txn = self.route_inode(state, handle, ino);
                state.scopes().txn_mut(txn).entries.pending(tid, ino);
            }
            Change::Range { ino, start, end } => {
                let txn = self.route_inode(state, handle, ino);
                let entries = &mut state.scopes().txn_mut(txn).entries;
                entries.add_range(tid, ino, start, end);
            }
            Change::Extended { ino } => {
                let txn = self.route_inode(state, handle, ino);
                state
                    .scopes()
                    .txn_mut(txn)
                    .entries
                    .pending(tid, ino)
                    .extended = true;
            }
            Change::InodeAllocated { ino } => {
                state.unnamed.insert(ino, tid);
                self.route_inode(state, handle, ino);
            }
            Change::InodeFreed { ino } => {
                state.unnamed.remove(&ino);
                if !self.global {
                    let mut held_back = self.held_back.lock();
                    if held_back.len() < MAX_HELD_BACK {
                        held_back.insert(ino, tid);
                    }
                }
                // Its owner stays: a new file given this number depends on
                // the freeing (the old names' UNLINKs, the old blocks).
                let txn = self.route_inode(state, handle, ino);
                state.scopes().txn_mut(txn).entries.forget_inode(tid, ino);
                state.scopes().forget_home(ino);
            }
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
                let txn = state.scopes().route(handle, Some(ino), &[parent]);
                state.scopes().learn_home(ino, parent);
                state.scopes().own(ino, txn);
                let entries = &mut state.scopes().txn_mut(txn).entries;
                entries.push_dentry(tid, op, parent, ino, name);
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
                let txn = state.scopes().route(handle, Some(ino), &[parent]);
                let entries = &mut state.scopes().txn_mut(txn).entries;
                entries.push_dentry(tid, DentryOp::Unlink, parent, ino, name);
            }
            Change::Ineligible(reason) => self.ineligible_locked(state, tid, reason),
        }
    }

    /// The transaction an inode-level change of `ino` by `handle` goes to,
    /// which then holds the inode's pending changes.
    fn route_inode(&self, state: &mut State, handle: u64, ino: u32) -> TxnId {
        let scopes = state.scopes();
        let txn = scopes.route(handle, Some(ino), &[]);
        scopes.own(ino, txn);
        txn
    }
}

fn is_eligible(state: &State, tid: u32) -> bool {
    state
        .ineligible_until
        .is_none_or(|until| tid_gt(tid, until))
}

impl ChangeObserver for Tracker {
    fn changed(&self, handle: u64, tid: u32, change: Change<'_>) {
        let mut state = self.state.lock();
        if !is_eligible(&state, tid) && !matches!(change, Change::Ineligible(_)) {
            // The full commit that clears the mark will hold this change.
            return;
        }
        self.track(&mut state, handle, tid, change);
        let over = over_capacity(&mut state, handle, self.capacity_bytes);
        if over {
            self.ineligible_locked(&mut state, tid, Ineligible::AreaFull);
        }
    }

    fn stopped(&self, handle: u64) {
        let mut state = self.state.lock();
        if state.scopes().leave(handle) {
            self.wake.notify_all();
        }
    }

    fn committed(&self, tid: u32) {
        let mut state = self.state.lock();
        state.scopes().committed(tid);
        state
            .unnamed
            .retain(|_, allocated_in| tid_gt(*allocated_in, tid));
        if state
            .ineligible_until
            .is_some_and(|until| !tid_gt(until, tid))
        {
            state.ineligible_until = None;
        }
        drop(state);
        self.data.lock().committed(tid);
        self.held_back
            .lock()
            .retain(|_, freed_in| tid_gt(*freed_in, tid));
        self.wake.notify_all();
    }
}

/// Whether the transaction `handle` fills holds more records than the
/// area could take.
fn over_capacity(state: &mut MutexGuard<'_, State>, handle: u64, capacity: usize) -> bool {
    state
        .scopes()
        .bound_txn(handle)
        .is_some_and(|txn| txn.entries.bytes > capacity)
}

/// Estimated record bytes of `entries`.
fn estimate(entries: &Entries) -> usize {
    let inodes: usize = entries
        .inodes
        .values()
        .map(|inode| INODE_RECORD_BYTES + inode.ranges.len() * RANGE_RECORD_BYTES)
        .sum();
    let dentries: usize = entries
        .dentries
        .iter()
        .map(|dentry| DENTRY_RECORD_BYTES + dentry.name.len())
        .sum();
    inodes + dentries
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;
    use std::time::Duration;

    fn tracker() -> Tracker {
        Tracker::new(11, 1 << 20, false)
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

    /// Create `ino` named `name` in `dir` as operation `handle` of `tid`.
    fn create(tracker: &Tracker, handle: u64, tid: u32, dir: u32, ino: u32, name: &[u8]) {
        tracker.enter(handle, &[dir], false);
        tracker.changed(handle, tid, Change::InodeAllocated { ino });
        tracker.changed(handle, tid, Change::Inode { ino });
        tracker.changed(handle, tid, link(dir, ino, name));
        tracker.changed(handle, tid, Change::Inode { ino: dir });
        tracker.stopped(handle);
    }

    /// Take and drain `key`'s running transaction.
    fn take(tracker: &Tracker, key: Key) -> Option<(TxnId, Entries)> {
        match tracker.lock_down(key) {
            LockDown::Commit(txn) => Some((txn, tracker.drain(txn))),
            LockDown::Nothing { .. } => None,
        }
    }

    fn ops(entries: &Entries) -> Vec<(DentryOp, u32, u32)> {
        entries
            .dentries
            .iter()
            .map(|dentry| (dentry.op, dentry.parent, dentry.ino))
            .collect()
    }

    #[test]
    fn ranges_merge_when_they_touch() {
        let mut ranges = Ranges::new();
        assert_eq!(add_range(&mut ranges, 10, 20), 1);
        assert_eq!(add_range(&mut ranges, 30, 40), 1);
        assert_eq!(add_range(&mut ranges, 20, 25), 0);
        assert_eq!(ranges[..], [(10, 25), (30, 40)]);
        assert_eq!(add_range(&mut ranges, 0, 100), 0);
        assert_eq!(ranges[..], [(0, 100)]);
        assert_eq!(add_range(&mut ranges, 200, 201), 1);
        assert_eq!(ranges[..], [(0, 100), (200, 201)]);
    }

    /// A directory's commit frozen behind one whose write-back failed (and
    /// which went back unwritten) must not be written alone: it may rename
    /// a name only the failed one created.
    #[test]
    fn a_commit_behind_one_that_failed_is_not_written_alone() {
        let tracker = tracker();
        tracker.enter(1, &[20], false);
        tracker.changed(1, 5, Change::InodeAllocated { ino: 12 });
        tracker.changed(1, 5, Change::Inode { ino: 12 });
        tracker.changed(1, 5, link(20, 12, b"a"));
        tracker.stopped(1);
        let (first, _) = take(&tracker, 20).unwrap();
        assert_eq!(tracker.freeze(first, Entries::default(), 5), Freeze::Frozen);
        tracker.enter(2, &[20], false);
        tracker.changed(2, 5, unlink(20, 12, b"a"));
        tracker.changed(2, 5, link(20, 12, b"b"));
        tracker.stopped(2);
        let (second, entries) = take(&tracker, 20).unwrap();
        assert_eq!(entries.dentries.len(), 2);
        assert_eq!(
            tracker.freeze(second, Entries::default(), 5),
            Freeze::Frozen
        );
        // The first one's write-back fails, as `commit_txn` gives it up.
        tracker.mark_ineligible(5, Ineligible::Failed);
        tracker.put_back(first, Entries::default());
        assert!(
            !tracker.wait_turn(second, 5),
            "the rename would go out without the create"
        );
    }

    #[test]
    fn the_first_name_of_a_new_inode_is_a_create() {
        let tracker = tracker();
        tracker.enter(1, &[20], false);
        tracker.changed(1, 5, Change::InodeAllocated { ino: 12 });
        tracker.changed(1, 5, Change::Inode { ino: 12 });
        tracker.changed(1, 5, link(20, 12, b"a"));
        tracker.changed(1, 5, link(20, 12, b"b"));
        tracker.changed(1, 5, unlink(20, 12, b"a"));
        tracker.stopped(1);
        let (txn, entries) = take(&tracker, 20).unwrap();
        let kinds: Vec<DentryOp> = entries.dentries.iter().map(|d| d.op).collect();
        assert_eq!(kinds, [DentryOp::Create, DentryOp::Link, DentryOp::Unlink]);
        assert!(entries.inodes.contains_key(&12));
        assert_eq!(tracker.freeze(txn, Entries::default(), 5), Freeze::Frozen);
        // Taken once; the next commit of the directory waits for it.
        assert!(tracker.wait_turn(txn, 5));
        tracker.queued(txn, 1);
        assert!(matches!(
            tracker.lock_down(20),
            LockDown::Nothing { after: Some(1) }
        ));
        tracker.retire(txn, Some(1));
        assert!(matches!(
            tracker.lock_down(20),
            LockDown::Nothing { after: None }
        ));
    }

    #[test]
    fn a_freed_inode_leaves_only_its_name_changes_without_create() {
        let tracker = tracker();
        tracker.enter(1, &[20], false);
        tracker.changed(1, 5, Change::InodeAllocated { ino: 12 });
        tracker.changed(1, 5, link(20, 12, b"a"));
        tracker.changed(
            1,
            5,
            Change::Range {
                ino: 12,
                start: 0,
                end: 4,
            },
        );
        tracker.changed(1, 5, unlink(20, 12, b"a"));
        tracker.changed(1, 5, Change::InodeFreed { ino: 12 });
        tracker.stopped(1);
        let (_, entries) = take(&tracker, 20).unwrap();
        assert!(entries.inodes.is_empty());
        assert_eq!(ops(&entries), [(DentryOp::Unlink, 20, 12)]);
    }

    #[test]
    fn directories_commit_apart() {
        let tracker = tracker();
        create(&tracker, 1, 5, 20, 30, b"x");
        create(&tracker, 2, 5, 21, 31, b"y");
        let (_, entries) = take(&tracker, 20).unwrap();
        assert_eq!(ops(&entries), [(DentryOp::Create, 20, 30)]);
        assert_eq!(entries.inodes.keys().copied().collect::<Vec<_>>(), [20, 30]);
        let (_, other) = take(&tracker, 21).unwrap();
        assert_eq!(ops(&other), [(DentryOp::Create, 21, 31)]);
        // A descriptor of 31 commits with its directory.
        assert_eq!(tracker.key_of(31, false), tracker.key_of(21, true));
        assert_eq!(tracker.stats().conflicts.coalesced, 0);
    }

    #[test]
    fn a_rename_across_directories_commits_as_one() {
        let tracker = tracker();
        create(&tracker, 1, 5, 20, 30, b"x");
        tracker.enter(2, &[20, 21], false);
        tracker.changed(2, 5, unlink(20, 30, b"x"));
        tracker.changed(2, 5, link(21, 30, b"y"));
        tracker.changed(2, 5, Change::Inode { ino: 30 });
        tracker.stopped(2);
        // Committing the target directory commits the source too.
        let (txn, entries) = take(&tracker, 21).unwrap();
        assert_eq!(
            ops(&entries),
            [
                (DentryOp::Create, 20, 30),
                (DentryOp::Unlink, 20, 30),
                (DentryOp::Link, 21, 30)
            ]
        );
        assert!(tracker.stats().conflicts.coalesced >= 1);
        assert_eq!(tracker.freeze(txn, Entries::default(), 5), Freeze::Frozen);
        assert!(tracker.wait_turn(txn, 5));
        tracker.queued(txn, 1);
        tracker.retire(txn, Some(1));
        assert!(take(&tracker, 20).is_none(), "nothing left in the source");
    }

    #[test]
    fn a_link_into_another_directory_coalesces_with_the_file() {
        let tracker = tracker();
        create(&tracker, 1, 5, 20, 30, b"x");
        tracker.enter(2, &[21, tracker.key_of(30, false)], false);
        tracker.changed(2, 5, link(21, 30, b"y"));
        tracker.changed(2, 5, Change::Inode { ino: 30 });
        tracker.stopped(2);
        let (_, entries) = take(&tracker, 21).unwrap();
        assert_eq!(
            ops(&entries),
            [(DentryOp::Create, 20, 30), (DentryOp::Link, 21, 30)]
        );
    }

    #[test]
    fn a_new_file_given_a_freed_number_commits_with_the_freeing() {
        let tracker = tracker();
        tracker.enter(1, &[20], false);
        tracker.changed(1, 5, unlink(20, 30, b"old"));
        tracker.changed(1, 5, Change::Inode { ino: 30 });
        tracker.changed(1, 5, Change::InodeFreed { ino: 30 });
        tracker.stopped(1);
        // Another directory's new file gets number 30.
        create(&tracker, 2, 5, 21, 30, b"new");
        let (_, entries) = take(&tracker, 21).unwrap();
        assert_eq!(
            ops(&entries),
            [(DentryOp::Unlink, 20, 30), (DentryOp::Create, 21, 30)]
        );
    }

    #[test]
    fn a_foreign_change_while_building_is_a_conflict_and_is_built_again() {
        let tracker = tracker();
        create(&tracker, 1, 5, 20, 30, b"x");
        let (txn, entries) = take(&tracker, 20).unwrap();
        // An operation of another directory (a hard link's) changes 30
        // while the records are built.
        tracker.enter(2, &[21], false);
        tracker.changed(2, 5, Change::Inode { ino: 30 });
        tracker.stopped(2);
        assert_eq!(tracker.freeze(txn, entries, 5), Freeze::Conflict);
        assert_eq!(tracker.stats().conflicts.waited, 1);
        assert_eq!(tracker.stats().retries, 1);
        // Given back and united: the next build holds both.
        let (again, entries) = take(&tracker, 21).unwrap();
        assert_eq!(ops(&entries), [(DentryOp::Create, 20, 30)]);
        assert!(entries.inodes.contains_key(&30));
        assert_eq!(tracker.freeze(again, entries, 5), Freeze::Frozen);
        // A change to a frozen transaction's inode is shadowed.
        tracker.enter(3, &[22], false);
        tracker.changed(3, 5, Change::Inode { ino: 30 });
        tracker.stopped(3);
        assert_eq!(tracker.stats().conflicts.shadowed, 1);
    }

    #[test]
    fn a_build_waits_for_the_handles_inside_and_entering_waits_for_the_build() {
        let tracker = Arc::new(tracker());
        tracker.enter(1, &[20], false);
        tracker.changed(1, 5, Change::Inode { ino: 30 });
        let LockDown::Commit(txn) = tracker.lock_down(20) else {
            panic!("something to commit");
        };
        // Handle 1 is still inside: the drain waits for it.
        let (drained_tx, drained) = mpsc::channel();
        let builder = {
            let tracker = Arc::clone(&tracker);
            std::thread::spawn(move || {
                let entries = tracker.drain(txn);
                drained_tx.send(()).unwrap();
                entries
            })
        };
        assert!(drained.recv_timeout(Duration::from_millis(100)).is_err());
        // Its later change still belongs to the transaction taken.
        tracker.changed(1, 5, Change::Inode { ino: 31 });
        tracker.stopped(1);
        drained.recv_timeout(Duration::from_secs(10)).unwrap();
        let entries = builder.join().unwrap();
        assert!(entries.inodes.contains_key(&31));
        // Another directory enters at once; this one waits for the freeze.
        tracker.enter(2, &[21], false);
        tracker.stopped(2);
        let (entered_tx, entered) = mpsc::channel();
        let operation = {
            let tracker = Arc::clone(&tracker);
            std::thread::spawn(move || {
                tracker.enter(3, &[20], false);
                entered_tx.send(()).unwrap();
                tracker.stopped(3);
            })
        };
        assert!(entered.recv_timeout(Duration::from_millis(100)).is_err());
        assert_eq!(tracker.freeze(txn, entries, 5), Freeze::Frozen);
        entered.recv_timeout(Duration::from_secs(10)).unwrap();
        operation.join().unwrap();
        assert_eq!(tracker.stats().lockup_waits, 1);
    }

    #[test]
    fn an_existing_directory_renamed_is_ineligible_until_committed() {
        let tracker = tracker();
        tracker.changed(1, 7, Change::Inode { ino: 20 });
        tracker.changed(
            1,
            7,
            Change::Link {
                parent: 2,
                ino: 30,
                name: b"dir2",
                dir: true,
            },
        );
        assert!(!tracker.eligible(7));
        // Changes of the same transaction are not queued; the next one's are.
        tracker.changed(1, 7, Change::Inode { ino: 21 });
        tracker.stopped(1);
        tracker.changed(2, 8, Change::Inode { ino: 22 });
        tracker.stopped(2);
        // 8 is eligible (its fast commit waits for 7's full commit).
        assert!(tracker.eligible(8));
        // A late mark for 7 does not drop what 8 changed.
        tracker.changed(3, 7, Change::Ineligible(Ineligible::Xattr));
        tracker.stopped(3);
        tracker.committed(7);
        assert!(tracker.eligible(8));
        let (_, entries) = take(&tracker, tracker.key_of(22, false)).unwrap();
        assert_eq!(entries.inodes.keys().copied().collect::<Vec<_>>(), [22]);
        assert_eq!(tracker.stats().ineligible[Ineligible::RenameDir.index()], 1);
    }

    /// A mark that does not move (its transaction marked already) counts
    /// its reason and scans nothing; entries a committer gives back after
    /// the mark are trimmed to what it leaves, and go with the full commit
    /// that clears it.
    #[test]
    fn a_repeated_mark_counts_and_entries_given_back_go_with_the_full_commit() {
        let tracker = tracker();
        tracker.changed(1, 7, Change::Inode { ino: 20 });
        tracker.stopped(1);
        let (txn, entries) = take(&tracker, tracker.key_of(20, false)).unwrap();
        tracker.mark_ineligible(7, Ineligible::Xattr);
        tracker.mark_ineligible(7, Ineligible::Xattr);
        tracker.mark_ineligible(6, Ineligible::Xattr);
        assert_eq!(tracker.stats().ineligible[Ineligible::Xattr.index()], 3);
        assert!(!tracker.eligible(7) && tracker.eligible(8));
        // The committer found 7 ineligible and gives its entries back:
        // trimmed to nothing, as the mark in force says 7's full commit
        // holds them (kept, they would count in the set's size).
        tracker.put_back(txn, entries);
        assert!(
            take(&tracker, tracker.key_of(20, false)).is_none(),
            "7's change is left to its full commit"
        );
        tracker.changed(2, 8, Change::Inode { ino: 22 });
        tracker.stopped(2);
        tracker.committed(7);
        assert!(
            take(&tracker, tracker.key_of(20, false)).is_none(),
            "7's change went with its full commit"
        );
        let (_, entries) = take(&tracker, tracker.key_of(22, false)).unwrap();
        assert_eq!(entries.inodes.keys().copied().collect::<Vec<_>>(), [22]);
    }

    #[test]
    fn a_full_commit_drops_what_it_holds_and_idle_sets_dissolve() {
        let tracker = tracker();
        tracker.enter(1, &[20, 21], false);
        tracker.changed(1, 3, Change::Inode { ino: 12 });
        tracker.changed(1, 3, link(20, 13, b"x"));
        tracker.stopped(1);
        tracker.enter(2, &[20], false);
        tracker.changed(2, 4, Change::Inode { ino: 14 });
        tracker.changed(
            2,
            4,
            Change::Range {
                ino: 12,
                start: 8,
                end: 9,
            },
        );
        tracker.stopped(2);
        tracker.committed(3);
        let (txn, entries) = take(&tracker, 20).unwrap();
        assert!(entries.dentries.is_empty());
        // 12 changed again in 4: only 4's range is left.
        assert_eq!(entries.inodes[&12].ranges[..], [(8, 9)]);
        assert!(entries.inodes.contains_key(&14));
        // (A full commit waits for every fast commit: this one gives up.)
        tracker.put_back(txn, entries);
        tracker.committed(4);
        let mut state = tracker.state.lock();
        let (txns, sets) = state.scopes().sizes();
        assert!(txns <= 1 && sets <= 1, "{txns} transactions, {sets} sets");
    }

    #[test]
    fn the_filesystems_own_inodes_are_not_recorded() {
        let tracker = tracker();
        tracker.enter(1, &[20], false);
        tracker.changed(1, 3, Change::Inode { ino: 8 });
        tracker.changed(1, 3, Change::Inode { ino: 2 });
        tracker.changed(1, 3, Change::Inode { ino: 11 });
        tracker.stopped(1);
        let (_, entries) = take(&tracker, 20).unwrap();
        assert_eq!(entries.inodes.keys().copied().collect::<Vec<_>>(), [11]);
    }

    #[test]
    fn the_global_scope_commits_every_directory_at_once() {
        let tracker = Tracker::new(11, 1 << 20, true);
        create(&tracker, 1, 5, 20, 30, b"x");
        create(&tracker, 2, 5, 21, 31, b"y");
        let (_, entries) = take(&tracker, 21).unwrap();
        assert_eq!(entries.dentries.len(), 2);
    }

    #[test]
    fn too_much_to_record_is_ineligible() {
        let tracker = Tracker::new(11, 4096, false);
        tracker.enter(1, &[20], false);
        for ino in 12..100 {
            tracker.changed(1, 3, Change::Inode { ino });
        }
        tracker.stopped(1);
        assert!(!tracker.eligible(3));
        assert_eq!(tracker.stats().ineligible[Ineligible::AreaFull.index()], 1);
    }
}
