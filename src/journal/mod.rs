//! Transactions: the only way metadata changes.
//!
//! Every filesystem operation opens a [`Handle`] with `Journal::start(credits)`
//! before it takes any filesystem lock, changes metadata blocks only through
//! `Handle::get_write_access` / `get_create_access` (which put the block in
//! the handle's transaction), reports freed blocks with
//! `Handle::free_blocks`, and closes with `Handle::stop`. Any step may call
//! `Handle::set_sync` (O_SYNC, dirsync, `-o sync`); when that handle stops,
//! its transaction is committed and the stop waits for it — with no
//! filesystem lock held.
//!
//! Locks: the ranking of `crate::lock` (a handle is started before any
//! filesystem lock is taken; the JBD2 state ranks right after it and is
//! never taken under a filesystem lock; the journal's lists are leaves).
//! The journal never takes a filesystem lock, except the superblock's and
//! buffers' in its commit hook.
//!
//! Modes:
//! - `Jbd2` (`jbd2.rs`, `commit.rs`, `checkpoint.rs`): the real journal,
//!   for filesystems with `has_journal`.
//! - `WriteBack`: no journal (ext2 images): dirty buffers are written home
//!   by a background flusher, by `sync`, under cache pressure and at
//!   unmount. Same promise as ext2: a crash may leave work for `e2fsck`.

mod bytelog;
pub mod change;
mod checkpoint;
mod commit;
pub mod fast_commit;
mod fc_commit;
pub mod format;
mod jbd2;
pub mod logdump;
pub mod recovery;
mod waiters;
mod writeback;

pub use fc_commit::{FastCommitBegin, FastCommitOutcome, FastCommitTicket, Written, merge_ranges};
pub use jbd2::{Jbd2Options, Jbd2Stats};

use crate::cache::{Buffer, BufferCache};
use crate::dev::guard::GuardedDevice;
use crate::error::{Error, Result};
use crate::lock::{Held, Rank, RwLockWriteGuard};
use change::{Change, ChangeObserver};
use jbd2::{Jbd2, Transaction};
use recovery::JournalArea;
use std::cell::{Cell, RefCell};
use std::ops::{Deref, DerefMut};
use std::rc::Rc;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use writeback::WriteBack;

/// Tunables of the transaction layer, set from mount options.
#[derive(Debug, Clone)]
pub struct JournalConfig {
    /// Seconds between background commits (`-o commit=`), or write-back
    /// passes when unjournaled.
    pub commit_interval: Duration,
    /// Every handle stop is synchronous (`-o sync`).
    pub sync_all: bool,
}

impl Default for JournalConfig {
    fn default() -> Self {
        JournalConfig {
            commit_interval: Duration::from_secs(5),
            sync_all: false,
        }
    }
}

enum Mode {
    WriteBack(WriteBack),
    Jbd2(Arc<Jbd2>),
}

pub struct Journal {
    cache: Arc<BufferCache>,
    mode: Mode,
    config: JournalConfig,
    /// Set when the filesystem is mounted read-only or turned read-only after
    /// an error: no handle may start.
    read_only: AtomicBool,
    /// Why nothing more may be written, once the journal aborted (a panic
    /// in the engine; a JBD2 commit failure also lives in its own state).
    abort_reason: parking_lot::Mutex<Option<String>>,
}

/// Statistics for `jext4` status reports.
#[derive(Debug, Default, Clone, Copy)]
pub struct JournalStats {
    /// Buffers waiting for write-back (unjournaled mode).
    pub dirty_buffers: u64,
    pub jbd2: Option<Jbd2Stats>,
}

impl Journal {
    /// An unjournaled transaction layer over `cache`.
    pub fn write_back(
        cache: Arc<BufferCache>,
        config: JournalConfig,
        read_only: bool,
    ) -> Arc<Self> {
        let journal = Arc::new(Journal {
            mode: Mode::WriteBack(WriteBack::new(Arc::clone(&cache))),
            cache,
            config,
            read_only: AtomicBool::new(read_only),
            abort_reason: parking_lot::Mutex::new(None),
        });
        if !read_only {
            WriteBack::start_flusher(&journal);
        }
        journal
    }

