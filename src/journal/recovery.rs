//! Journal recovery: replay the log into the filesystem, as the kernel's
//! `fs/jbd2/recovery.c` and e2fsck 1.47 (which shares that file) do, then
//! reset the journal so the replayed transactions can never replay again.
//!
//! Three passes walk the log from `s_start` / `s_sequence`:
//! - **scan** finds the end of the valid log: the first block without the
//!   magic, with an unexpected tid or an unknown type; checksums decide as
//!   the kernel decides (below);
//! - **revoke** collects every revoked block with the newest tid that
//!   revoked it;
//! - **replay** writes each logged block home unless a revoke record with a
//!   tid at or after its transaction names it; later copies overwrite
//!   earlier ones, so the newest wins.
//!
//! How the kernel treats damage, replicated here because the result must be
//! byte-identical to `e2fsck -E journal_only`:
//! - a descriptor or revoke block whose tail checksum fails during the scan
//!   may be a stale block (lazy journal init): the scan goes on, and the
//!   next commit block decides: an older commit time ends the log quietly,
//!   a newer one fails recovery (checksum error, nothing replayed);
//! - a commit block whose checksum fails ends the log there (the
//!   transaction is not replayed, "failed commit"), unless its commit time
//!   is older than the previous commit's (then it is stale: quiet end); with
//!   async_commit the scan carries on but nothing after is replayed;
//! - a logged block whose tag checksum fails is skipped; the others are
//!   replayed and recovery reports failure.
//!
//! When recovery fails, e2fsck still resets the journal (keeping
//! `s_sequence`); this module does the same and says so in the report
//! (`RecoveryReport::problem`). Device errors abort instead, leaving the
//! journal untouched for another try.
//!
//! This module is block-level, as JBD2 is: it reads and writes the journal
//! and the home blocks it logged, never the ext4 superblock. `fs/journal.rs`
//! decides from the ext4 superblock whether to recover (needs_recovery),
//! refuses external journals, and records the outcome there (error state,
//! the flag cleared), around the two steps here: `replay`, then `reset`.
//! Crash safety: replay writes only home blocks and is repeatable, so
//! `reset` clears the log (s_start = 0) only after `replay` flushed every
//! replayed block; the order of the ext4 superblock's writes around them
//! is explained in `fs/journal.rs`, beside the code that keeps it.
//!
//! Fast commits are not replayed here: the fast-commit area and the tid its
//! records must carry are reported, and `replay` lets `fs/` replay them
//! after the block replay and before the journal reset.
//!
//! Every loop is bounded by the journal size: a corrupt journal can make
//! recovery fail but never hang it.

use super::format::{
    BlockHeader, CommitBlock, JournalSuperblock, LogFormat, LogLayout, SUPERBLOCK_SIZE, block_type,
    crc32_be, descriptor_tags, fast_commit_head_tid, revoke_records, tid_geq, tid_gt, unescape,
    verify_block_tail, verify_commit_block, verify_data_block,
};
use crate::dev::BlockDevice;
use crate::error::{Error, Location, Result};
use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;

/// Where the journal lives: `blocks[i]` is the block of `dev` holding
/// journal block `i`. For an internal journal, `dev` is the filesystem's
/// device and the map comes from the journal inode; for an external one,
/// `dev` joins the filesystem's device and the journal's
/// (`dev::JoinedDevice`) and the map is the journal device's blocks in
/// order, as jbd2 numbers them (`jbd2_journal_bmap` of a device journal is
/// the identity).
pub struct JournalArea {
    pub dev: Arc<dyn BlockDevice>,
    pub fs_block_size: u32,
    pub blocks: Vec<u64>,
    /// The journal block holding the journal superblock: 0 for an internal
    /// journal; on an external device the block after the ext4 superblock
    /// that names the device (1 with 4 KiB blocks, 2 with 1 KiB).
    superblock_index: u64,
    /// Bytes of `dev` that belong to the filesystem: replay writes home
    /// only below this.
    home_end: u64,
    /// Whether the journal is on a device of its own.
    external: bool,
}

