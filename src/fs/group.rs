//! Block groups while mounted: each group's descriptor under its own lock
//! [Group] — the allocator takes one group at a time, so allocations in
//! different groups never wait for each other — with mirrors of its counts
//! that scans (the allocator's search, Orlov) read without the lock, and
//! where its bitmaps and inode table are, which never changes.
//!
//! A descriptor changed under its lock is written back to its table block
//! when the lock is released (`GroupGuard`'s drop), and the free totals
//! (`SbInfo`) move by what its counts moved: the totals always equal the
//! sum of the descriptors written. The table blocks stay resident, so the
//! write back cannot fail.
//!
//! Beside its descriptor, each group keeps the blocks freed in it by
//! transactions that are not durable yet (`PendingFrees`), as a mask the
//! allocator lays over the bitmap: those blocks read free but must not be
//! handed out before the commit that frees them is durable (the journal's
//! pending-free map is the authority; the mask is its per-group copy, so
//! that a search never asks about one candidate at a time — the kernel's
//! mballoc keeps such blocks used in its buddy bitmap until the commit).

use super::prealloc::{Window, WindowMask};
use super::sb_info::SbInfo;
use super::system_zone::SystemZone;
use crate::cache::{Buffer, BufferCache};
use crate::error::Result;
use crate::format::bitmap;
use crate::format::group_desc::{GroupDesc, GroupLocations};
use crate::format::superblock::Geometry;
use crate::journal::Handle;
use crate::journal::format::tid_gt;
use crate::lock::{Mutex, MutexGuard, Rank};
use std::ops::{Deref, DerefMut};
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, AtomicU32, AtomicU64, Ordering};

/// A group's block bitmap was found corrupt (the kernel's
/// `EXT4_GROUP_INFO_BBITMAP_CORRUPT`): no block is allocated from or
/// freed into it, and its free blocks are off the totals.
pub(crate) const BLOCK_BITMAP_CORRUPT: u8 = 1;
/// A group's inode bitmap was found corrupt (`IBITMAP_CORRUPT`): no inode
/// is allocated from or freed into it, its free inodes off the totals.
pub(crate) const INODE_BITMAP_CORRUPT: u8 = 2;
/// A group's block bitmap marks metadata free that the kernel's check
/// passes over (with flex_bg, any; without, another group's or a
/// descriptor copy): blocks are freed into it, as the kernel frees them,
/// but none is allocated from it, and its free blocks are off the totals
/// as a corrupt bitmap's are.
pub(crate) const BLOCK_ALLOC_REFUSED: u8 = 4;
/// The flags whose group's free blocks are off the totals.
const OFF_BLOCK_TOTALS: u8 = BLOCK_BITMAP_CORRUPT | BLOCK_ALLOC_REFUSED;

struct Group {
    at: GroupLocations,
    /// [Group] The descriptor as it is on disk, or will be at commit, and
    /// the blocks freed but not allocatable yet.
    desc: Mutex<GroupState>,
    /// Mirrors of the descriptor's free counts and of the initialised part
    /// of its inode table, for readers that take no lock.
    free_blocks: AtomicU32,
    free_inodes: AtomicU32,
    initialised_inodes: AtomicU32,
    /// Mirror of the pending frees: the oldest entry's tid in the high
    /// half, the masked blocks in the low half (0: none). A hint for
    /// scans that take no lock.
    pending_hint: AtomicU64,
    /// Mirror of the blocks the group's windows hold (a hint).
    window_hint: AtomicU32,
    /// `BLOCK_BITMAP_CORRUPT`, `INODE_BITMAP_CORRUPT` and
    /// `BLOCK_ALLOC_REFUSED`, each set once (under the group's lock) and
    /// never cleared while mounted.
    corrupt: AtomicU8,
}

struct GroupState {
    desc: GroupDesc,
    pending: PendingFrees,
    /// The blocks of files' preallocation windows in this group.
    windows: WindowMask,
}

/// Blocks of one group freed by transactions that are not durable yet:
/// each free with its transaction, and a bit per block of the group set
/// while any of them covers it (no mask while there are none).
#[derive(Default)]
pub(crate) struct PendingFrees {
    /// (freeing tid, first bit, count), oldest first.
    entries: Vec<(u32, u32, u32)>,
    mask: Vec<u8>,
    blocks: u32,
}

