//! The block-level machinery of the replay: sets of block ranges, the
//! allocator the format algorithms see, and the bitmap bits of blocks and
//! inodes the records name (the scratch device is `dev::overlay`'s). The
//! allocator (`fs/alloc.rs`) finds free blocks and inodes; the replay also
//! needs to claim and release given ones.

use crate::error::{Error, Location, Result};
use crate::format::{BlockAllocator, bitmap};
use crate::fs::Tx;
use crate::journal::Handle;

// ---------------------------------------------------------------------------
// Sets of block ranges.

/// A `[start, end)` run of blocks.
pub(super) type Range = (u64, u64);

/// Sorted, non-overlapping, non-adjacent `[start, end)` block ranges.
#[derive(Debug, Default, Clone)]
pub(super) struct BlockRanges {
    pub(super) ranges: Vec<(u64, u64)>,
}

impl BlockRanges {
    pub(super) fn from_blocks(blocks: &[u64]) -> Self {
        let mut ranges = BlockRanges::default();
        for &block in blocks {
            ranges.ranges.push((block, block + 1));
        }
        ranges.normalize();
        ranges
    }

    pub(super) fn push(&mut self, start: u64, end: u64) {
        if start < end {
            self.ranges.push((start, end));
        }
    }

    pub(super) fn normalize(&mut self) {
        self.ranges.sort_unstable();
        let mut merged: Vec<(u64, u64)> = Vec::with_capacity(self.ranges.len());
        for &(start, end) in &self.ranges {
            match merged.last_mut() {
                Some(last) if start <= last.1 => last.1 = last.1.max(end),
                _ => merged.push((start, end)),
            }
        }
        self.ranges = merged;
    }

    pub(super) fn overlaps(&self, start: u64, end: u64) -> bool {
        let at = self
            .ranges
            .partition_point(|&(_, range_end)| range_end <= start);
        self.ranges
            .get(at)
            .is_some_and(|&(range_start, _)| range_start < end)
    }

    /// `[start, end)` cut into the pieces inside these ranges and outside.
    pub(super) fn split(&self, start: u64, end: u64) -> (Vec<Range>, Vec<Range>) {
        let (mut inside, mut outside) = (Vec::new(), Vec::new());
        let mut at = start;
        let mut index = self
            .ranges
            .partition_point(|&(_, range_end)| range_end <= start);
        while at < end {
            match self.ranges.get(index) {
                Some(&(range_start, range_end)) if range_start < end => {
                    if at < range_start {
                        outside.push((at, range_start));
                    }
                    let piece_end = range_end.min(end);
                    inside.push((at.max(range_start), piece_end));
                    at = piece_end;
                    index += 1;
                }
                _ => {
                    outside.push((at, end));
                    at = end;
                }
            }
        }
        (inside, outside)
    }

    /// The pieces of these ranges that `other` does not cover.
    pub(super) fn minus(&self, other: &BlockRanges) -> Vec<(u64, u64)> {
        self.ranges
            .iter()
            .flat_map(|&(start, end)| other.split(start, end).1)
            .collect()
    }
}

// ---------------------------------------------------------------------------
// The allocator the replay's format algorithms see.

/// The engine's allocator, except that (1) the first allocation after
/// `pin` returns the pinned blocks (ADD_RANGE maps blocks the record names:
/// `mapping::allocate` takes its data blocks first, in one call), and (2)
/// freeing a reserved block leaves it marked in use until the end of the
/// replay, so that nothing else is allocated on it meanwhile.
pub(super) struct ReplayAllocator<'r, 'a, 'j> {
    pub(super) tx: &'r mut Tx<'a, 'j>,
    pub(super) reserved: &'r BlockRanges,
    /// Reserved blocks freed by the replay: released at the end unless
    /// some inode maps them again.
    pub(super) released: &'r mut BlockRanges,
    pub(super) pinned: Option<(u64, u32)>,
}

impl BlockAllocator for ReplayAllocator<'_, '_, '_> {
    // Replay runs before the mount, unmetered: what it maps was accepted
    // within a budget before the crash.
    fn charge(&mut self, blocks: u64) -> Result<()> {
        self.tx.charge(blocks)
    }

    fn charge_run(&mut self, fixed: u64, flexible: u64) -> Result<u64> {
        self.tx.charge_run(fixed, flexible)
    }

    fn alloc_blocks(&mut self, _handle: &Handle<'_>, goal: u64, count: u32) -> Result<(u64, u32)> {
        if let Some((start, len)) = self.pinned.take() {
            return Ok((start, count.min(len)));
        }
        self.tx.alloc_data_blocks(goal, count)
    }

    fn free_blocks(
        &mut self,
        handle: &Handle<'_>,
        start: u64,
        count: u64,
        metadata: bool,
    ) -> Result<()> {
        let (inside, outside) = self.reserved.split(start, start + count);
        for (piece_start, piece_end) in outside {
            self.tx
                .release_blocks(piece_start, piece_end - piece_start, metadata)?;
        }
        for (piece_start, piece_end) in inside {
            self.released.push(piece_start, piece_end);
            handle.free_blocks(piece_start, piece_end - piece_start, metadata);
        }
        Ok(())
    }
}

