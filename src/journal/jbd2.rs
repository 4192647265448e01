//! JBD2: transactions, handles, buffer registration, the commit thread
//! that drives commit (`commit.rs`), and the checkpoint thread
//! (`checkpoint.rs`): a commit, and so an fsync, never waits behind a
//! checkpoint's home writes; only a handle that finds the log truly full
//! waits for the checkpoint to free space.
//!
//! Transaction states, as in the kernel:
//! - RUNNING: handles join it (`start`) and register buffers.
//! - LOCKED: the commit thread wants it; new handles wait until its
//!   in-flight handles (`updates`) drain, which takes as long as the
//!   operations already inside it, never any I/O.
//! - COMMITTING: swapped out at lock-down, a new RUNNING transaction opens
//!   at once; the commit thread captures each registered buffer and writes
//!   descriptors, blocks, revokes, then the commit block.
//! - CHECKPOINT: committed; its buffers wait to be written home before the
//!   log space they use can be reused.
//!
//! Dirtying is O(1) and copies nothing: `register` records the buffer in
//! the running transaction once (the buffer's `JournalHead::running` says
//! it is there already). The log copy is taken when the commit captures the
//! buffer after lock-down (the transaction is quiescent then). Only when a
//! handle of the new running transaction asks for write access to a buffer
//! the committing transaction has not captured yet is a frozen copy made
//! for the commit first — once per buffer per commit, off the common path.
//!
//! Blocks freed in a transaction (data or metadata) are not handed out
//! again until that transaction is durable: otherwise a crash could leave
//! the old owner pointing at the new owner's bytes. Freed metadata blocks
//! are also revoked, so replay never writes an older logged copy over them.
//!
//! Locks (ranked in `crate::lock`): `State` [JournalState] → a buffer's
//! `journal` head → the buffer's bytes [Buffer]. `Transaction::buffers` and
//! `revokes`, the pending-free map, the write-ahead guard and the change
//! observer's own lock are leaves (the observer is told of a commit under
//! `State`). No lock is held across I/O except by the journal's threads on
//! their own state.

use super::change::ChangeObserver;
use super::format::{JournalSuperblock, LogFormat, LogLayout, incompat};
use super::recovery::JournalArea;
use super::waiters::{self, Waiters};
use crate::cache::{Buffer, BufferCache};
use crate::dev::guard::GuardedDevice;
use crate::error::{Error, Location, Result};
use crate::format::fast_commit::AreaBuffer;
use crate::lock::{self, Condvar, MutexGuard, Rank};
use parking_lot::Mutex;
use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock, Weak};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Blocks of log space never handed out, so that a commit that slightly
/// overruns its estimate still fits (the kernel keeps a similar margin).
pub(crate) const LOG_RESERVE_BLOCKS: u32 = 32;

/// The first range of `ranges` (start → (end, tid), never overlapping one
/// another) that overlaps `start..end`: one that starts at or before
/// `start` and reaches past it, else the first one starting inside.
fn first_overlap(ranges: &BTreeMap<u64, (u64, u32)>, start: u64, end: u64) -> Option<(u64, u64)> {
    if let Some((&range_start, &(range_end, _))) = ranges.range(..=start).next_back()
        && range_end > start
    {
        return Some((range_start, range_end));
    }
    ranges
        .range(start..end)
        .next()
        .map(|(&range_start, &(range_end, _))| (range_start, range_end))
}

pub(crate) struct Transaction {
    pub tid: u32,
    /// Buffers registered, each once (or again after a forget and a new
    /// allocation: the lock-down sweep skips duplicates).
    pub buffers: Mutex<Vec<Arc<Buffer>>>,
    /// Metadata blocks freed in this transaction: revoke records.
    pub revokes: Mutex<Vec<u64>>,
    /// Handles inside the transaction (`t_updates`).
    pub updates: AtomicU32,
    /// Credits reserved by handles still running.
    pub outstanding: AtomicU32,
    /// Distinct buffers registered (`buffers.len()` without the lock).
    pub registered: AtomicU32,
    pub created: Instant,
}

impl Transaction {
    pub(crate) fn new(tid: u32) -> Arc<Self> {
        Arc::new(Transaction {
            tid,
            buffers: Mutex::new(Vec::new()),
            revokes: Mutex::new(Vec::new()),
            updates: AtomicU32::new(0),
            outstanding: AtomicU32::new(0),
            registered: AtomicU32::new(0),
            created: Instant::now(),
        })
    }

    pub fn is_empty(&self) -> bool {
        self.registered.load(Ordering::Acquire) == 0 && self.revokes.lock().is_empty()
    }
}

/// A committed transaction whose buffers are not all home yet.
pub(crate) struct Checkpoint {
    pub tid: u32,
    /// Log position of its first block: the tail while it is the oldest.
    pub start: u32,
    pub buffers: Vec<Arc<Buffer>>,
}

