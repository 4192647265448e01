//! The filesystem's side of the journal: finding the journal's blocks
//! through the journal inode, replaying a journal that needs recovery
//! before anything else reads the filesystem, and the needs_recovery flag
//! that tells the kernel and e2fsck to replay after a crash.
//!
//! Recovery is split as the kernel splits it between ext4 and jbd2:
//! `journal::recovery` replays and resets the log (block-level), and this
//! module does what is about the ext4 superblock — whether to recover at
//! all (needs_recovery), where the journal is (its inode, or a device of
//! its own: `journal_dev.rs`), the error state the replay found, and the
//! flags cleared at the end.
//!
//! The order of the writes, each flushed before the next (a crash between
//! any two recovers to the same image):
//! 1. the replay's home blocks (`recovery::replay`), while needs_recovery
//!    holds: a crash replays them again;
//! 2. the error state (ERROR_FS for an aborted journal or a failed commit,
//!    VALID_FS off when recovery stopped short, as e2fsck marks them),
//!    still under needs_recovery, so that it is never lost with the log;
//! 3. the journal reset (`recovery::reset`, s_start = 0): a crash after it
//!    finds needs_recovery with an empty log, which recovers to the same
//!    image;
//! 4. needs_recovery cleared, and BYTELOG with it (its fast commits are
//!    replayed, or were never there: the image is plain ext4 again).
//!
//! When recovery stops short, e2fsck still resets the journal and clears
//! needs_recovery, but leaves the filesystem not clean; so does `jext4
//! recover`. A mount does what the kernel's does instead
//! (`replay_for_mount`): it writes the valid log home, then refuses,
//! leaving the journal and needs_recovery for e2fsck, so that no later
//! mount skips the check.

use super::group::Groups;
use super::inode::read_inode_with;
use super::journal_dev::ExternalJournal;
use crate::cache::BufferCache;
use crate::dev::BlockDevice;
use crate::error::{Error, Location, Result};
use crate::format::mapping::{self, Lookup};
use crate::format::superblock::{self, Geometry, STATE_ERROR, STATE_VALID, Superblock, incompat};
pub(crate) use crate::journal::recovery::JournalArea;
use crate::journal::recovery::{self, FastCommitArea, RecoveryReport};
use std::sync::Arc;

/// Journal inodes larger than this are refused (the kernel's limit is
/// 2^32 blocks; 10 million blocks is already 40 GiB of journal).
const MAX_JOURNAL_BLOCKS: u64 = 10_000_000;

/// The physical block of every journal block, from the journal inode.
pub(crate) fn journal_blocks(geo: &Geometry, cache: &Arc<BufferCache>) -> Result<Vec<u64>> {
    let ino = geo.journal_inum;
    let location = Location::Inode { ino };
    // The journal is what is being found: the zone without it.
    let groups = Groups::load(geo, cache, &[])?;
    let inode = read_inode_with(geo, cache, &groups, ino)?;
    if inode.mode == 0 {
        return Err(Error::corrupt(location, "the journal inode is not in use"));
    }
    let count = inode.size / geo.block_size as u64;
    if count == 0 || count > MAX_JOURNAL_BLOCKS {
        return Err(Error::corrupt(
            location,
            format!("journal of {count} blocks"),
        ));
    }
    let mut blocks = Vec::with_capacity(count as usize);
    let mut lblk = 0;
    while lblk < count {
        match mapping::lookup(geo, cache, ino, &inode, lblk)? {
            Lookup::Mapped(extent) if !extent.unwritten => {
                let run = (extent.len as u64).min(count - lblk);
                blocks.extend((0..run).map(|i| extent.physical + i));
                lblk += run;
            }
            _ => {
                return Err(Error::corrupt(
                    location,
                    format!("the journal has a hole at block {lblk}"),
                ));
            }
        }
    }
    Ok(blocks)
}

