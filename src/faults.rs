//! Fault injection for the crash-state tests: switches that break the
//! journal's ordering rules on purpose, so that a test can show that the
//! crash-state oracle (`crate::crash`) notices each kind of breakage. A
//! harness that passes a broken journal is worse than none.
//!
//! A crate-level module, like `lock.rs` and `hash.rs`, because the rules
//! it breaks are kept in every layer: the ordered-data rule at the device
//! (`dev/guard.rs`), the commit and checkpoint order in `journal/`, the
//! records' CRCs in `format/`, the directory commits in `fs/`; the panic
//! points below sit in `journal/`, `fs/` and `fuse/`. Each switch lives at
//! the site of its rule, so no one layer owns them; inside `journal/`,
//! `dev/` had to import from a layer above it.
//!
//! The switches are compiled into every build (the hooks are one atomic
//! load each, at the site of the rule they break) but only tests set them.
//! They are process-wide: a test that sets one must not share its process
//! with tests that expect a correct journal running at the same time.
//!
//! What each one breaks (the rule, then the fault):
//! - [`Fault::SkipPreCommitFlush`]: the log blocks (and the ordered data
//!   written before them) are flushed before the commit block is written;
//!   skipped, a commit block can reach the disk without its transaction.
//! - [`Fault::WriteHomeBeforeCommit`]: no metadata block goes home before
//!   the commit block of its transaction is durable; broken, every logged
//!   block is also written home (around the write-ahead guard) before the
//!   commit block.
//! - [`Fault::DropRevoke`]: a freed metadata block is revoked, so replay
//!   never writes an older logged copy over its next owner; broken, no
//!   revoke record is written.
//! - [`Fault::EarlyTailAdvance`]: checkpoint flushes the home writes before
//!   the journal superblock moves the tail past them; broken, the home
//!   writes and the new tail share one flush epoch.
//! - [`Fault::DeferOrderedData`]: data=ordered writes file data before the
//!   commit of the metadata that points at it; broken, data writes are held
//!   back (reads still see them) until the next commit is durable.
//! - [`Fault::FastCommitTailFirst`]: a fast commit's TAIL becomes durable
//!   only after its records and the data they map; broken, the TAIL's block
//!   is written and flushed first and the other record blocks follow with
//!   no flush before the fsync returns.
//! - [`Fault::FastCommitDropRange`]: a fast commit records every change of
//!   the inodes it covers; broken, it leaves out their range records
//!   (ADD_RANGE, DEL_RANGE), so replay keeps the old mapping under the new
//!   size.
//! - [`Fault::FastCommitCrcSpan`]: the TAIL's CRC covers every byte from
//!   the first record to the TAIL's tid; broken, it stops before the TAIL.
//! - [`Fault::ByteLogPayloadUnfenced`]: a ByteLog fast commit's ring
//!   records are persisted (written back and fenced) before its ANCHOR and
//!   TAIL are stored; broken, only the ANCHOR and TAIL are persisted, and
//!   the records' cache lines may still be lost after the fsync returned.
//! - [`Fault::ByteLogCrcSpan`]: a ring record's payload CRC covers its
//!   whole payload; broken, it leaves the last byte out, so replay rejects
//!   every record.
//! - [`Fault::DirCommitSkipsData`]: a directory's commit makes its inodes'
//!   data durable with its records (the barrier names their ranges);
//!   broken, the ranges are left out, so a TAIL can be durable before the
//!   data its ranges map.
//! - [`Fault::DirCommitSplitsCoalesced`]: an operation across directories
//!   (a rename, a link) unites their transactions, so that committing one
//!   commits both; broken, each name change goes to its own directory's
//!   transaction, and a commit of one carries half of the rename.
//! - [`Fault::FastCommitAckEarly`]: a queued fast commit is acknowledged
//!   once the write holding it is durable; broken, the writer counts its
//!   group durable when it takes it, and the waiters return before the
//!   write's barrier.
//! - [`Fault::DelallocFsyncSkipsWriteOut`]: fsync writes a file's data
//!   held by delayed allocation out (allocated, written, mapped) before it
//!   commits; broken, the held data stays in memory and the fsync commits
//!   without it.
//! - [`Fault::DirSyncDropsDentry`]: a directory fsync's fast commit records
//!   every name created, linked or removed in its transaction; broken, it
//!   leaves the last one out, so a name the fsync acknowledged is missing
//!   (or an unlinked one back) after replay.
//! - [`Fault::MetaBgFlatDescriptor`]: with meta_bg, the descriptor of a
//!   group in meta group `M` is written to that meta group's descriptor
//!   block (in its first group); broken, it goes where the table would be
//!   without meta_bg — block `M` after the primary superblock, over what
//!   lies there — and its real block keeps the old counts.
//! - [`Fault::EaInodeRefKept`]: replacing or removing a value kept in an
//!   EA inode (ea_inode), or deleting its owner, drops one of the EA
//!   inode's references, freeing it with the last; broken, the count stays
//!   as it was, so an EA inode nothing names is left in use.
//! - [`Fault::EaInodeShareUncounted`]: a value set equal to one an EA
//!   inode holds shares that EA inode and takes one more of its
//!   references; broken, the count stays, so the EA inode is freed while
//!   the other place still names it.
//! - [`Fault::VerityFlagBeforeTree`]: enabling fs-verity sets the flag
//!   in the transaction that commits after the Merkle tree is written;
//!   broken, it is set first, so a crash leaves a verity file without its
//!   tree.
//! - [`Fault::ExternalJournalUnflushed`]: with the journal on a device of
//!   its own, a barrier flushes both devices (`dev/joined.rs`); broken, it
//!   flushes the filesystem's only, so a commit can be acknowledged, and
//!   its blocks checkpointed home, while its log is still volatile.
//! - [`Fault::InlineDirConvertDropsValue`]: an inline directory that
//!   outgrows its inode moves to a block with all its names, those of
//!   `i_block` and those of the `system.data` value; broken, the value's
//!   are left behind, so names the directory held vanish.
//! - [`Fault::QuotaChargedLate`]: an operation's quota usage is written to
//!   the quota files in its own transaction; broken, it waits for the next
//!   operation's, so a crash between them leaves usage and blocks apart.
//! - [`Fault::EaInodeQuotaUncharged`]: with quota and ea_inode, each
//!   value kept in an EA inode counts one inode for its owner; broken,
//!   the count misses the values set and removed.
//! - [`Fault::CasefoldHashRaw`]: a casefolded directory's htree hashes
//!   each name's folded bytes; broken, its raw bytes, so that a lookup by
//!   another case misses and e2fsck finds the names out of hash order.
//! - [`Fault::DataJournalWrittenHome`]: data=journal logs file data and
//!   writes it home only at the checkpoint after its commit; broken, each
//!   block is also written home at once, so a crash before the commit
//!   leaves a write's blocks part new, part old.
//! - [`Fault::BigallocClusterFreedShared`]: with bigalloc, unmapping part
//!   of a cluster frees it only when no other block of the file lies
//!   there; broken, the end clusters of every unmapped range are freed
//!   too, so the file keeps blocks of a cluster the bitmap has free.
//! - [`Fault::BigallocImpliedCounted`]: with bigalloc, a block mapped into
//!   a cluster the file already has costs nothing; broken, i_blocks counts
//!   the cluster again, which e2fsck finds in the crash states.

