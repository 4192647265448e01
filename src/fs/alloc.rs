//! Block and inode allocation.
//!
//! Blocks: first fit from a goal block, scanning forward group by group and
//! wrapping, so that a file written sequentially gets contiguous blocks
//! after its previous ones (the goal comes from `format::mapping`), and a
//! new file starts near its inode. A regular file's run leaves the free
//! blocks after it as the file's preallocation window, which its next
//! append takes first and other files' searches step over until nothing
//! else is left (`prealloc.rs`). Free counts in descriptors are exact at
//! every operation; the totals are counters (`SbInfo`).
//!
//! Inodes: files go to their directory's group; directories are spread
//! Orlov-style: top-level directories to the emptiest flex group (round
//! robin among the above-average ones), others near their parent unless
//! that flex group is crowded.
//!
//! Lazy-init groups (`BLOCK_UNINIT`, `INODE_UNINIT`, `bg_itable_unused`) are
//! initialised on first allocation, the way the kernel does.
//!
//! bigalloc: a bitmap bit, a descriptor's free count and the space budget
//! count clusters. The interface stays in blocks, in whole clusters: every
//! run asked for, handed out or freed starts on a cluster and spans whole
//! ones (asserted); which blocks of a cluster a file uses is the mapping's
//! business (`format::extent`). Bits inside a group are cluster numbers
//! from the group's first block (`bit_block`, `block_bit`).
//!
//! Locks: one group at a time [Group], taken here and released before
//! the next group is tried; the bitmaps' buffers inside it. The search
//! skips groups by their unlocked counts and rechecks under the lock.

use super::Tx;
use super::group::{BLOCK_ALLOC_REFUSED, BLOCK_BITMAP_CORRUPT, GroupGuard, INODE_BITMAP_CORRUPT};
use super::prealloc::{Window, WindowAsk};
use crate::cache::Buffer;
use crate::error::{Error, Location, Result};
use crate::format::BlockAllocator;
use crate::format::bitmap;
use crate::format::group_desc::{BG_BLOCK_UNINIT, BG_INODE_UNINIT, GroupDesc};
use crate::format::superblock::{ROOT_INO, incompat};
use crate::journal::Handle;
use crate::journal::change::Change;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

/// What block allocation did, for `jext4 stats` and the metric-4 test: a
/// search near full must not walk blocks it may not take one by one.
#[derive(Default)]
pub(crate) struct AllocCounters {
    calls: AtomicU64,
    groups_searched: AtomicU64,
    candidates_skipped: AtomicU64,
    window_blocks: AtomicU64,
}

/// What one search of `find_and_take` looks for.
#[derive(Debug, Clone, Copy)]
struct Search {
    count: u32,
    /// Leave the free blocks after the run as this file's window.
    window: Option<WindowAsk>,
    /// Take blocks of other files' windows too (nothing else is left).
    over_windows: bool,
}

/// A snapshot of `AllocCounters`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AllocStats {
    /// Block allocations asked for.
    pub calls: u64,
    /// Groups locked and searched by them.
    pub groups_searched: u64,
    /// Free runs found and passed over (blocks a checkpoint pass was
    /// writing home).
    pub candidates_skipped: u64,
    /// Blocks allocated out of files' preallocation windows.
    pub window_blocks: u64,
    /// Blocks preallocation windows hold now (free blocks other files'
    /// searches step over until nothing else is left).
    pub windows_holding: u64,
}

impl AllocCounters {
    pub fn snapshot(&self) -> AllocStats {
        AllocStats {
            calls: self.calls.load(Ordering::Relaxed),
            groups_searched: self.groups_searched.load(Ordering::Relaxed),
            candidates_skipped: self.candidates_skipped.load(Ordering::Relaxed),
            window_blocks: self.window_blocks.load(Ordering::Relaxed),
            windows_holding: 0,
        }
    }
}

impl Tx<'_, '_> {
    /// May this caller use the blocks reserved for root?
    pub(super) fn may_use_reserved(&self) -> bool {
        self.caller.uid == 0
            || self.caller.uid == self.core.resuid
            || self.caller.gid == self.core.resgid
    }

    /// The block bitmap of the locked group, initialised (in the
    /// transaction) if the group was still BLOCK_UNINIT, and checked when
    /// read (`verify_block_bitmap`): one that fails marks the group corrupt
    /// (`mark_group_corrupt`) and is a corruption error, now and whenever
    /// it is asked for again, as the kernel's `ext4_read_block_bitmap`;
    /// one that marks metadata free where the kernel does not check is
    /// returned, its group kept out of allocation (`BLOCK_ALLOC_REFUSED`).
    pub(crate) fn block_bitmap(&self, desc: &mut GroupGuard<'_, '_>) -> Result<Arc<Buffer>> {
        let core = self.core;
        let geo = &core.geo;
        let group = desc.group();
        if desc.is_corrupt(BLOCK_BITMAP_CORRUPT) {
            return Err(Error::corrupt(
                Location::Block {
                    block: desc.block_bitmap,
                },
                format!("the block bitmap of group {group} is corrupt"),
            ));
        }
        if geo.has_group_csum() && desc.flags & BG_BLOCK_UNINIT != 0 {
            let buffer = core.cache.get_for_overwrite(desc.block_bitmap)?;
            {
                let mut bytes = self.handle.get_create_access(&buffer)?;
                bitmap::uninit_block_bitmap(geo, group, core.groups.locations(), &mut bytes);
                desc.flags &= !BG_BLOCK_UNINIT;
                desc.set_block_bitmap_csum(geo, &bytes);
            }
            buffer.set_verified();
            return Ok(buffer);
        }
        let buffer = core.cache.read(desc.block_bitmap)?;
        match verify_block_bitmap(self, desc, &buffer) {
            Err(error) => {
                self.mark_group_corrupt(desc, BLOCK_BITMAP_CORRUPT, &error);
                Err(error)
            }
            Ok(Some(stray)) => {
                if desc.mark_corrupt(BLOCK_ALLOC_REFUSED) {
                    // Logged, not an error: the kernel reads such a bitmap
                    // without a word, and so nothing turns read-only.
                    tracing::error!(
                        group,
                        error = %stray,
                        "group not allocated from: its block bitmap marks metadata free"
                    );
                }
                Ok(buffer)
            }
            Ok(None) => Ok(buffer),
        }
    }

