//! Checkpoint: write committed buffers to their home locations, flush, and
//! move the log tail past the transactions whose buffers are all home, so
//! their log space can be reused.
//!
//! Runs on its own thread (the commit thread runs the last pass at
//! unmount), one pass at a time under `Jbd2::checkpointing`, beside
//! commits. A buffer in the oldest transaction is:
//! - skipped when a newer committed transaction logged it again (that one
//!   will write it) or when it was freed;
//! - blocking when a running or committing transaction holds it: its live
//!   bytes are not committed yet, so that transaction must commit first
//!   (after which the buffer belongs to the newer checkpoint). Committing
//!   means until the commit block is durable (`JournalHead::logging`), not
//!   only until the commit has captured the bytes: from capture to the
//!   commit's end the live bytes are the new commit's, and written home
//!   they would break the write-ahead rule;
//! - otherwise written home with its current bytes, which are exactly the
//!   committed ones.
//!
//! What running beside the commit thread takes care of:
//! - log space is handed back only once the moved tail is durable: the
//!   retired transactions leave `State::checkpoints` after the journal
//!   superblock's flush, so no commit writes over them before;
//! - when the log empties, the tail moves to the head with the sequence of
//!   the transaction that will be written there next (the committing one,
//!   else the running one);
//! - a buffer copied for a home write may be freed by a newer transaction
//!   and that transaction may become durable before the write is issued:
//!   the blocks of a pass are not allocatable until it ends
//!   (`Jbd2::checkpoint_writing`), so the stale copy never lands on a
//!   block's new owner;
//! - when a running transaction holds a buffer of the oldest checkpoint,
//!   the pass asks the commit thread for that commit and waits for it.
//!
//! Progressive: `make_room` checkpoints the oldest transactions until a
//! quarter of the log is in use (and the cache is back under its bound),
//! not the whole log at once.

use super::jbd2::Jbd2;
use crate::error::Result;
use crate::faults::{self, Fault};
use std::sync::Arc;
use std::sync::atomic::Ordering;

/// At most this many transactions retire in one checkpoint round (their
/// home writes are gathered in memory first).
const CHECKPOINT_BATCH: usize = 512;

impl Jbd2 {
    /// Free log space and pinned memory (the checkpoint thread):
    /// checkpoint until at most a quarter of the log is in use and the
    /// cache is within its bound, or until blocked.
    pub(crate) fn make_room(&self) -> Result<()> {
        let _pass = self.checkpointing.lock();
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
                // The commit thread commits; this thread only waits.
                self.commit_and_wait(self.running_tid())?;
                if !self.checkpoint_oldest()? {
                    break; // still blocked: a handle is inside; next round
                }
            }
        }
        let _state = self.state.lock();
        self.changed.notify_all();
        Ok(())
    }

    /// Checkpoint every transaction (the commit thread, at unmount, once
    /// the checkpoint thread has stopped).
    pub(crate) fn checkpoint_all(&self) -> Result<()> {
        let _pass = self.checkpointing.lock();
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
        // Before any copy is taken: a block freed and handed out again
        // after its copy was taken must not be allocatable until the copy
        // is written (see the module comment).
        {
            let mut writing: Vec<u64> = oldest
                .iter()
                .flat_map(|(_, buffers)| buffers.iter().map(|buffer| buffer.block()))
                .collect();
            writing.sort_unstable();
            writing.dedup();
            *self.checkpoint_writing.lock() = writing;
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
                if head.running.is_some() || head.logging.is_some() {
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
            self.checkpoint_writing.lock().clear();
            return Ok(false);
        }
        writes.sort_unstable_by_key(|(block, ..)| *block);
        let block_size = self.area.fs_block_size as u64;
        let written = (|| {
            for (block, bytes, _, tid) in &writes {
                self.guard
                    .write_committed(block * block_size, bytes, *tid)?;
            }
            if !faults::active(Fault::EarlyTailAdvance) {
                self.area.dev.flush()?;
            }
            Ok::<_, crate::error::Error>(())
        })();
        // Issued (and flushed): a later owner's writes come after these.
        self.checkpoint_writing.lock().clear();
        written?;
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
        // The retired transactions stay in `checkpoints` (so their log
        // space stays in use) until the superblock below is durable: a
        // commit running beside this may not write over them before.
        let (start, sequence) = {
            let state = self.state.lock();
            debug_assert!(
                tids.iter()
                    .zip(&state.checkpoints)
                    .all(|(tid, checkpoint)| checkpoint.tid == *tid),
                "retiring transactions that are not the oldest"
            );
            match state.checkpoints.get(tids.len()) {
                Some(next) => (next.start, next.tid),
                // The log empties: point at the head, where the committing
                // transaction is being written, else where the running one
                // will be (head only moves when a commit finishes, and then
                // that transaction is in the log, which is also valid).
                None => (
                    state.head,
                    state.committing_tid.unwrap_or(state.running.tid),
                ),
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
        for tid in tids {
            let retired = state.checkpoints.pop_front();
            debug_assert_eq!(retired.map(|c| c.tid), Some(*tid));
        }
        state.sb_empty_on_disk = false;
        self.changed.notify_all();
        Ok(())
    }
}