pub(crate) struct State {
    pub running: Arc<Transaction>,
    /// The running transaction is locked down: new handles wait.
    pub locked: bool,
    /// Log blocks the committing transaction will use (0 if none).
    pub committing_blocks: u32,
    pub committing_tid: Option<u32>,
    /// Newest transaction whose commit block is durable.
    pub committed_tid: u32,
    /// Someone waits for this transaction to commit.
    pub commit_request: Option<u32>,
    /// Someone needs log space or memory: the checkpoint thread should run.
    pub checkpoint_request: bool,
    /// [JournalState; popped only by a checkpoint pass, after the moved
    /// tail is durable] Committed transactions, oldest first.
    pub checkpoints: VecDeque<Checkpoint>,
    /// Next log position to write.
    pub head: u32,
    /// The journal superblock on disk says the log is empty (s_start = 0):
    /// it must be pointed at the log before the next commit is written.
    pub sb_empty_on_disk: bool,
    pub stopping: bool,
    /// The checkpoint thread should finish its pass and exit (unmount
    /// stops it before the commit thread's final commit and checkpoint).
    pub checkpoint_stopping: bool,
    /// Set when the journal aborted: every later handle fails.
    pub error: Option<String>,
    /// Fast-commit tickets alive (`fc_commit.rs`): no full commit may lock
    /// the running transaction down until every one has dropped.
    pub fc_active: u32,
    /// A full commit waits to lock down: no new ticket is handed out.
    pub fc_full_wanted: bool,
    /// Units of the fast-commit area used since the last full commit
    /// (blocks; ByteLog: fast commits).
    pub fc_next: u32,
    /// Directory transactions queued for the next fast commit, in order.
    pub fc_queue: Vec<super::fc_commit::QueuedFastCommit>,
    /// The number of the last one queued, and of the last one durable (a
    /// queued commit is durable once this reaches its number).
    pub fc_queued_seq: u64,
    pub fc_durable_seq: u64,
    /// A group is being written (one at a time, in queue order).
    pub fc_writing: bool,
    /// Queued commits that were not made durable, and why (kept for every
    /// waiter until the area is retired).
    pub fc_refused: BTreeMap<u64, super::fc_commit::Refusal>,
    /// A group was refused: every later one of the transaction is too.
    pub fc_refusing: bool,
    /// `commit_and_wait` callers, by the tid `committed_tid` must reach.
    pub commit_waiters: Waiters,
    /// Fast-commit waiters (`FastCommitTicket::wait`), by queue number.
    pub fc_waiters: Waiters,
}

impl State {
    pub fn commit_waiters(&mut self) -> &mut Waiters {
        &mut self.commit_waiters
    }

    pub fn fc_waiters(&mut self) -> &mut Waiters {
        &mut self.fc_waiters
    }

    /// Wake the commit waiters whose transaction is now durable.
    pub fn wake_committed(&self) {
        let committed = self.committed_tid;
        self.commit_waiters
            .wake_where(|target| !super::format::tid_gt(target as u32, committed));
    }
}

impl State {
    /// Fails once the journal has aborted: nothing more may be started,
    /// committed or waited for.
    pub fn check_aborted(&self) -> Result<()> {
        match &self.error {
            Some(error) => Err(Error::Io(std::io::Error::other(format!(
                "journal aborted: {error}"
            )))),
            None => Ok(()),
        }
    }
}

#[derive(Debug, Default, Clone, Copy)]
pub struct Jbd2Stats {
    pub commits: u64,
    pub blocks_logged: u64,
    pub revokes_logged: u64,
    pub frozen_copies: u64,
    pub checkpoints: u64,
    pub blocks_checkpointed: u64,
    /// Rounds of the commit thread (it wakes about once per commit
    /// interval when idle).
    pub thread_rounds: u64,
    pub guard_violations: u64,
    /// Fast commits written (writes of the area), the directory
    /// transactions they held (compound degree: members per fast commit),
    /// the area bytes, record bytes and flushes (barriers) they took.
    pub fast_commits: u64,
    pub fast_commit_members: u64,
    pub fast_commit_bytes: u64,
    pub fast_commit_record_bytes: u64,
    pub fast_commit_flushes: u64,
    /// ByteLog persists (`-o bytelog`), and how they are made.
    pub bytelog_persists: u64,
    pub bytelog_method: Option<crate::dev::PersistMethod>,
}