    /// A JBD2 journal in `area` (already recovered: the log must be empty).
    /// Home writes of metadata go through `guard`.
    pub fn jbd2(
        cache: Arc<BufferCache>,
        area: JournalArea,
        guard: Arc<GuardedDevice>,
        config: JournalConfig,
        options: &Jbd2Options,
    ) -> Result<Arc<Self>> {
        let jbd2 = Jbd2::load(area, Arc::clone(&cache), guard, options)?;
        Ok(Arc::new(Journal {
            mode: Mode::Jbd2(jbd2),
            cache,
            config,
            read_only: AtomicBool::new(false),
            abort_reason: parking_lot::Mutex::new(None),
        }))
    }

    fn write_back_mode(&self) -> Option<&WriteBack> {
        match &self.mode {
            Mode::WriteBack(write_back) => Some(write_back),
            Mode::Jbd2(_) => None,
        }
    }

    pub fn cache(&self) -> &Arc<BufferCache> {
        &self.cache
    }

    /// The largest transaction, in log blocks (None unjournaled): a
    /// handle needing more waits for an empty one.
    pub fn max_transaction_blocks(&self) -> Option<u32> {
        match &self.mode {
            Mode::Jbd2(jbd2) => Some(jbd2.max_transaction),
            Mode::WriteBack(_) => None,
        }
    }

    pub fn is_journaled(&self) -> bool {
        matches!(self.mode, Mode::Jbd2(_))
    }

    /// Read-only as mounted, after an error, or because the journal
    /// aborted.
    pub fn is_read_only(&self) -> bool {
        self.read_only.load(Ordering::Acquire)
            || matches!(&self.mode, Mode::Jbd2(jbd2) if jbd2.is_aborted())
    }

    /// Why the journal aborted, if it did: nothing more is written and the
    /// log on disk stays as the last commit left it (replayable).
    pub fn abort_reason(&self) -> Option<String> {
        if let Some(reason) = self.abort_reason.lock().clone() {
            return Some(reason);
        }
        match &self.mode {
            Mode::Jbd2(jbd2) => jbd2.error(),
            Mode::WriteBack(_) => None,
        }
    }

    /// Stop writing for good (the kernel's jbd2_journal_abort): every
    /// handle and every waiter for a commit fails from now on, and unmount
    /// writes nothing. For a state the engine can no longer trust — a
    /// panic part-way through an operation — where committing what is in
    /// memory could write a half-made change.
    pub fn abort(&self, reason: &str) {
        self.read_only.store(true, Ordering::Release);
        {
            let mut stored = self.abort_reason.lock();
            if stored.is_some() {
                return;
            }
            *stored = Some(reason.to_string());
        }
        match &self.mode {
            Mode::Jbd2(jbd2) => jbd2.abort_with(reason),
            Mode::WriteBack(write_back) => {
                tracing::error!(reason, "write-back stopped: nothing more is written");
                write_back.stop_flusher();
            }
        }
    }

    fn check_not_aborted(&self) -> Result<()> {
        match self.abort_reason.lock().as_ref() {
            Some(reason) => Err(Error::Io(std::io::Error::other(format!(
                "journal aborted: {reason}"
            )))),
            None => Ok(()),
        }
    }

    /// Refuse every further change (errors=remount-ro). What was accepted
    /// before is still committed and written at unmount: it is consistent
    /// with itself; the damage that triggered this was found on read.
    pub fn set_read_only(&self) {
        self.read_only.store(true, Ordering::Release);
    }

