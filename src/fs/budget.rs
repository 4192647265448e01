//! The space budget: Tux3's delta budget (DESIGN "Out-of-space
//! accounting"), so that an operation learns it cannot have its blocks
//! before it changes anything, and a full volume fails fast.
//!
//! Each transaction has a budget: the free blocks when it opened, which
//! include the blocks the transaction committing before it frees (they
//! become allocatable when that commit is durable, as `alloc.rs` waits
//! for), less the reserves this caller may not use. An operation charges
//! the worst case of what it may allocate (`MetaCtx::charge`: the format
//! layer knows the costs) against the transaction's balance with one
//! atomic add; when that takes the balance below zero it backs the charge
//! out with another and fails with `Shortfall`. A shortfall that blocks
//! freed in the running transaction could cover (they count from its
//! commit on) makes `Fs::transact` commit and try again; any other is
//! ENOSPC at once, with no commit and no wait.
//!
//! Blocks an operation charged and did not allocate go back when it ends
//! (`refund`), not only at the commit: an estimate that was not needed
//! (a merge, a leaf with room after all) leaves no hole in the budget, and
//! a transaction that allocated nothing — which never reaches lock-down —
//! holds nothing. At lock-down (`transition`, from the superblock's commit
//! hook: no handle of the old transaction is running and none of the new
//! one has started) the new transaction's budget is the free count, and
//! its charges start from zero.
//!
//! Operations that must not fail half-way (create, link, rename) charge
//! their whole cost first. Far from full they charge a bound worked out
//! from the inode alone (`charge_bounded`); only when the balance no
//! longer covers it do they work out the exact cost, which reads the
//! structures (a dry run of the directory insert).
//!
//! Unjournaled (and in the unmounted engine of recovery), freed blocks are
//! allocatable at once: they go straight into the budget, and there is no
//! transition.
//!
//! What the costs count: data blocks, extent-tree and block-map blocks,
//! directory blocks (htree splits), xattr blocks. Bitmaps, group
//! descriptors and inode tables live at fixed places, and the journal is
//! allocated when the filesystem is made: journal credits consume log
//! space (`journal/`), never filesystem blocks, so they cost nothing here.
//!
//! The emergency reserve (the kernel's `s_resv_clusters`) is part of the
//! budget: only operations that free space (`Tx::draws_on_emergency_reserve`)
//! may charge against it, so that `rm` works on a full volume.
//!
//! Delayed allocation (`delalloc.rs`) reserves blocks for data it holds
//! in memory: a reservation outlives transactions (it is not reset at
//! lock-down) and comes off every transaction's limit, until the data's
//! write-out claims it into the charge of the transaction that allocates
//! the blocks (`claim`: one move, which cannot fail) or the data is
//! discarded (`unreserve`).
//!
//! Locks: none; atomics only. `charged` may run ahead of the budget for
//! the instant between a charge and its back-out; every reader treats it
//! as a snapshot.

use super::Tx;
use crate::error::{Error, Result};
use std::sync::atomic::{AtomicU64, Ordering};

/// What `Fs::transact` waits for before it runs an operation that met
/// ENOSPC once more.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SpaceWait {
    /// The running transaction freed blocks a charge needs: its commit.
    Commit,
    /// A charge was covered, but the free blocks the allocator found were
    /// all freed by a commit that is not durable yet (or are being written
    /// home by a checkpoint): that commit.
    Durable,
}

/// How many times an operation runs again after a commit its ENOSPC
/// waited for: other threads may take the room meanwhile.
pub(crate) const SPACE_RETRIES: u32 = 4;

/// A charge the balance could not cover.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Shortfall {
    /// Committing the running transaction would make enough room: it
    /// freed blocks that count from its commit on.
    pub commit_helps: bool,
}

/// The reserves a charge must leave alone, by who asks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Withheld(pub u64);

pub(crate) struct Budget {
    /// Free blocks when the running transaction opened; unjournaled, also
    /// every block freed since.
    base: AtomicU64,
    /// Blocks charged in the running transaction: allocated, or held by
    /// operations still running.
    charged: AtomicU64,
    /// Blocks freed in the running transaction (journaled): not
    /// allocatable before its commit.
    freed: AtomicU64,
    /// Blocks reserved for delayed-allocation data held in memory, across
    /// transactions.
    reserved: AtomicU64,
    journaled: bool,
    /// Off (`JEXT4_SPACE_BUDGET=off`, for measuring its cost): nothing is
    /// charged, and an allocation only checks the free count against the
    /// reserves, as before the budget.
    enabled: bool,
    /// Blocks root's reservation keeps from other users (s_r_blocks_count).
    pub root_reserve: u64,
    /// Blocks only operations that free space may use.
    pub emergency_reserve: u64,
    charges: AtomicU64,
    backed_out: AtomicU64,
    forced_commits: AtomicU64,
    enospc: AtomicU64,
}

