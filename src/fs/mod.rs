//! Filesystem operations: the engine behind both front ends.
//!
//! `Fs` is `Send + Sync`; every public operation is a method taking `&self`.
//!
//! Locks: the ranking in `crate::lock` (written once, checked in debug
//! builds), and no lock over the whole filesystem. A journal handle is
//! started before any filesystem lock is taken. An operation takes the
//! inode locks of what it reads or changes (`inode_lock.rs`): a namespace
//! change its directory's exclusive, then the inodes named; a lookup or
//! readdir the directory's shared; file data, truncate, setattr and
//! xattrs the inode's; a cross-directory rename the rename lock first.
//! getattr takes none. Each block group's descriptor has its own lock
//! (`group.rs`), the orphan records theirs (`orphan.rs`), the
//! superblock's fields theirs (`sb_info.rs`), and the free totals are
//! counters written into the superblock at each commit. `open_files` and
//! the fast-commit tracker's lock are leaves. File data is read and
//! written on the device under the file's own inode lock and no other.
//!
//! A mutating operation runs inside `Fs::transact`, which gives it a
//! `Tx`: the shared core and the handle. A descriptor is written back
//! when its group's lock is released; the superblock when an operation
//! changes one of its fields, and at every commit for the counts.

mod acl;
mod alloc;
mod budget;
mod caller;
mod data_journal;
mod delalloc;
mod dirops;
mod fast_commit;
mod file;
mod fileattr;
mod group;
mod iflags;
mod inline;
mod inode;
mod inode_lock;
mod journal;
mod journal_dev;
mod mmp;
mod namei;
mod orphan;
mod prealloc;
mod quota;
mod sb_info;
mod system_zone;
mod verity;
pub mod walk;
mod xattr;

pub use crate::format::xattr::SetMode as XattrMode;
pub use caller::Caller;
pub use dirops::Dentry;
pub use file::{
    FALLOC_FL_KEEP_SIZE, FALLOC_FL_PUNCH_HOLE, FALLOC_FL_ZERO_RANGE, SeekWhence, Written,
};
pub use inode::{Attr, FileKind, SetAttr, TimeSet};
pub use journal::{
    ImageRecovery, image_stats, image_stats_from, journal_shape, logdump_image, logdump_image_from,
    needs_recovery, recover_device, recover_device_with, recover_image, recover_image_from,
    recover_journal, recover_journal_with,
};
pub use namei::RenameFlags;
pub use quota::{QuotaLimits, QuotaReport};

use crate::cache::BufferCache;
use crate::dev::BlockDevice;
use crate::dev::Claim;
use crate::dev::guard::GuardedDevice;
use crate::error::{Error, Location, Result};
use crate::format;
use crate::format::superblock::{self, Geometry, STATE_ERROR, STATE_VALID, Superblock};
use crate::hash::{NumberMap, NumberSet};
use crate::journal::change::Ineligible;
use crate::journal::{CommitHook, Handle, Jbd2Options, Journal, JournalConfig};
use crate::lock::Rank;
pub use alloc::AllocStats;
use budget::Budget;
pub use budget::BudgetStats;
pub use delalloc::DelallocStats;
pub use fast_commit::{ConflictStats, FastCommitStats};
use group::Groups;
use inode_lock::{InodeGuard, InodeLocks};
use orphan::Orphans;
use parking_lot::Mutex;
use sb_info::SbInfo;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::Duration;
pub use verity::VerityParams;

/// Mount options understood by the engine (the CLI parses `-o` into this).
#[derive(Debug, Clone)]
pub struct MountOptions {
    pub read_only: bool,
    /// Bound on the metadata buffer cache, in bytes.
    pub cache_size: u64,
    /// Seconds between background commits / write-back passes.
    pub commit_interval: Duration,
    /// Every operation is durable when it returns (`-o sync`).
    pub sync: bool,
    /// Directory operations are durable when they return (`-o dirsync`).
    pub dirsync: bool,
    /// Access-time policy.
    pub atime: AtimePolicy,
    /// Directories' atime is never updated (`-o nodiratime`); files'
    /// follows `atime`.
    pub nodiratime: bool,
    /// Do not load (or replay) the journal: read-only, possibly
    /// inconsistent (`-o noload` / `norecovery`).
    pub noload: bool,
    /// Commit blocks carry a checksum and the flush before them is skipped
    /// (`-o journal_async_commit`).
    pub journal_async_commit: bool,
    /// fsync writes fast commits on images with the fast_commit feature:
    /// `None` (the default) where the image has it, `Some(false)` never
    /// (`-o fast_commit=off`), `Some(true)` required (`-o fast_commit`).
    pub fast_commit: Option<bool>,
    /// One transaction scope for the whole filesystem (`-o
    /// fast_commit=global`, the kernel's single fast-commit queue): an
    /// fsync commits every directory's changes. The default is one per
    /// directory (DESIGN §2, tier 3).
    pub fast_commit_global: bool,
    /// Fast commits go through a persistent-memory mapping of the journal's
    /// fast-commit area (ByteLog, `-o bytelog`); the image carries the
    /// BYTELOG incompat flag until a clean unmount.
    pub bytelog: bool,
    /// Charge allocations to the space budget (`budget.rs`). Off only to
    /// measure what it costs (`JEXT4_SPACE_BUDGET=off` in the server's
    /// environment): operations then find out they are out of space when
    /// an allocation fails, part-way.
    pub space_budget: bool,
    /// Quota limits enforced, by type (user, group, project: `-o usrquota`
    /// or `quota`, `grpquota`, `prjquota`), as the kernel enforces them
    /// only when mounted with these; usage is kept whatever they say.
    pub quota_limits: [bool; 3],
    /// Delayed allocation (`-o delalloc`, `delalloc.rs`): writes into
    /// holes and past the end are held in memory and given blocks when
    /// written out. Off by default; it needs the space budget.
    pub delalloc: bool,
    /// Journal file data (`data_journal.rs`): `Some(true)` for `-o
    /// data=journal`, `Some(false)` for `data=ordered` or `writeback`,
    /// `None` (the default) for what the superblock's default mount
    /// options say (`tune2fs -o journal_data`), as the kernel decides it.
    /// Settled to `Some` at mount.
    pub data_journal: Option<bool>,
    /// A read-write open of an image with a feature jext4 only reads
    /// (btree_dir, snapshot, shared_blocks: read-only compatible) is made read-only
    /// with a warning instead of refused. The image tools set it: `ls` or
    /// `cp` out of such an image need no `-o ro`, and a verb that writes
    /// gets EROFS. A mount keeps the kernel's refusal.
    pub read_only_fallback: bool,
    /// Where the superblock is read from and written to, in 1 KiB units
    /// whatever the block size (`-o sb=N`, the kernel's `s_sb_block`): 1,
    /// the primary, by default; a backup's (block × block size / 1024) to
    /// mount from it, the group descriptors then read from the table after
    /// it.
    pub sb: u64,
    /// The external journal's device (`-o journal_path=PATH`, the
    /// kernel's option), for a filesystem whose journal is on a device of
    /// its own; without it the device is looked for by the number and the
    /// UUID the superblock records (`journal_dev.rs`).
    pub journal_path: Option<std::path::PathBuf>,
}

/// The largest `sb=`: the kernel parses it as a u32 (`fsparam_u32`).
pub const SB_OPTION_MAX: u64 = u32::MAX as u64;

/// The longest commit interval: the kernel refuses `commit=` above
/// INT_MAX / HZ seconds (fs/ext4/super.c), with HZ = 250 as Debian builds
/// its kernels. Longer intervals would overflow the commit thread's clock.
pub const COMMIT_INTERVAL_MAX: Duration = Duration::from_secs(i32::MAX as u64 / 250);

/// The smallest metadata cache worth running with.
pub const CACHE_SIZE_MIN: u64 = 1 << 20;

impl MountOptions {
    /// Refuse values the engine cannot run with (the command line refuses
    /// them by name first; a library caller gets the same check).
    pub fn validate(&self) -> Result<()> {
        if self.commit_interval.is_zero() || self.commit_interval > COMMIT_INTERVAL_MAX {
            return Err(Error::Invalid(format!(
                "commit interval {:?}: must be between 1 and {} seconds",
                self.commit_interval,
                COMMIT_INTERVAL_MAX.as_secs()
            )));
        }
        if self.cache_size < CACHE_SIZE_MIN {
            return Err(Error::Invalid(format!(
                "cache size {} bytes: must be at least 1M",
                self.cache_size
            )));
        }
        if self.sb == 0 || self.sb > SB_OPTION_MAX {
            return Err(Error::Invalid(format!(
                "sb={}: must be between 1 (the primary superblock) and {SB_OPTION_MAX}; the \
                 unit is 1 KiB (sb=0 is the boot block)",
                self.sb
            )));
        }
        Ok(())
    }

