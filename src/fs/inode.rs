//! Inodes as the engine sees them: reading and writing them in the inode
//! table, their attributes, `setattr`, and freeing them when the last link
//! and the last open reference are gone.

use super::group::Groups;
use super::{Caller, Core, Fs, InodeTids, Scope, Tx};
use crate::cache::BufferCache;
use crate::error::{Error, Location, Result};
use crate::format::inode::{self as fmt, Inode, Timestamp};
use crate::format::superblock::{Geometry, ROOT_INO};
use crate::format::{mapping, xattr};
use crate::hash::NumberMap;
use crate::journal::change::{Change, Ineligible};
use crate::lock::Rank;
use std::sync::atomic::Ordering;

/// Logical blocks freed per transaction when a large file is truncated or
/// deleted (see `Fs::punch_in_chunks`).
pub(crate) const PUNCH_CHUNK_BLOCKS: u64 = 1024;

const S_ISUID: u16 = 0o4000;
const S_ISGID: u16 = 0o2000;
const S_IXGRP: u16 = 0o0010;

/// File capabilities (linux/xattr.h XATTR_NAME_CAPS): what the kernel
/// removes on a write, truncate or chown of the file.
const CAPABILITY_XATTR: &[u8] = b"security.capability";

/// The setuid and setgid bits a write or truncate (`chown` false) or a
/// chown by `caller` takes from `inode`, as the kernel decides them: setuid
/// always, setgid when group-executable or when the caller is neither in
/// the file's group nor CAP_FSETID (`setattr_should_drop_sgid`); after a
/// write or truncate, only from a regular file and only when the caller
/// lacks CAP_FSETID (`setattr_should_drop_suidgid`); after a chown, from
/// anything but a directory. `/proc` is read only when a bit is there to
/// lose.
pub(crate) fn setid_bits_to_drop(inode: &Inode, caller: &Caller, chown: bool) -> u16 {
    let mode = inode.mode;
    if mode & (S_ISUID | S_ISGID) == 0 || inode.is_dir() {
        return 0;
    }
    if !chown && (!inode.is_reg() || caller.capable_fsetid()) {
        return 0;
    }
    let mut drop = mode & S_ISUID;
    if mode & S_ISGID != 0 && (mode & S_IXGRP != 0 || !caller.in_group_or_capable(inode.gid)) {
        drop |= S_ISGID;
    }
    drop
}

/// Whether the inode has any extended attribute (in the inode or in a
/// block): only then can it carry file capabilities.
pub(crate) fn has_xattrs(inode: &Inode) -> bool {
    inode.file_acl != 0 || inode.inline_xattr_area().iter().any(|&byte| byte != 0)
}

/// Inodes whose transaction ids are remembered for fsync before old
/// entries are dropped.
const MAX_TRACKED_INODES: usize = 1 << 16;

/// The transactions holding each inode's latest changes, for fsync
/// (`Fs::fsync`). Entries of durable transactions are dropped once the map
/// reaches `prune_at`; entries of the running and the committing
/// transaction must stay, and when they alone fill the map the threshold
/// doubles, so that pruning stays amortised O(1) per change instead of a
/// scan of every entry at every change.
#[derive(Debug)]
pub(crate) struct InodeTidMap {
    tids: NumberMap<u32, InodeTids>,
    prune_at: usize,
}

impl Default for InodeTidMap {
    fn default() -> Self {
        InodeTidMap {
            tids: NumberMap::default(),
            prune_at: MAX_TRACKED_INODES,
        }
    }
}

impl InodeTidMap {
    pub(crate) fn get(&self, ino: u32) -> Option<InodeTids> {
        self.tids.get(&ino).copied()
    }