/// What `jext4 stats` shows of the budget.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BudgetStats {
    /// Charges are made (`JEXT4_SPACE_BUDGET=off` turns them off).
    pub enabled: bool,
    /// The running transaction's budget before reserves.
    pub budget: u64,
    /// What is left of it for an ordinary user (reserves withheld).
    pub balance: i64,
    pub charged: u64,
    pub freed_in_running: u64,
    /// Reserved for delayed-allocation data not yet written out.
    pub reserved_delayed: u64,
    /// Root's reserved blocks and the emergency reserve, which the
    /// balance leaves out.
    pub root_reserve: u64,
    pub emergency_reserve: u64,
    pub charges: u64,
    pub backed_out: u64,
    pub forced_commits: u64,
    pub enospc: u64,
}

impl Budget {
    pub fn new(free_blocks: u64, journaled: bool, root_reserve: u64, emergency: u64) -> Budget {
        Budget {
            base: AtomicU64::new(free_blocks),
            charged: AtomicU64::new(0),
            freed: AtomicU64::new(0),
            reserved: AtomicU64::new(0),
            journaled,
            enabled: true,
            root_reserve,
            emergency_reserve: emergency,
            charges: AtomicU64::new(0),
            backed_out: AtomicU64::new(0),
            forced_commits: AtomicU64::new(0),
            enospc: AtomicU64::new(0),
        }
    }

    /// The budget switched off: see `enabled`.
    pub fn disabled(self) -> Budget {
        Budget {
            enabled: false,
            ..self
        }
    }

    /// The reserves withheld from a caller: root's unless it may use
    /// them, the emergency reserve unless the operation frees space.
    pub fn withheld(&self, may_use_root_reserve: bool, releasing: bool) -> Withheld {
        let mut withheld = 0;
        if !may_use_root_reserve {
            withheld += self.root_reserve;
        }
        if !releasing {
            withheld += self.emergency_reserve;
        }
        Withheld(withheld)
    }

    /// Charge `blocks` to the running transaction: one atomic add, and one
    /// more to back it out when it takes the balance below zero.
    pub fn charge(&self, blocks: u64, withheld: Withheld) -> Result<(), Shortfall> {
        debug_assert!(blocks > 0);
        let limit = self.limit(withheld);
        let before = self.charged.fetch_add(blocks, Ordering::AcqRel);
        if before + blocks <= limit {
            self.charges.fetch_add(1, Ordering::Relaxed);
            return Ok(());
        }
        self.charged.fetch_sub(blocks, Ordering::AcqRel);
        self.backed_out.fetch_add(1, Ordering::Relaxed);
        Err(self.shortfall(blocks, withheld))
    }

    /// Charge `fixed` blocks and as many of `flexible` more, at least
    /// `at_least` of them, as the balance covers; returns how many of
    /// `flexible` were charged. A write that meets the wall writes what
    /// fits, as the kernel's does.
    pub fn charge_up_to(
        &self,
        fixed: u64,
        flexible: u64,
        at_least: u64,
        withheld: Withheld,
    ) -> Result<u64, Shortfall> {
        debug_assert!(at_least <= flexible);
        let least = fixed + at_least;
        // A few rounds: other operations move the balance between the
        // look and the charge.
        for _ in 0..4 {
            let room = self.balance(withheld).max(0) as u64;
            let granted = room.saturating_sub(fixed).min(flexible);
            if fixed + granted < least || fixed + granted == 0 {
                break;
            }
            if self.charge(fixed + granted, withheld).is_ok() {
                return Ok(granted);
            }
        }
        if least == 0 {
            return Ok(0);
        }
        self.charge(least, withheld).map(|()| at_least)
    }

    /// What is left for a caller with `withheld` reserves.
    pub fn balance(&self, withheld: Withheld) -> i64 {
        let limit = self.base.load(Ordering::Acquire) as i64
            - withheld.0 as i64
            - self.reserved.load(Ordering::Acquire) as i64;
        limit - self.charged.load(Ordering::Acquire) as i64
    }

