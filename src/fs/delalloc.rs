//! Delayed allocation (`-o delalloc`): a write into a hole or past the end
//! of a file is held in memory, charged to the space budget, and given
//! blocks only when it is written out — at fsync, when the file holds more
//! than a stream's worth (`HELD_PER_FILE`) or all held data passes its
//! memory bound, when it is older than the commit interval, at sync and
//! unmount — so that many interleaved appenders each get one
//! contiguous run, a partial block appended to again is not read back from
//! the device, and data nobody synced is no other file's ordered data.
//!
//! What stays as it was:
//! - **data=ordered.** A write-out is an ordinary write of whole blocks
//!   (`Tx::write_data`) in a transaction of its own: the data reaches its
//!   blocks before the commit that maps them, and the file's on-disk size
//!   (the kernel's i_disksize) grows only with the blocks written, so a
//!   crash never shows a size whose blocks were not written — the file is
//!   as of its last write-out. Before that, the size the file shows
//!   (`attr_of`, `read`) is the held one.
//! - **ENOSPC reaches write(2).** Each held block reserves one block in
//!   the budget, and each run of held blocks the worst case of one extent
//!   insert (`mapping::append_cost_bound`); a write-out claims the
//!   reservation into its transaction's charge (`Budget::claim`), which
//!   cannot fail, and draws on both reserves beyond it, so that no
//!   write-out — the kernel's writeback — ever fails for space. A write the
//!   balance cannot reserve for is not held: it allocates at once, and the
//!   wall is met exactly. So is every write when what the balance leaves
//!   after the reservations falls below half of them (`low_on_space`, the
//!   kernel's `ext4_nonda_switch`), and such a writer writes every held
//!   file out, so that the reservations' worst cases stop hiding free
//!   blocks; a write that meets ENOSPC while data is held does the same
//!   and tries once more.
//! - **Anything else that reads or changes a file's mapping** (truncate,
//!   fallocate, SEEK_DATA/SEEK_HOLE, a write over mapped blocks) writes the
//!   file out first; a rename over an existing name writes the renamed file
//!   out first, as the kernel's `auto_da_alloc` does, so that the
//!   replace-by-rename idiom never leaves an empty file after a crash; a
//!   file that is freed drops its held data and its reservation.
//!
//! Only extent-mapped files are held (the kernel's ext3 mode has no delayed
//! allocation either), never under `-o sync` or for an inode with the
//! SYNC flag. Memory: the held data is bounded by a quarter of
//! `cache_size` (the metadata cache gets the rest); a writer that passes
//! the bound writes the oldest files out until an eighth of it is free.
//!
//! Locks: a file's held blocks are read under its inode lock (shared) and
//! changed under it (exclusive), in `Delayed::files`, a leaf lock.

use super::budget::Budget;
use super::file::{CREDITS_WRITE, WRITE_CHUNK_BLOCKS, max_file_size};
use super::{Caller, Fs, Scope, Tx};
use crate::error::{Error, Result};
use crate::faults::{self, Fault};
use crate::format::inode::Inode;
use crate::format::mapping::{self, Lookup};
use crate::lock::Rank;
use parking_lot::Mutex;
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

/// Runs one write-out transaction maps at most, so that its credits are
/// bounded: each may split every level of the extent tree and touch a
/// bitmap and a descriptor.
const MAX_RUNS_PER_WRITE_OUT: usize = 8;

/// Journal credits of one write-out: a write's per run.
const CREDITS_WRITE_OUT: u32 = CREDITS_WRITE * MAX_RUNS_PER_WRITE_OUT as u32;

/// Writes this large are not held: a stream's, or a copy's (cp writes
/// 128 KiB at a time), which gain nothing from waiting — their runs are
/// long anyway — and would pay two more copies of every byte (into the
/// held blocks, and into the write-out's runs).
const HOLD_WRITES_BELOW: u64 = 64 << 10;

/// Bytes one file holds at most: more is a stream, which gains nothing
/// from waiting (its runs are long anyway) and would go out in one burst.
const HELD_PER_FILE: u64 = 1 << 20;

/// Blocks of balance under which writes stop being held, beyond what is
/// reserved (the kernel's EXT4_FREECLUSTERS_WATERMARK serves alike).
const LOW_SPACE_SLACK: u64 = 256;