/// The journal of a filesystem about to be mounted, its superblock
/// checked: the kernel refuses a mount (read-only too, unless `noload`)
/// whose journal inode or journal superblock does not load ("no valid
/// journal superblock found", "journal checksum error"), and e2fsck -fy
/// repairs it (it clears the journal and makes a new one).
pub(crate) fn checked_journal_area(
    geo: &Geometry,
    dev: &Arc<dyn BlockDevice>,
    external: Option<&ExternalJournal>,
) -> Result<JournalArea> {
    let area =
        journal_area(geo, dev, external).and_then(|area| area.load_superblock().map(|_| area));
    area.map_err(|error| {
        error.map_corrupt_detail(|detail| {
            format!(
                "{detail}: `e2fsck -fy IMAGE` repairs the journal (it makes a new one); \
                 `-o ro,noload` reads the filesystem without it"
            )
        })
    })
}

/// The journal as a `JournalArea`: on `dev` through the journal inode (a
/// short-lived cache reads it and its mapping), or on the external journal
/// device, which a filesystem without a journal inode must be given.
pub(crate) fn journal_area(
    geo: &Geometry,
    dev: &Arc<dyn BlockDevice>,
    external: Option<&ExternalJournal>,
) -> Result<JournalArea> {
    match (geo.journal_inum, external) {
        (0, Some(external)) => return external.area(geo, dev),
        (0, None) => {
            return Err(Error::Unsupported(
                "the journal is on an external device, which was not given: name it with \
                 -o journal_path=PATH (the tools' --journal PATH)"
                    .into(),
            ));
        }
        (ino, Some(_)) => {
            return Err(Error::Invalid(format!(
                "a journal device was given, but the filesystem's journal is inode {ino}"
            )));
        }
        _ => {}
    }
    let cache = Arc::new(BufferCache::new(
        Arc::clone(dev),
        geo.block_size as usize,
        8 << 20,
    ));
    let blocks = journal_blocks(geo, &cache)?;
    Ok(JournalArea::new(Arc::clone(dev), geo.block_size, blocks))
}

/// Replay the journal if the superblock says it needs recovery (or the log
/// holds transactions). Returns the report when something was replayed.
pub(crate) fn recover_if_needed(
    geo: &Geometry,
    sb: &Superblock,
    dev: &Arc<dyn BlockDevice>,
    external: Option<&ExternalJournal>,
) -> Result<Option<RecoveryReport>> {
    let area = journal_area(geo, dev, external)?;
    let at = geo.superblock_offset;
    if !needs_recovery_at(&**dev, at)? && !sb.has_incompat(incompat::RECOVER) {
        if sb.has_incompat(incompat::BYTELOG) {
            // A ByteLog flag without needs_recovery: no fast commit of
            // that mount can be pending (both are set in one write at
            // mount); the image is plain ext4.
            tracing::info!("clearing a stale BYTELOG flag");
            clear_needs_recovery(&**dev, at)?;
        }
        return Ok(None);
    }
    let report = recover_journal_at(&area, at, |area, fast_commit| {
        super::fast_commit::replay(area, fast_commit, at)
    })?;
    if let Some(problem) = &report.problem {
        return Err(Error::corrupt(
            Location::Journal { block: 0 },
            format!(
                "journal recovery stopped short ({problem}); the journal was reset and the \
                 filesystem marked for a full check: `e2fsck -fy IMAGE` repairs it"
            ),
        ));
    }
    tracing::info!(
        transactions = report.transactions_replayed,
        blocks = report.blocks_replayed,
        "journal replayed"
    );
    Ok(Some(report))
}

