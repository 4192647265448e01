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
//! costs a look at clean pages, never a wrong answer. An inode whose every
//! remembered write was in a barrier that became durable is forgotten
//! (`forget_durable`): each of its writes is numbered, and only those up
//! to the number read with the barrier's ranges count as covered — a
//! write recorded meanwhile keeps the inode. Without that a file number
//! reused by file after file (create, write, fsync, unlink) would gather
//! ranges up to the bound, each barrier sorting all of them, and then
//! overflow into flushes of the whole device.
//!
//! Bounded: an inode remembers at most `MAX_RANGES_PER_INODE` separate
//! ranges, the map at most `MAX_INODES` inodes; past either, the ranges
//! are unknown (`None`) until the next full commit, and a commit that
//! needs them flushes the whole device.
//!
//! Lock: the tracker's `data` mutex, a leaf.

use crate::hash::NumberMap;
use crate::journal::format::tid_gt;
use smallvec::SmallVec;

/// Separate ranges one inode remembers (a random writer's).
const MAX_RANGES_PER_INODE: usize = 256;
/// Inodes remembered.
const MAX_INODES: usize = 1 << 16;

/// Ranges `[start, end)`, sorted, apart: in place for the one or two an
/// inode usually has (every write and every mapping change adds one).
pub(crate) type Ranges = SmallVec<[(u64, u64); 2]>;

#[derive(Debug, Default)]
struct InodeData {
    /// Byte ranges `[start, end)`, sorted, apart.
    ranges: Ranges,
    /// The newest transaction that wrote.
    tid: u32,
    /// More ranges than remembered were written.
    overflow: bool,
    /// The number of its latest write (`UnflushedData::writes`).
    last_write: u64,
}

/// What a barrier over `UnflushedData::ranges` covers: the writes of
/// `inodes` numbered up to `writes`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct DataMark {
    /// The committed inodes: few (in place).
    inodes: SmallVec<[u32; 4]>,
    writes: u64,
}

#[derive(Debug, Default)]
pub(super) struct UnflushedData {
    inodes: NumberMap<u32, InodeData>,
    /// The map overflowed with writes of transactions up to this one.
    overflow_until: Option<u32>,
    /// Writes recorded since mount (numbers them).
    writes: u64,
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
        self.writes += 1;
        let data = self.inodes.entry(ino).or_default();
        data.last_write = self.writes;
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

    /// `ranges(inodes)` with the mark of the writes they hold, for
    /// `forget_durable` once a barrier over them is durable.
    pub fn ranges_marked(&self, inodes: &[u32]) -> Option<(Vec<(u64, u64)>, DataMark)> {
        let ranges = self.ranges(inodes.iter().copied())?;
        let mark = DataMark {
            inodes: SmallVec::from_slice(inodes),
            writes: self.writes,
        };
        Some((ranges, mark))
    }

    /// A barrier over the ranges `mark` was read with is durable: forget
    /// the inodes of `mark` that wrote nothing since.
    pub fn forget_durable(&mut self, mark: &DataMark) {
        debug_assert!(mark.writes <= self.writes, "a mark from the future");
        for ino in &mark.inodes {
            if self
                .inodes
                .get(ino)
                .is_some_and(|data| !data.overflow && data.last_write <= mark.writes)
            {
                self.inodes.remove(ino);
            }
        }
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
pub(super) fn add_range(ranges: &mut Ranges, start: u64, end: u64) -> usize {
    debug_assert!(start < end);
    let before = ranges.len();
    let mut merged = (start, end);
    ranges.retain(|&mut (from, to)| {
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
    fn a_durable_barrier_forgets_only_the_writes_it_covered() {
        let mut data = UnflushedData::default();
        data.wrote(5, 12, 4096, 4096);
        data.wrote(5, 13, 65536, 1024);
        let (ranges, mark) = data.ranges_marked(&[12, 13]).expect("within bounds");
        assert_eq!(ranges, vec![(4096, 4096), (65536, 1024)]);
        // Written after the ranges were read: not in that barrier.
        data.wrote(5, 13, 131072, 512);
        data.wrote(5, 14, 0, 512);
        data.forget_durable(&mark);
        assert_eq!(data.ranges([12]), Some(vec![]));
        assert_eq!(
            data.ranges([13, 14]),
            Some(vec![(0, 512), (65536, 1024), (131072, 512)])
        );
        // A number reused by file after file keeps one range, not all.
        for round in 0..(2 * MAX_RANGES_PER_INODE as u64) {
            data.wrote(6, 20, round * 8192, 4096);
            let (ranges, mark) = data.ranges_marked(&[20]).expect("within bounds");
            assert_eq!(ranges, vec![(round * 8192, 4096)]);
            data.forget_durable(&mark);
        }
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