/// Why held data was written out (`jext4 stats`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum WriteOut {
    /// fsync or fdatasync of the file.
    Fsync,
    /// sync, syncfs, fsyncdir or unmount.
    Sync,
    /// The held data passed its memory bound.
    Memory,
    /// The file held more than `HELD_PER_FILE`.
    Stream,
    /// Held longer than the commit interval.
    Age,
    /// An operation on the file's mapping (truncate, fallocate, seek, a
    /// write that cannot be held).
    Mapping,
    /// Renamed over another file (`auto_da_alloc`).
    Rename,
    /// Closed for the last time after a truncate to zero
    /// (`auto_da_alloc`).
    Close,
    /// The volume is nearly full.
    Space,
}

/// `jext4 stats`' names of the reasons, in `WriteOut`'s order.
const WRITE_OUT_NAMES: [&str; 9] = [
    "fsync", "sync", "memory", "stream", "age", "mapping", "rename", "close", "space",
];

/// One file's held data.
struct HeldFile {
    /// The size the file shows: at least its on-disk size.
    size: u64,
    /// Whole blocks by logical number; bytes the writes did not cover are
    /// zeros (a hole, or past the end).
    blocks: BTreeMap<u64, Box<[u8]>>,
    /// Blocks reserved in the budget for the data blocks and the extent
    /// inserts of its runs.
    reserved: u64,
    /// When the oldest held byte was written.
    since: Instant,
}

impl HeldFile {
    /// Nothing held yet, over a file whose on-disk size is `size`.
    fn new(size: u64) -> HeldFile {
        HeldFile {
            size,
            blocks: BTreeMap::new(),
            reserved: 0,
            since: Instant::now(),
        }
    }
}

/// What one write-out transaction takes of a file: whole-block runs (by
/// first logical block) and the file's size, which the last run's bytes
/// are cut to.
pub(crate) struct Chunk {
    runs: Vec<(u64, Vec<u8>)>,
    size: u64,
    /// The part of the file's reservation the write-out claims.
    claim: u64,
    blocks: u64,
}

/// The held data of every file.
pub(crate) struct Delayed {
    enabled: bool,
    block_size: usize,
    /// Bytes held before writers write files out.
    limit: u64,
    files: Mutex<HashMap<u32, HeldFile>>,
    /// Files truncated to zero since their last close (a leaf lock): the
    /// last close writes them out.
    emptied: Mutex<std::collections::HashSet<u32>>,
    bytes: AtomicU64,
    held_writes: AtomicU64,
    blocks_written_out: AtomicU64,
    /// Write-outs by reason, indexed by `WriteOut`.
    write_outs: [AtomicU64; WRITE_OUT_NAMES.len()],
}

/// What `jext4 stats` shows of delayed allocation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DelallocStats {
    pub enabled: bool,
    pub bytes_held: u64,
    pub files_held: u64,
    pub limit: u64,
    pub held_writes: u64,
    pub blocks_written_out: u64,
    /// Write-outs by reason.
    pub write_outs: Vec<(&'static str, u64)>,
}

/// How a write goes.
pub(crate) enum Placement {
    /// Held in memory: this many bytes.
    Held(usize),
    /// Allocated and written at once.
    Direct,
    /// The file holds data, and this write cannot be held: write the file
    /// out, then try again.
    WriteOutFirst,
}

impl Delayed {
    pub fn new(enabled: bool, block_size: u32, limit: u64) -> Delayed {
        Delayed {
            enabled,
            block_size: block_size as usize,
            limit,
            files: Mutex::new(HashMap::new()),
            emptied: Mutex::new(Default::default()),
            bytes: AtomicU64::new(0),
            held_writes: AtomicU64::new(0),
            blocks_written_out: AtomicU64::new(0),
            write_outs: Default::default(),
        }
    }

    pub fn enabled(&self) -> bool {
        self.enabled
    }

    /// Whether any file holds data. When none does, the lookups below
    /// need not take the map's lock (every getattr asks): `bytes` moves
    /// under that lock, with the blocks, and a file's blocks under its
    /// inode lock.
    pub fn holds_any(&self) -> bool {
        self.enabled && self.bytes.load(Ordering::Acquire) > 0
    }

    /// Whether `ino` holds data.
    pub fn holds(&self, ino: u32) -> bool {
        self.holds_any() && self.files.lock().contains_key(&ino)
    }

    /// The last block `ino` holds.
    fn last_held(&self, ino: u32) -> Option<u64> {
        let files = self.files.lock();
        let file = files.get(&ino)?;
        file.blocks.last_key_value().map(|(lblk, _)| *lblk)
    }

