//! The engine's locks, their one ranking, and the debug-build checker.
//!
//! Every lock that can be held while another is taken is one of the
//! wrappers below (or, for the journal handle and the inode locks, records
//! itself through [`Held`]), and each carries a [`Rank`]. A thread may take
//! a lock only while every lock it holds ranks strictly before it; locks of
//! a nestable rank (buffers) may also be taken while others of the same
//! rank are held. In debug builds — CI tests with debug assertions on
//! (`--profile ci`) — each thread keeps the ranks it holds, and taking a
//! lock out of order panics at once, naming both locks, before the thread
//! could block: an inversion is caught the first time it happens, not the
//! day two threads meet in it. In release builds the wrappers are the
//! parking_lot locks and nothing is recorded.
//!
//! # Lock ranking (outermost first), in the manner of jbd2.h
//!
//! ```text
//! Handle        a journal handle: Journal::start (the outermost one of a
//!               thread). Starting one waits for a commit's lock-down,
//!               so no filesystem lock may be held then.
//! Checkpoint    Jbd2::checkpointing: one checkpoint pass at a time (the
//!               checkpoint thread; unmount). Held across I/O.
//! JournalState  Jbd2::state: transaction states, log head and tail,
//!               commit and checkpoint requests. Taken by handle start and
//!               stop, fsync's waits and the journal's threads; never while
//!               a filesystem lock is held.
//! Rename        Core::rename_lock: the shape of the directory tree (the
//!               kernel's s_vfs_rename_mutex); cross-directory renames.
//! Directory     an inode lock taken for a directory whose entries an
//!               operation reads or changes (lookup, readdir, create,
//!               unlink, rename, link's target directory).
//! Directory2    the second directory of a cross-directory rename: taken
//!               after Directory, the ancestor first, else the lower
//!               inode number first.
//! Inode         an inode lock taken for the inode itself: its fields, its
//!               mapping and data, its xattrs; the victim of unlink/rmdir,
//!               the source of rename, the file of link, a new inode.
//! Inode2        the second inode of a rename (source and target: the lower
//!               inode number is Inode, the higher Inode2).
//! EaInode       an EA inode (ea_inode), taken under the inode whose
//!               attribute names it (or the two of a rename) to read its
//!               value or change its reference count. One at a time.
//! Orphan        Core::orphans: the orphan records (s_last_orphan and its
//!               i_dtime chain, the orphan file's slots).
//! Group         Core::groups[g].desc: group g's descriptor and bitmaps.
//!               One group at a time.
//! Superblock    Core::sb: the superblock's fields but the free counts
//!               (atomic counters, written into it at commit).
//! Buffer        Buffer::journal, then Buffer::data: one block's journal
//!               head and bytes. Nestable: an operation holds the blocks
//!               of the structures its locks above give it.
//! ```
//!
//! Leaf locks are taken last and never held while taking another lock:
//! the buffer cache's map, the inode lock table's shards, a transaction's
//! buffer and revoke lists, the pending-free map, the write-ahead guard,
//! the write-back set, the fast-commit tracker, the files' preallocation
//! windows (`Core::windows`, taken under a group lock or none), the
//! groups' spare masks (`Groups::spare_masks`, under a group lock), and the
//! engine's small maps (`inode_tids`, `open_files`, `open_orphans`,
//! `remembered`). They are plain parking_lot locks.
//!
//! The journal's own state ranks second, right after the handle, not
//! innermost: it is the lock of the commit and checkpoint threads, which
//! take buffer locks under it (lock-down sweeps the transaction's buffers,
//! the commit hook writes the superblock's counters into it), and
//! filesystem operations only touch it holding no filesystem lock. What is
//! innermost are the journal's leaf locks that `get_write_access` and
//! `free_blocks` reach from inside operations.
//!
//! Waiting: a thread holding a filesystem lock never waits for a commit
//! (fsync, sync, `-o sync` wait after their operation released its locks
//! and stopped its handle). A directory's fast commit takes its consistent
//! cut without stopping other directories: it waits for the handles bound
//! to that directory's transaction to stop (they hold locks, it holds
//! none), and new operations in that directory wait at their start —
//! holding only their handle — until its records are built
//! (`fs::fast_commit::track`); each inode is read under its inode lock.

use std::ops::{Deref, DerefMut};
use std::time::Instant;

/// The ranks, outermost first (see the module comment).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Rank {
    Handle,
    Checkpoint,
    JournalState,
    Rename,
    Directory,
    Directory2,
    Inode,
    Inode2,
    EaInode,
    Orphan,
    Group,
    Superblock,
    Buffer,
}

impl Rank {
    /// Locks of this rank may be taken while others of it are held.
    #[cfg_attr(not(debug_assertions), allow(dead_code))]
    fn nestable(self) -> bool {
        self == Rank::Buffer
    }
}

#[cfg(debug_assertions)]
mod checker {
    use super::Rank;
    use std::cell::RefCell;

    thread_local! {
        /// The locks this thread holds: (rank, address), oldest first.
        static HELD: RefCell<Vec<(Rank, usize)>> = const { RefCell::new(Vec::new()) };
    }

