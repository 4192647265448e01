//! Inodes as the engine sees them: reading and writing them in the inode
//! table, their attributes, `setattr`, and freeing them when the last link
//! and the last open reference are gone.

use super::group::Groups;
use super::{Caller, Core, Fs, Tx};
use crate::cache::BufferCache;
use crate::error::{Error, Location, Result};
use crate::format::inode::{self as fmt, Inode, Timestamp};
use crate::format::superblock::Geometry;
use crate::format::{mapping, xattr};
use crate::journal::change::{Change, Ineligible};
use crate::lock::Rank;
use std::sync::atomic::Ordering;

/// Logical blocks freed per transaction when a large file is truncated or
/// deleted (see `Fs::punch_in_chunks`).
pub(crate) const PUNCH_CHUNK_BLOCKS: u64 = 1024;

/// Inodes whose transaction ids are remembered for fsync before old
/// entries are dropped.
const MAX_TRACKED_INODES: usize = 1 << 16;

/// The kind of an inode, from the file-type bits of its mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FileKind {
    Regular,
    Directory,
    Symlink,
    CharDevice,
    BlockDevice,
    Fifo,
    Socket,
}

impl FileKind {
    pub fn from_mode(mode: u16) -> Option<FileKind> {
        Some(match mode & fmt::S_IFMT {
            fmt::S_IFREG => FileKind::Regular,
            fmt::S_IFDIR => FileKind::Directory,
            fmt::S_IFLNK => FileKind::Symlink,
            fmt::S_IFCHR => FileKind::CharDevice,
            fmt::S_IFBLK => FileKind::BlockDevice,
            fmt::S_IFIFO => FileKind::Fifo,
            fmt::S_IFSOCK => FileKind::Socket,
            _ => return None,
        })
    }
}

/// Attributes as `stat` reports them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attr {
    pub ino: u32,
    pub kind: FileKind,
    /// Permission bits including setuid, setgid and sticky.
    pub perm: u16,
    pub nlink: u32,
    pub uid: u32,
    pub gid: u32,
    pub size: u64,
    /// Allocated space in 512-byte units.
    pub blocks: u64,
    pub atime: Timestamp,
    pub mtime: Timestamp,
    pub ctime: Timestamp,
    pub crtime: Timestamp,
    pub rdev: u32,
    pub blksize: u32,
    pub generation: u32,
    pub flags: u32,
}

/// A timestamp to set: the current time or a given one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TimeSet {
    Now,
    At(Timestamp),
}

/// The changes of one `setattr` call; `None` leaves a field as it is.
#[derive(Debug, Clone, Default)]
pub struct SetAttr {
    /// Permission bits (the file type cannot change).
    pub mode: Option<u16>,
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    pub size: Option<u64>,
    pub atime: Option<TimeSet>,
    pub mtime: Option<TimeSet>,
    pub ctime: Option<Timestamp>,
}

pub(crate) fn now_seconds() -> i64 {
    Timestamp::now().sec
}

/// Read inode `ino` from its table block. An inode in a never-initialised
/// part of the table reads as all zeros (mode 0: not in use). Takes no
/// lock but the block's: the inode is decoded from one consistent copy of
/// its bytes, which writers encode whole under the block's lock.
pub(crate) fn read_inode(core: &Core, ino: u32) -> Result<Inode> {
    read_inode_with(&core.geo, &core.cache, &core.groups, ino)
}

/// `read_inode` from its parts, for callers without a mounted `Fs` (the
/// journal inode is read before the journal is set up).
pub(crate) fn read_inode_with(
    geo: &Geometry,
    cache: &BufferCache,
    groups: &Groups,
    ino: u32,
) -> Result<Inode> {
    if !geo.is_valid_ino(ino) {
        return Err(Error::corrupt(
            Location::Inode { ino },
            "inode number out of range",
        ));
    }
    let group = geo.group_of_inode(ino);
    let index = geo.inode_index_in_group(ino);
    if index >= groups.initialised_inodes(group) {
        return Ok(Inode::new(geo));
    }
    let (block, offset) = inode_location(geo, groups, ino);
    let buffer = cache.read(block)?;
    let bytes = buffer.read();
    Inode::decode(geo, ino, &bytes[offset..offset + geo.inode_size as usize])
}

