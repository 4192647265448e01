//! Extended attribute operations: the engine side of getxattr, listxattr,
//! setxattr and removexattr. The formats (in-inode area, xattr block,
//! ACL encoding) are in `format::xattr`.

use super::acl::{self, ACL_ACCESS};
use super::inode::{check_live, read_inode};
use super::quota::Ask;
use super::{Caller, Fs, Scope};
use crate::error::{Error, Location, Result};
use crate::format::inode::{self as fmt, Inode, Timestamp, flags};
use crate::format::mapping::{self, Lookup};
use crate::format::superblock::{compat, incompat};
use crate::format::xattr::{self, Located, SetMode};
use crate::journal::change::{Change, Ineligible};
use crate::lock::Rank;

/// An xattr change: the format layer's own blocks, the inode's and, for
/// the first attribute of the filesystem, the superblock's.
const CREDITS_XATTR: u32 = xattr::SET_CREDITS + 2;
const XATTR_SIZE_MAX: usize = 65536;
/// EA inodes the cache of `EaInodeCache` remembers (the kernel's mbcache
/// grows with memory and shrinks under pressure; a bound keeps this one
/// within `cache_size`'s spirit: 16 bytes an entry).
const EA_INODE_CACHE_ENTRIES: usize = 4096;

/// EA inodes by the hash of their value, as the kernel's `ea_inode_cache`
/// (an mbcache) keeps them: where a large value being set may already be
/// stored, so that equal values share one EA inode. Filled as EA inodes
/// are made and read, emptied of each as it is freed; a hint only, every
/// candidate is checked under its lock before it is shared. The oldest
/// entry goes first past `EA_INODE_CACHE_ENTRIES` (a leaf lock).
#[derive(Default)]
pub(crate) struct EaInodeCache {
    entries: parking_lot::Mutex<EaEntries>,
}

#[derive(Default)]
struct EaEntries {
    by_hash: std::collections::HashMap<u32, Vec<u32>>,
    /// (hash, ino) in the order they came.
    order: std::collections::VecDeque<(u32, u32)>,
}

impl EaInodeCache {
    fn insert(&self, hash: u32, ino: u32) {
        let mut entries = self.entries.lock();
        let inos = entries.by_hash.entry(hash).or_default();
        if inos.contains(&ino) {
            return;
        }
        inos.push(ino);
        entries.order.push_back((hash, ino));
        while entries.order.len() > EA_INODE_CACHE_ENTRIES {
            let Some((old_hash, old_ino)) = entries.order.pop_front() else {
                break;
            };
            entries.forget(old_hash, old_ino);
        }
        debug_assert!(entries.order.len() <= EA_INODE_CACHE_ENTRIES);
    }

    fn remove(&self, hash: u32, ino: u32) {
        let mut entries = self.entries.lock();
        if entries.forget(hash, ino) {
            entries.order.retain(|&entry| entry != (hash, ino));
        }
    }

    fn candidates(&self, hash: u32) -> Vec<u32> {
        self.entries
            .lock()
            .by_hash
            .get(&hash)
            .cloned()
            .unwrap_or_default()
    }
}

impl EaEntries {
    /// Drop `ino` from `hash`'s list; whether it was there.
    fn forget(&mut self, hash: u32, ino: u32) -> bool {
        let Some(inos) = self.by_hash.get_mut(&hash) else {
            return false;
        };
        let before = inos.len();
        inos.retain(|&other| other != ino);
        let found = inos.len() < before;
        if inos.is_empty() {
            self.by_hash.remove(&hash);
        }
        found
    }
}

impl Fs {
    // No `ext_attr` feature (old ext2 images, the Hurd's) is not "no
    // xattrs allowed": like the kernel, reading finds none (ENODATA, an
    // empty list — the answer FUSE's ACL check needs to fall back to the
    // mode bits) and the first set turns the feature on.
    pub fn getxattr(&self, ino: u32, name: &[u8]) -> Result<Vec<u8>> {
        let _inode = self.core.inodes.read(ino, Rank::Inode);
        let result = read_inode(&self.core, ino).and_then(|inode| {
            check_live(ino, &inode)?;
            match xattr::locate(&self.core.geo, &self.core.cache, ino, &inode, name)? {
                Some(Located::Value(value)) => Ok(value),
                Some(Located::InInode(value)) => self.read_ea_inode(ino, &inode, &value),
                None => Err(Error::NoAttribute),
            }
        });
        self.note_error(result)
    }