impl JournalArea {
    /// An internal journal: `blocks` from the journal inode, on `dev`.
    pub fn new(dev: Arc<dyn BlockDevice>, fs_block_size: u32, blocks: Vec<u64>) -> Self {
        let home_end = dev.size_bytes();
        JournalArea {
            dev,
            fs_block_size,
            blocks,
            superblock_index: 0,
            home_end,
            external: false,
        }
    }

    /// An external journal: `len` journal blocks from byte `journal_base`
    /// of `joined`, its superblock in block `superblock_index`; the
    /// filesystem's bytes end at `home_end`.
    pub fn external(
        joined: Arc<dyn BlockDevice>,
        fs_block_size: u32,
        journal_base: u64,
        len: u64,
        superblock_index: u64,
        home_end: u64,
    ) -> Self {
        let block_size = fs_block_size as u64;
        assert!(journal_base.is_multiple_of(block_size) && journal_base >= home_end);
        assert!(superblock_index < len);
        let base_block = journal_base / block_size;
        JournalArea {
            dev: joined,
            fs_block_size,
            blocks: (base_block..base_block + len).collect(),
            superblock_index,
            home_end,
            external: true,
        }
    }

    /// The journal's blocks that are the filesystem's too, which the
    /// filesystem must never allocate: all of them for an internal journal,
    /// none for an external one.
    pub fn blocks_in_filesystem(&self) -> &[u64] {
        match self.external {
            true => &[],
            false => &self.blocks,
        }
    }

    /// The block holding the journal superblock.
    pub fn read_superblock_block(&self) -> Result<Vec<u8>> {
        self.read_block(self.superblock_index)
    }

    /// Read journal block `index` (a position in the journal file).
    pub fn read_block(&self, index: u64) -> Result<Vec<u8>> {
        let fs_block = usize::try_from(index)
            .ok()
            .and_then(|i| self.blocks.get(i))
            .copied()
            .ok_or_else(|| {
                Error::corrupt(
                    Location::Journal { block: index },
                    "beyond the journal's mapped blocks",
                )
            })?;
        let mut block = vec![0u8; self.fs_block_size as usize];
        self.dev
            .read_at(fs_block * self.fs_block_size as u64, &mut block)?;
        Ok(block)
    }

    /// Read and check the journal superblock; returns it with the log layout.
    pub fn load_superblock(&self) -> Result<(JournalSuperblock, LogLayout)> {
        ensure_format_journal(!self.blocks.is_empty(), 0, "the journal maps no blocks")?;
        let block = self.read_superblock_block()?;
        let superblock = JournalSuperblock::decode(&block)?;
        let layout = superblock.check(self.fs_block_size, self.blocks.len() as u64)?;
        // On an external device the log starts after the superblock's
        // block (mke2fs sets s_first so); a log over it would overwrite it.
        ensure_format_journal(
            layout.first as u64 > self.superblock_index,
            self.superblock_index,
            &format!(
                "the log starts at block {}, at or before the journal superblock",
                layout.first
            ),
        )?;
        self.check_mapping(layout.total)?;
        Ok((superblock, layout))
    }

    /// Every journal block must map inside the device (e2fsck refuses a
    /// journal inode with holes or out-of-range blocks).
    fn check_mapping(&self, total: u32) -> Result<()> {
        let device_blocks = self.dev.size_bytes() / self.fs_block_size as u64;
        for (index, &fs_block) in self.blocks.iter().take(total as usize).enumerate() {
            ensure_format_journal(
                fs_block != 0 && fs_block < device_blocks,
                index as u64,
                &format!("maps to block {fs_block}, outside the device"),
            )?;
        }
        Ok(())
    }

    /// Encode and store a journal superblock (not flushed).
    pub fn store_superblock(&self, superblock: &mut JournalSuperblock) -> Result<()> {
        self.write_superblock(superblock.encode())
    }

