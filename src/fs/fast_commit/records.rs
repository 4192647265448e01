//! Applying each kind of fast-commit record (see the module above for what
//! each means and where this replay departs from the kernel's).

use super::Replayer;
use super::blocks::{inode_in_use, mark_inode_in_use};
use crate::error::{Error, Location, Result};
use crate::format::dir;
use crate::format::extent::{self, EXTENT_MAGIC};
use crate::format::fast_commit::Dentry;
use crate::format::get_u16;
use crate::format::inode::LINK_MAX;
use crate::format::inode::{self as fmt, I_BLOCK, I_BLOCK_SIZE, Inode};
use crate::format::mapping::{self, Extent, Lookup};
use crate::format::superblock::{Geometry, incompat};
use crate::format::xattr;
use crate::fs::dirops::{DirReader, DirWriter};

/// Names the kernel could have recorded but a directory cannot hold.
fn usable_name(name: &[u8]) -> bool {
    name != b"." && name != b".." && !name.contains(&b'/') && !name.contains(&0)
}

// INODE.
impl Replayer<'_, '_, '_> {
    pub(super) fn replay_inode(&mut self, ino: u32, raw: &[u8]) -> Result<bool> {
        let geo = self.geo();
        if ino < geo.first_ino || !geo.is_valid_ino(ino) {
            // The kernel fails its replay here too (ext4_mark_inode_used).
            return Err(Error::corrupt(
                Location::Inode { ino },
                "fast commit records a reserved or nonexistent inode",
            ));
        }
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
        // i_dtime of a live inode links the orphan list, which fast commits
        // do not carry: it stays as the filesystem has it.
        inode.dtime = current.map_or(0, |current| current.dtime);
        self.tx.write_inode(ino, &inode)?;
        self.modified.insert(ino);
        Ok(true)
    }

    /// Free an inode whose last name is gone, and everything it maps.
    fn evict(&mut self, ino: u32, mut inode: Inode) -> Result<()> {
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
    crate::ensure_format!(
        raw.len() >= I_BLOCK + I_BLOCK_SIZE && raw.len() <= geo.inode_size as usize,
        Location::Inode { ino },
        "fast-commit inode record of {} bytes",
        raw.len()
    );
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

    pub(super) fn replay_add_range(&mut self, ino: u32, extent: &Extent) -> Result<bool> {
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

    pub(super) fn replay_del_range(&mut self, ino: u32, lblk: u32, len: u32) -> Result<bool> {
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

    pub(super) fn replay_create(&mut self, dentry: &Dentry) -> Result<bool> {
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

    pub(super) fn replay_link(&mut self, dentry: &Dentry) -> Result<bool> {
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

    pub(super) fn replay_unlink(&mut self, dentry: &Dentry) -> Result<bool> {
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
            let reader = &mut DirReader::new(self.tx.core, ino, &inode);
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
