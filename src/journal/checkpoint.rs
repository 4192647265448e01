//! Checkpoint: write committed buffers to their home locations, flush, and
//! move the log tail past the transactions whose buffers are all home, so
//! their log space can be reused.
//!
//! Runs only on the commit thread, so it never races a commit. A buffer in
//! the oldest transaction is:
//! - skipped when a newer committed transaction logged it again (that one
//!   will write it) or when it was freed;
//! - blocking when a running or committing transaction holds it: its live
//!   bytes are not committed yet, so that transaction must commit first
//!   (after which the buffer belongs to the newer checkpoint);
//! - otherwise written home with its current bytes, which are exactly the
//!   committed ones.
//!
//! Progressive: `make_room` checkpoints the oldest transactions until a
//! quarter of the log is in use (and the cache is back under its bound),
//! not the whole log at once.

use super::faults::{self, Fault};
use super::jbd2::Jbd2;
use crate::error::Result;
use std::sync::Arc;
use std::sync::atomic::Ordering;

/// At most this many transactions retire in one checkpoint round (their
/// home writes are gathered in memory first).
const CHECKPOINT_BATCH: usize = 512;

impl Jbd2 {
    /// Free log space and pinned memory: checkpoint until at most a quarter
    /// of the log is in use and the cache is within its bound.
    pub(crate) fn make_room(&self) -> Result<()> {
        // Each round either retires a transaction or commits the running
        // one that blocked it; bounded by the transactions in the log.
        for _ in 0..=self.log_size() {
            let enough = {
                let state = self.state.lock();
                state.checkpoints.is_empty()
                    || (self.used_blocks(&state) <= self.log_size() / 4
                        && !self.cache.over_capacity())
            };
            if enough {
                break;
            }
            if !self.checkpoint_oldest()? {
                self.commit_running()?;
                if !self.checkpoint_oldest()? {
                    break; // still blocked: a handle is inside; next round
                }
            }
        }
        let _state = self.state.lock();
        self.changed.notify_all();
        Ok(())
    }

    /// Checkpoint every transaction (unmount).
    pub(crate) fn checkpoint_all(&self) -> Result<()> {
        for _ in 0..=self.log_size() {
            if self.state.lock().checkpoints.is_empty() {
                return Ok(());
            }
            if !self.checkpoint_oldest()? {
                self.commit_running()?;
            }
        }
        Ok(())
    }

    /// Write the oldest transactions' buffers home and retire them: up to
    /// `CHECKPOINT_BATCH` transactions, stopping at the first one that has a
    /// buffer held by an uncommitted transaction. One flush for all the
    /// home writes and one for the moved tail, not two per transaction: a
    /// stream of small fsync'd transactions leaves thousands in the log, and
    /// the commits waiting behind this thread would otherwise pay for every
    /// flush (the message-journal benchmark saw 150 ms stalls). Returns
    /// false if not even the oldest could be retired.
    fn checkpoint_oldest(&self) -> Result<bool> {
        let oldest: Vec<(u32, Vec<Arc<crate::cache::Buffer>>)> = {
            let state = self.state.lock();
            state
                .checkpoints
                .iter()
                .take(CHECKPOINT_BATCH)
                .map(|checkpoint| (checkpoint.tid, checkpoint.buffers.clone()))
                .collect()
        };
        if oldest.is_empty() {
            return Ok(true);
        }
        // (block, bytes, buffer, the transaction whose checkpoint writes it)
        let mut writes: Vec<(u64, Vec<u8>, Arc<crate::cache::Buffer>, u32)> = Vec::new();
        let mut retiring = 0;
        'transactions: for (tid, buffers) in &oldest {
            let mut mine = Vec::new();
            for buffer in buffers {
                let head = buffer.journal.lock();
                // A buffer belongs to the checkpoint of the newest committed
                // transaction that logged it, so no block comes twice.
                if head.checkpoint != Some(*tid) {
                    continue;
                }
                if head.running.is_some() || head.committing.is_some() {
                    break 'transactions;
                }
                let bytes = buffer.read().to_vec();
                drop(head);
                mine.push((buffer.block(), bytes, Arc::clone(buffer), *tid));
            }
            writes.append(&mut mine);
            retiring += 1;
        }
        if retiring == 0 {
            return Ok(false);
        }
        writes.sort_unstable_by_key(|(block, ..)| *block);
        let block_size = self.area.fs_block_size as u64;
        for (block, bytes, _, tid) in &writes {
            self.guard
                .write_committed(block * block_size, bytes, *tid)?;
        }
        if !faults::active(Fault::EarlyTailAdvance) {
            self.area.dev.flush()?;
        }
        for (_, _, buffer, tid) in &writes {
            let mut head = buffer.journal.lock();
            if head.checkpoint == Some(*tid) {
                head.checkpoint = None;
            }
        }
        let tids: Vec<u32> = oldest[..retiring].iter().map(|(tid, _)| *tid).collect();
        self.retire_oldest(&tids)?;
        self.checkpoints
            .fetch_add(retiring as u64, Ordering::Relaxed);
        self.blocks_checkpointed
            .fetch_add(writes.len() as u64, Ordering::Relaxed);
        Ok(true)
    }

    /// Drop the oldest transactions (`tids`, oldest first) from the log:
    /// the journal superblock's tail moves to the next one (or to the head
    /// when none is left), and is durable before that log space can be
    /// written again.
    fn retire_oldest(&self, tids: &[u32]) -> Result<()> {
        // Only the commit thread writes the log, and it is running this:
        // no commit can reuse the retired space before the superblock below
        // is durable, so the state lock need not be held across the I/O.
        let (start, sequence) = {
            let mut state = self.state.lock();
            for tid in tids {
                let retired = state.checkpoints.pop_front();
                debug_assert_eq!(retired.map(|c| c.tid), Some(*tid));
            }
            match state.checkpoints.front() {
                Some(next) => (next.start, next.tid),
                None => (state.head, state.running.tid),
            }
        };
        {
            let mut sb = self.sb.lock();
            sb.start = start;
            sb.sequence = sequence;
            self.area.store_superblock(&mut sb)?;
        }
        self.area.dev.flush()?;
        let mut state = self.state.lock();
        state.sb_empty_on_disk = false;
        self.changed.notify_all();
        Ok(())
    }
}
