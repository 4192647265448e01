//! Quota usage (RO_COMPAT_QUOTA): the space and inodes each user, group
//! and project uses, kept in the quota files (`format::quota`) in the same
//! transaction as the change that uses them, so that no crash leaves the
//! counts and the blocks apart.
//!
//! The counts follow the inodes as they are written, which is what the
//! kernel charges and e2fsck recounts (e2fsck pass 1, quota_data_add):
//! every in-use inode but the reserved ones (the root excepted) and the
//! quota files themselves counts one inode, and its `i_blocks` in bytes,
//! for its owner, its group and its project.
//! - `Tx::store_inode` compares the inode with what the inode table held
//!   and charges the difference: blocks gained or lost, and on a change
//!   of owner, group or project everything moved from the old id to the
//!   new one. An inode this transaction allocated held nothing before:
//!   its first write charges it whole, with its inode.
//! - `Tx::release_inode` takes back what the freed inode still held.
//! - At the end of the operation (`Fs::transact`), before its handle
//!   stops, the charges of each id are added to its entry — made if it
//!   has none — in the quota file, whose blocks are journaled metadata.
//!
//! Limits are enforced in `limits.rs`. Entries whose usage drops to zero
//! stay (the kernel deletes those with no limits; e2fsck takes either).

mod limits;

pub(crate) use limits::Ask;

use super::{Caller, Core, Tx};
use crate::cache::Buffer;
use crate::error::{Error, Location, Result};
use crate::format::inode::{Inode, flags};
use crate::format::mapping::{self, Lookup};
use crate::format::quota::{self, Info, QUOTA_BLOCK, QuotaBlocks, QuotaType};
use crate::format::superblock::{Geometry, ROOT_INO};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::Arc;

/// Journal credits an operation's quota update may use: for each type,
/// two ids' entries, the tree path of one new id, the info block, and the
/// allocator's blocks for growing the file.
pub const QUOTA_CREDITS: u32 = 3 * (2 + quota::INSERT_BLOCKS_MAX + 1 + 3);

/// Entry offsets each quota file keeps in memory (ids seen lately): a
/// bound, whatever the number of ids.
const OFFSETS_KEPT_MAX: usize = 4096;

/// One type's quota file.
struct QuotaFile {
    qtype: QuotaType,
    ino: u32,
    /// Its limits are enforced (`limits.rs`), not only its usage kept.
    limits_enforced: bool,
    /// The file's info and where entries are, under one lock: a leaf
    /// lock but for the allocator's group locks a new block takes.
    state: Mutex<FileState>,
}

struct FileState {
    info: Option<Info>,
    offsets: HashMap<u32, u64>,
    /// What running operations were granted, by id (`limits.rs`).
    held: HashMap<u32, limits::Held>,
    /// Whether an id's entry sets limits, for ids seen lately (at most
    /// `limits::LIMITED_KEPT_MAX`).
    limited: HashMap<u32, bool>,
}

impl FileState {
    /// Remember that `id`'s entry is at `offset` (at most
    /// `OFFSETS_KEPT_MAX` ids).
    fn remember_offset(&mut self, id: u32, offset: u64) {
        if self.offsets.len() >= OFFSETS_KEPT_MAX {
            self.offsets.clear();
        }
        self.offsets.insert(id, offset);
    }
}

/// The quota files this filesystem keeps (none without the feature).
#[derive(Default)]
pub(crate) struct Quotas {
    files: Vec<QuotaFile>,
    /// Charges held back by the fault `QuotaChargedLate` (crash tests).
    carried: Mutex<Vec<Charge>>,
}

