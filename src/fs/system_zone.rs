//! The system zone: the blocks that hold the filesystem's own metadata —
//! superblock copies with their descriptor blocks, every group's bitmaps
//! and inode table, and the internal journal's blocks — which no file may
//! own (the journal inode its own blocks excepted) and the allocator must
//! never hand out, whatever a block bitmap says (the kernel's
//! `block_validity.c`, on by default, which protects the journal inode's
//! blocks with `ext4_protect_reserved_inode`).
//!
//! Built once at mount from the descriptors, in the kernel's order (each
//! group's superblock copy, block bitmap, inode bitmap and inode table,
//! then the journal) and with its test: a range that starts inside one
//! already added refuses the mount (a block and an inode bitmap in one
//! block, a bitmap inside an earlier group's table), as the kernel's
//! `ext4_setup_system_zone` does ("failed to initialize system zone"),
//! read-only too. A range that starts before one already added and covers
//! it (an inode table over its own group's bitmap) passes the kernel's
//! test, and the kernel mounts such an image, then writes one structure's
//! bits into the other; jext4 mounts it too and takes the groups involved
//! out of allocation (`SystemZone::overlaps`), so that neither is written
//! through the other. The journal overlapping anything refuses the mount
//! whichever way round: its log would overwrite the metadata.
//!
//! The zone covers what the kernel's does (since 6.4, which this
//! machine's 6.18 is): for every group, the superblock copy, descriptor
//! blocks and reserved descriptor blocks at its start
//! (`ext4_num_base_meta_blocks`; older kernels added only the copy and
//! descriptors of the first five groups and of each flex group's first),
//! and its bitmaps and inode table. So a bitmap or table that a damaged
//! descriptor places inside a backup's reserved descriptor blocks refuses
//! the mount, as with the kernel, and no file may map such a block (the
//! resize inode, which owns them, is never read through the zone's
//! check).

use crate::error::{Error, Location, Result};
use crate::format::group_desc::GroupLocations;
use crate::format::superblock::Geometry;

/// What a range of the zone holds, for the message that refuses a mount.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Holder {
    Superblock {
        group: u32,
    },
    BlockBitmap {
        group: u32,
    },
    InodeBitmap {
        group: u32,
    },
    InodeTable {
        group: u32,
    },
    /// The internal journal (no group of its own: a message about it
    /// names the group its first block lies in).
    Journal {
        group: u32,
    },
}

impl std::fmt::Display for Holder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match *self {
            Holder::Superblock { group } => {
                write!(
                    f,
                    "the superblock copy and descriptor blocks of group {group}"
                )
            }
            Holder::BlockBitmap { group } => write!(f, "the block bitmap of group {group}"),
            Holder::InodeBitmap { group } => write!(f, "the inode bitmap of group {group}"),
            Holder::InodeTable { group } => write!(f, "the inode table of group {group}"),
            Holder::Journal { .. } => write!(f, "the journal"),
        }
    }
}

impl Holder {
    fn group(self) -> u32 {
        match self {
            Holder::Superblock { group }
            | Holder::BlockBitmap { group }
            | Holder::InodeBitmap { group }
            | Holder::InodeTable { group }
            | Holder::Journal { group } => group,
        }
    }
}

/// The zone as sorted, disjoint, merged block ranges `start..end`.
pub(crate) struct SystemZone {
    ranges: Vec<(u64, u64)>,
    /// Groups whose metadata overlap other metadata in a way the kernel's
    /// test lets through, each with what overlaps what.
    overlaps: Vec<(u32, String)>,
}

impl SystemZone {
    /// The zone of the filesystem whose groups lie at `locations` (group
    /// order) and whose internal journal is at `journal` (its blocks in
    /// journal order; empty without one), or the corruption that refuses
    /// the mount: two ranges that overlap.
    pub fn build(
        geo: &Geometry,
        locations: &[GroupLocations],
        journal: &[u64],
    ) -> Result<SystemZone> {
        // Sorted by start; overlapping entries are possible (see above).
        let mut added: Vec<(u64, u64, Holder)> = Vec::with_capacity(locations.len() * 3 + 8);
        let mut add = |start: u64, end: u64, holder: Holder| -> Result<()> {
            let at = added.partition_point(|&(first, _, _)| first <= start);
            if let Some(&before) = at.checked_sub(1).map(|i| &added[i])
                && start < before.1
            {
                return Err(overlap_error(before, (start, end, holder)));
            }
            added.insert(at, (start, end, holder));
            Ok(())
        };
        for (group, at) in (0u32..).zip(locations) {
            let count = geo.group_base_meta_blocks(group) as u64;
            if count > 0 {
                let start = geo.group_first_block(group);
                add(start, start + count, Holder::Superblock { group })?;
            }
            let table = geo.inode_table_blocks as u64;
            add(
                at.block_bitmap,
                at.block_bitmap + 1,
                Holder::BlockBitmap { group },
            )?;
            add(
                at.inode_bitmap,
                at.inode_bitmap + 1,
                Holder::InodeBitmap { group },
            )?;
            add(
                at.inode_table,
                at.inode_table + table,
                Holder::InodeTable { group },
            )?;
        }
        for (start, end) in runs(journal) {
            let group = geo.group_of_block(start);
            add(start, end, Holder::Journal { group })?;
        }
        // What the kernel's test let through: a range covering one added
        // before it. The journal's never passes here.
        let mut overlaps = Vec::new();
        // The added range that reaches furthest so far.
        let mut reach: Option<(u64, u64, Holder)> = None;
        for &(start, end, holder) in &added {
            if let Some(reacher @ (_, reach_end, reaching)) = reach
                && start < reach_end
            {
                let journal = |holder| matches!(holder, Holder::Journal { .. });
                if journal(holder) || journal(reaching) {
                    return Err(overlap_error(reacher, (start, end, holder)));
                }
                let reacher = reaching;
                let what = format!(
                    "{holder} (from block {start}) lies inside {reacher}: the group descriptors \
                     are damaged; run e2fsck -fy on it"
                );
                if holder.group() != reacher.group() {
                    overlaps.push((holder.group(), what.clone()));
                }
                overlaps.push((reacher.group(), what));
            }
            if reach.is_none_or(|(_, reach_end, _)| end > reach_end) {
                reach = Some((start, end, holder));
            }
        }
        let mut merged: Vec<(u64, u64)> = Vec::with_capacity(added.len());
        for (start, end, _) in added {
            match merged.last_mut() {
                Some(last) if start <= last.1 => last.1 = last.1.max(end),
                _ => merged.push((start, end)),
            }
        }
        debug_assert!(merged.windows(2).all(|pair| pair[0].1 < pair[1].0));
        Ok(SystemZone {
            ranges: merged,
            overlaps,
        })
    }

