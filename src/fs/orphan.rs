//! Orphans: inodes whose last link is gone while they are still open (or,
//! after a crash, that were being deleted). They are recorded on disk so
//! that whoever mounts next — jext4, the kernel or e2fsck — frees them.
//!
//! With the `orphan_file` feature the inode number goes into a free slot of
//! the orphan file (and `orphan_present` is set); otherwise, or when the
//! orphan file is full, into the classic list: `s_last_orphan` → inode →
//! `i_dtime` → next inode.
//!
//! Locks: the records change under `Orphans::records` [Orphan], taken
//! with the inode's own lock held (an operation orphans the inode it
//! changes). Taking another inode off the list rewrites its predecessor's
//! `i_dtime`, an inode this thread does not lock: so while an inode is on
//! the list its `i_dtime` belongs to this code alone — it patches the
//! stored field under the table block's lock, and `Tx::write_inode` keeps
//! the stored value instead of the caller's copy (`Orphans::on_list`), as
//! ext4 keeps the link in its in-memory inode (`NEXT_ORPHAN`).

use super::data_journal::punch_revoke_credits;
use super::inode::PUNCH_CHUNK_BLOCKS;
use super::{Caller, Fs, Scope, Tx};
use crate::error::{Error, Location, Result};
use crate::format::inode::Inode;
use crate::format::mapping::{self, Lookup};
use crate::format::orphan as fmt;
use crate::format::superblock::ro_compat;
use crate::hash::{NumberMap, NumberSet};
use crate::journal::change::{Change, Ineligible};
use crate::lock::{Mutex, MutexGuard, Rank};
use std::collections::HashSet;
use std::sync::atomic::{AtomicUsize, Ordering};

/// The inodes on the orphan records, as this mount knows them.
pub(crate) struct Orphans {
    /// [Orphan] Every inode on the records (list or file), so that
    /// recording and unrecording are idempotent when operations on one
    /// inode overlap; held while the records change. With each, the
    /// transaction that recorded it (0: found at mount).
    records: Mutex<NumberMap<u32, u32>>,
    /// The inodes on the classic list (a leaf lock; `listed` counts them,
    /// so that the common case of none costs one load).
    on_list: parking_lot::Mutex<NumberSet<u32>>,
    listed: AtomicUsize,
}

impl Orphans {
    pub fn new() -> Self {
        Orphans {
            records: Mutex::new(Rank::Orphan, NumberMap::default()),
            on_list: parking_lot::Mutex::new(NumberSet::default()),
            listed: AtomicUsize::new(0),
        }
    }

    pub fn lock(&self) -> MutexGuard<'_, NumberMap<u32, u32>> {
        self.records.lock()
    }

    /// `ino` is on the classic list: its stored `i_dtime` is the list's.
    pub fn on_list(&self, ino: u32) -> bool {
        self.listed.load(Ordering::Acquire) > 0 && self.on_list.lock().contains(&ino)
    }

    fn set_on_list(&self, ino: u32, listed: bool) {
        let mut on_list = self.on_list.lock();
        let changed = if listed {
            on_list.insert(ino)
        } else {
            on_list.remove(&ino)
        };
        if changed {
            self.listed.store(on_list.len(), Ordering::Release);
        }
    }
}

/// Upper bound on orphan-list walks: a corrupt list must end.
const MAX_ORPHAN_CHAIN: u32 = 1 << 20;

/// A list that comes back to an inode it passed: without this check a
/// cycle would be walked to the bound above, a million inode reads.
#[track_caller]
fn orphan_cycle(ino: u32) -> Error {
    Error::corrupt(
        Location::Inode { ino },
        "orphan list comes back to this inode (a cycle)",
    )
}