use std::sync::atomic::{AtomicU32, Ordering};

/// One way of breaking the journal (a bit in the active set).
#[doc(hidden)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum Fault {
    SkipPreCommitFlush = 1 << 0,
    WriteHomeBeforeCommit = 1 << 1,
    DropRevoke = 1 << 2,
    EarlyTailAdvance = 1 << 3,
    DeferOrderedData = 1 << 4,
    FastCommitTailFirst = 1 << 5,
    FastCommitDropRange = 1 << 6,
    FastCommitCrcSpan = 1 << 7,
    ByteLogPayloadUnfenced = 1 << 8,
    ByteLogCrcSpan = 1 << 9,
    DirCommitSkipsData = 1 << 10,
    DirCommitSplitsCoalesced = 1 << 11,
    FastCommitAckEarly = 1 << 12,
    DelallocFsyncSkipsWriteOut = 1 << 13,
    DirSyncDropsDentry = 1 << 14,
    MetaBgFlatDescriptor = 1 << 15,
    EaInodeRefKept = 1 << 16,
    ExternalJournalUnflushed = 1 << 17,
    EaInodeShareUncounted = 1 << 18,
    VerityFlagBeforeTree = 1 << 19,
    InlineDirConvertDropsValue = 1 << 20,
    QuotaChargedLate = 1 << 21,
    EaInodeQuotaUncharged = 1 << 22,
    CasefoldHashRaw = 1 << 23,
    DataJournalWrittenHome = 1 << 24,
    BigallocClusterFreedShared = 1 << 25,
    BigallocImpliedCounted = 1 << 26,
}

