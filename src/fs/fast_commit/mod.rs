//! Fast-commit replay: applying the records of the journal's fast-commit
//! area after the block replay, as the kernel's `ext4_fc_replay` does, to
//! an engine built over the unmounted device.
//!
//! Order of work (`replay`): scan the area (`format::fast_commit`: records
//! up to the last valid TAIL); apply the records to a scratch overlay of the
//! device through one `Tx` (`Fs::with_unmounted_tx`); then hand the blocks
//! that changed to `journal::fast_commit`, which logs them as one JBD2
//! transaction before writing them home, so that a crash at any point
//! leaves either the journal as it was or the whole replay.
//!
//! Records state outcomes, and each is applied as the kernel applies it:
//! - INODE: the inode's fields from the record; its block map (`i_block`)
//!   stays as the filesystem has it (ADD_RANGE and DEL_RANGE bring it up to
//!   date), `i_blocks` is recounted from the map, the inode is marked in use;
//! - ADD_RANGE: the logical range maps to the given physical blocks
//!   (inserted, remapped or converted from unwritten);
//! - DEL_RANGE: the range is unmapped and its blocks freed;
//! - CREAT: the new inode gets its name (a directory first gets "." and
//!   ".."); LINK: one more name and link; UNLINK: the name goes, and with
//!   its last link the inode and its blocks.
//!
//! Where the kernel's own replay leaves an image that e2fsck rejects, this
//! one keeps the image consistent instead (the tree it yields is the
//! kernel's): a new directory's link count and its parent's, the group's
//! directory count, `i_blocks` of directories that grew, the device number
//! of device nodes and the target of fast symlinks (kept from the record,
//! not from the stale inode), the deletion of a removed directory, the
//! superblock's free counts. Directories are never described by ranges or
//! by their size in the records (the kernel does not track them): their
//! blocks are whatever the replayed entry operations make them.
//!
//! Blocks: the physical blocks of every ADD_RANGE are reserved in the block
//! bitmap before anything is applied, so that no block the replay allocates
//! (extent tree and directory blocks) can be one a later record maps (the
//! kernel's excluded regions). At the end every block mapped by an inode
//! the replay touched is marked in use, and reserved blocks that nothing
//! maps are released (`ext4_fc_set_bitmaps_and_counters`).
//!
//! Departures from the kernel, deliberate: a record naming an inode or a
//! directory that is not in use is skipped (as the kernel does) but an
//! UNLINK whose name points to another inode changes nothing (the kernel
//! still drops a link, which only makes sense for its own half-done
//! replays); an INODE record keeps the on-disk `i_dtime` of a live inode
//! (the orphan list's link; the list itself is not in the records); a
//! deletion's `i_dtime` is the inode's ctime, so that a second replay
//! writes the same bytes; a torn first fast commit is ignored where the
//! kernel refuses to mount. Every loop is bounded by the records, the
//! ranges they name or the filesystem's size.
//!
//! Here: the replay's driver and its end (bitmaps and counters);
//! `records.rs` applies each kind of record; `blocks.rs` holds block range
//! sets, the allocator the format algorithms see and the bitmap bits of
//! given blocks and inodes. The scratch overlay is `dev::overlay`'s, with
//! pages of the block size.

mod blocks;
mod commit;
mod data;
mod records;
mod scope;
mod track;

pub(crate) use commit::Outcome;
pub use scope::ConflictStats;
pub use track::FastCommitStats;
pub(crate) use track::Tracker;

use super::Tx;
use crate::dev::BlockDevice;
use crate::dev::overlay::OverlayDevice;
use crate::error::{Error, Location, Result};
use crate::format::MetaCtx;
use crate::format::bytelog::{self, Anchor};
use crate::format::fast_commit::{FastCommitLog, Record, Scanner};
use crate::format::inode::Inode;
use crate::format::mapping::{self, BlockUse};
use crate::format::superblock::{self, Geometry};
use crate::journal::fast_commit::{ReplayWrite, write_replayed_blocks};
use crate::journal::recovery::{FastCommitArea, JournalArea};
use blocks::{BlockRanges, ReplayAllocator, inode_in_use, mark_blocks};
use std::collections::BTreeSet;
use std::sync::Arc;

/// What the replay did, for the log.
#[derive(Debug, Default, Clone, Copy)]
struct ReplayStats {
    applied: u32,
    skipped: u32,
}