impl Quotas {
    /// The files `geo` names; `limits` says, by type, whether their
    /// limits are enforced (the mount's `usrquota`, `grpquota`,
    /// `prjquota`).
    ///
    /// prjquota on an image without project quotas is refused, as the
    /// kernel refuses it (EINVAL); usrquota and grpquota without quota
    /// files are the kernel's old-style quotas, which need quotactl: they
    /// enforce nothing, and the log says so.
    pub fn new(geo: &Geometry, limits: [bool; 3]) -> Result<Quotas> {
        if limits[QuotaType::Project as usize] && geo.quota_inums[QuotaType::Project as usize] == 0
        {
            return Err(Error::Invalid(
                "prjquota: the filesystem keeps no project quotas (mke2fs -O quota,project)".into(),
            ));
        }
        for qtype in [QuotaType::User, QuotaType::Group] {
            if limits[qtype as usize] && geo.quota_inums[qtype as usize] == 0 {
                tracing::warn!(
                    "{} quota limits asked for, but the filesystem keeps no {} quota file: none are enforced",
                    qtype.name(),
                    qtype.name()
                );
            }
        }
        let files = QuotaType::ALL
            .iter()
            .zip(geo.quota_inums)
            .filter(|(_, ino)| *ino != 0)
            .map(|(&qtype, ino)| QuotaFile {
                qtype,
                ino,
                limits_enforced: limits[qtype as usize],
                state: Mutex::new(FileState {
                    info: None,
                    offsets: HashMap::new(),
                    held: HashMap::new(),
                    limited: HashMap::new(),
                }),
            })
            .collect();
        Ok(Quotas {
            files,
            carried: Mutex::new(Vec::new()),
        })
    }

    /// Are the limits of any type enforced?
    pub fn limits_enforced(&self) -> bool {
        self.files.iter().any(|file| file.limits_enforced)
    }

    pub fn enabled(&self) -> bool {
        !self.files.is_empty()
    }

    fn is_quota_file(&self, ino: u32) -> bool {
        self.files.iter().any(|file| file.ino == ino)
    }
}

/// What one inode is charged for: its ids and its bytes, when it counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Usage {
    ids: [u32; 3],
    bytes: i64,
}

/// One id's charges within an operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Charge {
    qtype: QuotaType,
    id: u32,
    space: i64,
    inodes: i64,
}

/// The charges an operation gathers, and the inodes it allocated that have
/// not been written yet; what its limits granted it (`limits.rs`).
#[derive(Debug, Default)]
pub(crate) struct Pending {
    charges: Vec<Charge>,
    fresh: Vec<u32>,
    /// Grants held for this operation, by type and id.
    held: Vec<Charge>,
    /// The ids the blocks it charges count against, while it changes a
    /// file (`Tx::with_quota_subject`).
    subject: Option<[u32; 3]>,
    /// Whether the caller is bound by no limit, once asked.
    exempt: Option<bool>,
}

impl Pending {
    /// No charge left to apply and no grant left held (allocated inodes
    /// never written carry none).
    pub fn is_settled(&self) -> bool {
        self.charges.is_empty() && self.held.is_empty()
    }

    fn add(&mut self, qtype: QuotaType, id: u32, space: i64, inodes: i64) {
        if space == 0 && inodes == 0 {
            return;
        }
        match self
            .charges
            .iter_mut()
            .find(|charge| charge.qtype == qtype && charge.id == id)
        {
            Some(charge) => {
                charge.space += space;
                charge.inodes += inodes;
            }
            None => self.charges.push(Charge {
                qtype,
                id,
                space,
                inodes,
            }),
        }
    }

    /// `usage` counted (`sign` 1) or taken back (-1), with its inode.
    fn count(&mut self, quotas: &Quotas, usage: Usage, sign: i64) {
        for file in &quotas.files {
            let id = usage.ids[file.qtype as usize];
            self.add(file.qtype, id, sign * usage.bytes, sign);
        }
    }

    /// `inodes` more (or fewer) inodes for ids `ids`.
    fn count_inodes(&mut self, quotas: &Quotas, ids: [u32; 3], inodes: i64) {
        for file in &quotas.files {
            self.add(file.qtype, ids[file.qtype as usize], 0, inodes);
        }
    }
}

/// The usage of `inode` (number `ino`), or None when it counts for no one.
fn usage_of(core: &Core, ino: u32, inode: &Inode) -> Option<Usage> {
    let geo = &core.geo;
    let counted = (ino == ROOT_INO || ino >= geo.first_ino)
        && inode.mode != 0
        && !core.quotas.is_quota_file(ino)
        && ino != geo.orphan_file_inum
        && !inode.has_flag(flags::EA_INODE);
    counted.then(|| Usage {
        ids: [inode.uid, inode.gid, inode.projid],
        bytes: (inode.blocks * 512) as i64,
    })
}

