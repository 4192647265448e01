//! Filesystem operations: the engine behind both front ends.
//!
//! `Fs` is `Send + Sync`; every public operation is a method taking `&self`.
//!
//! Locking (outermost first, DESIGN.md §4): a journal handle is started
//! before the filesystem lock is taken; `Fs::state` (the filesystem lock)
//! guards the superblock, the group descriptors and the allocator state, and
//! serialises changes to inodes and directories; buffer byte locks are taken
//! inside it; the journal's own state innermost. Read-only operations take
//! the lock shared. `open_files` is a leaf lock, never held while taking
//! `state`. The fast-commit tracker's lock (`fast_commit::track`) is a leaf
//! too: handles report changes to it under `state`, and an fsync takes what
//! it queued under `state` shared — so a fast commit records a cut no
//! operation is half-way through.
//!
//! A mutating operation runs inside [`Fs::transact`], which gives it a
//! [`Tx`]: the shared core, the state under the write lock, and the handle.
//! Superblock and descriptor changes are collected in the state and written
//! to their buffers once, when the operation ends.

mod alloc;
mod dirops;
mod fast_commit;
mod file;
mod inode;
mod journal;
mod namei;
mod orphan;
pub mod walk;
mod xattr;

pub use crate::format::xattr::SetMode as XattrMode;
pub use dirops::Dentry;
pub use file::{FALLOC_FL_KEEP_SIZE, FALLOC_FL_PUNCH_HOLE, FALLOC_FL_ZERO_RANGE, SeekWhence};
pub use inode::{Attr, FileKind, SetAttr, TimeSet};
pub use journal::{ImageRecovery, journal_shape, logdump_image, recover_device, recover_image};
pub use namei::RenameFlags;

use crate::cache::BufferCache;
use crate::dev::BlockDevice;
use crate::dev::guard::GuardedDevice;
use crate::error::{Error, Location, Result};
use crate::format::group_desc::GroupDesc;
use crate::format::superblock::{
    self, Geometry, STATE_ERROR, STATE_VALID, SUPERBLOCK_OFFSET, SUPERBLOCK_SIZE, Superblock,
};
use crate::journal::change::Ineligible;
use crate::journal::{Handle, Jbd2Options, Journal, JournalConfig};
pub use fast_commit::FastCommitStats;
use parking_lot::{Mutex, RwLock};
use std::collections::{BTreeSet, HashMap, HashSet};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

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
    /// Fast commits go through a persistent-memory mapping of the journal's
    /// fast-commit area (ByteLog, `-o bytelog`); the image carries the
    /// BYTELOG incompat flag until a clean unmount.
    pub bytelog: bool,
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
            noload: false,
            journal_async_commit: false,
            fast_commit: None,
            bytelog: false,
        }
    }
}

/// Who asks: permission-relevant identity of the caller (reserved blocks,
/// ownership of new inodes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Caller {
    pub uid: u32,
    pub gid: u32,
}

impl Caller {
    pub const ROOT: Caller = Caller { uid: 0, gid: 0 };
}

/// What never changes while mounted, shared by every operation.
pub(crate) struct Core {
    pub geo: Geometry,
    pub cache: Arc<BufferCache>,
    pub journal: Arc<Journal>,
    pub options: MountOptions,
    /// Blocks reserved for root (s_r_blocks_count).
    pub reserved_blocks: u64,
    pub resuid: u32,
    pub resgid: u32,
    /// Blocks that never hold file data (group metadata, the journal):
    /// what statfs leaves out of the total, as the kernel does.
    pub overhead_blocks: u64,
    /// The transactions holding each inode's latest changes (fsync).
    pub inode_tids: Mutex<HashMap<u32, InodeTids>>,
    /// Inodes whose last link is gone while a file handle keeps them:
    /// recorded as orphans on disk, freed at their last release. An inode
    /// with no links that is not here is gone, whatever a stale handle
    /// says (a leaf lock).
    pub open_orphans: Mutex<HashSet<u32>>,
    /// Inodes currently on the on-disk orphan records (list or orphan
    /// file), so that recording and unrecording are idempotent when
    /// operations on one inode overlap (a leaf lock).
    pub orphans: Mutex<HashSet<u32>>,
    /// What the next fast commit records, when this mount writes them.
    pub fast_commit: Option<Arc<fast_commit::Tracker>>,
    /// Inode numbers a front end still names (the FUSE kernel's lookup
    /// counts): the allocator does not hand them out again while named,
    /// or a stale name would reach a new, unrelated file (a leaf lock).
    pub remembered: Mutex<HashMap<u32, u64>>,
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
    fn new(
        geo: Geometry,
        sb: &Superblock,
        cache: Arc<BufferCache>,
        journal: Arc<Journal>,
        options: MountOptions,
    ) -> Core {
        Core {
            overhead_blocks: overhead_blocks(&geo, sb),
            inode_tids: Mutex::new(HashMap::new()),
            open_orphans: Mutex::new(HashSet::new()),
            remembered: Mutex::new(HashMap::new()),
            orphans: Mutex::new(HashSet::new()),
            fast_commit: None,
            reserved_blocks: sb.reserved_blocks_count,
            resuid: sb.def_resuid as u32,
            resgid: sb.def_resgid as u32,
            geo,
            cache,
            journal,
            options,
        }
    }