    /// Check that `rank` may be taken now and record it as held.
    pub fn acquire(rank: Rank, address: usize) {
        HELD.with(|held| {
            let mut held = held.borrow_mut();
            let offending = held.iter().find(|&&(other, other_address)| {
                other > rank || (other == rank && !rank.nestable()) || other_address == address
            });
            if let Some(&(other, other_address)) = offending {
                let ranks: Vec<Rank> = held.iter().map(|(rank, _)| *rank).collect();
                let what = if other_address == address {
                    "the same lock again"
                } else {
                    "out of order"
                };
                drop(held);
                panic!(
                    "lock ranking violated: taking {rank:?} while holding {other:?} \
                     ({what}; held, oldest first: {ranks:?})"
                );
            }
            held.push((rank, address));
        });
    }

    pub fn release(address: usize) {
        HELD.with(|held| {
            let mut held = held.borrow_mut();
            if let Some(index) = held.iter().rposition(|&(_, other)| other == address) {
                held.remove(index);
            }
        });
    }

    pub fn held() -> Vec<Rank> {
        HELD.with(|held| held.borrow().iter().map(|(rank, _)| *rank).collect())
    }
}

/// One lock held by this thread, as the checker knows it: created just
/// before the lock is taken (the order is checked then), dropped when it
/// is released. Zero-sized in release builds.
#[must_use]
pub struct Held {
    #[cfg(debug_assertions)]
    address: usize,
}

impl Held {
    /// Check that the lock at `address` of `rank` may be taken by this
    /// thread now (debug builds panic on an inversion) and record it.
    #[cfg_attr(not(debug_assertions), allow(unused_variables))]
    pub fn acquire(rank: Rank, address: usize) -> Held {
        #[cfg(debug_assertions)]
        checker::acquire(rank, address);
        Held {
            #[cfg(debug_assertions)]
            address,
        }
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        #[cfg(debug_assertions)]
        checker::release(self.address);
    }
}

/// The ranks this thread holds, oldest first (debug builds; empty in
/// release builds).
pub fn held_ranks() -> Vec<Rank> {
    #[cfg(debug_assertions)]
    return checker::held();
    #[cfg(not(debug_assertions))]
    Vec::new()
}

/// Debug builds: panic unless this thread holds no ranked lock (before it
/// waits for a commit, say).
pub fn assert_none_held(what: &str) {
    #[cfg(debug_assertions)]
    {
        let held = checker::held();
        assert!(held.is_empty(), "{what} while holding {held:?}");
    }
    #[cfg(not(debug_assertions))]
    let _ = what;
}

thread_local! {
    static BEFORE_BLOCKING: std::cell::RefCell<Option<Box<dyn Fn()>>> =
        const { std::cell::RefCell::new(None) };
}

/// Give the calling thread something to run whenever it is about to block
/// on one of these locks or condition variables: a `/dev/fuse` worker
/// uses it to wake another worker to read meanwhile (`fuse/turns.rs`).
/// The hook runs under the caller's locks, so it may take only a leaf
/// lock outside this ranking (turns.rs's `parked`, a std mutex) and
/// never one of these.
pub fn set_before_blocking(hook: Box<dyn Fn()>) {
    BEFORE_BLOCKING.with(|slot| *slot.borrow_mut() = Some(hook));
}

/// The calling thread is about to wait: for a contended lock, a commit, a
/// condition.
pub fn before_blocking() {
    BEFORE_BLOCKING.with(|slot| {
        if let Some(hook) = &*slot.borrow() {
            hook();
        }
    });
}

/// A lock's guard without waiting if `attempt` got it; else run the hook
/// (`before_blocking`), then `wait` for it. For the wrappers here and the
/// inode locks, whose uncontended path stays one try.
pub fn take_or_wait<G>(attempt: Option<G>, wait: impl FnOnce() -> G) -> G {
    attempt.unwrap_or_else(|| {
        before_blocking();
        wait()
    })
}

fn address_of<T: ?Sized>(value: &T) -> usize {
    value as *const T as *const u8 as usize
}

/// A mutex with a rank.
pub struct Mutex<T: ?Sized> {
    rank: Rank,
    inner: parking_lot::Mutex<T>,
}

pub struct MutexGuard<'a, T: ?Sized> {
    guard: parking_lot::MutexGuard<'a, T>,
    _held: Held,
}

impl<T> Mutex<T> {
    pub const fn new(rank: Rank, value: T) -> Self {
        Mutex {
            rank,
            inner: parking_lot::Mutex::new(value),
        }
    }

    pub fn into_inner(self) -> T {
        self.inner.into_inner()
    }
}

impl<T: ?Sized> Mutex<T> {
    pub fn lock(&self) -> MutexGuard<'_, T> {
        let held = Held::acquire(self.rank, address_of(self));
        let guard = take_or_wait(self.inner.try_lock(), || self.inner.lock());
        MutexGuard { guard, _held: held }
    }

    pub fn get_mut(&mut self) -> &mut T {
        self.inner.get_mut()
    }
}

impl<T: ?Sized> Deref for MutexGuard<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.guard
    }
}

impl<T: ?Sized> DerefMut for MutexGuard<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        &mut self.guard
    }
}