/// A mount's replay, as the kernel's (`jbd2_journal_recover`, then
/// `jbd2_journal_load`): the valid log is written home; then a log that
/// recovery could not finish (a logged block failing its checksum or past
/// the device) refuses the mount and is left as it is, needs_recovery
/// included, so that every mount refuses it until e2fsck has replayed it
/// and checked the filesystem. (`jext4 recover`, like `e2fsck -E
/// journal_only`, resets such a log instead and marks the filesystem for
/// a full check.) Returns the report when something was replayed.
///
/// A commit block that fails its checksum ends the log instead, its
/// transaction not replayed and the filesystem marked with errors: a
/// power cut while the commit block was written leaves exactly that (a
/// torn block: a new header over old sectors), and after a power cut the
/// image must mount. The kernel's `jbd2_journal_load` refuses such a log
/// ("journal transaction N is corrupt") and leaves it to e2fsck, whose
/// replay also stops there.
pub(crate) fn replay_for_mount(
    geo: &Geometry,
    sb: &Superblock,
    dev: &Arc<dyn BlockDevice>,
    external: Option<&ExternalJournal>,
) -> Result<Option<RecoveryReport>> {
    let area = checked_journal_area(geo, dev, external)?;
    let at = geo.superblock_offset;
    if !sb.has_incompat(incompat::RECOVER) {
        if sb.has_incompat(incompat::BYTELOG) {
            tracing::info!("clearing a stale BYTELOG flag");
            clear_needs_recovery(&**dev, at)?;
        }
        return Ok(None);
    }
    check_journaled(sb)?;
    let replayed = recovery::replay(&area, |area, fast_commit| {
        super::fast_commit::replay(area, fast_commit, at)
    })?;
    if let Some(why) = unfinished(&replayed.report) {
        return Err(Error::corrupt(
            Location::Journal { block: 0 },
            format!(
                "{why}; the journal is kept as it is and no mount can use it: \
                 `e2fsck -fy IMAGE` replays what is valid and repairs the filesystem"
            ),
        ));
    }
    let report = finish_recovery(&area, at, replayed)?;
    tracing::info!(
        transactions = report.transactions_replayed,
        blocks = report.blocks_replayed,
        "journal replayed"
    );
    Ok(Some(report))
}

/// Why this replay could not finish, if it could not.
fn unfinished(report: &RecoveryReport) -> Option<String> {
    report
        .problem
        .as_ref()
        .map(|problem| format!("journal recovery failed: {problem}"))
}

/// Whether the filesystem on `dev` says its journal must be replayed
/// (INCOMPAT_RECOVER in the ext4 superblock).
pub fn needs_recovery(dev: &dyn BlockDevice) -> Result<bool> {
    needs_recovery_at(dev, superblock::SUPERBLOCK_OFFSET)
}

/// `needs_recovery`, of the superblock copy at byte `at` (`sb=`).
fn needs_recovery_at(dev: &dyn BlockDevice, at: u64) -> Result<bool> {
    Ok(superblock::read_at(dev, at)?.has_incompat(incompat::RECOVER))
}

/// Replay the journal in `area` if needs_recovery is set, reset it and
/// clear the flag. Fast commits, if any, are left unreplayed (see
/// `recover_journal_with`).
pub fn recover_journal(area: &JournalArea) -> Result<RecoveryReport> {
    recover_journal_with(area, |_, _| Ok(()))
}

/// `recover_journal`, calling `replay_fast_commits` after the block replay
/// when the fast-commit area holds records for the transaction after the
/// log — and before the journal reset, so a crash during it replays again.
/// The writes go in the order the module's preamble explains.
pub fn recover_journal_with<F>(area: &JournalArea, replay_fast_commits: F) -> Result<RecoveryReport>
where
    F: FnOnce(&JournalArea, &FastCommitArea) -> Result<()>,
{
    recover_journal_at(area, superblock::SUPERBLOCK_OFFSET, replay_fast_commits)
}

/// `recover_journal_with`, for the filesystem whose superblock copy in
/// use is at byte `at` (`sb=`): its flags are the ones read and changed.
fn recover_journal_at<F>(
    area: &JournalArea,
    at: u64,
    replay_fast_commits: F,
) -> Result<RecoveryReport>
where
    F: FnOnce(&JournalArea, &FastCommitArea) -> Result<()>,
{
    let dev = &*area.dev;
    let sb = superblock::read_at(dev, at)?;
    check_journaled(&sb)?;
    if !sb.has_incompat(incompat::RECOVER) {
        return recovery::check_log_empty(area);
    }
    let replayed = recovery::replay(area, replay_fast_commits)?;
    finish_recovery(area, at, replayed)
}

/// After the replay: the error state it found, the journal reset,
/// needs_recovery cleared — in the order the module's preamble explains.
fn finish_recovery(
    area: &JournalArea,
    at: u64,
    replayed: recovery::Replayed,
) -> Result<RecoveryReport> {
    let dev = &*area.dev;
    let (errors, stopped_short) = (replayed.found_errors(), replayed.report.problem.is_some());
    if errors || stopped_short {
        update_superblock(dev, at, |sb| {
            if errors {
                sb.state |= STATE_ERROR;
            }
            if stopped_short {
                sb.state &= !STATE_VALID;
            }
        })?;
    }
    let report = recovery::reset(area, replayed)?;
    clear_needs_recovery(dev, at)?;
    debug_assert!(!needs_recovery_at(dev, at)?);
    Ok(report)
}