    /// The byte offset of the superblock copy `sb` names.
    pub fn superblock_offset(&self) -> u64 {
        self.sb * superblock::SB_OPTION_UNIT
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AtimePolicy {
    /// Update atime only when it is older than mtime/ctime or a day old.
    Relatime,
    Strict,
    Never,
}

impl Default for MountOptions {
    fn default() -> Self {
        MountOptions {
            read_only: false,
            cache_size: 256 << 20,
            commit_interval: Duration::from_secs(5),
            sync: false,
            dirsync: false,
            atime: AtimePolicy::Relatime,
            nodiratime: false,
            noload: false,
            journal_async_commit: false,
            fast_commit: None,
            fast_commit_global: false,
            bytelog: false,
            space_budget: true,
            quota_limits: [false; 3],
            delalloc: false,
            data_journal: None,
            read_only_fallback: false,
            sb: superblock::PRIMARY_SB_OPTION,
            journal_path: None,
        }
    }
}

/// What every operation shares: the fixed shape of the filesystem, the
/// cache and journal, and the state that has locks of its own.
pub(crate) struct Core {
    pub geo: Geometry,
    pub cache: Arc<BufferCache>,
    /// The device itself, beneath the write-ahead guard: for the one write
    /// no transaction may carry, the error record after an abort
    /// (`Fs::record_error`), and for `Fault::DataJournalWrittenHome`.
    pub home: Arc<dyn BlockDevice>,
    pub journal: Arc<Journal>,
    pub options: MountOptions,
    /// Blocks reserved for root (s_r_blocks_count).
    pub reserved_blocks: u64,
    /// The emergency reserve: blocks only operations that free space may
    /// allocate (`Tx::draws_on_emergency_reserve`). Sized as the kernel's
    /// `s_resv_clusters` (ext4_calculate_resv_clusters: 2 % of the volume,
    /// at most 4,096 clusters) and reported by statfs as the kernel
    /// reports it: in f_bfree, not in f_bavail.
    pub emergency_reserve: u64,
    pub resuid: u32,
    pub resgid: u32,
    /// Blocks that never hold file data (group metadata, the journal):
    /// what statfs leaves out of the total, as the kernel does.
    pub overhead_blocks: u64,
    /// The superblock [Superblock] and the free totals (counters).
    pub sbi: Arc<SbInfo>,
    /// The block groups, each under its own lock [Group].
    pub groups: Groups,
    /// Round-robin start for spreading top-level directories (Orlov).
    pub next_topdir_group: AtomicU32,
    /// Rotates inode generations.
    pub next_generation: AtomicU32,
    /// The transactions holding each inode's latest changes (fsync).
    pub inode_tids: Mutex<inode::InodeTidMap>,
    /// Inodes whose last link is gone while a file handle keeps them:
    /// recorded as orphans on disk, freed at their last release. An inode
    /// with no links that is not here is gone, whatever a stale handle
    /// says (a leaf lock).
    pub open_orphans: Mutex<NumberSet<u32>>,
    /// The inodes on the on-disk orphan records [Orphan].
    pub orphans: Orphans,
    /// One lock per inode in use [Directory, Inode].
    pub inodes: InodeLocks,
    /// [Rename] Held by cross-directory renames: no directory changes
    /// parent meanwhile (the kernel's `s_vfs_rename_mutex`).
    pub rename_lock: crate::lock::Mutex<()>,
    /// What the next fast commit records, when this mount writes them.
    pub fast_commit: Option<Arc<fast_commit::Tracker>>,
    /// Inode numbers a front end still names (the FUSE kernel's lookup
    /// counts): the allocator does not hand them out again while named,
    /// or a stale name would reach a new, unrelated file (a leaf lock).
    pub remembered: Mutex<NumberMap<u32, u64>>,
    /// EA inodes by the hash of their value, for equal values to share
    /// one (a leaf lock).
    pub ea_inodes: xattr::EaInodeCache,
    /// Files fs-verity is being enabled on: writes to them are refused
    /// meanwhile (the kernel's deny_write_access; a leaf lock).
    pub verity_enabling: Mutex<NumberSet<u32>>,
    /// Files whose JOURNAL_DATA flag was cleared in this mount while it
    /// journaled their data (`data_journal.rs`): logged copies of their
    /// blocks may still await the checkpoint, so they stay journaled
    /// until the next mount (a leaf lock).
    pub journaled_until_remount: data_journal::UntilRemount,
    /// Verity files' descriptors read lately (a leaf lock).
    pub verity_descriptors: verity::Descriptors,
    /// The quota files and their state (`quota.rs`).
    pub quotas: quota::Quotas,
    /// What block allocation did (`jext4 stats`).
    pub alloc_counters: alloc::AllocCounters,
    /// Files' preallocation windows (a leaf lock; their blocks are masked
    /// in their groups, under the group locks).
    pub windows: prealloc::Windows,
    /// File data held by delayed allocation (a leaf lock).
    pub delayed: delalloc::Delayed,
    /// Directories whose htree index this mount found damaged: their
    /// lookups and listings read the leaves linearly, as the kernel does
    /// once dx_probe fails (`ERR_BAD_DX_DIR`), and names are not added
    /// through the index (a leaf lock).
    /// With each, where its names lie once a lookup worked it out
    /// (`htree::LeafRanges`, at most `LEAF_RANGES_KEPT_MAX` leaves in all).
    pub damaged_indexes: Mutex<NumberMap<u32, Option<Arc<crate::format::htree::LeafRanges>>>>,
    /// Directories whose listings left something out (a damaged entry or
    /// leaf, a name with '/'): their listings end with an error (a leaf
    /// lock).
    pub incomplete_listings: Mutex<NumberSet<u32>>,
}

/// The newest transaction that changed an inode at all (`sync`, for
/// fsync), and the newest that changed what reading its data depends on —
/// size, block map, existence (`datasync`, for fdatasync).
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct InodeTids {
    pub sync: u32,
    pub datasync: u32,
}

impl Core {
    /// Map logical block `lblk` of inode `ino` (`mapping::lookup`), and
    /// refuse a mapping into the system zone — group metadata or the
    /// journal, which only the journal inode maps — as the kernel's
    /// `check_block_validity` does: reading, writing or freeing such a
    /// block would read or overwrite the filesystem's own structures.
    pub fn lookup(
        &self,
        ino: u32,
        inode: &format::inode::Inode,
        lblk: u64,
    ) -> Result<format::mapping::Lookup> {
        let found = format::mapping::lookup(&self.geo, &self.cache, ino, inode, lblk)?;
        if let format::mapping::Lookup::Mapped(extent) = &found {
            let end = extent.physical.saturating_add(extent.len as u64);
            if ino != self.geo.journal_inum
                && let Some(block) = self.groups.first_system_block(extent.physical, end)
            {
                return Err(Error::corrupt(
                    Location::Inode { ino },
                    format!(
                        "lblock {lblk} mapped to illegal pblock {} (length {}): block {block} \
                         holds filesystem metadata",
                        extent.physical, extent.len
                    ),
                ));
            }
        }
        Ok(found)
    }
}

impl Core {
    /// The engine's shared state for the filesystem whose superblock is
    /// `sb` and whose descriptors are `groups`, over `cache` and
    /// `journal` (`Core::open` has built them). The free totals start as the
    /// descriptors' sums, as the kernel's (ext4_percpu_param_init): the
    /// superblock's are only a summary, and a damaged one would otherwise
    /// overflow when blocks or inodes are freed.
    fn assemble(
        mut sb: Superblock,
        groups: Groups,
        cache: Arc<BufferCache>,
        home: Arc<dyn BlockDevice>,
        journal: Arc<Journal>,
        options: MountOptions,
    ) -> Result<Core> {
        let geo = Geometry::from_superblock(&sb);
        let (free_blocks, free_inodes) = groups.free_totals();
        sb.free_blocks_count = free_blocks;
        sb.free_inodes_count = free_inodes as u32;
        let generation_seed = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .subsec_nanos();
        let reserved_blocks = sb.reserved_blocks_count;
        let emergency_reserve = emergency_reserve_blocks(&geo);
        // The budget counts clusters, as the free counts do (the kernel's
        // ext4_has_free_clusters turns s_r_blocks_count into clusters).
        let ratio = geo.cluster_ratio as u64;
        let mut budget = Budget::new(
            free_blocks,
            journal.is_journaled(),
            reserved_blocks / ratio,
            emergency_reserve / ratio,
        );
        if !options.space_budget {
            budget = budget.disabled();
        }
        let core = Core {
            overhead_blocks: overhead_blocks(&geo, &sb, &groups),
            reserved_blocks,
            emergency_reserve,
            resuid: sb.def_resuid as u32,
            resgid: sb.def_resgid as u32,
            sbi: SbInfo::new(&geo, sb, &cache, budget)?,
            groups,
            next_topdir_group: AtomicU32::new(generation_seed % geo.group_count.max(1)),
            next_generation: AtomicU32::new(generation_seed),
            inode_tids: Mutex::new(inode::InodeTidMap::default()),
            open_orphans: Mutex::new(NumberSet::default()),
            remembered: Mutex::new(NumberMap::default()),
            ea_inodes: xattr::EaInodeCache::default(),
            verity_enabling: Mutex::new(NumberSet::default()),
            journaled_until_remount: data_journal::UntilRemount::default(),
            verity_descriptors: verity::Descriptors::default(),
            quotas: quota::Quotas::new(&geo, options.quota_limits)?,
            alloc_counters: alloc::AllocCounters::default(),
            windows: prealloc::Windows::default(),
            delayed: delalloc::Delayed::new(
                options.delalloc,
                geo.block_size,
                delalloc_limit(&options),
            ),
            orphans: Orphans::new(),
            damaged_indexes: Mutex::new(NumberMap::default()),
            incomplete_listings: Mutex::new(NumberSet::default()),
            inodes: InodeLocks::new(),
            rename_lock: crate::lock::Mutex::new(Rank::Rename, ()),
            fast_commit: fast_commit::Tracker::attach(&geo, &journal, options.fast_commit_global),
            geo,
            cache,
            home,
            journal,
            options,
        };
        core.journal
            .set_commit_hook(Arc::clone(&core.sbi) as Arc<dyn CommitHook>);
        Ok(core)
    }

    pub fn dev(&self) -> &Arc<dyn BlockDevice> {
        self.cache.device()
    }

    /// Record corruption `error` in the superblock's error fields, which
    /// go to disk with the next commit (what `dumpe2fs` shows; e2fsck then
    /// checks the filesystem whatever its mount count). Returns the record.
    pub(crate) fn record_error(&self, error: &Error) -> Option<superblock::ErrorRecord<'static>> {
        let Error::Corrupt {
            location, origin, ..
        } = error
        else {
            return None;
        };
        let (ino, block) = location.ino_and_block();
        let function = origin.file().strip_prefix("src/").unwrap_or(origin.file());
        let record = superblock::ErrorRecord {
            time: inode::now_seconds(),
            ino,
            block,
            function,
            line: origin.line(),
            errcode: superblock::error_code(error.errno()),
        };
        self.sbi.lock().record_error(&record);
        Some(record)
    }
}

/// The journal a mount writes through: its blocks, and whether fast
/// commits follow them.
struct JournalPlan {
    area: journal::JournalArea,
    fast_commit: bool,
}

impl Core {
    /// The engine over `dev` — write-ahead guard, cache, block groups,
    /// journal, shared state — whether for a mount or for the unmounted
    /// engine of fast-commit replay: the one path both take. With `plan`
    /// the changes go through a JBD2 journal in its area; without, straight
    /// to `dev` (write-back: an unjournaled image, `noload`, read-only, or
    /// work inside recovery). The internal journal's blocks join the
    /// system zone: `plan`'s, or without one `unloaded_journal` (a
    /// read-only or noload mount; empty: none, or unknown).
    fn open(
        mut sb: Superblock,
        dev: &Arc<dyn BlockDevice>,
        options: MountOptions,
        plan: Option<JournalPlan>,
        unloaded_journal: &[u64],
    ) -> Result<Core> {
        let geo = Geometry::from_superblock(&sb);
        let guard = plan
            .as_ref()
            .map(|_| Arc::new(GuardedDevice::new(Arc::clone(dev), geo.block_size)));
        let cache_device: Arc<dyn BlockDevice> = match &guard {
            Some(guard) => Arc::clone(guard) as Arc<dyn BlockDevice>,
            None => Arc::clone(dev),
        };
        let cache = Arc::new(BufferCache::new(
            cache_device,
            geo.block_size as usize,
            options.cache_size - delalloc_limit(&options),
        ));
        let journal_blocks = plan
            .as_ref()
            .map_or(unloaded_journal, |plan| plan.area.blocks_in_filesystem());
        let groups = Groups::load(&geo, &cache, journal_blocks)?;
        for (group, what) in groups.overlaps() {
            tracing::error!("group {group} is not allocated from: {what}");
        }
        let config = JournalConfig {
            commit_interval: options.commit_interval,
            sync_all: options.sync,
        };
        let journal = match plan.zip(guard) {
            Some((plan, guard)) => {
                announce_journal(&mut sb, dev, &groups, &options)?;
                let jbd2_options = Jbd2Options {
                    commit_interval: options.commit_interval,
                    async_commit: options.journal_async_commit,
                    fs_64bit: geo.has_incompat(superblock::incompat::BIT64),
                    metadata_csum: geo.metadata_csum,
                    fast_commit: plan.fast_commit,
                    bytelog: options.bytelog,
                };
                let cache = Arc::clone(&cache);
                Journal::jbd2(cache, plan.area, guard, config, &jbd2_options)?
            }
            None => Journal::write_back(Arc::clone(&cache), config, options.read_only),
        };
        Core::assemble(sb, groups, cache, Arc::clone(dev), journal, options)
    }
}

/// Write the superblock that says a journaled mount is in use, before any
/// commit: with needs_recovery clear the kernel wipes the log instead of
/// replaying it, and with BYTELOG clear it would not look in the ring for
/// the fast commits about to go there.
fn announce_journal(
    sb: &mut Superblock,
    dev: &Arc<dyn BlockDevice>,
    groups: &Groups,
    options: &MountOptions,
) -> Result<()> {
    sb.feature_incompat |= superblock::incompat::RECOVER;
    if options.bytelog {
        sb.feature_incompat |= superblock::incompat::BYTELOG;
    }
    let (free_clusters, free_inodes) = groups.free_totals();
    sb.free_blocks_count = free_clusters * sb.cluster_ratio() as u64;
    sb.free_inodes_count = free_inodes as u32;
    superblock::write_to(&**dev, sb)
}

/// Settle what the mount options leave to the filesystem: refuse a
/// read-write mount of features jext4 only reads, turn a read-only device
/// or `noload` of a journal into a read-only mount, delayed allocation
/// only with the space budget. Returns whether fast commits are written.
/// A mount asked read-write of a feature jext4 only reads is made
/// read-only (`options.read_only` set, `forced_read_only` too): it still
/// replays the journal first, as the read-write mount would have.
fn settle_options(
    sb: &Superblock,
    dev: &dyn BlockDevice,
    options: &mut MountOptions,
    forced_read_only: &mut Option<String>,
) -> Result<bool> {
    let read_write_allowed = sb.check_features()?;
    *forced_read_only = None;
    if !options.read_only && !read_write_allowed && options.read_only_fallback {
        options.read_only = true;
        *forced_read_only = Some(sb.read_only_features().join(", "));
    }
    if !options.read_only && !read_write_allowed {
        return Err(Error::Unsupported(format!(
            "filesystem uses feature {} that jext4 can only read; mount with -o ro",
            sb.read_only_features().join(", ")
        )));
    }
    if options.read_only || dev.is_read_only() {
        options.read_only = true;
    }
    if sb.has_compat(superblock::compat::HAS_JOURNAL) && options.noload {
        options.read_only = true;
    }
    // Decided once: what the engine holds and what the metadata cache
    // gives up for it (`delalloc_limit`) follow from this.
    if options.delalloc && !options.space_budget {
        tracing::warn!("delalloc needs the space budget (JEXT4_SPACE_BUDGET=off): off");
    }
    options.delalloc &= options.space_budget && !options.read_only;
    data_journal::settle(sb, options)?;
    fast_commit_wanted(sb, options)
}

/// The bytes of file data delayed allocation may hold: a quarter of
/// `cache_size`, which the metadata cache does without.
fn delalloc_limit(options: &MountOptions) -> u64 {
    match options.delalloc {
        true => options.cache_size / 4,
        false => 0,
    }
}

/// The kernel's reserve for metadata that deletions need
/// (ext4_calculate_resv_clusters: 2 % of the clusters, at most 4,096
/// clusters), in blocks.
fn emergency_reserve_blocks(geo: &Geometry) -> u64 {
    const RESERVE_CLUSTERS_MAX: u64 = 4096;
    let ratio = geo.cluster_ratio as u64;
    (geo.blocks_count / ratio / 50).min(RESERVE_CLUSTERS_MAX) * ratio
}

/// Leaves of damaged directories whose hash ranges a mount keeps (16
/// bytes each): 4 MiB at most, whatever the image.
pub(crate) const LEAF_RANGES_KEPT_MAX: usize = 1 << 18;

/// Distinct corruptions remembered so that each is logged once.
const LOGGED_CORRUPTIONS_MAX: usize = 1024;

pub struct Fs {
    pub(crate) core: Core,
    /// Open counts per inode, so that an unlinked file stays until released.
    pub(crate) open_files: Mutex<NumberMap<u32, u32>>,
    /// Set after a corruption was found at run time (errors=remount-ro).
    errored: AtomicBool,
    /// The superblock's state as the mount found it (after any journal
    /// replay), which unmount writes back, as the kernel's
    /// `s_mount_state`: a filesystem that was not clean — an ext2 image
    /// after a crash, a backup superblock, which e2fsprogs writes with
    /// VALID_FS off — stays so until e2fsck has checked it.
    mount_state: std::sync::atomic::AtomicU16,
    /// The corruptions logged so far (a leaf lock): each is logged once,
    /// however many operations meet it.
    logged: Mutex<std::collections::HashSet<(Location, String)>>,
    /// Set after the device failed an I/O (the filesystem is read-only).
    device_failed: AtomicBool,
    unmounted: AtomicBool,
    /// The delayed-allocation flusher thread, joined at unmount
    /// (`delalloc.rs`; a leaf lock).
    flusher: Mutex<Option<std::thread::JoinHandle<()>>>,
    /// The claimed MMP block of a read-write mount with `mmp`, released
    /// (marked clean) last at unmount.
    mmp: Mutex<Option<mmp::Protection>>,
}

/// The directory transaction an operation enters (per-directory fast
/// commits, `fast_commit/scope.rs`): a path-based operation names its
/// directories, a descriptor-based one its file.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Scope<'s> {
    /// Names change in these directories: their transaction (united when
    /// two, as a rename across directories needs).
    Dirs(&'s [u32]),
    /// The file's own changes: its directory's transaction.
    File(u32),
    /// A new name in `dir` for the existing `file`: both transactions.
    Link { dir: u32, file: u32 },
    /// The filesystem's own bookkeeping (mount, unmount, orphans found at
    /// mount): whatever it changes decides.
    Housekeeping,
}

/// One operation's view of the filesystem while it changes it.
pub(crate) struct Tx<'a, 'j> {
    pub core: &'a Core,
    pub handle: &'a Handle<'j>,
    pub caller: Caller,
    /// A block mapping changed in ways the inode's size and root do not
    /// show (an unwritten extent converted deep in the tree).
    pub mapping_changed: bool,
    /// This operation frees space (unlink, rmdir, truncate, hole punching,
    /// rename over a file) and may allocate from the emergency reserve
    /// the blocks it needs to do so — an extent split, a deeper tree — so
    /// that deleting works on a full volume.
    pub draws_on_emergency_reserve: bool,
    /// Blocks charged to the space budget and not yet allocated
    /// (`budget.rs`); what is left when the operation ends goes back.
    pub prepaid: u64,
    /// Mount-time work (journal recovery, fast-commit replay) allocates
    /// outside the budget: nothing else runs yet.
    pub unmetered: bool,
    /// Why this operation's ENOSPC may pass: what `Fs::transact` waits for
    /// before running it again.
    pub space_wait: Option<budget::SpaceWait>,
    /// Large inodes to free in chunks once this operation's handle is
    /// stopped (they are on the orphan records).
    pub deferred_evictions: Vec<u32>,
    /// Quota usage this operation changed, for `apply_quota`.
    pub quota: quota::Pending,
    /// File data was logged (`data_journal.rs`): the file's inode is
    /// written as a datasync change, which fdatasync waits for.
    pub data_logged: bool,
}

impl Drop for Tx<'_, '_> {
    fn drop(&mut self) {
        // Every operation's charges reach the quota files before its
        // handle stops (`transact`): none may be lost on the way.
        if !std::thread::panicking() {
            debug_assert!(
                self.quota.is_settled(),
                "quota charges of an operation were never applied"
            );
        }
    }
}

impl<'a, 'j> Tx<'a, 'j> {
    fn new(core: &'a Core, handle: &'a Handle<'j>, caller: Caller) -> Self {
        Tx {
            core,
            handle,
            caller,
            mapping_changed: false,
            draws_on_emergency_reserve: false,
            prepaid: 0,
            unmetered: false,
            space_wait: None,
            deferred_evictions: Vec::new(),
            quota: quota::Pending::default(),
            data_logged: false,
        }
    }