impl Tx<'_, '_> {
    /// Charge the change of inode `ino` from what the table held (its
    /// slot at byte `offset` of `table`) to `new` (`store_inode`, before
    /// it writes).
    ///
    /// ea_inode: an inode whose ids change takes the values it keeps in
    /// EA inodes with it (one inode each, as `dquot_transfer` moves
    /// `ext4_get_inode_usage`).
    pub(super) fn charge_inode_write(
        &mut self,
        ino: u32,
        table: &Buffer,
        offset: usize,
        new: &Inode,
    ) -> Result<()> {
        let core = self.core;
        if !core.quotas.enabled() {
            return Ok(());
        }
        let fresh = match self.quota.fresh.iter().position(|&other| other == ino) {
            Some(at) => {
                self.quota.fresh.swap_remove(at);
                true
            }
            None => false,
        };
        let before = match fresh {
            true => None,
            false => {
                let size = core.geo.inode_size as usize;
                let old =
                    Inode::decode_unchecked(&core.geo, ino, &table.read()[offset..offset + size]);
                old.ok().and_then(|old| usage_of(core, ino, &old))
            }
        };
        let after = usage_of(core, ino, new);
        if before == after {
            return Ok(());
        }
        if let Some(before) = before {
            self.quota.count(&core.quotas, before, -1);
        }
        if let Some(after) = after {
            self.quota.count(&core.quotas, after, 1);
        }
        if let (Some(before), Some(after)) = (before, after)
            && before.ids != after.ids
        {
            let entries = self.quota_ea_entries(ino, new)? as i64;
            self.quota.count_inodes(&core.quotas, before.ids, -entries);
            self.quota.count_inodes(&core.quotas, after.ids, entries);
        }
        Ok(())
    }

    /// ea_inode: how many values inode `ino` keeps in EA inodes, each one
    /// inode more for its quota (0 without quota files or ea_inode).
    pub(in crate::engine::fs) fn quota_ea_entries(&self, ino: u32, inode: &Inode) -> Result<u64> {
        let core = self.core;
        if !core.quotas.enabled() {
            return Ok(0);
        }
        crate::format::xattr::ea_inode_entries(&core.geo, &core.cache, ino, inode)
    }

    /// ea_inode: inode `ino`'s values in EA inodes (`quota_ea_entries`)
    /// counted (`sign` 1) or taken back (-1), for its ids: an xattr change
    /// charges the difference, an eviction takes them back (the kernel's
    /// `ext4_xattr_inode_alloc_quota` and `_free_quota`).
    pub(in crate::engine::fs) fn charge_ea_entries(
        &mut self,
        ino: u32,
        inode: &Inode,
        sign: i64,
    ) -> Result<()> {
        let entries = self.quota_ea_entries(ino, inode)?;
        self.charge_ea_entry_change(ino, inode, sign * entries as i64);
        Ok(())
    }

    /// `delta` values more (or fewer) in EA inodes for inode `ino`'s ids.
    pub(in crate::engine::fs) fn charge_ea_entry_change(
        &mut self,
        ino: u32,
        inode: &Inode,
        delta: i64,
    ) {
        let core = self.core;
        if delta == 0 || crate::faults::active(crate::faults::Fault::EaInodeQuotaUncharged) {
            return;
        }
        if let Some(usage) = usage_of(core, ino, inode) {
            self.quota.count_inodes(&core.quotas, usage.ids, delta);
        }
    }

    /// A newly allocated inode: it held nothing before its first write.
    pub(super) fn note_inode_allocated(&mut self, ino: u32) {
        if self.core.quotas.enabled() {
            self.quota.fresh.push(ino);
        }
    }

    /// An inode about to be freed: what it still holds goes back.
    pub(super) fn charge_inode_release(&mut self, ino: u32) -> Result<()> {
        let core = self.core;
        if !core.quotas.enabled() {
            return Ok(());
        }
        if let Some(at) = self.quota.fresh.iter().position(|&other| other == ino) {
            // Never written: never charged.
            self.quota.fresh.swap_remove(at);
            return Ok(());
        }
        let inode = self.read_inode(ino)?;
        if let Some(usage) = usage_of(core, ino, &inode) {
            self.quota.count(&core.quotas, usage, -1);
        }
        Ok(())
    }

    /// Add this operation's charges to the quota files (`Fs::transact`,
    /// before the handle stops), then let its grants go.
    pub(in crate::engine::fs) fn apply_quota(&mut self) -> Result<()> {
        let applied = self.apply_charges();
        self.release_quota_grants();
        applied
    }