impl PendingFrees {
    /// Bits `first..first+count` were freed in transaction `tid`.
    pub fn add(&mut self, tid: u32, first: u32, count: u32, spare: &SpareMasks) {
        debug_assert!(count > 0);
        if self.mask.is_empty() {
            self.mask = spare.take();
        }
        self.entries.push((tid, first, count));
        self.mark(first, count);
    }

    /// Set bits `first..first+count` in the mask, counting the new ones.
    fn mark(&mut self, first: u32, count: u32) {
        for bit in first as usize..(first + count) as usize {
            if !bitmap::test_bit(&self.mask, bit) {
                bitmap::set_bit(&mut self.mask, bit);
                self.blocks += 1;
            }
        }
    }

    /// Forget the frees of transactions up to `durable` (their blocks are
    /// allocatable now); the mask is rebuilt from what stays, since one
    /// block may be freed, reused and freed again while an old entry
    /// waits here. A mask left empty goes back to `spare`.
    pub fn retire(&mut self, durable: u32, spare: &SpareMasks) {
        // Entries come in transaction order (a group's frees are made
        // under its lock, by handles of the running transaction): when the
        // oldest is not durable, none is — the common case costs nothing.
        match self.entries.first() {
            Some(&(oldest, _, _)) if !tid_gt(oldest, durable) => {}
            _ => return,
        }
        debug_assert!(
            self.entries
                .windows(2)
                .all(|pair| !tid_gt(pair[0].0, pair[1].0)),
            "pending frees out of transaction order"
        );
        let before = self.entries.len();
        self.entries.retain(|&(tid, _, _)| tid_gt(tid, durable));
        if self.entries.len() == before {
            return;
        }
        self.mask.fill(0);
        self.blocks = 0;
        if self.entries.is_empty() {
            spare.give(std::mem::take(&mut self.mask));
            return;
        }
        let entries = std::mem::take(&mut self.entries);
        for &(_, first, count) in &entries {
            self.mark(first, count);
        }
        self.entries = entries;
    }

    /// The bits not allocatable yet, if any.
    pub fn mask(&self) -> Option<&[u8]> {
        (!self.mask.is_empty()).then_some(&self.mask[..])
    }
}

/// Most spare masks kept (each a block's size): enough for the groups a
/// few threads work in at once; more are freed.
const SPARE_MASKS: usize = 16;

/// Zeroed masks of a bitmap's length for the groups' pending frees and
/// windows. A group makes its mask when its first window or pending free
/// comes and gives it up when the last goes — on a create, write, unlink
/// loop once per file — so the masks are recycled here instead of
/// allocated and zeroed each time, while groups without windows or
/// pending frees still hold none (a leaf lock, taken under a group lock).
pub(crate) struct SpareMasks {
    bitmap_bytes: usize,
    masks: parking_lot::Mutex<Vec<Vec<u8>>>,
}

impl SpareMasks {
    pub fn new(bitmap_bytes: usize) -> SpareMasks {
        SpareMasks {
            bitmap_bytes,
            masks: parking_lot::Mutex::new(Vec::with_capacity(SPARE_MASKS)),
        }
    }

    /// A zeroed mask.
    pub fn take(&self) -> Vec<u8> {
        let mask = self.masks.lock().pop();
        let mask = mask.unwrap_or_else(|| vec![0; self.bitmap_bytes]);
        debug_assert_eq!(mask.len(), self.bitmap_bytes);
        mask
    }

    /// Keep `mask`, all zero again, for the next `take` (or free it when
    /// enough are kept).
    pub fn give(&self, mask: Vec<u8>) {
        debug_assert_eq!(mask.len(), self.bitmap_bytes);
        debug_assert!(
            mask.iter().all(|&byte| byte == 0),
            "a spare mask with bits set"
        );
        let mut masks = self.masks.lock();
        if masks.len() < SPARE_MASKS {
            masks.push(mask);
        }
    }
}

pub(crate) struct Groups {
    groups: Vec<Group>,
    /// The descriptor table's blocks, resident: block `i` holds the
    /// descriptors of groups `i*N..i*N+N` wherever it lies (meta_bg).
    table: Vec<Arc<Buffer>>,
    /// The cache the table was read from (the fault `MetaBgFlatDescriptor`
    /// reads the block it writes to wrongly).
    cache: Arc<BufferCache>,
    /// Blocks in preallocation windows, all groups (changed under the
    /// group's lock): none means a search that steps over windows missed
    /// nothing.
    window_blocks: AtomicU64,
    /// Masks for the groups' pending frees and windows, recycled.
    spare_masks: SpareMasks,
    /// Where metadata lies, which is never handed out.
    zone: SystemZone,
}

