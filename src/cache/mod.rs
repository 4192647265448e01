//! Block buffers for metadata, bounded in memory.
//!
//! A buffer is keyed by its physical block number. The cache itself knows
//! nothing of dirtiness: whoever must keep a buffer in memory (the running
//! transaction, the committing one, the checkpoint list, the write-back set
//! of an unjournaled mount) holds an `Arc` to it, and the cache evicts only
//! buffers that nobody but itself references. The journal layer therefore
//! decides alone when a block may reach its home location.
//!
//! File data does not pass through here: it is read and written directly on
//! the device (see `fs/file.rs`), so `cache_size` bounds metadata only and
//! large files never push metadata out.
//!
//! Locks (ranked in `crate::lock`): a buffer's journal head, then its bytes
//! (rank Buffer, nestable across buffers); `BufferCache::inner` is a leaf
//! lock, never held across device I/O.

use crate::dev::BlockDevice;
use crate::error::{Error, Location, Result};
use crate::hash::NumberMap;
use crate::lock::{self, Rank, RwLock, RwLockReadGuard, RwLockWriteGuard};
use parking_lot::Mutex;
use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// The journal's bookkeeping for one buffer (the kernel's journal_head).
/// Owned and interpreted by `journal/`; the cache only stores it so that it
/// lives exactly as long as the buffer.
///
/// Lock order: a buffer's `journal` mutex is taken before its bytes.
#[derive(Debug, Default)]
pub struct JournalHead {
    /// The running transaction the buffer is registered in.
    pub running: Option<u32>,
    /// The committing transaction that has not yet captured the buffer's
    /// content for the log.
    pub committing: Option<u32>,
    /// The committing transaction that logs this buffer, from lock-down
    /// until its commit block is durable (`committing` ends earlier, at
    /// capture). Meanwhile the buffer's bytes may be that commit's, not yet
    /// durable: the checkpoint (another thread) must not write them home.
    pub logging: Option<u32>,
    /// The committing transaction's copy, taken when the running
    /// transaction asked for write access before the commit captured it.
    pub frozen: Option<Box<[u8]>>,
    /// The newest committed transaction whose log holds this buffer while
    /// the home location is older: the checkpoint must write it home.
    pub checkpoint: Option<u32>,
    /// Freed as metadata by the running transaction: never logged again,
    /// never written home.
    pub freed: bool,
}

pub struct Buffer {
    block: u64,
    /// Journal bookkeeping, taken before `data` when both are needed.
    pub(crate) journal: lock::Mutex<JournalHead>,
    data: RwLock<Box<[u8]>>,
    /// The bytes reflect the device (or a fresh block being written).
    uptodate: AtomicBool,
    /// The structure's checksum was verified since the block was read; the
    /// format layer skips re-verifying cached blocks it wrote itself.
    verified: AtomicBool,
    /// The same per slot, for blocks that hold several checksummed
    /// structures (inode tables: bit i is the inode at byte i x inode
    /// size). Slots from `VERIFIED_SLOTS` on are never marked: they are
    /// verified at every read.
    slots_verified: AtomicU64,
    /// Clock bit for eviction.
    referenced: AtomicBool,
}

impl Buffer {
    fn new(block: u64, block_size: usize) -> Self {
        Buffer {
            block,
            journal: lock::Mutex::new(Rank::Buffer, JournalHead::default()),
            data: RwLock::new(Rank::Buffer, vec![0u8; block_size].into_boxed_slice()),
            uptodate: AtomicBool::new(false),
            verified: AtomicBool::new(false),
            slots_verified: AtomicU64::new(0),
            referenced: AtomicBool::new(true),
        }
    }

    pub fn block(&self) -> u64 {
        self.block
    }

    /// Shared access to the bytes.
    pub fn read(&self) -> RwLockReadGuard<'_, Box<[u8]>> {
        self.data.read()
    }

    /// Exclusive access to the bytes. Only `journal/` calls this: every other
    /// layer changes metadata through `Handle::get_write_access`, which is
    /// what makes the change part of a transaction.
    pub(crate) fn write_unjournaled(&self) -> RwLockWriteGuard<'_, Box<[u8]>> {
        self.data.write()
    }

    /// Whether the bytes were read or made (a buffer just filed for a
    /// read in progress has neither).
    pub fn is_uptodate(&self) -> bool {
        self.uptodate.load(Ordering::Acquire)
    }

    pub fn is_verified(&self) -> bool {
        self.verified.load(Ordering::Acquire)
    }

    pub fn set_verified(&self) {
        self.verified.store(true, Ordering::Release);
    }

    /// Whether slot `slot`'s checksum was verified since the block was read
    /// from the device, or the slot was last written by the format layer.
    pub fn is_slot_verified(&self, slot: usize) -> bool {
        slot < VERIFIED_SLOTS && self.slots_verified.load(Ordering::Acquire) & (1 << slot) != 0
    }

    /// Remember slot `slot` as verified (a slot past the bitmap is not).
    /// Callers hold the bytes' lock, shared after verifying them or
    /// exclusive after writing them, so no writer can slip in between.
    pub fn set_slot_verified(&self, slot: usize) {
        if slot < VERIFIED_SLOTS {
            self.slots_verified.fetch_or(1 << slot, Ordering::AcqRel);
        }
    }
}