    /// What charges may reach: the budget less the reserves withheld and
    /// the delayed data's reservations.
    fn limit(&self, withheld: Withheld) -> u64 {
        self.base
            .load(Ordering::Acquire)
            .saturating_sub(withheld.0)
            .saturating_sub(self.reserved.load(Ordering::Acquire))
    }

    /// Reserve `blocks` for delayed data, beyond this transaction: one
    /// atomic add, backed out like a charge when the balance cannot
    /// cover it.
    pub fn reserve(&self, blocks: u64, withheld: Withheld) -> Result<(), Shortfall> {
        debug_assert!(blocks > 0);
        let limit = self.base.load(Ordering::Acquire).saturating_sub(withheld.0);
        let before = self.reserved.fetch_add(blocks, Ordering::AcqRel);
        let charged = self.charged.load(Ordering::Acquire);
        if before + blocks + charged <= limit {
            return Ok(());
        }
        self.reserved.fetch_sub(blocks, Ordering::AcqRel);
        self.backed_out.fetch_add(1, Ordering::Relaxed);
        Err(self.shortfall(blocks, withheld))
    }

    /// Delayed data is being written out: `blocks` of its reservation
    /// become a charge of the running transaction. The limit moves by
    /// nothing, so this cannot fail (the charge is added first: for an
    /// instant the two count twice, which errs on the safe side).
    pub fn claim(&self, blocks: u64) {
        if blocks == 0 {
            return;
        }
        self.charged.fetch_add(blocks, Ordering::AcqRel);
        let before = self.reserved.fetch_sub(blocks, Ordering::AcqRel);
        debug_assert!(before >= blocks, "claim of {blocks} with {before} reserved");
    }

    /// Delayed data was discarded (its file truncated or freed): its
    /// reservation goes back.
    pub fn unreserve(&self, blocks: u64) {
        if blocks == 0 {
            return;
        }
        let before = self.reserved.fetch_sub(blocks, Ordering::AcqRel);
        debug_assert!(
            before >= blocks,
            "unreserve of {blocks} with {before} reserved"
        );
    }

    /// A write-out that claimed `blocks` failed: the data is still held,
    /// and so is its reservation again (unchecked: it was covered before
    /// the claim, and erring high is safe).
    pub fn restore_reservation(&self, blocks: u64) {
        self.reserved.fetch_add(blocks, Ordering::AcqRel);
    }

    /// Blocks reserved for delayed data now.
    pub fn reserved(&self) -> u64 {
        self.reserved.load(Ordering::Acquire)
    }

    fn shortfall(&self, blocks: u64, withheld: Withheld) -> Shortfall {
        let missing = blocks as i64 - self.balance(withheld).max(0);
        let freed = self.freed.load(Ordering::Acquire) as i64;
        let commit_helps = self.journaled && freed > 0 && freed >= missing;
        if !commit_helps {
            self.enospc.fetch_add(1, Ordering::Relaxed);
        }
        Shortfall { commit_helps }
    }

    /// An operation ends with `blocks` charged and not allocated.
    pub fn refund(&self, blocks: u64) {
        if blocks == 0 {
            return;
        }
        let before = self.charged.fetch_sub(blocks, Ordering::AcqRel);
        debug_assert!(before >= blocks, "refund of {blocks} with {before} charged");
    }

    /// `blocks` were freed: allocatable at once unjournaled, after the
    /// running transaction's commit otherwise.
    pub fn released(&self, blocks: u64) {
        if self.journaled {
            self.freed.fetch_add(blocks, Ordering::AcqRel);
        } else {
            self.base.fetch_add(blocks, Ordering::AcqRel);
        }
    }

    /// A commit forced by a shortfall is about to start.
    pub fn note_forced_commit(&self) {
        self.forced_commits.fetch_add(1, Ordering::Relaxed);
    }

    /// Lock-down: the transaction that now opens has `free_blocks` as its
    /// budget (the blocks the one now committing frees included) and
    /// nothing charged. No operation is running: every charge of the old
    /// transaction was allocated or refunded. Unjournaled (the commit hook
    /// runs before each write-back pass, operations running meanwhile)
    /// there are no transactions: nothing to do.
    pub fn transition(&self, free_blocks: u64) {
        if !self.journaled {
            return;
        }
        self.base.store(free_blocks, Ordering::Release);
        self.charged.store(0, Ordering::Release);
        self.freed.store(0, Ordering::Release);
    }

