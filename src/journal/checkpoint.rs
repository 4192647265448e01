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

use super::jbd2::Jbd2;
use crate::error::Result;
use std::sync::Arc;
use std::sync::atomic::Ordering;

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

    /// Write the oldest transaction's buffers home and retire it. Returns
    /// false if a buffer is held by an uncommitted transaction.
    fn checkpoint_oldest(&self) -> Result<bool> {
        let (tid, buffers) = {
            let state = self.state.lock();
            match state.checkpoints.front() {
                Some(oldest) => (oldest.tid, oldest.buffers.clone()),
                None => return Ok(true),
            }
        };
        let mut writes: Vec<(u64, Vec<u8>, Arc<crate::cache::Buffer>)> = Vec::new();
        for buffer in &buffers {
            let head = buffer.journal.lock();
            if head.checkpoint != Some(tid) {
                continue;
            }
            if head.running.is_some() || head.committing.is_some() {
                return Ok(false);
            }
            let bytes = buffer.read().to_vec();
            drop(head);
            writes.push((buffer.block(), bytes, Arc::clone(buffer)));
        }
        writes.sort_unstable_by_key(|(block, _, _)| *block);
        let block_size = self.area.fs_block_size as u64;
        for (block, bytes, _) in &writes {
            self.guard.write_committed(block * block_size, bytes, tid)?;
        }
        self.area.dev.flush()?;
        for (_, _, buffer) in &writes {
            let mut head = buffer.journal.lock();
            if head.checkpoint == Some(tid) {
                head.checkpoint = None;
            }
        }
        self.retire_oldest(tid)?;
        self.checkpoints.fetch_add(1, Ordering::Relaxed);
        self.blocks_checkpointed
            .fetch_add(writes.len() as u64, Ordering::Relaxed);
        Ok(true)
    }

    /// Drop the oldest transaction from the log: the journal superblock's
    /// tail moves to the next one (or to the head when none is left), and
    /// is durable before that log space can be written again.
    fn retire_oldest(&self, tid: u32) -> Result<()> {
        // Only the commit thread writes the log, and it is running this:
        // no commit can reuse the retired space before the superblock below
        // is durable, so the state lock need not be held across the I/O.
        let (start, sequence) = {
            let mut state = self.state.lock();
            let retired = state.checkpoints.pop_front();
            debug_assert_eq!(retired.map(|c| c.tid), Some(tid));
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