impl Tx<'_, '_> {
    /// Record `ino` as an orphan: its last link is gone while it is open,
    /// or a truncate or deletion is under way in several transactions.
    /// Recording an inode twice records it once. The caller holds `ino`'s
    /// lock.
    ///
    /// Fast commits stay eligible when the inode has no link left (a file
    /// unlinked while open, a large one being freed in chunks): no fast
    /// commit record describes the orphan records, but none needs to — the
    /// UNLINK record that took the last name makes every replay free the
    /// inode, as orphan cleanup would, and the inode gets no INODE record.
    /// An inode with links (a truncate in several transactions) would get
    /// one, whose `i_dtime` holds a list link: not eligible.
    ///
    /// An inode an earlier transaction recorded is on the records a full
    /// commit left: a change to it now (its last link going while a
    /// chunked truncate runs) must not be fast-committed, or a replay
    /// would free an inode those records still name.
    pub fn orphan_add(&mut self, ino: u32, inode: &mut Inode) -> Result<()> {
        let mut records = self.core.orphans.lock();
        if let Some(&recorded_in) = records.get(&ino) {
            if self.recorded_earlier(recorded_in) {
                self.handle.note(Change::Ineligible(Ineligible::Orphan));
            }
            return Ok(());
        }
        if inode.links_count > 0 {
            self.handle.note(Change::Ineligible(Ineligible::Orphan));
        }
        if !self.orphan_file_slot_add(ino)? {
            let mut sb = self.core.sbi.lock();
            let next = sb.last_orphan;
            self.set_orphan_link(ino, next)?;
            self.core.orphans.set_on_list(ino, true);
            inode.dtime = next;
            sb.last_orphan = ino;
            self.core.sbi.write(&sb, self.handle)?;
        }
        records.insert(ino, self.handle.tid());
        Ok(())
    }

    /// Take `ino` off whichever orphan record holds it (no-op if none).
    /// The caller holds `ino`'s lock.
    ///
    /// Fast commits stay eligible when the running transaction recorded it
    /// (and `orphan_add` kept them so): the records as the last full commit
    /// left them never held it. Otherwise they did, and a replay that
    /// freed or reused the inode before orphan cleanup walks that list
    /// would go wrong: not eligible.
    pub fn orphan_remove(&mut self, ino: u32, inode: &mut Inode) -> Result<()> {
        let mut records = self.core.orphans.lock();
        let Some(&recorded_in) = records.get(&ino) else {
            return Ok(());
        };
        if self.recorded_earlier(recorded_in) || inode.links_count > 0 {
            self.handle.note(Change::Ineligible(Ineligible::Orphan));
        }
        if !self.orphan_file_slot_remove(ino)? {
            self.orphan_list_remove(ino)?;
            inode.dtime = 0;
        }
        records.remove(&ino);
        Ok(())
    }

    /// Whether an orphan recorded by transaction `recorded_in` (0: found
    /// at mount) may be on the records the last full commit left: recorded
    /// by another transaction than this handle's, or unjournaled.
    fn recorded_earlier(&self, recorded_in: u32) -> bool {
        let tid = self.handle.tid();
        tid == 0 || recorded_in != tid
    }

    /// Unlink `ino` from the classic list (under the records' lock): its
    /// predecessor — the superblock or another inode — takes its link.
    fn orphan_list_remove(&mut self, ino: u32) -> Result<()> {
        let next = self.stored_dtime(ino)?;
        let mut sb = self.core.sbi.lock();
        let mut current = sb.last_orphan;
        if current == ino {
            sb.last_orphan = next;
            self.core.sbi.write(&sb, self.handle)?;
        } else {
            drop(sb);
            let mut visited = HashSet::new();
            let mut steps = 0;
            loop {
                if current == 0 {
                    break; // not on the list
                }
                if !visited.insert(current) || steps == MAX_ORPHAN_CHAIN {
                    return Err(orphan_cycle(current));
                }
                steps += 1;
                if !self.core.geo.is_valid_ino(current) {
                    return Err(Error::corrupt(
                        Location::Superblock,
                        "orphan list points outside the inode table",
                    ));
                }
                let link = self.stored_dtime(current)?;
                if link == ino {
                    self.set_orphan_link(current, next)?;
                    break;
                }
                current = link;
            }
        }
        self.set_orphan_link(ino, 0)?;
        self.core.orphans.set_on_list(ino, false);
        Ok(())
    }

    /// `i_dtime` as stored in the inode table.
    fn stored_dtime(&self, ino: u32) -> Result<u32> {
        let (block, offset) = super::inode::inode_location(&self.core.geo, &self.core.groups, ino);
        let buffer = self.core.cache.read(block)?;
        let bytes = buffer.read();
        Ok(Inode::stored_dtime(&bytes[offset..]))
    }