    /// Mark the locked group's block or inode bitmap (`flag`) corrupt
    /// because of `why` (`ext4_mark_group_bitmap_corrupted`): nothing is
    /// allocated from it or freed into it again, and its free blocks or
    /// inodes leave the totals (statfs). `why` is then returned, and
    /// `Fs::note_failure` logs it once, records it in the superblock and
    /// turns the filesystem read-only, as the kernel's `ext4_error` does
    /// under errors=remount-ro (jext4's only error behaviour).
    fn mark_group_corrupt(&self, desc: &mut GroupGuard<'_, '_>, flag: u8, why: &Error) {
        if desc.mark_corrupt(flag) {
            tracing::debug!(group = desc.group(), error = %why, "group bitmap marked corrupt");
        }
    }

    /// The inode bitmap of the locked group, initialised if the group was
    /// still INODE_UNINIT; one whose checksum fails marks the group corrupt
    /// and is a corruption error, now and later (`ext4_read_inode_bitmap`).
    pub(crate) fn inode_bitmap(&self, desc: &mut GroupGuard<'_, '_>) -> Result<Arc<Buffer>> {
        let core = self.core;
        let geo = &core.geo;
        let group = desc.group();
        if desc.is_corrupt(INODE_BITMAP_CORRUPT) {
            return Err(Error::corrupt(
                Location::Block {
                    block: desc.inode_bitmap,
                },
                format!("the inode bitmap of group {group} is corrupt"),
            ));
        }
        if geo.has_group_csum() && desc.flags & BG_INODE_UNINIT != 0 {
            let buffer = core.cache.get_for_overwrite(desc.inode_bitmap)?;
            {
                let mut bytes = self.handle.get_create_access(&buffer)?;
                bytes.fill(0);
                // Bits past inodes_per_group up to the block's end are set
                // (e2fsck checks the padding).
                for bit in geo.inodes_per_group as usize..bytes.len() * 8 {
                    bitmap::set_bit(&mut bytes, bit);
                }
                desc.flags &= !BG_INODE_UNINIT;
                // Nothing of the group's inode table was in use.
                desc.itable_unused = geo.inodes_per_group;
                desc.set_inode_bitmap_csum(geo, &bytes);
            }
            buffer.set_verified();
            return Ok(buffer);
        }
        let buffer = core.cache.read(desc.inode_bitmap)?;
        if !buffer.is_verified() {
            let ok = desc.inode_bitmap_csum_ok(geo, &buffer.read());
            if !ok {
                let error = Error::corrupt(
                    Location::Block {
                        block: desc.inode_bitmap,
                    },
                    format!("inode bitmap checksum mismatch for group {group}"),
                );
                self.mark_group_corrupt(desc, INODE_BITMAP_CORRUPT, &error);
                return Err(error);
            }
            buffer.set_verified();
        }
        Ok(buffer)
    }

    /// Lock group `group`'s descriptor in this transaction.
    pub(crate) fn lock_group(&self, group: u32) -> GroupGuard<'_, '_> {
        let core = self.core;
        core.groups.lock(&core.geo, &core.sbi, self.handle, group)
    }

    /// Allocate up to `count` contiguous blocks, first fit from `goal`,
    /// out of what the operation charged to the space budget. With bigalloc
    /// `count` is whole clusters and so is the run returned.
    pub fn alloc_data_blocks(&mut self, goal: u64, count: u32) -> Result<(u64, u32)> {
        self.alloc_blocks_for(None, goal, count)
    }

    /// `alloc_data_blocks` for the data of file `ino`, which maps `mapped`
    /// blocks: a run that continues the file's last one (`goal`) comes out
    /// of its preallocation window, and a run found by a search keeps the
    /// free blocks after it as the file's window (`prealloc.rs`).
    pub fn alloc_file_blocks(
        &mut self,
        ino: u32,
        mapped: u64,
        goal: u64,
        count: u32,
    ) -> Result<(u64, u32)> {
        let ratio = self.core.geo.cluster_ratio;
        self.alloc_blocks_for(Some(WindowAsk::for_file(ino, mapped, ratio)), goal, count)
    }

    fn alloc_blocks_for(
        &mut self,
        window: Option<WindowAsk>,
        goal: u64,
        count: u32,
    ) -> Result<(u64, u32)> {
        let ratio = self.core.geo.cluster_ratio;
        if count == 0 || !count.is_multiple_of(ratio) {
            // A caller's bug: the mapping asks for whole clusters.
            debug_assert!(
                false,
                "allocating {count} blocks: not whole clusters of {ratio}"
            );
            return Err(Error::Invalid(format!(
                "allocating {count} blocks: not whole clusters of {ratio}"
            )));
        }
        self.core
            .alloc_counters
            .calls
            .fetch_add(1, Ordering::Relaxed);
        let goal = self.core.geo.cluster_start(goal);
        let clusters = self.spend_charge(count / ratio)?;
        let from_window = match window {
            Some(ask) => self.take_from_window(ask.ino, goal, clusters)?,
            None => None,
        };
        let found = match from_window {
            Some(run) => Ok(run),
            None => self.find_and_take(goal, clusters, window),
        };
        let found = found.map(|(start, got)| (start, got * ratio));
        match &found {
            Ok((_, got)) => self.spent((*got / ratio) as u64),
            Err(Error::NoSpace) if self.core.journal.has_pending_frees() => {
                // Charged, so the blocks exist: freed by a commit that is
                // not durable yet, or being written home by a checkpoint.
                self.space_wait = Some(super::budget::SpaceWait::Durable);
            }
            Err(_) => {}
        }
        found
    }