    /// Store the journal superblock (its first 1024 bytes; the fields that
    /// change all lie in the first sector, so a torn write cannot mix them).
    fn write_superblock(&self, bytes: &[u8; SUPERBLOCK_SIZE]) -> Result<()> {
        let offset = self.blocks[self.superblock_index as usize] * self.fs_block_size as u64;
        self.dev.write_at(offset, bytes)?;
        Ok(())
    }
}

#[track_caller]
fn ensure_format_journal(condition: bool, block: u64, detail: &str) -> Result<()> {
    if condition {
        Ok(())
    } else {
        Err(Error::corrupt(Location::Journal { block }, detail))
    }
}

/// Why a recovery pass stopped short. With any of these, e2fsck (and this
/// module) still resets the journal but marks the filesystem for a full
/// check; the kernel refuses to mount.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum RecoveryProblem {
    /// The log points outside the journal (kernel: EFSCORRUPTED).
    OutsideJournal { index: u64 },
    /// A descriptor's tail checksum failed after the scan accepted it.
    DescriptorChecksum { index: u64 },
    /// A bad descriptor or revoke checksum was followed by a commit block
    /// that is not stale (kernel: "Invalid checksum found in transaction").
    TransactionChecksum { tid: u32 },
    /// A revoke block's `r_count` runs past the block (kernel: EINVAL).
    RevokeCount { index: u64 },
    /// A logged block did not match its tag checksum; it was not replayed.
    DataChecksum { tid: u32, fs_block: u64 },
    /// A tag names a block past the end of the device; it was not replayed.
    HomeOutsideDevice { fs_block: u64 },
    /// The revoke or replay pass ended at another tid than the scan.
    PassMismatch { ended: u32, expected: u32 },
    /// The log visits more blocks than the journal holds (the kernel would
    /// loop forever).
    EndlessLog,
}

impl fmt::Display for RecoveryProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::OutsideJournal { index } => write!(f, "log block {index} is outside the journal"),
            Self::DescriptorChecksum { index } => {
                write!(f, "descriptor block {index} has a bad checksum")
            }
            Self::TransactionChecksum { tid } => {
                write!(
                    f,
                    "transaction {tid} has a bad descriptor or revoke checksum"
                )
            }
            Self::RevokeCount { index } => write!(f, "revoke block {index} has a bad count"),
            Self::DataChecksum { tid, fs_block } => {
                write!(
                    f,
                    "logged copy of block {fs_block} in transaction {tid} has a bad checksum"
                )
            }
            Self::HomeOutsideDevice { fs_block } => {
                write!(f, "logged block {fs_block} lies past the end of the device")
            }
            Self::PassMismatch { ended, expected } => {
                write!(f, "replay ended at transaction {ended}, scan at {expected}")
            }
            Self::EndlessLog => write!(f, "the log is longer than the journal"),
        }
    }
}

/// The fast-commit area and what its records must carry to be replayed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FastCommitArea {
    /// First journal block of the area.
    pub first_block: u32,
    /// One past the last journal block the kernel writes fast commits to.
    pub end_block: u32,
    /// The tid of the transaction the fast commits extend: the first tid the
    /// block replay did not reach (the kernel's `expected_commit_id`).
    pub expected_tid: u32,
    /// The area starts with a HEAD record carrying `expected_tid`.
    pub has_records: bool,
}

/// What recovery found and did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RecoveryReport {
    /// needs_recovery was set, so the journal was replayed and reset.
    pub needed: bool,
    /// `s_sequence` before recovery: the first tid looked for.
    pub start_tid: u32,
    /// The first tid not replayed (the end of the valid log).
    pub end_tid: u32,
    /// The tid written to `s_sequence` for the next transaction.
    pub next_tid: u32,
    pub transactions_replayed: u32,
    pub blocks_replayed: u64,
    /// Revoke records read, and logged blocks they kept from replay.
    pub revoke_records: u64,
    pub revoked_blocks_skipped: u64,
    /// The valid log runs past the end of the journal back to `s_first`.
    pub log_wrapped: bool,
    /// A transaction whose commit block failed its checksum; it and
    /// everything after it was not replayed (the filesystem gets ERROR_FS).
    pub failed_commit: Option<u32>,
    /// Recovery stopped short (see `RecoveryProblem`); the filesystem was
    /// marked not clean and needs a full e2fsck.
    pub problem: Option<RecoveryProblem>,
    /// Set when the journal has the FAST_COMMIT feature.
    pub fast_commit: Option<FastCommitArea>,
}