    /// Set the stored `i_dtime` of `ino` (a link of the list) to `link`,
    /// leaving the rest of the inode as stored.
    fn set_orphan_link(&mut self, ino: u32, link: u32) -> Result<()> {
        let geo = &self.core.geo;
        let (block, offset) = super::inode::inode_location(geo, &self.core.groups, ino);
        let buffer = self.core.cache.read(block)?;
        let mut bytes = self.handle.get_write_access(&buffer)?;
        let mut inode = Inode::decode_in_table(geo, ino, &buffer, &bytes, offset)?;
        inode.dtime = link;
        inode.encode_in_table(geo, ino, &buffer, &mut bytes, offset);
        Ok(())
    }

    /// Physical blocks of the orphan file, in order (empty if the feature
    /// is off).
    fn orphan_file_blocks(&self) -> Result<(Vec<u64>, Option<u32>)> {
        let ino = self.core.geo.orphan_file_inum;
        if ino == 0 {
            return Ok((Vec::new(), None));
        }
        let inode = self.read_live_inode(ino)?;
        let geo = &self.core.geo;
        let count = inode.size / geo.block_size as u64;
        if count > 1 << 16 {
            return Err(Error::corrupt(
                Location::Inode { ino },
                "orphan file is implausibly large",
            ));
        }
        let mut blocks = Vec::with_capacity(count as usize);
        for lblk in 0..count {
            match self.core.lookup(ino, &inode, lblk)? {
                Lookup::Mapped(extent) => blocks.push(extent.physical),
                Lookup::Hole { .. } => {
                    return Err(Error::corrupt(
                        Location::Inode { ino },
                        "orphan file has a hole",
                    ));
                }
            }
        }
        let seed = geo.metadata_csum.then(|| inode.csum_seed(geo, ino));
        Ok((blocks, seed))
    }

    fn orphan_file_slot_add(&mut self, ino: u32) -> Result<bool> {
        let (blocks, seed) = self.orphan_file_blocks()?;
        let slots = fmt::slots_per_block(self.core.geo.block_size as usize);
        for physical in blocks {
            let buffer = self.core.cache.read(physical)?;
            fmt::verify(&buffer.read(), physical, seed)?;
            let free = (0..slots).find(|&i| fmt::slot(&buffer.read(), i) == 0);
            if let Some(index) = free {
                let mut bytes = self.handle.get_write_access(&buffer)?;
                fmt::set_slot(&mut bytes, index, ino);
                fmt::set_tail(&mut bytes, physical, seed);
                drop(bytes);
                let mut sb = self.core.sbi.lock();
                if !sb.has_ro_compat(ro_compat::ORPHAN_PRESENT) {
                    sb.feature_ro_compat |= ro_compat::ORPHAN_PRESENT;
                    self.core.sbi.write(&sb, self.handle)?;
                }
                return Ok(true);
            }
        }
        Ok(false)
    }

    fn orphan_file_slot_remove(&mut self, ino: u32) -> Result<bool> {
        let (blocks, seed) = self.orphan_file_blocks()?;
        let slots = fmt::slots_per_block(self.core.geo.block_size as usize);
        for physical in blocks {
            let buffer = self.core.cache.read(physical)?;
            fmt::verify(&buffer.read(), physical, seed)?;
            let found = (0..slots).find(|&i| fmt::slot(&buffer.read(), i) == ino);
            if let Some(index) = found {
                let mut bytes = self.handle.get_write_access(&buffer)?;
                fmt::set_slot(&mut bytes, index, 0);
                fmt::set_tail(&mut bytes, physical, seed);
                return Ok(true);
            }
        }
        Ok(false)
    }

    /// Every inode number recorded in the orphan file.
    fn orphan_file_entries(&self) -> Result<Vec<u32>> {
        let (blocks, seed) = self.orphan_file_blocks()?;
        let slots = fmt::slots_per_block(self.core.geo.block_size as usize);
        let mut entries = Vec::new();
        for physical in blocks {
            let buffer = self.core.cache.read(physical)?;
            let bytes = buffer.read();
            fmt::verify(&bytes, physical, seed)?;
            entries.extend(
                (0..slots)
                    .map(|i| fmt::slot(&bytes, i))
                    .filter(|&ino| ino != 0),
            );
        }
        Ok(entries)
    }