    pub fn dev(&self) -> &Arc<dyn BlockDevice> {
        self.cache.device()
    }
}

/// Mutable filesystem state, under `Fs::state`.
pub(crate) struct State {
    pub sb: Superblock,
    pub groups: Vec<GroupDesc>,
    /// Descriptors changed by the running operation, written at its end.
    pub dirty_groups: BTreeSet<u32>,
    pub sb_dirty: bool,
    /// Round-robin start for spreading top-level directories (Orlov).
    pub next_topdir_group: u32,
    /// Rotates inode generations.
    pub next_generation: u32,
    /// Large inodes to free in chunks once the current operation's
    /// transaction handle is stopped (they are on the orphan records).
    pub deferred_evictions: Vec<u32>,
}

pub struct Fs {
    pub(crate) core: Core,
    pub(crate) state: RwLock<State>,
    /// Open counts per inode, so that an unlinked file stays until released.
    pub(crate) open_files: Mutex<HashMap<u32, u32>>,
    /// Set after a corruption was found at run time (errors=remount-ro).
    errored: AtomicBool,
    /// Set after the device failed an I/O (the filesystem is read-only).
    device_failed: AtomicBool,
    unmounted: AtomicBool,
}

/// One operation's view of the filesystem while it changes it.
pub(crate) struct Tx<'a, 'j> {
    pub core: &'a Core,
    pub st: &'a mut State,
    pub handle: &'a Handle<'j>,
    pub caller: Caller,
    /// A block mapping changed in ways the inode's size and root do not
    /// show (an unwritten extent converted deep in the tree).
    pub mapping_changed: bool,
}

impl Fs {
    /// Open an image file, block device or NBD URI and mount it.
    pub fn open(path: &Path, options: MountOptions) -> Result<Arc<Fs>> {
        Fs::mount(crate::dev::open_image(path, options.read_only)?, options)
    }

