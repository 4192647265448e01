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

use super::sb_info::SbInfo;
use crate::cache::{Buffer, BufferCache};
use crate::error::Result;
use crate::format::group_desc::{GroupDesc, GroupLocations};
use crate::format::superblock::Geometry;
use crate::journal::Handle;
use crate::lock::{Mutex, MutexGuard, Rank};
use std::ops::{Deref, DerefMut};
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

struct Group {
    at: GroupLocations,
    /// [Group] The descriptor as it is on disk, or will be at commit.
    desc: Mutex<GroupDesc>,
    /// Mirrors of the descriptor's free counts and of the initialised part
    /// of its inode table, for readers that take no lock.
    free_blocks: AtomicU32,
    free_inodes: AtomicU32,
    initialised_inodes: AtomicU32,
}

pub(crate) struct Groups {
    groups: Vec<Group>,
    /// The descriptor table's blocks, resident.
    table: Vec<Arc<Buffer>>,
}

impl Groups {
    /// Read every descriptor (checked against the geometry on decode).
    pub fn load(geo: &Geometry, cache: &BufferCache) -> Result<Groups> {
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
                desc: Mutex::new(Rank::Group, desc),
            });
        }
        Ok(Groups { groups, table })
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

    /// Free blocks in `group` when last written (no lock: a hint).
    pub fn free_blocks(&self, group: u32) -> u32 {
        self.groups[group as usize]
            .free_blocks
            .load(Ordering::Acquire)
    }

    /// Free inodes in `group` when last written (no lock: a hint).
    pub fn free_inodes(&self, group: u32) -> u32 {
        self.groups[group as usize]
            .free_inodes
            .load(Ordering::Acquire)
    }

    /// Inodes of `group`'s table past this index were never initialised
    /// (lazy init): they read as zeros. An inode is counted here before
    /// it is handed out, so a reader of a live inode always sees it.
    pub fn initialised_inodes(&self, group: u32) -> u32 {
        self.groups[group as usize]
            .initialised_inodes
            .load(Ordering::Acquire)
    }

    /// The sums of the descriptors' free counts (blocks, inodes).
    pub fn free_totals(&self) -> (u64, u64) {
        let blocks = (0..self.count()).map(|g| self.free_blocks(g) as u64).sum();
        let inodes = (0..self.count()).map(|g| self.free_inodes(g) as u64).sum();
        (blocks, inodes)
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
        let before = (desc.free_blocks, desc.free_inodes);
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
    desc: MutexGuard<'a, GroupDesc>,
    /// The free counts when locked: the totals move by the difference.
    before: (u32, u32),
    dirty: bool,
}

impl GroupGuard<'_, '_> {
    pub fn group(&self) -> u32 {
        self.group
    }

    /// Write the descriptor into its table block (if it changed) and
    /// publish its counts.
    fn write_back(&mut self) {
        let geo = self.geo;
        let (block, offset) = geo.group_desc_location(self.group);
        let buffer = &self.groups.table[(self.group / geo.descs_per_block) as usize];
        debug_assert_eq!(buffer.block(), block);
        // get_write_access cannot fail: the block is resident.
        if let Ok(mut bytes) = self.handle.get_write_access(buffer) {
            let size = geo.desc_size as usize;
            self.desc
                .encode(geo, self.group, &mut bytes[offset..offset + size]);
        }
        let shared = &self.groups.groups[self.group as usize];
        shared
            .free_blocks
            .store(self.desc.free_blocks, Ordering::Release);
        shared
            .free_inodes
            .store(self.desc.free_inodes, Ordering::Release);
        shared
            .initialised_inodes
            .store(self.desc.initialised_inodes(geo), Ordering::Release);
        self.sbi.add_free(
            self.desc.free_blocks as i64 - self.before.0 as i64,
            self.desc.free_inodes as i64 - self.before.1 as i64,
        );
        self.before = (self.desc.free_blocks, self.desc.free_inodes);
        self.dirty = false;
    }
}

impl Deref for GroupGuard<'_, '_> {
    type Target = GroupDesc;
    fn deref(&self) -> &GroupDesc {
        &self.desc
    }
}

impl DerefMut for GroupGuard<'_, '_> {
    fn deref_mut(&mut self) -> &mut GroupDesc {
        self.dirty = true;
        &mut self.desc
    }
}

impl Drop for GroupGuard<'_, '_> {
    fn drop(&mut self) {
        if self.dirty {
            self.write_back();
        }
    }
}