    /// The search of `alloc_data_blocks` for `count` clusters (blocks
    /// without bigalloc; the run returned counts them too): first over
    /// what no window holds (leaving a window for `window`'s file), then,
    /// when that finds nothing and windows hold blocks, over those too.
    fn find_and_take(
        &mut self,
        goal: u64,
        count: u32,
        window: Option<WindowAsk>,
    ) -> Result<(u64, u32)> {
        let core = self.core;
        let geo = &core.geo;
        let goal = if goal >= geo.first_data_block as u64 && goal < geo.blocks_count {
            goal
        } else {
            geo.first_data_block as u64
        };
        let start_group = geo.group_of_block(goal);
        let groups = geo.group_count;
        let durable = core.journal.frees_durable_tid();
        for over_windows in [false, true] {
            if over_windows && core.groups.window_blocks() == 0 {
                break;
            }
            let search = Search {
                count,
                window: window.filter(|_| !over_windows),
                over_windows,
            };
            // One pass over every group from the goal's, then the goal's
            // group again from its start (the part before the goal).
            for step in 0..=groups {
                let group = (start_group + step) % groups;
                let groups_hint = &self.core.groups;
                if !groups_hint.may_allocate(group, durable)
                    || !(over_windows || groups_hint.may_allocate_outside_windows(group))
                {
                    continue;
                }
                let from = if step == 0 {
                    geo.block_bit(group, goal)
                } else {
                    0
                };
                if let Some(found) = self.take_run_in_group(group, from, search)? {
                    return Ok(found);
                }
            }
        }
        // No group had any: the space is freed by transactions not yet
        // durable (ENOSPC now, retried after a commit by `Fs::transact`).
        // A group whose count and bitmap disagree was reported as corrupt
        // by the search itself.
        Err(Error::NoSpace)
    }

    /// Take up to `count` clusters from the start of `ino`'s window when
    /// they continue its last run (`goal`) and are still free; drop the
    /// window otherwise. None: no window served. The run's length returned
    /// is in clusters.
    fn take_from_window(&mut self, ino: u32, goal: u64, count: u32) -> Result<Option<(u64, u32)>> {
        let core = self.core;
        let Some(window) = core.windows.take(ino) else {
            return Ok(None);
        };
        let mut desc = self.lock_group(window.group);
        desc.remove_window(window);
        if core.geo.bit_block(window.group, window.start as usize) != goal {
            return Ok(None);
        }
        let buffer = self.block_bitmap(&mut desc)?;
        if desc.is_corrupt(BLOCK_ALLOC_REFUSED) {
            return Ok(None);
        }
        let range = window.start as usize..window.end() as usize;
        let (found, _) = self.search_group(&mut desc, &buffer, range, count as usize, false);
        let Some((start, length)) = found.filter(|&(start, _)| start == window.start as usize)
        else {
            return Ok(None);
        };
        debug_assert!(length <= count as usize);
        self.take_bits(&mut desc, &buffer, (start, length), false)?;
        let rest = Window {
            group: window.group,
            start: (start + length) as u32,
            len: window.len - length as u32,
        };
        if rest.len > 0 && core.windows.put(ino, rest) {
            desc.add_window(rest.start, rest.len);
        }
        core.alloc_counters
            .window_blocks
            .fetch_add(length as u64, Ordering::Relaxed);
        Ok(Some((
            core.geo.bit_block(window.group, start),
            length as u32,
        )))
    }

    /// Find the first free bit at or after `from` in `group` and take a run
    /// of up to `search.count` blocks there (the rest of what is free
    /// after it, up to the window asked for, becomes that window).
    fn take_run_in_group(
        &mut self,
        group: u32,
        from: usize,
        search: Search,
    ) -> Result<Option<(u64, u32)>> {
        let core = self.core;
        let geo = &core.geo;
        let mut desc = self.lock_group(group);
        if desc.free_blocks == 0 {
            return Ok(None); // taken meanwhile
        }
        let counters = &core.alloc_counters;
        counters.groups_searched.fetch_add(1, Ordering::Relaxed);
        let buffer = self.block_bitmap(&mut desc)?;
        if desc.is_corrupt(BLOCK_ALLOC_REFUSED) {
            return Ok(None); // found so by this read
        }
        // The search skips blocks a checkpoint pass is writing home, which
        // may begin or end during it: sampled before and after, as either
        // explains an empty result (and so do the group's pending mask,
        // stable under the group's lock, and its windows).
        let writing_before = core.journal.has_checkpoint_writing();
        let count = search.count as usize;
        let wanted = count + search.window.map_or(0, |ask| ask.len as usize);
        let range = from..geo.clusters_in_group(group) as usize;
        let lay_windows = !search.over_windows;
        let (found, masked) = self.search_group(&mut desc, &buffer, range, wanted, lay_windows);
        let Some((start, length)) = found else {
            if from == 0 && !masked && !writing_before && !core.journal.has_checkpoint_writing() {
                let error = Error::corrupt(
                    Location::Block {
                        block: desc.block_bitmap,
                    },
                    format!(
                        "group {group} counts {} free blocks but its bitmap has none",
                        desc.free_blocks
                    ),
                );
                self.mark_group_corrupt(&mut desc, BLOCK_BITMAP_CORRUPT, &error);
                return Err(error);
            }
            return Ok(None);
        };
        let taken = length.min(count);
        self.take_bits(&mut desc, &buffer, (start, taken), search.over_windows)?;
        if let Some(ask) = search.window
            && length > taken
        {
            let window = Window {
                group,
                start: (start + taken) as u32,
                len: (length - taken) as u32,
            };
            if core.windows.put(ask.ino, window) {
                desc.add_window(window.start, window.len);
            }
        }
        Ok(Some((geo.bit_block(group, start), taken as u32)))
    }