/// Slots per buffer whose verification is remembered: every inode of a
/// 4 KiB table block of 128-byte inodes or larger; beyond (64 KiB blocks,
/// say), the rest are verified at every read.
pub const VERIFIED_SLOTS: usize = 64;

impl std::fmt::Debug for Buffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Buffer({})", self.block)
    }
}

struct CacheInner {
    map: NumberMap<u64, Arc<Buffer>>,
    /// Eviction order (clock). May hold blocks no longer in `map`; those are
    /// dropped when the hand reaches them.
    clock: VecDeque<u64>,
}

#[derive(Debug, Default, Clone, Copy)]
pub struct CacheStats {
    pub hits: u64,
    pub misses: u64,
    pub evictions: u64,
    pub resident: u64,
    pub capacity: u64,
}

pub struct BufferCache {
    dev: Arc<dyn BlockDevice>,
    block_size: usize,
    /// Upper bound on resident buffers that the cache enforces on its own;
    /// pinned buffers may exceed it, and then `over_capacity` tells the
    /// journal to commit and checkpoint.
    capacity: usize,
    inner: Mutex<CacheInner>,
    hits: AtomicU64,
    misses: AtomicU64,
    evictions: AtomicU64,
}

impl BufferCache {
    pub fn new(dev: Arc<dyn BlockDevice>, block_size: usize, capacity_bytes: u64) -> Self {
        assert!(block_size.is_power_of_two() && block_size >= 1024);
        // A floor keeps tiny settings workable: one operation may pin a few
        // dozen blocks (path through two extent trees, bitmaps, descriptors).
        let capacity = ((capacity_bytes / block_size as u64) as usize).max(256);
        BufferCache {
            dev,
            block_size,
            capacity,
            inner: Mutex::new(CacheInner {
                map: NumberMap::default(),
                clock: VecDeque::new(),
            }),
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
            evictions: AtomicU64::new(0),
        }
    }

    /// How many buffers the cache keeps (pinned ones may exceed it).
    pub fn capacity_blocks(&self) -> usize {
        self.capacity
    }

    pub fn block_size(&self) -> usize {
        self.block_size
    }

    pub fn device(&self) -> &Arc<dyn BlockDevice> {
        &self.dev
    }

    fn device_blocks(&self) -> u64 {
        self.dev.size_bytes() / self.block_size as u64
    }

    /// Find or insert the buffer for `block`, without reading it.
    fn lookup_or_insert(&self, block: u64) -> Arc<Buffer> {
        let mut inner = self.inner.lock();
        if let Some(buffer) = inner.map.get(&block) {
            debug_assert_eq!(
                buffer.block, block,
                "the cache filed a buffer under another block"
            );
            buffer.referenced.store(true, Ordering::Relaxed);
            self.hits.fetch_add(1, Ordering::Relaxed);
            return Arc::clone(buffer);
        }
        self.misses.fetch_add(1, Ordering::Relaxed);
        let buffer = Arc::new(Buffer::new(block, self.block_size));
        inner.map.insert(block, Arc::clone(&buffer));
        inner.clock.push_back(block);
        // Every resident buffer is on the clock (which may also hold
        // forgotten ones): one the hand never reaches is never evicted.
        debug_assert!(inner.clock.len() >= inner.map.len());
        if inner.map.len() > self.capacity {
            self.evict(&mut inner);
        }
        buffer
    }

    /// One sweep of the clock hand, bounded by the queue length: evict
    /// unreferenced, unpinned buffers until back under capacity.
    fn evict(&self, inner: &mut CacheInner) {
        let mut budget = inner.clock.len();
        while inner.map.len() > self.capacity && budget > 0 {
            budget -= 1;
            let Some(block) = inner.clock.pop_front() else {
                break;
            };
            let Some(buffer) = inner.map.get(&block) else {
                continue; // forgotten earlier
            };
            // strong_count == 1: only the map holds it, and nobody can clone
            // it without `inner`, which we hold.
            let pinned = Arc::strong_count(buffer) > 1;
            if !pinned && !buffer.referenced.swap(false, Ordering::Relaxed) {
                inner.map.remove(&block);
                self.evictions.fetch_add(1, Ordering::Relaxed);
            } else {
                inner.clock.push_back(block);
            }
        }
    }