    /// Take `ino`'s lock exclusive, as `rank` (`inode_lock.rs`).
    pub fn lock_write(&self, ino: u32, rank: Rank) -> InodeGuard<'a> {
        self.core.inodes.write(ino, rank)
    }

    /// Take `ino`'s lock shared, as `rank`.
    pub fn lock_read(&self, ino: u32, rank: Rank) -> InodeGuard<'a> {
        self.core.inodes.read(ino, rank)
    }
}

impl Fs {
    /// Open an image file, block device or NBD URI and mount it.
    pub fn open(path: &Path, options: MountOptions) -> Result<Arc<Fs>> {
        let claim = if options.read_only {
            Claim::Shared
        } else {
            Claim::Exclusive
        };
        let device = crate::dev::open_image_claimed(path, options.read_only, claim)?;
        let name = path
            .file_name()
            .unwrap_or(path.as_os_str())
            .to_string_lossy();
        Fs::mount_named(device, None, options, &name)
    }

    /// Mount a filesystem on any block device.
    pub fn mount(dev: Arc<dyn BlockDevice>, options: MountOptions) -> Result<Arc<Fs>> {
        Fs::mount_named(dev, None, options, "jext4")
    }

    /// `mount`, the filesystem's external journal on `journal` (a device
    /// checked as a `journal_path=` one is); None is `mount`.
    pub fn mount_with_journal(
        dev: Arc<dyn BlockDevice>,
        journal: Option<Arc<dyn BlockDevice>>,
        options: MountOptions,
    ) -> Result<Arc<Fs>> {
        Fs::mount_named(dev, journal, options, "jext4")
    }