pub(crate) struct Jbd2 {
    pub area: JournalArea,
    pub layout: LogLayout,
    pub format: LogFormat,
    pub uuid: [u8; 16],
    pub cache: Arc<BufferCache>,
    pub guard: Arc<GuardedDevice>,
    pub sb: Mutex<JournalSuperblock>,
    pub state: lock::Mutex<State>,
    /// The commit thread sleeps here.
    pub wake_commit: Condvar,
    /// The checkpoint thread sleeps here.
    pub wake_checkpoint: Condvar,
    /// [Checkpoint] One checkpoint pass at a time: the checkpoint thread's,
    /// or the commit thread's final one at unmount.
    pub checkpointing: lock::Mutex<()>,
    /// [leaf] Blocks a checkpoint pass is writing home, sorted: not
    /// allocatable until the pass ends, even if a newer transaction freed
    /// them meanwhile (the pass's copy is older than their new owner's).
    pub checkpoint_writing: Mutex<Vec<u64>>,
    /// Handles waiting to start, fast commits waiting for a full commit
    /// to end, and the checkpoint thread sleep here (fsyncs waiting for
    /// their commit sleep in `State::commit_waiters`/`fc_waiters`).
    pub changed: Condvar,
    /// The commit thread sleeps here while handles or fast commits drain
    /// out of the transaction it locks down.
    pub drained: Condvar,
    /// Largest transaction, in log blocks (a quarter of the log).
    pub max_transaction: u32,
    pub commit_interval: Duration,
    pub async_commit: bool,
    /// This mount writes fast commits (the area is in `layout`).
    pub fast_commit: bool,
    /// Freed ranges not yet allocatable: start → (end, freeing tid).
    pub pending_free: Mutex<BTreeMap<u64, (u64, u32)>>,
    /// The newest transaction whose freed blocks are allocatable again
    /// (`committed_tid`, published after `pending_free` drops them), read
    /// without a lock by the allocator's per-group masks.
    pub frees_durable_tid: AtomicU32,
    thread: Mutex<Option<JoinHandle<()>>>,
    checkpoint_thread: Mutex<Option<JoinHandle<()>>>,
    /// Told of every handle's logical changes and every full commit.
    pub observer: OnceLock<Arc<dyn ChangeObserver>>,
    /// `state.error` is set (read without the state lock on every handle).
    aborted: AtomicBool,
    /// Writes the filesystem's summary into each transaction at lock-down.
    pub commit_hook: OnceLock<Arc<dyn super::CommitHook>>,
    pub commits: AtomicU64,
    pub blocks_logged: AtomicU64,
    pub revokes_logged: AtomicU64,
    pub frozen_copies: AtomicU64,
    pub checkpoints: AtomicU64,
    pub blocks_checkpointed: AtomicU64,
    pub thread_rounds: AtomicU64,
    pub fast_commits: AtomicU64,
    pub fast_commit_members: AtomicU64,
    pub fast_commit_bytes: AtomicU64,
    pub fast_commit_record_bytes: AtomicU64,
    pub fast_commit_flushes: AtomicU64,
    /// Fast commits go to a persistent-memory mapping (`-o bytelog`).
    pub bytelog: Option<super::bytelog::ByteLog>,
    /// [leaf] The memory the fast-commit group writer builds its blocks
    /// in, taken out while it writes (one writer at a time).
    pub fc_area_buffer: Mutex<AreaBuffer>,
}

/// Options for loading the journal.
#[derive(Debug, Clone)]
pub struct Jbd2Options {
    pub commit_interval: Duration,
    pub async_commit: bool,
    /// The filesystem has the 64bit feature (journal block numbers need it).
    pub fs_64bit: bool,
    pub metadata_csum: bool,
    /// Write fast commits: the journal gets the FAST_COMMIT feature (and
    /// its log ends before the area), as the kernel sets it at mount.
    pub fast_commit: bool,
    /// Write them through a persistent-memory mapping of the area
    /// (`journal::bytelog`); needs `fast_commit`.
    pub bytelog: bool,
}