impl Groups {
    /// Read every descriptor (checked against the geometry on decode), and
    /// refuse descriptors whose metadata overlap each other or the
    /// internal journal's blocks `journal` (`SystemZone::build`; empty
    /// when there is none, or while the journal is being found).
    pub fn load(geo: &Geometry, cache: &Arc<BufferCache>, journal: &[u64]) -> Result<Groups> {
        let mut groups = Vec::with_capacity(geo.group_count as usize);
        let mut table: Vec<Arc<Buffer>> = Vec::new();
        for group in 0..geo.group_count {
            let (block, offset) = geo.group_desc_location(group);
            if group % geo.descs_per_block == 0 {
                table.push(cache.read(block)?);
            }
            let buffer = table.last().expect("group 0 starts the table");
            debug_assert_eq!(buffer.block(), block);
            let desc = {
                let bytes = buffer.read();
                GroupDesc::decode(geo, group, &bytes[offset..offset + geo.desc_size as usize])?
            };
            groups.push(Group {
                at: desc.locations(),
                free_blocks: AtomicU32::new(desc.free_blocks),
                free_inodes: AtomicU32::new(desc.free_inodes),
                initialised_inodes: AtomicU32::new(desc.initialised_inodes(geo)),
                pending_hint: AtomicU64::new(0),
                window_hint: AtomicU32::new(0),
                corrupt: AtomicU8::new(0),
                desc: Mutex::new(
                    Rank::Group,
                    GroupState {
                        desc,
                        pending: PendingFrees::default(),
                        windows: WindowMask::default(),
                    },
                ),
            });
        }
        debug_assert_eq!(table.len(), geo.gdt_blocks as usize);
        let locations: Vec<GroupLocations> = groups.iter().map(|group| group.at).collect();
        let zone = SystemZone::build(geo, &locations, journal)?;
        for (group, _) in zone.overlaps() {
            // As a bitmap found corrupt: out of the totals, never
            // allocated from, its bitmaps never written. The mount says so
            // (`Core::open`): this load may be one of several.
            groups[*group as usize].corrupt.fetch_or(
                BLOCK_BITMAP_CORRUPT | INODE_BITMAP_CORRUPT,
                Ordering::AcqRel,
            );
        }
        Ok(Groups {
            groups,
            table,
            cache: Arc::clone(cache),
            window_blocks: AtomicU64::new(0),
            spare_masks: SpareMasks::new(geo.block_size as usize),
            zone,
        })
    }