    /// Inode `ino` changed in transaction `tid` (its timestamps only, or
    /// more).
    fn note(&mut self, ino: u32, tid: u32, timestamps_only: bool) {
        if self.tids.len() >= self.prune_at {
            // Entries of transactions before the committing one (tid - 1)
            // are durable: fsync of those inodes needs no commit.
            let committing = tid.wrapping_sub(1);
            self.tids
                .retain(|_, entry| entry.sync == tid || entry.sync == committing);
            self.prune_at = (self.tids.len() * 2).max(MAX_TRACKED_INODES);
        }
        debug_assert!(self.tids.len() < self.prune_at);
        let entry = self.tids.entry(ino).or_default();
        entry.sync = tid;
        if !timestamps_only {
            entry.datasync = tid;
        }
    }
}

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
    Inode::decode_in_table(geo, ino, &buffer, &bytes, offset)
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
        // Quota usage follows what the table held and what it will.
        self.charge_inode_write(ino, &buffer, offset, inode)?;
        {
            let mut bytes = self.handle.get_write_access(&buffer)?;
            if self.core.orphans.on_list(ino) {
                // The orphan list's link is the orphan code's (orphan.rs).
                let mut kept = inode.clone();
                kept.dtime = Inode::stored_dtime(&bytes[offset..]);
                kept.encode_in_table(geo, ino, &buffer, &mut bytes, offset);
            } else {
                inode.encode_in_table(geo, ino, &buffer, &mut bytes, offset);
            }
        }
        self.note_tid(ino, timestamps_only);
        self.handle.note(Change::Inode { ino });
        if self.core.journals_data(ino, inode) {
            self.handle
                .note(Change::Ineligible(Ineligible::InodeJournalData));
        }
        Ok(())
    }

    /// Remember which transaction holds the inode's latest change (fsync).
    /// Unjournaled there is no transaction to remember: fsync writes
    /// everything back (and every change would carry tid 0, so no entry
    /// would ever be dropped).
    fn note_tid(&self, ino: u32, timestamps_only: bool) {
        if !self.core.journal.is_journaled() {
            return;
        }
        let tid = self.handle.tid();
        self.core.inode_tids.lock().note(ino, tid, timestamps_only);
    }

    /// Write whole blocks of file `ino`'s data at device byte `offset`:
    /// logged where the file journals its data (`journaled`,
    /// `data_journal.rs`), else in place (data blocks never enter the
    /// metadata cache then), remembered until durable so that the file's
    /// directory commit makes it so (`fast_commit`).
    pub fn write_file_blocks(
        &self,
        (ino, journaled): (u32, bool),
        offset: u64,
        data: &[u8],
    ) -> Result<()> {
        self.write_file_pieces((ino, journaled), offset, &[data])
    }

    /// `write_file_blocks` of `pieces` one after another from `offset`,
    /// as one device write where it can be.
    pub fn write_file_pieces(
        &self,
        (ino, journaled): (u32, bool),
        offset: u64,
        pieces: &[&[u8]],
    ) -> Result<()> {
        if journaled {
            return self.log_file_blocks(ino, offset, pieces);
        }
        let len: u64 = pieces.iter().map(|piece| piece.len() as u64).sum();
        if cfg!(debug_assertions) {
            // A cached copy is a logged one (only journaled writes make
            // copies of data blocks): its checkpoint would later write it
            // over these bytes.
            let block_size = self.core.geo.block_size as u64;
            for block in offset / block_size..(offset + len).div_ceil(block_size) {
                debug_assert!(
                    self.core.cache.peek(block).is_none(),
                    "inode {ino}: data written in place over block {block}, which the cache holds"
                );
            }
        }
        match pieces {
            [data] => self.core.dev().write_at(offset, data)?,
            _ => self.core.dev().write_pieces_at(offset, pieces)?,
        }
        self.wrote_data(ino, offset, len);
        Ok(())
    }

    /// Remember `len` bytes of `ino`'s data written at device byte
    /// `offset` until durable (`fast_commit`).
    fn wrote_data(&self, ino: u32, offset: u64, len: u64) {
        if let Some(tracker) = &self.core.fast_commit {
            tracker.wrote_data(self.handle.tid(), ino, offset, len);
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

    /// Without a journal, what an operation changed before it fails
    /// cannot be discarded (there is no transaction to abort): an unlink
    /// that removed the name, then met a group it may not free into, would
    /// leave an inode with no links and its blocks allocated. So, as ext2
    /// orders its steps, an operation that will evict `ino` now (`inode`,
    /// its last link about to go, not open) first checks, changing
    /// nothing, that all it will free can be freed: the inode's bit and
    /// the blocks it maps (a mapping small enough to be freed at once; a
    /// larger one is freed later, from the orphan list, which a failure
    /// leaves it on). With a journal the abort discards a half eviction and
    /// the check is not made.
    pub fn check_evictable(&mut self, ino: u32, inode: &Inode) -> Result<()> {
        let core = self.core;
        if core.journal.is_journaled() {
            return Ok(());
        }
        self.check_release_inode(ino)?;
        let block_sectors = (core.geo.block_size / 512) as u64;
        if !inode.has_data_blocks(&core.geo) || inode.blocks / block_sectors > PUNCH_CHUNK_BLOCKS {
            return Ok(());
        }
        let mut runs: Vec<(u64, u64)> = Vec::new();
        mapping::for_each_block(&core.geo, &core.cache, ino, inode, &mut |used| {
            match used {
                mapping::BlockUse::Data(extent) if extent.len > 0 => {
                    runs.push((extent.physical, extent.len as u64))
                }
                mapping::BlockUse::Data(_) => {}
                mapping::BlockUse::Meta(block) => runs.push((block, 1)),
            }
            Ok(())
        })?;
        for (start, count) in runs {
            self.check_release_blocks(start, count)?;
        }
        Ok(())
    }

    /// Free the inode and all it holds in this transaction.
    pub fn evict_inode_now(&mut self, ino: u32, mut inode: Inode) -> Result<()> {
        // The values its attributes keep in EA inodes stop counting for it.
        self.charge_ea_entries(ino, &inode, -1)?;
        self.orphan_remove(ino, &mut inode)?;
        if inode.has_data_blocks(&self.core.geo) {
            self.release_all_blocks(ino, &mut inode)?;
        }
        {
            let mut ctx = self.meta_ctx();
            xattr::release_body_ea_inodes(&mut ctx, ino, &inode)?;
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
        // fdatasync waits for it, whether or not i_blocks moved (with
        // bigalloc a cluster that keeps other blocks stays counted).
        self.mapping_changed = true;
        // An EA inode's blocks are metadata too (written through the
        // cache, journaled), as the kernel's are.
        // So are a journaled file's (`data_journal.rs`).
        if inode.is_dir()
            || inode.has_flag(crate::format::inode::flags::EA_INODE)
            || core.journals_data(ino, inode)
        {
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

    /// What a write, a truncate or a chown takes away, as the kernel's
    /// `file_remove_privs` and `notify_change` do (and as
    /// FUSE_HANDLE_KILLPRIV_V2 asks of the server): the mode bits `setid`
    /// (from `setid_bits_to_drop`) and, from a regular file, its
    /// capabilities (`security.capability`) always. Returns whether the
    /// inode changed; the caller writes it.
    pub fn kill_privileges(&mut self, ino: u32, inode: &mut Inode, setid: u16) -> Result<bool> {
        debug_assert_eq!(setid & !(S_ISUID | S_ISGID), 0, "only setuid and setgid");
        let mut changed = inode.mode & setid != 0;
        inode.mode &= !setid;
        if inode.is_reg()
            && has_xattrs(inode)
            && xattr::get(
                &self.core.geo,
                &self.core.cache,
                ino,
                inode,
                CAPABILITY_XATTR,
            )?
            .is_some()
        {
            let mut ctx = self.meta_ctx();
            xattr::set(
                &mut ctx,
                ino,
                inode,
                CAPABILITY_XATTR,
                None,
                xattr::SetMode::Replace,
            )?;
            changed = true;
        }
        debug_assert_eq!(inode.mode & setid, 0);
        Ok(changed)
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
    check_size(ino, inode)
}

/// An in-use inode's size must be a valid file offset (the kernel's
/// `__ext4_iget`: "bad i_size value", EFSCORRUPTED); above 2^63 no read
/// or stat could report it (FUSE's client answers EIO to such an
/// attribute without a word).
pub(crate) fn check_size(ino: u32, inode: &Inode) -> Result<()> {
    if inode.size > i64::MAX as u64 {
        return Err(Error::corrupt(
            Location::Inode { ino },
            format!("bad i_size value {:#x}", inode.size),
        ));
    }
    Ok(())
}

/// The attributes of `ino` for a caller that holds none of its locks,
/// once `check` accepts its inode. A file whose data delayed allocation
/// holds is read under its inode lock (shared): unlocked, the inode could
/// be read before a write-out stores its new size and the held data looked
/// up after the write-out dropped it — an old, shorter size, which a FUSE
/// kernel would cache.
pub(crate) fn attr_unlocked(
    core: &Core,
    ino: u32,
    check: impl FnOnce(&Inode) -> Result<()>,
) -> Result<Attr> {
    let _inode = core
        .delayed
        .holds(ino)
        .then(|| core.inodes.read(ino, Rank::Inode));
    let inode = read_inode(core, ino)?;
    check(&inode)?;
    attr_of(core, ino, &inode)
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
    // Data held by delayed allocation shows in the size and block count,
    // as the kernel's i_size and reserved delalloc blocks do.
    let (mut size, mut blocks) = (inode.size, inode.blocks);
    core.delayed.overlay(ino, &mut size, &mut blocks);
    if kind == FileKind::Symlink && inode.is_encrypted(&core.geo) {
        // fscrypt_symlink_getattr: the length of the target as shown.
        size = crate::format::fscrypt::symlink_size(size);
    }
    if kind == FileKind::Regular && inode.has_inline_data() {
        // ext4_file_getattr: a regular file with inline data reports the
        // sectors its bytes would take, so that tar and rsync do not
        // take it for sparse.
        blocks += size.div_ceil(512);
    }
    Ok(Attr {
        ino,
        kind,
        perm: inode.mode & 0o7777,
        nlink: inode.links_count as u32,
        uid: inode.uid,
        gid: inode.gid,
        size,
        blocks,
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
        let result = attr_unlocked(&self.core, ino, |inode| match inode.mode {
            0 => Err(Error::Stale),
            _ => check_size(ino, inode),
        });
        self.note_error(result)
    }

    /// The inode a file handle names by number (FUSE export support,
    /// NFS): its attributes while it exists — linked, or unlinked but
    /// still open — and `Stale` once it is gone. The generation in the
    /// attributes tells a reused number from the original.
    pub fn inode_by_number(&self, ino: u32) -> Result<Attr> {
        if !self.core.geo.is_valid_ino(ino) || ino < self.core.geo.first_ino && ino != ROOT_INO {
            return Err(Error::Stale);
        }
        let result = attr_unlocked(&self.core, ino, |inode| self.check_not_freed(ino, inode));
        self.note_error(result)
    }

    /// Change attributes (chmod, chown, truncate, utimes).
    pub fn setattr(&self, ino: u32, changes: &SetAttr, caller: Caller) -> Result<Attr> {
        if let Some(size) = changes.size {
            self.truncate(ino, size, caller)?;
        }
        self.transact(
            Scope::File(ino),
            2 + crate::format::xattr::SET_CREDITS,
            caller,
            |tx| {
                let _inode = tx.lock_write(ino, Rank::Inode);
                let mut inode = tx.read_live_inode(ino)?;
                self.check_not_freed(ino, &inode)?;
                // chattr +i and +a (notify_change): mode, owner and times
                // set explicitly are fixed; times set to now, only +i's.
                let explicit_time = |time: &Option<TimeSet>| matches!(time, Some(TimeSet::At(_)));
                if changes.mode.is_some()
                    || changes.uid.is_some()
                    || changes.gid.is_some()
                    || explicit_time(&changes.atime)
                    || explicit_time(&changes.mtime)
                {
                    super::iflags::check_attributes_changeable(&inode)?;
                }
                if changes.atime.is_some() || changes.mtime.is_some() || changes.ctime.is_some() {
                    super::iflags::check_writable(&inode)?;
                }
                if inode.is_dir() {
                    // Fast commits record a directory's inode only with its
                    // creation (as the kernel's): its own attributes need a
                    // full commit.
                    tx.handle
                        .note(Change::Ineligible(Ineligible::DirAttributes));
                }
                // dquot_transfer first: a new owner or group over its quota
                // limits refuses the whole change (EDQUOT).
                if changes.uid.is_some() || changes.gid.is_some() {
                    let uid = changes.uid.unwrap_or(inode.uid);
                    let gid = changes.gid.unwrap_or(inode.gid);
                    tx.grant_transfer(ino, &inode, [uid, gid, inode.projid])?;
                }
                let now = Timestamp::now();
                let mut changed = false;
                if let Some(mode) = changes.mode {
                    inode.mode = (inode.mode & fmt::S_IFMT) | (mode & 0o7777);
                    changed = true;
                    if inode.file_acl != 0 || !inode.inline_xattr_area().is_empty() {
                        let mut ctx = tx.meta_ctx();
                        super::acl::chmod(&mut ctx, ino, &mut inode)?;
                    }
                }
                let chown = changes.uid.is_some() || changes.gid.is_some();
                // chown takes setuid and setgid (decided against the old group),
                // a truncate too unless the caller holds CAP_FSETID; neither
                // when the caller sets the mode in the same call. Both drop
                // file capabilities.
                let setid = if changes.mode.is_none() && (chown || changes.size.is_some()) {
                    setid_bits_to_drop(&inode, &caller, chown)
                } else {
                    0
                };
                if let Some(uid) = changes.uid {
                    inode.uid = uid;
                    changed = true;
                }
                if let Some(gid) = changes.gid {
                    inode.gid = gid;
                    changed = true;
                }
                if chown || changes.size.is_some() {
                    changed |= tx.kill_privileges(ino, &mut inode, setid)?;
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
            },
        )
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
    fn charge(&mut self, blocks: u64) -> Result<()> {
        self.0.charge(blocks)
    }

    fn ea_inode_for(&mut self, owner: u32, value: &[u8], hash: u32, also: u64) -> Result<u32> {
        self.0.ea_inode_for(owner, value, hash, also)
    }

    fn change_ea_inode_refs(&mut self, owner: u32, ino: u32, delta: i32) -> Result<()> {
        self.0.change_ea_inode_refs(owner, ino, delta)
    }

    fn charge_run(&mut self, fixed: u64, flexible: u64) -> Result<u64> {
        self.0.charge_run(fixed, flexible)
    }

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn live_transactions_keep_their_entries_and_durable_ones_go() {
        let mut map = InodeTidMap::default();
        // More inodes than the first threshold, all changed in transactions
        // 7 and 8 (committing and running): every one must stay, or fsync
        // of it would skip the commit it needs.
        let live = (MAX_TRACKED_INODES + MAX_TRACKED_INODES / 2) as u32;
        let tid_of = |ino: u32| if ino < live / 3 { 7 } else { 8 };
        for ino in 0..live {
            map.note(ino, tid_of(ino), false);
        }
        for ino in 0..live {
            assert_eq!(map.get(ino).map(|tids| tids.sync), Some(tid_of(ino)));
        }
        assert!(map.prune_at > live as usize, "{}", map.prune_at);
        // Later transactions: 7 and 8 become durable and are dropped at the
        // next prune, the new changes stay.
        let mut ino = live;
        while map.get(0).is_some() {
            map.note(ino, 20, ino.is_multiple_of(3));
            ino += 1;
            assert!(ino < live * 4, "durable entries were never dropped");
        }
        let newest = map.get(ino - 1).unwrap();
        assert_eq!(newest.sync, 20);
        assert_eq!(
            newest.datasync,
            if (ino - 1).is_multiple_of(3) { 0 } else { 20 }
        );
        assert!(map.tids.len() < map.prune_at);
        // The threshold follows what stays, never below the floor.
        assert!(map.prune_at >= MAX_TRACKED_INODES);
    }
}