    /// Whether `ino` holds a block up to `up_to`.
    fn holds_up_to(&self, ino: u32, up_to: u64) -> bool {
        let files = self.files.lock();
        files
            .get(&ino)
            .is_some_and(|file| file.blocks.range(..=up_to).next().is_some())
    }

    /// Bytes `ino` holds.
    fn held_by(&self, ino: u32) -> u64 {
        let files = self.files.lock();
        files
            .get(&ino)
            .map_or(0, |file| (file.blocks.len() * self.block_size) as u64)
    }

    /// Blocks of data held, which will need blocks when written out.
    pub fn held_blocks(&self) -> u64 {
        self.bytes.load(Ordering::Acquire) / self.block_size as u64
    }

    /// `ino` was truncated to zero: whoever rewrites it and closes it
    /// expects the new contents after a crash, not an empty file (the
    /// kernel's EXT4_STATE_DA_ALLOC_CLOSE).
    pub fn note_emptied(&self, ino: u32) {
        if self.enabled {
            self.emptied.lock().insert(ino);
        }
    }

    /// Whether `ino` was truncated to zero since its last close.
    pub fn take_emptied(&self, ino: u32) -> bool {
        self.enabled && self.emptied.lock().remove(&ino)
    }

    /// The size `ino` shows, when it holds data.
    pub fn size_of(&self, ino: u32) -> Option<u64> {
        if !self.holds_any() {
            return None;
        }
        self.files.lock().get(&ino).map(|file| file.size)
    }

    /// `ino`'s size and 512-byte block count with its held data.
    pub fn overlay(&self, ino: u32, size: &mut u64, blocks: &mut u64) {
        if !self.holds_any() {
            return;
        }
        if let Some(file) = self.files.lock().get(&ino) {
            *size = file.size;
            *blocks += (file.blocks.len() * self.block_size / 512) as u64;
        }
    }

    /// Copy `ino`'s held blocks over `buffer`, which holds the file's
    /// blocks from `first` on.
    pub fn read_into(&self, ino: u32, first: u64, buffer: &mut [u8]) {
        if !self.holds_any() {
            return;
        }
        let files = self.files.lock();
        let Some(file) = files.get(&ino) else {
            return;
        };
        let count = (buffer.len() / self.block_size) as u64;
        for (lblk, block) in file.blocks.range(first..first + count) {
            let at = (lblk - first) as usize * self.block_size;
            buffer[at..at + self.block_size].copy_from_slice(block);
        }
    }

    /// The files holding data, oldest first.
    fn oldest_first(&self) -> Vec<(Instant, u32)> {
        let mut files: Vec<(Instant, u32)> = self
            .files
            .lock()
            .iter()
            .map(|(ino, file)| (file.since, *ino))
            .collect();
        files.sort_unstable();
        files
    }

    /// Take the next write-out of `ino`: its lowest held blocks, up to
    /// `WRITE_CHUNK_BLOCKS` in up to `MAX_RUNS_PER_WRITE_OUT` runs (copied:
    /// they stay held until `written`).
    fn chunk(&self, ino: u32, up_to: u64) -> Option<Chunk> {
        let files = self.files.lock();
        let file = files.get(&ino)?;
        // Due while a block up to `up_to` is held; then everything held now,
        // blocks a concurrent writer added past `up_to` included: a chunk
        // that ends before the file's last held block would leave an
        // on-disk size at a block boundary, which no version of the file
        // had (the crash oracle's `lagging_sizes`). Only a file held in
        // more than one chunk's worth goes out by block-aligned prefixes.
        file.blocks.range(..=up_to).next()?;
        let mut runs: Vec<(u64, Vec<u8>)> = Vec::new();
        let mut blocks = 0u64;
        for (lblk, block) in &file.blocks {
            if blocks == WRITE_CHUNK_BLOCKS {
                break;
            }
            let continues = runs.last().is_some_and(|(start, bytes)| {
                start.checked_add((bytes.len() / self.block_size) as u64) == Some(*lblk)
            });
            if continues && let Some((_, bytes)) = runs.last_mut() {
                bytes.extend_from_slice(block);
            } else if runs.len() == MAX_RUNS_PER_WRITE_OUT {
                break;
            } else {
                runs.push((*lblk, block.to_vec()));
            }
            blocks += 1;
        }
        let last = blocks as usize == file.blocks.len();
        // All that is left when the file is done; else its data blocks
        // and one insert bound per run (what `reserve_for` set aside).
        let per_run = (file.reserved - file.blocks.len() as u64) / file_runs(file).max(1);
        let claim = if last {
            file.reserved
        } else {
            (blocks + per_run * runs.len() as u64).min(file.reserved)
        };
        Some(Chunk {
            runs,
            size: file.size,
            claim,
            blocks,
        })
    }