    /// Open a handle for an operation that will dirty at most `credits`
    /// metadata blocks. On a thread that already holds a handle of this
    /// journal the new handle nests in it (the kernel's `h_ref`): it joins
    /// the same transaction without reserving or waiting, and only the
    /// outermost `stop` leaves the transaction (and commits if any level
    /// asked for sync).
    pub fn start(&self, credits: u32) -> Result<Handle<'_>> {
        if let Some(state) = current_handle(self) {
            state.depth.set(state.depth.get() + 1);
            return Ok(Handle {
                journal: self,
                state,
                stopped: false,
            });
        }
        if self.is_read_only() {
            return Err(Error::ReadOnly);
        }
        debug_assert!(credits > 0, "a handle that changes nothing needs no handle");
        // The outermost handle ranks before every lock: starting one may
        // wait for a lock-down, which waits for every handle to stop.
        let held = Held::acquire(Rank::Handle, self.id());
        let transaction = match &self.mode {
            Mode::WriteBack(_) => None,
            Mode::Jbd2(jbd2) => Some(jbd2.start_handle(credits)?),
        };
        let state = Rc::new(HandleState {
            journal_id: self.id(),
            id: NEXT_HANDLE_ID.fetch_add(1, Ordering::Relaxed),
            transaction,
            credits,
            dirtied: Cell::new(0),
            changed: Cell::new(false),
            sync: Cell::new(self.config.sync_all),
            depth: Cell::new(1),
            held: RefCell::new(Some(held)),
        });
        CURRENT_HANDLES.with(|handles| handles.borrow_mut().push(Rc::clone(&state)));
        Ok(Handle {
            journal: self,
            state,
            stopped: false,
        })
    }

    fn id(&self) -> usize {
        self as *const Journal as usize
    }

    /// The transaction new handles join now (0 when unjournaled).
    pub fn running_tid(&self) -> u32 {
        match &self.mode {
            Mode::WriteBack(_) => 0,
            Mode::Jbd2(jbd2) => jbd2.running_tid(),
        }
    }

    /// Make transaction `tid` durable (fsync): commit it if it is running,
    /// wait for it if it is committing. Unjournaled: write everything back.
    /// Returns whether the device was flushed after this call began (a
    /// commit's final flush, or write-back's): then everything written
    /// before the call is durable too, file data included.
    pub fn commit_and_wait(&self, tid: u32) -> Result<bool> {
        match &self.mode {
            Mode::WriteBack(_) => self.sync().map(|()| true),
            Mode::Jbd2(jbd2) => jbd2.commit_and_wait(tid),
        }
    }

    /// Wait until transaction `tid` is durable, or fast commits of it may
    /// be queued (`fc_commit.rs`). Unjournaled, or without a fast-commit
    /// area: refused.
    pub fn begin_fast_commit(&self, tid: u32) -> Result<FastCommitBegin<'_>> {
        match &self.mode {
            Mode::WriteBack(_) => Ok(FastCommitBegin::Refused),
            Mode::Jbd2(jbd2) => jbd2.begin_fast_commit(tid),
        }
    }

    /// Make the completed writes in device byte `ranges` durable, without
    /// writing back other dirty data where the device allows it (a barrier
    /// carried by the zero block after the fast-commit area); a flush of
    /// everything where this mount writes no fast commits.
    pub fn barrier(&self, ranges: &[(u64, u64)]) -> Result<()> {
        match &self.mode {
            Mode::Jbd2(jbd2) if jbd2.fast_commit_area().is_some() => jbd2.barrier(ranges),
            _ => self.flush_data(),
        }
    }

    /// The journal's fast-commit area `[first, end)` when this mount writes
    /// fast commits.
    pub fn fast_commit_area(&self) -> Option<(u32, u32)> {
        match &self.mode {
            Mode::WriteBack(_) => None,
            Mode::Jbd2(jbd2) => jbd2.fast_commit_area(),
        }
    }

    /// Make everything accepted so far durable, file data included (sync,
    /// syncfs): one commit, or one flush when there is nothing to commit.
    pub fn sync(&self) -> Result<()> {
        self.check_not_aborted()?;
        match &self.mode {
            Mode::WriteBack(write_back) => {
                write_back.write_all()?;
                self.cache.flush_device()
            }
            Mode::Jbd2(jbd2) => {
                if !jbd2.commit_and_wait(jbd2.running_tid())? {
                    self.flush_data()?;
                }
                Ok(())
            }
        }
    }

    /// Flush the device without committing: file data written in place
    /// becomes durable (fdatasync of an overwrite).
    pub fn flush_data(&self) -> Result<()> {
        self.cache.flush_device()
    }

    /// The first range overlapping `start..start+len` of blocks freed by
    /// a transaction that is not durable yet (a checkpoint pass's blocks
    /// are `checkpoint_writing_overlap`).
    pub fn freed_not_durable_overlap(&self, start: u64, len: u64) -> Option<(u64, u64)> {
        match &self.mode {
            Mode::WriteBack(_) => None,
            Mode::Jbd2(jbd2) => jbd2.freed_not_durable_overlap(start, len),
        }
    }

    /// The newest transaction whose freed blocks are allocatable again:
    /// blocks freed in it or before may be handed out (unjournaled, freed
    /// blocks are allocatable at once: `None`).
    pub fn frees_durable_tid(&self) -> Option<u32> {
        match &self.mode {
            Mode::WriteBack(_) => None,
            Mode::Jbd2(jbd2) => Some(jbd2.frees_durable_tid.load(Ordering::Acquire)),
        }
    }

    /// The first block in `start..start+len` a checkpoint pass is writing
    /// home (not allocatable until the pass ends).
    pub fn checkpoint_writing_overlap(&self, start: u64, len: u64) -> Option<(u64, u64)> {
        match &self.mode {
            Mode::WriteBack(_) => None,
            Mode::Jbd2(jbd2) => jbd2.checkpoint_writing_overlap(start, len),
        }
    }

    pub fn has_checkpoint_writing(&self) -> bool {
        match &self.mode {
            Mode::WriteBack(_) => false,
            Mode::Jbd2(jbd2) => jbd2.has_checkpoint_writing(),
        }
    }

    pub fn has_pending_frees(&self) -> bool {
        match &self.mode {
            Mode::WriteBack(_) => false,
            Mode::Jbd2(jbd2) => jbd2.has_pending_frees(),
        }
    }

    /// Called after handles stop: keep pinned memory within the cache bound.
    fn relieve_pressure(&self) -> Result<()> {
        if !self.cache.over_capacity() || self.abort_reason.lock().is_some() {
            return Ok(());
        }
        match &self.mode {
            Mode::WriteBack(write_back) => write_back.write_all(),
            Mode::Jbd2(jbd2) => {
                jbd2.request_checkpoint();
                Ok(())
            }
        }
    }

    /// Final write-out at unmount: commit, checkpoint, mark the journal
    /// empty; stop the background thread.
    pub fn shutdown(&self) -> Result<()> {
        match &self.mode {
            Mode::WriteBack(write_back) => {
                write_back.stop_flusher();
                self.check_not_aborted()?;
                if !self.is_read_only() || write_back.has_dirty() {
                    write_back.write_all()?;
                    self.cache.flush_device()?;
                }
                Ok(())
            }
            Mode::Jbd2(jbd2) => jbd2.shutdown(),
        }
    }

    /// Report every handle's logical changes (`Handle::note`) and every
    /// full commit to `observer` from now on. Only a JBD2 journal has
    /// observers: without a log there is nothing for them to replace.
    pub fn set_change_observer(&self, observer: Arc<dyn ChangeObserver>) {
        if let Mode::Jbd2(jbd2) = &self.mode {
            let fresh = jbd2.observer.set(observer).is_ok();
            debug_assert!(fresh, "one change observer per journal");
        }
    }

    /// Have `hook` write its summary into every transaction from now on.
    pub fn set_commit_hook(&self, hook: Arc<dyn CommitHook>) {
        let fresh = match &self.mode {
            Mode::Jbd2(jbd2) => jbd2.commit_hook.set(hook).is_ok(),
            Mode::WriteBack(write_back) => write_back.commit_hook.set(hook).is_ok(),
        };
        debug_assert!(fresh, "one commit hook per journal");
    }

    pub fn stats(&self) -> JournalStats {
        match &self.mode {
            Mode::WriteBack(write_back) => JournalStats {
                dirty_buffers: write_back.dirty_count() as u64,
                jbd2: None,
            },
            Mode::Jbd2(jbd2) => JournalStats {
                dirty_buffers: 0,
                jbd2: Some(jbd2.stats()),
            },
        }
    }
}