/// Turn INCOMPAT_RECOVER and BYTELOG off in the superblock copy at byte
/// `at` (the primary, or the `sb=` backup mounted) and flush. Recovery
/// runs before any buffer cache exists, so this writes through the device.
fn clear_needs_recovery(dev: &dyn BlockDevice, at: u64) -> Result<()> {
    update_superblock(dev, at, |sb| {
        sb.feature_incompat &= !(incompat::RECOVER | incompat::BYTELOG);
    })
}

/// Read, change, write and flush the superblock copy at byte `at`.
fn update_superblock(
    dev: &dyn BlockDevice,
    at: u64,
    change: impl FnOnce(&mut Superblock),
) -> Result<()> {
    let mut sb = superblock::read_at(dev, at)?;
    change(&mut sb);
    superblock::write_to(dev, &mut sb)
}

/// Recovery replays the journal of a filesystem that has one.
fn check_journaled(sb: &Superblock) -> Result<()> {
    if sb.has_incompat(incompat::JOURNAL_DEV) {
        return Err(Error::Unsupported(
            "this is an external journal device, not a filesystem".into(),
        ));
    }
    if !sb.has_compat(superblock::compat::HAS_JOURNAL) {
        return Err(Error::Invalid("the filesystem has no journal".into()));
    }
    super::journal_dev::check_unambiguous(sb)
}

/// What the journal commands work on.
struct Journaled {
    dev: Arc<dyn BlockDevice>,
    sb: Superblock,
    geo: Geometry,
    /// The journal's device, for a journal of its own.
    external: Option<ExternalJournal>,
}

/// Open `path` and read what the journal commands need: the device, the
/// superblock, the geometry and, for a journal of its own, the journal
/// device (`journal_path`, or found as `journal_dev.rs` finds it). Refuses
/// images without a journal.
fn open_journaled(
    path: &std::path::Path,
    read_only: bool,
    sb: u64,
    journal_path: Option<&std::path::Path>,
) -> Result<Journaled> {
    let dev = crate::dev::open_image(path, read_only)?;
    let (sb, geo) = journaled_superblock_at(&dev, superblock_offset(sb)?)?;
    let external = ExternalJournal::find(&sb, journal_path, read_only)?;
    Ok(Journaled {
        dev,
        sb,
        geo,
        external,
    })
}

/// The byte offset of the superblock copy `sb` names (1 KiB units, as the
/// mount option), checked as the mount checks it.
fn superblock_offset(sb: u64) -> Result<u64> {
    let options = super::MountOptions {
        sb,
        ..super::MountOptions::default()
    };
    options.validate()?;
    Ok(options.superblock_offset())
}

/// The superblock of the filesystem on `dev` and its geometry, refusing
/// features jext4 does not know and filesystems without a journal.
fn journaled_superblock(dev: &Arc<dyn BlockDevice>) -> Result<(Superblock, Geometry)> {
    journaled_superblock_at(dev, superblock::SUPERBLOCK_OFFSET)
}

/// `journaled_superblock`, of the superblock copy at byte `offset`.
fn journaled_superblock_at(
    dev: &Arc<dyn BlockDevice>,
    offset: u64,
) -> Result<(Superblock, Geometry)> {
    let sb = superblock::read_at(&**dev, offset)?;
    let (at, uuid) = sb.identity();
    dev.expect_identity(at, &uuid);
    sb.check_features()?;
    if !sb.has_compat(superblock::compat::HAS_JOURNAL) {
        return Err(Error::Invalid("the filesystem has no journal".into()));
    }
    let geo = Geometry::from_superblock(&sb);
    Ok((sb, geo))
}

/// Replay the journal of the filesystem on `dev` in place if it needs it:
/// the block replay, then the fast commits. What `jext4 recover` and a
/// mount do, on any device. Returns the report, or None when the journal
/// needed nothing.
pub fn recover_device(dev: &Arc<dyn BlockDevice>) -> Result<Option<RecoveryReport>> {
    recover_device_with(dev, None)
}

