//! Commit: lock the running transaction down, open the next one at once,
//! then write the transaction to the log (revoke blocks, descriptor blocks
//! with their metadata blocks, flush, commit block, flush) and hand its
//! buffers to the checkpoint.
//!
//! Ordered data needs nothing here: file data is written to its home blocks
//! before the operations that map it return, so the flush before the
//! commit block makes it durable before the metadata that points at it.
//! With `journal_async_commit` the commit block carries a checksum and the
//! first flush is skipped (recovery rejects a commit whose blocks did not
//! all arrive).

use super::format::{DescriptorBuilder, encode_commit_block, encode_revoke_blocks};
use super::jbd2::{Checkpoint, Jbd2, Transaction};
use crate::cache::Buffer;
use crate::error::{Error, Location, Result};
use crate::faults::{self, Fault};
use std::sync::Arc;
use std::sync::atomic::Ordering;

/// Blocks gathered before a log write is issued: bounds the commit's
/// memory while keeping writes large.
const LOG_WRITE_BATCH: usize = 256;

/// What lock-down hands to the write phase.
struct LockedDown {
    transaction: Arc<Transaction>,
    /// Buffers to log, each once, in registration order.
    log: Vec<Arc<Buffer>>,
    /// Buffers freed by the transaction: revoked, never logged.
    freed: Vec<Arc<Buffer>>,
    revokes: Vec<u64>,
    start: u32,
    point_superblock: bool,
}

impl Jbd2 {
    /// Commit the running transaction if it holds anything; wait until it
    /// is durable.
    pub(crate) fn commit_running(&self) -> Result<()> {
        let Some(locked) = self.lock_down()? else {
            return Ok(());
        };
        let tid = locked.transaction.tid;
        faults::panic_point(faults::PanicPoint::Commit);
        if locked.point_superblock {
            // The superblock said "empty log": point it at this transaction
            // before the transaction can be found in the log.
            let mut sb = self.sb.lock();
            sb.start = locked.start;
            sb.sequence = tid;
            self.area.store_superblock(&mut sb)?;
            self.area.dev.flush()?;
        }
        let end = self.write_transaction(&locked)?;
        let retired = self.retire_area()?;
        self.finish_commit(locked, end)?;
        if retired {
            // Makes the zeroed HEAD durable; nobody waits for it.
            self.area.dev.flush()?;
        }
        Ok(())
    }

    /// T_LOCKED: stop new handles, wait for the ones inside to leave, take
    /// the transaction's contents, and open the next transaction.
    fn lock_down(&self) -> Result<Option<LockedDown>> {
        let mut state = self.state.lock();
        // Fast commits under way extend the running transaction: they
        // must end before that transaction is locked down (the kernel's
        // FULL_COMMIT_ONGOING waits for FAST_COMMIT_ONGOING too); no new
        // one starts meanwhile.
        while state.fc_active > 0 {
            state.fc_full_wanted = true;
            self.drained.wait(&mut state);
        }
        state.fc_full_wanted = false;
        let transaction = Arc::clone(&state.running);
        if transaction.is_empty() && transaction.updates.load(Ordering::Acquire) == 0 {
            if state
                .commit_request
                .is_some_and(|tid| !super::format::tid_gt(tid, transaction.tid))
            {
                state.commit_request = None;
            }
            // Nothing to commit: whoever waits for this transaction finds
            // it empty and returns.
            let tid = transaction.tid;
            state
                .commit_waiters
                .wake_where(|target| !super::format::tid_gt(target as u32, tid));
            self.changed.notify_all();
            return Ok(None);
        }
        state.locked = true;
        while transaction.updates.load(Ordering::Acquire) > 0 {
            self.drained.wait(&mut state);
        }
        // Every handle has left, and each returned what it reserved.
        debug_assert_eq!(
            transaction.outstanding.load(Ordering::Acquire),
            0,
            "transaction {} locked down with credits outstanding",
            transaction.tid
        );
        if let Some(hook) = self.commit_hook.get() {
            hook.before_commit(&super::CommitAccess::jbd2(self, &transaction));
        }
        let buffers = std::mem::take(&mut *transaction.buffers.lock());
        let (log, freed) = sweep(transaction.tid, buffers);
        let mut revokes = std::mem::take(&mut *transaction.revokes.lock());
        revokes.sort_unstable();
        revokes.dedup();
        let blocks = self.log_blocks_for(log.len() as u32, revokes.len() as u32);
        if blocks > self.free_blocks(&state) + super::jbd2::LOG_RESERVE_BLOCKS {
            let error = Error::corrupt(
                Location::Journal {
                    block: state.head as u64,
                },
                format!(
                    "transaction {} needs {blocks} log blocks, more than the journal has free",
                    transaction.tid
                ),
            );
            self.abort(&mut state, &error);
            return Err(error);
        }
        state.running = Transaction::new(transaction.tid.wrapping_add(1));
        state.locked = false;
        state.committing_blocks = blocks;
        state.committing_tid = Some(transaction.tid);
        if state
            .commit_request
            .is_some_and(|tid| !super::format::tid_gt(tid, transaction.tid))
        {
            state.commit_request = None;
        }
        let point_superblock = std::mem::take(&mut state.sb_empty_on_disk);
        let start = state.head;
        self.changed.notify_all();
        Ok(Some(LockedDown {
            transaction,
            log,
            freed,
            revokes,
            start,
            point_superblock,
        }))
    }