/// A summary the filesystem keeps outside the transactions (ext4's free
/// block and inode counters) and writes into each transaction as it is
/// committed, so that operations stop sharing one dirty block for it.
pub trait CommitHook: Send + Sync {
    /// Called once per commit at lock-down — every handle of the
    /// transaction has stopped and none of the next one has started, so
    /// the summary agrees exactly with the transaction's blocks — with the
    /// journal's state lock held; unjournaled, before each write-back pass.
    fn before_commit(&self, access: &CommitAccess<'_>);
}

/// Changes a `CommitHook` makes, as part of the transaction being
/// committed (or of the write-back pass about to run).
pub struct CommitAccess<'a> {
    target: AccessTarget<'a>,
}

enum AccessTarget<'a> {
    Jbd2 {
        jbd2: &'a Jbd2,
        transaction: &'a Transaction,
    },
    WriteBack(&'a WriteBack),
}

impl<'a> CommitAccess<'a> {
    fn jbd2(jbd2: &'a Jbd2, transaction: &'a Transaction) -> Self {
        CommitAccess {
            target: AccessTarget::Jbd2 { jbd2, transaction },
        }
    }

    fn write_back(write_back: &'a WriteBack) -> Self {
        CommitAccess {
            target: AccessTarget::WriteBack(write_back),
        }
    }

