//! The block-level machinery of the replay: a scratch overlay of the
//! device, sets of block ranges, the allocator the format algorithms see,
//! and the bitmap bits of blocks and inodes the records name. The
//! allocator (`fs/alloc.rs`) finds free blocks and inodes; the replay also
//! needs to claim and release given ones.

use crate::dev::BlockDevice;
use crate::error::{Error, Location, Result};
use crate::format::{BlockAllocator, bitmap};
use crate::fs::Tx;
use crate::journal::Handle;
use parking_lot::Mutex;
use std::collections::BTreeMap;
use std::sync::Arc;

// ---------------------------------------------------------------------------
// A scratch layer over the device.

/// Reads fall through to the device; writes stay here, whole blocks, until
/// `take_blocks`. The engine runs on it so that nothing reaches the device
/// before the journal has the replay's blocks.
pub(super) struct OverlayDevice {
    base: Arc<dyn BlockDevice>,
    block_size: u64,
    /// Block number → bytes [guards: none beyond its own lock].
    written: Mutex<BTreeMap<u64, Vec<u8>>>,
}

impl OverlayDevice {
    pub(super) fn new(base: Arc<dyn BlockDevice>, block_size: u32) -> Self {
        OverlayDevice {
            base,
            block_size: block_size as u64,
            written: Mutex::new(BTreeMap::new()),
        }
    }

    pub(super) fn take_blocks(&self) -> BTreeMap<u64, Vec<u8>> {
        std::mem::take(&mut *self.written.lock())
    }

    /// Each block piece of `[offset, offset + len)`: (block, offset in the
    /// block, offset in the caller's buffer, length).
    fn pieces(&self, offset: u64, len: usize) -> Vec<(u64, usize, usize, usize)> {
        let mut pieces = Vec::new();
        let mut done = 0;
        while done < len {
            let at = offset + done as u64;
            let block = at / self.block_size;
            let within = (at % self.block_size) as usize;
            let take = (self.block_size as usize - within).min(len - done);
            pieces.push((block, within, done, take));
            done += take;
        }
        pieces
    }
}

impl BlockDevice for OverlayDevice {
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> std::io::Result<()> {
        crate::dev::check_range(offset, buf.len(), self.size_bytes())?;
        let written = self.written.lock();
        for (block, within, at, len) in self.pieces(offset, buf.len()) {
            match written.get(&block) {
                Some(bytes) => buf[at..at + len].copy_from_slice(&bytes[within..within + len]),
                None => self
                    .base
                    .read_at(offset + at as u64, &mut buf[at..at + len])?,
            }
        }
        Ok(())
    }

    fn write_at(&self, offset: u64, buf: &[u8]) -> std::io::Result<()> {
        crate::dev::check_range(offset, buf.len(), self.size_bytes())?;
        let mut written = self.written.lock();
        for (block, within, at, len) in self.pieces(offset, buf.len()) {
            let bytes = match written.entry(block) {
                std::collections::btree_map::Entry::Occupied(entry) => entry.into_mut(),
                std::collections::btree_map::Entry::Vacant(entry) => {
                    let mut bytes = vec![0u8; self.block_size as usize];
                    self.base.read_at(block * self.block_size, &mut bytes)?;
                    entry.insert(bytes)
                }
            };
            bytes[within..within + len].copy_from_slice(&buf[at..at + len]);
        }
        Ok(())
    }

    fn flush(&self) -> std::io::Result<()> {
        Ok(())
    }

    fn size_bytes(&self) -> u64 {
        self.base.size_bytes()
    }
}

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
    use crate::dev::MemoryDevice;

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

    #[test]
    fn overlay_keeps_writes_and_reads_through() {
        let base: Arc<dyn BlockDevice> = Arc::new(MemoryDevice::from_bytes(
            (0..8192u32).map(|i| (i % 251) as u8).collect(),
        ));
        let overlay = OverlayDevice::new(Arc::clone(&base), 4096);
        // A write across the block boundary, sector-aligned.
        overlay.write_at(3584, &[0xAA; 1024]).unwrap();
        let mut bytes = vec![0u8; 8192];
        overlay.read_at(0, &mut bytes).unwrap();
        assert!(bytes[3584..4608].iter().all(|&b| b == 0xAA));
        assert_eq!(bytes[100], 100);
        assert_eq!(bytes[5000], (5000 % 251) as u8);
        let mut untouched = vec![0u8; 512];
        base.read_at(3584, &mut untouched).unwrap();
        assert_eq!(
            untouched[0],
            (3584 % 251) as u8,
            "the device is not written"
        );
        let blocks = overlay.take_blocks();
        assert_eq!(blocks.keys().copied().collect::<Vec<_>>(), vec![0, 1]);
        assert_eq!(blocks[&1][0], 0xAA);
        assert_eq!(blocks[&1][600], ((4096 + 600) % 251) as u8);
    }
}