/// What recovery would meet in a journal, found without changing it: for
/// tools that must know how other replays will read the log.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LogShape {
    /// The journal says FAST_COMMIT (its log ends before the area).
    pub fast_commit: bool,
    /// The valid log runs past the end of the log back to `s_first`.
    pub wraps: bool,
    /// The tid of the HEAD opening the fast-commit area, if one does.
    pub fast_commit_head: Option<u32>,
}

/// The shape of `area`'s log (read only; a log the scan refuses reads as
/// not wrapping).
pub fn log_shape(area: &JournalArea) -> Result<LogShape> {
    let (superblock, layout) = area.load_superblock()?;
    let log = Log::new(area, &superblock, layout);
    let wraps =
        superblock.start != 0 && matches!(scan(&log, &superblock)?, Ok(outcome) if outcome.wrapped);
    let fast_commit_head = match layout.fast_commit {
        Some((first, end)) if first < end => fast_commit_head_tid(&area.read_block(first as u64)?),
        _ => None,
    };
    Ok(LogShape {
        fast_commit: layout.fast_commit.is_some(),
        wraps,
        fast_commit_head,
    })
}

/// The journal of a filesystem whose needs_recovery flag is clear: the log
/// must be empty. e2fsck -p stops here too ("needs_recovery flag is clear,
/// but journal has data"): replaying could overwrite newer data.
pub fn check_log_empty(area: &JournalArea) -> Result<RecoveryReport> {
    let (journal_superblock, _) = area.load_superblock()?;
    ensure_format_journal(
        journal_superblock.start == 0,
        0,
        "needs_recovery is clear but the journal holds a log; run e2fsck",
    )?;
    Ok(RecoveryReport {
        start_tid: journal_superblock.sequence,
        end_tid: journal_superblock.sequence,
        next_tid: journal_superblock.sequence,
        ..RecoveryReport::default()
    })
}

/// A journal replayed and flushed, not yet reset.
pub struct Replayed {
    journal_superblock: JournalSuperblock,
    pub report: RecoveryReport,
}

impl Replayed {
    /// The journal was aborted (`s_errno`) or, with no recovery problem, a
    /// commit failed: e2fsck then marks the filesystem with errors.
    pub fn found_errors(&self) -> bool {
        self.journal_superblock.errno != 0
            || (self.report.problem.is_none() && self.report.failed_commit.is_some())
    }
}

/// The three passes over the log of a filesystem that needs recovery,
/// then `replay_fast_commits` when the fast-commit area holds records for
/// the transaction after the log. Every block written is flushed before
/// this returns, and the journal is left as it was (`reset` comes next),
/// so a crash during it replays again.
pub fn replay<F>(area: &JournalArea, replay_fast_commits: F) -> Result<Replayed>
where
    F: FnOnce(&JournalArea, &FastCommitArea) -> Result<()>,
{
    let (journal_superblock, layout) = area.load_superblock()?;
    let mut report = RecoveryReport {
        needed: true,
        start_tid: journal_superblock.sequence,
        end_tid: journal_superblock.sequence,
        ..RecoveryReport::default()
    };
    let log = Log::new(area, &journal_superblock, layout);
    if journal_superblock.start != 0 {
        report.problem = replay_log(&log, &journal_superblock, &mut report)?.err();
    }
    area.dev.flush()?;
    if report.problem.is_none() {
        // The kernel looks at fast commits only after scanning a log: with
        // s_start = 0 it returns before its fast-commit pass.
        let scanned = journal_superblock.start != 0;
        report.fast_commit = find_fast_commits(&log, report.end_tid, scanned)?;
        if let Some(fast_commit) = report.fast_commit.filter(|area| area.has_records) {
            replay_fast_commits(area, &fast_commit)?;
            area.dev.flush()?;
        }
    }
    Ok(Replayed {
        journal_superblock,
        report,
    })
}