    /// `mount`, with the device's name for the MMP block.
    fn mount_named(
        dev: Arc<dyn BlockDevice>,
        journal: Option<Arc<dyn BlockDevice>>,
        mut options: MountOptions,
        device_name: &str,
    ) -> Result<Arc<Fs>> {
        options.validate()?;
        let mut sb = superblock::read_at(&*dev, options.superblock_offset())?;
        let (at, uuid) = sb.identity();
        dev.expect_identity(at, &uuid);
        let external = match journal {
            Some(journal) => Some(journal_dev::ExternalJournal::from_device(&sb, journal)?),
            None if options.noload && journal_dev::is_external(&sb) => None,
            None => journal_dev::ExternalJournal::find(
                &sb,
                options.journal_path.as_deref(),
                options.read_only,
            )?,
        };
        let external = external.as_ref();
        let journal_number = external.and_then(|journal| journal.number_to_record(&sb));
        let mut forced_read_only = None;
        let fast_commit = settle_options(&sb, &*dev, &mut options, &mut forced_read_only)?;
        let geo = Geometry::from_superblock(&sb);
        check_device_size(&geo, &*dev)?;
        let journaled = sb.has_compat(superblock::compat::HAS_JOURNAL);
        let replay_first = forced_read_only.is_some()
            && !dev.is_read_only()
            && journaled
            && !options.noload
            && sb.has_incompat(superblock::incompat::RECOVER);
        // Before anything is written, journal replay included.
        let writes = !options.read_only || replay_first;
        let protection = match writes && sb.has_incompat(superblock::incompat::MMP) {
            true => Some(mmp::claim(&dev, &sb, &geo, device_name)?),
            false => None,
        };
        if replay_first && journal::replay_for_mount(&geo, &sb, &dev, external)?.is_some() {
            sb = superblock::read_at(&*dev, geo.superblock_offset)?;
        }
        // The replay is the only write of a read-only mount: the heartbeat
        // stops (marking the block clean) once it is done.
        let protection = protection.filter(|_| !options.read_only);
        let mut plan = None;
        let mut unloaded_journal = Vec::new();
        if journaled && !options.noload {
            let area = recover_for_mount(&mut sb, &dev, external, &options)?;
            match options.read_only {
                true => unloaded_journal = area.blocks_in_filesystem().to_vec(),
                false => plan = Some(JournalPlan { area, fast_commit }),
            }
        } else {
            if journaled {
                // Not loaded, still protected (the kernel's system zone
                // takes the journal inode's blocks whatever noload says); a
                // journal inode that cannot be read only loses that here.
                match journal::journal_area(&geo, &dev, external) {
                    Ok(area) => unloaded_journal = area.blocks_in_filesystem().to_vec(),
                    Err(error) => {
                        tracing::warn!(%error, "noload: the journal's blocks are unknown")
                    }
                }
            }
            if sb.has_incompat(superblock::incompat::RECOVER) {
                tracing::warn!(
                    "journal recovery skipped (noload): the filesystem may be inconsistent"
                );
            }
        }
        let core = Core::open(sb, &dev, options, plan, &unloaded_journal)?;
        let fs = Arc::new(Fs {
            core,
            open_files: Mutex::new(NumberMap::default()),
            errored: AtomicBool::new(false),
            mount_state: std::sync::atomic::AtomicU16::new(STATE_VALID),
            logged: Mutex::new(std::collections::HashSet::new()),
            device_failed: AtomicBool::new(false),
            unmounted: AtomicBool::new(false),
            flusher: Mutex::new(None),
            mmp: Mutex::new(None),
        });
        if let Some(protection) = protection {
            // Another node writing the block: stop writing at once.
            let weak = Arc::downgrade(&fs);
            protection.on_conflict(Box::new(move |why| {
                if let Some(fs) = weak.upgrade() {
                    fs.abort(why);
                }
            }));
            *fs.mmp.lock() = Some(protection);
        }
        fs.check_root()?;
        if !fs.core.options.read_only {
            fs.mark_mounted(journal_number)?;
            fs.recover_orphans()?;
        }
        if fs.core.delayed.enabled() {
            fs.start_flusher();
        }
        // Said once the mount stands: a refusal after this point would
        // otherwise follow a line announcing a mount that never was.
        if let Some(features) = forced_read_only {
            tracing::warn!(
                "filesystem uses feature {features}, which jext4 reads but does not write \
                 yet: mounted read-only"
            );
        }
        Ok(fs)
    }