    /// Mount a filesystem on any block device.
    pub fn mount(dev: Arc<dyn BlockDevice>, mut options: MountOptions) -> Result<Arc<Fs>> {
        if dev.size_bytes() < SUPERBLOCK_OFFSET + SUPERBLOCK_SIZE as u64 {
            return Err(Error::corrupt(
                Location::Superblock,
                "device too small to hold a superblock",
            ));
        }
        let mut sb_bytes = vec![0u8; SUPERBLOCK_SIZE];
        dev.read_at(SUPERBLOCK_OFFSET, &mut sb_bytes)?;
        let mut sb = Superblock::decode(&sb_bytes)?;
        let read_write_allowed = sb.check_features()?;
        if !options.read_only && !read_write_allowed {
            return Err(Error::Unsupported(format!(
                "filesystem uses feature {} that jext4 can only read; mount with -o ro",
                sb.read_only_features().join(", ")
            )));
        }
        if options.read_only || dev.is_read_only() {
            options.read_only = true;
        }
        let journaled = sb.has_compat(superblock::compat::HAS_JOURNAL);
        if journaled && options.noload {
            options.read_only = true;
        }
        let fast_commit = fast_commit_wanted(&sb, &options)?;
        let geo = Geometry::from_superblock(&sb);
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
        let mut journal_parts = None;
        if journaled && !options.noload {
            let needs = sb.has_incompat(superblock::incompat::RECOVER);
            if options.read_only {
                if needs {
                    return Err(Error::Unsupported(
                        "the journal needs recovery, which a read-only mount cannot write: mount \
                         read-write (which replays it), run `jext4 recover IMAGE`, or use -o ro,noload"
                            .into(),
                    ));
                }
            } else {
                if journal::recover_if_needed(&geo, &sb, &dev)?.is_some() {
                    dev.read_at(SUPERBLOCK_OFFSET, &mut sb_bytes)?;
                    sb = Superblock::decode(&sb_bytes)?;
                }
                let area = journal::journal_area(&geo, &dev)?;
                let guard = Arc::new(GuardedDevice::new(Arc::clone(&dev), geo.block_size));
                journal_parts = Some((area, guard));
            }
        } else if sb.has_incompat(superblock::incompat::RECOVER) {
            tracing::warn!("journal recovery skipped (noload): the filesystem may be inconsistent");
        }
        let geo = Geometry::from_superblock(&sb);
        let cache_device: Arc<dyn BlockDevice> = match &journal_parts {
            Some((_, guard)) => Arc::clone(guard) as Arc<dyn BlockDevice>,
            None => Arc::clone(&dev),
        };
        let cache = Arc::new(BufferCache::new(
            cache_device,
            geo.block_size as usize,
            options.cache_size,
        ));
        let groups = read_group_descs(&geo, &cache)?;
        // The superblock's free counts are only a summary; like the kernel
        // (ext4_percpu_param_init) take them from the descriptors, whose
        // counts are checked against the group size. A damaged summary
        // would otherwise overflow when blocks or inodes are freed.
        sb.free_blocks_count = groups.iter().map(|desc| desc.free_blocks as u64).sum();
        sb.free_inodes_count = groups.iter().map(|desc| desc.free_inodes).sum();
        let config = JournalConfig {
            commit_interval: options.commit_interval,
            sync_all: options.sync,
        };
        let journal = match journal_parts {
            Some((area, guard)) => {
                // needs_recovery must be durable before any commit is: with
                // it clear, the kernel wipes the log instead of replaying.
                // BYTELOG too, before any fast commit goes to the ring.
                sb.feature_incompat |= superblock::incompat::RECOVER;
                if options.bytelog {
                    sb.feature_incompat |= superblock::incompat::BYTELOG;
                }
                journal::write_superblock_direct(&*dev, &mut sb)?;
                let jbd2_options = Jbd2Options {
                    commit_interval: options.commit_interval,
                    async_commit: options.journal_async_commit,
                    fs_64bit: geo.has_incompat(superblock::incompat::BIT64),
                    metadata_csum: geo.metadata_csum,
                    fast_commit,
                    bytelog: options.bytelog,
                };
                Journal::jbd2(Arc::clone(&cache), area, guard, config, &jbd2_options)?
            }
            None => Journal::write_back(Arc::clone(&cache), config, options.read_only),
        };
        let mut core = Core::new(geo, &sb, cache, journal, options);
        core.fast_commit = fast_commit::Tracker::attach(&core.geo, &core.journal);
        let generation_seed = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .subsec_nanos();
        let fs = Arc::new(Fs {
            state: RwLock::new(State {
                sb,
                groups,
                dirty_groups: BTreeSet::new(),
                sb_dirty: false,
                next_topdir_group: generation_seed % core.geo.group_count.max(1),
                next_generation: generation_seed,
                deferred_evictions: Vec::new(),
            }),
            core,
            open_files: Mutex::new(HashMap::new()),
            errored: AtomicBool::new(false),
            device_failed: AtomicBool::new(false),
            unmounted: AtomicBool::new(false),
        });
        fs.check_root()?;
        if !fs.core.options.read_only {
            fs.mark_mounted()?;
            fs.recover_orphans()?;
        }
        Ok(fs)
    }