/// Empty the log of a replayed journal and flush. It restarts past every
/// tid it held, so no old commit block can ever match again; a failed
/// recovery keeps `s_sequence`, as e2fsck does.
pub fn reset(area: &JournalArea, replayed: Replayed) -> Result<RecoveryReport> {
    let Replayed {
        mut journal_superblock,
        mut report,
    } = replayed;
    debug_assert!(
        report.needed,
        "only a journal that needed recovery is reset"
    );
    report.next_tid = if report.problem.is_some() {
        journal_superblock.sequence
    } else {
        report.end_tid.wrapping_add(1)
    };
    journal_superblock.start = 0;
    journal_superblock.sequence = report.next_tid;
    journal_superblock.errno = 0;
    area.write_superblock(journal_superblock.encode())?;
    area.dev.flush()?;
    Ok(report)
}

// ---------------------------------------------------------------------------
// Walking the log.

/// The log as the passes see it.
struct Log<'a> {
    area: &'a JournalArea,
    format: LogFormat,
    layout: LogLayout,
}

impl<'a> Log<'a> {
    fn new(area: &'a JournalArea, superblock: &JournalSuperblock, layout: LogLayout) -> Self {
        Log {
            area,
            format: superblock.log_format(),
            layout,
        }
    }

    /// The kernel's `wrap()`: one subtraction, exactly as it does it (a
    /// position it leaves past `last` fails the next read).
    fn wrap(&self, index: u64) -> (u64, bool) {
        let (first, last) = (self.layout.first as u64, self.layout.last as u64);
        if index >= last {
            (index - (last - first), true)
        } else {
            (index, false)
        }
    }

    /// The kernel's `jread`: `None` for a position outside the journal.
    fn read(&self, index: u64) -> Result<Option<Vec<u8>>> {
        if index >= self.layout.total as u64 {
            return Ok(None);
        }
        self.area.read_block(index).map(Some)
    }

    /// A legitimate log visits each journal block at most once, plus the
    /// block that ends it.
    fn max_steps(&self) -> u64 {
        self.layout.total as u64 + 1
    }
}

/// Position in the log while walking it.
struct Cursor {
    next_tid: u32,
    next_index: u64,
    wrapped: bool,
}

impl Cursor {
    fn start(superblock: &JournalSuperblock) -> Self {
        Cursor {
            next_tid: superblock.sequence,
            next_index: superblock.start as u64,
            wrapped: false,
        }
    }

    /// Take the next log position and move past it.
    fn take(&mut self, log: &Log) -> u64 {
        let index = self.next_index;
        self.skip(log, 1);
        index
    }

    fn skip(&mut self, log: &Log, blocks: usize) {
        debug_assert!(
            blocks <= log.format.block_size,
            "more tags than a block holds"
        );
        let (index, wrapped) = log.wrap(self.next_index + blocks as u64);
        self.next_index = index;
        self.wrapped |= wrapped;
    }
}

/// The outcome of one step of a pass.
enum Step {
    Next,
    End,
    Fail(RecoveryProblem),
}

type PassResult<T> = Result<std::result::Result<T, RecoveryProblem>>;