    fn check_root(&self) -> Result<()> {
        let root = inode::read_inode(&self.core, superblock::ROOT_INO)?;
        if !root.is_dir() || root.links_count < 2 {
            return Err(Error::corrupt(
                Location::Inode {
                    ino: superblock::ROOT_INO,
                },
                "root inode is not a directory",
            ));
        }
        Ok(())
    }

    /// Record the mount in the superblock. Unjournaled, the filesystem is
    /// "not clean" until unmount writes STATE_VALID back, as the kernel does
    /// for ext2; journaled, it stays valid and needs_recovery says a replay
    /// is due after a crash.
    ///
    /// `journal_number`: an external journal's device number to record
    /// where the superblock has another (`journal_dev.rs`).
    fn mark_mounted(&self, journal_number: Option<u32>) -> Result<()> {
        let journaled = self.core.journal.is_journaled();
        self.transact(Scope::Housekeeping, 1, Caller::ROOT, |tx| {
            let mut sb = tx.core.sbi.lock();
            if sb.state & STATE_VALID == 0 {
                tracing::warn!(
                    "filesystem was not cleanly unmounted; running e2fsck is recommended"
                );
            }
            if sb.state & STATE_ERROR != 0 {
                tracing::warn!("filesystem has errors recorded; running e2fsck is recommended");
            }
            self.mount_state.store(sb.state, Ordering::Release);
            if !journaled {
                sb.state &= !STATE_VALID;
            }
            if let Some(number) = journal_number {
                tracing::info!(number, "recording the external journal's device number");
                let uuid = sb.journal_uuid;
                sb.set_external_journal(uuid, number);
            }
            sb.mount_count = sb.mount_count.wrapping_add(1);
            sb.mount_time = inode::now_seconds();
            sb.write_time = sb.mount_time;
            tx.core.sbi.write(&sb, tx.handle)
        })?;
        self.core.journal.sync()
    }

    pub fn geometry(&self) -> &Geometry {
        &self.core.geo
    }

    pub fn is_read_only(&self) -> bool {
        self.core.options.read_only || self.core.journal.is_read_only()
    }

    /// Run a mutating operation: start a handle for `credits` blocks, run
    /// `body` — which takes the locks it needs and releases them when it
    /// returns — then stop the handle (which commits and waits when the
    /// operation asked for sync): a thread holding a filesystem lock never
    /// waits for a commit.
    ///
    /// The body charges what it may allocate to the space budget
    /// (`budget.rs`) before it changes anything; what it did not use goes
    /// back when it ends. When it failed with ENOSPC that a commit can
    /// cure — the running transaction freed the blocks its charge needs,
    /// or the blocks it was charged for were freed by a commit not yet
    /// durable — it runs again after that commit, a bounded number of
    /// times; any other ENOSPC returns at once. `body` must therefore
    /// leave the filesystem consistent when it fails, as every operation
    /// here does.
    pub(crate) fn transact<R>(
        &self,
        scope: Scope<'_>,
        credits: u32,
        caller: Caller,
        body: impl FnMut(&mut Tx<'_, '_>) -> Result<R>,
    ) -> Result<R> {
        self.transact_with(scope, credits, caller, false, body)
    }

    /// `transact` for an operation that frees space (unlink, rmdir,
    /// truncate, hole punching): it may draw on the emergency reserve.
    pub(crate) fn transact_releasing<R>(
        &self,
        scope: Scope<'_>,
        credits: u32,
        caller: Caller,
        body: impl FnMut(&mut Tx<'_, '_>) -> Result<R>,
    ) -> Result<R> {
        self.transact_with(scope, credits, caller, true, body)
    }

    fn transact_with<R>(
        &self,
        scope: Scope<'_>,
        credits: u32,
        caller: Caller,
        releases_space: bool,
        mut body: impl FnMut(&mut Tx<'_, '_>) -> Result<R>,
    ) -> Result<R> {
        if self.is_read_only() {
            return Err(Error::ReadOnly);
        }
        let mut attempt = 0;
        let credits = match self.core.quotas.enabled() {
            true => credits + quota::QUOTA_CREDITS,
            false => credits,
        };
        loop {
            let handle = self.core.journal.start(credits)?;
            self.enter_scope(&handle, scope);
            let tid = handle.tid();
            let mut deferred = Vec::new();
            let (result, space_wait) = {
                let mut tx = Tx::new(&self.core, &handle, caller);
                tx.draws_on_emergency_reserve = releases_space;
                let result = body(&mut tx);
                // Whatever the body changed, failed or not, is charged in
                // its own transaction.
                let result = match (result, tx.apply_quota()) {
                    (Ok(value), Ok(())) => Ok(value),
                    (Ok(_), Err(error)) | (Err(error), _) => Err(error),
                };
                deferred.append(&mut tx.deferred_evictions);
                // Before the handle stops: at lock-down every charge of the
                // transaction is allocated or back.
                tx.refund_charge();
                (result, tx.space_wait)
            };
            // While the handle is open the transaction cannot commit: a
            // failure found on disk after the body changed something aborts
            // the journal here, so that half of the operation never
            // reaches the disk (other failures leave nothing half done:
            // operations check before they change).
            let noted = match &result {
                Err(error) => self.note_failure(error, handle.changed()),
                Ok(_) => false,
            };
            let stopped = handle.stop();
            // Deferred evictions are on the orphan records whatever the
            // outcome: finish them.
            let evicted = self.finish_deferred_evictions(deferred);
            if matches!(result, Err(Error::NoSpace))
                && space_wait.is_some()
                && attempt < budget::SPACE_RETRIES
            {
                attempt += 1;
                stopped?;
                evicted?;
                self.core.sbi.budget.note_forced_commit();
                self.core.journal.commit_and_wait(tid)?;
                continue;
            }
            let result = result.and_then(|value| stopped.map(|()| value));
            let result = result.and_then(|value| evicted.map(|()| value));
            if noted {
                return result;
            }
            return self.note_error(result);
        }
    }

    /// Enter the directory transaction of `scope` with `handle` (before
    /// any filesystem lock: entering may wait for that directory's commit
    /// to be built).
    fn enter_scope(&self, handle: &Handle<'_>, scope: Scope<'_>) {
        let Some(tracker) = &self.core.fast_commit else {
            return;
        };
        let nested = handle.depth() > 1;
        match scope {
            Scope::Dirs(dirs) => tracker.enter(handle.id(), dirs, nested),
            Scope::File(ino) => {
                let key = tracker.key_of(ino, false);
                tracker.enter(handle.id(), &[key], nested);
            }
            Scope::Link { dir, file } => {
                let key = tracker.key_of(file, false);
                tracker.enter(handle.id(), &[dir, key], nested);
            }
            Scope::Housekeeping => {}
        }
    }

    /// Turn corruption and device failures into a read-only filesystem
    /// (errors=remount-ro) and log, once, what happened; pass every result
    /// through unchanged. A device that failed a write or a flush may have
    /// lost any write since the last good flush: nothing more is accepted,
    /// and what was acknowledged is in the journal for recovery.
    pub(crate) fn note_error<R>(&self, result: Result<R>) -> Result<R> {
        if let Err(error) = &result {
            self.note_failure(error, false);
        }
        result
    }