    /// Finish what a crash interrupted for one orphan: delete it if it has
    /// no links, else cut its blocks beyond i_size (an interrupted
    /// truncate), and take it off the record.
    /// The inodes on the classic orphan list, in list order, but those in
    /// `in_file` (the orphan file holds them too); a list that loops is
    /// cut where it comes back (logged).
    fn classic_orphans(&mut self, in_file: &[u32]) -> Result<Vec<u32>> {
        let mut listed = Vec::new();
        let mut visited = HashSet::new();
        let mut ino = self.core.sbi.lock().last_orphan;
        while ino != 0 {
            if !visited.insert(ino) {
                tracing::warn!(
                    inode = ino,
                    "the orphan list comes back to an inode it passed; it ends there"
                );
                break;
            }
            if visited.len() as u32 > MAX_ORPHAN_CHAIN {
                return Err(Error::corrupt(
                    Location::Superblock,
                    "orphan list does not end",
                ));
            }
            if !in_file.contains(&ino) {
                listed.push(ino);
            }
            ino = self.read_inode(ino)?.dtime;
        }
        Ok(listed)
    }

    /// `resolve_orphan` for an inode the classic list held, once the list
    /// is off the superblock: its `i_dtime` was the list's link.
    fn resolve_listed_orphan(&mut self, ino: u32) -> Result<()> {
        self.check_orphan_number(ino)?;
        let mut inode = self.read_live_inode(ino)?;
        self.handle.note(Change::Ineligible(Ineligible::Orphan));
        if inode.links_count == 0 {
            return self.evict_inode(ino, inode);
        }
        inode.dtime = 0;
        self.truncate_orphan(ino, inode)
    }

    fn check_orphan_number(&self, ino: u32) -> Result<()> {
        let geo = &self.core.geo;
        if ino < geo.first_ino || !geo.is_valid_ino(ino) {
            return Err(Error::corrupt(
                Location::Inode { ino },
                "orphan record names a reserved inode",
            ));
        }
        Ok(())
    }

    /// A linked orphan: what lies past its size goes (an interrupted
    /// truncate or extension).
    fn truncate_orphan(&mut self, ino: u32, mut inode: Inode) -> Result<()> {
        if inode.has_data_blocks(&self.core.geo) {
            let first_unused = inode.size.div_ceil(self.core.geo.block_size as u64);
            self.punch_mapping(ino, &mut inode, first_unused, None)?;
        }
        self.write_inode(ino, &inode)
    }

    /// An inode the orphan file holds: freed or truncated, and taken off
    /// the file's slots.
    fn resolve_orphan(&mut self, ino: u32) -> Result<()> {
        self.check_orphan_number(ino)?;
        let mut inode = self.read_live_inode(ino)?;
        if inode.links_count == 0 {
            return self.evict_inode(ino, inode);
        }
        self.orphan_remove(ino, &mut inode)?;
        self.truncate_orphan(ino, inode)
    }
}

impl Fs {
    /// At mount: free the orphans a crash left behind (truncate the
    /// linked ones to their size, free the unlinked ones), as the kernel's
    /// `ext4_orphan_cleanup` does.
    ///
    /// The classic list comes off the superblock whole, in the one
    /// transaction that resolves every inode on it, so nothing is left
    /// naming them. A list that comes back to an inode it passed is cut
    /// there: the kernel's cleanup, which takes each inode off the list as
    /// it goes, ends such a list the same way.
    pub(crate) fn recover_orphans(&self) -> Result<()> {
        let resolved = self.transact_releasing(Scope::Housekeeping, 64, Caller::ROOT, |tx| {
            let in_file = tx.orphan_file_entries()?;
            let listed = tx.classic_orphans(&in_file)?;
            tx.core
                .orphans
                .lock()
                .extend(in_file.iter().map(|&ino| (ino, 0)));
            let mut sb = tx.core.sbi.lock();
            let present = sb.has_ro_compat(ro_compat::ORPHAN_PRESENT);
            if sb.last_orphan != 0 || present {
                sb.last_orphan = 0;
                sb.feature_ro_compat &= !ro_compat::ORPHAN_PRESENT;
                tx.core.sbi.write(&sb, tx.handle)?;
            }
            drop(sb);
            for &ino in &in_file {
                tx.resolve_orphan(ino)?;
            }
            for &ino in &listed {
                tx.resolve_listed_orphan(ino)?;
            }
            Ok(in_file.len() + listed.len())
        })?;
        if resolved > 0 {
            tracing::info!(
                count = resolved,
                "released orphan inodes left by an earlier mount"
            );
        }
        Ok(())
    }