    /// `chunk` is on the device and mapped: drop it.
    fn written(&self, ino: u32, chunk: &Chunk) {
        let mut files = self.files.lock();
        let Some(file) = files.get_mut(&ino) else {
            return;
        };
        for (start, bytes) in &chunk.runs {
            let count = (bytes.len() / self.block_size) as u64;
            for lblk in *start..start + count {
                file.blocks.remove(&lblk);
            }
        }
        file.reserved -= chunk.claim.min(file.reserved);
        self.bytes
            .fetch_sub(chunk.blocks * self.block_size as u64, Ordering::AcqRel);
        self.blocks_written_out
            .fetch_add(chunk.blocks, Ordering::Relaxed);
        if file.blocks.is_empty() {
            debug_assert_eq!(file.reserved, 0, "a written-out file kept a reservation");
            files.remove(&ino);
        }
    }

    /// `ino` is freed: drop its data. Returns the blocks it had reserved.
    pub fn discard(&self, ino: u32) -> u64 {
        if !self.enabled {
            return 0;
        }
        self.emptied.lock().remove(&ino);
        match self.files.lock().remove(&ino) {
            Some(file) => {
                let bytes = (file.blocks.len() * self.block_size) as u64;
                self.bytes.fetch_sub(bytes, Ordering::AcqRel);
                file.reserved
            }
            None => 0,
        }
    }

    fn note_write_out(&self, reason: WriteOut) {
        self.write_outs[reason as usize].fetch_add(1, Ordering::Relaxed);
    }

    fn over_limit(&self) -> bool {
        self.bytes.load(Ordering::Acquire) > self.limit
    }

    pub fn stats(&self) -> DelallocStats {
        let files = self.files.lock();
        DelallocStats {
            enabled: self.enabled,
            bytes_held: self.bytes.load(Ordering::Acquire),
            files_held: files.len() as u64,
            limit: self.limit,
            held_writes: self.held_writes.load(Ordering::Relaxed),
            blocks_written_out: self.blocks_written_out.load(Ordering::Relaxed),
            write_outs: WRITE_OUT_NAMES
                .iter()
                .zip(&self.write_outs)
                .map(|(name, count)| (*name, count.load(Ordering::Relaxed)))
                .collect(),
        }
    }
}

/// Whether the balance is low for holding more: what an ordinary user's
/// balance leaves after the reservations is under half of them, as the
/// kernel's `ext4_nonda_switch` (2 × free < 3 × dirty), plus a margin.
/// Root's writes use the same threshold, so that a writer stops holding
/// at the point where `after_delayed_write` writes everything out.
fn low_on_space(budget: &Budget) -> bool {
    let reserved = budget.reserved();
    budget.balance(budget.withheld(false, false)) < (reserved / 2 + LOW_SPACE_SLACK) as i64
}

/// Runs of contiguous blocks in `file`.
fn file_runs(file: &HeldFile) -> u64 {
    let mut runs = 0;
    let mut next = None;
    for lblk in file.blocks.keys() {
        if next != Some(*lblk) {
            runs += 1;
        }
        next = lblk.checked_add(1);
    }
    runs
}