/// Scan, revoke and replay; fills the report. The inner error is a
/// recovery problem (the journal is still reset), the outer one a device
/// error (nothing more is written).
fn replay_log(
    log: &Log,
    superblock: &JournalSuperblock,
    report: &mut RecoveryReport,
) -> PassResult<()> {
    let scan = match scan(log, superblock)? {
        Ok(scan) => scan,
        Err(problem) => return Ok(Err(problem)),
    };
    debug_assert!(
        tid_geq(scan.end_tid, superblock.sequence),
        "the log ends before it starts"
    );
    report.end_tid = scan.end_tid;
    report.failed_commit = scan.failed_commit;
    report.log_wrapped = scan.wrapped;
    let mut revokes = RevokeTable::default();
    let revoke_pass = Walk {
        log,
        superblock,
        end_tid: scan.end_tid,
        replay: false,
    };
    if let Err(problem) = revoke_pass.run(&mut revokes, report)? {
        return Ok(Err(problem));
    }
    let replay_pass = Walk {
        replay: true,
        ..revoke_pass
    };
    let outcome = replay_pass.run(&mut revokes, report)?;
    report.transactions_replayed = scan.end_tid.wrapping_sub(superblock.sequence);
    Ok(outcome)
}

// ---------------------------------------------------------------------------
// Pass 1: scan.

struct ScanOutcome {
    end_tid: u32,
    failed_commit: Option<u32>,
    wrapped: bool,
}

/// The scan's state: the kernel's `do_one_pass` locals for PASS_SCAN.
struct Scan {
    cursor: Cursor,
    /// `info->end_transaction`; 0 means "not known yet", as in the kernel
    /// (which therefore cannot tell a failed commit of tid 0 apart).
    end_tid: u32,
    failed_commit: Option<u32>,
    /// Checksum v1: CRC32 of the current transaction's blocks so far.
    crc32_sum: u32,
    /// A descriptor or revoke checksum failed: the next commit decides.
    need_check_commit_time: bool,
    last_commit_time: u64,
}

fn scan(log: &Log, superblock: &JournalSuperblock) -> PassResult<ScanOutcome> {
    let mut scan = Scan {
        cursor: Cursor::start(superblock),
        end_tid: 0,
        failed_commit: None,
        crc32_sum: !0,
        need_check_commit_time: false,
        last_commit_time: 0,
    };
    let mut steps = 0;
    let step = loop {
        steps += 1;
        if steps > log.max_steps() {
            break Step::Fail(RecoveryProblem::EndlessLog);
        }
        let index = scan.cursor.take(log);
        let Some(block) = log.read(index)? else {
            break Step::Fail(RecoveryProblem::OutsideJournal { index });
        };
        let step = match BlockHeader::decode(&block) {
            Some(header) if header.sequence == scan.cursor.next_tid => match header.block_type {
                block_type::DESCRIPTOR => scan.descriptor(log, &block)?,
                block_type::COMMIT => scan.commit(log, &block),
                block_type::REVOKE => scan.revoke(log, &block),
                _ => Step::End,
            },
            _ => Step::End,
        };
        if !matches!(step, Step::Next) {
            break step;
        }
    };
    if let Step::Fail(problem) = step {
        return Ok(Err(problem));
    }
    if scan.end_tid == 0 {
        scan.end_tid = scan.cursor.next_tid;
    }
    Ok(Ok(ScanOutcome {
        end_tid: scan.end_tid,
        failed_commit: scan.failed_commit,
        wrapped: scan.cursor.wrapped,
    }))
}

impl Scan {
    fn descriptor(&mut self, log: &Log, block: &[u8]) -> Result<Step> {
        if !verify_block_tail(&log.format, block) {
            // Possibly a stale block from before the journal was last
            // reset; the next commit block tells.
            self.need_check_commit_time = true;
        }
        let count = descriptor_tags(&log.format, block).len();
        if log.format.has_checksum_v1() && !self.need_check_commit_time && self.end_tid == 0 {
            // Checksum v1 covers the descriptor then each logged block.
            self.crc32_sum = crc32_be(self.crc32_sum, block);
            for _ in 0..count {
                let index = self.cursor.take(log);
                let Some(data) = log.read(index)? else {
                    return Ok(Step::End);
                };
                self.crc32_sum = crc32_be(self.crc32_sum, &data);
            }
            return Ok(Step::Next);
        }
        self.cursor.skip(log, count);
        Ok(Step::Next)
    }