    /// What `note_error` does for `error`, for an operation that `changed`
    /// the filesystem before it failed, or did not. Returns whether the
    /// error was one found on disk or on the device (and so noted).
    ///
    /// Corruption met by an operation that changed something aborts the
    /// journal, as the kernel's `ext4_handle_error` does under
    /// errors=remount-ro: the running transaction — which holds the first
    /// half of the operation, mixed with other operations' changes in the
    /// same blocks — is discarded, and the disk keeps its last committed
    /// state. Without that change, or without a journal (where nothing can
    /// be discarded: blocks go home as they are written, as ext2's do), the
    /// filesystem turns read-only and what was accepted before stays: it is
    /// consistent with itself.
    pub(crate) fn note_failure(&self, error: &Error, changed: bool) -> bool {
        match error {
            Error::Corrupt {
                location,
                detail,
                origin,
            } => {
                let abort = changed && self.core.journal.is_journaled();
                self.errored.store(true, Ordering::Release);
                if self.first_report(location, detail) || abort {
                    tracing::error!(
                        %location,
                        %detail,
                        found_in = %origin,
                        aborted = abort,
                        "corruption detected; filesystem is now read-only"
                    );
                }
                if abort {
                    self.core.journal.abort(&format!(
                        "an operation met corruption ({location}: {detail}) after it had \
                         changed the filesystem; its transaction was discarded and the \
                         image keeps its last committed state: run e2fsck -fy on it"
                    ));
                } else {
                    self.core.journal.set_read_only();
                }
                self.record_error(error, abort);
                true
            }
            // ENXIO is SEEK_DATA's answer past the last data, not an I/O error.
            Error::Io(io_error) if io_error.raw_os_error() != Some(libc::ENXIO) => {
                if !self.device_failed.swap(true, Ordering::AcqRel) {
                    tracing::error!(error = %io_error, "device I/O error; filesystem is now read-only");
                }
                self.core.journal.set_read_only();
                true
            }
            _ => false,
        }
    }

    /// Whether the corruption at `location` described by `detail` is seen
    /// for the first time (then it is logged). A bounded memory: past
    /// `LOGGED_CORRUPTIONS_MAX` distinct ones, a repeat may be logged again.
    pub(crate) fn first_report(&self, location: &Location, detail: &str) -> bool {
        let mut logged = self.logged.lock();
        if logged.contains(&(*location, detail.to_string())) {
            return false;
        }
        if logged.len() >= LOGGED_CORRUPTIONS_MAX {
            logged.clear();
        }
        logged.insert((*location, detail.to_string()))
    }

    /// Record `error` in the superblock's error fields (what `dumpe2fs`
    /// shows; e2fsck then checks the filesystem whatever its mount count).
    /// Normally the record goes with the superblock into the next commit.
    /// After an abort nothing more commits: like the kernel's
    /// `ext4_commit_super`, it is written in place on the device, beneath
    /// the write-ahead guard, over the superblock the last checkpoint left
    /// (a replay of the log may overwrite it; the journal superblock's
    /// `s_errno` then still says that errors were found).
    fn record_error(&self, error: &Error, aborted: bool) {
        let Some(record) = self.core.record_error(error) else {
            return;
        };
        if !aborted || self.core.options.read_only {
            return;
        }
        let at = self.core.geo.superblock_offset;
        let written = superblock::read_at(&*self.core.home, at).and_then(|mut on_disk| {
            on_disk.record_error(&record);
            superblock::write_to(&*self.core.home, &mut on_disk)
        });
        if let Err(error) = written {
            tracing::warn!(%error, "could not record the error in the superblock");
        }
    }

    /// Stop writing for good after a panic (a bug) in the engine or a front
    /// end: the journal aborts (every change and every commit fails from
    /// now on; the log on disk stays replayable), the filesystem is
    /// read-only, reads go on until unmount, and unmount writes nothing.
    pub fn abort(&self, reason: &str) {
        self.errored.store(true, Ordering::Release);
        self.core.journal.abort(reason);
    }

    /// A front end hands inode number `ino` out once more (a FUSE entry
    /// reply: the kernel's lookup count grows). While any count remains the
    /// number is not reused for a new inode: the kernel may still send
    /// requests for it, and after a reuse they would reach another file
    /// (FUSE requests carry the number, not the generation).
    pub fn remember(&self, ino: u32) {
        *self.core.remembered.lock().entry(ino).or_insert(0) += 1;
    }

    /// The front end dropped `count` of its references to `ino` (FUSE
    /// FORGET); at zero the number may be reused.
    pub fn forget(&self, ino: u32, count: u64) {
        let mut remembered = self.core.remembered.lock();
        if let Some(held) = remembered.get_mut(&ino) {
            *held = held.saturating_sub(count);
            if *held == 0 {
                remembered.remove(&ino);
            }
        }
    }

    /// Make everything durable (sync(2), syncfs(2)).
    pub fn sync(&self) -> Result<()> {
        self.check_device_healthy()?;
        self.write_out_all(delalloc::WriteOut::Sync)?;
        self.note_error(self.core.journal.sync())
    }

    /// EIO for every fsync and sync once the device failed a write or a
    /// flush: what was written since the last good flush may be lost, and
    /// the host reports an image file's write-back error once, to whichever
    /// sync comes first (a ranged barrier of another directory's fsync, say)
    /// — a later fsync that finds its pages clean must not claim them
    /// durable.
    pub(crate) fn check_device_healthy(&self) -> Result<()> {
        if self.device_failed.load(Ordering::Acquire) {
            return Err(Error::Io(std::io::Error::from_raw_os_error(libc::EIO)));
        }
        Ok(())
    }

    /// Flush, release every orphan, mark the filesystem clean and stop.
    /// Called once; later calls do nothing.
    pub fn unmount(&self) -> Result<()> {
        if self.unmounted.swap(true, Ordering::AcqRel) {
            return Ok(());
        }
        let result = self.write_out_for_unmount();
        // Last: once the MMP block says clean, another node may mount.
        let released = match self.mmp.lock().take() {
            Some(protection) => protection.stop(),
            None => Ok(()),
        };
        result.and(released)
    }

    /// The work of `unmount`: release orphans, mark clean, stop the journal.
    fn write_out_for_unmount(&self) -> Result<()> {
        self.stop_flusher();
        let writable = !self.is_read_only();
        if writable {
            // Held data first: writing it out may need orphans' inodes
            // (open files unlinked), which are released next.
            self.write_out_all(delalloc::WriteOut::Sync)?;
            // Whatever is still open is closed by the unmount.
            self.open_files.lock().clear();
            let orphans: Vec<u32> = self.core.open_orphans.lock().iter().copied().collect();
            for ino in orphans {
                self.note_error(self.evict_if_unlinked(ino))?;
            }
            self.transact(Scope::Housekeeping, 1, Caller::ROOT, |tx| {
                let mut sb = tx.core.sbi.lock();
                // The state the mount found, with any error since.
                sb.state = self.mount_state.load(Ordering::Acquire) | (sb.state & STATE_ERROR);
                // Every orphan was just released.
                sb.feature_ro_compat &= !superblock::ro_compat::ORPHAN_PRESENT;
                sb.write_time = inode::now_seconds();
                tx.core.sbi.write(&sb, tx.handle)
            })?;
        }
        self.core.journal.shutdown()?;
        let sbi = &self.core.sbi;
        let mut sb = sbi.lock();
        let errored = self.errored.load(Ordering::Acquire);
        if self.core.journal.is_journaled() && !self.core.options.read_only {
            // The log is empty now: the filesystem needs no recovery. After
            // an error, e2fsck must still look: keep needs_recovery off but
            // record the error state.
            sb.feature_incompat &= !(superblock::incompat::RECOVER | superblock::incompat::BYTELOG);
            if errored {
                sb.state |= STATE_ERROR;
            }
            superblock::write_to(&**self.core.dev(), &mut sbi.with_counts(&sb))?;
        } else if errored && writable {
            sb.state |= STATE_ERROR;
            superblock::write_to(&**self.core.dev(), &mut sbi.with_counts(&sb))?;
        }
        Ok(())
    }

    /// Journal statistics, including write-ahead guard events.
    pub fn journal_stats(&self) -> crate::journal::JournalStats {
        self.core.journal.stats()
    }