pub(crate) fn inode_location(geo: &Geometry, groups: &Groups, ino: u32) -> (u64, usize) {
    let group = geo.group_of_inode(ino);
    let byte = geo.inode_index_in_group(ino) as u64 * geo.inode_size as u64;
    let block = groups.at(group).inode_table + byte / geo.block_size as u64;
    (block, (byte % geo.block_size as u64) as usize)
}

impl Tx<'_, '_> {
    pub fn read_inode(&self, ino: u32) -> Result<Inode> {
        read_inode(self.core, ino)
    }

    /// Read an inode that a directory entry or the caller says is in use.
    pub fn read_live_inode(&self, ino: u32) -> Result<Inode> {
        let inode = self.read_inode(ino)?;
        check_live(ino, &inode)?;
        Ok(inode)
    }

    /// Write an inode back; fdatasync of it will wait for this transaction.
    pub fn write_inode(&mut self, ino: u32, inode: &Inode) -> Result<()> {
        self.store_inode(ino, inode, false)
    }

    /// Write an inode whose only changes are timestamps: fsync waits for
    /// this transaction, fdatasync does not (the kernel's I_DIRTY_SYNC
    /// without I_DIRTY_DATASYNC).
    pub fn write_inode_timestamps(&mut self, ino: u32, inode: &Inode) -> Result<()> {
        self.store_inode(ino, inode, true)
    }

    fn store_inode(&mut self, ino: u32, inode: &Inode, timestamps_only: bool) -> Result<()> {
        let geo = &self.core.geo;
        let (block, offset) = inode_location(geo, &self.core.groups, ino);
        let buffer = self.core.cache.read(block)?;
        {
            let mut bytes = self.handle.get_write_access(&buffer)?;
            let slot = &mut bytes[offset..offset + geo.inode_size as usize];
            if self.core.orphans.on_list(ino) {
                // The orphan list's link is the orphan code's (orphan.rs).
                let mut kept = inode.clone();
                kept.dtime = Inode::stored_dtime(slot);
                kept.encode(geo, ino, slot);
            } else {
                inode.encode(geo, ino, slot);
            }
        }
        self.note_tid(ino, timestamps_only);
        self.handle.note(Change::Inode { ino });
        Ok(())
    }

    /// Remember which transaction holds the inode's latest change (fsync).
    fn note_tid(&self, ino: u32, timestamps_only: bool) {
        let tid = self.handle.tid();
        let mut tids = self.core.inode_tids.lock();
        if tids.len() >= MAX_TRACKED_INODES {
            // Entries of transactions before the committing one (tid - 1)
            // are durable: fsync of those inodes needs no commit.
            let committing = tid.wrapping_sub(1);
            tids.retain(|_, entry| entry.sync == tid || entry.sync == committing);
        }
        let entry = tids.entry(ino).or_default();
        entry.sync = tid;
        if !timestamps_only {
            entry.datasync = tid;
        }
    }