/// A condition variable for ranked mutexes. While a thread waits, its
/// lock counts as held: it takes nothing else meanwhile.
#[derive(Default)]
pub struct Condvar(parking_lot::Condvar);

impl Condvar {
    pub const fn new() -> Self {
        Condvar(parking_lot::Condvar::new())
    }

    pub fn wait<T: ?Sized>(&self, guard: &mut MutexGuard<'_, T>) {
        before_blocking();
        self.0.wait(&mut guard.guard);
    }

    /// Returns true when the deadline passed.
    pub fn wait_until<T: ?Sized>(&self, guard: &mut MutexGuard<'_, T>, deadline: Instant) -> bool {
        before_blocking();
        self.0.wait_until(&mut guard.guard, deadline).timed_out()
    }

    /// Returns true when the time ran out.
    pub fn wait_for<T: ?Sized>(
        &self,
        guard: &mut MutexGuard<'_, T>,
        timeout: std::time::Duration,
    ) -> bool {
        before_blocking();
        self.0.wait_for(&mut guard.guard, timeout).timed_out()
    }

    pub fn notify_one(&self) -> bool {
        self.0.notify_one()
    }

    pub fn notify_all(&self) -> usize {
        self.0.notify_all()
    }
}

/// A reader-writer lock with a rank.
pub struct RwLock<T: ?Sized> {
    rank: Rank,
    inner: parking_lot::RwLock<T>,
}

pub struct RwLockReadGuard<'a, T: ?Sized> {
    guard: parking_lot::RwLockReadGuard<'a, T>,
    _held: Held,
}

pub struct RwLockWriteGuard<'a, T: ?Sized> {
    guard: parking_lot::RwLockWriteGuard<'a, T>,
    _held: Held,
}

impl<T> RwLock<T> {
    pub const fn new(rank: Rank, value: T) -> Self {
        RwLock {
            rank,
            inner: parking_lot::RwLock::new(value),
        }
    }
}

impl<T: ?Sized> RwLock<T> {
    pub fn read(&self) -> RwLockReadGuard<'_, T> {
        let held = Held::acquire(self.rank, address_of(self));
        let guard = take_or_wait(self.inner.try_read(), || self.inner.read());
        RwLockReadGuard { guard, _held: held }
    }

    pub fn write(&self) -> RwLockWriteGuard<'_, T> {
        let held = Held::acquire(self.rank, address_of(self));
        let guard = take_or_wait(self.inner.try_write(), || self.inner.write());
        RwLockWriteGuard { guard, _held: held }
    }
}

impl<T: ?Sized> Deref for RwLockReadGuard<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.guard
    }
}

impl<T: ?Sized> Deref for RwLockWriteGuard<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.guard
    }
}

impl<T: ?Sized> DerefMut for RwLockWriteGuard<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        &mut self.guard
    }
}

#[cfg(all(test, debug_assertions))]
mod tests {
    use super::*;

    #[test]
    fn in_order_nested_and_released_locks_pass() {
        let group = Mutex::new(Rank::Group, 0);
        let first = RwLock::new(Rank::Buffer, 1);
        let second = RwLock::new(Rank::Buffer, 2);
        {
            let _group = group.lock();
            let _first = first.write();
            // Buffers nest.
            let _second = second.read();
            assert_eq!(
                held_ranks(),
                [Rank::Group, Rank::Buffer, Rank::Buffer],
                "every lock recorded"
            );
        }
        assert!(held_ranks().is_empty(), "every release recorded");
        // Released locks no longer count: the inner one first is fine now.
        let _first = first.read();
        drop(_first);
        let _group = group.lock();
    }

    #[test]
    #[should_panic(expected = "taking Group while holding Superblock")]
    fn an_inversion_panics_before_blocking() {
        let group = Mutex::new(Rank::Group, ());
        let superblock = Mutex::new(Rank::Superblock, ());
        let _superblock = superblock.lock();
        let _group = group.lock();
    }

    #[test]
    #[should_panic(expected = "taking Inode while holding Inode")]
    fn two_locks_of_one_plain_rank_panic() {
        let first = RwLock::new(Rank::Inode, ());
        let second = RwLock::new(Rank::Inode, ());
        let _first = first.write();
        let _second = second.write();
    }

    #[test]
    #[should_panic(expected = "the same lock again")]
    fn taking_a_nestable_lock_twice_panics() {
        let buffer = RwLock::new(Rank::Buffer, ());
        let _first = buffer.read();
        let _again = buffer.read();
    }

    #[test]
    fn a_panic_leaves_the_thread_consistent() {
        // A thread that panicked while holding locks released them as it
        // unwound; its next acquisitions are judged on what it holds now.
        let result = std::thread::spawn(|| {
            let group = Mutex::new(Rank::Group, ());
            let inode = RwLock::new(Rank::Inode, ());
            let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                let _group = group.lock();
                let _inode = inode.write();
            }));
            assert!(caught.is_err());
            assert!(held_ranks().is_empty());
            let _inode = inode.write();
            let _group = group.lock();
        })
        .join();
        assert!(result.is_ok());
    }
}