    /// Everything worth reporting about a mounted filesystem, one
    /// `name value` pair per line (what `jext4 stats` prints).
    pub fn stats_report(&self) -> String {
        let cache = self.cache_stats();
        let statfs = self.statfs();
        let journal = self.journal_stats();
        let mut lines = vec![
            format!("blocks_total {}", statfs.blocks),
            format!("blocks_free {}", statfs.free_blocks),
            format!("blocks_available {}", statfs.available_blocks),
            format!("blocks_reserved_root {}", self.core.reserved_blocks),
            format!("blocks_reserved_emergency {}", self.core.emergency_reserve),
            format!("inodes_free {}", statfs.free_files),
        ];
        lines.extend(budget_lines(
            &self.budget_stats(),
            self.core.geo.cluster_ratio,
        ));
        lines.extend(delalloc::stats_lines(&self.delalloc_stats()));
        let alloc = self.alloc_stats();
        lines.extend([
            format!("alloc_calls {}", alloc.calls),
            format!("alloc_groups_searched {}", alloc.groups_searched),
            format!("alloc_candidates_skipped {}", alloc.candidates_skipped),
            format!("alloc_window_blocks {}", alloc.window_blocks),
            format!("alloc_windows_holding {}", alloc.windows_holding),
        ]);
        lines.extend([
            format!("read_only {}", self.is_read_only()),
            format!("errors_detected {}", self.errored.load(Ordering::Acquire)),
            format!(
                "journal_aborted {}",
                self.core.journal.abort_reason().is_some()
            ),
            format!("cache_resident_blocks {}", cache.resident),
            format!("cache_capacity_blocks {}", cache.capacity),
            format!("cache_hits {}", cache.hits),
            format!("cache_misses {}", cache.misses),
            format!("cache_evictions {}", cache.evictions),
            format!("journaled {}", journal.jbd2.is_some()),
            format!(
                "data_mode {}",
                match (journal.jbd2.is_some(), self.core.options.data_journal) {
                    (false, _) => "writeback",
                    (true, Some(true)) => "journal",
                    (true, _) => "ordered",
                }
            ),
        ]);
        match journal.jbd2 {
            Some(jbd2) => lines.extend([
                format!("journal_commits {}", jbd2.commits),
                format!("journal_blocks_logged {}", jbd2.blocks_logged),
                format!("journal_revokes_logged {}", jbd2.revokes_logged),
                format!("journal_frozen_copies {}", jbd2.frozen_copies),
                format!("journal_checkpoints {}", jbd2.checkpoints),
                format!("journal_blocks_checkpointed {}", jbd2.blocks_checkpointed),
                format!("journal_thread_rounds {}", jbd2.thread_rounds),
                format!("write_ahead_guard_events {}", jbd2.guard_violations),
            ]),
            None => lines.push(format!("dirty_buffers {}", journal.dirty_buffers)),
        }
        if let (Some(tracker), Some(jbd2)) = (&self.core.fast_commit, journal.jbd2) {
            lines.extend(fast_commit_lines(
                &tracker.stats(),
                &jbd2,
                self.core.options.fast_commit_global,
            ));
        }
        if let Some(reason) = self.core.journal.abort_reason() {
            // Last: the reason is free text.
            lines.push(format!(
                "journal_abort_reason {}",
                reason.replace('\n', " ")
            ));
        }
        lines.join("\n") + "\n"
    }

    /// The space budget's state and counters (`budget.rs`).
    pub fn budget_stats(&self) -> BudgetStats {
        self.core.sbi.budget.stats()
    }

    /// What block allocation did (`alloc.rs`).
    pub fn alloc_stats(&self) -> AllocStats {
        AllocStats {
            windows_holding: self.core.groups.window_blocks(),
            ..self.core.alloc_counters.snapshot()
        }
    }

    /// Fast-commit counters, when this mount writes fast commits.
    pub fn fast_commit_stats(&self) -> Option<FastCommitStats> {
        self.core
            .fast_commit
            .as_ref()
            .map(|tracker| tracker.stats())
    }

    pub fn cache_stats(&self) -> crate::cache::CacheStats {
        self.core.cache.stats()
    }
}

impl Drop for Fs {
    fn drop(&mut self) {
        if !self.unmounted.load(Ordering::Acquire)
            && let Err(error) = self.unmount()
        {
            tracing::error!(%error, "unmount at drop failed");
        }
    }
}

/// Filesystem statistics (statfs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StatFs {
    pub block_size: u32,
    pub blocks: u64,
    pub free_blocks: u64,
    /// Free blocks an unprivileged user may allocate.
    pub available_blocks: u64,
    pub files: u64,
    pub free_files: u64,
    pub name_max: u32,
}

impl Fs {
    pub fn statfs(&self) -> StatFs {
        let core = &self.core;
        // Blocks held by delayed allocation count as used, as the kernel
        // takes its dirty delalloc clusters off f_bfree. With bigalloc the
        // free counts are clusters; ext4_statfs reports them in blocks.
        let free_blocks = (core.sbi.free_blocks() * core.geo.cluster_ratio as u64)
            .saturating_sub(core.delayed.held_blocks());
        StatFs {
            block_size: core.geo.block_size,
            blocks: core.geo.blocks_count.saturating_sub(core.overhead_blocks),
            free_blocks,
            // As ext4_statfs: f_bavail leaves out root's blocks and the
            // emergency reserve (the kernel's s_resv_clusters).
            available_blocks: free_blocks
                .saturating_sub(core.reserved_blocks + core.emergency_reserve),
            files: core.geo.inodes_count as u64,
            free_files: core.sbi.free_inodes(),
            name_max: format::dir::NAME_MAX as u32,
        }
    }

    /// `statfs` of the path whose inode is `ino`: the filesystem's
    /// figures, or for a directory whose project its entries inherit (+P)
    /// with project limits enforced, its project's (`quota/limits.rs`),
    /// as ext4_statfs reports them.
    pub fn statfs_at(&self, ino: u32) -> Result<StatFs> {
        let mut stat = self.statfs();
        self.limit_statfs_to_project(ino, &mut stat)?;
        Ok(stat)
    }
}

/// `jext4 stats` lines about the space budget: the running transaction's
/// budget (free blocks when it opened), its balance for an ordinary user
/// (both reserves withheld), what is charged and freed in it; charges
/// made, backed out, commits they forced and the ENOSPC they returned.
/// Its amounts count clusters (`budget_unit_blocks` blocks each; 1
/// without bigalloc).
fn budget_lines(stats: &BudgetStats, unit_blocks: u32) -> Vec<String> {
    vec![
        format!("budget_enabled {}", stats.enabled),
        format!("budget_unit_blocks {unit_blocks}"),
        format!("budget_blocks {}", stats.budget),
        format!("budget_balance {}", stats.balance),
        format!("budget_charged {}", stats.charged),
        format!("budget_freed_in_running {}", stats.freed_in_running),
        format!("budget_reserved_delayed {}", stats.reserved_delayed),
        format!("budget_charges {}", stats.charges),
        format!("budget_charges_backed_out {}", stats.backed_out),
        format!("budget_commits_forced {}", stats.forced_commits),
        format!("budget_enospc {}", stats.enospc),
    ]
}

/// `jext4 stats` lines about fast commits: how many, against full
/// commits; bytes and flushes per fast commit (hundredths); each reason a
/// change made fast commits ineligible.
fn fast_commit_lines(
    stats: &FastCommitStats,
    jbd2: &crate::journal::Jbd2Stats,
    global: bool,
) -> Vec<String> {
    // Per fast commit: per write of the area, which holds the directory
    // transactions committed together (the compound degree).
    let per_commit = |total: u64| match jbd2.fast_commits {
        0 => "0".to_string(),
        commits => format!("{:.2}", total as f64 / commits as f64),
    };
    let scope = if global { "global" } else { "directory" };
    let mut lines = vec![
        format!("fast_commit_scope {scope}"),
        format!("fast_commits {}", jbd2.fast_commits),
        format!("fast_commit_directory_transactions {}", stats.commits),
        format!(
            "fast_commit_compound_degree {}",
            per_commit(jbd2.fast_commit_members)
        ),
        format!("fast_commit_fallbacks {}", stats.fallbacks),
        format!("full_commits {}", jbd2.commits),
        format!("fast_commit_record_bytes {}", jbd2.fast_commit_record_bytes),
        format!("fast_commit_bytes_written {}", jbd2.fast_commit_bytes),
        format!(
            "fast_commit_bytes_per_commit {}",
            per_commit(jbd2.fast_commit_bytes)
        ),
        format!("fast_commit_flushes {}", jbd2.fast_commit_flushes),
        format!(
            "fast_commit_flushes_per_commit {}",
            per_commit(jbd2.fast_commit_flushes)
        ),
        format!("fast_commit_data_overflows {}", stats.data_overflows),
        format!("dir_tx_coalesced {}", stats.conflicts.coalesced),
        format!("dir_tx_conflicts_waited {}", stats.conflicts.waited),
        format!("dir_tx_conflicts_shadowed {}", stats.conflicts.shadowed),
        format!("dir_tx_build_retries {}", stats.retries),
        format!("dir_tx_lockup_waits {}", stats.lockup_waits),
        format!("dir_tx_lockup_micros {}", stats.lockup_micros),
    ];
    if let Some(method) = jbd2.bytelog_method {
        lines.push(format!(
            "bytelog_persist_method {}",
            method.to_string().replace(' ', "_")
        ));
        lines.push(format!("bytelog_persists {}", jbd2.bytelog_persists));
        lines.push(format!(
            "bytelog_persists_per_commit {}",
            per_commit(jbd2.bytelog_persists)
        ));
    }
    for reason in Ineligible::ALL {
        lines.push(format!(
            "fast_commit_ineligible_{} {}",
            reason.name(),
            stats.ineligible[reason.index()]
        ));
    }
    lines
}