    fn apply_charges(&mut self) -> Result<()> {
        let core = self.core;
        if !core.quotas.enabled() || self.quota.charges.is_empty() {
            return Ok(());
        }
        let mut charges = std::mem::take(&mut self.quota.charges);
        if crate::faults::active(crate::faults::Fault::QuotaChargedLate) {
            // The fault: this operation's charges wait for the next one's
            // transaction, and that one's are written now.
            std::mem::swap(&mut charges, &mut core.quotas.carried.lock());
        }
        for file in &core.quotas.files {
            let mine: Vec<Charge> = charges
                .iter()
                .filter(|charge| {
                    charge.qtype == file.qtype && (charge.space, charge.inodes) != (0, 0)
                })
                .copied()
                .collect();
            if mine.is_empty() {
                continue;
            }
            self.apply_to(file, &mine)?;
        }
        Ok(())
    }

    fn apply_to(&mut self, file: &QuotaFile, charges: &[Charge]) -> Result<()> {
        let now = limits::now_secs();
        self.edit_quota_file(file, |editor| {
            for charge in charges {
                editor.change(charge.id, |dquot, info| {
                    dquot.space = add_signed(dquot.space, charge.space);
                    dquot.inodes = add_signed(dquot.inodes, charge.inodes);
                    limits::update_grace(dquot, info, now);
                })?;
            }
            Ok(())
        })
    }

    /// Run `edit` on quota file `file`, under its lock: with its info (read
    /// once a mount), and its entries found, or made, by id. The info goes
    /// back to the file if it changed, the quota inode if the file grew.
    fn edit_quota_file(
        &mut self,
        file: &QuotaFile,
        edit: impl FnOnce(&mut Editor<'_, '_, '_, '_>) -> Result<()>,
    ) -> Result<()> {
        let mut state = file.state.lock();
        let mut blocks = FileBlocks::open(self, file.ino)?;
        let info = match state.info {
            Some(info) => info,
            None => quota::read_info(&mut blocks, file.qtype)?,
        };
        let before = info;
        let mut editor = Editor {
            blocks,
            info,
            state: &mut state,
        };
        edit(&mut editor)?;
        let Editor {
            mut blocks, info, ..
        } = editor;
        if info != before {
            quota::write_info(&mut blocks, &info)?;
        }
        blocks.close()?;
        state.info = Some(info);
        Ok(())
    }
}

/// A quota file being changed (`Tx::edit_quota_file`).
struct Editor<'s, 't, 'a, 'j> {
    blocks: FileBlocks<'t, 'a, 'j>,
    info: Info,
    /// Where entries are, by id, and which set limits.
    state: &'s mut FileState,
}

impl Editor<'_, '_, '_, '_> {
    /// Change `id`'s entry (made if it has none) with `change`, which also
    /// sees the file's info.
    fn change(&mut self, id: u32, change: impl FnOnce(&mut quota::Dquot, &Info)) -> Result<()> {
        let offset = match self.state.offsets.get(&id) {
            Some(&offset) => offset,
            None => {
                let offset = match quota::find(&mut self.blocks, &self.info, id)? {
                    Some(offset) => offset,
                    None => quota::insert(&mut self.blocks, &mut self.info, id)?,
                };
                self.state.remember_offset(id, offset);
                offset
            }
        };
        let mut dquot = quota::read_entry(&mut self.blocks, offset)?;
        debug_assert_eq!(dquot.id, id);
        change(&mut dquot, &self.info);
        quota::write_entry(&mut self.blocks, offset, &dquot)
    }
}

/// `count + delta`, never below zero: a file that already disagreed with
/// the filesystem stays as close to it as it can.
fn add_signed(count: u64, delta: i64) -> u64 {
    if delta >= 0 {
        count.saturating_add(delta as u64)
    } else {
        count.saturating_sub(delta.unsigned_abs())
    }
}

/// A quota file's blocks through the transaction: read through the cache,
/// changed under the handle (quota files are journaled metadata, as the
/// kernel's ext4_quota_write makes them), grown block by block.
struct FileBlocks<'t, 'a, 'j> {
    tx: &'t mut Tx<'a, 'j>,
    ino: u32,
    inode: Inode,
    changed: bool,
}