impl Jbd2 {
    /// Take over an empty (recovered or cleanly unmounted) journal and
    /// start the commit thread. The journal superblock's features are set
    /// the way the kernel sets them for ext4 at mount.
    pub fn load(
        area: JournalArea,
        cache: Arc<BufferCache>,
        guard: Arc<GuardedDevice>,
        options: &Jbd2Options,
    ) -> Result<Arc<Jbd2>> {
        let (mut sb, _) = area.load_superblock()?;
        if sb.start != 0 {
            return Err(Error::corrupt(
                Location::Journal { block: 0 },
                "journal still holds transactions to replay",
            ));
        }
        if sb.version < 2 {
            return Err(Error::Unsupported(
                "version 1 journals cannot be written (tune2fs -O ^has_journal then -j)".into(),
            ));
        }
        let mut wanted = sb.feature_incompat | incompat::REVOKE;
        if options.fs_64bit {
            wanted |= incompat::BIT64;
        }
        if options.metadata_csum {
            // ext4 uses checksum v3 with metadata_csum, never v2 or v1.
            wanted = (wanted | incompat::CSUM_V3) & !incompat::CSUM_V2;
            sb.feature_compat &= !super::format::compat::CHECKSUM;
            sb.checksum_type = super::format::checksum_type::CRC32C;
        }
        if options.async_commit {
            wanted |= incompat::ASYNC_COMMIT;
        } else {
            wanted &= !incompat::ASYNC_COMMIT;
        }
        if options.fast_commit {
            wanted |= incompat::FAST_COMMIT;
        } else {
            wanted &= !incompat::FAST_COMMIT;
        }
        sb.feature_incompat = wanted;
        // The log's end moves with FAST_COMMIT: the area is carved off it.
        let mapped = area.blocks.len() as u64;
        sb.encode();
        let layout = match sb.check(area.fs_block_size, mapped) {
            Err(error) if wanted & incompat::FAST_COMMIT != 0 => {
                tracing::warn!(%error, "no fast commits: the journal has no room for their area");
                sb.feature_incompat &= !incompat::FAST_COMMIT;
                sb.encode();
                sb.check(area.fs_block_size, mapped)?
            }
            layout => layout?,
        };
        area.store_superblock(&mut sb)?;
        area.dev.flush()?;
        let fast_commit = options.fast_commit && layout.fast_commit.is_some();
        let bytelog = match layout.fast_commit.filter(|_| options.bytelog) {
            // The area's last block stays zero (`fc_commit.rs`).
            Some((first, end)) if fast_commit => {
                Some(super::bytelog::ByteLog::map(&area, first, end - 1)?)
            }
            _ if options.bytelog => {
                return Err(Error::Unsupported(
                    "bytelog needs fast commits, and the journal has no room for their area".into(),
                ));
            }
            _ => None,
        };
        let format = sb.log_format();
        let log_size = layout.last - layout.first;
        let first_tid = sb.sequence;
        let jbd2 = Arc::new(Jbd2 {
            uuid: sb.uuid,
            max_transaction: (log_size / 4).max(16),
            state: lock::Mutex::new(
                Rank::JournalState,
                State {
                    running: Transaction::new(sb.sequence),
                    locked: false,
                    committing_blocks: 0,
                    committing_tid: None,
                    committed_tid: sb.sequence.wrapping_sub(1),
                    commit_request: None,
                    checkpoint_request: false,
                    checkpoints: VecDeque::new(),
                    head: layout.first,
                    sb_empty_on_disk: true,
                    stopping: false,
                    checkpoint_stopping: false,
                    error: None,
                    fc_active: 0,
                    fc_full_wanted: false,
                    fc_next: 0,
                    fc_queue: Vec::new(),
                    fc_queued_seq: 0,
                    fc_durable_seq: 0,
                    fc_writing: false,
                    fc_refused: BTreeMap::new(),
                    fc_refusing: false,
                    commit_waiters: Waiters::default(),
                    fc_waiters: Waiters::default(),
                },
            ),
            sb: Mutex::new(sb),
            area,
            layout,
            format,
            cache,
            guard,
            wake_commit: Condvar::new(),
            wake_checkpoint: Condvar::new(),
            checkpointing: lock::Mutex::new(Rank::Checkpoint, ()),
            checkpoint_writing: Mutex::new(Vec::new()),
            changed: Condvar::new(),
            drained: Condvar::new(),
            commit_interval: options.commit_interval,
            async_commit: options.async_commit,
            fast_commit,
            pending_free: Mutex::new(BTreeMap::new()),
            frees_durable_tid: AtomicU32::new(first_tid.wrapping_sub(1)),
            thread: Mutex::new(None),
            checkpoint_thread: Mutex::new(None),
            observer: OnceLock::new(),
            aborted: AtomicBool::new(false),
            commit_hook: OnceLock::new(),
            commits: AtomicU64::new(0),
            blocks_logged: AtomicU64::new(0),
            revokes_logged: AtomicU64::new(0),
            frozen_copies: AtomicU64::new(0),
            checkpoints: AtomicU64::new(0),
            blocks_checkpointed: AtomicU64::new(0),
            thread_rounds: AtomicU64::new(0),
            fast_commits: AtomicU64::new(0),
            fast_commit_members: AtomicU64::new(0),
            fast_commit_bytes: AtomicU64::new(0),
            fast_commit_record_bytes: AtomicU64::new(0),
            fast_commit_flushes: AtomicU64::new(0),
            fc_area_buffer: Mutex::new(AreaBuffer::default()),
            bytelog,
        });
        jbd2.prepare_fast_commit_area()?;
        Jbd2::start_threads(&jbd2);
        Ok(jbd2)
    }

    pub fn log_size(&self) -> u32 {
        self.layout.last - self.layout.first
    }

    /// Tags one descriptor block holds.
    fn tags_per_descriptor(&self) -> u32 {
        let usable =
            self.format.block_size - super::format::HEADER_SIZE - self.format.tail_size() - 16;
        (usable / self.format.tag_bytes()).max(1) as u32
    }

    fn revokes_per_block(&self) -> u32 {
        let usable =
            self.format.block_size - super::format::REVOKE_HEADER_SIZE - self.format.tail_size();
        (usable / self.format.revoke_record_size()).max(1) as u32
    }

    /// Log blocks a transaction of `blocks` buffers and `revokes` revoke
    /// records occupies: descriptors, blocks, revoke blocks, commit block.
    pub fn log_blocks_for(&self, blocks: u32, revokes: u32) -> u32 {
        blocks
            + blocks.div_ceil(self.tags_per_descriptor())
            + revokes.div_ceil(self.revokes_per_block())
            + 1
    }