/// Replay the fast commits of `fast_commit` (called by recovery after the
/// block replay, before the journal reset), on the filesystem whose
/// superblock copy in use is at byte `superblock_offset` (`sb=`).
/// A feature of `sb` with which jext4 neither writes fast commits (every
/// commit is a full one) nor replays them:
/// - inline_data: the kernel's replay rewrites inline inodes whole, which
///   jext4's does not yet (e2fsck 1.47.0's replay drops the system.data of
///   an inline inode it rewrites, which the kernel then refuses: not a way
///   out either);
/// - quota: replayed inodes would have to be charged to their owners;
/// - bigalloc: replayed ranges would have to be marked in whole clusters,
///   a cluster freed only with its last block (the kernel's
///   `ext4_fc_set_bitmaps_and_counters` re-marks them afterwards).
pub(crate) fn unsupported_feature(sb: &superblock::Superblock) -> Option<&'static str> {
    if sb.has_incompat(superblock::incompat::INLINE_DATA) {
        Some("inline_data")
    } else if sb.has_ro_compat(superblock::ro_compat::QUOTA) {
        Some("quota")
    } else if sb.has_ro_compat(superblock::ro_compat::BIGALLOC) {
        Some("bigalloc")
    } else {
        None
    }
}

pub(crate) fn replay(
    area: &JournalArea,
    fast_commit: &FastCommitArea,
    superblock_offset: u64,
) -> Result<()> {
    let sb = superblock::read_at(&*area.dev, superblock_offset)?;
    let geo = Geometry::from_superblock(&sb);
    let bytelog = sb.has_incompat(crate::format::superblock::incompat::BYTELOG);
    let log = scan(area, fast_commit, geo.inode_size, bytelog)?;
    tracing::info!(
        commits = log.commits,
        records = log.records.len(),
        end = ?log.end,
        tid = fast_commit.expected_tid,
        "fast-commit area scanned"
    );
    if log.records.is_empty() {
        return Ok(());
    }
    if let Some(feature) = unsupported_feature(&sb) {
        return Err(Error::Unsupported(format!(
            "the journal holds fast commits of a {feature} filesystem, which jext4 does not \
             replay yet: replay them with a kernel mount first"
        )));
    }
    let overlay = Arc::new(OverlayDevice::new(Arc::clone(&area.dev), geo.block_size));
    let journal_blocks = BlockRanges::from_blocks(&area.blocks);
    let overlay_dev = Arc::clone(&overlay) as Arc<dyn BlockDevice>;
    let stats = super::Fs::with_unmounted_tx(overlay_dev, superblock_offset, |tx| {
        Replayer::new(tx, &journal_blocks).run(&log.records)
    })?;
    let blocks = overlay.take_pages();
    let written = write_replayed_blocks(area, fast_commit, &blocks)?;
    if written == ReplayWrite::Direct {
        tracing::warn!("the journal had no room to log the fast-commit replay; written in place");
    }
    tracing::info!(
        applied = stats.applied,
        skipped = stats.skipped,
        blocks = blocks.len(),
        ?written,
        "fast commits replayed"
    );
    Ok(())
}

/// Read the area block by block until the scan stops (`fc_do_one_pass`).
/// With `bytelog` (the image's BYTELOG flag) ANCHOR records stand for the
/// ByteLog windows they name; elsewhere they end the scan, as the kernel's
/// unknown tags do.
fn scan(
    area: &JournalArea,
    fast_commit: &FastCommitArea,
    inode_size: u16,
    bytelog: bool,
) -> Result<FastCommitLog> {
    let mut scanner = Scanner::new(fast_commit.expected_tid, inode_size);
    if bytelog {
        scanner = scanner
            .with_resolver(|anchor| read_bytelog_window(area, fast_commit, anchor, inode_size));
    }
    for index in fast_commit.first_block..fast_commit.end_block {
        let block = area.read_block(index as u64)?;
        if !scanner.scan_block(&block)? {
            break;
        }
    }
    Ok(scanner.finish())
}