    fn write_transaction(&self, locked: &LockedDown) -> Result<u32> {
        let tid = locked.transaction.tid;
        let mut writer = LogWriter::new(self, locked.start);
        let revokes: &[u64] = if faults::active(Fault::DropRevoke) {
            &[]
        } else {
            &locked.revokes
        };
        for block in encode_revoke_blocks(&self.format, tid, revokes) {
            writer.push(block)?;
        }
        let mut pending = locked.log.iter().peekable();
        while pending.peek().is_some() {
            let mut descriptor = DescriptorBuilder::new(&self.format, tid, self.uuid);
            let mut copies = Vec::new();
            while !descriptor.is_full() {
                let Some(buffer) = pending.next() else {
                    break;
                };
                let mut copy = capture(tid, buffer);
                if faults::active(Fault::WriteHomeBeforeCommit) {
                    self.write_home_early(buffer.block(), &copy)?;
                }
                descriptor.add(buffer.block(), &mut copy);
                copies.push(copy);
            }
            writer.push(descriptor.finish())?;
            for copy in copies {
                writer.push(copy)?;
            }
        }
        writer.write_out()?;
        if !self.async_commit && !faults::active(Fault::SkipPreCommitFlush) {
            self.area.dev.flush()?;
        }
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        writer.push(encode_commit_block(
            &self.format,
            tid,
            now.as_secs(),
            now.subsec_nanos(),
            0,
        ))?;
        writer.write_out()?;
        self.area.dev.flush()?;
        self.blocks_logged
            .fetch_add(locked.log.len() as u64, Ordering::Relaxed);
        self.revokes_logged
            .fetch_add(locked.revokes.len() as u64, Ordering::Relaxed);
        Ok(writer.position)
    }

    /// `Fault::WriteHomeBeforeCommit`: the block goes home now, around the
    /// write-ahead guard (which would refuse it).
    fn write_home_early(&self, block: u64, bytes: &[u8]) -> Result<()> {
        debug_assert!(faults::active(Fault::WriteHomeBeforeCommit));
        let offset = block * self.area.fs_block_size as u64;
        self.guard.raw().write_at(offset, bytes)?;
        Ok(())
    }