    /// Log positions between the tail (oldest live transaction) and the head.
    pub fn used_blocks(&self, state: &State) -> u32 {
        match state.checkpoints.front() {
            None => 0,
            Some(oldest) => (state.head + self.log_size() - oldest.start) % self.log_size(),
        }
    }

    pub fn free_blocks(&self, state: &State) -> u32 {
        self.log_size()
            .saturating_sub(self.used_blocks(state))
            .saturating_sub(state.committing_blocks)
            .saturating_sub(LOG_RESERVE_BLOCKS)
    }

    fn running_need(&self, state: &State, extra_credits: u32) -> u32 {
        let running = &state.running;
        let blocks = running.registered.load(Ordering::Acquire)
            + running.outstanding.load(Ordering::Acquire)
            + extra_credits;
        self.log_blocks_for(blocks, running.revokes.lock().len() as u32)
    }

    /// Join the running transaction with `credits` blocks of log space.
    pub fn start_handle(&self, credits: u32) -> Result<Arc<Transaction>> {
        let mut state = self.state.lock();
        loop {
            state.check_aborted()?;
            if state.locked {
                self.changed.wait(&mut state);
                continue;
            }
            let need = self.running_need(&state, credits);
            let running_has_work =
                !state.running.is_empty() || state.running.updates.load(Ordering::Acquire) > 0;
            if need > self.max_transaction && running_has_work {
                // Full: close this transaction to new handles and commit it.
                state.commit_request = Some(state.running.tid);
                self.wake_commit.notify_one();
                self.changed.wait(&mut state);
                continue;
            }
            if need > self.free_blocks(&state) {
                if need > self.log_size() / 2 {
                    return Err(Error::Unsupported(format!(
                        "an operation needs {need} journal blocks, more than the journal can hold"
                    )));
                }
                // Truly full: the only wait for a checkpoint.
                state.checkpoint_request = true;
                self.wake_checkpoint.notify_one();
                self.changed.wait(&mut state);
                continue;
            }
            let running = Arc::clone(&state.running);
            running.updates.fetch_add(1, Ordering::AcqRel);
            running.outstanding.fetch_add(credits, Ordering::AcqRel);
            return Ok(running);
        }
    }

    /// Leave the transaction; returns nothing to wait for.
    pub fn stop_handle(&self, transaction: &Transaction, credits: u32) {
        // Paired with `start_handle`: a handle returns what it reserved and
        // did not turn into registered blocks, and leaves once.
        let outstanding = transaction.outstanding.fetch_sub(credits, Ordering::AcqRel);
        debug_assert!(
            outstanding >= credits,
            "transaction {}: a handle returns {credits} credits, {outstanding} are outstanding",
            transaction.tid
        );
        let updates = transaction.updates.fetch_sub(1, Ordering::AcqRel);
        debug_assert!(
            updates > 0,
            "transaction {}: a handle left that had not joined",
            transaction.tid
        );
        if updates == 1 {
            // The commit thread may be waiting for the transaction to drain;
            // take the lock so the wakeup cannot slip between its check and
            // its wait.
            let _state = self.state.lock();
            self.drained.notify_all();
        }
    }

    /// Put `buffer` in `transaction` (once). If the committing transaction
    /// still has to capture it, freeze its current content for that commit
    /// first. Returns whether the buffer was new to the transaction.
    pub fn register(&self, transaction: &Transaction, buffer: &Arc<Buffer>) -> bool {
        let mut head = buffer.journal.lock();
        if head.running == Some(transaction.tid) {
            return false;
        }
        debug_assert!(
            head.running.is_none(),
            "buffer {} registered in two running transactions",
            buffer.block()
        );
        if head.committing.is_some() && head.frozen.is_none() {
            head.frozen = Some(buffer.read().clone());
            self.frozen_copies.fetch_add(1, Ordering::Relaxed);
        }
        head.running = Some(transaction.tid);
        head.freed = false;
        drop(head);
        transaction.buffers.lock().push(Arc::clone(buffer));
        transaction.registered.fetch_add(1, Ordering::AcqRel);
        self.guard.pin(buffer.block(), transaction.tid);
        true
    }

    /// `count` blocks from `start` were freed in `transaction`; metadata
    /// blocks are revoked and their buffers never written again.
    pub fn free_blocks_in(
        &self,
        transaction: &Transaction,
        start: u64,
        count: u64,
        metadata: bool,
    ) {
        if metadata {
            for block in start..start + count {
                if let Some(buffer) = self.cache.peek(block) {
                    let mut head = buffer.journal.lock();
                    if head.running != Some(transaction.tid) {
                        head.running = Some(transaction.tid);
                        drop(head);
                        transaction.buffers.lock().push(Arc::clone(&buffer));
                        head = buffer.journal.lock();
                    }
                    head.freed = true;
                }
                self.cache.forget(block);
                transaction.revokes.lock().push(block);
            }
        }
        self.pending_free
            .lock()
            .insert(start, (start + count, transaction.tid));
    }

