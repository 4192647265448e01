//! Writing fast commits: the journal's side (the kernel's
//! `jbd2_fc_begin_commit`, `jbd2_fc_get_buf`, `jbd2_fc_end_commit`), with
//! the group commit of per-directory transactions.
//!
//! The fast-commit area follows the log (`LogLayout::fast_commit`). Fast
//! commits extend the running transaction: their TAIL carries its tid, and
//! recovery replays them only when the log ends right before that
//! transaction. So:
//! - a directory's commit starts only when no full commit is under way
//!   (the transaction before the running one must be durable first, or a
//!   crash would leave a log ending one transaction earlier and the records
//!   would be skipped), and no full commit locks down while one is under
//!   way (`State::fc_active`, tickets; the kernel's FAST_COMMIT_ONGOING);
//!   a full commit that wants to lock down keeps new ones from starting
//!   (`State::fc_full_wanted`), so it is never starved;
//! - the area is one log: fast commits are appended one after another,
//!   each in whole blocks (its TAIL runs to the end of its last block),
//!   never over an earlier one of the same transaction: replay walks the
//!   area from its first block and stops at the first bad TAIL;
//! - many directories' commits are built at once (`fs::fast_commit`), each
//!   under its own directory's lock-down, and queued here (`enqueue`, which
//!   numbers them); whoever waits for one while no write is under way
//!   becomes the writer and writes everything queued as one fast commit —
//!   HEAD if first, every queued commit's records in queue order, one TAIL
//!   — with one set of flushes (`wait`). A queued commit is acknowledged
//!   when the write holding it is durable, and writes go one at a time in
//!   queue order, so everything before it in the area is durable by then;
//!   once one is refused (no room, an error) every later one of the
//!   transaction is too — it may build on the refused one (a later commit
//!   of the same directory) — and the full commit that follows covers them;
//! - a full commit retires them (`retire_area`): every record describes a
//!   change the full commit now holds, so the next fast commit starts at
//!   the area's first block again with a HEAD for the new transaction.
//!   The old HEAD is overwritten with zeros once the commit block is
//!   durable: the kernel and jext4 would merely stop at a HEAD for an
//!   older transaction, but e2fsck 1.47 fails its recovery on one.
//!
//! Ordering on the device (`write_fast_commit`), with ranged barriers
//! (`BlockDevice::write_durable`: the image's other dirty data, another
//! directory's, is not written by them): the records and the TAIL are
//! written and one barrier makes them durable, with the data ranges the
//! queued commits name — the TAIL's CRC covers every record byte, so a
//! TAIL that reaches the disk without some record block is rejected by
//! every replay, and nothing was acknowledged yet. When the records map
//! newly written data blocks, the data must be durable before the TAIL can
//! be: the blocks before the TAIL's are written, a barrier over them and
//! the data (carried by a rewrite of the zero block after the area), then
//! the TAIL's block with a barrier of its own. Two barriers then, one
//! otherwise.
//!
//! Two rules come from how the kernel's replay treats damage:
//! - it refuses to mount (EFSBADCRC, ECANCELED) when the area opens with a
//!   HEAD for the expected transaction but no valid TAIL follows — a torn
//!   first fast commit. So the first fast commit of a transaction writes
//!   everything but the sector holding its HEAD, makes it durable, and
//!   only then writes that sector (durably): a HEAD is never durable
//!   before its TAIL. Two barriers for that fast commit, data or not.
//! - its scan reads the area up to and including the block one past its
//!   end (`j_fc_last` is `s_maxlen`), which fails the whole recovery, when
//!   no record before stops it. So the area's last block is never used and
//!   holds zeros (written at mount): the scan always stops there at the
//!   latest. Rewriting its zeros with `write_durable` is the barrier that
//!   carries no block of its own (`barrier`).
//!
//! The journal superblock: recovery scans the log only when `s_start` is
//! not zero (the kernel returns before its fast-commit pass otherwise).
//! After the mount's first commit it never is until a clean unmount: the
//! checkpoint moves `s_start` to the head of the log when the log empties,
//! with `s_sequence` the running transaction — exactly the tid fast
//! commits carry. Before that first commit, fast commits are refused.

use super::format::tid_gt;
use super::jbd2::{Jbd2, State};
use super::waiters;
use crate::dev::SECTOR_SIZE;
use crate::error::{Error, Result};
use crate::faults::{self, Fault};
use crate::format::fast_commit::{AreaBuilder, Record};
use std::sync::atomic::Ordering;

