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
//! replays); a torn first fast commit is ignored where the kernel refuses
//! to mount. Every loop is bounded by the records, the ranges they name or
//! the filesystem's size.

use super::Tx;
use super::dirops::DirWriter;
use crate::cache::Buffer;
use crate::dev::BlockDevice;
use crate::error::{Error, Location, Result};
use crate::format::dir;
use crate::format::extent::{self, EXTENT_MAGIC};
use crate::format::fast_commit::{Dentry, FastCommitLog, Record, Scanner};
use crate::format::group_desc::{BG_BLOCK_UNINIT, BG_INODE_UNINIT};
use crate::format::inode::{self as fmt, I_BLOCK, I_BLOCK_SIZE, Inode};
use crate::format::mapping::{self, BlockUse, Extent, Lookup};
use crate::format::superblock::{
    Geometry, SUPERBLOCK_OFFSET, SUPERBLOCK_SIZE, Superblock, incompat,
};
use crate::format::{BlockAllocator, MetaCtx, bitmap, get_u16, xattr};
use crate::journal::Handle;
use crate::journal::fast_commit::{ReplayWrite, write_replayed_blocks};
use crate::journal::recovery::{FastCommitArea, JournalArea};
use parking_lot::Mutex;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

/// ext4's EXT4_LINK_MAX: past it a directory with dir_nlink counts 1.
const LINK_MAX: u16 = 65000;

/// What the replay did, for the log.
#[derive(Debug, Default, Clone, Copy)]
struct ReplayStats {
    applied: u32,
    skipped: u32,
}