    /// A value kept in an EA inode (ea_inode), read under the EA inode's
    /// lock and checked as the kernel checks it.
    fn read_ea_inode(&self, owner: u32, inode: &Inode, value: &xattr::EaValue) -> Result<Vec<u8>> {
        check_ea_ino(&self.core.geo, owner, value.ino)?;
        let _ea = self.core.inodes.read(value.ino, Rank::EaInode);
        let ea_inode = read_inode(&self.core, value.ino)?;
        let data = read_ea_value(&self.core, value.ino, &ea_inode, value.size as usize)?;
        let data = xattr::check_ea_inode_value(
            &self.core.geo,
            owner,
            inode.generation,
            value,
            &ea_inode,
            data,
        )?;
        // A value read may be shared by the next equal one set.
        self.core
            .ea_inodes
            .insert(ea_inode.atime.sec as u32, value.ino);
        Ok(data)
    }

    /// Names of all attributes, with their namespace prefixes.
    pub fn listxattr(&self, ino: u32) -> Result<Vec<Vec<u8>>> {
        let _inode = self.core.inodes.read(ino, Rank::Inode);
        let result = read_inode(&self.core, ino).and_then(|inode| {
            check_live(ino, &inode)?;
            xattr::list(&self.core.geo, &self.core.cache, ino, &inode)
        });
        self.note_error(result)
    }

    pub fn setxattr(
        &self,
        ino: u32,
        name: &[u8],
        value: &[u8],
        mode: SetMode,
        caller: Caller,
    ) -> Result<()> {
        if value.len() > XATTR_SIZE_MAX {
            return Err(Error::Range);
        }
        self.change_xattr(ino, name, Some(value), mode, caller)
    }

    pub fn removexattr(&self, ino: u32, name: &[u8], caller: Caller) -> Result<()> {
        self.change_xattr(ino, name, None, SetMode::Replace, caller)
    }

    fn change_xattr(
        &self,
        ino: u32,
        name: &[u8],
        value: Option<&[u8]>,
        mode: SetMode,
        caller: Caller,
    ) -> Result<()> {
        if name.len() > xattr::XATTR_NAME_MAX {
            return Err(Error::Range);
        }
        // With ea_inode a value may take a new EA inode's blocks, all
        // journaled, and free an old one's.
        let credits = match self.core.geo.has_incompat(incompat::EA_INODE) {
            true => CREDITS_XATTR + 2 * (XATTR_SIZE_MAX as u32 / self.core.geo.block_size) + 16,
            false => CREDITS_XATTR,
        };
        self.transact(Scope::File(ino), credits, caller, |tx| {
            let _inode = tx.lock_write(ino, Rank::Inode);
            let mut inode = tx.read_live_inode(ino)?;
            self.check_not_freed(ino, &inode)?;
            super::iflags::check_attributes_changeable(&inode)?;
            // Values kept in EA inodes count one inode each for the owner.
            let entries_before = tx.quota_ea_entries(ino, &inode)?;
            // A new xattr block counts against the inode's quota limits,
            // and so does the inode a large value takes: one more for the
            // owner, granted first as ext4_xattr_inode_alloc_quota does
            // (a smaller value that finds no room elsewhere is counted
            // without the check).
            let subject = tx.quota_ids(ino, &inode);
            if let (Some(ids), Some(value)) = (subject, value)
                && xattr::goes_to_ea_inode(&self.core.geo, value.len())
            {
                tx.grant_quota(ids.map(Some), Ask::exact(0, 1))?;
            }
            let result = tx.with_quota_subject(subject, |tx| {
                let mut ctx = tx.meta_ctx();
                if name == ACL_ACCESS {
                    acl::set_access(&mut ctx, ino, &mut inode, value, &caller)
                } else {
                    xattr::set(&mut ctx, ino, &mut inode, name, value, mode)
                }
            });
            if result.is_ok() {
                inode.ctime = Timestamp::now();
            }
            let entries_after = tx.quota_ea_entries(ino, &inode)?;
            tx.charge_ea_entry_change(ino, &inode, entries_after as i64 - entries_before as i64);
            // Written even on error: a block may have been allocated.
            tx.write_inode(ino, &inode)?;
            result?;
            if value.is_some() {
                announce_ext_attr(tx)?;
            }
            Ok(())
        })
    }
}

/// The kernel's iget of an EA inode refuses reserved and out-of-range
/// numbers (EXT4_IGET_EA_INODE).
fn check_ea_ino(geo: &crate::format::Geometry, owner: u32, ea: u32) -> Result<()> {
    if ea < geo.first_ino || !geo.is_valid_ino(ea) {
        return Err(Error::corrupt(
            Location::Inode { ino: owner },
            format!("xattr value in reserved or invalid inode {ea}"),
        ));
    }
    Ok(())
}