// ---------------------------------------------------------------------------
// Bitmap bits of given blocks and inodes.

/// Set (`in_use`) or clear the bits of blocks `[start, end)`, keeping the
/// free counts exact. Returns the ranges whose bits changed.
pub(super) fn mark_blocks(
    tx: &mut Tx<'_, '_>,
    start: u64,
    end: u64,
    in_use: bool,
) -> Result<Vec<Range>> {
    let geo = &tx.core.geo;
    if start < geo.first_data_block as u64 || end > geo.blocks_count {
        return Err(Error::corrupt(
            Location::Block { block: start },
            format!("blocks {start}..{end} lie outside the filesystem"),
        ));
    }
    let mut changed = Vec::new();
    let mut block = start;
    // One group per round.
    while block < end {
        let group = geo.group_of_block(block);
        let base = geo.group_first_block(group);
        let group_end = (base + geo.blocks_in_group(group) as u64).min(end);
        let mut desc = tx.lock_group(group);
        let buffer = tx.block_bitmap(&mut desc)?;
        let mut bytes = tx.handle.get_write_access(&buffer)?;
        let mut flipped = 0u32;
        for at in block..group_end {
            let bit = (at - base) as usize;
            if bitmap::test_bit(&bytes, bit) != in_use {
                if in_use {
                    bitmap::set_bit(&mut bytes, bit);
                } else {
                    bitmap::clear_bit(&mut bytes, bit);
                }
                flipped += 1;
                match changed.last_mut() {
                    Some((_, last_end)) if *last_end == at => *last_end = at + 1,
                    _ => changed.push((at, at + 1)),
                }
            }
        }
        if flipped > 0 {
            if in_use {
                desc.free_blocks = desc.free_blocks.checked_sub(flipped).ok_or_else(|| {
                    Error::corrupt(
                        Location::GroupDescriptor { group },
                        "free block count below the bitmap's",
                    )
                })?;
            } else {
                desc.free_blocks += flipped;
            }
            desc.set_block_bitmap_csum(geo, &bytes);
        }
        drop(bytes);
        block = group_end;
    }
    Ok(changed)
}

/// Whether `ino`'s bit is set (an inode in a never-initialised part of the
/// table is free).
pub(super) fn inode_in_use(tx: &Tx<'_, '_>, ino: u32) -> Result<bool> {
    let geo = &tx.core.geo;
    let group = geo.group_of_inode(ino);
    let index = geo.inode_index_in_group(ino);
    if index >= tx.core.groups.initialised_inodes(group) {
        return Ok(false);
    }
    let buffer = tx.core.cache.read(tx.core.groups.at(group).inode_bitmap)?;
    let used = bitmap::test_bit(&buffer.read(), index as usize);
    Ok(used)
}

/// Claim inode `ino` in its group (`ext4_mark_inode_used`), counting it
/// and, for a directory, the group's directories.
pub(super) fn mark_inode_in_use(tx: &mut Tx<'_, '_>, ino: u32, is_dir: bool) -> Result<()> {
    tx.claim_inode(ino, is_dir).map(|_| ())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ranges(pairs: &[(u64, u64)]) -> BlockRanges {
        let mut ranges = BlockRanges::default();
        for &(start, end) in pairs {
            ranges.push(start, end);
        }
        ranges.normalize();
        ranges
    }

    #[test]
    fn ranges_merge_split_and_subtract() {
        let set = ranges(&[(10, 20), (15, 25), (25, 30), (40, 41), (5, 5)]);
        assert_eq!(set.ranges, vec![(10, 30), (40, 41)]);
        assert!(set.overlaps(29, 35) && set.overlaps(0, 11) && !set.overlaps(30, 40));
        assert_eq!(
            set.split(0, 45),
            (vec![(10, 30), (40, 41)], vec![(0, 10), (30, 40), (41, 45)])
        );
        assert_eq!(set.split(12, 14), (vec![(12, 14)], vec![]));
        assert_eq!(set.split(31, 39), (vec![], vec![(31, 39)]));
        let other = ranges(&[(0, 12), (20, 22), (40, 50)]);
        assert_eq!(set.minus(&other), vec![(12, 20), (22, 30)]);
        assert_eq!(
            BlockRanges::from_blocks(&[7, 3, 4, 5, 9]).ranges,
            vec![(3, 6), (7, 8), (9, 10)]
        );
    }
}