/// `recover_device`, the journal on `journal` when it is external.
pub fn recover_device_with(
    dev: &Arc<dyn BlockDevice>,
    journal: Option<&Arc<dyn BlockDevice>>,
) -> Result<Option<RecoveryReport>> {
    let (sb, geo) = journaled_superblock(dev)?;
    let external = given_journal(&sb, journal)?;
    recover_if_needed(&geo, &sb, dev, external.as_ref())
}

/// The shape of the log of the filesystem on `dev` (`recovery::log_shape`),
/// read without changing anything; the journal on `journal` when it is
/// external.
pub fn journal_shape(
    dev: &Arc<dyn BlockDevice>,
    journal: Option<&Arc<dyn BlockDevice>>,
) -> Result<recovery::LogShape> {
    let (sb, geo) = journaled_superblock(dev)?;
    let external = given_journal(&sb, journal)?;
    recovery::log_shape(&journal_area(&geo, dev, external.as_ref())?)
}

/// A journal device given as a device, checked against `sb`.
pub(crate) fn given_journal(
    sb: &Superblock,
    journal: Option<&Arc<dyn BlockDevice>>,
) -> Result<Option<ExternalJournal>> {
    journal
        .map(|dev| ExternalJournal::from_device(sb, Arc::clone(dev)))
        .transpose()
}

/// What `recover_image` did.
#[derive(Debug)]
pub struct ImageRecovery {
    pub journal: RecoveryReport,
    /// The crash left orphan inodes (files being deleted or truncated in
    /// several transactions, files unlinked while open), now released.
    pub orphans_released: bool,
}

/// `jext4 recover IMAGE`: replay the journal in place without mounting,
/// like `e2fsck -E journal_only`, and like it release the orphan inodes
/// the crash left: on the orphan list they are inodes without links that
/// `e2fsck -fn` reports ("deleted inode has zero dtime", bitmap
/// differences) and that the kernel or e2fsck -p would free anyway.
/// Releasing them mounts the recovered filesystem once through the engine
/// (journaled, like any change) and unmounts it. Returns None when the
/// journal needed nothing.
pub fn recover_image(path: &std::path::Path) -> Result<Option<ImageRecovery>> {
    recover_image_from(path, superblock::PRIMARY_SB_OPTION, None)
}

/// `recover_image` working from the superblock copy `sb_option` names, in 1 KiB
/// units as the mount option `sb=` (`jext4 recover --sb N`), with the
/// external journal at `journal_path` (`--journal PATH`) if given.
pub fn recover_image_from(
    path: &std::path::Path,
    sb_option: u64,
    journal_path: Option<&std::path::Path>,
) -> Result<Option<ImageRecovery>> {
    let Journaled {
        dev,
        sb,
        geo,
        external,
    } = open_journaled(path, false, sb_option, journal_path)?;
    // Replay writes: with `mmp`, only once nobody else uses the filesystem
    // (as e2fsck claims it). Released before the orphans' mount claims it.
    let protection = match sb.has_incompat(incompat::MMP) {
        true => {
            let name = path.file_name().unwrap_or(path.as_os_str());
            Some(super::mmp::claim(&dev, &sb, &geo, &name.to_string_lossy())?)
        }
        false => None,
    };
    let replayed = recover_if_needed(&geo, &sb, &dev, external.as_ref());
    if let Some(protection) = protection {
        protection.stop()?;
    }
    let Some(journal) = replayed? else {
        return Ok(None);
    };
    let at = geo.superblock_offset;
    let orphans_released = has_orphans(&*dev, at)?;
    if orphans_released {
        let options = super::MountOptions {
            sb: sb_option,
            ..super::MountOptions::default()
        };
        let journal = external
            .as_ref()
            .map(|external| Arc::clone(external.device()));
        let fs = super::Fs::mount_with_journal(Arc::clone(&dev), journal, options)?;
        fs.unmount()?;
        debug_assert!(!has_orphans(&*dev, at)?, "orphans left after their release");
    }
    Ok(Some(ImageRecovery {
        journal,
        orphans_released,
    }))
}