    /// Mark bits `start..start + length` of the locked group in use; only
    /// a search `over_windows` may take blocks of a window.
    fn take_bits(
        &self,
        desc: &mut GroupGuard<'_, '_>,
        buffer: &Arc<Buffer>,
        (start, length): (usize, usize),
        over_windows: bool,
    ) -> Result<()> {
        let core = self.core;
        let geo = &core.geo;
        let group = desc.group();
        let first = geo.bit_block(group, start);
        let blocks = length as u64 * geo.cluster_ratio as u64;
        // The journal's pending frees are the authority the mask copies.
        // (Not a checkpoint pass's blocks: the search skipped those it was
        // writing, and one that starts meanwhile lists blocks freed and
        // durable too — it does not write them, their buffers left its
        // checkpoint when the free became durable.)
        debug_assert!(
            core.journal
                .freed_not_durable_overlap(first, blocks)
                .is_none(),
            "group {group}'s pending mask let blocks {first}+{blocks} through",
        );
        debug_assert!(
            over_windows
                || desc.window_mask().is_none_or(
                    |mask| (start..start + length).all(|bit| !bitmap::test_bit(mask, bit))
                ),
            "group {group}: blocks {first}+{length} taken out of a window still masked"
        );
        // Whatever the bitmap says, metadata is never handed out (the
        // kernel's ext4_mb_mark_diskspace_used checks the system zone). A
        // bitmap that let a metadata block through failed its check when
        // read, so this is a bitmap changed since: its group is marked.
        if let Some(block) = core.groups.first_metadata_block(geo, first, first + blocks) {
            let error = Error::corrupt(
                Location::Block { block },
                format!("group {group}'s block bitmap marks metadata block {block} free"),
            );
            self.mark_group_corrupt(desc, BLOCK_BITMAP_CORRUPT, &error);
            return Err(error);
        }
        let mut bytes = self.handle.get_write_access(buffer)?;
        if desc.free_blocks < length as u32 {
            return Err(Error::corrupt(
                Location::GroupDescriptor { group },
                "free block count below the bitmap's",
            ));
        }
        bitmap::set_range(&mut bytes, start, length);
        desc.free_blocks -= length as u32;
        desc.set_block_bitmap_csum(geo, &bytes);
        Ok(())
    }

    /// Search the locked group's bitmap over bits `range` for a run of up
    /// to `count` allocatable blocks, with its pending frees laid over it
    /// (retired first up to the journal's durable tid) and, with
    /// `lay_windows`, its preallocation windows; also says whether a mask
    /// was laid.
    fn search_group(
        &self,
        desc: &mut GroupGuard<'_, '_>,
        buffer: &Buffer,
        range: std::ops::Range<usize>,
        count: usize,
        lay_windows: bool,
    ) -> (Option<(usize, usize)>, bool) {
        let group = desc.group();
        let durable = self.core.journal.frees_durable_tid();
        let bytes = buffer.read();
        if let Some(durable) = durable {
            desc.retire_pending(durable);
        }
        let pending = durable.and(desc.pending_mask());
        let windows = desc.window_mask().filter(|_| lay_windows);
        let overlay = bitmap::Overlay::new(&bytes, [pending, windows]);
        let found = self.find_allocatable(&overlay, group, range.start, range.end, count);
        (found, overlay.masked())
    }

    /// The first run of clear bits at or after `from` (bits `..end`) that
    /// contains no block a checkpoint pass is writing home. `bytes` has the
    /// group's pending frees set already: reusing a block before the
    /// commit that frees it is durable could put its old owner, restored
    /// by a crash, on top of its new owner's bytes.
    fn find_allocatable(
        &self,
        bytes: &bitmap::Overlay<'_>,
        group: u32,
        from: usize,
        end: usize,
        count: usize,
    ) -> Option<(usize, usize)> {
        let geo = &self.core.geo;
        let ratio = geo.cluster_ratio as u64;
        let mut from = from;
        // Each round skips one block being written or succeeds; a group
        // has at most `end` bits.
        for _ in 0..=end {
            let start = bytes.find_zero(from, end)?;
            let length = bytes.zero_run(start, end, count);
            match self
                .core
                .journal
                .checkpoint_writing_overlap(geo.bit_block(group, start), length as u64 * ratio)
            {
                None => return Some((start, length)),
                Some((writing_start, writing_end)) => {
                    let counters = &self.core.alloc_counters;
                    counters.candidates_skipped.fetch_add(1, Ordering::Relaxed);
                    // The clusters before the one the write starts in, and
                    // on from the one after it ends.
                    let base = geo.group_first_block(group);
                    let writing_start = (writing_start.saturating_sub(base) / ratio) as usize;
                    if writing_start > start {
                        return Some((start, writing_start - start));
                    }
                    from = (writing_end - base).div_ceil(ratio) as usize;
                    if from >= end {
                        return None;
                    }
                }
            }
        }
        None
    }

    /// Return blocks to the free pool (with bigalloc, whole clusters).
    /// Freeing a block that is free, or one that holds group metadata, is
    /// corruption (a double reference).
    pub fn release_blocks(&mut self, start: u64, count: u64, metadata: bool) -> Result<()> {
        let ratio = self.core.geo.cluster_ratio as u64;
        if !(start.is_multiple_of(ratio) && count.is_multiple_of(ratio)) {
            // The mapping frees whole clusters; a run that is not comes
            // from a structure that cannot hold clusters (a block map).
            return Err(Error::corrupt(
                Location::Block { block: start },
                format!("freeing blocks {start}+{count}: not whole clusters of {ratio}"),
            ));
        }
        self.for_each_group_run(start, count, &mut |alloc, group, start, end| {
            alloc.release_in_group(group, start, end, metadata)
        })
    }