/// The first `size` bytes of EA inode `ino`, read through the metadata
/// cache: the kernel reads and writes an EA inode's blocks as metadata
/// (`ext4_xattr_inode_read` and `_write`, journaled), and so does jext4,
/// so the newest copy of a block may be in the cache and the journal only.
fn read_ea_value(core: &super::Core, ino: u32, ea_inode: &Inode, size: usize) -> Result<Vec<u8>> {
    let geo = &core.geo;
    let block_size = geo.block_size as usize;
    let mut data = Vec::with_capacity(size);
    let mut lblk = 0u64;
    while data.len() < size {
        let extent = match mapping::lookup(geo, &core.cache, ino, ea_inode, lblk)? {
            Lookup::Mapped(extent) if !extent.unwritten => extent,
            _ => {
                return Err(Error::corrupt(
                    Location::Inode { ino },
                    format!("EA inode has a hole at block {lblk} of its value"),
                ));
            }
        };
        for physical in extent.physical..extent.physical + extent.len as u64 {
            if data.len() >= size {
                break;
            }
            let buffer = core.cache.read(physical)?;
            let bytes = buffer.read();
            let take = (size - data.len()).min(block_size);
            data.extend_from_slice(&bytes[..take]);
            lblk += 1;
        }
    }
    Ok(data)
}

/// An EA inode's reference count, as the kernel keeps it
/// (`ext4_xattr_inode_get_ref`): its high half in `i_ctime`'s seconds, its
/// low half in `i_version`'s low word.
fn ea_refs(ea_inode: &Inode) -> u64 {
    ((ea_inode.ctime.sec as u32 as u64) << 32) | (ea_inode.version & 0xffff_ffff)
}

fn set_ea_refs(ea_inode: &mut Inode, refs: u64) {
    ea_inode.ctime = Timestamp {
        sec: (refs >> 32) as i64,
        nsec: 0,
    };
    ea_inode.version = refs & 0xffff_ffff;
}

impl super::Tx<'_, '_> {
    /// `BlockAllocator::ea_inode_for`: an EA inode already holding `value`
    /// with one reference more, or a new one.
    pub(crate) fn ea_inode_for(
        &mut self,
        owner: u32,
        value: &[u8],
        hash: u32,
        also: u64,
    ) -> Result<u32> {
        if let Some(ino) = self.share_ea_inode(owner, value, hash, also)? {
            return Ok(ino);
        }
        let ino = self.create_ea_inode(owner, value, hash, also)?;
        self.core.ea_inodes.insert(hash, ino);
        Ok(ino)
    }

    /// An EA inode the cache names for `hash` whose value is `value`,
    /// checked under its lock as the kernel's `ext4_xattr_inode_cache_find`
    /// checks it (in use, flagged EA_INODE, referenced, the same hash and
    /// size, the same bytes), its count one higher; None when there is
    /// none. A candidate that fails a check is forgotten, or skipped when
    /// only its bytes differ (a hash collision). `also`, the xattr block
    /// the change may allocate after, is charged first.
    fn share_ea_inode(
        &mut self,
        owner: u32,
        value: &[u8],
        hash: u32,
        also: u64,
    ) -> Result<Option<u32>> {
        let core = self.core;
        for ino in core.ea_inodes.candidates(hash) {
            if ino == owner || check_ea_ino(&core.geo, owner, ino).is_err() {
                core.ea_inodes.remove(hash, ino);
                continue;
            }
            let _ea = self.lock_write(ino, Rank::EaInode);
            let usable = self.read_inode(ino).ok().filter(|ea_inode| {
                ea_inode.mode != 0
                    && ea_inode.links_count > 0
                    && ea_inode.has_flag(flags::EA_INODE)
                    && ea_refs(ea_inode) > 0
                    && ea_inode.atime.sec as u32 == hash
                    && ea_inode.size == value.len() as u64
            });
            let Some(mut ea_inode) = usable else {
                core.ea_inodes.remove(hash, ino);
                continue;
            };
            match read_ea_value(core, ino, &ea_inode, value.len()) {
                Ok(stored) if stored == value => {}
                _ => continue,
            }
            self.charge(also)?;
            let refs = match crate::faults::active(crate::faults::Fault::EaInodeShareUncounted) {
                true => ea_refs(&ea_inode),
                false => ea_refs(&ea_inode) + 1,
            };
            set_ea_refs(&mut ea_inode, refs);
            self.write_inode(ino, &ea_inode)?;
            return Ok(Some(ino));
        }
        Ok(None)
    }

