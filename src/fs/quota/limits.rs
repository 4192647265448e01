//! Quota limits, enforced as the kernel enforces them (fs/quota/dquot.c:
//! `check_bdq`, `check_idq`, `ignore_hardlimit`):
//! - A change may take an id's usage up to its hard limit, not past it
//!   (EDQUOT), and up to its soft limit once the grace time that began
//!   when the usage first went past it has run out.
//! - Going past a soft limit starts the grace time (`dqb_btime`,
//!   `dqb_itime` = now + the file's grace); coming back within it ends it.
//! - A caller with CAP_SYS_RESOURCE is bound by no limit.
//!
//! Space is granted where the space budget is charged (`budget.rs`): an
//! operation names the ids the blocks it charges count against (its
//! subject: the file a write, truncate or fallocate changes, the inode an
//! xattr is set on), and each charge is granted within their limits
//! first, before anything changes — so EDQUOT, like ENOSPC, never leaves
//! an operation half done. A run of data blocks is cut to what the limits
//! leave, as the kernel's `ext4_mb_new_blocks` shortens its request: a
//! write past a limit is a short write, then EDQUOT. Creates, links and
//! renames are granted their new inode and directory growth whole, before
//! the inode is allocated (`namei.rs`); a change of owner, group or
//! project moves the inode's usage only if the new ids can take it
//! (`dquot_transfer`).
//!
//! What running operations were granted and have not yet added to the
//! quota files (at the end of each, `Tx::apply_quota`) is held in memory
//! by id and counted with the usage, as the kernel's `dqb_rsvspace`: two
//! writers of one user cannot pass a limit together. Whether an id has
//! limits at all is remembered (a bounded map), so that ids without any —
//! nearly all — cost a map lookup per charge.
//!
//! Delayed allocation holds no data for an id with limits (its writes
//! allocate at once and meet the limit exactly); data held before a
//! limit was set is written out whatever the limits, as the kernel's
//! claimed reservations are.

use super::{Charge, FileState, QuotaFile, ReadBlocks, Usage, usage_of};
use crate::engine::fs::{Core, Tx};
use crate::error::{Error, Result};
use crate::format::inode::{Inode, Timestamp};
use crate::format::quota::{self, Dquot};
use parking_lot::MutexGuard;

/// Ids whose having limits or not is remembered per quota file: a bound,
/// whatever the number of ids.
const LIMITED_KEPT_MAX: usize = 4096;

/// What running operations were granted for one id and have not applied.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(super) struct Held {
    bytes: u64,
    inodes: u64,
}

/// Seconds since the epoch, as quota times are kept.
pub(super) fn now_secs() -> u64 {
    Timestamp::now().sec.max(0) as u64
}

/// Does `dquot` set any limit?
fn has_limits(dquot: &Dquot) -> bool {
    dquot.space_hard | dquot.space_soft | dquot.inode_hard | dquot.inode_soft != 0
}

/// How many more bytes and inodes the limits of `dquot` leave, with `held`
/// granted to running operations, at time `now`.
fn room(dquot: &Dquot, held: Held, now: u64) -> (u64, u64) {
    let bound = |used: u64, hard: u64, soft: u64, deadline: u64| {
        let mut room = u64::MAX;
        if hard > 0 {
            room = room.min(hard.saturating_sub(used));
        }
        // check_bdq: past the soft limit only while the grace time runs.
        if soft > 0 && deadline != 0 && now >= deadline {
            room = room.min(soft.saturating_sub(used));
        }
        room
    };
    let space = bound(
        dquot.space.saturating_add(held.bytes),
        dquot.space_hard.saturating_mul(1024),
        dquot.space_soft.saturating_mul(1024),
        dquot.block_time,
    );
    let inodes = bound(
        dquot.inodes.saturating_add(held.inodes),
        dquot.inode_hard,
        dquot.inode_soft,
        dquot.inode_time,
    );
    (space, inodes)
}

/// A soft limit's grace deadline after a change of usage or limits: none
/// within the limit, the running one kept, or one starting now past it.
pub(super) fn grace_deadline(over: bool, running: u64, now: u64, grace: u32) -> u64 {
    match (over, running) {
        (false, _) => 0,
        (true, 0) => now + grace as u64,
        (true, running) => running,
    }
}