    fn commit(&mut self, log: &Log, block: &[u8]) -> Step {
        let commit = CommitBlock::decode(block);
        let commit_time = commit.commit_sec;
        if self.need_check_commit_time {
            if commit_time >= self.last_commit_time {
                return Step::Fail(RecoveryProblem::TransactionChecksum {
                    tid: self.cursor.next_tid,
                });
            }
            return Step::End; // an older commit: stale blocks, the log ends
        }
        let mut checksum_failed = false;
        if log.format.has_checksum_v1() {
            if self.end_tid != 0 {
                self.failed_commit = Some(self.end_tid);
                return Step::End;
            }
            if commit.v1_checksum_matches(self.crc32_sum) {
                self.crc32_sum = !0;
            } else {
                checksum_failed = true;
            }
        }
        if checksum_failed || !verify_commit_block(&log.format, block) {
            if commit_time < self.last_commit_time {
                return Step::End;
            }
            self.end_tid = self.cursor.next_tid;
            if !log.format.has_async_commit() {
                self.failed_commit = Some(self.cursor.next_tid);
                return Step::End;
            }
        }
        self.last_commit_time = commit_time;
        self.cursor.next_tid = self.cursor.next_tid.wrapping_add(1);
        Step::Next
    }

    fn revoke(&mut self, log: &Log, block: &[u8]) -> Step {
        if !verify_block_tail(&log.format, block) {
            self.need_check_commit_time = true;
        }
        Step::Next
    }
}

// ---------------------------------------------------------------------------
// Passes 2 and 3: revoke and replay.

/// Revoked blocks with the newest tid that revoked each (kernel revoke.c:
/// a record revokes the block in its own transaction and all earlier ones).
#[derive(Default)]
struct RevokeTable {
    newest: HashMap<u64, u32>,
}

impl RevokeTable {
    fn set(&mut self, fs_block: u64, tid: u32) {
        let entry = self.newest.entry(fs_block).or_insert(tid);
        if tid_gt(tid, *entry) {
            *entry = tid;
        }
        debug_assert!(self.is_revoked(fs_block, tid));
    }

    fn is_revoked(&self, fs_block: u64, tid: u32) -> bool {
        self.newest
            .get(&fs_block)
            .is_some_and(|&revoked| !tid_gt(tid, revoked))
    }
}

/// The revoke pass (`replay == false`) or the replay pass, over the
/// transactions the scan accepted.
#[derive(Clone, Copy)]
struct Walk<'l, 'a> {
    log: &'l Log<'a>,
    superblock: &'l JournalSuperblock,
    end_tid: u32,
    replay: bool,
}

impl Walk<'_, '_> {
    fn run(&self, revokes: &mut RevokeTable, report: &mut RecoveryReport) -> PassResult<()> {
        let log = self.log;
        let mut cursor = Cursor::start(self.superblock);
        // A later failure (a bad data block) does not stop the replay.
        let mut deferred: Option<RecoveryProblem> = None;
        for _ in 0..log.max_steps() {
            if tid_geq(cursor.next_tid, self.end_tid) {
                break;
            }
            let index = cursor.take(log);
            let Some(block) = log.read(index)? else {
                return Ok(Err(RecoveryProblem::OutsideJournal { index }));
            };
            let header = match BlockHeader::decode(&block) {
                Some(header) if header.sequence == cursor.next_tid => header,
                _ => break,
            };
            match header.block_type {
                block_type::DESCRIPTOR => {
                    if !verify_block_tail(&log.format, &block) {
                        return Ok(Err(RecoveryProblem::DescriptorChecksum { index }));
                    }
                    if self.replay {
                        let problem =
                            self.replay_descriptor(&mut cursor, &block, revokes, report)?;
                        deferred = deferred.or(problem);
                    } else {
                        cursor.skip(log, descriptor_tags(&log.format, &block).len());
                    }
                }
                block_type::COMMIT => cursor.next_tid = cursor.next_tid.wrapping_add(1),
                block_type::REVOKE if !self.replay => {
                    let Some(records) = revoke_records(&log.format, &block) else {
                        return Ok(Err(RecoveryProblem::RevokeCount { index }));
                    };
                    report.revoke_records += records.len() as u64;
                    for fs_block in records {
                        revokes.set(fs_block, cursor.next_tid);
                    }
                }
                block_type::REVOKE => {}
                _ => break,
            }
        }
        if cursor.next_tid != self.end_tid {
            deferred = deferred.or(Some(RecoveryProblem::PassMismatch {
                ended: cursor.next_tid,
                expected: self.end_tid,
            }));
        }
        Ok(deferred.map_or(Ok(()), Err))
    }

