//! The filesystem's side of the journal: finding the journal's blocks
//! through the journal inode, replaying a journal that needs recovery
//! before anything else reads the filesystem, and the needs_recovery flag
//! that tells the kernel and e2fsck to replay after a crash.

use super::inode::read_inode_with;
use super::read_group_descs;
use crate::cache::BufferCache;
use crate::dev::BlockDevice;
use crate::error::{Error, Location, Result};
use crate::format::mapping::{self, Lookup};
use crate::format::superblock::{
    Geometry, SUPERBLOCK_OFFSET, SUPERBLOCK_SIZE, Superblock, incompat,
};
use crate::journal::recovery::{self, JournalArea, RecoveryReport};
use std::sync::Arc;

/// Journal inodes larger than this are refused (the kernel's limit is
/// 2^32 blocks; 10 million blocks is already 40 GiB of journal).
const MAX_JOURNAL_BLOCKS: u64 = 10_000_000;

/// The physical block of every journal block, from the journal inode.
pub(crate) fn journal_blocks(geo: &Geometry, cache: &BufferCache) -> Result<Vec<u64>> {
    let ino = geo.journal_inum;
    let location = Location::Inode { ino };
    let groups = read_group_descs(geo, cache)?;
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

/// The journal as a `JournalArea` on `dev` (a short-lived cache reads the
/// journal inode and its mapping).
pub(crate) fn journal_area(geo: &Geometry, dev: &Arc<dyn BlockDevice>) -> Result<JournalArea> {
    let cache = BufferCache::new(Arc::clone(dev), geo.block_size as usize, 8 << 20);
    let blocks = journal_blocks(geo, &cache)?;
    Ok(JournalArea::new(Arc::clone(dev), geo.block_size, blocks))
}

/// Replay the journal if the superblock says it needs recovery (or the log
/// holds transactions). Returns the report when something was replayed.
pub(crate) fn recover_if_needed(
    geo: &Geometry,
    sb: &Superblock,
    dev: &Arc<dyn BlockDevice>,
) -> Result<Option<RecoveryReport>> {
    let area = journal_area(geo, dev)?;
    if !recovery::needs_recovery(&area)? && !sb.has_incompat(incompat::RECOVER) {
        if sb.has_incompat(incompat::BYTELOG) {
            // A ByteLog flag without needs_recovery: no fast commit of
            // that mount can be pending (both are set in one write at
            // mount); the image is plain ext4.
            tracing::info!("clearing a stale BYTELOG flag");
            recovery::clear_needs_recovery(&**dev)?;
        }
        return Ok(None);
    }
    let report = recovery::recover_with(&area, super::fast_commit::replay)?;
    if let Some(problem) = &report.problem {
        return Err(Error::corrupt(
            Location::Journal { block: 0 },
            format!(
                "journal recovery stopped short ({problem}); the filesystem needs a full e2fsck -f"
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

/// Write the superblock's first 1024 bytes straight to the device and
/// flush (at mount and unmount, when the journal is empty).
pub(crate) fn write_superblock_direct(dev: &dyn BlockDevice, sb: &mut Superblock) -> Result<()> {
    let bytes: &[u8; SUPERBLOCK_SIZE] = sb.encode();
    dev.write_at(SUPERBLOCK_OFFSET, bytes)?;
    dev.flush()?;
    Ok(())
}

/// Open `path` and read what the journal commands need: the device, the
/// superblock and the geometry. Refuses images without an internal journal.
fn open_journaled(
    path: &std::path::Path,
    read_only: bool,
) -> Result<(Arc<dyn BlockDevice>, Superblock, Geometry)> {
    let dev = crate::dev::open_image(path, read_only)?;
    let (sb, geo) = journaled_superblock(&dev).map_err(|error| match error {
        Error::Invalid(detail) => Error::Invalid(format!("{}: {detail}", path.display())),
        error => error,
    })?;
    Ok((dev, sb, geo))
}

/// The superblock of the filesystem on `dev` and its geometry, refusing
/// features jext4 does not know and filesystems without a journal.
fn journaled_superblock(dev: &Arc<dyn BlockDevice>) -> Result<(Superblock, Geometry)> {
    let mut bytes = vec![0u8; SUPERBLOCK_SIZE];
    dev.read_at(SUPERBLOCK_OFFSET, &mut bytes)?;
    let sb = Superblock::decode(&bytes)?;
    sb.check_features()?;
    if !sb.has_compat(crate::format::superblock::compat::HAS_JOURNAL) {
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
    let (sb, geo) = journaled_superblock(dev)?;
    recover_if_needed(&geo, &sb, dev)
}

/// The shape of the log of the filesystem on `dev` (`recovery::log_shape`),
/// read without changing anything.
pub fn journal_shape(dev: &Arc<dyn BlockDevice>) -> Result<recovery::LogShape> {
    let (_, geo) = journaled_superblock(dev)?;
    recovery::log_shape(&journal_area(&geo, dev)?)
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
    let (dev, sb, geo) = open_journaled(path, false)?;
    let Some(journal) = recover_if_needed(&geo, &sb, &dev)? else {
        return Ok(None);
    };
    let orphans_released = has_orphans(&*dev)?;
    if orphans_released {
        let fs = super::Fs::mount(Arc::clone(&dev), super::MountOptions::default())?;
        fs.unmount()?;
        debug_assert!(!has_orphans(&*dev)?, "orphans left after their release");
    }
    Ok(Some(ImageRecovery {
        journal,
        orphans_released,
    }))
}

/// The superblock names orphans: the classic list or the orphan file.
fn has_orphans(dev: &dyn BlockDevice) -> Result<bool> {
    let mut bytes = vec![0u8; SUPERBLOCK_SIZE];
    dev.read_at(SUPERBLOCK_OFFSET, &mut bytes)?;
    let sb = Superblock::decode(&bytes)?;
    Ok(sb.last_orphan != 0
        || sb.has_ro_compat(crate::format::superblock::ro_compat::ORPHAN_PRESENT))
}

/// `jext4 logdump IMAGE`: print the journal superblock and every
/// transaction still in the log.
pub fn logdump_image(path: &std::path::Path, out: &mut dyn std::io::Write) -> Result<()> {
    let (dev, _, geo) = open_journaled(path, true)?;
    let area = journal_area(&geo, &dev)?;
    crate::journal::logdump::logdump(&area, out)
}