/// The barrier's block, written once per fast commit: ext4 blocks are at
/// most 64 KiB (`s_log_block_size` ≤ 6), and a static zero block spares
/// zeroing a new one each time.
static ZERO_BLOCK: [u8; 65536] = [0; 65536];

/// What `Jbd2::begin_fast_commit` found.
pub enum FastCommitBegin<'j> {
    /// Transaction `tid` is durable already (committed in full). `flushed`:
    /// a commit's final flush came after the call began.
    Durable { flushed: bool },
    /// A fast commit cannot be written now (the log has no full commit yet,
    /// or the area has no room): commit in full.
    Refused,
    /// The caller may queue fast commits for the running transaction until
    /// the ticket drops; no full commit locks it down meanwhile.
    Started(FastCommitTicket<'j>),
}

/// The right to queue fast commits of the running transaction (`tid`).
/// Many exist at once; full commits wait until every one has dropped.
pub struct FastCommitTicket<'j> {
    jbd2: &'j Jbd2,
    /// The running transaction, whose tid the HEAD and TAIL carry.
    pub tid: u32,
}

/// One directory transaction's part of a fast commit, waiting for the
/// writer (`State::fc_queue`).
pub(crate) struct QueuedFastCommit {
    pub seq: u64,
    pub records: Vec<Record>,
    /// The records expose data written since the last flush: it must be
    /// durable before the TAIL is.
    pub data_first: bool,
    /// Device byte ranges of data that must be durable when the fast
    /// commit is acknowledged (offset, length).
    pub ranges: Vec<(u64, u64)>,
}

/// Why a queued fast commit was not made durable.
#[derive(Debug, Clone)]
pub(crate) enum Refusal {
    /// The area had no room for the write holding it (nothing written).
    NoRoom,
    /// The write failed; the text of the error.
    Failed(String),
}

/// What became of a queued fast commit (`FastCommitTicket::wait`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FastCommitOutcome {
    /// Durable, with everything queued before it.
    Durable,
    /// The area had no room: commit in full.
    NoRoom,
}

/// What one fast commit (a write of the area) wrote.
#[derive(Debug, Clone, Copy)]
pub struct Written {
    /// Bytes of records, HEAD and TAIL included (not the padding); with
    /// ByteLog the ring records' headers and the stream line's records.
    pub record_bytes: usize,
    /// Bytes written to the area.
    pub area_bytes: u64,
    /// Device flushes or barriers.
    pub flushes: u32,
    /// ByteLog persists (cache-line write-back and fence, or msync).
    pub persists: u32,
}

impl FastCommitTicket<'_> {
    /// Queue one directory transaction's records; returns its number, for
    /// `wait`. Queue order is area order.
    pub fn enqueue(&self, records: Vec<Record>, data_first: bool, ranges: Vec<(u64, u64)>) -> u64 {
        let mut state = self.jbd2.state.lock();
        debug_assert!(state.fc_active > 0 && state.running.tid == self.tid);
        state.fc_queued_seq += 1;
        let seq = state.fc_queued_seq;
        state.fc_queue.push(QueuedFastCommit {
            seq,
            records,
            data_first,
            ranges,
        });
        seq
    }

    /// Wait until the fast commit numbered `seq` is durable — writing the
    /// queue, this one's and others', when no write is under way (the
    /// group commit).
    pub fn wait(&self, seq: u64) -> Result<FastCommitOutcome> {
        let jbd2 = self.jbd2;
        let mut state = jbd2.state.lock();
        // Each round either returns, writes one group, or sleeps until a
        // group is written.
        loop {
            // Refusals first: a later group may be durable past this one.
            // They stay for every waiter until the full commit that covers
            // them retires the area.
            if let Some(refusal) = state.fc_refused.get(&seq) {
                return match refusal {
                    Refusal::NoRoom => Ok(FastCommitOutcome::NoRoom),
                    Refusal::Failed(why) => Err(Error::Io(std::io::Error::other(why.clone()))),
                };
            }
            if state.fc_durable_seq >= seq {
                return Ok(FastCommitOutcome::Durable);
            }
            state.check_aborted()?;
            if state.fc_writing || state.fc_queue.is_empty() {
                // `end_group` wakes us when our commit's fate is known, or
                // when ours is the first in the queue left to write.
                waiters::sleep(&mut state, State::fc_waiters, seq);
                continue;
            }
            let group = std::mem::take(&mut state.fc_queue);
            if state.fc_refusing {
                // An earlier group was not written: these may depend on it
                // (a later commit of the same directory), so none is.
                let refusal = (0, Ok(None));
                jbd2.end_group(&mut state, &group, refusal);
                continue;
            }
            state.fc_writing = true;
            let used = state.fc_next;
            if faults::active(Fault::FastCommitAckEarly) {
                // Broken on purpose: the group counts as durable once
                // taken, and its waiters return before its barrier.
                let durable = group.last().expect("a group").seq;
                state.fc_durable_seq = durable;
                state.fc_waiters.wake_where(|target| target <= durable);
            }
            drop(state);
            let result = jbd2.write_group(self.tid, used, &group);
            state = jbd2.state.lock();
            jbd2.end_group(&mut state, &group, result);
        }
    }
}

