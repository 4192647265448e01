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

/// The 64 bits from `bit` on (a multiple of 64), bit n of the word being
/// bit `bit + n`: bytes are little-endian words in this bit order.
#[inline]
fn word_at(bitmap: &[u8], bit: usize) -> u64 {
    debug_assert_eq!(bit % 64, 0);
    let at = bit / 8;
    u64::from_le_bytes(bitmap[at..at + 8].try_into().expect("eight bytes"))
}

/// First clear bit in `start..end`, a 64-bit word at a time where whole
/// words lie inside (the allocator scans past the used start of a group
/// on every allocation, as the kernel's `find_next_zero_bit`).
pub fn find_zero(bitmap: &[u8], start: usize, end: usize) -> Option<usize> {
    Overlay::new(bitmap, [None, None]).find_zero(start, end)
}

/// Length of the run of clear bits starting at `start`, at most `limit`,
/// not crossing `end`; whole clear words at a time, as `find_zero`.
pub fn zero_run(bitmap: &[u8], start: usize, end: usize, limit: usize) -> usize {
    Overlay::new(bitmap, [None, None]).zero_run(start, end, limit)
}

/// A bitmap read with up to two masks of its length laid over it: a bit
/// reads set when it is set in the bitmap or in a mask. The allocator
/// searches a group's block bitmap this way with the group's pending
/// frees and preallocation windows over it, reading only the words the
/// search reaches instead of building their union (a block-sized copy and
/// an allocation per search).
#[derive(Clone, Copy)]
pub struct Overlay<'a> {
    bitmap: &'a [u8],
    masks: [Option<&'a [u8]>; 2],
}