    pub fn next_generation(&self) -> u32 {
        let step = |generation: u32| generation.wrapping_mul(1_103_515_245).wrapping_add(12_345);
        let previous = self
            .core
            .next_generation
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |g| Some(step(g)))
            .unwrap_or_else(|g| g);
        step(previous)
    }

    /// Free everything an unlinked, unopened inode holds, then the inode.
    /// A large mapping is freed in chunks, one transaction each, after the
    /// current operation (`Fs::finish_deferred_evictions`); meanwhile the
    /// inode sits on the orphan list, so a crash midway is finished by the
    /// next mount.
    pub fn evict_inode(&mut self, ino: u32, mut inode: Inode) -> Result<()> {
        debug_assert_eq!(inode.links_count, 0);
        let block_sectors = (self.core.geo.block_size / 512) as u64;
        if inode.has_data_blocks(&self.core.geo)
            && inode.blocks / block_sectors > PUNCH_CHUNK_BLOCKS
        {
            self.orphan_add(ino, &mut inode)?;
            self.write_inode(ino, &inode)?;
            self.deferred_evictions.push(ino);
            return Ok(());
        }
        self.evict_inode_now(ino, inode)
    }

    /// Free the inode and all it holds in this transaction.
    pub fn evict_inode_now(&mut self, ino: u32, mut inode: Inode) -> Result<()> {
        self.orphan_remove(ino, &mut inode)?;
        if inode.has_data_blocks(&self.core.geo) {
            self.release_all_blocks(ino, &mut inode)?;
        }
        if inode.file_acl != 0 {
            let mut ctx = self.meta_ctx();
            xattr::release_block(&mut ctx, ino, &mut inode)?;
        }
        let is_dir = inode.is_dir();
        inode.dtime = now_seconds() as u32;
        inode.size = 0;
        self.write_inode(ino, &inode)?;
        self.release_inode(ino, is_dir)
    }

    /// Free every block `inode` maps. A directory's blocks are metadata:
    /// read and changed through the cache (and journaled), so they are
    /// freed as metadata, which forgets them there. Freed as data, a copy
    /// still dirty from the entries just removed would later be written
    /// over whatever the blocks hold next (file data bypasses the cache).
    /// The kernel frees directory blocks with EXT4_FREE_BLOCKS_METADATA |
    /// EXT4_FREE_BLOCKS_FORGET for the same reason.
    pub fn release_all_blocks(&mut self, ino: u32, inode: &mut Inode) -> Result<()> {
        self.punch_mapping(ino, inode, 0, None)
    }

    /// `mapping::punch` of logical blocks `from..to` (to the end: `None`),
    /// a directory's blocks freed as metadata (see `release_all_blocks`).
    pub fn punch_mapping(
        &mut self,
        ino: u32,
        inode: &mut Inode,
        from: u64,
        to: Option<u64>,
    ) -> Result<()> {
        let core = self.core;
        let handle = self.handle;
        if inode.is_dir() {
            let mut ctx = crate::format::MetaCtx {
                geo: &core.geo,
                cache: &core.cache,
                handle,
                alloc: &mut FreeAsMetadata(self),
            };
            return mapping::punch(&mut ctx, ino, inode, from, to);
        }
        let mut ctx = self.meta_ctx();
        mapping::punch(&mut ctx, ino, inode, from, to)
    }

    pub fn meta_ctx(&mut self) -> crate::format::MetaCtx<'_, '_> {
        let core = self.core;
        let handle = self.handle;
        crate::format::MetaCtx {
            geo: &core.geo,
            cache: &core.cache,
            handle,
            alloc: self,
        }
    }
}

/// An inode reached through a name must be in use.
pub(crate) fn check_live(ino: u32, inode: &Inode) -> Result<()> {
    if inode.mode == 0 || FileKind::from_mode(inode.mode).is_none() {
        return Err(Error::corrupt(
            Location::Inode { ino },
            format!(
                "directory entry points to an unused inode (mode {:o})",
                inode.mode
            ),
        ));
    }
    Ok(())
}

pub(crate) fn attr_of(core: &Core, ino: u32, inode: &Inode) -> Result<Attr> {
    let kind = FileKind::from_mode(inode.mode).ok_or_else(|| {
        Error::corrupt(
            Location::Inode { ino },
            format!("bad file type in mode {:o}", inode.mode),
        )
    })?;
    let rdev = match kind {
        FileKind::CharDevice | FileKind::BlockDevice => inode.device_number(),
        _ => 0,
    };
    Ok(Attr {
        ino,
        kind,
        perm: inode.mode & 0o7777,
        nlink: inode.links_count as u32,
        uid: inode.uid,
        gid: inode.gid,
        size: inode.size,
        blocks: inode.blocks,
        atime: inode.atime,
        mtime: inode.mtime,
        ctime: inode.ctime,
        crtime: inode.crtime,
        rdev,
        blksize: core.geo.block_size,
        generation: inode.generation,
        flags: inode.flags,
    })
}