    /// Change `buffer`'s bytes in the transaction being committed.
    pub fn change(&self, buffer: &Arc<Buffer>, change: impl FnOnce(&mut [u8])) {
        match &self.target {
            AccessTarget::Jbd2 { jbd2, transaction } => {
                jbd2.register(transaction, buffer);
                change(&mut buffer.write_unjournaled());
            }
            AccessTarget::WriteBack(write_back) => {
                change(&mut buffer.write_unjournaled());
                write_back.mark_dirty(buffer);
            }
        }
    }
}

/// Numbers of outermost handles, unique per process.
static NEXT_HANDLE_ID: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

/// What the nested levels of one operation's handle share.
struct HandleState {
    journal_id: usize,
    /// This operation's number, for the change observer.
    id: u64,
    transaction: Option<Arc<Transaction>>,
    credits: u32,
    dirtied: Cell<u32>,
    /// Some level asked for write access to a block or freed blocks: the
    /// operation may have changed the filesystem (an error after this
    /// leaves half of it in the transaction: `Handle::changed`).
    changed: Cell<bool>,
    sync: Cell<bool>,
    /// Levels started and not yet stopped.
    depth: Cell<u32>,
    /// The handle's place in the lock ranking, until the outermost stop.
    held: RefCell<Option<Held>>,
}

thread_local! {
    /// The outermost handle each journal has open on this thread.
    static CURRENT_HANDLES: RefCell<Vec<Rc<HandleState>>> = const { RefCell::new(Vec::new()) };
}

fn current_handle(journal: &Journal) -> Option<Rc<HandleState>> {
    CURRENT_HANDLES.with(|handles| {
        handles
            .borrow()
            .iter()
            .find(|state| state.journal_id == journal.id())
            .cloned()
    })
}

/// One operation's membership in the running transaction. Not `Send`: an
/// operation runs on one thread.
pub struct Handle<'j> {
    journal: &'j Journal,
    state: Rc<HandleState>,
    stopped: bool,
}