    /// A new EA inode for `value` (`ea_inode_for`): a regular file, mode 0600, owned
    /// as `owner` is, flagged EA_INODE, one link, its reference count 1 and
    /// the value's hash in `i_atime` (`ext4_xattr_inode_create`); the value
    /// is written in blocks through the cache, journaled as the kernel's
    /// `ext4_xattr_inode_write` does.
    pub(crate) fn create_ea_inode(
        &mut self,
        owner: u32,
        value: &[u8],
        hash: u32,
        also: u64,
    ) -> Result<u32> {
        let core = self.core;
        let geo = &core.geo;
        let block_size = geo.block_size as usize;
        let owner_inode = self.read_inode(owner)?;
        let count = value.len().div_ceil(block_size) as u32;
        let extents = geo.has_incompat(incompat::EXTENTS);
        let mut inode = Inode::new(geo);
        mapping::init(&mut inode, extents);
        // The whole cost first, `also` included: nothing is allocated on a
        // full volume.
        let bound = count as u64 + mapping::append_cost_bound(&inode, count) + also;
        self.charge(bound)?;
        let ino = self.alloc_inode(owner, false)?;
        let _ea = self.lock_write(ino, Rank::EaInode);
        let now = Timestamp::now();
        inode.mode = fmt::S_IFREG | 0o600;
        inode.uid = owner_inode.uid;
        inode.gid = owner_inode.gid;
        inode.links_count = 1;
        inode.mtime = now;
        inode.crtime = now;
        inode.atime = Timestamp {
            sec: hash as i64,
            nsec: 0,
        };
        set_ea_refs(&mut inode, 1);
        inode.generation = self.next_generation();
        inode.flags |= flags::EA_INODE;
        inode.size = value.len() as u64;
        let goal = geo.group_first_block(geo.group_of_inode(ino));
        let mut lblk = 0u32;
        while lblk < count {
            let extent = {
                let mut ctx = self.meta_ctx();
                mapping::allocate(
                    &mut ctx,
                    ino,
                    &mut inode,
                    lblk as u64,
                    count - lblk,
                    goal,
                    false,
                )?
            };
            for physical in extent.physical..extent.physical + extent.len as u64 {
                let start = lblk as usize * block_size;
                let chunk = &value[start..(start + block_size).min(value.len())];
                let buffer = core.cache.get_for_overwrite(physical)?;
                {
                    let mut bytes = self.handle.get_create_access(&buffer)?;
                    bytes[..chunk.len()].copy_from_slice(chunk);
                    bytes[chunk.len()..].fill(0);
                }
                buffer.set_verified();
                lblk += 1;
            }
        }
        self.write_inode(ino, &inode)?;
        Ok(ino)
    }

    /// `BlockAllocator::change_ea_inode_refs`: `delta` (1 or -1) on EA
    /// inode `ino`'s reference count, under its lock; at 0 it loses its
    /// link and is freed, its blocks as metadata
    /// (`ext4_xattr_inode_update_ref`, then its eviction).
    pub(crate) fn change_ea_inode_refs(&mut self, owner: u32, ino: u32, delta: i32) -> Result<()> {
        check_ea_ino(&self.core.geo, owner, ino)?;
        // Freeing EA inodes is outside what the kernel's fast-commit
        // replay rebuilds.
        self.handle.note(Change::Ineligible(Ineligible::Xattr));
        let _ea = self.lock_write(ino, Rank::EaInode);
        let mut ea_inode = self.read_inode(ino)?;
        let location = Location::Inode { ino };
        if ea_inode.mode == 0 || !ea_inode.has_flag(flags::EA_INODE) {
            return Err(Error::corrupt(
                location,
                format!("the xattr EA inode {ino} of inode {owner} is not an EA inode in use"),
            ));
        }
        let refs = ea_refs(&ea_inode)
            .checked_add_signed(delta as i64)
            .ok_or_else(|| Error::corrupt(location, "EA inode reference count would go below 0"))?;
        let refs = if crate::faults::active(crate::faults::Fault::EaInodeRefKept) && delta < 0 {
            refs + 1
        } else {
            refs
        };
        set_ea_refs(&mut ea_inode, refs);
        if refs > 0 {
            // A count back from 0 (the kernel's orphaned, unfreed EA inode)
            // gets its link back.
            ea_inode.links_count = 1;
            return self.write_inode(ino, &ea_inode);
        }
        ea_inode.links_count = 0;
        self.core.ea_inodes.remove(ea_inode.atime.sec as u32, ino);
        self.write_inode(ino, &ea_inode)?;
        self.evict_inode(ino, ea_inode)
    }
}

/// Set `ext_attr` in the superblock, in the transaction that stores the
/// first attribute (the kernel's `ext4_xattr_update_super_block`), so that
/// e2fsck and older kernels know to look for them.
fn announce_ext_attr(tx: &super::Tx<'_, '_>) -> Result<()> {
    let mut sb = tx.core.sbi.lock();
    if sb.has_compat(compat::EXT_ATTR) {
        return Ok(());
    }
    sb.feature_compat |= compat::EXT_ATTR;
    tx.core.sbi.write(&sb, tx.handle)
}
