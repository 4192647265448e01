//! Block and inode bitmaps: bit operations, searches, and the bitmap a
//! group with `BLOCK_UNINIT` implicitly has.
//!
//! Bits are little-endian within bytes (bit n is byte n/8, mask 1 << n%8),
//! as ext2's `ext2fs_test_bit`. The checksums live in the group descriptor
//! (`group_desc.rs`).

use super::group_desc::GroupLocations;
use super::superblock::Geometry;

#[inline]
pub fn test_bit(bitmap: &[u8], bit: usize) -> bool {
    bitmap[bit / 8] & (1 << (bit % 8)) != 0
}

#[inline]
pub fn set_bit(bitmap: &mut [u8], bit: usize) {
    bitmap[bit / 8] |= 1 << (bit % 8);
}

#[inline]
pub fn clear_bit(bitmap: &mut [u8], bit: usize) {
    bitmap[bit / 8] &= !(1 << (bit % 8));
}

/// Set bits `start..start+count`.
pub fn set_range(bitmap: &mut [u8], start: usize, count: usize) {
    for bit in start..start + count {
        set_bit(bitmap, bit);
    }
}

/// First clear bit in `start..end`, skipping whole full bytes quickly.
pub fn find_zero(bitmap: &[u8], start: usize, end: usize) -> Option<usize> {
    let mut bit = start;
    while bit < end {
        if bit % 8 == 0 && bit + 8 <= end && bitmap[bit / 8] == 0xFF {
            bit += 8;
            continue;
        }
        if !test_bit(bitmap, bit) {
            return Some(bit);
        }
        bit += 1;
    }
    None
}

/// Length of the run of clear bits starting at `start`, at most `limit`,
/// not crossing `end`.
pub fn zero_run(bitmap: &[u8], start: usize, end: usize, limit: usize) -> usize {
    let mut length = 0;
    while start + length < end && length < limit && !test_bit(bitmap, start + length) {
        length += 1;
    }
    length
}

/// Number of set bits among the first `bits` bits.
pub fn count_set(bitmap: &[u8], bits: usize) -> usize {
    let full = bits / 8;
    let mut count: usize = bitmap[..full].iter().map(|b| b.count_ones() as usize).sum();
    for bit in full * 8..bits {
        count += test_bit(bitmap, bit) as usize;
    }
    count
}

/// The block bitmap of a `BLOCK_UNINIT` group, as the kernel's
/// `ext4_init_block_bitmap` and e2fsck compute it: the superblock backup and
/// descriptor tables of this group, every group's bitmaps and inode table
/// that fall inside this group (flex_bg packs them into the first group of
/// each flex group), and the tail past the end of the filesystem. Padding
/// bits beyond `blocks_per_group` up to the block's end are set too.
pub fn uninit_block_bitmap(
    geo: &Geometry,
    group: u32,
    groups: impl IntoIterator<Item = GroupLocations>,
    out: &mut [u8],
) {
    out.fill(0);
    let first = geo.group_first_block(group);
    let in_group = geo.blocks_in_group(group) as u64;
    set_range(out, 0, geo.group_overhead_blocks(group) as usize);
    let mut mark = |block: u64, count: u64| {
        for b in block..block + count {
            if b >= first && b < first + in_group {
                set_bit(out, (b - first) as usize);
            }
        }
    };
    for at in groups {
        mark(at.block_bitmap, 1);
        mark(at.inode_bitmap, 1);
        mark(at.inode_table, geo.inode_table_blocks as u64);
    }
    // Bits for blocks past the end of a short last group, and past
    // blocks_per_group to the end of the bitmap block, are set.
    for bit in in_group as usize..out.len() * 8 {
        set_bit(out, bit);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn search_and_count() {
        let mut bitmap = vec![0u8; 16];
        set_range(&mut bitmap, 0, 20);
        assert_eq!(find_zero(&bitmap, 0, 128), Some(20));
        assert_eq!(zero_run(&bitmap, 20, 128, 1000), 108);
        set_bit(&mut bitmap, 30);
        assert_eq!(zero_run(&bitmap, 20, 128, 1000), 10);
        assert_eq!(count_set(&bitmap, 128), 21);
        clear_bit(&mut bitmap, 5);
        assert_eq!(find_zero(&bitmap, 0, 128), Some(5));
        assert_eq!(find_zero(&[0xFF; 4], 0, 32), None);
    }
}