/// The records of the ByteLog window `anchor` names, read from the area and
/// checked (`format::bytelog::read_window`); Ok(Err) says why not.
pub(crate) fn read_bytelog_window(
    area: &JournalArea,
    fast_commit: &FastCommitArea,
    anchor: &Anchor,
    inode_size: u16,
) -> Result<std::result::Result<Vec<Record>, String>> {
    let block_size = area.fs_block_size as u64;
    let ring = fast_commit.first_block as u64 + anchor.ring_block as u64;
    let (head, tail) = (anchor.head as u64, anchor.tail as u64);
    let end_block = ring + tail.div_ceil(block_size);
    if tail < head || end_block > fast_commit.end_block as u64 {
        return Ok(Err(format!(
            "window {head}..{tail} from block {ring} lies outside the fast-commit area"
        )));
    }
    let mut bytes = Vec::with_capacity((tail - head + block_size) as usize);
    // Bounded by the area's size (checked above).
    for index in ring + head / block_size..end_block {
        bytes.extend_from_slice(&area.read_block(index)?);
    }
    let start = (head % block_size) as usize;
    let window = &bytes[start..start + (tail - head) as usize];
    Ok(bytelog::read_window(
        window,
        anchor,
        fast_commit.expected_tid,
        inode_size,
    ))
}

// ---------------------------------------------------------------------------
// Applying the records.

struct Replayer<'r, 'a, 'j> {
    tx: &'r mut Tx<'a, 'j>,
    journal_blocks: &'r BlockRanges,
    /// Physical blocks of every ADD_RANGE (see the module comment).
    reserved: BlockRanges,
    /// Reserved blocks whose bits the reservation set, or that an unmapping
    /// freed: released at the end unless mapped.
    released: BlockRanges,
    /// Inodes whose block map or block count the replay may have changed.
    modified: BTreeSet<u32>,
    stats: ReplayStats,
}

impl<'r, 'a, 'j> Replayer<'r, 'a, 'j> {
    fn new(tx: &'r mut Tx<'a, 'j>, journal_blocks: &'r BlockRanges) -> Self {
        Replayer {
            tx,
            journal_blocks,
            reserved: BlockRanges::default(),
            released: BlockRanges::default(),
            modified: BTreeSet::new(),
            stats: ReplayStats::default(),
        }
    }

    fn run(mut self, records: &[Record]) -> Result<ReplayStats> {
        // The kernel keeps only the groups' counts exact; the allocator
        // below counts on the superblock's too.
        sum_free_counts(self.tx);
        self.reserve(records)?;
        for record in records {
            let applied = match record {
                Record::Inode { ino, raw } => self.replay_inode(*ino, raw)?,
                Record::AddRange { ino, extent } => self.replay_add_range(*ino, extent)?,
                Record::DelRange { ino, lblk, len } => self.replay_del_range(*ino, *lblk, *len)?,
                Record::Create(dentry) => self.replay_create(dentry)?,
                Record::Link(dentry) => self.replay_link(dentry)?,
                Record::Unlink(dentry) => self.replay_unlink(dentry)?,
                Record::Anchor(_) => {
                    debug_assert!(false, "the scan replaces every ANCHOR by its records");
                    false
                }
                Record::Head { .. } | Record::Tail { .. } | Record::Pad => true,
            };
            if applied {
                self.stats.applied += 1;
            } else {
                self.stats.skipped += 1;
                tracing::debug!(?record, "fast-commit record skipped");
            }
        }
        self.set_bitmaps_and_counters()?;
        Ok(self.stats)
    }