    pub fn stats(&self) -> BudgetStats {
        let budget = self.base.load(Ordering::Acquire);
        BudgetStats {
            enabled: self.enabled,
            budget,
            balance: self.balance(self.withheld(false, false)),
            charged: self.charged.load(Ordering::Acquire),
            freed_in_running: self.freed.load(Ordering::Acquire),
            reserved_delayed: self.reserved(),
            root_reserve: self.root_reserve,
            emergency_reserve: self.emergency_reserve,
            charges: self.charges.load(Ordering::Relaxed),
            backed_out: self.backed_out.load(Ordering::Relaxed),
            forced_commits: self.forced_commits.load(Ordering::Relaxed),
            enospc: self.enospc.load(Ordering::Relaxed),
        }
    }
}

impl Tx<'_, '_> {
    /// The reserves this operation may not charge against.
    fn withheld(&self) -> Withheld {
        self.core
            .sbi
            .budget
            .withheld(self.may_use_reserved(), self.draws_on_emergency_reserve)
    }

    /// Make sure this operation holds `blocks` charged and not yet
    /// allocated: the format layer's worst case for its next step, or an
    /// operation's for all of it. What an earlier, larger charge covers
    /// costs nothing more.
    pub fn charge(&mut self, blocks: u64) -> Result<()> {
        if self.is_unmetered() || blocks <= self.prepaid {
            return Ok(());
        }
        let more = blocks - self.prepaid;
        let budget = &self.core.sbi.budget;
        match budget.charge(more, self.withheld()) {
            Ok(()) => {
                // The quota limits of the blocks' owner next (EDQUOT
                // before anything changed, as ENOSPC).
                if let Err(error) = self.grant_subject_blocks(more) {
                    budget.refund(more);
                    return Err(error);
                }
                self.prepaid += more;
                Ok(())
            }
            Err(shortfall) => Err(self.no_space(shortfall)),
        }
    }

    /// `charge` for an operation's whole cost when only a bound on it is
    /// cheap: while the balance covers `bound` it is charged as is (what
    /// it did not need returns when the operation ends), else `exact`
    /// works the cost out (reading the structures it changes) and that is
    /// charged — so the dry run is paid only near full.
    pub fn charge_bounded(
        &mut self,
        bound: u64,
        exact: impl FnOnce(&Self) -> Result<u64>,
    ) -> Result<()> {
        if self.is_unmetered() || bound <= self.prepaid {
            return Ok(());
        }
        let withheld = self.withheld();
        let budget = &self.core.sbi.budget;
        let more = bound - self.prepaid;
        if budget.balance(withheld) >= more as i64 && budget.charge(more, withheld).is_ok() {
            self.prepaid = bound;
            return Ok(());
        }
        let cost = exact(self)?;
        debug_assert!(cost <= bound, "cost {cost} above its bound {bound}");
        self.charge(cost)
    }

    /// `charge` for `fixed` blocks and up to `flexible` more (a run of
    /// data blocks, which may come out shorter): returns how many of
    /// `flexible` are covered, at least one.
    ///
    /// At the wall, the `fixed` part — the mapping's growth (an extent
    /// leaf, indirect blocks) — may come out of the emergency reserve once
    /// the data blocks fit the caller's own balance: otherwise a write
    /// whose last data block needs a new leaf would stop with that block
    /// free, and `df` would not say 100 % at the ENOSPC (how many extents
    /// a file has depends on timing: a search steps over blocks a
    /// checkpoint pass is writing).
    ///
    /// The blocks newly charged are then granted within the quota limits
    /// of the operation's subject (`quota/limits.rs`): the run is cut to
    /// what they leave, and what the cut took goes back to the budget.
    pub fn charge_run(&mut self, fixed: u64, flexible: u64) -> Result<u64> {
        let before = self.prepaid;
        let covered = self.charge_run_space(fixed, flexible)?;
        let newly = self.prepaid - before;
        if newly == 0 {
            return Ok(covered);
        }
        let newly_fixed = fixed.saturating_sub(before).min(newly);
        let newly_flexible = newly - newly_fixed;
        let held_flexible = covered - newly_flexible;
        let at_least = u64::from(held_flexible == 0 && newly_flexible > 0);
        match self.grant_subject_run(newly_fixed, newly_flexible, at_least) {
            Ok(granted) => {
                let cut = newly_flexible - granted;
                self.core.sbi.budget.refund(cut);
                self.prepaid -= cut;
                Ok(covered - cut)
            }
            Err(error) => {
                self.core.sbi.budget.refund(newly);
                self.prepaid = before;
                Err(error)
            }
        }
    }