/// Start or end `dquot`'s grace times for its usage now (the kernel sets
/// them as usage passes the soft limits, and clears them as it comes back).
pub(super) fn update_grace(dquot: &mut Dquot, info: &quota::Info, now: u64) {
    let over_space = dquot.space_soft > 0 && dquot.space > dquot.space_soft.saturating_mul(1024);
    dquot.block_time = grace_deadline(over_space, dquot.block_time, now, info.block_grace);
    let over_inodes = dquot.inode_soft > 0 && dquot.inodes > dquot.inode_soft;
    dquot.inode_time = grace_deadline(over_inodes, dquot.inode_time, now, info.inode_grace);
}

/// `id`'s entry in `file` if it sets limits (None: no entry, or no limit),
/// read through the cache under the file's lock.
fn limited_entry(
    core: &Core,
    file: &QuotaFile,
    state: &mut FileState,
    id: u32,
) -> Result<Option<Dquot>> {
    if !file.limits_enforced || state.limited.get(&id) == Some(&false) {
        return Ok(None);
    }
    let inode = crate::engine::fs::inode::read_inode(core, file.ino)?;
    let mut blocks = ReadBlocks {
        core,
        ino: file.ino,
        inode,
    };
    let info = match state.info {
        Some(info) => info,
        None => {
            let info = quota::read_info(&mut blocks, file.qtype)?;
            state.info = Some(info);
            info
        }
    };
    let offset = match state.offsets.get(&id) {
        Some(&offset) => Some(offset),
        None => {
            let found = quota::find(&mut blocks, &info, id)?;
            if let Some(offset) = found {
                state.remember_offset(id, offset);
            }
            found
        }
    };
    let dquot = match offset {
        Some(offset) => Some(quota::read_entry(&mut blocks, offset)?),
        None => None,
    };
    let limited = dquot.as_ref().is_some_and(has_limits);
    if state.limited.len() >= LIMITED_KEPT_MAX {
        state.limited.clear();
    }
    state.limited.insert(id, limited);
    Ok(dquot.filter(|_| limited))
}

/// What a grant asks for: `fixed` bytes, and up to `flexible` more units
/// of `unit` bytes (at least `at_least` of them), and `inodes` inodes.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Ask {
    pub fixed: u64,
    pub unit: u64,
    pub flexible: u64,
    pub at_least: u64,
    pub inodes: u64,
}

impl Ask {
    /// Exactly `bytes` and `inodes`.
    pub fn exact(bytes: u64, inodes: u64) -> Ask {
        Ask {
            fixed: bytes,
            unit: 0,
            flexible: 0,
            at_least: 0,
            inodes,
        }
    }
}

impl Tx<'_, '_> {
    /// The ids inode `ino` (`inode`) is charged to, if it counts.
    pub(in crate::engine::fs) fn quota_ids(&self, ino: u32, inode: &Inode) -> Option<[u32; 3]> {
        match self.core.quotas.enabled() {
            true => usage_of(self.core, ino, inode).map(|usage: Usage| usage.ids),
            false => None,
        }
    }

    /// Run `body` with the blocks it charges counted against `subject`
    /// (`quota_ids` of the inode it changes), as the kernel charges a
    /// file's blocks to its owner, group and project.
    pub(in crate::engine::fs) fn with_quota_subject<R>(
        &mut self,
        subject: Option<[u32; 3]>,
        body: impl FnOnce(&mut Self) -> R,
    ) -> R {
        let outer = std::mem::replace(&mut self.quota.subject, subject);
        let result = body(self);
        self.quota.subject = outer;
        result
    }

    /// The ids the blocks charged now count against, if any.
    pub(in crate::engine::fs) fn quota_subject(&self) -> Option<[u32; 3]> {
        match self.core.quotas.limits_enforced() && !self.unmetered {
            true => self.quota.subject,
            false => None,
        }
    }

