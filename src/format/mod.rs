//! ext2/3/4 on-disk structures, each parsed and written in one module.
//!
//! No other layer touches raw metadata bytes: `fs/` asks this layer to
//! decode, change and re-encode structures, and every structure that
//! metadata_csum covers is verified here on read and re-checksummed here on
//! write (see `csum.rs` for the shared compute/verify/set shape).
//!
//! Algorithms that change the shape of a structure (extent tree splits,
//! htree splits, xattr block copy-on-write) need blocks allocated and freed;
//! they get that through [`MetaCtx`], which `fs/` builds around its allocator,
//! so this layer stays below `fs/` in the layer picture.
//!
//! Space is charged where the costs are known: each algorithm that may
//! allocate charges its worst case (`MetaCtx::charge`, `charge_run`)
//! before its first change, from what it has read of the structure (a
//! leaf with room costs nothing), so that running out of space fails a
//! step before anything changed. Operations that must not fail half-way
//! charge their whole cost first from the estimates here
//! (`dir::add_entry_cost`, `mapping::append_cost`); `fs/budget.rs` holds
//! the budget the charges go against.

pub mod acl;
pub mod bitmap;
pub mod blockmap;
pub mod bytelog;
pub mod casefold;
pub mod csum;
pub mod dir;
pub mod extent;
pub mod fast_commit;
pub mod fscrypt;
pub mod group_desc;
pub mod htree;
pub mod inline;
pub mod inode;
pub mod mapping;
pub mod mmp;
pub mod orphan;
pub mod quota;
pub mod superblock;
pub mod verity;
pub mod xattr;

use crate::cache::{Buffer, BufferCache};
use crate::error::{Error, Result};
use crate::journal::Handle;
use std::sync::Arc;
pub use superblock::Geometry;

/// Block allocation as seen from the format layer. Implemented by `fs/`.
pub trait BlockAllocator {
    /// Make sure the operation holds `blocks` charged to the space budget
    /// and not yet allocated (what it holds already counts). ENOSPC when
    /// the budget cannot cover them; nothing is charged then.
    fn charge(&mut self, blocks: u64) -> Result<()>;

    /// `charge` for `fixed` blocks and up to `flexible` more: returns how
    /// many of `flexible` are covered, at least one (when `flexible` > 0).
    fn charge_run(&mut self, fixed: u64, flexible: u64) -> Result<u64>;

    /// Allocate up to `count` contiguous blocks near `goal` (at least one);
    /// returns the first block and how many were allocated. The blocks are
    /// marked in use in the bitmap and counted in the descriptors; the caller
    /// accounts them in the owning inode's `i_blocks`. They must have been
    /// charged.
    fn alloc_blocks(&mut self, handle: &Handle<'_>, goal: u64, count: u32) -> Result<(u64, u32)>;

    /// `alloc_blocks` for data blocks of inode `ino`, which maps `mapped`
    /// blocks so far: the allocator may keep free blocks after the run for
    /// the file's next one (a preallocation window, in memory only).
    fn alloc_file_blocks(
        &mut self,
        handle: &Handle<'_>,
        (ino, mapped): (u32, u64),
        goal: u64,
        count: u32,
    ) -> Result<(u64, u32)> {
        let _ = (ino, mapped);
        self.alloc_blocks(handle, goal, count)
    }

    /// Return `count` blocks starting at `start` to the free pool. Blocks
    /// that held metadata are also forgotten by the cache and the journal
    /// (`Handle::forget`); `metadata` says which kind they were.
    fn free_blocks(
        &mut self,
        handle: &Handle<'_>,
        start: u64,
        count: u64,
        metadata: bool,
    ) -> Result<()>;

    /// ea_inode: an EA inode holding `value` for an attribute of inode
    /// `owner`, with one reference for it: an EA inode already holding an
    /// equal value, its count one higher (the kernel's
    /// `ext4_xattr_inode_lookup_create`, through its cache of EA inodes by
    /// hash), or a new one, its count 1 and `hash` (the value's CRC32C)
    /// kept as the kernel keeps them (`ext4_xattr_inode_create`,
    /// `ext4_xattr_inode_write`); returns its number. `also` blocks more,
    /// which the same change allocates after it (a new xattr block), are
    /// charged with the EA inode's, before anything is allocated: nothing
    /// then fails for want of space once the EA inode exists. Where the
    /// format layer runs without the filesystem around it, not offered.
    fn ea_inode_for(&mut self, owner: u32, value: &[u8], hash: u32, also: u64) -> Result<u32> {
        let _ = (owner, value, hash, also);
        Err(Error::NotSupported)
    }

    /// ea_inode: one reference more (`delta` 1) or one less (-1) to EA
    /// inode `ino`, named by an attribute of inode `owner`
    /// (`ext4_xattr_inode_update_ref`); the last reference gone, the EA
    /// inode is freed.
    fn change_ea_inode_refs(&mut self, owner: u32, ino: u32, delta: i32) -> Result<()> {
        let _ = (owner, ino, delta);
        Err(Error::NotSupported)
    }
}

/// What a format algorithm that changes structure needs from around it.
pub struct MetaCtx<'a, 'j> {
    pub geo: &'a Geometry,
    pub cache: &'a BufferCache,
    pub handle: &'a Handle<'j>,
    pub alloc: &'a mut dyn BlockAllocator,
}

impl MetaCtx<'_, '_> {
    /// See `BlockAllocator::charge`.
    pub fn charge(&mut self, blocks: u64) -> Result<()> {
        self.alloc.charge(blocks)
    }

    /// See `BlockAllocator::charge_run`.
    pub fn charge_run(&mut self, fixed: u64, flexible: u64) -> Result<u64> {
        self.alloc.charge_run(fixed, flexible)
    }

    /// Allocate one block to hold metadata and return its (zeroed) buffer.
    /// The caller fills it through `handle.get_create_access`. With
    /// bigalloc it takes a whole cluster and is its first block, as the
    /// kernel's `ext4_new_meta_blocks`; the owner counts the cluster.
    pub fn new_meta_block(&mut self, goal: u64) -> Result<Arc<Buffer>> {
        let ratio = self.geo.cluster_ratio;
        let (block, _) = self.alloc.alloc_blocks(self.handle, goal, ratio)?;
        let buffer = self.cache.get_for_overwrite(block)?;
        {
            let mut data = self.handle.get_create_access(&buffer)?;
            data.fill(0);
        }
        Ok(buffer)
    }

    /// Free one metadata block (with bigalloc, the cluster it lies in,
    /// which held nothing else).
    pub fn free_meta_block(&mut self, block: u64) -> Result<()> {
        let ratio = self.geo.cluster_ratio as u64;
        let first = self.geo.cluster_start(block);
        self.alloc.free_blocks(self.handle, first, ratio, true)
    }
}

// Little-endian field access, shared with the journal (`crate::bytes`).
pub use crate::bytes::{get_u8, get_u16, get_u32, get_u64, put_u8, put_u16, put_u32, put_u64};