    /// The first range overlapping `start..start+len` freed by a
    /// transaction not yet durable (only those: not a checkpoint pass's
    /// blocks, which a pass lists whole when it starts, including blocks
    /// freed and durable that it will not write).
    pub fn freed_not_durable_overlap(&self, start: u64, len: u64) -> Option<(u64, u64)> {
        first_overlap(&self.pending_free.lock(), start, start + len)
    }

    /// Whether a checkpoint pass is writing blocks home now: those are not
    /// allocatable until it ends, even if a newer transaction freed them
    /// and is durable.
    pub fn checkpoint_writing_overlap(&self, start: u64, len: u64) -> Option<(u64, u64)> {
        let writing = self.checkpoint_writing.lock();
        let index = writing.partition_point(|&block| block < start);
        writing
            .get(index)
            .filter(|&&block| block < start + len)
            .map(|&block| (block, block + 1))
    }

    pub fn has_checkpoint_writing(&self) -> bool {
        !self.checkpoint_writing.lock().is_empty()
    }

    /// Some free blocks are not allocatable yet: freed by a transaction
    /// that is not durable, or being written home by a checkpoint pass
    /// (the allocator's search skips both, so the allocator's "count says
    /// free, bitmap has none" corruption check must know of both).
    pub fn has_pending_frees(&self) -> bool {
        !self.pending_free.lock().is_empty() || !self.checkpoint_writing.lock().is_empty()
    }

    /// Wait until transaction `tid` is durable (starting its commit if it
    /// is the running one). If it is the running one and holds nothing,
    /// waits for the transaction committing before it, if any: a caller
    /// asking for the running transaction (sync, syncfs) needs everything
    /// accepted so far, which includes a commit already under way.
    ///
    /// Returns whether it waited for a commit: that commit's final flush
    /// came after everything written before this call, so the caller needs
    /// no flush of its own.
    pub fn commit_and_wait(&self, tid: u32) -> Result<bool> {
        let mut state = self.state.lock();
        let mut waited = false;
        loop {
            state.check_aborted()?;
            if !super::format::tid_gt(tid, state.committed_tid) {
                return Ok(waited);
            }
            if state.running.tid == tid
                && state.running.is_empty()
                && state.running.updates.load(Ordering::Acquire) == 0
            {
                if state.committing_tid.is_none() {
                    return Ok(waited);
                }
                debug_assert!(state.committing_tid != Some(tid));
                // finish_commit of the one before (or an abort) wakes us.
                waiters::sleep(
                    &mut state,
                    State::commit_waiters,
                    tid.wrapping_sub(1) as u64,
                );
                waited = true;
                continue;
            }
            // Already committing: wait for it. Asking again would make the
            // commit thread commit the next transaction too, for nobody.
            if state.committing_tid != Some(tid)
                && state
                    .commit_request
                    .is_none_or(|requested| super::format::tid_gt(tid, requested))
            {
                state.commit_request = Some(tid);
            }
            self.wake_commit.notify_one();
            waiters::sleep(&mut state, State::commit_waiters, tid as u64);
            waited = true;
        }
    }

    /// Ask the checkpoint thread to run (log or memory pressure).
    pub fn request_checkpoint(&self) {
        let mut state = self.state.lock();
        state.checkpoint_request = true;
        self.wake_checkpoint.notify_one();
    }

    pub fn running_tid(&self) -> u32 {
        self.state.lock().running.tid
    }

    /// Stop the checkpoint thread, then the commit thread after everything
    /// is committed and checkpointed, and mark the journal empty on disk.
    /// The checkpoint thread goes first: its pass may wait for a commit.
    pub fn shutdown(&self) -> Result<()> {
        {
            let mut state = self.state.lock();
            state.checkpoint_stopping = true;
            self.wake_checkpoint.notify_one();
        }
        join_unless_current(&self.checkpoint_thread);
        {
            let mut state = self.state.lock();
            state.stopping = true;
            self.wake_commit.notify_one();
        }
        join_unless_current(&self.thread);
        let state = self.state.lock();
        state.check_aborted()?;
        Ok(())
    }

    pub fn stats(&self) -> Jbd2Stats {
        Jbd2Stats {
            commits: self.commits.load(Ordering::Relaxed),
            blocks_logged: self.blocks_logged.load(Ordering::Relaxed),
            revokes_logged: self.revokes_logged.load(Ordering::Relaxed),
            frozen_copies: self.frozen_copies.load(Ordering::Relaxed),
            checkpoints: self.checkpoints.load(Ordering::Relaxed),
            blocks_checkpointed: self.blocks_checkpointed.load(Ordering::Relaxed),
            thread_rounds: self.thread_rounds.load(Ordering::Relaxed),
            guard_violations: self.guard.violations(),
            fast_commits: self.fast_commits.load(Ordering::Relaxed),
            fast_commit_members: self.fast_commit_members.load(Ordering::Relaxed),
            fast_commit_bytes: self.fast_commit_bytes.load(Ordering::Relaxed),
            fast_commit_record_bytes: self.fast_commit_record_bytes.load(Ordering::Relaxed),
            fast_commit_flushes: self.fast_commit_flushes.load(Ordering::Relaxed),
            bytelog_persists: self
                .bytelog
                .as_ref()
                .map_or(0, |bytelog| bytelog.persists.load(Ordering::Relaxed)),
            bytelog_method: self.bytelog.as_ref().map(|bytelog| bytelog.method()),
        }
    }