    /// Whether `release_blocks(start, count)` would succeed, checked
    /// without changing anything: the blocks lie inside the filesystem and
    /// outside its metadata, and each group's bitmap loads and has them in
    /// use. A failed check is the error the release would give, and marks
    /// the group corrupt as it would.
    /// With bigalloc the clusters the blocks lie in are checked.
    pub fn check_release_blocks(&mut self, start: u64, count: u64) -> Result<()> {
        let geo = &self.core.geo;
        let (start, count) = match count {
            0 => (start, 0),
            _ => {
                let first = geo.cluster_start(start);
                let last = geo.cluster_start(start.saturating_add(count - 1));
                (first, last - first + geo.cluster_ratio as u64)
            }
        };
        self.for_each_group_run(start, count, &mut |alloc, group, start, end| {
            let mut desc = alloc.lock_group(group);
            alloc
                .verify_release_in_group(&mut desc, start, end)
                .map(drop)
        })
    }

    /// `f(self, group, start, end)` for each group's part of blocks
    /// `start..start + count`, which must lie inside the filesystem.
    fn for_each_group_run(
        &mut self,
        start: u64,
        count: u64,
        f: &mut dyn FnMut(&mut Self, u32, u64, u64) -> Result<()>,
    ) -> Result<()> {
        let geo = &self.core.geo;
        let end = start
            .checked_add(count)
            .filter(|&end| end <= geo.blocks_count);
        if start < geo.first_data_block as u64 || end.is_none() {
            return Err(Error::corrupt(
                Location::Block { block: start },
                format!("freeing {count} blocks outside the filesystem"),
            ));
        }
        let mut block = start;
        let end = start + count;
        while block < end {
            let geo = &self.core.geo;
            let group = geo.group_of_block(block);
            let group_end =
                (geo.group_first_block(group) + geo.blocks_in_group(group) as u64).min(end);
            f(self, group, block, group_end)?;
            block = group_end;
        }
        Ok(())
    }

    /// The checks of freeing blocks `start..end` of the locked group, and
    /// its bitmap if they pass: not metadata, a bitmap that loads, every
    /// block in use there.
    fn verify_release_in_group(
        &self,
        desc: &mut GroupGuard<'_, '_>,
        start: u64,
        end: u64,
    ) -> Result<Arc<Buffer>> {
        let group = desc.group();
        self.check_not_group_metadata(start, end)?;
        let buffer = self.block_bitmap(desc)?;
        let geo = &self.core.geo;
        let ratio = geo.cluster_ratio as usize;
        let already_free = {
            let bytes = buffer.read();
            (start..end)
                .step_by(ratio)
                .find(|&block| !bitmap::test_bit(&bytes, geo.block_bit(group, block)))
        };
        if let Some(block) = already_free {
            // Two owners of one block, or a bitmap that lost bits: the
            // kernel's mb_free_blocks marks the group corrupt and frees
            // nothing more in it.
            let error = Error::corrupt(
                Location::Block { block },
                format!("freeing block {block}, which group {group}'s bitmap has free"),
            );
            self.mark_group_corrupt(desc, BLOCK_BITMAP_CORRUPT, &error);
            return Err(error);
        }
        Ok(buffer)
    }

    fn release_in_group(&mut self, group: u32, start: u64, end: u64, metadata: bool) -> Result<()> {
        let core = self.core;
        let geo = &core.geo;
        let mut desc = self.lock_group(group);
        let buffer = self.verify_release_in_group(&mut desc, start, end)?;
        let (first, bits) = (geo.block_bit(group, start), geo.block_bit(group, end));
        let clusters = bits - first;
        {
            let mut bytes = self.handle.get_write_access(&buffer)?;
            for bit in first..bits {
                bitmap::clear_bit(&mut bytes, bit);
            }
            desc.free_blocks += clusters as u32;
            desc.set_block_bitmap_csum(geo, &bytes);
        }
        if core.journal.frees_durable_tid().is_some() {
            // Not allocatable before this transaction is durable.
            desc.add_pending(self.handle.tid(), first as u32, clusters as u32);
        }
        self.handle.free_blocks(start, end - start, metadata);
        core.sbi.budget.released(clusters as u64);
        Ok(())
    }

    /// Refuse to free superblock copies, descriptor tables, bitmaps and
    /// inode tables and the journal: an extent pointing there is corruption.
    fn check_not_group_metadata(&self, start: u64, end: u64) -> Result<()> {
        let core = self.core;
        if let Some(block) = core.groups.first_metadata_block(&core.geo, start, end) {
            return Err(Error::corrupt(
                Location::Block { block },
                "a file claims blocks that hold filesystem metadata (group metadata or the journal)",
            ));
        }
        Ok(())
    }

    /// Allocate an inode for a new object in directory `parent`.
    pub fn alloc_inode(&mut self, parent: u32, is_dir: bool) -> Result<u32> {
        let core = self.core;
        let groups = core.groups.count();
        let first_choice = self.choose_inode_group(parent, is_dir)?;
        // Other threads may take a group's last inodes between the choice
        // and its lock: then the next groups, each once.
        for step in 0..groups {
            let group = (first_choice + step) % groups;
            // A group whose inode bitmap is corrupt is passed over, the
            // parent's own too, as the kernel's allocator passes over
            // EXT4_MB_GRP_IBITMAP_CORRUPT groups: the error was reported
            // when it was marked.
            let corrupt = core.groups.corrupt(group) & INODE_BITMAP_CORRUPT != 0;
            if corrupt || (step > 0 && core.groups.free_inodes(group) == 0) {
                continue;
            }
            if let Some(ino) = self.alloc_inode_in(group, is_dir)? {
                self.note_inode_allocated(ino);
                return Ok(ino);
            }
        }
        Err(Error::NoSpace)
    }