impl Tx<'_, '_> {
    /// Hold `data` (at byte `offset` of `ino`) in memory if it may be;
    /// else say how the write must go.
    pub(crate) fn write_delayed(
        &mut self,
        ino: u32,
        inode: &Inode,
        offset: u64,
        data: &[u8],
    ) -> Result<Placement> {
        let delayed = &self.core.delayed;
        if !delayed.enabled || data.is_empty() {
            return Ok(Placement::Direct);
        }
        let holds = delayed.holds(ino);
        let not_held = if holds {
            Placement::WriteOutFirst
        } else {
            Placement::Direct
        };
        let sync = self.core.options.sync || inode.has_flag(crate::format::inode::flags::SYNC);
        let inline = inode.has_flag(crate::format::inode::flags::INLINE_DATA);
        let large = data.len() as u64 >= HOLD_WRITES_BELOW;
        let low = low_on_space(&self.core.sbi.budget);
        if sync || large || !inode.uses_extents() || inline || low {
            return Ok(not_held);
        }
        // An id with quota limits meets them at the write, exactly
        // (`quota/limits.rs`): none of its data is held.
        if let Some(ids) = self.quota_subject()
            && self.quota_limits_any(ids)?
        {
            return Ok(not_held);
        }
        let block_size = self.core.geo.block_size as u64;
        let end = offset + data.len() as u64;
        if end > max_file_size(&self.core.geo, inode) {
            return Ok(not_held);
        }
        let (first, last) = (offset / block_size, (end - 1) / block_size);
        let Some(new_blocks) = self.holes_to_hold(ino, inode, first, last)? else {
            return Ok(not_held);
        };
        if !self.reserve_for(ino, inode, &new_blocks) {
            return Ok(not_held);
        }
        delayed.hold(ino, inode.size, offset, data);
        Ok(Placement::Held(data.len()))
    }

    /// The blocks of `first..=last` that are not held yet, when each is
    /// held or a hole; None when one is mapped.
    fn holes_to_hold(
        &self,
        ino: u32,
        inode: &Inode,
        first: u64,
        last: u64,
    ) -> Result<Option<Vec<u64>>> {
        let held: Vec<u64> = {
            let files = self.core.delayed.files.lock();
            match files.get(&ino) {
                Some(file) => file.blocks.range(first..=last).map(|(l, _)| *l).collect(),
                None => Vec::new(),
            }
        };
        let mut new_blocks = Vec::new();
        let mut lblk = first;
        while lblk <= last {
            if held.binary_search(&lblk).is_ok() {
                lblk += 1;
                continue;
            }
            match self.core.lookup(ino, inode, lblk)? {
                Lookup::Mapped(_) => return Ok(None),
                Lookup::Hole { next } => {
                    let hole_end = next.unwrap_or(u64::MAX).min(last + 1);
                    let from = lblk;
                    new_blocks.extend((from..hole_end).filter(|l| held.binary_search(l).is_err()));
                    lblk = hole_end;
                }
            }
        }
        Ok(Some(new_blocks))
    }

    /// Reserve the budget for holding `new_blocks` of `ino`: a block each
    /// and an extent insert per run they start. False when the balance
    /// cannot cover it. With bigalloc the budget counts clusters, and a
    /// block each is a cluster each: more than the write-out takes (a run
    /// of n blocks fills at most n new clusters, a block of a cluster the
    /// file has none); what it does not take goes back then. The kernel
    /// reserves per new logical cluster (`ext4_insert_delayed_blocks`).
    fn reserve_for(&mut self, ino: u32, inode: &Inode, new_blocks: &[u64]) -> bool {
        if new_blocks.is_empty() {
            return true;
        }
        let per_run = mapping::append_cost_bound(inode, 1);
        let new_runs = {
            let files = self.core.delayed.files.lock();
            let held = files.get(&ino);
            let is_held = |lblk: u64| held.is_some_and(|file| file.blocks.contains_key(&lblk));
            new_blocks
                .iter()
                .enumerate()
                .filter(|(index, lblk)| {
                    let previous = lblk.checked_sub(1);
                    let joins_new = *index > 0 && previous == Some(new_blocks[index - 1]);
                    !joins_new && !previous.is_some_and(is_held)
                })
                .count() as u64
        };
        let blocks = new_blocks.len() as u64 + new_runs * per_run;
        if !self.reserve_delayed(blocks) {
            return false;
        }
        let mut files = self.core.delayed.files.lock();
        let file = files
            .entry(ino)
            .or_insert_with(|| HeldFile::new(inode.size));
        file.reserved += blocks;
        true
    }