    /// Grant `ask` to ids `ids` within their limits; returns how many of
    /// its flexible units were granted (all when no limit binds). EDQUOT,
    /// with nothing granted, when the fixed bytes, the inodes or
    /// `at_least` units do not fit and the caller is bound by limits.
    /// A type whose id is None is not asked.
    pub(in crate::engine::fs) fn grant_quota(
        &mut self,
        ids: [Option<u32>; 3],
        ask: Ask,
    ) -> Result<u64> {
        let core = self.core;
        if !core.quotas.limits_enforced() || self.unmetered || self.quota.exempt == Some(true) {
            return Ok(ask.flexible);
        }
        let now = now_secs();
        loop {
            // Every file's lock at once, in their order, so that what is
            // checked is what is held.
            let mut states: Vec<MutexGuard<'_, FileState>> = core
                .quotas
                .files
                .iter()
                .map(|file| file.state.lock())
                .collect();
            let mut units = ask.flexible;
            let mut fits = true;
            for (file, state) in core.quotas.files.iter().zip(states.iter_mut()) {
                let Some(id) = ids[file.qtype as usize] else {
                    continue;
                };
                let Some(dquot) = limited_entry(core, file, state, id)? else {
                    continue;
                };
                let held = state.held.get(&id).copied().unwrap_or_default();
                let (space, inodes) = room(&dquot, held, now);
                if ask.fixed > space || ask.inodes > inodes {
                    fits = false;
                    break;
                }
                if let Some(fit) = (space - ask.fixed).checked_div(ask.unit) {
                    units = units.min(fit);
                }
            }
            fits &= units >= ask.at_least;
            if !fits || units < ask.flexible {
                if self.quota.exempt.is_none() {
                    // Asked only now that a limit binds: /proc, unlocked.
                    drop(states);
                    self.quota.exempt = Some(self.caller.capable_sys_resource());
                    continue;
                }
                if self.quota.exempt == Some(true) {
                    return Ok(ask.flexible);
                }
                if !fits {
                    return Err(Error::QuotaExceeded);
                }
            }
            let bytes = ask.fixed + units * ask.unit;
            if bytes == 0 && ask.inodes == 0 {
                return Ok(units);
            }
            for (file, state) in core.quotas.files.iter().zip(states.iter_mut()) {
                let Some(id) = ids[file.qtype as usize] else {
                    continue;
                };
                let held = state.held.entry(id).or_default();
                held.bytes += bytes;
                held.inodes += ask.inodes;
                let grants = &mut self.quota.held;
                match grants
                    .iter_mut()
                    .find(|grant| grant.qtype == file.qtype && grant.id == id)
                {
                    Some(grant) => {
                        grant.space += bytes as i64;
                        grant.inodes += ask.inodes as i64;
                    }
                    None => grants.push(Charge {
                        qtype: file.qtype,
                        id,
                        space: bytes as i64,
                        inodes: ask.inodes as i64,
                    }),
                }
            }
            return Ok(units);
        }
    }

    /// Grant `blocks` more blocks to this operation's subject, if it has
    /// one (`Tx::charge`).
    pub(in crate::engine::fs) fn grant_subject_blocks(&mut self, blocks: u64) -> Result<()> {
        match self.quota_subject() {
            Some(ids) if blocks > 0 => {
                // Charges count clusters (blocks without bigalloc), as
                // the kernel charges EXT4_C2B of them.
                let bytes = blocks * self.core.geo.cluster_bytes();
                self.grant_quota(ids.map(Some), Ask::exact(bytes, 0))
                    .map(|_| ())
            }
            _ => Ok(()),
        }
    }

    /// Grant `fixed` blocks and up to `flexible` more (at least `at_least`)
    /// to this operation's subject; returns how many of `flexible`.
    pub(in crate::engine::fs) fn grant_subject_run(
        &mut self,
        fixed: u64,
        flexible: u64,
        at_least: u64,
    ) -> Result<u64> {
        let Some(ids) = self.quota_subject() else {
            return Ok(flexible);
        };
        let unit = self.core.geo.cluster_bytes();
        let ask = Ask {
            fixed: fixed * unit,
            unit,
            flexible,
            at_least,
            inodes: 0,
        };
        self.grant_quota(ids.map(Some), ask)
    }