    /// Whether free inode `ino` should not be handed out now (see
    /// `alloc_inode_in`). Each check takes its leaf lock alone.
    fn inode_held_back(&self, ino: u32) -> bool {
        self.core.remembered.lock().contains_key(&ino)
            || self
                .core
                .fast_commit
                .as_ref()
                .is_some_and(|tracker| tracker.holds_back(ino))
    }

    /// Take a free inode of `group`, if it has one.
    fn alloc_inode_in(&mut self, group: u32, is_dir: bool) -> Result<Option<u32>> {
        let core = self.core;
        let geo = &core.geo;
        let mut desc = self.lock_group(group);
        if desc.free_inodes == 0 {
            return Ok(None);
        }
        let buffer = self.inode_bitmap(&mut desc)?;
        // Reserved inodes (below s_first_ino) live in group 0 and are never
        // handed out even when their bits are clear.
        let first = if group == 0 {
            geo.first_ino as usize - 1
        } else {
            0
        };
        let (first_free, taken) = {
            let bytes = buffer.read();
            let ipg = geo.inodes_per_group as usize;
            let first_free = bitmap::find_zero(&bytes, first, ipg);
            // Skip numbers a front end still names, and numbers whose
            // freeing is not durable yet (`fast_commit`: a new file given
            // one would have to commit with the directory that freed it);
            // if the group has only those left, reusing one is the lesser
            // evil (ENOSPC would be false).
            let mut candidate = first_free;
            while let Some(index) = candidate {
                let ino = group * geo.inodes_per_group + index as u32 + 1;
                if !self.inode_held_back(ino) {
                    break;
                }
                candidate = bitmap::find_zero(&bytes, index + 1, ipg);
            }
            (first_free, candidate.or(first_free))
        };
        let (Some(first_free), Some(index)) = (first_free, taken) else {
            let error = Error::corrupt(
                Location::Block {
                    block: desc.inode_bitmap,
                },
                format!("group {group} counts free inodes but its bitmap has none"),
            );
            self.mark_group_corrupt(&mut desc, INODE_BITMAP_CORRUPT, &error);
            return Err(error);
        };
        // The number taken is checked, and so is the first free one when it
        // was passed over: the kernel's allocator meets that one, and a
        // held-back number may be a live file whose bit the damage cleared
        // (the front end names it because it is live). Skipping it would
        // leave the bitmap wrong where the kernel sets the bit back.
        let checked = if first_free == index {
            &[index][..]
        } else {
            &[first_free, index][..]
        };
        for &index in checked {
            let ino = group * geo.inodes_per_group + index as u32 + 1;
            if let Err(error) = self.check_inode_unused(&desc, index, ino) {
                // The bitmap lost the bit of a live inode: it cannot be
                // trusted for any other. The live inode's bit is set back
                // first, as the kernel's allocator leaves it when it meets
                // the inode in use ("doubly allocated?"): on a journaled
                // image the abort that follows discards it with the rest; on
                // ext2 it stays, and is right.
                let live_dir = self.read_inode(ino).is_ok_and(|live| live.is_dir());
                let _ = self.claim_inode_locked(&mut desc, &buffer, ino, live_dir);
                self.mark_group_corrupt(&mut desc, INODE_BITMAP_CORRUPT, &error);
                return Err(error);
            }
        }
        let ino = group * geo.inodes_per_group + index as u32 + 1;
        self.claim_inode_locked(&mut desc, &buffer, ino, is_dir)?;
        // The guard drops here: the group's initialised inodes count the
        // new one before anyone is told its number.
        drop(desc);
        Ok(Some(ino))
    }

    /// The bitmap may be damaged: an inode that still has links is in use
    /// whatever its bit says, and taking it over would silently turn that
    /// file into the new one. A slot that does not decode (never written,
    /// or garbage) holds nothing to lose, and neither does the part of the
    /// table that lazy init has not zeroed yet (its bytes may be a previous
    /// filesystem's).
    fn check_inode_unused(&self, desc: &GroupDesc, index: usize, ino: u32) -> Result<()> {
        let geo = &self.core.geo;
        if index as u32 >= desc.initialised_inodes(geo) {
            return Ok(());
        }
        if let Ok(existing) = self.read_inode(ino)
            && existing.links_count > 0
            && existing.mode != 0
        {
            return Err(Error::corrupt(
                Location::Inode { ino },
                "inode bitmap marks an inode with links free",
            ));
        }
        Ok(())
    }

    /// Mark inode `ino` in use (bitmap, free and directory counts, the
    /// initialised part of the inode table). Returns false if it already
    /// was. Used by fast-commit replay, which must claim the inodes the log
    /// names.
    pub(crate) fn claim_inode(&mut self, ino: u32, is_dir: bool) -> Result<bool> {
        let group = self.core.geo.group_of_inode(ino);
        let mut desc = self.lock_group(group);
        let buffer = self.inode_bitmap(&mut desc)?;
        self.claim_inode_locked(&mut desc, &buffer, ino, is_dir)
    }