    /// The metadata blocks inside `group`'s blocks, as ranges of blocks:
    /// its superblock copy, descriptor and reserved descriptor blocks, and
    /// any group's bitmaps and inode table that lie there (flex_bg packs a
    /// flex group's into its first group).
    pub fn metadata_in_group(
        &self,
        geo: &Geometry,
        group: u32,
    ) -> impl Iterator<Item = (u64, u64)> + '_ {
        let first = geo.group_first_block(group);
        let end = first + geo.blocks_in_group(group) as u64;
        let overhead = (first, first + geo.group_overhead_blocks(group) as u64);
        std::iter::once(overhead)
            .filter(|&(start, end)| start < end)
            .chain(self.zone.within(first, end))
    }

    /// The first block of `start..end` (inside one group) that holds
    /// metadata, if any: what no file may own and no allocation may take.
    pub fn first_metadata_block(&self, geo: &Geometry, start: u64, end: u64) -> Option<u64> {
        let group = geo.group_of_block(start);
        self.metadata_in_group(geo, group)
            .find(|&(first, last)| first < end && start < last)
            .map(|(first, _)| first.max(start))
    }

    /// The first block of `start..end` (any groups) in the system zone —
    /// group metadata or the journal — if any: what only the journal
    /// inode may map.
    pub fn first_system_block(&self, start: u64, end: u64) -> Option<u64> {
        self.zone.first_within(start, end)
    }

    /// Groups kept out of allocation because their metadata overlap in a
    /// way the kernel mounts (`SystemZone::overlaps`), each with why.
    pub fn overlaps(&self) -> &[(u32, String)] {
        self.zone.overlaps()
    }

    /// `BLOCK_BITMAP_CORRUPT`, `INODE_BITMAP_CORRUPT` and
    /// `BLOCK_ALLOC_REFUSED` of `group`.
    pub fn corrupt(&self, group: u32) -> u8 {
        self.groups[group as usize].corrupt.load(Ordering::Acquire)
    }

    pub fn count(&self) -> u32 {
        self.groups.len() as u32
    }

    /// Where group `group`'s bitmaps and inode table are.
    pub fn at(&self, group: u32) -> &GroupLocations {
        &self.groups[group as usize].at
    }

    /// Every group's locations, in group order.
    pub fn locations(&self) -> impl Iterator<Item = GroupLocations> + '_ {
        self.groups.iter().map(|group| group.at)
    }

    /// Free blocks in `group` when last written (no lock: a hint); none in
    /// a group whose block bitmap is corrupt.
    pub fn free_blocks(&self, group: u32) -> u32 {
        let group = &self.groups[group as usize];
        if group.corrupt.load(Ordering::Acquire) & OFF_BLOCK_TOTALS != 0 {
            return 0;
        }
        group.free_blocks.load(Ordering::Acquire)
    }

    /// Whether `group` may have a block to allocate, from its counts alone
    /// (no lock): not when it has none free, nor when every free block is
    /// one its pending frees hold and the oldest of them is not durable
    /// yet (`durable`; the newer ones are not either, so the count is
    /// exact). Pending frees that may be durable are retired by the
    /// search, which must visit the group for that.
    pub fn may_allocate(&self, group: u32, durable: Option<u32>) -> bool {
        let free = self.free_blocks(group);
        if free == 0 {
            return false;
        }
        let hint = self.groups[group as usize]
            .pending_hint
            .load(Ordering::Acquire);
        let (oldest, pending) = ((hint >> 32) as u32, hint as u32);
        match durable {
            Some(durable) if pending >= free => !tid_gt(oldest, durable),
            _ => true,
        }
    }

    /// Free inodes in `group` when last written (no lock: a hint); none in
    /// a group whose inode bitmap is corrupt.
    pub fn free_inodes(&self, group: u32) -> u32 {
        let group = &self.groups[group as usize];
        if group.corrupt.load(Ordering::Acquire) & INODE_BITMAP_CORRUPT != 0 {
            return 0;
        }
        group.free_inodes.load(Ordering::Acquire)
    }

    /// Inodes of `group`'s table past this index were never initialised
    /// (lazy init): they read as zeros. An inode is counted here before
    /// it is handed out, so a reader of a live inode always sees it.
    pub fn initialised_inodes(&self, group: u32) -> u32 {
        self.groups[group as usize]
            .initialised_inodes
            .load(Ordering::Acquire)
    }

    /// The sums of the descriptors' free counts (blocks, inodes), but those
    /// of groups whose bitmaps are corrupt, as the kernel's counters.
    pub fn free_totals(&self) -> (u64, u64) {
        let blocks = (0..self.count()).map(|g| self.free_blocks(g) as u64).sum();
        let inodes = (0..self.count()).map(|g| self.free_inodes(g) as u64).sum();
        (blocks, inodes)
    }

    /// Whether `group` may have a block outside every window (no lock: a
    /// hint): not when windows hold all its free blocks.
    pub fn may_allocate_outside_windows(&self, group: u32) -> bool {
        let group = &self.groups[group as usize];
        group.window_hint.load(Ordering::Acquire) < group.free_blocks.load(Ordering::Acquire)
    }

    /// Blocks in preallocation windows (a snapshot).
    pub fn window_blocks(&self) -> u64 {
        self.window_blocks.load(Ordering::Acquire)
    }

    /// Unmask `window` (taken from `Windows`) in its group: for a file
    /// released, outside any transaction.
    pub fn drop_window(&self, window: Window) {
        let group = &self.groups[window.group as usize];
        let mut state = group.desc.lock();
        state
            .windows
            .remove(window.start, window.len, &self.spare_masks);
        group.window_hint.fetch_sub(window.len, Ordering::AcqRel);
        self.window_blocks
            .fetch_sub(window.len as u64, Ordering::AcqRel);
    }

    /// Lock `group`'s descriptor for a change made in `handle`'s
    /// transaction.
    pub fn lock<'a, 'j>(
        &'a self,
        geo: &'a Geometry,
        sbi: &'a SbInfo,
        handle: &'a Handle<'j>,
        group: u32,
    ) -> GroupGuard<'a, 'j> {
        let desc = self.groups[group as usize].desc.lock();
        let before = (desc.desc.free_blocks, desc.desc.free_inodes);
        GroupGuard {
            groups: self,
            geo,
            sbi,
            handle,
            group,
            desc,
            before,
            dirty: false,
        }
    }
}