    /// `charge_run` against the space budget alone.
    fn charge_run_space(&mut self, fixed: u64, flexible: u64) -> Result<u64> {
        if self.is_unmetered() || fixed + flexible <= self.prepaid {
            return Ok(flexible);
        }
        let fixed_more = fixed.saturating_sub(self.prepaid);
        let flexible_held = self.prepaid.saturating_sub(fixed);
        debug_assert!(flexible_held < flexible || flexible == 0);
        let at_least = u64::from(flexible_held == 0 && flexible > 0);
        let budget = &self.core.sbi.budget;
        let withheld = self.withheld();
        match budget.charge_up_to(fixed_more, flexible - flexible_held, at_least, withheld) {
            Ok(granted) => {
                self.prepaid += fixed_more + granted;
                Ok(flexible_held + granted)
            }
            Err(shortfall) if fixed_more > 0 && at_least > 0 => {
                match self.charge_growth_from_reserve(fixed_more, flexible - flexible_held) {
                    Some(granted) => Ok(flexible_held + granted),
                    None => Err(self.no_space(shortfall)),
                }
            }
            Err(shortfall) => Err(self.no_space(shortfall)),
        }
    }

    /// `charge_run`'s fallback at the wall: the data blocks (at least one)
    /// against the caller's balance, then `growth` against the emergency
    /// reserve too. None, with nothing charged, when either fails.
    fn charge_growth_from_reserve(&mut self, growth: u64, flexible: u64) -> Option<u64> {
        let budget = &self.core.sbi.budget;
        let granted = budget.charge_up_to(0, flexible, 1, self.withheld()).ok()?;
        let with_reserve = budget.withheld(self.may_use_reserved(), true);
        if budget.charge(growth, with_reserve).is_err() {
            budget.refund(granted);
            return None;
        }
        self.prepaid += growth + granted;
        Some(granted)
    }

    fn no_space(&mut self, shortfall: Shortfall) -> Error {
        self.space_wait = shortfall.commit_helps.then_some(SpaceWait::Commit);
        Error::NoSpace
    }

    /// Nothing is charged: mount-time work, or the budget is off.
    fn is_unmetered(&self) -> bool {
        self.unmetered || !self.core.sbi.budget.enabled
    }

    /// Up to `count` blocks are about to be allocated: they come out of
    /// what this operation charged. An estimate that missed them is a bug
    /// (debug builds stop here); release builds charge them now. With the
    /// budget off, only the reserves are checked, against the free count,
    /// and the run is cut to what they leave. Returns the blocks to take.
    pub(crate) fn spend_charge(&mut self, count: u32) -> Result<u32> {
        if self.unmetered {
            return Ok(count);
        }
        let budget = &self.core.sbi.budget;
        if !budget.enabled {
            let free = self.core.sbi.free_blocks();
            let available = free.saturating_sub(self.withheld().0);
            if available == 0 {
                return Err(Error::NoSpace);
            }
            let count = count.min(available.min(u32::MAX as u64) as u32);
            // Nothing was charged: the quota limits are met here, at the
            // allocation, as the kernel meets them.
            return Ok(self.grant_subject_run(0, count as u64, 1)? as u32);
        }
        if count as u64 > self.prepaid {
            debug_assert!(
                false,
                "allocating {count} blocks with {} charged: a cost estimate missed them",
                self.prepaid
            );
            self.charge(count as u64)?;
        }
        Ok(count)
    }

    /// `count` blocks were allocated out of the charge.
    pub(crate) fn spent(&mut self, count: u64) {
        if !self.is_unmetered() {
            debug_assert!(count <= self.prepaid);
            self.prepaid -= count.min(self.prepaid);
        }
    }

    /// Reserve `blocks` for delayed data (`delalloc.rs`); false when the
    /// balance cannot cover them (the write then allocates at once, and
    /// meets the wall exactly).
    pub(crate) fn reserve_delayed(&self, blocks: u64) -> bool {
        blocks == 0
            || self
                .core
                .sbi
                .budget
                .reserve(blocks, self.withheld())
                .is_ok()
    }

    /// Delayed data's reservation of `blocks` pays for its write-out in
    /// this operation.
    pub(crate) fn claim_reserved(&mut self, blocks: u64) {
        self.core.sbi.budget.claim(blocks);
        self.prepaid += blocks;
    }