impl Drop for FastCommitTicket<'_> {
    fn drop(&mut self) {
        let mut state = self.jbd2.state.lock();
        debug_assert!(state.fc_active > 0);
        state.fc_active -= 1;
        if state.fc_active == 0 {
            debug_assert!(state.fc_queue.is_empty() && !state.fc_writing);
            self.jbd2.drained.notify_all();
        }
    }
}

/// What writing one group did: area units used (blocks, or one per
/// ByteLog fast commit) and what was written; `None` written when the area
/// had no room.
type GroupResult = (u32, Result<Option<Written>>);

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
    /// else ever writes it but `barrier`, with zeros).
    pub(crate) fn prepare_fast_commit_area(&self) -> Result<()> {
        if let Some((_, end)) = self.fast_commit_area() {
            let zeros = vec![0u8; self.area.fs_block_size as usize];
            self.write_area_blocks(end, &zeros)?;
            self.area.dev.flush()?;
        }
        Ok(())
    }

    /// Make the completed writes in device byte `ranges` durable without
    /// writing back the rest of the device's dirty data: `sync_ranges`,
    /// with the zero block after the fast-commit area as the block it may
    /// rewrite (a flush where this mount writes no fast commits).
    pub fn barrier(&self, ranges: &[(u64, u64)]) -> Result<()> {
        let Some((_, end)) = self.fast_commit_area() else {
            self.area.dev.flush()?;
            return Ok(());
        };
        let block_size = self.area.fs_block_size as u64;
        debug_assert!(block_size as usize <= ZERO_BLOCK.len());
        let zeros = &ZERO_BLOCK[..block_size as usize];
        let physical = self.area.blocks[end as usize];
        self.area
            .dev
            .sync_ranges(ranges, (physical * block_size, zeros))?;
        Ok(())
    }

    /// Wait until transaction `tid` is durable, or fast commits of it may
    /// be queued: no full commit under way or waiting to lock down.
    pub fn begin_fast_commit(&self, tid: u32) -> Result<FastCommitBegin<'_>> {
        let Some((first, end)) = self.fast_commit_area() else {
            return Ok(FastCommitBegin::Refused);
        };
        let mut state = self.state.lock();
        let mut waited = false;
        loop {
            state.check_aborted()?;
            if !tid_gt(tid, state.committed_tid) {
                return Ok(FastCommitBegin::Durable { flushed: waited });
            }
            if state.locked || state.committing_tid.is_some() || state.fc_full_wanted {
                self.changed.wait(&mut state);
                waited = true;
                continue;
            }
            debug_assert_eq!(
                tid, state.running.tid,
                "neither committed, committing nor running"
            );
            // ByteLog checks its own room (`fc_next` counts fast commits there).
            if state.sb_empty_on_disk || (self.bytelog.is_none() && first + state.fc_next >= end) {
                return Ok(FastCommitBegin::Refused);
            }
            state.fc_active += 1;
            return Ok(FastCommitBegin::Started(FastCommitTicket {
                jbd2: self,
                tid,
            }));
        }
    }

    /// Write `group` (everything queued, in order) as one fast commit of
    /// `tid` after the `used` area units of earlier ones.
    fn write_group(&self, tid: u32, used: u32, group: &[QueuedFastCommit]) -> GroupResult {
        debug_assert!(!group.is_empty());
        let head = used == 0;
        let records: Vec<&Record> = group.iter().flat_map(|queued| &queued.records).collect();
        let data_first = group.iter().any(|queued| queued.data_first);
        let ranges = merge_ranges(
            group
                .iter()
                .flat_map(|queued| queued.ranges.iter().copied()),
        );
        match &self.bytelog {
            Some(bytelog) => {
                let dev = &*self.area.dev;
                let records: Vec<Record> = records.into_iter().cloned().collect();
                let written = bytelog.write(dev, tid, head, &records, data_first);
                // Taken unless there was no room (then nothing was stored).
                let units = !matches!(written, Ok(None)) as u32;
                let written = written.and_then(|written| match written {
                    Some(mut written) if written.flushes == 0 && !ranges.is_empty() => {
                        // Data written in place that no record exposes
                        // still needs its barrier before the fsync returns.
                        self.barrier(&ranges)?;
                        written.flushes += 1;
                        Ok(Some(written))
                    }
                    written => Ok(written),
                });
                (units, written)
            }
            None => self.write_group_blocks(tid, used, head, &records, data_first, &ranges),
        }
    }

    /// The group as whole blocks of the area (the kernel's layout).
    fn write_group_blocks(
        &self,
        tid: u32,
        used: u32,
        head: bool,
        records: &[&Record],
        data_first: bool,
        ranges: &[(u64, u64)],
    ) -> GroupResult {
        let (first, end) = self.fast_commit_area().expect("an area to write");
        let block_size = self.area.fs_block_size;
        // Out of its lock while in use: no leaf lock is held across I/O.
        let reused = std::mem::take(&mut *self.fc_area_buffer.lock());
        let mut area = AreaBuilder::reusing(block_size as usize, reused);
        if head {
            area.add(&Record::Head { features: 0, tid });
        }
        for record in records {
            area.add(record);
        }
        area.tail(tid);
        let record_bytes = area.record_bytes();
        let area = area.finish();
        let units = area.blocks().len() as u32;
        let result = if units > end.saturating_sub(first + used) {
            (0, Ok(None))
        } else {
            // Counted before any I/O: after an error part of it may be on
            // disk, and the next fast commit must not mix with it.
            let written = self
                .write_fast_commit(first + used, head, area.bytes(), data_first, ranges)
                .map(|flushes| {
                    Some(Written {
                        record_bytes,
                        area_bytes: units as u64 * block_size as u64,
                        flushes,
                        persists: 0,
                    })
                });
            (units, written)
        };
        *self.fc_area_buffer.lock() = area;
        result
    }

    /// The writer is done with `group`: record where the area stands and
    /// what each queued commit's fate is, and wake the waiters.
    fn end_group(
        &self,
        state: &mut crate::lock::MutexGuard<'_, super::jbd2::State>,
        group: &[QueuedFastCommit],
        (units, result): GroupResult,
    ) {
        state.fc_writing = false;
        state.fc_next += units;
        let last = group.last().expect("a group").seq;
        match result {
            Ok(Some(written)) => {
                debug_assert!(
                    last > state.fc_durable_seq || faults::active(Fault::FastCommitAckEarly),
                    "groups end in queue order"
                );
                state.fc_durable_seq = last;
                self.fast_commits.fetch_add(1, Ordering::Relaxed);
                self.fast_commit_members
                    .fetch_add(group.len() as u64, Ordering::Relaxed);
                self.fast_commit_bytes
                    .fetch_add(written.area_bytes, Ordering::Relaxed);
                self.fast_commit_record_bytes
                    .fetch_add(written.record_bytes as u64, Ordering::Relaxed);
                self.fast_commit_flushes
                    .fetch_add(written.flushes as u64, Ordering::Relaxed);
            }
            Ok(None) => {
                state.fc_refusing = true;
                for queued in group {
                    state.fc_refused.insert(queued.seq, Refusal::NoRoom);
                }
            }
            Err(error) => {
                state.fc_refusing = true;
                for queued in group {
                    state
                        .fc_refused
                        .insert(queued.seq, Refusal::Failed(error.to_string()));
                }
            }
        }
        // The group's waiters, and the first one queued after it, which
        // writes the next group; the rest sleep on.
        state.fc_waiters.wake_where(|target| target <= last);
        if !state.fc_queue.is_empty() {
            state.fc_waiters.wake_first_after(last);
        }
    }

    /// Write the fast commit's `blocks` (end to end, the last one the
    /// TAIL's) at area block `first_block`, with the barriers it needs;
    /// returns how many.
    fn write_fast_commit(
        &self,
        first_block: u32,
        head: bool,
        blocks: &[u8],
        data_first: bool,
        data: &[(u64, u64)],
    ) -> Result<u32> {
        debug_assert!(
            self.state.lock().fc_writing,
            "a fast commit written outside the group writer"
        );
        let block_size = self.area.fs_block_size as usize;
        debug_assert!(!blocks.is_empty() && blocks.len().is_multiple_of(block_size));
        let (records, tail) = blocks.split_at(blocks.len() - block_size);
        let record_blocks = (records.len() / block_size) as u32;
        let tail_at = first_block + record_blocks;
        let record_ranges = self.area_ranges(first_block, record_blocks);
        let mut with_records = data.to_vec();
        with_records.extend_from_slice(&record_ranges);
        if faults::active(Fault::FastCommitTailFirst) {
            // Broken on purpose: the TAIL is durable before the records
            // (and the data); they follow with no barrier of their own.
            self.write_area_durable(tail_at, tail, &[])?;
            self.write_area_blocks(first_block, records)?;
            return Ok(1);
        }
        if head {
            // Everything but the HEAD's sector, durable (with the data);
            // then the HEAD's sector: a HEAD is never durable without its
            // TAIL.
            let sector = SECTOR_SIZE as usize;
            let mut without_head = blocks.to_vec();
            without_head[..sector].fill(0);
            let (before, last) = without_head.split_at(records.len());
            self.write_area_blocks(first_block, before)?;
            self.write_area_durable(tail_at, last, &with_records)?;
            let physical = self.area.blocks[first_block as usize];
            let offset = physical * self.area.fs_block_size as u64;
            self.area
                .dev
                .write_durable(offset, &blocks[..sector], &[])?;
            return Ok(2);
        }
        self.write_area_blocks(first_block, records)?;
        if data_first {
            self.barrier(&with_records)?;
            self.write_area_durable(tail_at, tail, &[])?;
            return Ok(2);
        }
        self.write_area_durable(tail_at, tail, &with_records)?;
        Ok(1)
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
            debug_assert!(state.fc_active == 0, "a fast commit during a full commit");
            debug_assert!(state.fc_queue.is_empty());
            // The full commit holds what they would have.
            state.fc_refused.clear();
            state.fc_refusing = false;
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
        self.write_area_blocks(first, &zeros)?;
        Ok(true)
    }

    /// Device byte ranges of journal blocks `index..index + count`, runs
    /// of contiguous blocks merged.
    fn area_ranges(&self, index: u32, count: u32) -> Vec<(u64, u64)> {
        let block_size = self.area.fs_block_size as u64;
        merge_ranges((index..index + count).map(|at| {
            let physical = self.area.blocks[at as usize];
            (physical * block_size, block_size)
        }))
    }

    /// Write `block` at journal block `index` and make it durable with the
    /// completed writes in `ranges`.
    fn write_area_durable(&self, index: u32, block: &[u8], ranges: &[(u64, u64)]) -> Result<()> {
        let block_size = self.area.fs_block_size as u64;
        let physical = self.area.blocks[index as usize];
        self.area
            .dev
            .write_durable(physical * block_size, block, ranges)?;
        Ok(())
    }

    /// Write `blocks` (end to end) at journal blocks `index..`, runs of
    /// contiguous device blocks in one write.
    fn write_area_blocks(&self, index: u32, blocks: &[u8]) -> Result<()> {
        let block_size = self.area.fs_block_size as usize;
        debug_assert_eq!(blocks.len() % block_size, 0);
        let count = blocks.len() / block_size;
        let mut at = 0;
        while at < count {
            let first_physical = self.area.blocks[index as usize + at];
            let mut run = 1;
            while at + run < count
                && self.area.blocks[index as usize + at + run] == first_physical + run as u64
            {
                run += 1;
            }
            let bytes = &blocks[at * block_size..(at + run) * block_size];
            self.area
                .dev
                .write_at(first_physical * block_size as u64, bytes)?;
            at += run;
        }
        Ok(())
    }
}