/// The superblock names orphans: the classic list or the orphan file.
fn has_orphans(dev: &dyn BlockDevice, at: u64) -> Result<bool> {
    let sb = superblock::read_at(dev, at)?;
    Ok(sb.last_orphan != 0 || sb.has_ro_compat(superblock::ro_compat::ORPHAN_PRESENT))
}

/// `jext4 stats IMAGE` of an image that is not mounted (a file, a block
/// device or an NBD URI): what its superblocks say, as `name value`
/// lines like a live mount's report. Reads only; works on images that
/// need recovery, have errors recorded or use features jext4 cannot
/// mount, which is when one wants to know.
pub fn image_stats(path: &std::path::Path) -> Result<String> {
    image_stats_from(path, superblock::PRIMARY_SB_OPTION)
}

/// `image_stats` of the superblock copy `sb` names (`jext4 stats --sb N`).
pub fn image_stats_from(path: &std::path::Path, sb: u64) -> Result<String> {
    let dev = crate::dev::open_image(path, true)?;
    let sb = crate::format::superblock::read_at(&*dev, superblock_offset(sb)?)?;
    let geo = Geometry::from_superblock(&sb);
    use crate::format::superblock::{STATE_ERROR, STATE_VALID, compat, incompat};
    let mut lines = vec![
        format!("block_size {}", geo.block_size),
        format!("blocks_total {}", sb.blocks_count),
        format!("blocks_free {}", sb.free_blocks_count),
        format!("blocks_reserved {}", sb.reserved_blocks_count),
        format!("inodes_total {}", sb.inodes_count),
        format!("inodes_free {}", sb.free_inodes_count),
        format!("clean {}", sb.state & STATE_VALID != 0),
        format!("errors_detected {}", sb.state & STATE_ERROR != 0),
        format!("needs_recovery {}", sb.has_incompat(incompat::RECOVER)),
        format!("mount_count {}", sb.mount_count),
        format!("last_mount_time {}", sb.mount_time),
        format!("last_write_time {}", sb.write_time),
        format!("journaled {}", sb.has_compat(compat::HAS_JOURNAL)),
        format!("journal_external {}", super::journal_dev::is_external(&sb)),
    ];
    // The journal's own superblock, when jext4 can find the journal (an
    // internal one, or an external one it finds, on a filesystem whose
    // features it knows).
    let external = match super::journal_dev::is_external(&sb) {
        true => ExternalJournal::find(&sb, None, true).ok().flatten(),
        false => None,
    };
    let found = !super::journal_dev::is_external(&sb) || external.is_some();
    if sb.has_compat(compat::HAS_JOURNAL) && sb.check_features().is_ok() && found {
        let area = journal_area(&geo, &dev, external.as_ref())?;
        let journal =
            crate::journal::format::JournalSuperblock::decode(&area.read_superblock_block()?)?;
        lines.extend([
            format!("journal_blocks {}", journal.max_len),
            format!("journal_fast_commit_blocks {}", journal.num_fc_blocks),
            format!("journal_sequence {}", journal.sequence),
            format!("journal_empty {}", journal.start == 0),
            format!("journal_errno {}", journal.errno),
        ]);
    }
    // Last: free text.
    lines.push(format!("features {}", sb.feature_list().join(" ")));
    Ok(lines.join("\n") + "\n")
}

/// `jext4 logdump IMAGE`: print the journal superblock and every
/// transaction still in the log.
pub fn logdump_image(path: &std::path::Path, out: &mut dyn std::io::Write) -> Result<()> {
    logdump_image_from(path, superblock::PRIMARY_SB_OPTION, None, out)
}

/// `logdump_image` through the superblock copy `sb` names (`jext4
/// logdump --sb N`), with the external journal at `journal_path`
/// (`--journal PATH`) if given.
pub fn logdump_image_from(
    path: &std::path::Path,
    sb: u64,
    journal_path: Option<&std::path::Path>,
    out: &mut dyn std::io::Write,
) -> Result<()> {
    let Journaled {
        dev, geo, external, ..
    } = open_journaled(path, true, sb, journal_path)?;
    let area = journal_area(&geo, &dev, external.as_ref())?;
    crate::journal::logdump::logdump(&area, out)
}
