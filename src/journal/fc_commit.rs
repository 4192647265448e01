//! Writing fast commits: the journal's side (the kernel's
//! `jbd2_fc_begin_commit`, `jbd2_fc_get_buf`, `jbd2_fc_end_commit`).
//!
//! The fast-commit area follows the log (`LogLayout::fast_commit`). Fast
//! commits extend the running transaction: their TAIL carries its tid, and
//! recovery replays them only when the log ends right before that
//! transaction. So:
//! - a fast commit starts only when no full commit is under way (the
//!   transaction before the running one must be durable first, or a crash
//!   would leave a log ending one transaction earlier and the records
//!   would be skipped), and no full commit starts while a fast commit is
//!   under way (`State::fc_ongoing`; the kernel's FAST_COMMIT_ONGOING);
//! - fast commits are appended to the area one after another, each in
//!   whole blocks (its TAIL runs to the end of its last block), never over
//!   an earlier one of the same transaction: replay walks the area from
//!   its first block and stops at the first bad TAIL;
//! - a full commit retires them (`retire_area`): every record describes a
//!   change the full commit now holds, so the next fast commit starts at
//!   the area's first block again with a HEAD for the new transaction.
//!   The old HEAD is overwritten with zeros once the commit block is
//!   durable: the kernel and jext4 would merely stop at a HEAD for an
//!   older transaction, but e2fsck 1.47 fails its recovery on one.
//!
//! Ordering on the device (`write_fast_commit`): the records and the TAIL
//! are written together and one flush makes them durable — the TAIL's CRC
//! covers every record byte, so a TAIL that reaches the disk without some
//! record block is rejected by every replay, and nothing was acknowledged
//! yet. When the records map newly written data blocks, the data must be
//! durable before the TAIL can be: the blocks before the TAIL's are
//! written, one flush (covering the data written before this call too),
//! then the TAIL's block and a second flush. Two flushes then, one
//! otherwise.
//!
//! Two rules come from how the kernel's replay treats damage:
//! - it refuses to mount (EFSBADCRC, ECANCELED) when the area opens with a
//!   HEAD for the expected transaction but no valid TAIL follows — a torn
//!   first fast commit. So the first fast commit of a transaction writes
//!   everything but the sector holding its HEAD, flushes, and only then
//!   writes that sector (and flushes): a HEAD is never durable before its
//!   TAIL. Two flushes for that fast commit, data or not (the first flush
//!   makes the data durable too).
//! - its scan reads the area up to and including the block one past its
//!   end (`j_fc_last` is `s_maxlen`), which fails the whole recovery, when
//!   no record before stops it. So the area's last block is never used and
//!   holds zeros (written at mount): the scan always stops there at the
//!   latest.
//!
//! The journal superblock: recovery scans the log only when `s_start` is
//! not zero (the kernel returns before its fast-commit pass otherwise).
//! After the mount's first commit it never is until a clean unmount: the
//! checkpoint moves `s_start` to the head of the log when the log empties,
//! with `s_sequence` the running transaction — exactly the tid fast
//! commits carry. Before that first commit, fast commits are refused.

use super::faults::{self, Fault};
use super::format::tid_gt;
use super::jbd2::Jbd2;
use crate::dev::SECTOR_SIZE;
use crate::error::Result;
use crate::format::fast_commit::{AreaBuilder, Record};
use std::sync::atomic::Ordering;

/// What `Jbd2::begin_fast_commit` found.
pub enum FastCommitBegin<'j> {
    /// The caller's changes are durable already: committed in full, or
    /// carried by a fast commit that started after them. `flushed`: a
    /// commit's final flush came after the call began.
    Durable { flushed: bool },
    /// A fast commit cannot be written now (the log has no full commit yet,
    /// or the area has no room): commit in full.
    Refused,
    /// This caller may write one fast commit for the running transaction.
    Started(FastCommitSlot<'j>),
}