    fn claim_inode_locked(
        &self,
        desc: &mut GroupGuard<'_, '_>,
        buffer: &Arc<Buffer>,
        ino: u32,
        is_dir: bool,
    ) -> Result<bool> {
        let core = self.core;
        let geo = &core.geo;
        let group = desc.group();
        let index = geo.inode_index_in_group(ino) as usize;
        if desc.flags & BG_BLOCK_UNINIT != 0 && geo.has_group_csum() {
            // As the kernel does: a group in use gets a real block bitmap.
            self.block_bitmap(desc)?;
        }
        {
            let mut bytes = self.handle.get_write_access(buffer)?;
            if bitmap::test_bit(&bytes, index) {
                return Ok(false);
            }
            if desc.free_inodes == 0 {
                return Err(Error::corrupt(
                    Location::GroupDescriptor { group },
                    "free inode count underflow",
                ));
            }
            bitmap::set_bit(&mut bytes, index);
            let ipg = geo.inodes_per_group;
            desc.free_inodes -= 1;
            if is_dir {
                desc.used_dirs += 1;
            }
            if geo.has_group_csum() && index as u32 >= ipg - desc.itable_unused {
                desc.itable_unused = ipg - index as u32 - 1;
            }
            desc.set_inode_bitmap_csum(geo, &bytes);
        }
        self.handle.note(Change::InodeAllocated { ino });
        Ok(true)
    }

    pub fn release_inode(&mut self, ino: u32, is_dir: bool) -> Result<()> {
        let core = self.core;
        let geo = &core.geo;
        if ino < geo.first_ino || !geo.is_valid_ino(ino) {
            return Err(Error::corrupt(
                Location::Inode { ino },
                "freeing a reserved or invalid inode",
            ));
        }
        if is_dir {
            // What this mount learnt of the directory's damage dies with
            // it: the number may name a new, sound directory next.
            core.damaged_indexes.lock().remove(&ino);
            core.incomplete_listings.lock().remove(&ino);
        }
        core.verity_descriptors.forget(ino);
        self.charge_inode_release(ino)?;
        // Data held by delayed allocation dies with the file, and its
        // reservation goes back.
        let reserved = core.delayed.discard(ino);
        core.sbi.budget.unreserve(reserved);
        let group = geo.group_of_inode(ino);
        let index = geo.inode_index_in_group(ino) as usize;
        let mut desc = self.lock_group(group);
        let buffer = self.verify_release_inode(&mut desc, ino)?;
        {
            let mut bytes = self.handle.get_write_access(&buffer)?;
            bitmap::clear_bit(&mut bytes, index);
            desc.free_inodes += 1;
            if is_dir {
                desc.used_dirs = desc.used_dirs.saturating_sub(1);
            }
            desc.set_inode_bitmap_csum(geo, &bytes);
        }
        // Under the group's lock, as `claim_inode_locked` notes its
        // allocation: the change observer must see the free before any
        // reuse of the number (else it takes the new file's first name for
        // a link, and forgets the new file).
        self.handle.note(Change::InodeFreed { ino });
        drop(desc);
        Ok(())
    }

    /// Whether `release_inode(ino)` would succeed, checked without
    /// changing anything (see `check_release_blocks`).
    pub fn check_release_inode(&mut self, ino: u32) -> Result<()> {
        let geo = &self.core.geo;
        if ino < geo.first_ino || !geo.is_valid_ino(ino) {
            return Err(Error::corrupt(
                Location::Inode { ino },
                "freeing a reserved or invalid inode",
            ));
        }
        let mut desc = self.lock_group(geo.group_of_inode(ino));
        self.verify_release_inode(&mut desc, ino).map(drop)
    }

    /// The checks of freeing inode `ino` of the locked group, and its
    /// bitmap if they pass: a bitmap that loads, the inode's bit set.
    fn verify_release_inode(&self, desc: &mut GroupGuard<'_, '_>, ino: u32) -> Result<Arc<Buffer>> {
        let index = self.core.geo.inode_index_in_group(ino) as usize;
        let buffer = self.inode_bitmap(desc)?;
        if !bitmap::test_bit(&buffer.read(), index) {
            // The kernel's ext4_free_inode: "bit already cleared", the
            // group's inode bitmap is marked corrupt.
            let error = Error::corrupt(
                Location::Inode { ino },
                "freeing an inode that is already free",
            );
            self.mark_group_corrupt(desc, INODE_BITMAP_CORRUPT, &error);
            return Err(error);
        }
        Ok(buffer)
    }

    fn choose_inode_group(&self, parent: u32, is_dir: bool) -> Result<u32> {
        let core = self.core;
        let geo = &core.geo;
        let parent_group = geo.group_of_inode(parent.max(1));
        if is_dir
            && parent == ROOT_INO
            && let Some(group) = self.orlov_top_level()
        {
            return Ok(group);
        }
        // Files, and directories below the top: the parent's flex group
        // first, then onward.
        let per_flex = geo.groups_per_flex;
        let start = parent_group / per_flex * per_flex;
        let groups = geo.group_count;
        for step in 0..groups {
            let group = (start + step) % groups;
            if core.groups.free_inodes(group) > 0
                && (core.groups.free_blocks(group) > 0 || step + 1 >= groups || !is_dir)
            {
                return Ok(group);
            }
        }
        (0..groups)
            .find(|&group| core.groups.free_inodes(group) > 0)
            .ok_or(Error::NoSpace)
    }

    /// A flex group with at least average free inodes and blocks, chosen
    /// round robin, and its first group with a free inode.
    fn orlov_top_level(&self) -> Option<u32> {
        let core = self.core;
        let geo = &core.geo;
        let per_flex = geo.groups_per_flex;
        let flex_count = geo.group_count.div_ceil(per_flex);
        let average_inodes = core.sbi.free_inodes() / flex_count as u64;
        let average_blocks = core.sbi.free_blocks() / flex_count as u64;
        let start = core.next_topdir_group.load(Ordering::Relaxed) % flex_count;
        for step in 0..flex_count {
            let flex = (start + step) % flex_count;
            let members = flex * per_flex..((flex + 1) * per_flex).min(geo.group_count);
            let (inodes, blocks) = members.clone().fold((0u64, 0u64), |(i, b), g| {
                (
                    i + core.groups.free_inodes(g) as u64,
                    b + core.groups.free_blocks(g) as u64,
                )
            });
            if inodes >= average_inodes.max(1) && blocks >= average_blocks {
                core.next_topdir_group.store(flex + 1, Ordering::Relaxed);
                return members
                    .into_iter()
                    .find(|&g| core.groups.free_inodes(g) > 0);
            }
        }
        None
    }
}