impl<'j> Handle<'j> {
    /// The number of this handle's operation (shared by its nested
    /// levels; the change observer's name for it).
    pub fn id(&self) -> u64 {
        self.state.id
    }

    /// The transaction this handle belongs to (0 when unjournaled).
    pub fn tid(&self) -> u32 {
        self.state
            .transaction
            .as_ref()
            .map_or(0, |transaction| transaction.tid)
    }

    /// Exclusive access to an existing metadata block. With JBD2 the block
    /// joins the transaction now (O(1), no copy); unjournaled, it is marked
    /// dirty when the guard drops.
    pub fn get_write_access<'h>(&'h self, buffer: &'h Arc<Buffer>) -> Result<MetaGuard<'h, 'j>> {
        self.state.changed.set(true);
        if let (Mode::Jbd2(jbd2), Some(transaction)) = (&self.journal.mode, &self.state.transaction)
            && jbd2.register(transaction, buffer)
        {
            self.count_new_block();
        }
        Ok(MetaGuard {
            handle: self,
            buffer,
            data: buffer.write_unjournaled(),
        })
    }

    /// Exclusive access to a block that has just been allocated as metadata;
    /// its old content is irrelevant and the caller rewrites all of it.
    pub fn get_create_access<'h>(&'h self, buffer: &'h Arc<Buffer>) -> Result<MetaGuard<'h, 'j>> {
        self.get_write_access(buffer)
    }

    /// `count` blocks from `start` were freed. Metadata blocks are revoked
    /// and forgotten (a pending write must never land on their next owner's
    /// data); no freed block is handed out again before this transaction is
    /// durable.
    pub fn free_blocks(&self, start: u64, count: u64, metadata: bool) {
        self.state.changed.set(true);
        match (&self.journal.mode, &self.state.transaction) {
            (Mode::Jbd2(jbd2), Some(transaction)) => {
                jbd2.free_blocks_in(transaction, start, count, metadata)
            }
            (Mode::WriteBack(write_back), _) if metadata => {
                for block in start..start + count {
                    write_back.forget(block);
                    self.journal.cache.forget(block);
                }
            }
            _ => {}
        }
    }

    /// Report a logical change this operation made (see `change.rs`): the
    /// one place format algorithms and the engine tell the journal's
    /// observer what changed, tagged with this handle's transaction.
    pub fn note(&self, change: Change<'_>) {
        if let (Mode::Jbd2(jbd2), Some(transaction)) = (&self.journal.mode, &self.state.transaction)
            && let Some(observer) = jbd2.observer.get()
        {
            observer.changed(self.state.id, transaction.tid, change);
        }
    }

    /// The operation must be durable when its outermost handle stops.
    pub fn set_sync(&self) {
        self.state.sync.set(true);
    }

    pub fn is_sync(&self) -> bool {
        self.state.sync.get()
    }

    /// Whether this operation (any of its levels) took write access to a
    /// block or freed blocks: if it now fails, its transaction may hold
    /// half of it.
    pub fn changed(&self) -> bool {
        self.state.changed.get()
    }

    /// How many handles of this operation are open (1 for the outermost).
    pub fn depth(&self) -> u32 {
        self.state.depth.get()
    }

    fn count_new_block(&self) {
        let dirtied = self.state.dirtied.get() + 1;
        self.state.dirtied.set(dirtied);
        if dirtied <= self.state.credits
            && let Some(transaction) = &self.state.transaction
        {
            // One reserved credit became a registered block: the
            // transaction's size estimate counts it once, not twice.
            let outstanding = transaction
                .outstanding
                .fetch_sub(1, std::sync::atomic::Ordering::AcqRel);
            debug_assert!(outstanding > 0, "a credit used that no handle reserved");
        }
        if dirtied == self.state.credits + 1 {
            // The transaction's size estimate counted this handle's
            // credits; an overrun eats into the log's safety margin.
            tracing::debug!(
                credits = self.state.credits,
                "handle dirtied more blocks than it reserved"
            );
        }
    }

    fn dirty_metadata(&self, buffer: &Arc<Buffer>) {
        if let Mode::WriteBack(write_back) = &self.journal.mode {
            self.count_new_block();
            write_back.mark_dirty(buffer);
        }
    }

    /// Close this level. Returns true when it was the outermost: the
    /// operation has left its transaction.
    fn leave(&mut self) -> bool {
        if std::mem::replace(&mut self.stopped, true) {
            return false;
        }
        let depth = self.state.depth.get() - 1;
        self.state.depth.set(depth);
        if depth > 0 {
            return false;
        }
        let id = self.state.journal_id;
        CURRENT_HANDLES.with(|handles| handles.borrow_mut().retain(|state| state.journal_id != id));
        drop(self.state.held.borrow_mut().take());
        if let (Mode::Jbd2(jbd2), Some(transaction)) = (&self.journal.mode, &self.state.transaction)
        {
            if let Some(observer) = jbd2.observer.get() {
                observer.stopped(self.state.id);
            }
            // Return the credits this operation reserved and did not use.
            let unused = self.state.credits.saturating_sub(self.state.dirtied.get());
            jbd2.stop_handle(transaction, unused);
        }
        true
    }

    /// Close the handle; the outermost one commits and waits if any level
    /// flagged sync.
    pub fn stop(mut self) -> Result<()> {
        let sync = self.state.sync.get();
        let tid = self.tid();
        if !self.leave() {
            return Ok(());
        }
        if sync {
            self.journal.commit_and_wait(tid)?;
        }
        self.journal.relieve_pressure()
    }
}