/// The right to write the next fast commit: where it goes and for which
/// transaction. One exists at a time; dropping it lets full commits and
/// other fast commits go on.
pub struct FastCommitSlot<'j> {
    jbd2: &'j Jbd2,
    /// The running transaction, whose tid the HEAD and TAIL carry.
    pub tid: u32,
    /// The first fast commit since the area was retired: it opens with a
    /// HEAD.
    pub head: bool,
    /// Area blocks still free (without ByteLog).
    free_blocks: u32,
    /// This fast commit's number (`State::fc_started` once it began).
    sequence: u64,
    /// Its blocks are durable: every fsync that read a smaller
    /// `fast_commit_sequence` is covered.
    durable: bool,
    /// Journal block where this fast commit's first block goes.
    first_block: u32,
    /// Area units this fast commit took (or tried to): blocks, or one per
    /// ByteLog fast commit.
    written: u32,
}

/// What one fast commit wrote.
#[derive(Debug, Clone, Copy)]
pub struct Written {
    /// Bytes of records, HEAD and TAIL included (not the padding); with
    /// ByteLog the ring records' headers and the stream line's records.
    pub record_bytes: usize,
    /// Bytes written to the area.
    pub area_bytes: u64,
    /// Device flushes.
    pub flushes: u32,
    /// ByteLog persists (cache-line write-back and fence, or msync).
    pub persists: u32,
}

impl FastCommitSlot<'_> {
    /// Whether every fast commit ends with a device flush (block fast
    /// commits do; a ByteLog one ends with a fence, and flushes only when
    /// its records expose new data).
    pub fn ends_with_flush(&self) -> bool {
        self.jbd2.bytelog.is_none()
    }

    /// Write `records` as one fast commit (HEAD first if it is the first
    /// since the area was retired, TAIL last) at the slot's place and make
    /// it durable. `data_first`: the records expose data written since the
    /// last flush (newly mapped blocks, a size that grew), which must be
    /// durable before the TAIL is. None when the area has no room for it
    /// (nothing was written).
    pub fn write(&mut self, records: &[Record], data_first: bool) -> Result<Option<Written>> {
        debug_assert_eq!(self.written, 0, "one fast commit per slot");
        let written = match &self.jbd2.bytelog {
            Some(bytelog) => {
                let dev = &*self.jbd2.area.dev;
                let written = bytelog.write(dev, self.tid, self.head, records, data_first);
                // Taken unless there was no room (then nothing was stored).
                self.written = !matches!(written, Ok(None)) as u32;
                written?
            }
            None => self.write_blocks(records, data_first)?,
        };
        if let Some(written) = &written {
            self.durable = true;
            self.jbd2.fast_commits.fetch_add(1, Ordering::Relaxed);
            self.jbd2
                .fast_commit_bytes
                .fetch_add(written.area_bytes, Ordering::Relaxed);
        }
        Ok(written)
    }

    /// The fast commit as whole blocks of the area (the kernel's layout).
    fn write_blocks(&mut self, records: &[Record], data_first: bool) -> Result<Option<Written>> {
        let block_size = self.jbd2.area.fs_block_size;
        let mut area = AreaBuilder::new(block_size as usize);
        if self.head {
            area.add(&Record::Head {
                features: 0,
                tid: self.tid,
            });
        }
        for record in records {
            area.add(record);
        }
        area.tail(self.tid);
        let record_bytes = area.record_bytes();
        let blocks = area.finish();
        if blocks.len() as u32 > self.free_blocks {
            return Ok(None);
        }
        // Counted before any I/O: after an error part of it may be on disk,
        // and the next fast commit must not mix with it.
        self.written = blocks.len() as u32;
        let flushes =
            self.jbd2
                .write_fast_commit(self.first_block, self.head, &blocks, data_first)?;
        Ok(Some(Written {
            record_bytes,
            area_bytes: blocks.len() as u64 * block_size as u64,
            flushes,
            persists: 0,
        }))
    }
}

impl<'j> FastCommitSlot<'j> {
    /// Wait until every handle of the running transaction has stopped and
    /// keep new ones from starting until the guard drops (the kernel's
    /// `jbd2_journal_lock_updates`): no operation is half-way meanwhile, so
    /// what the fast commit reads of the filesystem is a consistent cut.
    /// The caller holds no lock and no handle (it would wait for itself).
    pub fn lock_updates(&self) -> UpdatesLocked<'j> {
        crate::lock::assert_none_held("locking journal updates");
        let jbd2 = self.jbd2;
        let mut state = jbd2.state.lock();
        debug_assert!(state.fc_ongoing && !state.locked);
        state.locked = true;
        while state.running.updates.load(Ordering::Acquire) > 0 {
            jbd2.changed.wait(&mut state);
        }
        UpdatesLocked { jbd2 }
    }
}