    /// The groups whose metadata overlap in a way the kernel mounts, each
    /// with a description, to be kept out of allocation.
    pub fn overlaps(&self) -> &[(u32, String)] {
        &self.overlaps
    }

    /// The first block of `start..end` in the zone, if any.
    pub fn first_within(&self, start: u64, end: u64) -> Option<u64> {
        self.within(start, end).next().map(|(first, _)| first)
    }

    /// The parts of the zone inside blocks `start..end`, in order.
    pub fn within(&self, start: u64, end: u64) -> impl Iterator<Item = (u64, u64)> + '_ {
        // The first range that ends after `start`.
        let first = self
            .ranges
            .partition_point(|&(_, range_end)| range_end <= start);
        self.ranges[first..]
            .iter()
            .take_while(move |&&(range_start, _)| range_start < end)
            .map(move |&(range_start, range_end)| (range_start.max(start), range_end.min(end)))
    }
}

/// `blocks` as runs of consecutive blocks `start..end`, in their order
/// (a journal's blocks are mostly one or a few runs).
fn runs(blocks: &[u64]) -> Vec<(u64, u64)> {
    let mut runs: Vec<(u64, u64)> = Vec::new();
    for &block in blocks {
        match runs.last_mut() {
            Some(last) if last.1 == block => last.1 += 1,
            _ => runs.push((block, block + 1)),
        }
    }
    runs
}

/// The mount refusal for two overlapping ranges (`a` sorts first).
fn overlap_error(
    (a_start, a_end, a): (u64, u64, Holder),
    (b_start, b_end, b): (u64, u64, Holder),
) -> Error {
    let blocks = |start: u64, end: u64| match end - start {
        1 => format!("block {start}"),
        _ => format!("blocks {start}..={}", end - 1),
    };
    let (location, damaged) = match (a, b) {
        (Holder::Journal { .. }, _) | (_, Holder::Journal { .. }) => (
            Location::Inode {
                ino: crate::format::superblock::JOURNAL_INO,
            },
            "the journal inode is damaged",
        ),
        _ => (
            Location::GroupDescriptor { group: b.group() },
            "the group descriptors are damaged",
        ),
    };
    Error::corrupt(
        location,
        format!(
            "{b} ({}) overlaps {a} ({}): {damaged} and the kernel refuses this \
             filesystem too; run e2fsck -fy on it",
            blocks(b_start, b_end),
            blocks(a_start, a_end),
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn zone(ranges: &[(u64, u64)]) -> SystemZone {
        SystemZone {
            ranges: ranges.to_vec(),
            overlaps: Vec::new(),
        }
    }

    #[test]
    fn within_clips_to_the_asked_blocks() {
        let zone = zone(&[(1, 3), (10, 20), (30, 31)]);
        let parts: Vec<_> = zone.within(2, 15).collect();
        assert_eq!(parts, vec![(2, 3), (10, 15)]);
        assert_eq!(zone.within(3, 10).count(), 0, "the gaps are free");
        assert_eq!(zone.within(20, 40).collect::<Vec<_>>(), vec![(30, 31)]);
        assert_eq!(zone.within(31, 100).count(), 0);
        assert_eq!(zone.within(0, 2).collect::<Vec<_>>(), vec![(1, 2)]);
    }

    #[test]
    fn journal_blocks_become_runs() {
        assert_eq!(runs(&[5, 6, 7, 20, 21, 8]), vec![(5, 8), (20, 22), (8, 9)]);
        assert!(runs(&[]).is_empty());
    }

    #[test]
    fn an_overlap_names_both_holders_and_e2fsck() {
        let error = overlap_error(
            (260, 261, Holder::BlockBitmap { group: 1 }),
            (260, 261, Holder::InodeBitmap { group: 1 }),
        );
        let text = error.to_string();
        assert!(
            text.contains("inode bitmap of group 1 (block 260)")
                && text.contains("block bitmap of group 1")
                && text.contains("e2fsck"),
            "{text}"
        );
    }
}