    fn check_root(&self) -> Result<()> {
        let st = self.state.read();
        let root = inode::read_inode(&self.core, &st, superblock::ROOT_INO)?;
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
    fn mark_mounted(&self) -> Result<()> {
        let journaled = self.core.journal.is_journaled();
        self.transact(1, Caller::ROOT, |tx| {
            let sb = &mut tx.st.sb;
            if sb.state & STATE_VALID == 0 {
                tracing::warn!(
                    "filesystem was not cleanly unmounted; running e2fsck is recommended"
                );
            }
            if sb.state & STATE_ERROR != 0 {
                tracing::warn!("filesystem has errors recorded; running e2fsck is recommended");
            }
            if !journaled {
                sb.state &= !STATE_VALID;
            }
            sb.mount_count = sb.mount_count.wrapping_add(1);
            sb.mount_time = inode::now_seconds();
            sb.write_time = sb.mount_time;
            tx.st.sb_dirty = true;
            Ok(())
        })?;
        self.core.journal.sync()
    }

    pub fn geometry(&self) -> &Geometry {
        &self.core.geo
    }

    pub fn is_read_only(&self) -> bool {
        self.core.options.read_only || self.core.journal.is_read_only()
    }

    /// Run a mutating operation: start a handle for `credits` blocks, take
    /// the filesystem lock, run `body`, write back the superblock and
    /// descriptors it changed, release the lock, stop the handle.
    ///
    /// When the operation runs out of space while blocks freed by
    /// uncommitted transactions are waiting to become allocatable, it is
    /// run again after those transactions commit, up to three times (the
    /// kernel's `ext4_should_retry_alloc`); `body` must therefore leave the
    /// filesystem consistent when it fails, as every operation here does.
    pub(crate) fn transact<R>(
        &self,
        credits: u32,
        caller: Caller,
        mut body: impl FnMut(&mut Tx<'_, '_>) -> Result<R>,
    ) -> Result<R> {
        if self.is_read_only() {
            return Err(Error::ReadOnly);
        }
        let mut attempt = 0;
        loop {
            let handle = self.core.journal.start(credits)?;
            let tid = handle.tid();
            let result = {
                let mut state = self.state.write();
                let mut tx = Tx {
                    core: &self.core,
                    st: &mut state,
                    handle: &handle,
                    caller,
                    mapping_changed: false,
                };
                let result = body(&mut tx);
                // Whatever the body managed before an error is consistent on
                // its own (operations order their steps so), and must be
                // recorded.
                let finished = tx.finish();
                result.and_then(|value| finished.map(|()| value))
            };
            let stopped = handle.stop();
            // Up to three retries, as the kernel's ext4_should_retry_alloc:
            // other threads keep freeing into the running transaction, so
            // one commit may not release enough.
            if matches!(result, Err(Error::NoSpace))
                && attempt < 3
                && self.core.journal.has_pending_frees()
            {
                attempt += 1;
                stopped?;
                self.core.journal.commit_and_wait(tid)?;
                continue;
            }
            let result = result.and_then(|value| stopped.map(|()| value));
            let result = result.and_then(|value| self.finish_deferred_evictions().map(|()| value));
            return self.note_error(result);
        }
    }

    /// Turn corruption and device failures into a read-only filesystem
    /// (errors=remount-ro) and log, once, what happened; pass every result
    /// through unchanged. A device that failed a write or a flush may have
    /// lost any write since the last good flush: nothing more is accepted,
    /// and what was acknowledged is in the journal for recovery.
    pub(crate) fn note_error<R>(&self, result: Result<R>) -> Result<R> {
        match &result {
            Err(Error::Corrupt { location, detail }) => {
                if !self.errored.swap(true, Ordering::AcqRel) {
                    tracing::error!(%location, %detail, "corruption detected; filesystem is now read-only");
                } else {
                    tracing::warn!(%location, %detail, "corruption detected");
                }
                self.core.journal.set_read_only();
            }
            // ENXIO is SEEK_DATA's answer past the last data, not an I/O error.
            Err(Error::Io(error)) if error.raw_os_error() != Some(libc::ENXIO) => {
                if !self.device_failed.swap(true, Ordering::AcqRel) {
                    tracing::error!(%error, "device I/O error; filesystem is now read-only");
                }
                self.core.journal.set_read_only();
            }
            _ => {}
        }
        result
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
        self.note_error(self.core.journal.sync())
    }

    /// Flush, release every orphan, mark the filesystem clean and stop.
    /// Called once; later calls do nothing.
    pub fn unmount(&self) -> Result<()> {
        if self.unmounted.swap(true, Ordering::AcqRel) {
            return Ok(());
        }
        let writable = !self.is_read_only();
        if writable {
            // Whatever is still open is closed by the unmount.
            self.open_files.lock().clear();
            let orphans: Vec<u32> = self.core.open_orphans.lock().iter().copied().collect();
            for ino in orphans {
                self.note_error(self.evict_if_unlinked(ino))?;
            }
            self.transact(1, Caller::ROOT, |tx| {
                let sb = &mut tx.st.sb;
                sb.state |= STATE_VALID;
                // Every orphan was just released.
                sb.feature_ro_compat &= !superblock::ro_compat::ORPHAN_PRESENT;
                sb.write_time = inode::now_seconds();
                tx.st.sb_dirty = true;
                Ok(())
            })?;
        }
        self.core.journal.shutdown()?;
        let mut st = self.state.write();
        let errored = self.errored.load(Ordering::Acquire);
        if self.core.journal.is_journaled() && !self.core.options.read_only {
            // The log is empty now: the filesystem needs no recovery. After
            // an error, e2fsck must still look: keep needs_recovery off but
            // record the error state.
            st.sb.feature_incompat &=
                !(superblock::incompat::RECOVER | superblock::incompat::BYTELOG);
            if errored {
                st.sb.state |= STATE_ERROR;
            }
            journal::write_superblock_direct(&**self.core.dev(), &mut st.sb)?;
        } else if errored && writable {
            st.sb.state |= STATE_ERROR;
            journal::write_superblock_direct(&**self.core.dev(), &mut st.sb)?;
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
            format!("inodes_free {}", statfs.free_files),
            format!("read_only {}", self.is_read_only()),
            format!("cache_resident_blocks {}", cache.resident),
            format!("cache_capacity_blocks {}", cache.capacity),
            format!("cache_hits {}", cache.hits),
            format!("cache_misses {}", cache.misses),
            format!("cache_evictions {}", cache.evictions),
            format!("journaled {}", journal.jbd2.is_some()),
        ];
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
            lines.extend(fast_commit_lines(&tracker.stats(), &jbd2));
        }
        lines.join("\n") + "\n"
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
        if !self.unmounted.load(Ordering::Acquire) {
            if let Err(error) = self.unmount() {
                tracing::error!(%error, "unmount at drop failed");
            }
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
        let st = self.state.read();
        let core = &self.core;
        StatFs {
            block_size: core.geo.block_size,
            blocks: core.geo.blocks_count.saturating_sub(core.overhead_blocks),
            free_blocks: st.sb.free_blocks_count,
            available_blocks: st.sb.free_blocks_count.saturating_sub(core.reserved_blocks),
            files: core.geo.inodes_count as u64,
            free_files: st.sb.free_inodes_count as u64,
            name_max: 255,
        }
    }
}

/// `jext4 stats` lines about fast commits: how many, against full
/// commits; bytes and flushes per fast commit (hundredths); each reason a
/// change made fast commits ineligible.
fn fast_commit_lines(stats: &FastCommitStats, jbd2: &crate::journal::Jbd2Stats) -> Vec<String> {
    let per_commit = |total: u64| match stats.commits {
        0 => "0".to_string(),
        commits => format!("{:.2}", total as f64 / commits as f64),
    };
    let mut lines = vec![
        format!("fast_commits {}", stats.commits),
        format!("fast_commit_fallbacks {}", stats.fallbacks),
        format!("full_commits {}", jbd2.commits),
        format!("fast_commit_record_bytes {}", stats.record_bytes),
        format!("fast_commit_bytes_written {}", jbd2.fast_commit_bytes),
        format!(
            "fast_commit_bytes_per_commit {}",
            per_commit(jbd2.fast_commit_bytes)
        ),
        format!("fast_commit_flushes {}", stats.flushes),
        format!(
            "fast_commit_flushes_per_commit {}",
            per_commit(stats.flushes)
        ),
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
    Ok(feature && options.fast_commit != Some(false) && !options.read_only)
}

/// s_overhead_clusters when mke2fs recorded it, else the sum of every
/// group's fixed metadata plus the journal.
fn overhead_blocks(geo: &Geometry, sb: &Superblock) -> u64 {
    let mut overhead = geo.first_data_block as u64;
    for group in 0..geo.group_count {
        overhead += geo.group_overhead_blocks(group) as u64 + 2 + geo.inode_table_blocks as u64;
    }
    if geo.journal_inum != 0 {
        // mke2fs backs up the journal inode in s_jnl_blocks: i_block in
        // [0..15], i_size_high in [15], i_size in [16].
        let journal_bytes = (sb.jnl_blocks[15] as u64) << 32 | sb.jnl_blocks[16] as u64;
        overhead += journal_bytes / geo.block_size as u64;
    }
    overhead
}

fn read_group_descs(geo: &Geometry, cache: &BufferCache) -> Result<Vec<GroupDesc>> {
    let mut groups = Vec::with_capacity(geo.group_count as usize);
    for group in 0..geo.group_count {
        let (block, offset) = geo.group_desc_location(group);
        let buffer = cache.read(block)?;
        let bytes = buffer.read();
        let desc = GroupDesc::decode(geo, group, &bytes[offset..offset + geo.desc_size as usize])?;
        groups.push(desc);
    }
    Ok(groups)
}

impl Fs {
    /// Run `body` in one `Tx` over an engine on `dev` that is not mounted:
    /// for work inside journal recovery, before `Fs::mount` may read the
    /// filesystem (fast-commit replay). The superblock and descriptors come
    /// from `dev`; changes go through an unjournaled write-back `Journal`
    /// and are all written to `dev` and flushed when `body` succeeds. Any
    /// of them may reach `dev` earlier, whatever the outcome (cache
    /// pressure, the flusher): give it a scratch device when that matters.
    pub(crate) fn with_unmounted_tx<R>(
        dev: Arc<dyn BlockDevice>,
        body: impl FnOnce(&mut Tx<'_, '_>) -> Result<R>,
    ) -> Result<R> {
        let mut sb_bytes = vec![0u8; SUPERBLOCK_SIZE];
        dev.read_at(SUPERBLOCK_OFFSET, &mut sb_bytes)?;
        let sb = Superblock::decode(&sb_bytes)?;
        let geo = Geometry::from_superblock(&sb);
        let options = MountOptions::default();
        let cache = Arc::new(BufferCache::new(
            dev,
            geo.block_size as usize,
            options.cache_size,
        ));
        let groups = read_group_descs(&geo, &cache)?;
        let journal = Journal::write_back(Arc::clone(&cache), JournalConfig::default(), false);
        let core = Core::new(geo, &sb, cache, journal, options);
        let mut state = State {
            sb,
            groups,
            dirty_groups: BTreeSet::new(),
            sb_dirty: false,
            next_topdir_group: 0,
            next_generation: 0,
            deferred_evictions: Vec::new(),
        };
        let result = (|| {
            // Write-back handles reserve nothing; the bound only tunes the
            // overrun warning.
            let handle = core.journal.start(1 << 20)?;
            let mut tx = Tx {
                core: &core,
                st: &mut state,
                handle: &handle,
                caller: Caller::ROOT,
                mapping_changed: false,
            };
            let value = body(&mut tx)?;
            tx.finish()?;
            handle.stop()?;
            Ok(value)
        })();
        debug_assert!(state.deferred_evictions.is_empty());
        let shut = core.journal.shutdown();
        result.and_then(|value| shut.map(|()| value))
    }
}

impl Tx<'_, '_> {
    /// Write the superblock and the descriptors the operation changed.
    fn finish(&mut self) -> Result<()> {
        let dirty: Vec<u32> = std::mem::take(&mut self.st.dirty_groups)
            .into_iter()
            .collect();
        for group in dirty {
            let (block, offset) = self.core.geo.group_desc_location(group);
            let buffer = self.core.cache.read(block)?;
            let mut bytes = self.handle.get_write_access(&buffer)?;
            let size = self.core.geo.desc_size as usize;
            self.st.groups[group as usize].encode(
                &self.core.geo,
                group,
                &mut bytes[offset..offset + size],
            );
        }
        if std::mem::take(&mut self.st.sb_dirty) {
            let (block, offset) = self.core.geo.superblock_location();
            let buffer = self.core.cache.read(block)?;
            let mut bytes = self.handle.get_write_access(&buffer)?;
            bytes[offset..offset + SUPERBLOCK_SIZE].copy_from_slice(self.st.sb.encode());
        }
        Ok(())
    }

    pub fn mark_group_dirty(&mut self, group: u32) {
        self.st.dirty_groups.insert(group);
        self.st.sb_dirty = true;
    }
}