/// Handles are kept from starting while this lives (`lock_updates`).
pub struct UpdatesLocked<'j> {
    jbd2: &'j Jbd2,
}

impl Drop for UpdatesLocked<'_> {
    fn drop(&mut self) {
        let mut state = self.jbd2.state.lock();
        state.locked = false;
        self.jbd2.changed.notify_all();
    }
}

impl Drop for FastCommitSlot<'_> {
    fn drop(&mut self) {
        let durable = self.durable.then_some(self.sequence);
        self.jbd2.end_fast_commit(self.tid, self.written, durable);
    }
}

impl Jbd2 {
    /// The fast-commit area `[first, end)` in journal blocks, when this
    /// mount writes fast commits: the layout's area but its last block,
    /// which stays zero (see the module comment).
    pub fn fast_commit_area(&self) -> Option<(u32, u32)> {
        let (first, end) = self
            .fast_commit
            .then_some(self.layout.fast_commit)
            .flatten()?;
        (first + 1 < end).then_some((first, end - 1))
    }

    /// Zero the block after the area this mount writes (at load: nothing
    /// else ever writes it).
    pub(crate) fn prepare_fast_commit_area(&self) -> Result<()> {
        if let Some((_, end)) = self.fast_commit_area() {
            let zeros = vec![0u8; self.area.fs_block_size as usize];
            self.write_area_blocks(end, std::slice::from_ref(&zeros))?;
            self.area.dev.flush()?;
        }
        Ok(())
    }

    /// The number of fast commits begun so far. A caller that reads it
    /// after making its changes (an fsync) is covered by any fast commit
    /// numbered above it: that one takes its records after it began.
    pub fn fast_commit_sequence(&self) -> u64 {
        self.state.lock().fc_started
    }