/// Sort `ranges` (offset, length) and merge those that touch or overlap.
/// In place: given a `Vec` (or its `into_iter` filtered), the result reuses
/// its allocation, one fewer per fsync than a second vector.
pub fn merge_ranges(ranges: impl IntoIterator<Item = (u64, u64)>) -> Vec<(u64, u64)> {
    let mut ranges: Vec<(u64, u64)> = ranges.into_iter().filter(|&(_, len)| len > 0).collect();
    ranges.sort_unstable();
    ranges.dedup_by(|&mut (offset, len), (last, last_len)| {
        let touches = offset <= *last + *last_len;
        if touches {
            *last_len = (*last_len).max(offset + len - *last);
        }
        touches
    });
    ranges
}

#[cfg(test)]
mod tests {
    use super::merge_ranges;

    #[test]
    fn ranges_merge_when_they_touch_or_overlap() {
        assert_eq!(
            merge_ranges([
                (8192, 4096),
                (0, 4096),
                (4096, 1024),
                (100_000, 0),
                (9000, 10)
            ]),
            vec![(0, 5120), (8192, 4096)]
        );
        assert!(merge_ranges([]).is_empty());
        // One range inside another, and a run of three that chain.
        assert_eq!(
            merge_ranges(vec![(20, 5), (0, 100), (200, 10), (210, 10), (215, 20)]),
            vec![(0, 100), (200, 35)]
        );
    }
}