/// Replay the fast commits of `fast_commit` (called by recovery after the
/// block replay, before the journal reset).
pub(crate) fn replay(area: &JournalArea, fast_commit: &FastCommitArea) -> Result<()> {
    let mut bytes = vec![0u8; SUPERBLOCK_SIZE];
    area.dev.read_at(SUPERBLOCK_OFFSET, &mut bytes)?;
    let geo = Geometry::from_superblock(&Superblock::decode(&bytes)?);
    let log = scan(area, fast_commit, geo.inode_size)?;
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
    let overlay = Arc::new(OverlayDevice::new(Arc::clone(&area.dev), geo.block_size));
    let journal_blocks = BlockRanges::from_blocks(&area.blocks);
    let stats = super::Fs::with_unmounted_tx(Arc::clone(&overlay) as Arc<dyn BlockDevice>, |tx| {
        Replayer::new(tx, &journal_blocks).run(&log.records)
    })?;
    let blocks = overlay.take_blocks();
    let written = write_replayed_blocks(area, fast_commit.expected_tid, &blocks)?;
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
fn scan(
    area: &JournalArea,
    fast_commit: &FastCommitArea,
    inode_size: u16,
) -> Result<FastCommitLog> {
    let mut scanner = Scanner::new(fast_commit.expected_tid, inode_size);
    for index in fast_commit.first_block..fast_commit.end_block {
        let block = area.read_block(index as u64)?;
        if !scanner.scan_block(&block)? {
            break;
        }
    }
    Ok(scanner.finish())
}

// ---------------------------------------------------------------------------
// A scratch layer over the device.

/// Reads fall through to the device; writes stay here, whole blocks, until
/// `take_blocks`. The engine runs on it so that nothing reaches the device
/// before the journal has the replay's blocks.
struct OverlayDevice {
    base: Arc<dyn BlockDevice>,
    block_size: u64,
    /// Block number → bytes [guards: none beyond its own lock].
    written: Mutex<BTreeMap<u64, Vec<u8>>>,
}

impl OverlayDevice {
    fn new(base: Arc<dyn BlockDevice>, block_size: u32) -> Self {
        OverlayDevice {
            base,
            block_size: block_size as u64,
            written: Mutex::new(BTreeMap::new()),
        }
    }

    fn take_blocks(&self) -> BTreeMap<u64, Vec<u8>> {
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
type Range = (u64, u64);

/// Sorted, non-overlapping, non-adjacent `[start, end)` block ranges.
#[derive(Debug, Default, Clone)]
struct BlockRanges {
    ranges: Vec<(u64, u64)>,
}

impl BlockRanges {
    fn from_blocks(blocks: &[u64]) -> Self {
        let mut ranges = BlockRanges::default();
        for &block in blocks {
            ranges.ranges.push((block, block + 1));
        }
        ranges.normalize();
        ranges
    }

    fn push(&mut self, start: u64, end: u64) {
        if start < end {
            self.ranges.push((start, end));
        }
    }

    fn normalize(&mut self) {
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

    fn overlaps(&self, start: u64, end: u64) -> bool {
        let at = self
            .ranges
            .partition_point(|&(_, range_end)| range_end <= start);
        self.ranges
            .get(at)
            .is_some_and(|&(range_start, _)| range_start < end)
    }

    /// `[start, end)` cut into the pieces inside these ranges and outside.
    fn split(&self, start: u64, end: u64) -> (Vec<Range>, Vec<Range>) {
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
    fn minus(&self, other: &BlockRanges) -> Vec<(u64, u64)> {
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
struct ReplayAllocator<'r, 'a, 'j> {
    tx: &'r mut Tx<'a, 'j>,
    reserved: &'r BlockRanges,
    /// Reserved blocks freed by the replay: released at the end unless
    /// some inode maps them again.
    released: &'r mut BlockRanges,
    pinned: Option<(u64, u32)>,
}

impl BlockAllocator for ReplayAllocator<'_, '_, '_> {
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
        for (group, desc) in self.tx.st.groups.iter().enumerate() {
            let base = geo.group_first_block(group as u32);
            metadata |= overlaps(base, geo.group_overhead_blocks(group as u32) as u64)
                || overlaps(desc.block_bitmap, 1)
                || overlaps(desc.inode_bitmap, 1)
                || overlaps(desc.inode_table, geo.inode_table_blocks as u64);
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

/// Names the kernel could have recorded but a directory cannot hold.
fn usable_name(name: &[u8]) -> bool {
    name != b"." && name != b".." && !name.contains(&b'/') && !name.contains(&0)
}

// INODE.
impl Replayer<'_, '_, '_> {
    fn replay_inode(&mut self, ino: u32, raw: &[u8]) -> Result<bool> {
        let geo = self.geo();
        if ino < geo.first_ino || !geo.is_valid_ino(ino) {
            // The kernel fails its replay here too (ext4_mark_inode_used).
            return Err(Error::corrupt(
                Location::Inode { ino },
                "fast commit records a reserved or nonexistent inode",
            ));
        }
        debug_assert!(raw.len() >= 128 && raw.len() <= geo.inode_size as usize);
        let current = if inode_in_use(self.tx, ino)? {
            Some(self.tx.read_inode(ino)?).filter(|inode| inode.mode != 0)
        } else {
            None
        };
        let mut inode = merge_inode(geo, ino, current.as_ref(), raw)?;
        if inode.links_count == 0 {
            // Recorded while open after its last unlink: after the crash
            // it is gone (the kernel's replay stops at such an inode).
            if current.is_some() {
                self.evict(ino, inode)?;
            }
            return Ok(true);
        }
        if current.is_none() {
            mark_inode_in_use(self.tx, ino, inode.is_dir())?;
        }
        inode.dtime = 0;
        self.tx.write_inode(ino, &inode)?;
        self.modified.insert(ino);
        Ok(true)
    }

    /// Free an inode whose last name is gone, and everything it maps.
    fn evict(&mut self, ino: u32, mut inode: Inode) -> Result<()> {
        self.tx.orphan_remove(ino, &mut inode)?;
        if inode.has_data_blocks(self.geo()) {
            self.with_ctx(None, |ctx| mapping::punch(ctx, ino, &mut inode, 0, None))?;
        }
        if inode.file_acl != 0 {
            self.with_ctx(None, |ctx| xattr::release_block(ctx, ino, &mut inode))?;
        }
        let is_dir = inode.is_dir();
        inode.links_count = 0;
        inode.size = 0;
        // Deterministic (a second replay writes the same bytes): the
        // deletion is no earlier than the inode's last change.
        inode.dtime = (inode.ctime.sec as u32).max(1);
        self.tx.write_inode(ino, &inode)?;
        if inode_in_use(self.tx, ino)? {
            self.tx.release_inode(ino, is_dir)?;
        }
        self.modified.remove(&ino);
        Ok(())
    }
}

/// The inode an INODE record describes: the recorded bytes over the current
/// inode (zeros if it was free), with the block map handled as the module
/// comment says. Returns it with the checksum left to `encode`.
fn merge_inode(geo: &Geometry, ino: u32, current: Option<&Inode>, raw: &[u8]) -> Result<Inode> {
    let mut bytes = vec![0u8; geo.inode_size as usize];
    if let Some(current) = current {
        current.encode(geo, ino, &mut bytes);
    }
    let kept_block: [u8; I_BLOCK_SIZE] = bytes[I_BLOCK..I_BLOCK + I_BLOCK_SIZE].try_into().unwrap();
    bytes[..raw.len()].copy_from_slice(raw);
    // The recorded checksum is stale; encode sets the right one.
    let mut unchecked = geo.clone();
    unchecked.metadata_csum = false;
    let mut inode = Inode::decode(&unchecked, ino, &bytes)?;
    let recorded_is_data = !inode.has_data_blocks(geo);
    match current.filter(|current| current.is_dir() == inode.is_dir()) {
        Some(current) if inode.is_dir() => {
            // Directories: size and blocks are the replayed entries'.
            inode.block = current.block;
            inode.size = current.size;
            inode.blocks = current.blocks;
            inode.flags = (inode.flags & !(fmt::flags::INDEX | fmt::flags::EXTENTS))
                | (current.flags & (fmt::flags::INDEX | fmt::flags::EXTENTS));
        }
        Some(current) if !recorded_is_data => {
            inode.block = kept_block;
            inode.blocks = current.blocks;
        }
        _ if recorded_is_data => {} // device number or fast symlink target
        _ => {
            // A new inode: no blocks yet (ADD_RANGE and CREAT bring them).
            inode.blocks = 0;
            inode.flags &= !fmt::flags::INDEX;
            if inode.is_dir() {
                inode.size = 0;
            }
            let extents =
                geo.has_incompat(incompat::EXTENTS) && (inode.uses_extents() || inode.is_dir());
            mapping::init(&mut inode, extents);
        }
    }
    if inode.uses_extents() && get_u16(&inode.block, 0) != EXTENT_MAGIC {
        // ext4_fc_replay_inode: a map that is not an extent tree starts empty.
        extent::init(&mut inode);
    }
    Ok(inode)
}

// ADD_RANGE and DEL_RANGE.
impl Replayer<'_, '_, '_> {
    /// An inode whose block map a range record may change: in use, with
    /// data in blocks, not a directory (the kernel never records those).
    fn range_target(&self, ino: u32) -> Result<Option<Inode>> {
        let geo = self.geo();
        let Some(inode) = self.live_inode(ino)? else {
            return Ok(None);
        };
        if inode.is_dir() || !inode.has_data_blocks(geo) {
            return Ok(None);
        }
        if inode.has_flag(fmt::flags::INLINE_DATA) || !inode.uses_extents() {
            // The kernel replays ranges into extent trees only.
            return Err(Error::Unsupported(format!(
                "fast-commit ranges for inode {ino}, which has no extent tree"
            )));
        }
        Ok(Some(inode))
    }

    fn replay_add_range(&mut self, ino: u32, extent: &Extent) -> Result<bool> {
        let Some(mut inode) = self.range_target(ino)? else {
            return Ok(false);
        };
        let end = extent.end();
        if extent.len == 0 || end > extent::max_blocks(self.geo()) {
            return Ok(false);
        }
        let mut lblk = extent.logical;
        // Each step maps or keeps at least one block.
        while lblk < end {
            let physical = extent.physical + (lblk - extent.logical);
            let lookup = mapping::lookup(self.geo(), &self.tx.core.cache, ino, &inode, lblk)?;
            let count = match lookup {
                Lookup::Mapped(current) => {
                    let count = (current.len as u64).min(end - lblk);
                    if current.physical != physical || (current.unwritten && !extent.unwritten) {
                        self.remap(
                            ino,
                            &mut inode,
                            lblk,
                            count,
                            physical,
                            extent.unwritten,
                            current,
                        )?;
                    } else if !current.unwritten && extent.unwritten {
                        self.remap(ino, &mut inode, lblk, count, physical, true, current)?;
                    }
                    count
                }
                Lookup::Hole { next } => {
                    let count = next.unwrap_or(end).min(end) - lblk;
                    self.map_pinned(ino, &mut inode, lblk, count, physical, extent.unwritten)?;
                    count
                }
            };
            debug_assert!(count > 0);
            lblk += count;
        }
        self.tx.write_inode(ino, &inode)?;
        self.modified.insert(ino);
        Ok(true)
    }

    /// `[lblk, lblk + count)` is mapped, but not as the record says: the
    /// kernel's `ext4_ext_replay_update_ex`. Converting unwritten blocks in
    /// place keeps them; anything else is unmapped and mapped anew.
    #[allow(clippy::too_many_arguments)]
    fn remap(
        &mut self,
        ino: u32,
        inode: &mut Inode,
        lblk: u64,
        count: u64,
        physical: u64,
        unwritten: bool,
        current: Extent,
    ) -> Result<()> {
        if current.physical == physical && current.unwritten && !unwritten {
            self.with_ctx(None, |ctx| {
                mapping::mark_written(ctx, ino, inode, lblk, count)
            })?;
            return Ok(());
        }
        self.with_ctx(None, |ctx| {
            mapping::punch(ctx, ino, inode, lblk, Some(lblk + count))
        })?;
        self.map_pinned(ino, inode, lblk, count, physical, unwritten)
    }

    /// Map the hole `[lblk, lblk + count)` to the reserved blocks from
    /// `physical`, through `mapping::allocate` with the blocks pinned.
    fn map_pinned(
        &mut self,
        ino: u32,
        inode: &mut Inode,
        lblk: u64,
        count: u64,
        physical: u64,
        unwritten: bool,
    ) -> Result<()> {
        debug_assert!(self.reserved.split(physical, physical + count).1.is_empty());
        let mut done = 0;
        // Each allocation maps at least one block.
        while done < count {
            let want = (count - done).min(u32::MAX as u64) as u32;
            let pin = (physical + done, want);
            let (mapped, pin_taken) = self.with_ctx(Some(pin), |ctx| {
                mapping::allocate(ctx, ino, inode, lblk + done, want, pin.0, unwritten)
            })?;
            if !pin_taken || mapped.logical != lblk + done || mapped.physical != pin.0 {
                return Err(Error::corrupt(
                    Location::Inode { ino },
                    format!(
                        "replaying a fast-commit range mapped {mapped:?}, not block {}",
                        pin.0
                    ),
                ));
            }
            done += mapped.len as u64;
        }
        Ok(())
    }

    fn replay_del_range(&mut self, ino: u32, lblk: u32, len: u32) -> Result<bool> {
        if len == 0 {
            return Ok(false);
        }
        let Some(mut inode) = self.range_target(ino)? else {
            return Ok(false);
        };
        let start = lblk as u64;
        let end = start + len as u64;
        self.with_ctx(None, |ctx| {
            mapping::punch(ctx, ino, &mut inode, start, Some(end))
        })?;
        self.tx.write_inode(ino, &inode)?;
        self.modified.insert(ino);
        Ok(true)
    }
}

// CREAT, LINK, UNLINK.
impl Replayer<'_, '_, '_> {
    /// The directory `dentry` names and whether the name is there already.
    fn target_dir(&self, dentry: &Dentry) -> Result<Option<(Inode, Option<u32>)>> {
        if !usable_name(&dentry.name) {
            return Ok(None);
        }
        let Some(dir) = self.live_dir(dentry.parent)? else {
            return Ok(None);
        };
        let existing = self.tx.find_entry(dentry.parent, &dir, &dentry.name)?;
        Ok(Some((dir, existing.map(|entry| entry.ino))))
    }

    /// Add the name; the directory may grow.
    fn add_name(&mut self, dentry: &Dentry, dir: &mut Inode, inode: &Inode) -> Result<()> {
        let handle = self.tx.handle;
        let file_type = dir::file_type_from_mode(inode.mode);
        dir::add_entry(
            &mut DirWriter::new(self.tx, dentry.parent, dir),
            handle,
            &dentry.name,
            dentry.ino,
            file_type,
        )?;
        if inode.is_dir() {
            dir.links_count = if dir.links_count >= LINK_MAX || dir.links_count == 1 {
                1 // "many", with dir_nlink
            } else {
                dir.links_count + 1
            };
        }
        self.tx.write_inode(dentry.parent, dir)?;
        self.modified.insert(dentry.parent);
        Ok(())
    }

    fn replay_create(&mut self, dentry: &Dentry) -> Result<bool> {
        let Some(mut inode) = self.live_inode(dentry.ino)? else {
            // The kernel's replay fails here as well: CREAT follows the
            // inode's own record.
            return Err(Error::corrupt(
                Location::Inode { ino: dentry.ino },
                "fast commit names an inode that no inode record described",
            ));
        };
        let Some((mut dir, existing)) = self.target_dir(dentry)? else {
            return Ok(false);
        };
        if inode.is_dir() {
            if inode.size == 0 {
                let handle = self.tx.handle;
                let writer = &mut DirWriter::new(self.tx, dentry.ino, &mut inode);
                dir::init_dir(writer, handle, dentry.ino, dentry.parent)?;
            }
            inode.links_count = 2;
        } else {
            inode.links_count = 1;
        }
        self.tx.write_inode(dentry.ino, &inode)?;
        self.modified.insert(dentry.ino);
        if existing.is_none() {
            self.add_name(dentry, &mut dir, &inode)?;
        }
        Ok(true)
    }

    fn replay_link(&mut self, dentry: &Dentry) -> Result<bool> {
        let Some(mut inode) = self.live_inode(dentry.ino)? else {
            return Ok(false);
        };
        // Directories are never linked (the kernel falls back to a full
        // commit for their renames).
        if inode.is_dir() {
            return Ok(false);
        }
        let Some((mut dir, None)) = self.target_dir(dentry)? else {
            return Ok(false);
        };
        self.add_name(dentry, &mut dir, &inode)?;
        inode.links_count = inode.links_count.saturating_add(1);
        self.tx.write_inode(dentry.ino, &inode)?;
        Ok(true)
    }

    fn replay_unlink(&mut self, dentry: &Dentry) -> Result<bool> {
        let Some(mut inode) = self.live_inode(dentry.ino)? else {
            return Ok(false);
        };
        let Some((mut dir, Some(existing))) = self.target_dir(dentry)? else {
            return Ok(false);
        };
        if existing != dentry.ino {
            return Ok(false);
        }
        let handle = self.tx.handle;
        dir::remove_entry(
            &mut DirWriter::new(self.tx, dentry.parent, &mut dir),
            handle,
            &dentry.name,
        )?;
        if inode.is_dir() && dir.links_count > 2 {
            dir.links_count -= 1;
        }
        self.tx.write_inode(dentry.parent, &dir)?;
        if inode.is_dir() {
            return self.remove_dir(dentry.ino, inode).map(|()| true);
        }
        inode.links_count -= 1;
        if inode.links_count == 0 {
            self.evict(dentry.ino, inode)?;
        } else {
            self.tx.write_inode(dentry.ino, &inode)?;
        }
        Ok(true)
    }

    /// A directory lost its name (rmdir): it was empty then, and goes.
    fn remove_dir(&mut self, ino: u32, mut inode: Inode) -> Result<()> {
        let empty = {
            let reader = &mut super::dirops::DirReader::new(self.tx.core, ino, &inode);
            dir::is_empty(reader)?
        };
        if !empty {
            // Its entries' removals were not recorded: keep it for e2fsck
            // to reconnect rather than lose what it names.
            tracing::warn!(
                ino,
                "fast commit removes a directory that is not empty; kept"
            );
            inode.links_count = 2;
            return self.tx.write_inode(ino, &inode);
        }
        self.evict(ino, inode)
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
            self.tx.st.sb.free_blocks_count,
            self.tx
                .st
                .groups
                .iter()
                .map(|desc| desc.free_blocks as u64)
                .sum::<u64>()
        );
        sum_free_counts(self.tx);
        Ok(())
    }
}

/// The superblock's free counts as the sums of the groups' (what the
/// kernel's counters start from at mount, and what e2fsck checks).
fn sum_free_counts(tx: &mut Tx<'_, '_>) {
    let st = &mut *tx.st;
    st.sb.free_blocks_count = st.groups.iter().map(|desc| desc.free_blocks as u64).sum();
    st.sb.free_inodes_count = st.groups.iter().map(|desc| desc.free_inodes).sum();
    st.sb_dirty = true;
}

// ---------------------------------------------------------------------------
// Bitmap bits of given blocks and inodes. The allocator (`alloc.rs`) finds
// free blocks and inodes; the replay also needs to claim and release the
// ones the records name.

/// The block bitmap of `group`, initialised in the transaction if the group
/// is still BLOCK_UNINIT, its checksum verified otherwise.
fn block_bitmap(tx: &mut Tx<'_, '_>, group: u32) -> Result<Arc<Buffer>> {
    let geo = &tx.core.geo;
    let desc = &tx.st.groups[group as usize];
    if geo.has_group_csum() && desc.flags & BG_BLOCK_UNINIT != 0 {
        let buffer = tx.core.cache.get_for_overwrite(desc.block_bitmap)?;
        {
            let mut bytes = tx.handle.get_create_access(&buffer)?;
            bitmap::uninit_block_bitmap(geo, group, &tx.st.groups, &mut bytes);
            let desc = &mut tx.st.groups[group as usize];
            desc.flags &= !BG_BLOCK_UNINIT;
            desc.set_block_bitmap_csum(geo, &bytes);
        }
        buffer.set_verified();
        tx.mark_group_dirty(group);
        return Ok(buffer);
    }
    let buffer = tx.core.cache.read(desc.block_bitmap)?;
    if !buffer.is_verified() {
        if !desc.block_bitmap_csum_ok(geo, &buffer.read()) {
            return Err(Error::corrupt(
                Location::Block {
                    block: desc.block_bitmap,
                },
                format!("block bitmap checksum mismatch for group {group}"),
            ));
        }
        buffer.set_verified();
    }
    Ok(buffer)
}

/// Set (`in_use`) or clear the bits of blocks `[start, end)`, keeping the
/// free counts exact. Returns the ranges whose bits changed.
fn mark_blocks(tx: &mut Tx<'_, '_>, start: u64, end: u64, in_use: bool) -> Result<Vec<(u64, u64)>> {
    let geo = &tx.core.geo;
    debug_assert!(start >= geo.first_data_block as u64 && end <= geo.blocks_count);
    let mut changed = Vec::new();
    let mut block = start;
    // One group per round.
    while block < end {
        let group = geo.group_of_block(block);
        let base = geo.group_first_block(group);
        let group_end = (base + geo.blocks_in_group(group) as u64).min(end);
        let buffer = block_bitmap(tx, group)?;
        let mut flipped = 0u32;
        {
            let mut bytes = tx.handle.get_write_access(&buffer)?;
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
            let desc = &mut tx.st.groups[group as usize];
            if in_use {
                desc.free_blocks = desc.free_blocks.checked_sub(flipped).ok_or_else(|| {
                    Error::corrupt(
                        Location::GroupDescriptor { group },
                        "free block count below the bitmap's",
                    )
                })?;
                tx.st.sb.free_blocks_count -= flipped as u64;
            } else {
                desc.free_blocks += flipped;
                tx.st.sb.free_blocks_count += flipped as u64;
            }
            tx.st.groups[group as usize].set_block_bitmap_csum(geo, &bytes);
        }
        if flipped > 0 {
            tx.mark_group_dirty(group);
        }
        block = group_end;
    }
    Ok(changed)
}

/// Whether `ino`'s bit is set (an inode in a never-initialised part of the
/// table is free).
fn inode_in_use(tx: &Tx<'_, '_>, ino: u32) -> Result<bool> {
    let geo = &tx.core.geo;
    let group = geo.group_of_inode(ino);
    let index = geo.inode_index_in_group(ino);
    let desc = &tx.st.groups[group as usize];
    if geo.has_group_csum()
        && (desc.flags & BG_INODE_UNINIT != 0 || index >= geo.inodes_per_group - desc.itable_unused)
    {
        return Ok(false);
    }
    let buffer = tx.core.cache.read(desc.inode_bitmap)?;
    let used = bitmap::test_bit(&buffer.read(), index as usize);
    Ok(used)
}

/// Claim inode `ino` in its group (`ext4_mark_inode_used`), counting it
/// and, for a directory, the group's directories.
fn mark_inode_in_use(tx: &mut Tx<'_, '_>, ino: u32, is_dir: bool) -> Result<()> {
    let geo = &tx.core.geo;
    let group = geo.group_of_inode(ino);
    let index = geo.inode_index_in_group(ino);
    let uninit = geo.has_group_csum() && tx.st.groups[group as usize].flags & BG_INODE_UNINIT != 0;
    let buffer = inode_bitmap(tx, group, uninit)?;
    if tx.st.groups[group as usize].flags & BG_BLOCK_UNINIT != 0 && geo.has_group_csum() {
        block_bitmap(tx, group)?; // a group in use gets a real block bitmap
    }
    let mut bytes = tx.handle.get_write_access(&buffer)?;
    if bitmap::test_bit(&bytes, index as usize) {
        return Ok(());
    }
    bitmap::set_bit(&mut bytes, index as usize);
    let desc = &mut tx.st.groups[group as usize];
    desc.free_inodes = desc.free_inodes.checked_sub(1).ok_or_else(|| {
        Error::corrupt(
            Location::GroupDescriptor { group },
            "free inode count underflow",
        )
    })?;
    if is_dir {
        desc.used_dirs += 1;
    }
    if geo.has_group_csum() && index >= geo.inodes_per_group - desc.itable_unused {
        desc.itable_unused = geo.inodes_per_group - index - 1;
    }
    desc.set_inode_bitmap_csum(geo, &bytes);
    drop(bytes);
    tx.st.sb.free_inodes_count -= 1;
    tx.mark_group_dirty(group);
    Ok(())
}

/// The inode bitmap of `group`; a zeroed one (padding set) when the group
/// was INODE_UNINIT, which it no longer is.
fn inode_bitmap(tx: &mut Tx<'_, '_>, group: u32, uninit: bool) -> Result<Arc<Buffer>> {
    let geo = &tx.core.geo;
    let desc = &tx.st.groups[group as usize];
    if uninit {
        let buffer = tx.core.cache.get_for_overwrite(desc.inode_bitmap)?;
        {
            let mut bytes = tx.handle.get_create_access(&buffer)?;
            bytes.fill(0);
            for bit in geo.inodes_per_group as usize..bytes.len() * 8 {
                bitmap::set_bit(&mut bytes, bit);
            }
            let desc = &mut tx.st.groups[group as usize];
            desc.flags &= !BG_INODE_UNINIT;
            desc.itable_unused = geo.inodes_per_group;
            desc.set_inode_bitmap_csum(geo, &bytes);
        }
        buffer.set_verified();
        tx.mark_group_dirty(group);
        return Ok(buffer);
    }
    let buffer = tx.core.cache.read(desc.inode_bitmap)?;
    if !buffer.is_verified() {
        if !desc.inode_bitmap_csum_ok(geo, &buffer.read()) {
            return Err(Error::corrupt(
                Location::Block {
                    block: desc.inode_bitmap,
                },
                format!("inode bitmap checksum mismatch for group {group}"),
            ));
        }
        buffer.set_verified();
    }
    Ok(buffer)
}
