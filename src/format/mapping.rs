//! Logical → physical block mapping of an inode: the one entry point `fs/`
//! calls, whichever scheme the inode uses.
//!
//! An inode maps its logical blocks either with an ext4 extent tree
//! (`EXT4_EXTENTS_FL` set, `extent.rs`) or with the ext2/ext3 block map of
//! direct and indirect pointers (`blockmap.rs`). This module only dispatches
//! on `Inode::uses_extents` and defines the shared vocabulary.
//!
//! An inode with inline data (`inline.rs`) maps no block at all: every
//! logical block is a hole here, and it occupies none; its bytes are read
//! through `inline`, never through a mapping. Nothing allocates blocks for
//! one before it is converted to extents.
//!
//! Accounting contract: `inode.blocks` (`i_blocks`, 512-byte units) is
//! updated here for every data block and every tree or indirect block that
//! these functions allocate or free, so a caller never counts blocks itself.
//! Data blocks are freed with `metadata = false`; tree and indirect blocks go
//! through `MetaCtx::free_meta_block`. Data blocks never pass through the
//! buffer cache; tree and indirect blocks are metadata, read through the
//! cache and changed only under a journal handle.
//!
//! The inode itself (its `i_block` area holds the extent root or the direct
//! pointers) is changed in memory only: the caller writes it back.
//!
//! Every change to a mapping is reported here, once, to the handle's
//! observer (`Handle::note`, `journal::change`): fast commits record the
//! logical ranges whose mapping changed and look the physical blocks up
//! when they commit, as the kernel does.

use super::inode::Inode;
use super::superblock::Geometry;
use super::{MetaCtx, blockmap, extent};
use crate::cache::BufferCache;
use crate::error::{Error, Result};
use crate::journal::change::{Change, Ineligible};

/// A run of logical blocks mapped to consecutive physical blocks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Extent {
    pub logical: u64,
    pub physical: u64,
    pub len: u32,
    /// Allocated but never written (fallocate): reads return zeros. Only
    /// extent trees can say so (ext4_extents.h: ee_len above 32768).
    pub unwritten: bool,
}

impl Extent {
    /// One past the last logical block.
    pub fn end(&self) -> u64 {
        self.logical + self.len as u64
    }

    /// The physical block that `lblk` (inside this extent) maps to.
    pub fn physical_of(&self, lblk: u64) -> u64 {
        debug_assert!(lblk >= self.logical && lblk < self.end());
        self.physical + (lblk - self.logical)
    }

    /// The part of this extent from `lblk` on.
    pub fn trimmed_to(&self, lblk: u64) -> Extent {
        debug_assert!(lblk >= self.logical && lblk < self.end());
        Extent {
            logical: lblk,
            physical: self.physical_of(lblk),
            len: (self.end() - lblk) as u32,
            unwritten: self.unwritten,
        }
    }
}

/// What a logical block maps to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lookup {
    /// `lblk` is mapped; the returned run starts AT lblk (trimmed), len >= 1.
    Mapped(Extent),
    /// `lblk` is a hole; `next` is the first mapped logical block after it, if any.
    Hole { next: Option<u64> },
}

/// One block (or run) that an inode's mapping occupies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BlockUse {
    /// File data.
    Data(Extent),
    /// An extent tree block (index or leaf) or an indirect block.
    Meta(u64),
}

/// Map logical block `lblk` of inode `ino`.
pub fn lookup(
    geo: &Geometry,
    cache: &BufferCache,
    ino: u32,
    inode: &Inode,
    lblk: u64,
) -> Result<Lookup> {
    if inode.has_inline_data() {
        return Ok(Lookup::Hole { next: None });
    }
    if inode.uses_extents() {
        extent::lookup(geo, cache, ino, inode, lblk)
    } else {
        blockmap::lookup(geo, cache, ino, inode, lblk)
    }
}

/// Allocate blocks for the hole starting at `lblk` (at most `len`, never beyond the hole's end), map them,
/// return the new extent (may be shorter than len when free space is fragmented; caller loops).
/// Goal: the physical block right after the mapping of lblk-1 if any (contiguity), else the caller's `goal`.
/// `unwritten` (fallocate) is only for extent inodes; block-map inodes return Error::NotSupported.
pub fn allocate(
    ctx: &mut MetaCtx,
    ino: u32,
    inode: &mut Inode,
    lblk: u64,
    len: u32,
    goal: u64,
    unwritten: bool,
) -> Result<Extent> {
    debug_assert!(len > 0, "allocating nothing");
    refuse_inline(inode)?;
    let extent = if inode.uses_extents() {
        extent::allocate(ctx, ino, inode, lblk, len, goal, unwritten)?
    } else {
        blockmap::allocate(ctx, ino, inode, lblk, len, goal, unwritten)?
    };
    debug_assert_eq!(extent.logical, lblk, "a mapping starts where it was asked");
    note_range(ctx, ino, inode, extent.logical, extent.end(), true);
    Ok(extent)
}

/// Mapping blocks (extent-tree or indirect) that allocating `blocks` new
/// blocks from `lblk` (a hole) on, in separate runs at worst, may take
/// besides the blocks themselves: what an operation that must not fail
/// half-way charges first (`mapping::allocate` charges its own step).
pub fn append_cost(
    geo: &Geometry,
    cache: &BufferCache,
    ino: u32,
    inode: &Inode,
    lblk: u64,
    blocks: u32,
) -> Result<u64> {
    if blocks == 0 {
        return Ok(0);
    }
    if inode.uses_extents() {
        extent::append_cost(geo, cache, ino, inode, lblk, blocks)
    } else {
        blockmap::append_cost(geo, cache, ino, inode, lblk, blocks)
    }
}