impl<'a> Overlay<'a> {
    pub fn new(bitmap: &'a [u8], masks: [Option<&'a [u8]>; 2]) -> Overlay<'a> {
        debug_assert!(
            masks
                .iter()
                .flatten()
                .all(|mask| mask.len() == bitmap.len()),
            "a mask of another length than its bitmap's {}",
            bitmap.len()
        );
        Overlay { bitmap, masks }
    }

    /// Whether any layer has a mask over the bitmap.
    pub fn masked(&self) -> bool {
        self.masks.iter().any(Option::is_some)
    }

    #[inline]
    pub fn test(&self, bit: usize) -> bool {
        test_bit(self.bitmap, bit) || self.masks.iter().flatten().any(|mask| test_bit(mask, bit))
    }

    #[inline]
    fn word(&self, bit: usize) -> u64 {
        let word = word_at(self.bitmap, bit);
        self.masks
            .iter()
            .flatten()
            .fold(word, |word, mask| word | word_at(mask, bit))
    }

    /// First clear bit in `start..end` (see [`find_zero`]).
    pub fn find_zero(&self, start: usize, end: usize) -> Option<usize> {
        let mut bit = start;
        while bit < end && !bit.is_multiple_of(64) {
            if !self.test(bit) {
                return Some(bit);
            }
            bit += 1;
        }
        while bit + 64 <= end {
            let word = self.word(bit);
            if word != u64::MAX {
                let found = bit + (!word).trailing_zeros() as usize;
                debug_assert!(!self.test(found));
                return Some(found);
            }
            bit += 64;
        }
        (bit..end).find(|&bit| !self.test(bit))
    }

    /// Length of the clear run at `start` (see [`zero_run`]).
    pub fn zero_run(&self, start: usize, end: usize, limit: usize) -> usize {
        let stop = end.min(start.saturating_add(limit)).max(start);
        let mut bit = start;
        while bit < stop && !bit.is_multiple_of(64) {
            if self.test(bit) {
                return bit - start;
            }
            bit += 1;
        }
        while bit + 64 <= stop {
            let word = self.word(bit);
            if word != 0 {
                return bit + word.trailing_zeros() as usize - start;
            }
            bit += 64;
        }
        (bit..stop).find(|&bit| self.test(bit)).unwrap_or(stop) - start
    }
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
    // One bit per cluster (bigalloc): a cluster holding any metadata block
    // is in use, as ext4_init_block_bitmap marks them.
    let ratio = geo.cluster_ratio as u64;
    let first = geo.group_first_block(group);
    let in_group = geo.blocks_in_group(group) as u64;
    let overhead = (geo.group_overhead_blocks(group) as u64).div_ceil(ratio);
    set_range(out, 0, overhead as usize);
    let mut mark = |block: u64, count: u64| {
        for b in block..block + count {
            if b >= first && b < first + in_group {
                set_bit(out, ((b - first) / ratio) as usize);
            }
        }
    };
    for at in groups {
        mark(at.block_bitmap, 1);
        mark(at.inode_bitmap, 1);
        mark(at.inode_table, geo.inode_table_blocks as u64);
    }
    // Bits for clusters past the end of a short last group, and past
    // clusters_per_group to the end of the bitmap block, are set.
    for bit in (in_group / ratio) as usize..out.len() * 8 {
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

    /// The word-at-a-time searches give what a bit-by-bit scan gives, at
    /// every start, end and limit around the word edges.
    #[test]
    fn word_searches_match_bit_by_bit() {
        let slow_find = |bitmap: &[u8], start: usize, end: usize| {
            (start..end).find(|&bit| !test_bit(bitmap, bit))
        };
        let slow_run = |bitmap: &[u8], start: usize, end: usize, limit: usize| {
            (start..end)
                .take(limit)
                .take_while(|&bit| !test_bit(bitmap, bit))
                .count()
        };
        let mut bitmap = vec![0xFFu8; 40];
        for bit in [3, 64, 65, 127, 190, 191, 192, 250, 300, 301, 302, 319] {
            clear_bit(&mut bitmap, bit);
        }
        clear_bit(&mut bitmap, 200);
        for bit in 256..300 {
            clear_bit(&mut bitmap, bit);
        }
        for start in 0..320 {
            for end in [start, start + 1, 63, 64, 128, 200, 255, 256, 257, 299, 320] {
                let end = end.max(start);
                assert_eq!(
                    find_zero(&bitmap, start, end),
                    slow_find(&bitmap, start, end),
                    "find_zero({start}, {end})"
                );
                for limit in [0, 1, 2, 7, 64, 65, 1000] {
                    assert_eq!(
                        zero_run(&bitmap, start, end, limit),
                        slow_run(&bitmap, start, end, limit),
                        "zero_run({start}, {end}, {limit})"
                    );
                }
            }
        }
    }

    /// An overlay searches as its union would: a bit is taken when the
    /// bitmap or either mask has it, at every start around the word edges.
    #[test]
    fn an_overlay_searches_like_the_union_of_its_layers() {
        let mut bitmap = vec![0u8; 40];
        let mut pending = vec![0u8; 40];
        let mut windows = vec![0u8; 40];
        set_range(&mut bitmap, 0, 70);
        set_range(&mut pending, 70, 60);
        set_range(&mut windows, 131, 120);
        set_bit(&mut pending, 300);
        let mut union = bitmap.clone();
        for (byte, (&pending, &window)) in union.iter_mut().zip(pending.iter().zip(&windows)) {
            *byte |= pending | window;
        }
        let overlay = Overlay::new(&bitmap, [Some(&pending), Some(&windows)]);
        assert!(overlay.masked());
        assert!(!Overlay::new(&bitmap, [None, None]).masked());
        assert_eq!(overlay.find_zero(0, 320), Some(130));
        assert_eq!(overlay.zero_run(130, 320, 100), 1);
        for start in 0..320 {
            for end in [start, 64, 131, 256, 299, 320] {
                let end = end.max(start);
                assert_eq!(overlay.find_zero(start, end), find_zero(&union, start, end));
                assert_eq!(
                    overlay.zero_run(start, end, 80),
                    zero_run(&union, start, end, 80)
                );
                assert_eq!(overlay.test(start), test_bit(&union, start));
            }
        }
        let bare = Overlay::new(&bitmap, [None, Some(&windows)]);
        assert_eq!(bare.find_zero(0, 320), Some(70), "pending frees not laid");
    }
}