/// One group's descriptor, locked; changes through `DerefMut` are written
/// back when the guard drops.
pub(crate) struct GroupGuard<'a, 'j> {
    groups: &'a Groups,
    geo: &'a Geometry,
    sbi: &'a SbInfo,
    handle: &'a Handle<'j>,
    group: u32,
    desc: MutexGuard<'a, GroupState>,
    /// The free counts when locked: the totals move by the difference.
    before: (u32, u32),
    dirty: bool,
}

impl GroupGuard<'_, '_> {
    pub fn group(&self) -> u32 {
        self.group
    }

    /// Whether the group has `flag` (`BLOCK_BITMAP_CORRUPT`,
    /// `INODE_BITMAP_CORRUPT`, `BLOCK_ALLOC_REFUSED`).
    pub fn is_corrupt(&self, flag: u8) -> bool {
        self.groups.corrupt(self.group) & flag != 0
    }

    /// Mark the group `flag` (as `ext4_mark_group_bitmap_corrupted`, or
    /// `BLOCK_ALLOC_REFUSED`): its free blocks, or inodes, leave the
    /// totals, since nothing will allocate them. False if it was marked so
    /// already.
    pub fn mark_corrupt(&mut self, flag: u8) -> bool {
        debug_assert!(matches!(
            flag,
            BLOCK_BITMAP_CORRUPT | INODE_BITMAP_CORRUPT | BLOCK_ALLOC_REFUSED
        ));
        let shared = &self.groups.groups[self.group as usize];
        let was = shared.corrupt.fetch_or(flag, Ordering::AcqRel);
        if was & flag != 0 {
            return false;
        }
        // The totals hold the counts as last written back (`before`); from
        // now on `write_back` moves them by nothing for this group.
        // (Once: a refused group found corrupt later is off them already.)
        if flag == INODE_BITMAP_CORRUPT {
            self.sbi.add_free(0, -(self.before.1 as i64));
        } else if was & OFF_BLOCK_TOTALS == 0 {
            self.sbi.add_free(-(self.before.0 as i64), 0);
        }
        true
    }

    /// Retire the group's pending frees of transactions up to `durable`:
    /// their blocks are allocatable again.
    pub fn retire_pending(&mut self, durable: u32) {
        let spare = &self.groups.spare_masks;
        self.desc.pending.retire(durable, spare);
        self.publish_pending();
    }

    /// The group's blocks freed but not allocatable yet (as of the last
    /// `retire_pending`), as a mask over its bitmap.
    pub fn pending_mask(&self) -> Option<&[u8]> {
        self.desc.pending.mask()
    }

    /// Blocks `first..first+count` of the group (bits) were freed in the
    /// running transaction `tid`.
    pub fn add_pending(&mut self, tid: u32, first: u32, count: u32) {
        let spare = &self.groups.spare_masks;
        self.desc.pending.add(tid, first, count, spare);
        self.publish_pending();
    }

    /// The group's preallocation windows, as a mask over its bitmap.
    pub fn window_mask(&self) -> Option<&[u8]> {
        self.desc.windows.mask()
    }

    /// Keep bits `start..start + len` (free, outside every window and
    /// pending free) as a window.
    pub fn add_window(&mut self, start: u32, len: u32) {
        let spare = &self.groups.spare_masks;
        self.desc.windows.add(start, len, spare);
        self.groups.groups[self.group as usize]
            .window_hint
            .fetch_add(len, Ordering::AcqRel);
        self.groups
            .window_blocks
            .fetch_add(len as u64, Ordering::AcqRel);
    }

    /// Unmask `window`, a window of this group.
    pub fn remove_window(&mut self, window: Window) {
        debug_assert_eq!(window.group, self.group);
        let spare = &self.groups.spare_masks;
        self.desc.windows.remove(window.start, window.len, spare);
        self.groups.groups[self.group as usize]
            .window_hint
            .fetch_sub(window.len, Ordering::AcqRel);
        self.groups
            .window_blocks
            .fetch_sub(window.len as u64, Ordering::AcqRel);
    }

    fn publish_pending(&self) {
        let pending = &self.desc.pending;
        let oldest = pending.entries.first().map_or(0, |&(tid, _, _)| tid);
        let hint = (oldest as u64) << 32 | pending.blocks as u64;
        self.groups.groups[self.group as usize]
            .pending_hint
            .store(hint, Ordering::Release);
    }