    /// Write the next chunk of `ino`'s held data up to block `up_to`;
    /// returns whether more is held up to there.
    fn write_out_chunk(&mut self, ino: u32, up_to: u64) -> Result<bool> {
        let delayed = &self.core.delayed;
        let Some(chunk) = delayed.chunk(ino, up_to) else {
            return Ok(false);
        };
        self.claim_reserved(chunk.claim);
        let result = self.with_file(ino, super::file::Writer::HeldData, |tx, inode| {
            for (start, bytes) in &chunk.runs {
                let at = start * tx.core.geo.block_size as u64;
                // Only what lies within the size: the rest of the last
                // block is zeros, which a fresh block gets anyway.
                let within = chunk.size.saturating_sub(at).min(bytes.len() as u64);
                if within == 0 {
                    continue;
                }
                let written = tx.write_data(ino, inode, at, &bytes[..within as usize])?;
                if written < within as usize {
                    return Err(Error::NoSpace);
                }
            }
            Ok(())
        });
        match result {
            Ok(()) => {
                delayed.written(ino, &chunk);
                Ok(delayed.holds_up_to(ino, up_to))
            }
            Err(error) => {
                // Out of space with nothing a commit would free: a
                // reservation missed blocks (`transact` retries the other
                // case after the commit).
                debug_assert!(
                    !matches!(error, Error::NoSpace) || self.space_wait.is_some(),
                    "write-out of inode {ino} out of space: a reservation missed blocks"
                );
                // Still held: it keeps its reservation.
                self.core.sbi.budget.restore_reservation(chunk.claim);
                Err(error)
            }
        }
    }
}

impl Delayed {
    /// Copy `data` into `ino`'s held blocks (reserved by `reserve_for`).
    fn hold(&self, ino: u32, disk_size: u64, offset: u64, data: &[u8]) {
        let block_size = self.block_size as u64;
        let mut files = self.files.lock();
        let file = files.entry(ino).or_insert_with(|| HeldFile::new(disk_size));
        let end = offset + data.len() as u64;
        let mut position = offset;
        let mut added = 0u64;
        while position < end {
            let lblk = position / block_size;
            let within = (position - lblk * block_size) as usize;
            let count = ((block_size as usize - within) as u64).min(end - position) as usize;
            let block = file.blocks.entry(lblk).or_insert_with(|| {
                added += 1;
                vec![0u8; self.block_size].into_boxed_slice()
            });
            let from = (position - offset) as usize;
            block[within..within + count].copy_from_slice(&data[from..from + count]);
            position += count as u64;
        }
        file.size = file.size.max(end);
        self.bytes.fetch_add(added * block_size, Ordering::AcqRel);
        self.held_writes.fetch_add(1, Ordering::Relaxed);
    }
}

impl Fs {
    /// Write `ino`'s held data out, if it holds any.
    pub(crate) fn write_out(&self, ino: u32, reason: WriteOut) -> Result<()> {
        let delayed = &self.core.delayed;
        if !delayed.holds(ino) {
            return Ok(());
        }
        if reason == WriteOut::Fsync && faults::active(Fault::DelallocFsyncSkipsWriteOut) {
            return Ok(());
        }
        delayed.note_write_out(reason);
        // What is held now, not what writers add meanwhile: the write-out
        // ends (the kernel's TOWRITE tag).
        let Some(up_to) = delayed.last_held(ino) else {
            return Ok(());
        };
        // Caller root, and space released: a write-out draws on both
        // reserves rather than fail (its reservation covers it; they are
        // the margin for an estimate's miss). A file freed meanwhile holds
        // nothing: its release discarded it under the inode lock.
        loop {
            let more =
                self.transact_releasing(Scope::File(ino), CREDITS_WRITE_OUT, Caller::ROOT, |tx| {
                    let _inode = tx.lock_write(ino, Rank::Inode);
                    tx.write_out_chunk(ino, up_to)
                })?;
            if !more {
                return Ok(());
            }
        }
    }

    /// Run `op` on `ino` with nothing of it held: written out first, and
    /// again whenever a write held more before `op` took the inode's lock
    /// (`op` checks `Delayed::holds` under it and returns None then).
    pub(crate) fn with_nothing_held<R>(
        &self,
        ino: u32,
        mut op: impl FnMut() -> Result<Option<R>>,
    ) -> Result<R> {
        loop {
            self.write_out(ino, WriteOut::Mapping)?;
            if let Some(value) = op()? {
                return Ok(value);
            }
        }
    }

    /// Write every held file out.
    pub(crate) fn write_out_all(&self, reason: WriteOut) -> Result<()> {
        for (_, ino) in self.core.delayed.oldest_first() {
            self.write_out(ino, reason)?;
        }
        Ok(())
    }

    /// Files held longer than the commit interval are written out (the
    /// flusher, every tick).
    pub(crate) fn write_out_expired(&self) -> Result<()> {
        let age = self.core.options.commit_interval;
        let now = Instant::now();
        for (since, ino) in self.core.delayed.oldest_first() {
            if now.duration_since(since) < age {
                break;
            }
            self.write_out(ino, WriteOut::Age)?;
        }
        Ok(())
    }