    /// Does any of `ids` have limits? (Delayed allocation holds no data
    /// for such ids.)
    pub(in crate::engine::fs) fn quota_limits_any(&self, ids: [u32; 3]) -> Result<bool> {
        let core = self.core;
        for file in &core.quotas.files {
            let mut state = file.state.lock();
            if limited_entry(core, file, &mut state, ids[file.qtype as usize])?.is_some() {
                return Ok(true);
            }
        }
        Ok(false)
    }

    /// The grants of this operation go back (its charges are in the quota
    /// files now, or it charged nothing).
    pub(super) fn release_quota_grants(&mut self) {
        for grant in std::mem::take(&mut self.quota.held) {
            let Some(file) = self.core.quotas.file(grant.qtype) else {
                continue;
            };
            let mut state = file.state.lock();
            let Some(held) = state.held.get_mut(&grant.id) else {
                debug_assert!(false, "a grant of id {} was lost", grant.id);
                continue;
            };
            debug_assert!(held.bytes >= grant.space as u64 && held.inodes >= grant.inodes as u64);
            held.bytes = held.bytes.saturating_sub(grant.space as u64);
            held.inodes = held.inodes.saturating_sub(grant.inodes as u64);
            if *held == Held::default() {
                state.held.remove(&grant.id);
            }
        }
    }

    /// dquot_transfer: inode `ino` (now `inode`) goes to ids `new`: each
    /// id it changes to must take its space and its inode within limits.
    pub(in crate::engine::fs) fn grant_transfer(
        &mut self,
        ino: u32,
        inode: &Inode,
        new: [u32; 3],
    ) -> Result<()> {
        let Some(usage) = usage_of(self.core, ino, inode) else {
            return Ok(());
        };
        let mut changed = [None; 3];
        for (slot, (&old, &id)) in changed.iter_mut().zip(usage.ids.iter().zip(new.iter())) {
            if old != id {
                *slot = Some(id);
            }
        }
        if changed == [None; 3] {
            return Ok(());
        }
        let bytes = usage.bytes.max(0) as u64;
        self.grant_quota(changed, Ask::exact(bytes, 1)).map(|_| ())
    }
}

impl crate::engine::fs::Fs {
    /// ext4_statfs_project: the figures of `stat` cut to the limits of the
    /// project of inode `ino`, when it is a +P inode and project limits
    /// are enforced (the smaller non-zero of each soft and hard limit; the
    /// usage, what is granted included, taken off it).
    pub(in crate::engine::fs) fn limit_statfs_to_project(
        &self,
        ino: u32,
        stat: &mut crate::engine::fs::StatFs,
    ) -> Result<()> {
        let core = &self.core;
        let Some(file) = core.quotas.file(quota::QuotaType::Project) else {
            return Ok(());
        };
        if !file.limits_enforced {
            return Ok(());
        }
        let inode = crate::engine::fs::inode::read_inode(core, ino)?;
        if !inode.has_flag(crate::format::inode::flags::PROJINHERIT) {
            return Ok(());
        }
        let mut state = file.state.lock();
        let Some(dquot) = limited_entry(core, file, &mut state, inode.projid)? else {
            return Ok(());
        };
        let held = state.held.get(&inode.projid).copied().unwrap_or_default();
        let min_not_zero = |a: u64, b: u64| match (a, b) {
            (0, b) => b,
            (a, 0) => a,
            (a, b) => a.min(b),
        };
        let block_size = core.geo.block_size as u64;
        let blocks =
            min_not_zero(dquot.space_soft, dquot.space_hard).saturating_mul(1024) / block_size;
        if blocks > 0 {
            let used = dquot.space.saturating_add(held.bytes) / block_size;
            let remaining = blocks.saturating_sub(used);
            stat.blocks = stat.blocks.min(blocks);
            stat.free_blocks = stat.free_blocks.min(remaining);
            stat.available_blocks = stat.available_blocks.min(remaining);
        }
        let inodes = min_not_zero(dquot.inode_soft, dquot.inode_hard);
        if inodes > 0 {
            let remaining = inodes.saturating_sub(dquot.inodes.saturating_add(held.inodes));
            stat.files = stat.files.min(inodes);
            stat.free_files = stat.free_files.min(remaining);
        }
        Ok(())
    }
}