    /// Write the descriptor into its table block (if it changed) and
    /// publish its counts.
    fn write_back(&mut self) {
        let geo = self.geo;
        let (block, offset) = geo.group_desc_location(self.group);
        let buffer = &self.groups.table[(self.group / geo.descs_per_block) as usize];
        debug_assert_eq!(buffer.block(), block);
        let misplaced = self.misplaced_table_block(block);
        let buffer = misplaced.as_ref().unwrap_or(buffer);
        // get_write_access cannot fail: the block is resident.
        if let Ok(mut bytes) = self.handle.get_write_access(buffer) {
            let size = geo.desc_size as usize;
            self.desc
                .desc
                .encode(geo, self.group, &mut bytes[offset..offset + size]);
        }
        let shared = &self.groups.groups[self.group as usize];
        let desc = &self.desc.desc;
        shared
            .free_blocks
            .store(desc.free_blocks, Ordering::Release);
        shared
            .free_inodes
            .store(desc.free_inodes, Ordering::Release);
        shared
            .initialised_inodes
            .store(desc.initialised_inodes(geo), Ordering::Release);
        // A corrupt bitmap's group is off the totals for good.
        let corrupt = shared.corrupt.load(Ordering::Acquire);
        let moved = |now: u32, before: u32, flag: u8| match corrupt & flag {
            0 => now as i64 - before as i64,
            _ => 0,
        };
        self.sbi.add_free(
            moved(desc.free_blocks, self.before.0, OFF_BLOCK_TOTALS),
            moved(desc.free_inodes, self.before.1, INODE_BITMAP_CORRUPT),
        );
        self.before = (desc.free_blocks, desc.free_inodes);
        self.dirty = false;
    }
}

impl GroupGuard<'_, '_> {
    /// Under the fault `MetaBgFlatDescriptor`, the block the descriptor
    /// goes to instead of `block`, its real one: where the table would be
    /// without meta_bg, when that is elsewhere.
    fn misplaced_table_block(&self, block: u64) -> Option<Arc<Buffer>> {
        if !crate::faults::active(crate::faults::Fault::MetaBgFlatDescriptor) {
            return None;
        }
        let (flat, _) = self.geo.flat_group_desc_location(self.group);
        if flat == block {
            return None;
        }
        self.groups.cache.read(flat).ok()
    }
}

impl Deref for GroupGuard<'_, '_> {
    type Target = GroupDesc;
    fn deref(&self) -> &GroupDesc {
        &self.desc.desc
    }
}

impl DerefMut for GroupGuard<'_, '_> {
    fn deref_mut(&mut self) -> &mut GroupDesc {
        self.dirty = true;
        &mut self.desc.desc
    }
}

impl Drop for GroupGuard<'_, '_> {
    fn drop(&mut self) {
        if self.dirty {
            self.write_back();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pending_frees_retire_by_transaction_and_keep_blocks_freed_again() {
        let spare = SpareMasks::new(4);
        let mut pending = PendingFrees::default();
        assert!(pending.mask().is_none());
        pending.add(7, 10, 3, &spare);
        pending.add(8, 20, 1, &spare);
        // Block 11 was allocatable after 7, reused, and freed again in 9.
        pending.add(9, 11, 1, &spare);
        assert_eq!(pending.blocks, 4, "block 11 counts once");
        pending.retire(6, &spare);
        assert_eq!(pending.blocks, 4, "nothing durable yet");
        pending.retire(7, &spare);
        let mask = pending.mask().expect("8 and 9 still pending");
        let set: Vec<usize> = (0..32).filter(|&bit| bitmap::test_bit(mask, bit)).collect();
        assert_eq!(set, vec![11, 20], "7's blocks are free again but for 11");
        assert_eq!(pending.blocks, 2);
        pending.retire(9, &spare);
        assert!(pending.mask().is_none());
        assert_eq!(pending.blocks, 0);
        assert_eq!(
            spare.masks.lock().len(),
            1,
            "the emptied mask is kept, zeroed"
        );
        // Transaction ids wrap: u32::MAX is older than 0.
        pending.add(u32::MAX, 0, 1, &spare);
        pending.add(0, 1, 1, &spare);
        pending.retire(u32::MAX, &spare);
        assert_eq!(pending.blocks, 1);
    }
}