    /// Record a fatal journal error: every later handle and waiter fails,
    /// and nothing more is written (the log on disk stays replayable).
    pub fn abort(&self, state: &mut MutexGuard<'_, State>, error: &Error) {
        if state.error.is_none() {
            tracing::error!(%error, "journal aborted");
            state.error = Some(error.to_string());
            self.aborted.store(true, Ordering::Release);
        }
        self.changed.notify_all();
        self.drained.notify_all();
        state.commit_waiters.wake_all();
        state.fc_waiters.wake_all();
    }

    /// Abort from outside the commit path (`Journal::abort`): a panic or
    /// corruption met half way through an operation. The journal
    /// superblock records `s_errno` (-EIO, as `jbd2_journal_abort` from
    /// `ext4_handle_error` stores it), so that whoever replays the log
    /// next — jext4, the kernel, e2fsck — marks the filesystem as having
    /// errors. The log itself is left as the last commit wrote it.
    pub fn abort_with(&self, reason: &str) {
        {
            let mut state = self.state.lock();
            self.abort(
                &mut state,
                &Error::Io(std::io::Error::other(reason.to_string())),
            );
            self.wake_commit.notify_all();
        }
        if let Err(error) = self.record_errno(-libc::EIO) {
            tracing::warn!(%error, "could not record the abort in the journal superblock");
        }
    }

    /// Store `errno` in the journal superblock on disk and flush. The
    /// fields that locate the log stay as the last commit or checkpoint
    /// left them (`self.sb` is what they wrote), so the log replays as it
    /// would have.
    fn record_errno(&self, errno: i32) -> Result<()> {
        debug_assert!(self.is_aborted(), "s_errno only records an abort");
        let mut sb = self.sb.lock();
        if sb.errno != 0 {
            return Ok(());
        }
        sb.errno = errno;
        self.area.store_superblock(&mut sb)?;
        self.area.dev.flush()?;
        Ok(())
    }

    pub fn is_aborted(&self) -> bool {
        self.aborted.load(Ordering::Acquire)
    }

    /// The error the journal aborted with, if it did.
    pub fn error(&self) -> Option<String> {
        self.state.lock().error.clone()
    }

    fn start_threads(jbd2: &Arc<Jbd2>) {
        *jbd2.thread.lock() = Some(spawn_step_loop(jbd2, "jext4-commit", |jbd2| {
            jbd2.commit_thread_step()
        }));
        let mut backoff = false;
        *jbd2.checkpoint_thread.lock() =
            Some(spawn_step_loop(jbd2, "jext4-checkpoint", move |jbd2| {
                jbd2.checkpoint_thread_step(&mut backoff)
            }));
    }

    /// One round of the commit thread: wait for work, then commit.
    /// Returns false when the journal has stopped.
    fn commit_thread_step(&self) -> bool {
        self.thread_rounds.fetch_add(1, Ordering::Relaxed);
        let mut state = self.state.lock();
        // An empty running transaction has nothing to commit when its
        // interval ends: a deadline already past would make this loop spin
        // (an idle mount burnt a CPU). Look again an interval from now.
        // MountOptions::validate bounds the interval; an Instant past the
        // clock's range would still panic here, so never compute one.
        let start = if state.running.is_empty() {
            Instant::now()
        } else {
            state.running.created
        };
        let deadline = start.checked_add(self.commit_interval);
        while state.commit_request.is_none() && !state.stopping && state.error.is_none() {
            let timed_out = match deadline {
                Some(deadline) => self.wake_commit.wait_until(&mut state, deadline),
                None => self.wake_commit.wait_for(&mut state, self.commit_interval),
            };
            if timed_out {
                break;
            }
        }
        if state.error.is_some() {
            return false;
        }
        if state.stopping {
            drop(state);
            if let Err(error) = self.drain_for_unmount() {
                let mut state = self.state.lock();
                self.abort(&mut state, &error);
            }
            return false;
        }
        // A request for a transaction already committed or committing (an
        // older tid than the running one) asks nothing more.
        if state
            .commit_request
            .is_some_and(|requested| super::format::tid_gt(state.running.tid, requested))
        {
            state.commit_request = None;
        }
        let wants_commit = state.commit_request.is_some()
            || (!state.running.is_empty()
                && state.running.created.elapsed() >= self.commit_interval);
        drop(state);
        if wants_commit && let Err(error) = self.commit_running() {
            let mut state = self.state.lock();
            self.abort(&mut state, &error);
            return false;
        }
        let state = self.state.lock();
        if self.wants_checkpoint(&state) {
            self.wake_checkpoint.notify_one();
        }
        true
    }