impl<'t, 'a, 'j> FileBlocks<'t, 'a, 'j> {
    fn open(tx: &'t mut Tx<'a, 'j>, ino: u32) -> Result<Self> {
        let inode = tx.read_inode(ino)?;
        if !inode.is_reg() || inode.has_inline_data() {
            return Err(Error::corrupt(
                Location::Inode { ino },
                "quota file is not a regular file mapping blocks",
            ));
        }
        Ok(FileBlocks {
            tx,
            ino,
            inode,
            changed: false,
        })
    }

    /// Filesystem block `lblk` of the file, mapped (and zeroed) if it is
    /// a hole.
    fn buffer(&mut self, lblk: u64) -> Result<Arc<Buffer>> {
        let core = self.tx.core;
        match core.lookup(self.ino, &self.inode, lblk)? {
            Lookup::Mapped(extent) if !extent.unwritten => core.cache.read(extent.physical),
            Lookup::Mapped(_) => Err(Error::corrupt(
                Location::Inode { ino: self.ino },
                "quota file has an unwritten extent",
            )),
            Lookup::Hole { .. } => {
                let geo = &core.geo;
                let goal = geo.group_first_block(geo.group_of_inode(self.ino));
                // The file's blocks are the filesystem's own, as a
                // directory's are: the emergency reserve covers them.
                let reserve = std::mem::replace(&mut self.tx.draws_on_emergency_reserve, true);
                let extent = {
                    let mut ctx = self.tx.meta_ctx();
                    mapping::allocate(&mut ctx, self.ino, &mut self.inode, lblk, 1, goal, false)
                };
                self.tx.draws_on_emergency_reserve = reserve;
                let extent = extent?;
                self.changed = true;
                let buffer = core.cache.get_for_overwrite(extent.physical)?;
                self.tx.handle.get_create_access(&buffer)?.fill(0);
                buffer.set_verified();
                Ok(buffer)
            }
        }
    }

    /// Write the quota inode back if the file grew.
    fn close(self) -> Result<()> {
        if self.changed {
            self.tx.write_inode(self.ino, &self.inode)?;
        }
        Ok(())
    }
}

impl QuotaBlocks for FileBlocks<'_, '_, '_> {
    fn ino(&self) -> u32 {
        self.ino
    }

    fn read(&mut self, block: u32) -> Result<[u8; QUOTA_BLOCK]> {
        read_quota_block(self.tx.core, self.ino, &self.inode, block)
    }

    fn write(&mut self, block: u32, bytes: &[u8; QUOTA_BLOCK]) -> Result<()> {
        let (lblk, at) = place(&self.tx.core.geo, block);
        let buffer = self.buffer(lblk)?;
        self.tx.handle.get_write_access(&buffer)?[at..at + QUOTA_BLOCK].copy_from_slice(bytes);
        let end = (block as u64 + 1) * QUOTA_BLOCK as u64;
        if end > self.inode.size {
            self.inode.size = end;
            self.changed = true;
        }
        Ok(())
    }
}

/// Limits to set on one id (setquota's order; space in 1 KiB blocks, as
/// quotactl's Q_SETQUOTA takes it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct QuotaLimits {
    pub space_soft: u64,
    pub space_hard: u64,
    pub inode_soft: u64,
    pub inode_hard: u64,
}

/// One type's quota file as `jext4 quota report` shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QuotaReport {
    pub info: Info,
    /// Every entry, by id.
    pub entries: Vec<quota::Dquot>,
}

impl Quotas {
    fn file(&self, qtype: QuotaType) -> Option<&QuotaFile> {
        self.files.iter().find(|file| file.qtype == qtype)
    }
}

/// The filesystem block holding quota block `block`, and where in it.
fn place(geo: &Geometry, block: u32) -> (u64, usize) {
    let bytes = block as u64 * QUOTA_BLOCK as u64;
    let block_size = geo.block_size as u64;
    (bytes / block_size, (bytes % block_size) as usize)
}

/// Quota block `block` of quota file `ino`, read through the cache: zeros
/// past the file's end or in a hole.
fn read_quota_block(core: &Core, ino: u32, inode: &Inode, block: u32) -> Result<[u8; QUOTA_BLOCK]> {
    let mut bytes = [0u8; QUOTA_BLOCK];
    if (block as u64 + 1) * QUOTA_BLOCK as u64 > inode.size {
        return Ok(bytes);
    }
    let (lblk, at) = place(&core.geo, block);
    if let Lookup::Mapped(extent) = core.lookup(ino, inode, lblk)?
        && !extent.unwritten
    {
        let buffer = core.cache.read(extent.physical)?;
        bytes.copy_from_slice(&buffer.read()[at..at + QUOTA_BLOCK]);
    }
    Ok(bytes)
}

