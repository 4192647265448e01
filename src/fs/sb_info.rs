//! The superblock while mounted (the kernel's `ext4_sb_info`): its fields
//! under one lock, and the free block and inode totals as counters.
//!
//! The totals change with every allocation and release; kept in the
//! superblock they made every operation dirty one shared block. Like
//! ext4's percpu counters they are atomics here (`Groups` moves them with
//! each descriptor it writes), and the superblock carries them only when
//! it is written: into each transaction at its commit's lock-down (the
//! `CommitHook` — every handle of it has stopped, so the counts agree with
//! exactly the bitmaps and descriptors it holds), before each write-back
//! pass unjournaled, and at mount and unmount. They start from the sum of
//! the group descriptors, as the kernel's do.
//!
//! Locks: `sb` [Superblock], then the superblock's buffer [Buffer].

use super::budget::Budget;
use crate::cache::{Buffer, BufferCache};
use crate::error::Result;
use crate::format::superblock::{Geometry, SUPERBLOCK_SIZE, Superblock};
use crate::journal::{CommitAccess, CommitHook, Handle};
use crate::lock::{Mutex, MutexGuard, Rank};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

pub(crate) struct SbInfo {
    /// [Superblock] Every field but the free counts, which are stale here.
    sb: Mutex<Superblock>,
    /// The block holding the superblock, kept resident, and where in it.
    buffer: Arc<Buffer>,
    offset: usize,
    /// Free clusters, the sum of the descriptors' counts (the kernel's
    /// `s_freeclusters_counter`; a cluster is a block without bigalloc).
    free_blocks: AtomicU64,
    /// Blocks per cluster: `s_free_blocks_count` is in blocks.
    cluster_ratio: u64,
    /// `s_free_inodes_count` (`s_freeinodes_counter`).
    free_inodes: AtomicU64,
    /// The running transaction's space budget, moved to the next one at
    /// each lock-down (the kernel keeps its dirty-clusters counter here).
    pub budget: Budget,
}

impl SbInfo {
    /// The superblock `sb`, whose free counts are taken as given (the
    /// caller sums them from the descriptors: clusters).
    pub fn new(
        geo: &Geometry,
        sb: Superblock,
        cache: &BufferCache,
        budget: Budget,
    ) -> Result<Arc<SbInfo>> {
        let (block, offset) = geo.superblock_location();
        let buffer = cache.read(block)?;
        Ok(Arc::new(SbInfo {
            budget,
            free_blocks: AtomicU64::new(sb.free_blocks_count),
            free_inodes: AtomicU64::new(sb.free_inodes_count as u64),
            cluster_ratio: geo.cluster_ratio as u64,
            sb: Mutex::new(Rank::Superblock, sb),
            buffer,
            offset,
        }))
    }

    /// The superblock's fields (the free counts in it are stale: see
    /// `free_blocks`, `free_inodes`).
    pub fn lock(&self) -> MutexGuard<'_, Superblock> {
        self.sb.lock()
    }

    pub fn free_blocks(&self) -> u64 {
        self.free_blocks.load(Ordering::Acquire)
    }

    pub fn free_inodes(&self) -> u64 {
        self.free_inodes.load(Ordering::Acquire)
    }

    /// Move the totals by what a group descriptor's counts moved.
    pub fn add_free(&self, blocks: i64, inodes: i64) {
        if blocks != 0 {
            let before = self.free_blocks.fetch_add(blocks as u64, Ordering::AcqRel);
            debug_assert!(
                before as i64 + blocks >= 0,
                "free block total below zero ({before} {blocks:+})"
            );
        }
        if inodes != 0 {
            let before = self.free_inodes.fetch_add(inodes as u64, Ordering::AcqRel);
            debug_assert!(
                before as i64 + inodes >= 0,
                "free inode total below zero ({before} {inodes:+})"
            );
        }
    }

    /// Set the totals (fast-commit replay recounts them from the groups).
    pub fn set_free(&self, blocks: u64, inodes: u64) {
        self.free_blocks.store(blocks, Ordering::Release);
        self.free_inodes.store(inodes, Ordering::Release);
    }

    /// `sb` with the current totals: what is written to disk (free
    /// clusters as blocks, as ext4_commit_super writes them).
    pub fn with_counts(&self, sb: &Superblock) -> Superblock {
        let mut sb = sb.clone();
        sb.free_blocks_count = self.free_blocks() * self.cluster_ratio;
        sb.free_inodes_count = self.free_inodes().min(u32::MAX as u64) as u32;
        sb
    }

    /// Write `sb` (the guard's superblock, with the current totals) into
    /// its buffer in `handle`'s transaction.
    pub fn write(&self, sb: &Superblock, handle: &Handle<'_>) -> Result<()> {
        let mut full = self.with_counts(sb);
        let mut bytes = handle.get_write_access(&self.buffer)?;
        bytes[self.offset..self.offset + SUPERBLOCK_SIZE].copy_from_slice(full.encode());
        Ok(())
    }
}

impl CommitHook for SbInfo {
    fn before_commit(&self, access: &CommitAccess<'_>) {
        // Every handle of the transaction has stopped and none of the next
        // one has started: the next one's budget is what is free now.
        self.budget.transition(self.free_blocks());
        let sb = self.sb.lock();
        let mut full = self.with_counts(&sb);
        access.change(&self.buffer, |bytes| {
            bytes[self.offset..self.offset + SUPERBLOCK_SIZE].copy_from_slice(full.encode());
        });
    }
}