/// Check a block bitmap read from disk, once per read (the buffer is then
/// marked verified), as the kernel's `ext4_validate_block_bitmap` and the
/// buddy build after it do: the checksum matches (metadata_csum); without
/// flex_bg, the group's own bitmaps and inode table are marked in use
/// (`ext4_valid_block_bitmap`, which checks nothing with flex_bg); and the
/// free bits agree with the descriptor's free count
/// (`ext4_mb_generate_buddy`: "block bitmap and bg descriptor
/// inconsistent"). A bitmap that fails is an error. One that passes but
/// marks free any other metadata block inside the group (its superblock
/// copy and descriptor blocks, another group's bitmaps or inode table)
/// comes back with that error as `Some`: the kernel's frees go through
/// there and its allocator meets the block in the system zone, so frees
/// go through here too and the group is kept out of allocation.
fn verify_block_bitmap(
    tx: &Tx<'_, '_>,
    desc: &GroupGuard<'_, '_>,
    buffer: &Buffer,
) -> Result<Option<Error>> {
    if buffer.is_verified() {
        return Ok(None);
    }
    let geo = &tx.core.geo;
    let group = desc.group();
    let location = Location::Block {
        block: desc.block_bitmap,
    };
    let bytes = buffer.read();
    if !desc.block_bitmap_csum_ok(geo, &bytes) {
        return Err(Error::corrupt(
            location,
            format!("block bitmap checksum mismatch for group {group}"),
        ));
    }
    let first = geo.group_first_block(group);
    let ratio = geo.cluster_ratio.max(1) as u64;
    let bit_of = |block: u64| ((block - first) / ratio) as usize;
    let unmarked = |(start, end): (u64, u64)| {
        let zero = bitmap::find_zero(&bytes, bit_of(start), bit_of(end - 1) + 1)?;
        Some((first + zero as u64 * ratio).max(start))
    };
    let marks_free = |block: u64| {
        Error::corrupt(
            location,
            format!("block bitmap of group {group} marks metadata block {block} free"),
        )
    };
    // What the kernel checks (`ext4_valid_block_bitmap`): without flex_bg,
    // the group's own bitmaps and inode table; such a bitmap is refused
    // for frees as well. With flex_bg it checks nothing.
    let at = tx.core.groups.at(group);
    let own = [
        (at.block_bitmap, at.block_bitmap + 1),
        (at.inode_bitmap, at.inode_bitmap + 1),
        (
            at.inode_table,
            at.inode_table + geo.inode_table_blocks as u64,
        ),
    ];
    // (Without flex_bg the mount checked that they lie in their group.)
    let end = first + geo.blocks_in_group(group) as u64;
    let checked = !geo.has_incompat(incompat::FLEX_BG);
    let inside = |&(start, last): &(u64, u64)| checked && first <= start && last <= end;
    if let Some(block) = own.into_iter().filter(inside).find_map(&unmarked) {
        return Err(marks_free(block));
    }
    // Any other metadata marked free (another group's, packed here by
    // flex_bg, or a descriptor copy): the bitmap serves frees, as the
    // kernel's does, but nothing is allocated from it (the kernel's
    // allocator would meet the block, report it and fail the write).
    let stray = (tx.core.groups.metadata_in_group(geo, group))
        .find_map(unmarked)
        .map(marks_free);
    let bits = geo.clusters_per_group as usize;
    let free_bits = bits - bitmap::count_set(&bytes, bits);
    if free_bits != desc.free_blocks as usize {
        return Err(Error::corrupt(
            location,
            format!(
                "block bitmap of group {group} has {free_bits} free clusters, its descriptor counts {}",
                desc.free_blocks
            ),
        ));
    }
    drop(bytes);
    buffer.set_verified();
    Ok(stray)
}

impl BlockAllocator for Tx<'_, '_> {
    fn charge(&mut self, blocks: u64) -> Result<()> {
        Tx::charge(self, blocks)
    }

    fn ea_inode_for(&mut self, owner: u32, value: &[u8], hash: u32, also: u64) -> Result<u32> {
        Tx::ea_inode_for(self, owner, value, hash, also)
    }

    fn change_ea_inode_refs(&mut self, owner: u32, ino: u32, delta: i32) -> Result<()> {
        Tx::change_ea_inode_refs(self, owner, ino, delta)
    }

    fn charge_run(&mut self, fixed: u64, flexible: u64) -> Result<u64> {
        Tx::charge_run(self, fixed, flexible)
    }

    fn alloc_blocks(&mut self, handle: &Handle<'_>, goal: u64, count: u32) -> Result<(u64, u32)> {
        debug_assert!(std::ptr::eq(
            handle as *const _ as *const u8,
            self.handle as *const _ as *const u8
        ));
        self.alloc_data_blocks(goal, count)
    }

    fn alloc_file_blocks(
        &mut self,
        handle: &Handle<'_>,
        (ino, mapped): (u32, u64),
        goal: u64,
        count: u32,
    ) -> Result<(u64, u32)> {
        debug_assert!(std::ptr::eq(
            handle as *const _ as *const u8,
            self.handle as *const _ as *const u8
        ));
        Tx::alloc_file_blocks(self, ino, mapped, goal, count)
    }

    fn free_blocks(
        &mut self,
        handle: &Handle<'_>,
        start: u64,
        count: u64,
        metadata: bool,
    ) -> Result<()> {
        debug_assert!(std::ptr::eq(
            handle as *const _ as *const u8,
            self.handle as *const _ as *const u8
        ));
        self.release_blocks(start, count, metadata)
    }
}