/// A quota file's blocks read through the cache, outside a transaction.
struct ReadBlocks<'c> {
    core: &'c Core,
    ino: u32,
    inode: Inode,
}

impl QuotaBlocks for ReadBlocks<'_> {
    fn ino(&self) -> u32 {
        self.ino
    }

    fn read(&mut self, block: u32) -> Result<[u8; QUOTA_BLOCK]> {
        read_quota_block(self.core, self.ino, &self.inode, block)
    }

    fn write(&mut self, _block: u32, _bytes: &[u8; QUOTA_BLOCK]) -> Result<()> {
        Err(Error::ReadOnly)
    }
}

impl super::Fs {
    /// `qtype`'s quota file: its info and every entry. `Error::NotSupported`
    /// when the filesystem keeps no such file (no quota feature, or no
    /// project quotas).
    pub fn quota_report(&self, qtype: QuotaType) -> Result<QuotaReport> {
        let core = &self.core;
        let file = core.quotas.file(qtype).ok_or(Error::NotSupported)?;
        // Under the file's lock: no operation's charges land meanwhile.
        let _state = file.state.lock();
        let inode = super::inode::read_inode(core, file.ino)?;
        let mut blocks = ReadBlocks {
            core,
            ino: file.ino,
            inode,
        };
        let info = quota::read_info(&mut blocks, qtype)?;
        let mut entries = quota::entries(&mut blocks, &info)?;
        entries.sort_by_key(|entry| entry.id);
        Ok(QuotaReport { info, entries })
    }

    /// Set `id`'s limits in `qtype`'s quota file, as Q_SETQUOTA does
    /// (dquot_set_dqblk): a grace period starts for a usage above a new
    /// soft limit, and ends for one within it.
    pub fn set_quota_limits(&self, qtype: QuotaType, id: u32, limits: QuotaLimits) -> Result<()> {
        if self.core.quotas.file(qtype).is_none() {
            return Err(Error::NotSupported);
        }
        self.transact(
            super::Scope::Housekeeping,
            QUOTA_CREDITS,
            Caller::ROOT,
            |tx| tx.set_limits(qtype, id, limits),
        )
    }

    /// Set `qtype`'s grace times, in seconds (`setquota -t`, Q_SETINFO):
    /// how long a usage may stay past a soft limit. Grace times running
    /// keep their deadlines, as the kernel's do.
    pub fn set_quota_grace(
        &self,
        qtype: QuotaType,
        block_grace: u32,
        inode_grace: u32,
    ) -> Result<()> {
        if self.core.quotas.file(qtype).is_none() {
            return Err(Error::NotSupported);
        }
        self.transact(
            super::Scope::Housekeeping,
            QUOTA_CREDITS,
            Caller::ROOT,
            |tx| tx.set_grace(qtype, block_grace, inode_grace),
        )
    }
}

impl Tx<'_, '_> {
    fn set_limits(&mut self, qtype: QuotaType, id: u32, limits: QuotaLimits) -> Result<()> {
        let file = self
            .core
            .quotas
            .file(qtype)
            .expect("checked by set_quota_limits");
        let now = limits::now_secs();
        self.edit_quota_file(file, |editor| {
            editor.state.limited.remove(&id);
            editor.change(id, |dquot, info| {
                dquot.space_soft = limits.space_soft;
                dquot.space_hard = limits.space_hard;
                dquot.inode_soft = limits.inode_soft;
                dquot.inode_hard = limits.inode_hard;
                // dquot_set_dqblk: a grace time starts afresh for a usage
                // past a soft limit just set, and none runs within one.
                dquot.block_time = 0;
                dquot.inode_time = 0;
                limits::update_grace(dquot, info, now);
            })
        })
    }

    fn set_grace(&mut self, qtype: QuotaType, block_grace: u32, inode_grace: u32) -> Result<()> {
        let file = self
            .core
            .quotas
            .file(qtype)
            .expect("checked by set_quota_grace");
        self.edit_quota_file(file, |editor| {
            editor.info.block_grace = block_grace;
            editor.info.inode_grace = inode_grace;
            Ok(())
        })
    }
}