    /// The buffer for `block`, read from the device if not cached.
    pub fn read(&self, block: u64) -> Result<Arc<Buffer>> {
        if block >= self.device_blocks() {
            return Err(Error::corrupt(
                Location::Block { block },
                format!(
                    "block number beyond the device ({} blocks)",
                    self.device_blocks()
                ),
            ));
        }
        let buffer = self.lookup_or_insert(block);
        if !buffer.uptodate.load(Ordering::Acquire) {
            let mut data = buffer.data.write();
            // Another thread may have completed the read while we waited.
            if !buffer.uptodate.load(Ordering::Acquire) {
                self.dev
                    .read_at(block * self.block_size as u64, &mut data)
                    .map_err(Error::Io)?;
                buffer.uptodate.store(true, Ordering::Release);
            }
        }
        Ok(buffer)
    }

    /// The buffer for a block whose whole content the caller is about to
    /// write (a freshly allocated metadata block): no device read. The bytes
    /// are whatever the cache held, or zeros; the caller initialises them
    /// through a journal handle.
    pub fn get_for_overwrite(&self, block: u64) -> Result<Arc<Buffer>> {
        if block >= self.device_blocks() {
            return Err(Error::corrupt(
                Location::Block { block },
                "new block beyond the device",
            ));
        }
        let buffer = self.lookup_or_insert(block);
        if !buffer.uptodate.load(Ordering::Acquire) {
            let _data = buffer.data.write();
            buffer.uptodate.store(true, Ordering::Release);
        }
        Ok(buffer)
    }

    /// The buffer for `block` if it is resident, without reading it.
    pub fn peek(&self, block: u64) -> Option<Arc<Buffer>> {
        self.inner.lock().map.get(&block).cloned()
    }

    /// Drop the cached copy of a block that stops being metadata (freed), so
    /// that a stale copy can never be written over its next owner's data.
    /// The journal must already be done with it, or have marked it freed
    /// (revoked: never logged or written home again).
    pub fn forget(&self, block: u64) {
        let removed = self.inner.lock().map.remove(&block);
        if cfg!(debug_assertions)
            && let Some(buffer) = removed
        {
            // Outside `inner`, a leaf lock: the journal head ranks above it.
            let head = buffer.journal.lock();
            let held = head.running.is_some()
                || head.committing.is_some()
                || head.logging.is_some()
                || head.checkpoint.is_some();
            debug_assert!(
                head.freed || !held,
                "block {block} forgotten while the journal still means to write it: {:?}",
                *head
            );
        }
    }

    /// Write a buffer's current bytes to its home location.
    pub fn write_home(&self, buffer: &Buffer) -> Result<()> {
        // Bytes never read nor made would overwrite the block with zeros.
        debug_assert!(
            buffer.uptodate.load(Ordering::Acquire),
            "block {} written home before its bytes were read or made",
            buffer.block
        );
        let data = buffer.data.read();
        self.dev
            .write_at(buffer.block * self.block_size as u64, &data)
            .map_err(Error::Io)
    }

    pub fn flush_device(&self) -> Result<()> {
        self.dev.flush().map_err(Error::Io)
    }

    /// True when pinned buffers keep the cache above its bound: the journal
    /// layer answers by committing and checkpointing (or, unjournaled, by
    /// writing back).
    pub fn over_capacity(&self) -> bool {
        self.inner.lock().map.len() > self.capacity
    }

    pub fn stats(&self) -> CacheStats {
        let inner = self.inner.lock();
        CacheStats {
            hits: self.hits.load(Ordering::Relaxed),
            misses: self.misses.load(Ordering::Relaxed),
            evictions: self.evictions.load(Ordering::Relaxed),
            resident: inner.map.len() as u64,
            capacity: self.capacity as u64,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dev::MemoryDevice;

    #[test]
    fn reads_through_and_evicts_only_unpinned() {
        let dev = Arc::new(MemoryDevice::new(1024 * 1024));
        dev.write_at(5 * 1024, &[7u8; 1024]).unwrap();
        let cache = BufferCache::new(dev, 1024, 0); // floor: 256 blocks
        let pinned = cache.read(5).unwrap();
        assert_eq!(pinned.read()[0], 7);
        for block in 10..1000 {
            cache.read(block).unwrap();
        }
        let stats = cache.stats();
        assert!(stats.resident <= stats.capacity + 1, "{stats:?}");
        assert!(stats.evictions > 0);
        // The pinned buffer survived and is the same object.
        let again = cache.read(5).unwrap();
        assert!(Arc::ptr_eq(&pinned, &again));
    }

    #[test]
    fn refuses_blocks_beyond_device() {
        let dev = Arc::new(MemoryDevice::new(64 * 1024));
        let cache = BufferCache::new(dev, 1024, 1 << 20);
        assert!(cache.read(64).unwrap_err().is_corruption());
        assert!(cache.read(63).is_ok());
    }
}