    /// One pass of the checkpoint thread: wait until log space or memory
    /// is wanted, then checkpoint (`make_room`). Returns false when it
    /// should stop. `backoff`: the last pass left space or memory still
    /// wanted (a handle inside the transaction holding the oldest buffers,
    /// or a cache pinned by the running transaction), so the next pass
    /// waits for one wakeup — a commit, a request — or the timeout, rather
    /// than spinning.
    fn checkpoint_thread_step(&self, backoff: &mut bool) -> bool {
        let mut state = self.state.lock();
        let deadline = Instant::now() + self.commit_interval;
        let idle = |state: &State| {
            !state.checkpoint_request && !state.checkpoint_stopping && state.error.is_none()
        };
        if *backoff {
            if idle(&state) {
                self.wake_checkpoint.wait_until(&mut state, deadline);
            }
        } else {
            while idle(&state) && !self.wants_checkpoint(&state) {
                if self.wake_checkpoint.wait_until(&mut state, deadline) {
                    break;
                }
            }
        }
        if state.error.is_some() || state.checkpoint_stopping {
            return false;
        }
        let requested = std::mem::take(&mut state.checkpoint_request);
        let wanted = requested || self.wants_checkpoint(&state);
        drop(state);
        if !wanted {
            *backoff = false;
            return true;
        }
        match self.make_room() {
            Ok(()) => {
                *backoff = self.wants_checkpoint(&self.state.lock());
                true
            }
            Err(error) => {
                let mut state = self.state.lock();
                self.abort(&mut state, &error);
                false
            }
        }
    }

    /// Progressive checkpointing starts when half the log is in use, or
    /// when pinned buffers keep the cache over its bound.
    fn wants_checkpoint(&self, state: &State) -> bool {
        self.used_blocks(state) > self.log_size() / 2 || self.cache.over_capacity()
    }

    /// Commit everything, checkpoint everything, mark the journal empty.
    fn drain_for_unmount(&self) -> Result<()> {
        self.commit_running()?;
        self.checkpoint_all()?;
        let mut state = self.state.lock();
        let next = state.running.tid;
        let mut sb = self.sb.lock();
        sb.start = 0;
        sb.sequence = next;
        // As the kernel at unmount: a clean journal does not say
        // FAST_COMMIT (mke2fs leaves it off; a mount sets it again).
        sb.feature_incompat &= !incompat::FAST_COMMIT;
        self.area.store_superblock(&mut sb)?;
        self.area.dev.flush()?;
        state.sb_empty_on_disk = true;
        Ok(())
    }
}

/// A journal thread: runs `step` while the journal lives and `step` asks
/// for more.
fn spawn_step_loop(
    jbd2: &Arc<Jbd2>,
    name: &str,
    mut step: impl FnMut(&Jbd2) -> bool + Send + 'static,
) -> JoinHandle<()> {
    let weak: Weak<Jbd2> = Arc::downgrade(jbd2);
    std::thread::Builder::new()
        .name(name.into())
        .spawn(move || {
            while let Some(jbd2) = weak.upgrade() {
                // A panic (a bug) ends the thread; waiters for a commit or
                // for log space would sleep forever unless the journal
                // aborts, which wakes them with an error. The state lock
                // was released by the unwinding.
                let round = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| step(&jbd2)));
                match round {
                    Ok(true) => {}
                    Ok(false) => return,
                    Err(panic) => {
                        let why = crate::error::panic_message(&*panic);
                        let thread = std::thread::current();
                        let name = thread.name().unwrap_or("journal");
                        jbd2.abort_with(&format!("the {name} thread panicked: {why}"));
                        return;
                    }
                }
            }
        })
        .expect("spawning a journal thread")
}

/// Wait for a journal thread to end, unless this is that thread (an
/// unmount from inside it).
fn join_unless_current(thread: &Mutex<Option<JoinHandle<()>>>) {
    if let Some(thread) = thread.lock().take()
        && thread.thread().id() != std::thread::current().id()
    {
        let _ = thread.join();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_overlap_finds_the_earliest_range() {
        let mut ranges = BTreeMap::new();
        ranges.insert(10, (20, 1));
        ranges.insert(25, (26, 1));
        ranges.insert(40, (50, 2));
        // Starts inside the first range: that one, not the later ones.
        assert_eq!(first_overlap(&ranges, 15, 30), Some((10, 20)));
        // Starts in a gap: the first range beginning inside the query.
        assert_eq!(first_overlap(&ranges, 20, 45), Some((25, 26)));
        assert_eq!(first_overlap(&ranges, 26, 40), None);
        assert_eq!(first_overlap(&ranges, 0, 10), None);
        assert_eq!(first_overlap(&ranges, 49, 60), Some((40, 50)));
    }
}