/// Whether this mount writes fast commits: where the image has the
/// feature, unless `-o fast_commit=off`; `-o fast_commit` on an image
/// without it is refused (the kernel has no way to replay them there).
fn fast_commit_wanted(sb: &Superblock, options: &MountOptions) -> Result<bool> {
    let feature = sb.has_compat(superblock::compat::FAST_COMMIT);
    let full_only = fast_commit::unsupported_feature(sb);
    if options.bytelog {
        let refusal = if options.read_only {
            Some("a read-only mount writes no fast commits")
        } else if !sb.has_compat(superblock::compat::HAS_JOURNAL) || options.noload {
            Some("the filesystem has no journal")
        } else if !feature {
            Some(
                "the filesystem has no fast_commit feature (add it with tune2fs -O fast_commit while unmounted)",
            )
        } else if options.fast_commit == Some(false) {
            Some("it writes fast commits, and fast_commit=off was asked for")
        } else if full_only.is_some() {
            Some("jext4 writes no fast commits on inline_data, quota or bigalloc filesystems yet")
        } else {
            None
        };
        if let Some(refusal) = refusal {
            return Err(Error::Invalid(format!("mount option bytelog: {refusal}")));
        }
    }
    if options.fast_commit == Some(true) && !feature {
        return Err(Error::Invalid(
            "mount option fast_commit: the filesystem has no fast_commit feature \
             (add it with tune2fs -O fast_commit while unmounted)"
                .into(),
        ));
    }
    let wanted = feature && options.fast_commit != Some(false) && !options.read_only;
    if let (true, Some(feature)) = (wanted, full_only) {
        tracing::info!(
            "fast_commit: jext4 writes no fast commits on {feature} filesystems yet; \
             every commit is a full one"
        );
        return Ok(false);
    }
    Ok(wanted)
}

/// Blocks that never hold file data: without bigalloc, the sum of every
/// group's fixed metadata plus the journal; with bigalloc, in whole
/// clusters as the kernel counts them — s_overhead_clusters when mke2fs
/// recorded a sane one (ext4_fill_super trusts it only with bigalloc),
/// else `bigalloc_overhead_clusters`.
fn overhead_blocks(geo: &Geometry, sb: &Superblock, groups: &Groups) -> u64 {
    if !geo.bigalloc() {
        return block_overhead(geo, sb);
    }
    let ratio = geo.cluster_ratio as u64;
    let recorded = sb.overhead_clusters as u64;
    let clusters = if recorded > 0 && recorded * ratio <= geo.blocks_count {
        recorded
    } else {
        bigalloc_overhead_clusters(geo, groups) + journal_blocks(geo, sb).div_ceil(ratio)
    };
    clusters * ratio
}

/// The blocks of the internal journal, from the superblock's backup of
/// the journal inode: mke2fs keeps i_block in s_jnl_blocks[0..15],
/// i_size_high in [15], i_size in [16].
fn journal_blocks(geo: &Geometry, sb: &Superblock) -> u64 {
    if geo.journal_inum == 0 {
        return 0;
    }
    let journal_bytes = (sb.jnl_blocks[15] as u64) << 32 | sb.jnl_blocks[16] as u64;
    journal_bytes / geo.block_size as u64
}

/// The clusters of each group that hold its superblock copy, descriptor
/// blocks, or any group's bitmaps or inode table, counted once each, as
/// the kernel's count_overhead does with bigalloc.
fn bigalloc_overhead_clusters(geo: &Geometry, groups: &Groups) -> u64 {
    let ratio = geo.cluster_ratio as u64;
    let mut total = 0;
    for group in 0..geo.group_count {
        let first = geo.group_first_block(group);
        let end = first + geo.blocks_in_group(group) as u64;
        let mut clusters = std::collections::BTreeSet::new();
        let mut mark = |block: u64, count: u64| {
            for block in block.max(first)..(block + count).min(end) {
                clusters.insert((block - first) / ratio);
            }
        };
        let boot = u64::from(group == 0 && geo.primary_superblock_location().0 > first);
        let base =
            boot + u64::from(geo.group_has_super(group)) + geo.group_gdt_blocks(group) as u64;
        mark(first, base);
        for at in groups.locations() {
            mark(at.block_bitmap, 1);
            mark(at.inode_bitmap, 1);
            mark(at.inode_table, geo.inode_table_blocks as u64);
        }
        total += clusters.len() as u64;
    }
    total
}

/// `overhead_blocks` without bigalloc.
fn block_overhead(geo: &Geometry, sb: &Superblock) -> u64 {
    let mut overhead = geo.first_data_block as u64;
    for group in 0..geo.group_count {
        overhead += geo.group_overhead_blocks(group) as u64 + 2 + geo.inode_table_blocks as u64;
    }
    overhead + journal_blocks(geo, sb)
}

impl Fs {
    /// Run `body` in one `Tx` over an engine on `dev` that is not mounted:
    /// for work inside journal recovery, before `Fs::mount` may read the
    /// filesystem (fast-commit replay). The superblock (the copy at byte
    /// `superblock_offset`) and descriptors come from `dev`; changes go through an unjournaled write-back `Journal`
    /// and are all written to `dev` and flushed when `body` succeeds. Any
    /// of them may reach `dev` earlier, whatever the outcome (cache
    /// pressure, the flusher): give it a scratch device when that matters.
    pub(crate) fn with_unmounted_tx<R>(
        dev: Arc<dyn BlockDevice>,
        superblock_offset: u64,
        body: impl FnOnce(&mut Tx<'_, '_>) -> Result<R>,
    ) -> Result<R> {
        let sb = superblock::read_at(&*dev, superblock_offset)?;
        // Replay's own records are checked against the journal's blocks
        // (`fast_commit::Replayer`); the zone here is the groups'.
        let core = Core::open(sb, &dev, MountOptions::default(), None, &[])?;
        let result = (|| {
            // Write-back handles reserve nothing; the bound only tunes the
            // overrun warning.
            let handle = core.journal.start(1 << 20)?;
            let mut tx = Tx::new(&core, &handle, Caller::ROOT);
            // Mount-time work (recovery, orphan cleanup) frees space, and
            // replays what was accepted within a budget before the crash.
            tx.draws_on_emergency_reserve = true;
            tx.unmetered = true;
            let value = body(&mut tx);
            let applied = tx.apply_quota();
            let value = value?;
            applied?;
            debug_assert!(tx.deferred_evictions.is_empty());
            drop(tx);
            handle.stop()?;
            Ok(value)
        })();
        let shut = core.journal.shutdown();
        result.and_then(|value| shut.map(|()| value))
    }
}

/// A device shorter than the filesystem is a truncated image: refused
/// before anything reads past its end.
fn check_device_size(geo: &Geometry, dev: &dyn BlockDevice) -> Result<()> {
    let blocks_on_device = dev.size_bytes() / geo.block_size as u64;
    if blocks_on_device < geo.blocks_count {
        return Err(Error::corrupt(
            Location::Superblock,
            format!(
                "filesystem has {} blocks but the device only {blocks_on_device} (truncated image?)",
                geo.blocks_count
            ),
        ));
    }
    Ok(())
}

/// Replay the journal of a journaled filesystem about to be mounted (a
/// read-write mount replays; a read-only one refuses a journal that needs
/// it) and find the journal's blocks: the area a read-write mount writes
/// to, and the system zone's journal part either way. `sb` is read again
/// after a replay.
fn recover_for_mount(
    sb: &mut Superblock,
    dev: &Arc<dyn BlockDevice>,
    external: Option<&journal_dev::ExternalJournal>,
    options: &MountOptions,
) -> Result<journal::JournalArea> {
    let geo = Geometry::from_superblock(sb);
    if options.read_only {
        let area = journal::checked_journal_area(&geo, dev, external)?;
        if sb.has_incompat(superblock::incompat::RECOVER) {
            return Err(Error::Unsupported(
                "the journal needs recovery, which a read-only mount cannot write: mount \
                 read-write (which replays it), run `jext4 recover IMAGE`, or use -o ro,noload"
                    .into(),
            ));
        }
        return Ok(area);
    }
    if journal::replay_for_mount(&geo, sb, dev, external)?.is_some() {
        *sb = superblock::read_at(&**dev, geo.superblock_offset)?;
    }
    journal::journal_area(&geo, dev, external)
}