    /// Called when an inode's last open reference goes: free it if it has
    /// no links left.
    pub(crate) fn evict_if_unlinked(&self, ino: u32) -> Result<()> {
        // Only an inode unlinked while open waits for its release; any other
        // inode without links was freed already (evicting it again would
        // free it twice).
        if !self.core.open_orphans.lock().remove(&ino) {
            return Ok(());
        }
        self.transact_releasing(Scope::File(ino), 16, Caller::ROOT, |tx| {
            let _inode = tx.lock_write(ino, Rank::Inode);
            let inode = tx.read_inode(ino)?;
            // A link cannot come back to an inode with none (link() refuses
            // it), but stay safe against a corrupt count.
            if inode.links_count > 0 || inode.mode == 0 {
                return Ok(());
            }
            // Opened again between the release that brought us here and
            // this lock (open_file admits an open orphan): that opener's
            // last release frees it.
            if self.is_open(ino) {
                self.core.open_orphans.lock().insert(ino);
                return Ok(());
            }
            tx.evict_inode(ino, inode)
        })
    }
}

impl Fs {
    /// Journal credits of one punch chunk: block bitmaps and descriptors of
    /// every group the chunk's blocks may lie in, the extent leaves holding
    /// the chunk's extents, the path above them, the inode, the superblock.
    pub(super) fn punch_chunk_credits(&self) -> u32 {
        let geo = &self.core.geo;
        let groups = (geo.group_count as u64).min(PUNCH_CHUNK_BLOCKS) as u32;
        let descriptor_blocks = groups.div_ceil(geo.descs_per_block);
        let leaf_entries = (geo.block_size - 12) / 12;
        let leaves = (PUNCH_CHUNK_BLOCKS as u32).div_ceil(leaf_entries) + 1;
        // Blocks freed as metadata (a directory's, an EA inode's, a
        // journaled file's) are revoked, a record each: their log blocks.
        groups + descriptor_blocks + leaves + 16 + punch_revoke_credits(geo)
    }

    /// Free every mapped block of `ino` at or after logical block `from`,
    /// `PUNCH_CHUNK_BLOCKS` at a time, one transaction each, skipping holes.
    /// The caller keeps the inode on the orphan records meanwhile.
    pub(crate) fn punch_in_chunks(&self, ino: u32, from: u64) -> Result<()> {
        let credits = self.punch_chunk_credits();
        let mut position = from;
        loop {
            let next = self.transact_releasing(Scope::File(ino), credits, Caller::ROOT, |tx| {
                let _inode = tx.lock_write(ino, Rank::Inode);
                let mut inode = tx.read_live_inode(ino)?;
                let geo = &tx.core.geo;
                if position >= mapping::max_blocks(geo, &inode) {
                    return Ok(None);
                }
                let start = match tx.core.lookup(ino, &inode, position)? {
                    Lookup::Mapped(_) => position,
                    Lookup::Hole { next: Some(next) } => next,
                    Lookup::Hole { next: None } => return Ok(None),
                };
                let end = start.saturating_add(PUNCH_CHUNK_BLOCKS);
                let result = tx.punch_mapping(ino, &mut inode, start, Some(end));
                tx.write_inode(ino, &inode)?;
                result.map(|()| Some(end))
            })?;
            match next {
                // Strictly increasing and bounded by max_blocks: ends.
                Some(end) => position = end,
                None => return Ok(()),
            }
        }
    }

    /// Free the large inodes whose eviction an operation deferred.
    pub(crate) fn finish_deferred_evictions(&self, inodes: Vec<u32>) -> Result<()> {
        for ino in inodes {
            self.punch_in_chunks(ino, 0)?;
            self.transact_releasing(Scope::File(ino), 16, Caller::ROOT, |tx| {
                let _inode = tx.lock_write(ino, Rank::Inode);
                let inode = tx.read_inode(ino)?;
                tx.evict_inode_now(ino, inode)
            })?;
        }
        Ok(())
    }
}