    /// Wait until transaction `tid` is durable, or a fast commit numbered
    /// above `seen` (`fast_commit_sequence` read after the caller's
    /// changes) is, or a fast commit for it may be written: no full commit
    /// and no other fast commit under way. The second case is the group
    /// commit of concurrent fsyncs (the kernel's `s_fc_subtid` check): one
    /// fast commit carries every change made before it began.
    pub fn begin_fast_commit(&self, tid: u32, seen: u64) -> Result<FastCommitBegin<'_>> {
        let Some((first, end)) = self.fast_commit_area() else {
            return Ok(FastCommitBegin::Refused);
        };
        let mut state = self.state.lock();
        debug_assert!(seen <= state.fc_started, "a sequence from the future");
        let mut waited = false;
        loop {
            state.check_aborted()?;
            if !tid_gt(tid, state.committed_tid) {
                return Ok(FastCommitBegin::Durable { flushed: waited });
            }
            if state.fc_durable > seen {
                // Its flushes came after `seen` was read (a ByteLog fast
                // commit may have issued none: its fence is not a flush).
                return Ok(FastCommitBegin::Durable {
                    flushed: self.bytelog.is_none(),
                });
            }
            if state.locked || state.committing_tid.is_some() || state.fc_ongoing {
                self.changed.wait(&mut state);
                waited = true;
                continue;
            }
            debug_assert_eq!(
                tid, state.running.tid,
                "neither committed, committing nor running"
            );
            let used = state.fc_next;
            // ByteLog checks its own room (`used` counts fast commits there).
            if state.sb_empty_on_disk || (self.bytelog.is_none() && first + used >= end) {
                return Ok(FastCommitBegin::Refused);
            }
            state.fc_ongoing = true;
            state.fc_started += 1;
            return Ok(FastCommitBegin::Started(FastCommitSlot {
                jbd2: self,
                tid,
                head: used == 0,
                free_blocks: end.saturating_sub(first + used),
                sequence: state.fc_started,
                durable: false,
                first_block: first + used,
                written: 0,
            }));
        }
    }

    fn write_fast_commit(
        &self,
        first_block: u32,
        head: bool,
        blocks: &[Vec<u8>],
        data_first: bool,
    ) -> Result<u32> {
        debug_assert!(
            self.state.lock().fc_ongoing,
            "a fast commit without its slot"
        );
        let (tail, records) = blocks.split_last().expect("a TAIL block");
        let tail_at = first_block + records.len() as u32;
        if faults::active(Fault::FastCommitTailFirst) {
            // Broken on purpose: the TAIL is durable before the records
            // (and the data); they follow with no flush of their own.
            self.write_area_blocks(tail_at, std::slice::from_ref(tail))?;
            self.area.dev.flush()?;
            self.write_area_blocks(first_block, records)?;
            return Ok(1);
        }
        if head {
            // Everything but the HEAD's sector, flushed (with the data);
            // then the HEAD's sector: a HEAD is never durable without its
            // TAIL.
            let sector = SECTOR_SIZE as usize;
            let mut without_head = blocks.to_vec();
            without_head[0][..sector].fill(0);
            self.write_area_blocks(first_block, &without_head)?;
            self.area.dev.flush()?;
            self.write_area_bytes(first_block, &blocks[0][..sector])?;
            self.area.dev.flush()?;
            return Ok(2);
        }
        self.write_area_blocks(first_block, records)?;
        let mut flushes = 0;
        if data_first {
            self.area.dev.flush()?;
            flushes += 1;
        }
        self.write_area_blocks(tail_at, std::slice::from_ref(tail))?;
        self.area.dev.flush()?;
        Ok(flushes + 1)
    }

    /// The slot is given back; `written` area blocks now hold its fast
    /// commit (or whatever part of it reached them before an error): later
    /// fast commits of the same transaction go after them. `durable`: the
    /// number of the fast commit, when it is durable.
    fn end_fast_commit(&self, tid: u32, written: u32, durable: Option<u64>) {
        let mut state = self.state.lock();
        debug_assert!(state.fc_ongoing);
        debug_assert_eq!(state.running.tid, tid, "a full commit ran meanwhile");
        state.fc_ongoing = false;
        state.fc_next += written;
        if let Some(sequence) = durable {
            // One fast commit at a time: they end in the order they began.
            debug_assert!(sequence > state.fc_durable && sequence == state.fc_started);
            state.fc_durable = sequence;
        }
        self.changed.notify_all();
    }

    /// A full commit's commit block is durable (called by the commit
    /// thread before it marks the commit finished, so no fast commit can
    /// start in between): the area's fast commits are spent. Zero its first
    /// block if it was used — for e2fsck, which fails on a HEAD for an
    /// older transaction. Returns whether a block was written (its flush
    /// comes after the waiters are woken: nothing depends on it).
    pub(crate) fn retire_area(&self) -> Result<bool> {
        let Some((first, _)) = self.fast_commit_area() else {
            return Ok(false);
        };
        let used = {
            let mut state = self.state.lock();
            debug_assert!(!state.fc_ongoing, "a fast commit during a full commit");
            std::mem::take(&mut state.fc_next)
        };
        if let Some(bytelog) = &self.bytelog {
            // Its zeroed line is persisted at once: no flush to follow.
            bytelog.retire()?;
            return Ok(false);
        }
        if used == 0 {
            return Ok(false);
        }
        let zeros = vec![0u8; self.area.fs_block_size as usize];
        self.write_area_blocks(first, std::slice::from_ref(&zeros))?;
        Ok(true)
    }

    /// Write `bytes` (a sector) at the start of journal block `index`.
    fn write_area_bytes(&self, index: u32, bytes: &[u8]) -> Result<()> {
        let block_size = self.area.fs_block_size as u64;
        let physical = self.area.blocks[index as usize];
        self.area.dev.write_at(physical * block_size, bytes)?;
        Ok(())
    }

    /// Write `blocks` at journal blocks `index..`, runs of contiguous
    /// device blocks in one write.
    fn write_area_blocks(&self, index: u32, blocks: &[Vec<u8>]) -> Result<()> {
        let block_size = self.area.fs_block_size as u64;
        let mut at = 0;
        while at < blocks.len() {
            let first_physical = self.area.blocks[index as usize + at];
            let mut run = 1;
            while at + run < blocks.len()
                && self.area.blocks[index as usize + at + run] == first_physical + run as u64
            {
                run += 1;
            }
            let bytes: Vec<u8> = blocks[at..at + run].concat();
            self.area
                .dev
                .write_at(first_physical * block_size, &bytes)?;
            at += run;
        }
        Ok(())
    }
}