impl Drop for Handle<'_> {
    /// A handle abandoned by an error path or a panic still leaves its
    /// transaction, or the next commit would wait for it forever. A panic
    /// part-way through an operation aborts the journal first: the
    /// transaction may hold half of the change, and must never commit.
    fn drop(&mut self) {
        if !self.stopped && std::thread::panicking() {
            self.journal
                .abort("a panic interrupted an operation inside its transaction");
        }
        self.leave();
    }
}

/// Write access to one metadata block inside a handle.
pub struct MetaGuard<'h, 'j> {
    handle: &'h Handle<'j>,
    buffer: &'h Arc<Buffer>,
    data: RwLockWriteGuard<'h, Box<[u8]>>,
}

impl MetaGuard<'_, '_> {
    pub fn block(&self) -> u64 {
        self.buffer.block()
    }
}

impl Deref for MetaGuard<'_, '_> {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.data
    }
}

impl DerefMut for MetaGuard<'_, '_> {
    fn deref_mut(&mut self) -> &mut [u8] {
        &mut self.data
    }
}

impl Drop for MetaGuard<'_, '_> {
    fn drop(&mut self) {
        self.handle.dirty_metadata(self.buffer);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dev::MemoryDevice;

    #[test]
    fn nested_handles_share_one_transaction_and_the_outermost_syncs() {
        let cache = Arc::new(BufferCache::new(
            Arc::new(MemoryDevice::new(1 << 20)),
            1024,
            1 << 20,
        ));
        let journal = Journal::write_back(cache, JournalConfig::default(), false);
        let outer = journal.start(4).unwrap();
        assert_eq!(outer.depth(), 1);
        {
            let inner = journal.start(2).unwrap();
            assert_eq!(inner.depth(), 2);
            inner.set_sync();
            inner.stop().unwrap();
        }
        // The inner level's sync request belongs to the whole operation.
        assert!(outer.is_sync());
        assert_eq!(outer.depth(), 1);
        outer.stop().unwrap();
        // A new operation starts a fresh, unnested handle.
        let next = journal.start(1).unwrap();
        assert_eq!(next.depth(), 1);
        assert!(!next.is_sync());
        drop(next);
        let after_drop = journal.start(1).unwrap();
        assert_eq!(
            after_drop.depth(),
            1,
            "a dropped handle leaves no level behind"
        );
        after_drop.stop().unwrap();
        journal.shutdown().unwrap();
    }
}