    /// The commit block is durable: buffers go to the checkpoint, freed
    /// blocks become allocatable, waiters wake.
    fn finish_commit(&self, locked: LockedDown, end: u32) -> Result<()> {
        let tid = locked.transaction.tid;
        for buffer in &locked.log {
            let mut head = buffer.journal.lock();
            debug_assert_eq!(head.logging, Some(tid));
            head.logging = None;
            head.checkpoint = Some(tid);
            head.frozen = None;
        }
        for buffer in &locked.freed {
            let mut head = buffer.journal.lock();
            head.checkpoint = None;
            if head.running.is_none() {
                head.freed = false;
            }
        }
        self.guard.mark_durable(tid)?;
        self.pending_free
            .lock()
            .retain(|_, (_, freed_in)| super::format::tid_gt(*freed_in, tid));
        self.frees_durable_tid.store(tid, Ordering::Release);
        let mut state = self.state.lock();
        state.committed_tid = tid;
        state.head = end;
        state.committing_blocks = 0;
        state.committing_tid = None;
        state.checkpoints.push_back(Checkpoint {
            tid,
            start: locked.start,
            buffers: locked.log,
        });
        self.commits.fetch_add(1, Ordering::Relaxed);
        // Under the state lock, so that nobody woken below (a fast commit
        // about to start) sees the commit before the observer does.
        if let Some(observer) = self.observer.get() {
            observer.committed(tid);
        }
        state.wake_committed();
        self.changed.notify_all();
        Ok(())
    }
}

/// At lock-down: every buffer registered in `tid` now belongs to its
/// commit; freed ones are set aside. Duplicates (a buffer registered again
/// after a forget) are dropped.
fn sweep(tid: u32, buffers: Vec<Arc<Buffer>>) -> (Vec<Arc<Buffer>>, Vec<Arc<Buffer>>) {
    let mut log = Vec::with_capacity(buffers.len());
    let mut freed = Vec::new();
    for buffer in buffers {
        let mut head = buffer.journal.lock();
        if head.running != Some(tid) {
            continue; // a duplicate entry, already swept
        }
        head.running = None;
        if head.freed {
            drop(head);
            freed.push(buffer);
        } else {
            debug_assert!(
                head.committing.is_none(),
                "two commits of block {}",
                buffer.block()
            );
            head.committing = Some(tid);
            head.logging = Some(tid);
            drop(head);
            log.push(buffer);
        }
    }
    (log, freed)
}

/// The copy of `buffer` that transaction `tid` logs: the frozen copy if the
/// next transaction got to the buffer first, else its current bytes.
fn capture(tid: u32, buffer: &Buffer) -> Vec<u8> {
    let mut head = buffer.journal.lock();
    debug_assert_eq!(
        head.committing,
        Some(tid),
        "capturing block {} twice",
        buffer.block()
    );
    head.committing = None;
    match head.frozen.take() {
        Some(frozen) => frozen.into_vec(),
        None => buffer.read().to_vec(),
    }
}

/// Appends blocks at consecutive log positions (wrapping from the end of
/// the log to its start) and writes them in runs of contiguous device
/// blocks.
struct LogWriter<'j> {
    jbd2: &'j Jbd2,
    position: u32,
    batch: Vec<(u32, Vec<u8>)>,
}

impl<'j> LogWriter<'j> {
    fn new(jbd2: &'j Jbd2, position: u32) -> Self {
        LogWriter {
            jbd2,
            position,
            batch: Vec::new(),
        }
    }

    fn push(&mut self, block: Vec<u8>) -> Result<()> {
        self.batch.push((self.position, block));
        self.position += 1;
        if self.position == self.jbd2.layout.last {
            self.position = self.jbd2.layout.first;
        }
        if self.batch.len() >= LOG_WRITE_BATCH {
            self.write_out()?;
        }
        Ok(())
    }

    fn write_out(&mut self) -> Result<()> {
        let block_size = self.jbd2.area.fs_block_size as u64;
        let batch = std::mem::take(&mut self.batch);
        let mut index = 0;
        while index < batch.len() {
            let first_physical = self.jbd2.area.blocks[batch[index].0 as usize];
            let mut run = 1;
            while index + run < batch.len()
                && self.jbd2.area.blocks[batch[index + run].0 as usize]
                    == first_physical + run as u64
            {
                run += 1;
            }
            let mut bytes = Vec::with_capacity(run * block_size as usize);
            for (_, block) in &batch[index..index + run] {
                bytes.extend_from_slice(block);
            }
            self.jbd2
                .area
                .dev
                .write_at(first_physical * block_size, &bytes)?;
            index += run;
        }
        Ok(())
    }
}