    /// Write home every block the descriptor tags, unless revoked or torn.
    fn replay_descriptor(
        &self,
        cursor: &mut Cursor,
        block: &[u8],
        revokes: &RevokeTable,
        report: &mut RecoveryReport,
    ) -> Result<Option<RecoveryProblem>> {
        let log = self.log;
        let tid = cursor.next_tid;
        let mut problem = None;
        for tag in descriptor_tags(&log.format, block) {
            let index = cursor.take(log);
            let Some(mut data) = log.read(index)? else {
                problem = problem.or(Some(RecoveryProblem::OutsideJournal { index }));
                continue;
            };
            if revokes.is_revoked(tag.fs_block, tid) {
                report.revoked_blocks_skipped += 1;
                continue;
            }
            if !verify_data_block(&log.format, &tag, tid, &data) {
                problem = problem.or(Some(RecoveryProblem::DataChecksum {
                    tid,
                    fs_block: tag.fs_block,
                }));
                continue;
            }
            if tag.is_escaped() {
                unescape(&mut data);
            }
            if !self.write_home(tag.fs_block, &data)? {
                problem = problem.or(Some(RecoveryProblem::HomeOutsideDevice {
                    fs_block: tag.fs_block,
                }));
                continue;
            }
            report.blocks_replayed += 1;
        }
        Ok(problem)
    }

    /// Write a replayed block to its home; false if it lies past the device.
    fn write_home(&self, fs_block: u64, data: &[u8]) -> Result<bool> {
        let area = self.log.area;
        let block_size = area.fs_block_size as u64;
        debug_assert_eq!(data.len() as u64, block_size);
        let fits = fs_block
            .checked_add(1)
            .and_then(|end| end.checked_mul(block_size))
            .is_some_and(|end| end <= area.home_end);
        if fits {
            area.dev.write_at(fs_block * block_size, data)?;
        }
        Ok(fits)
    }
}

/// Look at the fast-commit area: the kernel replays its records only when
/// the first block opens with a HEAD for the tid after the log.
fn find_fast_commits(
    log: &Log,
    expected_tid: u32,
    scanned: bool,
) -> Result<Option<FastCommitArea>> {
    let Some((first_block, end_block)) = log.layout.fast_commit else {
        return Ok(None);
    };
    let has_records = if scanned && first_block < end_block {
        let block = log.area.read_block(first_block as u64)?;
        fast_commit_head_tid(&block) == Some(expected_tid)
    } else {
        false
    };
    Ok(Some(FastCommitArea {
        first_block,
        end_block,
        expected_tid,
        has_records,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn revoke_table_keeps_the_newest_tid_across_wrap() {
        let mut table = RevokeTable::default();
        table.set(10, u32::MAX);
        table.set(10, 1); // 1 follows 0xffffffff
        table.set(10, u32::MAX - 5); // older: ignored
        assert!(table.is_revoked(10, 1));
        assert!(table.is_revoked(10, u32::MAX));
        assert!(
            !table.is_revoked(10, 2),
            "a later transaction still replays"
        );
        assert!(!table.is_revoked(11, 0));
    }
}