    fn geo(&self) -> &'a Geometry {
        &self.tx.core.geo
    }

    /// Check every ADD_RANGE and mark its blocks in use.
    fn reserve(&mut self, records: &[Record]) -> Result<()> {
        for record in records {
            if let Record::AddRange { ino, extent } = record {
                if extent.len == 0 {
                    continue;
                }
                self.check_data_range(*ino, extent.physical, extent.len as u64)?;
                self.reserved
                    .push(extent.physical, extent.physical + extent.len as u64);
            }
        }
        self.reserved.normalize();
        let ranges = self.reserved.ranges.clone();
        for (start, end) in ranges {
            for (piece_start, piece_end) in mark_blocks(self.tx, start, end, true)? {
                self.released.push(piece_start, piece_end);
            }
        }
        Ok(())
    }

    /// A range a record maps must lie in the filesystem, clear of group
    /// metadata and of the journal (the kernel's system-zone check).
    fn check_data_range(&self, ino: u32, start: u64, count: u64) -> Result<()> {
        let geo = self.geo();
        let end = start
            .checked_add(count)
            .filter(|&end| end <= geo.blocks_count);
        let location = Location::Inode { ino };
        let Some(end) = end.filter(|_| start >= geo.first_data_block as u64) else {
            return Err(Error::corrupt(
                location,
                format!("fast commit maps blocks {start}+{count} outside the filesystem"),
            ));
        };
        let overlaps = |first: u64, len: u64| start < first + len && first < end;
        let mut metadata = self.journal_blocks.overlaps(start, end);
        for (group, at) in self.tx.core.groups.locations().enumerate() {
            let base = geo.group_first_block(group as u32);
            metadata |= overlaps(base, geo.group_overhead_blocks(group as u32) as u64)
                || overlaps(at.block_bitmap, 1)
                || overlaps(at.inode_bitmap, 1)
                || overlaps(at.inode_table, geo.inode_table_blocks as u64);
        }
        if metadata {
            return Err(Error::corrupt(
                location,
                format!("fast commit maps blocks {start}+{count} that hold metadata"),
            ));
        }
        Ok(())
    }

    /// The inode, if it is in use and has a link (the kernel's `ext4_iget`
    /// succeeds): records about any other inode are skipped.
    fn live_inode(&self, ino: u32) -> Result<Option<Inode>> {
        let geo = self.geo();
        if !geo.is_valid_ino(ino)
            || (ino < geo.first_ino && ino != crate::format::superblock::ROOT_INO)
        {
            return Ok(None);
        }
        if !inode_in_use(self.tx, ino)? {
            return Ok(None);
        }
        let inode = self.tx.read_inode(ino)?;
        Ok((inode.mode != 0 && inode.links_count > 0).then_some(inode))
    }

    fn live_dir(&self, ino: u32) -> Result<Option<Inode>> {
        Ok(self.live_inode(ino)?.filter(Inode::is_dir))
    }

    /// MetaCtx over the replay's allocator.
    fn with_ctx<R>(
        &mut self,
        pinned: Option<(u64, u32)>,
        body: impl FnOnce(&mut MetaCtx<'_, '_>) -> Result<R>,
    ) -> Result<(R, bool)> {
        let core = self.tx.core;
        let handle = self.tx.handle;
        let mut allocator = ReplayAllocator {
            tx: &mut *self.tx,
            reserved: &self.reserved,
            released: &mut self.released,
            pinned,
        };
        let result = {
            let mut ctx = MetaCtx {
                geo: &core.geo,
                cache: &core.cache,
                handle,
                alloc: &mut allocator,
            };
            body(&mut ctx)?
        };
        Ok((result, allocator.pinned.is_none()))
    }
}

// The end: bitmaps and counters.
impl Replayer<'_, '_, '_> {
    /// Mark every block of every inode the replay touched in use, release
    /// the reserved blocks nothing maps, recount the touched inodes'
    /// `i_blocks`, and make the superblock's free counts the groups' sums.
    fn set_bitmaps_and_counters(&mut self) -> Result<()> {
        let geo = self.geo();
        let sectors = (geo.block_size / 512) as u64;
        let mut mapped = BlockRanges::default();
        let modified: Vec<u32> = self.modified.iter().copied().collect();
        for ino in modified {
            if !inode_in_use(self.tx, ino)? {
                continue;
            }
            let mut inode = self.tx.read_inode(ino)?;
            if inode.mode == 0 {
                continue;
            }
            let mut count = 0u64;
            if inode.has_data_blocks(geo) {
                mapping::for_each_block(geo, &self.tx.core.cache, ino, &inode, &mut |used| {
                    let (start, len) = match used {
                        BlockUse::Data(extent) => (extent.physical, extent.len as u64),
                        BlockUse::Meta(block) => (block, 1),
                    };
                    mapped.push(start, start + len);
                    count += len;
                    Ok(())
                })?;
            }
            let blocks = (count + (inode.file_acl != 0) as u64) * sectors;
            if inode.blocks != blocks {
                inode.blocks = blocks;
                self.tx.write_inode(ino, &inode)?;
            }
        }
        mapped.normalize();
        for &(start, end) in &mapped.ranges {
            mark_blocks(self.tx, start, end, true)?;
        }
        self.released.normalize();
        for (start, end) in self.released.minus(&mapped) {
            mark_blocks(self.tx, start, end, false)?;
        }
        debug_assert_eq!(
            self.tx.core.sbi.free_blocks(),
            self.tx.core.groups.free_totals().0
        );
        sum_free_counts(self.tx);
        Ok(())
    }
}

/// The free totals as the sums of the groups' (what the kernel's counters
/// start from at mount, and what e2fsck checks): written into the
/// superblock when the replay's engine is shut down.
fn sum_free_counts(tx: &mut Tx<'_, '_>) {
    let (blocks, inodes) = tx.core.groups.free_totals();
    tx.core.sbi.set_free(blocks, inodes);
}