    /// The operation ends: what it charged and did not allocate goes back.
    pub(crate) fn refund_charge(&mut self) {
        let unused = std::mem::take(&mut self.prepaid);
        self.core.sbi.budget.refund(unused);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NONE: Withheld = Withheld(0);

    #[test]
    fn a_charge_past_the_balance_is_backed_out_and_fails_at_once_without_frees() {
        let budget = Budget::new(100, true, 10, 5);
        let user = budget.withheld(false, false);
        assert_eq!(user, Withheld(15));
        assert_eq!(budget.charge(80, user), Ok(()));
        assert_eq!(budget.balance(user), 5);
        // Past the balance: backed out, and nothing freed means no commit.
        assert_eq!(
            budget.charge(6, user),
            Err(Shortfall {
                commit_helps: false
            })
        );
        assert_eq!(budget.balance(user), 5, "the failed charge was backed out");
        // Root may use its reserve, a deletion the emergency reserve too.
        assert_eq!(budget.charge(10, budget.withheld(true, false)), Ok(()));
        assert!(budget.charge(6, budget.withheld(true, false)).is_err());
        assert_eq!(budget.charge(10, budget.withheld(true, true)), Ok(()));
        assert_eq!(budget.balance(NONE), 0);
        let stats = budget.stats();
        assert_eq!((stats.charges, stats.backed_out, stats.enospc), (3, 2, 2));
    }

    #[test]
    fn blocks_freed_in_the_running_transaction_count_after_its_commit() {
        let budget = Budget::new(50, true, 0, 0);
        budget.charge(50, NONE).unwrap();
        budget.released(20);
        // The freed blocks are not allocatable yet: the charge fails, but
        // a commit would cover it.
        assert_eq!(
            budget.charge(20, NONE),
            Err(Shortfall { commit_helps: true })
        );
        assert_eq!(
            budget.charge(21, NONE),
            Err(Shortfall {
                commit_helps: false
            })
        );
        // Lock-down: 50 allocated, 20 freed → 20 free.
        budget.transition(20);
        assert_eq!(budget.charge(20, NONE), Ok(()));
        assert!(budget.charge(1, NONE).is_err());
    }

    #[test]
    fn unjournaled_frees_count_at_once_and_refunds_return_unused_charges() {
        let budget = Budget::new(10, false, 0, 0);
        budget.charge(10, NONE).unwrap();
        budget.refund(3);
        assert_eq!(budget.balance(NONE), 3);
        budget.released(4);
        assert_eq!(budget.balance(NONE), 7);
        // Nothing to commit: a shortfall is final.
        assert_eq!(
            budget.charge(8, NONE),
            Err(Shortfall {
                commit_helps: false
            })
        );
    }

    #[test]
    fn reservations_outlive_transitions_and_their_claims_cannot_fail() {
        let budget = Budget::new(100, true, 0, 0);
        assert_eq!(budget.reserve(60, NONE), Ok(()));
        assert_eq!(budget.balance(NONE), 40);
        assert!(budget.charge(41, NONE).is_err());
        assert!(budget.reserve(41, NONE).is_err());
        assert_eq!(budget.reserved(), 60, "a failed reservation was backed out");
        // Lock-down keeps the reservation: the data is still held.
        budget.charge(10, NONE).unwrap();
        budget.transition(90);
        assert_eq!(budget.balance(NONE), 30);
        // Write-out: the reservation becomes the charge, with no room left
        // for anyone else meanwhile.
        budget.charge(30, NONE).unwrap();
        budget.claim(50);
        assert_eq!((budget.reserved(), budget.balance(NONE)), (10, 0));
        budget.unreserve(10);
        assert_eq!(budget.balance(NONE), 10);
    }

    #[test]
    fn charge_up_to_takes_what_fits_and_at_least_what_is_asked() {
        let budget = Budget::new(10, true, 0, 0);
        assert_eq!(budget.charge_up_to(2, 100, 1, NONE), Ok(8));
        assert_eq!(budget.balance(NONE), 0);
        assert!(budget.charge_up_to(0, 5, 1, NONE).is_err());
        // Nothing asked for at least: nothing charged, no failure.
        assert_eq!(budget.charge_up_to(0, 5, 0, NONE), Ok(0));
        budget.refund(3);
        assert_eq!(budget.charge_up_to(2, 5, 1, NONE), Ok(1));
        assert!(budget.charge_up_to(3, 0, 0, NONE).is_err());
        assert_eq!(budget.stats().charged, 10);
    }
}