impl Fs {
    /// Attributes of inode `ino` (getattr).
    /// Takes no lock: the inode is decoded from one consistent copy.
    pub fn getattr(&self, ino: u32) -> Result<Attr> {
        let result = read_inode(&self.core, ino).and_then(|inode| {
            if inode.mode == 0 {
                return Err(Error::Stale);
            }
            attr_of(&self.core, ino, &inode)
        });
        self.note_error(result)
    }

    /// Change attributes (chmod, chown, truncate, utimes).
    pub fn setattr(&self, ino: u32, changes: &SetAttr, caller: Caller) -> Result<Attr> {
        if let Some(size) = changes.size {
            self.truncate(ino, size, caller)?;
        }
        self.transact(2 + crate::format::xattr::SET_CREDITS, caller, |tx| {
            let _inode = tx.lock_write(ino, Rank::Inode);
            let mut inode = tx.read_live_inode(ino)?;
            self.check_not_freed(ino, &inode)?;
            if inode.is_dir() {
                // Fast commits record a directory's inode only with its
                // creation (as the kernel's): its own attributes need a
                // full commit.
                tx.handle
                    .note(Change::Ineligible(Ineligible::DirAttributes));
            }
            let now = Timestamp::now();
            let mut changed = false;
            if let Some(mode) = changes.mode {
                inode.mode = (inode.mode & fmt::S_IFMT) | (mode & 0o7777);
                changed = true;
                if inode.file_acl != 0 || !inode.inline_xattr_area().is_empty() {
                    let mut ctx = tx.meta_ctx();
                    super::xattr::chmod_access_acl(&mut ctx, ino, &mut inode)?;
                }
            }
            if let Some(uid) = changes.uid {
                inode.uid = uid;
                changed = true;
            }
            if let Some(gid) = changes.gid {
                inode.gid = gid;
                changed = true;
            }
            if changes.uid.is_some() || changes.gid.is_some() {
                // chown clears setuid, and setgid when group-executable
                // (the kernel's should_remove_suid), unless the caller set
                // the mode in the same call.
                if changes.mode.is_none() && inode.file_type() != fmt::S_IFDIR {
                    inode.mode &= !0o4000;
                    if inode.mode & 0o0010 != 0 {
                        inode.mode &= !0o2000;
                    }
                }
            }
            if let Some(time) = changes.atime {
                inode.atime = resolve(time, now);
                changed = true;
            }
            if let Some(time) = changes.mtime {
                inode.mtime = resolve(time, now);
                changed = true;
            }
            if let Some(ctime) = changes.ctime {
                inode.ctime = ctime;
            } else if changed || changes.size.is_some() {
                inode.ctime = now;
            }
            tx.write_inode(ino, &inode)?;
            attr_of(tx.core, ino, &inode)
        })
    }
}

fn resolve(time: TimeSet, now: Timestamp) -> Timestamp {
    match time {
        TimeSet::Now => now,
        TimeSet::At(at) => at,
    }
}

/// The allocator a directory's punch sees: every block it frees is freed
/// as metadata (see `Tx::release_all_blocks`).
struct FreeAsMetadata<'t, 'a, 'j>(&'t mut Tx<'a, 'j>);

impl crate::format::BlockAllocator for FreeAsMetadata<'_, '_, '_> {
    fn alloc_blocks(
        &mut self,
        _handle: &crate::journal::Handle<'_>,
        goal: u64,
        count: u32,
    ) -> Result<(u64, u32)> {
        self.0.alloc_data_blocks(goal, count)
    }

    fn free_blocks(
        &mut self,
        _handle: &crate::journal::Handle<'_>,
        start: u64,
        count: u64,
        _metadata: bool,
    ) -> Result<()> {
        self.0.release_blocks(start, count, true)
    }
}