    /// After a write to `ino`: a file holding more than `HELD_PER_FILE`
    /// goes out (a stream); past the memory bound, the oldest files go out
    /// until an eighth of it is free; low on space, every file goes out.
    /// Write-outs stay small, so that a commit that must wait for their
    /// data on the device — another directory's fsync meeting the host's
    /// own ordering — never meets tens of megabytes at once.
    pub(crate) fn after_delayed_write(&self, ino: u32) -> Result<()> {
        let delayed = &self.core.delayed;
        if !delayed.enabled {
            return Ok(());
        }
        if delayed.held_by(ino) > HELD_PER_FILE {
            self.write_out(ino, WriteOut::Stream)?;
        }
        if delayed.over_limit() {
            for (_, ino) in delayed.oldest_first() {
                if delayed.bytes.load(Ordering::Acquire) <= delayed.limit - delayed.limit / 8 {
                    break;
                }
                self.write_out(ino, WriteOut::Memory)?;
            }
        }
        let budget = &self.core.sbi.budget;
        if budget.reserved() > 0 && low_on_space(budget) {
            self.write_out_all(WriteOut::Space)?;
        }
        Ok(())
    }

    /// Start the thread that writes out data held longer than the commit
    /// interval. It holds the filesystem only during a pass; unmount
    /// joins it, so that no pass outlives the mount (nor a reference to
    /// its device).
    pub(crate) fn start_flusher(self: &Arc<Self>) {
        let weak: Weak<Fs> = Arc::downgrade(self);
        let spawned = std::thread::Builder::new()
            .name("jext4-delalloc".into())
            .spawn(move || {
                loop {
                    std::thread::park_timeout(FLUSHER_TICK);
                    let Some(fs) = weak.upgrade() else { break };
                    if fs.unmounted.load(Ordering::Acquire) {
                        break;
                    }
                    // A panic here must not leave the mount without its
                    // write-outs unnoticed: the journal aborts, as for a
                    // panic in a FUSE worker.
                    let pass = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                        fs.write_out_expired()
                    }));
                    match pass {
                        Ok(Ok(())) => {}
                        Ok(Err(error)) => {
                            tracing::warn!(%error, "delayed allocation: write-out by age failed")
                        }
                        Err(_) => {
                            fs.abort("panic in the delayed-allocation flusher");
                            break;
                        }
                    }
                }
            });
        match spawned {
            Ok(handle) => *self.flusher.lock() = Some(handle),
            // Held data still goes out at fsync, sync, its memory bound
            // and unmount: only the age bound is lost.
            Err(error) => tracing::warn!(%error, "delayed allocation: no flusher thread"),
        }
    }

    /// Unmount: wake the flusher and wait for it to end (unless this is
    /// the flusher, dropping the last reference).
    pub(crate) fn stop_flusher(&self) {
        debug_assert!(self.unmounted.load(Ordering::Acquire));
        let Some(handle) = self.flusher.lock().take() else {
            return;
        };
        if handle.thread().id() == std::thread::current().id() {
            return;
        }
        handle.thread().unpark();
        if handle.join().is_err() {
            tracing::error!("delayed allocation: the flusher thread panicked");
        }
    }

    /// Delayed-allocation counters (`jext4 stats`).
    pub fn delalloc_stats(&self) -> DelallocStats {
        self.core.delayed.stats()
    }
}

/// How often the flusher looks for held data older than the commit
/// interval.
pub(crate) const FLUSHER_TICK: Duration = Duration::from_millis(250);

/// `jext4 stats` lines about delayed allocation.
pub(crate) fn stats_lines(stats: &DelallocStats) -> Vec<String> {
    let mut lines = vec![
        format!("delalloc_enabled {}", stats.enabled),
        format!("delalloc_bytes_held {}", stats.bytes_held),
        format!("delalloc_files_held {}", stats.files_held),
        format!("delalloc_limit_bytes {}", stats.limit),
        format!("delalloc_held_writes {}", stats.held_writes),
        format!("delalloc_blocks_written_out {}", stats.blocks_written_out),
    ];
    for (reason, count) in &stats.write_outs {
        lines.push(format!("delalloc_write_outs_{reason} {count}"));
    }
    lines
}