impl Fault {
    pub const ALL: [Fault; 27] = [
        Fault::SkipPreCommitFlush,
        Fault::WriteHomeBeforeCommit,
        Fault::DropRevoke,
        Fault::EarlyTailAdvance,
        Fault::DeferOrderedData,
        Fault::FastCommitTailFirst,
        Fault::FastCommitDropRange,
        Fault::FastCommitCrcSpan,
        Fault::ByteLogPayloadUnfenced,
        Fault::ByteLogCrcSpan,
        Fault::DirCommitSkipsData,
        Fault::DirCommitSplitsCoalesced,
        Fault::FastCommitAckEarly,
        Fault::DelallocFsyncSkipsWriteOut,
        Fault::DirSyncDropsDentry,
        Fault::MetaBgFlatDescriptor,
        Fault::EaInodeRefKept,
        Fault::ExternalJournalUnflushed,
        Fault::EaInodeShareUncounted,
        Fault::VerityFlagBeforeTree,
        Fault::InlineDirConvertDropsValue,
        Fault::QuotaChargedLate,
        Fault::EaInodeQuotaUncharged,
        Fault::CasefoldHashRaw,
        Fault::DataJournalWrittenHome,
        Fault::BigallocClusterFreedShared,
        Fault::BigallocImpliedCounted,
    ];
}

/// The active faults, one bit per `Fault`.
static ACTIVE: AtomicU32 = AtomicU32::new(0);

/// Turn `fault` on for the whole process.
#[doc(hidden)]
pub fn set(fault: Fault) {
    ACTIVE.fetch_or(fault as u32, Ordering::SeqCst);
}

/// Turn every fault off.
#[doc(hidden)]
pub fn clear_all() {
    ACTIVE.store(0, Ordering::SeqCst);
}

/// Whether `fault` is on (the hook at each fault site).
#[doc(hidden)]
#[inline]
pub fn active(fault: Fault) -> bool {
    ACTIVE.load(Ordering::Relaxed) & fault as u32 != 0
}

/// Whether any fault is on.
#[doc(hidden)]
pub fn any_active() -> bool {
    ACTIVE.load(Ordering::SeqCst) != 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn faults_are_distinct_bits() {
        let mut seen = 0u32;
        for fault in Fault::ALL {
            assert_eq!((fault as u32).count_ones(), 1);
            assert_eq!(seen & fault as u32, 0, "{fault:?} shares a bit");
            seen |= fault as u32;
        }
        // No unit test sets a fault: the switches are process-wide and the
        // journal's own tests share this process.
        assert!(!any_active());
    }
}

/// Points where a test can make the server panic, once each: to show that
/// a panic in any thread ends in an aborted journal and a server that exits
/// once unmounted — never a hang holding the image. Armed from the
/// environment (`JEXT4_PANIC_AT=commit,create`) by the server, and only in
/// builds with debug assertions (the CI profile), never in release builds.
#[doc(hidden)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
pub enum PanicPoint {
    /// The commit thread, as it starts a commit.
    Commit = 1 << 0,
    /// Creating a file, after its inode is allocated in the running
    /// transaction and before its name exists: half of a change.
    Create = 1 << 1,
    /// An io_uring queue thread, about to decode a request (outside any
    /// request handler).
    UringQueue = 1 << 2,
    /// A directory's fast commit, its transaction taken, before its
    /// records are built.
    FastCommitBuild = 1 << 3,
}

/// The armed panic points, one bit per `PanicPoint`.
static PANIC_AT: AtomicU32 = AtomicU32::new(0);

/// Arm the panic points named in `JEXT4_PANIC_AT` (debug builds only).
#[doc(hidden)]
pub fn arm_panics_from_env() {
    if !cfg!(debug_assertions) {
        return;
    }
    let Ok(names) = std::env::var("JEXT4_PANIC_AT") else {
        return;
    };
    for name in names.split(',').map(str::trim) {
        let point = match name {
            "commit" => PanicPoint::Commit,
            "create" => PanicPoint::Create,
            "uring" => PanicPoint::UringQueue,
            "fc_build" => PanicPoint::FastCommitBuild,
            _ => continue,
        };
        PANIC_AT.fetch_or(point as u32, Ordering::SeqCst);
    }
}

/// Arm `point` from a test of the library (debug builds only).
#[doc(hidden)]
pub fn arm_panic(point: PanicPoint) {
    if cfg!(debug_assertions) {
        PANIC_AT.fetch_or(point as u32, Ordering::SeqCst);
    }
}

/// Panic here if `point` is armed (then disarm it): the hook at each site.
#[doc(hidden)]
#[inline]
pub fn panic_point(point: PanicPoint) {
    if PANIC_AT.load(Ordering::Relaxed) & point as u32 != 0
        && PANIC_AT.fetch_and(!(point as u32), Ordering::SeqCst) & point as u32 != 0
    {
        panic!("injected panic at {point:?} (JEXT4_PANIC_AT)");
    }
}
