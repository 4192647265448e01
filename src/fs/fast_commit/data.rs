//! File data written in place and not known durable: per inode, the device
//! byte ranges its writes covered since the last full commit, so that a
//! directory's commit makes its own inodes' data durable with a barrier
//! over those ranges (`BlockDevice::write_durable`) instead of flushing
//! every dirty page of the device — another directory's stream among them.
//!
//! A full commit of T makes durable every write made under a handle of T
//! or before (its flush comes after T's handles stopped), so its
//! `committed` drops the inodes whose newest write was in T or before.
//! Ranges already durable may be named again by a later barrier: that
//! costs a look at clean pages, never a wrong answer.
//!
//! Bounded: an inode remembers at most `MAX_RANGES_PER_INODE` separate
//! ranges, the map at most `MAX_INODES` inodes; past either, the ranges
//! are unknown (`None`) until the next full commit, and a commit that
//! needs them flushes the whole device.
//!
//! Lock: the tracker's `data` mutex, a leaf.

use crate::hash::NumberMap;
use crate::journal::format::tid_gt;

/// Separate ranges one inode remembers (a random writer's).
const MAX_RANGES_PER_INODE: usize = 256;
/// Inodes remembered.
const MAX_INODES: usize = 1 << 16;

#[derive(Debug, Default)]
struct InodeData {
    /// Byte ranges `[start, end)`, sorted, apart.
    ranges: Vec<(u64, u64)>,
    /// The newest transaction that wrote.
    tid: u32,
    /// More ranges than remembered were written.
    overflow: bool,
}

#[derive(Debug, Default)]
pub(super) struct UnflushedData {
    inodes: NumberMap<u32, InodeData>,
    /// The map overflowed with writes of transactions up to this one.
    overflow_until: Option<u32>,
}

impl UnflushedData {
    pub fn wrote(&mut self, tid: u32, ino: u32, offset: u64, len: u64) {
        if len == 0 {
            return;
        }
        if !self.inodes.contains_key(&ino) && self.inodes.len() >= MAX_INODES {
            if self.overflow_until.is_none_or(|until| tid_gt(tid, until)) {
                self.overflow_until = Some(tid);
            }
            return;
        }
        let data = self.inodes.entry(ino).or_default();
        if tid_gt(tid, data.tid) || data.ranges.is_empty() {
            data.tid = tid;
        }
        if data.overflow {
            return;
        }
        add_range(&mut data.ranges, offset, offset + len);
        if data.ranges.len() > MAX_RANGES_PER_INODE {
            data.ranges.clear();
            data.overflow = true;
        }
    }

    /// The merged ranges (offset, length) `inodes` wrote, or None when one
    /// of them is past the bound.
    pub fn ranges(&self, inodes: impl IntoIterator<Item = u32>) -> Option<Vec<(u64, u64)>> {
        if self.overflow_until.is_some() {
            return None;
        }
        let mut all = Vec::new();
        for ino in inodes {
            if let Some(data) = self.inodes.get(&ino) {
                if data.overflow {
                    return None;
                }
                all.extend(data.ranges.iter().map(|&(start, end)| (start, end - start)));
            }
        }
        Some(crate::journal::merge_ranges(all))
    }

    /// The full commit of `tid` made every write of `tid` or before durable.
    pub fn committed(&mut self, tid: u32) {
        self.inodes.retain(|_, data| tid_gt(data.tid, tid));
        if self.overflow_until.is_some_and(|until| !tid_gt(until, tid)) {
            self.overflow_until = None;
        }
    }
}

/// Merge `[start, end)` into sorted, disjoint `ranges` (touching or
/// overlapping ones are folded into it); returns how many ranges were
/// added (0 or 1).
pub(super) fn add_range(ranges: &mut Vec<(u64, u64)>, start: u64, end: u64) -> usize {
    debug_assert!(start < end);
    let before = ranges.len();
    let mut merged = (start, end);
    ranges.retain(|&(from, to)| {
        let apart = to < merged.0 || from > merged.1;
        if !apart {
            merged = (merged.0.min(from), merged.1.max(to));
        }
        apart
    });
    let at = ranges.partition_point(|&(from, _)| from < merged.0);
    ranges.insert(at, merged);
    debug_assert!(ranges.windows(2).all(|pair| pair[0].1 < pair[1].0));
    (ranges.len() > before) as usize
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_merge_per_inode_and_go_with_their_full_commit() {
        let mut data = UnflushedData::default();
        data.wrote(5, 12, 4096, 4096);
        data.wrote(5, 12, 8192, 4096);
        data.wrote(5, 13, 65536, 1024);
        data.wrote(6, 14, 0, 512);
        assert_eq!(data.ranges([12]), Some(vec![(4096, 8192)]));
        assert_eq!(
            data.ranges([12, 13, 99]),
            Some(vec![(4096, 8192), (65536, 1024)])
        );
        data.committed(5);
        assert_eq!(data.ranges([12, 13]), Some(vec![]));
        assert_eq!(data.ranges([14]), Some(vec![(0, 512)]));
    }

    #[test]
    fn too_many_pieces_mean_a_flush_of_everything() {
        let mut data = UnflushedData::default();
        for piece in 0..=MAX_RANGES_PER_INODE as u64 {
            data.wrote(3, 12, piece * 8192, 4096);
        }
        assert_eq!(data.ranges([12]), None);
        assert_eq!(data.ranges([13]), Some(vec![]));
        data.committed(3);
        assert_eq!(data.ranges([12]), Some(vec![]));
    }
}
