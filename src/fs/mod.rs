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
//! `state`.
//!
//! A mutating operation runs inside [`Fs::transact`], which gives it a
//! [`Tx`]: the shared core, the state under the write lock, and the handle.
//! Superblock and descriptor changes are collected in the state and written
//! to their buffers once, when the operation ends.

mod alloc;
mod dirops;
mod file;
mod inode;
mod namei;
mod orphan;
pub mod walk;
mod xattr;

pub use crate::format::xattr::SetMode as XattrMode;
pub use dirops::Dentry;
pub use file::{FALLOC_FL_KEEP_SIZE, FALLOC_FL_PUNCH_HOLE, FALLOC_FL_ZERO_RANGE, SeekWhence};
pub use inode::{Attr, FileKind, SetAttr, TimeSet};
pub use namei::RenameFlags;

use crate::cache::BufferCache;
use crate::dev::{BlockDevice, FileDevice};
use crate::error::{Error, Location, Result};
use crate::format::group_desc::GroupDesc;
use crate::format::superblock::{
    self, Geometry, STATE_ERROR, STATE_VALID, SUPERBLOCK_OFFSET, SUPERBLOCK_SIZE, Superblock,
};
use crate::journal::{Handle, Journal, JournalConfig};
use parking_lot::{Mutex, RwLock};
use std::collections::{BTreeSet, HashMap};
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
}

impl Core {
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
}

pub struct Fs {
    pub(crate) core: Core,
    pub(crate) state: RwLock<State>,
    /// Open counts per inode, so that an unlinked file stays until released.
    pub(crate) open_files: Mutex<HashMap<u32, u32>>,
    /// Set after a corruption was found at run time (errors=remount-ro).
    errored: AtomicBool,
    unmounted: AtomicBool,
}

/// One operation's view of the filesystem while it changes it.
pub(crate) struct Tx<'a, 'j> {
    pub core: &'a Core,
    pub st: &'a mut State,
    pub handle: &'a Handle<'j>,
    pub caller: Caller,
}

impl Fs {
    /// Open an image file or block device and mount it.
    pub fn open(path: &Path, options: MountOptions) -> Result<Arc<Fs>> {
        let device = FileDevice::open(path, options.read_only).map_err(|error| {
            Error::Io(std::io::Error::new(
                error.kind(),
                format!("cannot open {}: {error}", path.display()),
            ))
        })?;
        Fs::mount(Arc::new(device), options)
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
        if !options.read_only && sb.has_incompat(superblock::incompat::RECOVER) {
            return Err(Error::Unsupported(
                "the journal needs recovery, and this version of jext4 cannot replay it yet; \
                 run `e2fsck -E journal_only IMAGE` or mount with -o ro"
                    .into(),
            ));
        }
        if options.read_only || dev.is_read_only() {
            options.read_only = true;
        }
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
        let cache = Arc::new(BufferCache::new(
            dev,
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
        let journal = Journal::write_back(Arc::clone(&cache), config, options.read_only);
        let overhead_blocks = overhead_blocks(&geo, &sb);
        let core = Core {
            overhead_blocks,
            reserved_blocks: sb.reserved_blocks_count,
            resuid: sb.def_resuid as u32,
            resgid: sb.def_resgid as u32,
            geo,
            cache,
            journal,
            options,
        };
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
            }),
            core,
            open_files: Mutex::new(HashMap::new()),
            errored: AtomicBool::new(false),
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

    /// Record the mount in the superblock: the filesystem is "not clean"
    /// until unmount writes STATE_VALID back, as the kernel does for ext2.
    fn mark_mounted(&self) -> Result<()> {
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
            sb.state &= !STATE_VALID;
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
    pub(crate) fn transact<R>(
        &self,
        credits: u32,
        caller: Caller,
        body: impl FnOnce(&mut Tx<'_, '_>) -> Result<R>,
    ) -> Result<R> {
        if self.is_read_only() {
            return Err(Error::ReadOnly);
        }
        let handle = self.core.journal.start(credits)?;
        let result = {
            let mut state = self.state.write();
            let mut tx = Tx {
                core: &self.core,
                st: &mut state,
                handle: &handle,
                caller,
            };
            let result = body(&mut tx);
            // Whatever the body managed before an error is consistent on its
            // own (operations order their steps so), and must be recorded.
            let finished = tx.finish();
            result.and_then(|value| finished.map(|()| value))
        };
        let stopped = handle.stop();
        let result = result.and_then(|value| stopped.map(|()| value));
        self.note_error(result)
    }

    /// Turn corruption into a read-only filesystem (errors=remount-ro) and
    /// log where it was found; pass every result through unchanged.
    pub(crate) fn note_error<R>(&self, result: Result<R>) -> Result<R> {
        if let Err(Error::Corrupt { location, detail }) = &result {
            if !self.errored.swap(true, Ordering::AcqRel) {
                tracing::error!(%location, %detail, "corruption detected; filesystem is now read-only");
            } else {
                tracing::warn!(%location, %detail, "corruption detected");
            }
            self.core.journal.set_read_only();
        }
        result
    }

    /// Make everything durable (sync(2), syncfs(2)).
    pub fn sync(&self) -> Result<()> {
        self.core.journal.sync()
    }

    /// Flush, release every orphan, mark the filesystem clean and stop.
    /// Called once; later calls do nothing.
    pub fn unmount(&self) -> Result<()> {
        if self.unmounted.swap(true, Ordering::AcqRel) {
            return Ok(());
        }
        if !self.is_read_only() {
            // Whatever is still open is closed by the unmount.
            let open: Vec<u32> = self.open_files.lock().drain().map(|(ino, _)| ino).collect();
            for ino in open {
                self.note_error(self.evict_if_unlinked(ino))?;
            }
            self.transact(1, Caller::ROOT, |tx| {
                let sb = &mut tx.st.sb;
                if !self.errored.load(Ordering::Acquire) {
                    sb.state |= STATE_VALID;
                } else {
                    sb.state |= STATE_ERROR;
                }
                sb.write_time = inode::now_seconds();
                tx.st.sb_dirty = true;
                Ok(())
            })?;
        } else if self.errored.load(Ordering::Acquire) && !self.core.options.read_only {
            // Turned read-only by an error: record the error state directly.
            let mut st = self.state.write();
            st.sb.state |= STATE_ERROR;
            drop(st);
        }
        self.core.journal.shutdown()
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