/// A bound on `append_cost` from the inode alone (no block read): what an
/// operation may charge instead of the exact cost while the budget is far
/// from spent.
pub fn append_cost_bound(inode: &Inode, blocks: u32) -> u64 {
    let per_block = if inode.uses_extents() {
        extent::depth(inode).min(extent::MAX_DEPTH) as u64 + 2
    } else {
        blockmap::MAX_LEVELS as u64
    };
    blocks as u64 * per_block
}

/// Convert [lblk, lblk+len) from unwritten to written (splitting extents as needed). No-op for block maps.
pub fn mark_written(
    ctx: &mut MetaCtx,
    ino: u32,
    inode: &mut Inode,
    lblk: u64,
    len: u64,
) -> Result<()> {
    refuse_inline(inode)?;
    if inode.uses_extents() {
        extent::mark_written(ctx, ino, inode, lblk, len)?;
        note_range(ctx, ino, inode, lblk, lblk + len, false);
    }
    Ok(())
}

/// Unmap [start, end) (end None = to the end: truncate) and free the data blocks, plus tree/indirect
/// blocks that become empty. Partial extents are split/trimmed.
pub fn punch(
    ctx: &mut MetaCtx,
    ino: u32,
    inode: &mut Inode,
    start: u64,
    end: Option<u64>,
) -> Result<()> {
    if end.is_some_and(|end| end <= start) {
        return Ok(());
    }
    refuse_inline(inode)?;
    // Reported first: a punch that fails part-way has changed the mapping
    // already.
    let limit = max_blocks(ctx.geo, inode);
    note_range(
        ctx,
        ino,
        inode,
        start,
        end.unwrap_or(limit).min(limit),
        false,
    );
    if inode.uses_extents() {
        extent::punch(ctx, ino, inode, start, end)
    } else {
        blockmap::punch(ctx, ino, inode, start, end)
    }
}

/// Blocks are never mapped for an inode whose data is inline: it is
/// converted to extents first.
fn refuse_inline(inode: &Inode) -> Result<()> {
    if inode.has_inline_data() {
        return Err(Error::NotSupported);
    }
    Ok(())
}

/// Report that logical blocks `start..end` of `ino` map differently
/// (`allocated`: newly mapped). A directory's blocks are not ranges
/// (replay rebuilds a directory from its names), but a directory that grew
/// is something the kernel's replay gets wrong; a block-mapped file's
/// mapping cannot be replayed from records.
fn note_range(ctx: &MetaCtx, ino: u32, inode: &Inode, start: u64, end: u64, allocated: bool) {
    if start >= end {
        return;
    }
    if inode.is_dir() {
        if allocated {
            ctx.handle
                .note(Change::Ineligible(Ineligible::DirectoryGrew));
        }
        return;
    }
    let change = if inode.uses_extents() {
        Change::Range { ino, start, end }
    } else {
        Change::Ineligible(Ineligible::BlockMapped)
    };
    ctx.handle.note(change);
}

/// Empty mapping for a new inode: extent header in i_block (and EXTENTS flag) if `extents`, else zeros.
pub fn init(inode: &mut Inode, extents: bool) {
    if extents {
        extent::init(inode);
    } else {
        blockmap::init(inode);
    }
}

/// Call `f` for every block the mapping occupies: data runs and tree/indirect blocks (for walks and
/// checks). Bounded; corrupt structures give Error::Corrupt.
pub fn for_each_block(
    geo: &Geometry,
    cache: &BufferCache,
    ino: u32,
    inode: &Inode,
    f: &mut dyn FnMut(BlockUse) -> Result<()>,
) -> Result<()> {
    if inode.has_inline_data() {
        return Ok(());
    }
    if inode.uses_extents() {
        extent::for_each_block(geo, cache, ino, inode, f)
    } else {
        blockmap::for_each_block(geo, cache, ino, inode, f)
    }
}

/// Largest logical block count addressable by this inode's scheme.
pub fn max_blocks(geo: &Geometry, inode: &Inode) -> u64 {
    if inode.uses_extents() {
        extent::max_blocks(geo)
    } else {
        blockmap::max_blocks(geo)
    }
}

/// `i_blocks` units (512-byte sectors) per filesystem block.
pub(super) fn sectors_per_block(geo: &Geometry) -> u64 {
    geo.block_size as u64 / 512
}

/// `i_blocks` units per cluster: what one allocation counts (bigalloc
/// counts whole clusters, as the kernel's `EXT4_C2B` charges and e2fsck
/// checks; a block without bigalloc).
pub(super) fn sectors_per_cluster(geo: &Geometry) -> u64 {
    geo.cluster_bytes() / 512
}

/// The most sectors `i_blocks` can count: 32 bits without huge_file, 48
/// with it (ext4.h i_blocks_lo + l_i_blocks_high; HUGE_FILE_FL beyond that
/// is not produced by this crate for a single file's mapping).
pub(super) fn max_sectors(geo: &Geometry) -> u64 {
    if geo.has_ro_compat(super::superblock::ro_compat::HUGE_FILE) {
        (1 << 48) - 1
    } else {
        (1 << 32) - 1
    }
}
