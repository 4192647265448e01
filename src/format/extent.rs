//! ext4 extent trees: the node format and the tree algorithms behind
//! `mapping.rs` for inodes with `EXT4_EXTENTS_FL`.
//!
//! On disk (ext4_extents.h, Documentation/filesystems/ext4/ifork.rst) every
//! node starts with a 12-byte header (magic 0xF30A, entries, max, depth,
//! generation) followed by 12-byte entries: index entries (first logical
//! block covered, child block) above depth 0, extents (first logical block,
//! length, physical start) at depth 0. The root lives in the inode's 60-byte
//! `i_block` (4 entries); other nodes fill a block and end with a 4-byte
//! `ext4_extent_tail` right after `eh_max` entries, holding the CRC32C (inode
//! seed) of the block up to the tail.
//!
//! Invariants this module keeps, and checks on read, because the kernel
//! (`__ext4_ext_check`) and e2fsck (`scan_extent_node`) check them: entries
//! sorted and non-overlapping; an index key equals the first logical block
//! of the node below it; every key of a child lies below the parent's next
//! key; index nodes are never empty; an empty tree is a depth-0 root.
//!
//! Nodes are decoded into a [`Node`], changed in memory and encoded back:
//! byte conversion happens only in `Node::decode` / `Node::encode`. A
//! change that needs room (a full leaf) makes room one step at a time
//! (split the topmost full node below a node with room, or grow the root)
//! and then starts over from the root, so each step leaves a valid tree and
//! no path is ever patched after a split.

use super::csum::{crc32c_raw, inode_seed};
use super::inode::{I_BLOCK_SIZE, Inode, flags};
use super::mapping::{self, BlockUse, Extent, Lookup};
use super::superblock::Geometry;
use super::{MetaCtx, get_u16, get_u32, put_u16, put_u32};
use crate::cache::BufferCache;
use crate::ensure_format;
use crate::error::{Error, Location, Result};
use smallvec::{SmallVec, smallvec};

pub const EXTENT_MAGIC: u16 = 0xF30A;
const HEADER_SIZE: usize = 12;
const ENTRY_SIZE: usize = 12;
const TAIL_SIZE: usize = 4;
/// Entries that fit the in-inode root after its header.
pub const ROOT_CAPACITY: u16 = ((I_BLOCK_SIZE - HEADER_SIZE) / ENTRY_SIZE) as u16;
/// ext4_extents.h EXT4_MAX_EXTENT_DEPTH; e2fsck refuses deeper trees.
pub const MAX_DEPTH: u16 = 5;
/// Longest initialized extent: an ee_len of 0x8000 still means initialized.
pub const INIT_MAX_LEN: u32 = 1 << 15;
/// Longest unwritten extent: ee_len above 0x8000 flags unwritten.
pub const UNWRITTEN_MAX_LEN: u32 = INIT_MAX_LEN - 1;
/// ext4.h EXT_MAX_BLOCKS: logical blocks are 32-bit and the kernel keeps
/// the last value out of use, so files span at most 2^32 - 1 blocks.
pub const MAX_LOGICAL_BLOCKS: u64 = 0xFFFF_FFFF;
/// Keys are 32-bit: one past the largest block an extent may cover.
const LOGICAL_LIMIT: u64 = 1 << 32;

/// An index entry: the subtree at `child` covers logical blocks from
/// `logical` up to the next index entry's key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Index {
    pub logical: u64,
    pub child: u64,
}

/// A node's entries in place up to the root's four (a lookup in a file of
/// a few extents allocates nothing), on the heap beyond: a tree block holds
/// hundreds.
pub type Extents = SmallVec<[Extent; ROOT_CAPACITY as usize]>;
pub type Indexes = SmallVec<[Index; ROOT_CAPACITY as usize]>;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Entries {
    Leaf(Extents),
    Index(Indexes),
}

/// One decoded tree node (the root in `i_block`, or a tree block).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Node {
    pub depth: u16,
    pub max: u16,
    pub generation: u32,
    pub entries: Entries,
}

impl Node {
    fn empty_root(generation: u32) -> Node {
        Node {
            depth: 0,
            max: ROOT_CAPACITY,
            generation,
            entries: Entries::Leaf(Extents::new()),
        }
    }

    pub fn len(&self) -> usize {
        match &self.entries {
            Entries::Leaf(extents) => extents.len(),
            Entries::Index(indexes) => indexes.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn is_full(&self) -> bool {
        self.len() >= self.max as usize
    }

    fn first_key(&self) -> Option<u64> {
        match &self.entries {
            Entries::Leaf(extents) => extents.first().map(|e| e.logical),
            Entries::Index(indexes) => indexes.first().map(|i| i.logical),
        }
    }

    /// One past the last logical block the node's entries claim.
    fn end_key(&self) -> Option<u64> {
        match &self.entries {
            Entries::Leaf(extents) => extents.last().map(Extent::end),
            Entries::Index(indexes) => indexes.last().map(|i| i.logical + 1),
        }
    }

    fn extents_mut(&mut self) -> &mut Extents {
        match &mut self.entries {
            Entries::Leaf(extents) => extents,
            Entries::Index(_) => unreachable!("depth-0 nodes hold extents (checked on decode)"),
        }
    }

    fn indexes_mut(&mut self) -> &mut Indexes {
        match &mut self.entries {
            Entries::Index(indexes) => indexes,
            Entries::Leaf(_) => {
                unreachable!("nodes above depth 0 hold indexes (checked on decode)")
            }
        }
    }

    /// Move entries `at..` into a new node of the same depth with `max`
    /// entries of room.
    fn split_off(&mut self, at: usize, max: u16) -> Node {
        let entries = match &mut self.entries {
            Entries::Leaf(extents) => Entries::Leaf(extents.drain(at..).collect()),
            Entries::Index(indexes) => Entries::Index(indexes.drain(at..).collect()),
        };
        Node {
            depth: self.depth,
            max,
            generation: 0,
            entries,
        }
    }

    /// Parse a node from `bytes` (60 bytes of `i_block`, or a whole block
    /// whose entry room is `capacity`) and check everything that does not
    /// depend on the parent.
    pub fn decode(bytes: &[u8], capacity: u16, geo: &Geometry, location: Location) -> Result<Node> {
        debug_assert!(HEADER_SIZE + capacity as usize * ENTRY_SIZE <= bytes.len());
        let magic = get_u16(bytes, 0);
        let count = get_u16(bytes, 2);
        let max = get_u16(bytes, 4);
        let depth = get_u16(bytes, 6);
        ensure_format!(
            magic == EXTENT_MAGIC,
            location,
            "extent header magic {magic:#06x}"
        );
        ensure_format!(
            max > 0 && max <= capacity,
            location,
            "extent header eh_max {max} outside 1..={capacity}"
        );
        ensure_format!(
            count <= max,
            location,
            "extent header has {count} entries, room for {max}"
        );
        ensure_format!(
            depth <= MAX_DEPTH,
            location,
            "extent tree depth {depth} beyond {MAX_DEPTH}"
        );
        let entries = if depth == 0 {
            Entries::Leaf(decode_extents(bytes, count, geo, location)?)
        } else {
            ensure_format!(count > 0, location, "empty extent index node");
            Entries::Index(decode_indexes(bytes, count, geo, location)?)
        };
        Ok(Node {
            depth,
            max,
            generation: get_u32(bytes, 8),
            entries,
        })
    }

    /// Write header and entries into `bytes`, zeroing the unused entry room
    /// (and, in a block, everything after it up to the end; the checksum
    /// tail is set separately).
    pub fn encode(&self, bytes: &mut [u8]) {
        debug_assert!(self.len() <= self.max as usize);
        debug_assert!(HEADER_SIZE + self.max as usize * ENTRY_SIZE <= bytes.len());
        bytes.fill(0);
        put_u16(bytes, 0, EXTENT_MAGIC);
        put_u16(bytes, 2, self.len() as u16);
        put_u16(bytes, 4, self.max);
        put_u16(bytes, 6, self.depth);
        put_u32(bytes, 8, self.generation);
        match &self.entries {
            Entries::Leaf(extents) => {
                debug_assert_eq!(self.depth, 0);
                for (i, extent) in extents.iter().enumerate() {
                    encode_extent(&mut bytes[HEADER_SIZE + i * ENTRY_SIZE..], extent);
                }
            }
            Entries::Index(indexes) => {
                debug_assert!(self.depth > 0);
                for (i, index) in indexes.iter().enumerate() {
                    let at = HEADER_SIZE + i * ENTRY_SIZE;
                    debug_assert!(index.logical < LOGICAL_LIMIT);
                    put_u32(bytes, at, index.logical as u32);
                    put_u32(bytes, at + 4, index.child as u32);
                    put_u16(bytes, at + 8, (index.child >> 32) as u16);
                }
            }
        }
    }
}

fn encode_extent(bytes: &mut [u8], extent: &Extent) {
    debug_assert!(extent.len > 0 && extent.end() <= LOGICAL_LIMIT);
    let raw_len = if extent.unwritten {
        debug_assert!(extent.len <= UNWRITTEN_MAX_LEN);
        extent.len + INIT_MAX_LEN
    } else {
        debug_assert!(extent.len <= INIT_MAX_LEN);
        extent.len
    };
    put_u32(bytes, 0, extent.logical as u32);
    put_u16(bytes, 4, raw_len as u16);
    put_u16(bytes, 6, (extent.physical >> 32) as u16);
    put_u32(bytes, 8, extent.physical as u32);
}

/// Whether `count` blocks from `start` lie inside the filesystem's data
/// area (e2fsck: an extent starting at block 0, before s_first_data_block
/// or running past the end is bad).
fn blocks_in_filesystem(geo: &Geometry, start: u64, count: u64) -> bool {
    start != 0
        && start >= geo.first_data_block as u64
        && start
            .checked_add(count)
            .is_some_and(|end| end <= geo.blocks_count)
}

fn decode_extents(bytes: &[u8], count: u16, geo: &Geometry, location: Location) -> Result<Extents> {
    let mut extents = Extents::with_capacity(count as usize);
    let mut previous_end = 0;
    for i in 0..count as usize {
        let at = HEADER_SIZE + i * ENTRY_SIZE;
        let raw_len = get_u16(bytes, at + 4) as u32;
        let (len, unwritten) = if raw_len > INIT_MAX_LEN {
            (raw_len - INIT_MAX_LEN, true)
        } else {
            (raw_len, false)
        };
        let extent = Extent {
            logical: get_u32(bytes, at) as u64,
            physical: (get_u16(bytes, at + 6) as u64) << 32 | get_u32(bytes, at + 8) as u64,
            len,
            unwritten,
        };
        ensure_format!(len > 0, location, "extent {i} has length 0");
        ensure_format!(
            extent.end() <= LOGICAL_LIMIT,
            location,
            "extent {i} runs past logical block 2^32"
        );
        ensure_format!(
            extent.logical >= previous_end,
            location,
            "extent {i} at logical {} overlaps or precedes the one before",
            extent.logical
        );
        ensure_format!(
            blocks_in_filesystem(geo, extent.physical, len as u64),
            location,
            "extent {i} maps to blocks {}+{len} outside the filesystem",
            extent.physical
        );
        previous_end = extent.end();
        extents.push(extent);
    }
    Ok(extents)
}

fn decode_indexes(bytes: &[u8], count: u16, geo: &Geometry, location: Location) -> Result<Indexes> {
    let mut indexes = Indexes::with_capacity(count as usize);
    for i in 0..count as usize {
        let at = HEADER_SIZE + i * ENTRY_SIZE;
        let index = Index {
            logical: get_u32(bytes, at) as u64,
            child: get_u32(bytes, at + 4) as u64 | (get_u16(bytes, at + 8) as u64) << 32,
        };
        ensure_format!(
            indexes
                .last()
                .is_none_or(|last| last.logical < index.logical),
            location,
            "index entry {i} at logical {} is out of order",
            index.logical
        );
        ensure_format!(
            blocks_in_filesystem(geo, index.child, 1),
            location,
            "index entry {i} points at block {} outside the filesystem",
            index.child
        );
        indexes.push(index);
    }
    Ok(indexes)
}

/// Entries that fit an extent block after its header, leaving room for the
/// tail (ext4_ext_space_block: (block size - 12) / 12, always >= 4 bytes
/// spare for powers of two from 1 KiB).
pub fn block_capacity(block_size: u32) -> u16 {
    ((block_size as usize - HEADER_SIZE) / ENTRY_SIZE) as u16
}

fn tail_offset(max: u16) -> usize {
    HEADER_SIZE + max as usize * ENTRY_SIZE
}

/// ext4_extent_block_csum: CRC32C from the inode's seed over the block up
/// to the tail, which sits right after `eh_max` entries.
pub fn compute_block_checksum(seed: u32, block: &[u8]) -> u32 {
    let end = tail_offset(get_u16(block, 4));
    debug_assert!(end + TAIL_SIZE <= block.len());
    crc32c_raw(seed, &block[..end])
}

pub fn verify_block_checksum(seed: u32, block: &[u8]) -> bool {
    let end = tail_offset(get_u16(block, 4));
    end + TAIL_SIZE <= block.len() && get_u32(block, end) == compute_block_checksum(seed, block)
}

pub fn set_block_checksum(seed: u32, block: &mut [u8]) {
    let end = tail_offset(get_u16(block, 4));
    let sum = compute_block_checksum(seed, block);
    put_u32(block, end, sum);
}

/// One node on the way from the root to a leaf.
struct Level {
    node: Node,
    /// Where the node lives: `None` for the root in `i_block`.
    block: Option<u64>,
    /// In an index node, the entry followed downwards. In the leaf, the
    /// number of extents starting at or before the searched block: the
    /// extent that may contain it is `pos - 1`, and `pos` is where a new
    /// extent for it would be inserted.
    pos: usize,
}

/// Root first, leaf last: in place for trees of up to two levels.
type Path = SmallVec<[Level; 2]>;

/// What reading a tree needs.
#[derive(Clone, Copy)]
struct Reader<'a> {
    geo: &'a Geometry,
    cache: &'a BufferCache,
    ino: u32,
    /// For the checksum seed, computed only when a tree block is verified:
    /// most trees are their root alone.
    generation: u32,
}

impl<'a> Reader<'a> {
    fn new(geo: &'a Geometry, cache: &'a BufferCache, ino: u32, inode: &Inode) -> Self {
        Reader {
            geo,
            cache,
            ino,
            generation: inode.generation,
        }
    }

    fn seed(&self) -> u32 {
        inode_seed(self.geo.csum_seed, self.ino, self.generation)
    }

    fn root(&self, inode: &Inode) -> Result<Node> {
        let location = Location::Inode { ino: self.ino };
        let root = Node::decode(&inode.block, ROOT_CAPACITY, self.geo, location)?;
        ensure_format!(
            root.max == ROOT_CAPACITY,
            location,
            "extent root eh_max {} is not {ROOT_CAPACITY}",
            root.max
        );
        Ok(root)
    }

    /// Read and check the node `index` points to, one level below a node of
    /// `parent_depth`; its keys must lie in `[index.logical, upper)`.
    fn read_child(&self, parent_depth: u16, index: &Index, upper: u64) -> Result<Node> {
        let location = Location::InodeBlock {
            ino: self.ino,
            block: index.child,
        };
        let buffer = self.cache.read(index.child)?;
        let bytes = buffer.read();
        let capacity = block_capacity(self.geo.block_size);
        if self.geo.metadata_csum && !buffer.is_verified() {
            // The checksum first: it names bit rot more precisely than
            // whatever field it happened to hit. Its position comes from
            // eh_max, which must fit the block to be trusted.
            ensure_format!(
                get_u16(&bytes, 4) <= capacity && verify_block_checksum(self.seed(), &bytes),
                location,
                "extent block checksum mismatch"
            );
        }
        let node = Node::decode(&bytes, capacity, self.geo, location)?;
        buffer.set_verified();
        ensure_format!(
            node.depth + 1 == parent_depth,
            location,
            "extent node depth {} below a node of depth {parent_depth}",
            node.depth
        );
        ensure_format!(
            node.first_key().is_none_or(|key| key == index.logical),
            location,
            "first key {:?} differs from the index key {}",
            node.first_key(),
            index.logical
        );
        ensure_format!(
            node.end_key().is_none_or(|end| end <= upper),
            location,
            "entries reach logical block {:?}, beyond the parent's next key {upper}",
            node.end_key()
        );
        Ok(node)
    }

    /// Walk from the root to the leaf that holds (or would hold) `lblk`.
    fn find_path(&self, inode: &Inode, lblk: u64) -> Result<Path> {
        let mut node = self.root(inode)?;
        let mut block = None;
        let mut upper = LOGICAL_LIMIT;
        let mut path = Path::with_capacity(node.depth as usize + 1);
        // Depth drops by one per level and the root's is at most MAX_DEPTH.
        for _ in 0..=MAX_DEPTH {
            let (pos, down) = match &node.entries {
                Entries::Leaf(extents) => (extents.partition_point(|e| e.logical <= lblk), None),
                Entries::Index(indexes) => {
                    // The last entry whose key is at or before lblk, or the
                    // first one when lblk precedes the whole tree.
                    let pos = indexes
                        .partition_point(|i| i.logical <= lblk)
                        .saturating_sub(1);
                    let next = indexes.get(pos + 1).map_or(upper, |i| i.logical);
                    (pos, Some((indexes[pos], next)))
                }
            };
            let depth = node.depth;
            path.push(Level { node, block, pos });
            let Some((index, child_upper)) = down else {
                return Ok(path);
            };
            node = self.read_child(depth, &index, child_upper)?;
            block = Some(index.child);
            upper = child_upper;
        }
        Err(Error::corrupt(
            Location::Inode { ino: self.ino },
            "extent tree deeper than its root says",
        ))
    }
}

fn leaf(path: &Path) -> &Level {
    &path[path.len() - 1]
}

fn leaf_extents(path: &Path) -> &[Extent] {
    match &leaf(path).node.entries {
        Entries::Leaf(extents) => extents,
        Entries::Index(_) => unreachable!("a path ends at a leaf"),
    }
}

/// The first mapped logical block after `lblk`, from a path found for it.
fn next_mapped(path: &Path, lblk: u64) -> Option<u64> {
    let extents = leaf_extents(path);
    let pos = leaf(path).pos;
    if let Some(extent) = extents.get(pos) {
        debug_assert!(extent.logical > lblk);
        return Some(extent.logical);
    }
    // Past this leaf: the next subtree to the right starts at the key of
    // the nearest ancestor entry after the one we followed.
    path[..path.len() - 1]
        .iter()
        .rev()
        .find_map(|level| match &level.node.entries {
            Entries::Index(indexes) => indexes.get(level.pos + 1).map(|i| i.logical),
            Entries::Leaf(_) => None,
        })
}

fn lookup_in_path(path: &Path, lblk: u64) -> Lookup {
    let extents = leaf_extents(path);
    let pos = leaf(path).pos;
    match pos.checked_sub(1).map(|i| extents[i]) {
        Some(extent) if extent.end() > lblk => Lookup::Mapped(extent.trimmed_to(lblk)),
        _ => Lookup::Hole {
            next: next_mapped(path, lblk),
        },
    }
}

fn max_len(unwritten: bool) -> u32 {
    if unwritten {
        UNWRITTEN_MAX_LEN
    } else {
        INIT_MAX_LEN
    }
}

/// Whether `right` continues `left` logically and physically, in the same
/// state, within the length limit.
fn can_merge(left: &Extent, right: &Extent) -> bool {
    left.unwritten == right.unwritten
        && left.end() == right.logical
        && left.physical + left.len as u64 == right.physical
        && left.len + right.len <= max_len(left.unwritten)
}

/// Tree blocks that inserting `entries` new extents into the leaf on
/// `path` may allocate, for the space budget. None while the leaf has
/// room. One entry: one block per full node from the leaf up — each is
/// split once (`make_room`), or the root grows, and the node the root's
/// entries move to has room. More entries: each may split every level
/// once, of a tree that may have grown by one.
fn insert_cost(path: &Path, entries: usize) -> u64 {
    let leaf = &leaf(path).node;
    if leaf.len() + entries <= leaf.max as usize {
        return 0;
    }
    if entries == 1 {
        let full = path.iter().rev().take_while(|level| level.node.is_full());
        return full.count().max(1) as u64;
    }
    entries as u64 * (path.len() as u64 + 1)
}

/// A tree being changed: the inode (root and i_blocks) and the context
/// that allocates, frees and journals blocks.
struct Writer<'x, 'a, 'j> {
    ctx: &'x mut MetaCtx<'a, 'j>,
    ino: u32,
    inode: &'x mut Inode,
    /// bigalloc, while a range is unmapped: which clusters stay.
    unmapping: Option<ClusterFrees>,
}

/// bigalloc: a file's blocks of one logical cluster all lie in one
/// physical cluster, at the same offsets (the kernel's
/// `get_implied_cluster_alloc` keeps them so, e2fsck's
/// `has_unaligned_cluster_map` checks it), and the cluster is freed when
/// the last of them goes. Unmapping `[start, end)` frees every cluster its
/// blocks lie in but those two ends' clusters that keep blocks outside
/// it, each once (the kernel's `struct partial_cluster`).
#[derive(Debug, Clone, Copy)]
struct ClusterFrees {
    /// Clusters (numbers: block / ratio) still holding mapped blocks.
    keep: [Option<u64>; 2],
    /// The cluster freed last: blocks of one cluster are unmapped one
    /// after the other (their logical cluster is one), perhaps as pieces
    /// of several extents.
    last: Option<u64>,
}

impl<'x, 'a, 'j> Writer<'x, 'a, 'j> {
    fn new(ctx: &'x mut MetaCtx<'a, 'j>, ino: u32, inode: &'x mut Inode) -> Self {
        debug_assert!(inode.uses_extents());
        Writer {
            ctx,
            ino,
            inode,
            unmapping: None,
        }
    }

    fn cluster_ratio(&self) -> u64 {
        self.ctx.geo.cluster_ratio as u64
    }

    /// The physical block of the first mapped block in logical blocks
    /// `from..to`, if any (bigalloc: where that logical cluster lives).
    fn first_mapped_in(&self, from: u64, to: u64) -> Result<Option<u64>> {
        let mut at = from;
        // An index key may lie before its subtree's first extent: each
        // round moves to the next extent or subtree, at most a few.
        for _ in 0..2 * (MAX_DEPTH as usize + 2) {
            if at >= to {
                return Ok(None);
            }
            let path = self.find_path(at)?;
            match lookup_in_path(&path, at) {
                Lookup::Mapped(extent) => return Ok(Some(extent.physical)),
                Lookup::Hole { next: Some(next) } if next > at => at = next,
                Lookup::Hole { .. } => return Ok(None),
            }
        }
        Err(self.corrupt_loop("looking for a cluster's blocks"))
    }

    fn reader(&self) -> Reader<'a> {
        Reader {
            geo: self.ctx.geo,
            cache: self.ctx.cache,
            ino: self.ino,
            generation: self.inode.generation,
        }
    }

    fn find_path(&self, lblk: u64) -> Result<Path> {
        self.reader().find_path(self.inode, lblk)
    }

    fn sectors_per_block(&self) -> u64 {
        mapping::sectors_per_block(self.ctx.geo)
    }

    /// Bound for loops that visit extents one at a time: a consistent tree
    /// maps at most as many runs as i_blocks counts blocks.
    fn extent_visit_limit(&self) -> u64 {
        let blocks = self.inode.blocks / self.sectors_per_block();
        // Per extent: its own step plus, at worst, one split per level
        // and a root growth to make room first.
        (MAX_DEPTH as u64 + 3) * (blocks + 1) + 8
    }

    #[track_caller]
    fn corrupt_loop(&self, what: &str) -> Error {
        Error::corrupt(
            Location::Inode { ino: self.ino },
            format!("{what} did not finish within the extents i_blocks allows"),
        )
    }

    /// Encode a changed node back where it lives.
    fn write_level(&mut self, level: &Level) -> Result<()> {
        let Some(block) = level.block else {
            debug_assert_eq!(level.node.max, ROOT_CAPACITY);
            level.node.encode(&mut self.inode.block);
            return Ok(());
        };
        let buffer = self.ctx.cache.read(block)?;
        let mut bytes = self.ctx.handle.get_write_access(&buffer)?;
        self.encode_block(&level.node, &mut bytes);
        drop(bytes);
        buffer.set_verified();
        Ok(())
    }

    fn encode_block(&self, node: &Node, bytes: &mut [u8]) {
        // A tree block read from disk may have eh_max below the capacity,
        // as the kernel (__ext4_ext_check) and our decoder accept.
        debug_assert!(node.max <= block_capacity(self.ctx.geo.block_size));
        node.encode(bytes);
        if self.ctx.geo.metadata_csum {
            let seed = self.inode.csum_seed(self.ctx.geo, self.ino);
            set_block_checksum(seed, bytes);
            debug_assert!(verify_block_checksum(seed, bytes));
        }
    }

    /// Allocate a tree block near `goal`, write `node` into it and count it
    /// in i_blocks.
    fn write_new_node(&mut self, node: &Node, goal: u64) -> Result<u64> {
        let buffer = self.ctx.new_meta_block(goal)?;
        self.inode.blocks += mapping::sectors_per_cluster(self.ctx.geo);
        {
            let mut bytes = self.ctx.handle.get_create_access(&buffer)?;
            self.encode_block(node, &mut bytes);
        }
        buffer.set_verified();
        Ok(buffer.block())
    }

    fn free_tree_block(&mut self, block: u64) -> Result<()> {
        self.ctx.free_meta_block(block)?;
        let sectors = mapping::sectors_per_cluster(self.ctx.geo);
        self.inode.blocks = self.inode.blocks.saturating_sub(sectors);
        Ok(())
    }

    /// Allocate up to `count` data blocks near `goal` for this inode.
    /// Regular files may keep a preallocation window (dropped at their
    /// last release, which directories never have).
    fn alloc_data_run(&mut self, goal: u64, count: u32) -> Result<(u64, u32)> {
        if self.inode.is_reg() {
            let mapped = self.inode.blocks / self.sectors_per_block();
            let file = (self.ino, mapped);
            return self
                .ctx
                .alloc
                .alloc_file_blocks(self.ctx.handle, file, goal, count);
        }
        self.ctx.alloc.alloc_blocks(self.ctx.handle, goal, count)
    }

    /// Free data blocks `physical..+count`, just unmapped; with bigalloc,
    /// the clusters they lie in that keep no other mapped block
    /// (`ClusterFrees`).
    fn free_data(&mut self, physical: u64, count: u64) -> Result<()> {
        debug_assert!(count > 0);
        let ratio = self.cluster_ratio();
        if ratio == 1 {
            return self.free_clusters(physical, count);
        }
        let frees = self
            .unmapping
            .as_mut()
            .expect("bigalloc data freed outside an unmapping");
        let (first, last) = (physical / ratio, (physical + count - 1) / ratio);
        // Only the two end clusters can hold blocks outside the run.
        let from = match frees.keep.contains(&Some(first)) || frees.last == Some(first) {
            true => first + 1,
            false => first,
        };
        let to = match last > first && frees.keep.contains(&Some(last)) {
            true => last,
            false => last + 1,
        };
        frees.last = Some(last);
        if from < to {
            self.free_clusters(from * ratio, (to - from) * ratio)?;
        }
        Ok(())
    }

    /// Free whole clusters (blocks without bigalloc) of file data, and
    /// count them off i_blocks.
    fn free_clusters(&mut self, start: u64, count: u64) -> Result<()> {
        let metadata = self.inode.blocks_are_metadata();
        self.ctx
            .alloc
            .free_blocks(self.ctx.handle, start, count, metadata)?;
        let sectors = count * self.sectors_per_block();
        self.inode.blocks = self.inode.blocks.saturating_sub(sectors);
        Ok(())
    }

    /// The goal for a new tree block when no sibling suggests one: the
    /// start of the inode's group, where ext4 keeps its metadata close.
    fn inode_group_goal(&self) -> u64 {
        let geo = self.ctx.geo;
        geo.group_first_block(geo.group_of_inode(self.ino))
    }

    /// After the first key of the node at `at` changed, carry it up into the
    /// index entries that point at it (e2fsck: an index key must equal the
    /// first logical block below it).
    fn fix_keys(&mut self, path: &mut Path, at: usize) -> Result<()> {
        let mut child = at;
        while child > 0 {
            let Some(key) = path[child].node.first_key() else {
                break;
            };
            let parent = &mut path[child - 1];
            let pos = parent.pos;
            let entry = &mut parent.node.indexes_mut()[pos];
            if entry.logical == key {
                break;
            }
            entry.logical = key;
            self.write_level(&path[child - 1])?;
            if pos != 0 {
                break;
            }
            child -= 1;
        }
        Ok(())
    }

    /// Map `extent`, which lies in a hole, merging with its neighbours in
    /// the leaf when they continue each other.
    fn insert_extent(&mut self, extent: Extent) -> Result<()> {
        debug_assert!(extent.len > 0 && extent.end() <= MAX_LOGICAL_BLOCKS);
        // Each round either inserts or makes room at one level; a tree
        // needs at most one split per level plus one root growth.
        for _ in 0..2 * (MAX_DEPTH as usize + 2) {
            let mut path = self.find_path(extent.logical)?;
            debug_assert!(matches!(
                lookup_in_path(&path, extent.logical),
                Lookup::Hole { next } if next.is_none_or(|n| n >= extent.end())
            ));
            if self.try_merge(&mut path, extent)? {
                return Ok(());
            }
            let at = path.len() - 1;
            if !path[at].node.is_full() {
                let pos = path[at].pos;
                path[at].node.extents_mut().insert(pos, extent);
                self.write_level(&path[at])?;
                if pos == 0 {
                    self.fix_keys(&mut path, at)?;
                }
                return Ok(());
            }
            self.make_room(&mut path)?;
        }
        Err(self.corrupt_loop("making room for an extent"))
    }

    /// Extend a neighbour in the leaf to cover `extent`, if one continues it.
    fn try_merge(&mut self, path: &mut Path, extent: Extent) -> Result<bool> {
        let at = path.len() - 1;
        let pos = path[at].pos;
        let extents = path[at].node.extents_mut();
        let left = pos
            .checked_sub(1)
            .filter(|&i| can_merge(&extents[i], &extent));
        let right = (pos < extents.len() && can_merge(&extent, &extents[pos])).then_some(pos);
        match (left, right) {
            (Some(l), Some(r))
                if extents[l].len + extent.len + extents[r].len <= max_len(extent.unwritten) =>
            {
                extents[l].len += extent.len + extents[r].len;
                extents.remove(r);
            }
            (Some(l), _) => extents[l].len += extent.len,
            (None, Some(r)) => {
                extents[r] = Extent {
                    len: extents[r].len + extent.len,
                    ..extent
                };
            }
            (None, None) => return Ok(false),
        }
        self.write_level(&path[at])?;
        if left.is_none() && pos == 0 {
            self.fix_keys(path, at)?;
        }
        Ok(true)
    }

    /// The leaf on `path` needs more room: split the topmost full node
    /// below a node with room (the leaf itself when its parent has room),
    /// or, when every node above the leaf is full, grow the tree by one
    /// level. The caller starts over from the root afterwards.
    fn make_room(&mut self, path: &mut Path) -> Result<()> {
        let leaf_at = path.len() - 1;
        match (0..leaf_at).rev().find(|&at| !path[at].node.is_full()) {
            Some(parent_at) => self.split(path, parent_at + 1),
            None => self.grow_root(path),
        }
    }

    /// Split the full node at `at` in two; its parent has room for the new
    /// index entry. An insertion at the right edge (appending) moves just
    /// the last entry, so sequential files keep full nodes, as the kernel's
    /// split at the insertion point does.
    fn split(&mut self, path: &mut Path, at: usize) -> Result<()> {
        debug_assert!(at > 0 && path[at].node.len() >= 2);
        debug_assert!(at == path.len() - 1 || path[at].node.is_full());
        let level = &mut path[at];
        let Some(block) = level.block else {
            unreachable!("the root grows instead of splitting");
        };
        let len = level.node.len();
        let appending = match level.node.entries {
            Entries::Leaf(_) => level.pos == len,
            Entries::Index(_) => level.pos + 1 == len,
        };
        let split_at = if appending { len - 1 } else { len / 2 };
        let capacity = block_capacity(self.ctx.geo.block_size);
        let right = level.node.split_off(split_at, capacity);
        let Some(right_key) = right.first_key() else {
            unreachable!("a full node split below its length leaves entries on the right");
        };
        let right_block = self.write_new_node(&right, block)?;
        self.write_level(&path[at])?;
        let parent = &mut path[at - 1];
        let pos = parent.pos + 1;
        parent.node.indexes_mut().insert(
            pos,
            Index {
                logical: right_key,
                child: right_block,
            },
        );
        debug_assert!(parent.node.len() <= parent.node.max as usize);
        self.write_level(&path[at - 1])
    }

    /// Move the root's entries into a new block and make the root a
    /// one-entry index above it (the only way the tree gets deeper).
    fn grow_root(&mut self, path: &mut Path) -> Result<()> {
        let root = &path[0].node;
        debug_assert!(!root.is_empty());
        if root.depth >= MAX_DEPTH {
            return Err(Error::FileTooBig);
        }
        let capacity = block_capacity(self.ctx.geo.block_size);
        let child = Node {
            depth: root.depth,
            max: capacity,
            generation: 0,
            entries: root.entries.clone(),
        };
        let Some(key) = child.first_key() else {
            unreachable!("a root that needs room has entries");
        };
        let goal = self.inode_group_goal();
        let block = self.write_new_node(&child, goal)?;
        let new_root = Node {
            depth: root.depth + 1,
            max: ROOT_CAPACITY,
            generation: root.generation,
            entries: Entries::Index(smallvec![Index {
                logical: key,
                child: block,
            }]),
        };
        new_root.encode(&mut self.inode.block);
        Ok(())
    }

    /// Unmap `[start, end)` and free its data blocks, then let the tree
    /// lose levels it no longer needs.
    fn remove_range(&mut self, start: u64, end: u64) -> Result<()> {
        // Only an extent strictly containing the range gains an entry (it
        // becomes two); the range's later extents start at its cursor.
        let path = self.find_path(start)?;
        let containing = leaf(&path).pos.checked_sub(1);
        let splits = containing
            .map(|i| leaf_extents(&path)[i])
            .is_some_and(|extent| extent.logical < start && extent.end() > end);
        if splits {
            self.ctx.charge(insert_cost(&path, 1))?;
        }
        let ratio = self.cluster_ratio();
        if ratio == 1 {
            self.remove_extents(start, end)?;
            return self.shrink_root();
        }
        // bigalloc: the clusters of the range's two ends stay while blocks
        // outside it lie there.
        let before = match start % ratio {
            0 => None,
            offset => self.first_mapped_in(start - offset, start)?,
        };
        let after = match end % ratio {
            0 => None,
            offset => self.first_mapped_in(end, end - offset + ratio)?,
        };
        let keep = match crate::faults::active(crate::faults::Fault::BigallocClusterFreedShared) {
            true => [None, None],
            false => [before.map(|b| b / ratio), after.map(|b| b / ratio)],
        };
        self.unmapping = Some(ClusterFrees { keep, last: None });
        let removed = self.remove_extents(start, end);
        self.unmapping = None;
        removed?;
        self.shrink_root()
    }

    fn remove_extents(&mut self, start: u64, end: u64) -> Result<()> {
        debug_assert!(start < end && end <= LOGICAL_LIMIT);
        let mut cursor = start;
        for _ in 0..self.extent_visit_limit() {
            if cursor >= end {
                return Ok(());
            }
            let mut path = self.find_path(cursor)?;
            let extents = leaf_extents(&path);
            let pos = leaf(&path).pos;
            let first = match pos.checked_sub(1) {
                Some(i) if extents[i].end() > cursor => i,
                _ => pos,
            };
            match extents.get(first) {
                Some(extent) if extent.logical < end => {
                    cursor = self.remove_in_leaf(&mut path, first, cursor, end)?;
                }
                Some(_) => return Ok(()),
                // Nothing more in this leaf: continue where the next
                // subtree starts.
                None => match next_mapped(&path, cursor) {
                    Some(next) if next < end => cursor = next,
                    _ => return Ok(()),
                },
            }
        }
        Err(self.corrupt_loop("unmapping"))
    }

    /// Unmap `[cursor, end)` within the leaf on `path`, from extent `first`
    /// (the first one overlapping); returns how far it got, which is
    /// `cursor` itself when it only made room.
    fn remove_in_leaf(
        &mut self,
        path: &mut Path,
        first: usize,
        cursor: u64,
        end: u64,
    ) -> Result<u64> {
        let at = path.len() - 1;
        let whole = leaf_extents(path)[first];
        if whole.logical < cursor && whole.end() > end {
            // Strictly inside one extent: it becomes two, so the leaf needs
            // room for one more entry before anything changes.
            if path[at].node.is_full() {
                self.make_room(path)?;
                return Ok(cursor);
            }
            let extents = path[at].node.extents_mut();
            extents[first].len = (cursor - whole.logical) as u32;
            extents.insert(first + 1, whole.trimmed_to(end));
            self.write_level(&path[at])?;
            self.free_data(whole.physical_of(cursor), end - cursor)?;
            return Ok(end);
        }
        let extents = path[at].node.extents_mut();
        let mut reached = cursor;
        // Runs freed once the leaf is written: few, on the stack.
        let mut freed: SmallVec<[(u64, u64); 4]> = SmallVec::new();
        let mut i = first;
        while i < extents.len() && extents[i].logical < end {
            let extent = extents[i];
            let from = extent.logical.max(cursor);
            let to = extent.end().min(end);
            freed.push((extent.physical_of(from), to - from));
            reached = to;
            if from == extent.logical && to == extent.end() {
                extents.remove(i);
                continue;
            }
            if from == extent.logical {
                extents[i] = extent.trimmed_to(to);
            } else {
                debug_assert_eq!(to, extent.end());
                extents[i].len -= (to - from) as u32;
            }
            i += 1;
        }
        if path[at].node.is_empty() && at > 0 {
            self.remove_node(path, at)?;
        } else {
            self.write_level(&path[at])?;
            if first == 0 {
                self.fix_keys(path, at)?;
            }
        }
        for (physical, count) in freed {
            self.free_data(physical, count)?;
        }
        Ok(reached)
    }

    /// While the root indexes a single node whose entries fit in the root,
    /// move them up and free that node (as the kernel's
    /// ext4_ext_try_to_merge_up does): e2fsck reports a tree whose lower
    /// level would fit in an upper one as one that could be shallower.
    fn shrink_root(&mut self) -> Result<()> {
        for _ in 0..MAX_DEPTH {
            let reader = self.reader();
            let root = reader.root(self.inode)?;
            let index = match &root.entries {
                Entries::Index(indexes) if indexes.len() == 1 => indexes[0],
                _ => return Ok(()),
            };
            let child = reader.read_child(root.depth, &index, LOGICAL_LIMIT)?;
            if child.len() > ROOT_CAPACITY as usize {
                return Ok(());
            }
            let new_root = Node {
                depth: child.depth,
                max: ROOT_CAPACITY,
                generation: root.generation,
                entries: child.entries,
            };
            new_root.encode(&mut self.inode.block);
            self.free_tree_block(index.child)?;
        }
        Ok(())
    }

    /// Free the emptied node at `at` and drop its index entry, and so on
    /// upwards while parents empty; an emptied root becomes an empty leaf.
    fn remove_node(&mut self, path: &mut Path, at: usize) -> Result<()> {
        let mut at = at;
        while at > 0 {
            debug_assert!(path[at].node.is_empty());
            let Some(block) = path[at].block else {
                unreachable!("only the root lives in the inode");
            };
            self.free_tree_block(block)?;
            let parent_at = at - 1;
            let parent = &mut path[parent_at];
            let pos = parent.pos;
            parent.node.indexes_mut().remove(pos);
            if !parent.node.is_empty() {
                self.write_level(&path[parent_at])?;
                if pos == 0 {
                    self.fix_keys(path, parent_at)?;
                }
                return Ok(());
            }
            if parent_at == 0 {
                // ext4: an index root may not be empty; the tree is a
                // depth-0 root again.
                path[0].node = Node::empty_root(path[0].node.generation);
                return self.write_level(&path[0]);
            }
            at = parent_at;
        }
        Ok(())
    }

    /// Make `[start, end)` written; merges may leave the tree with levels
    /// it no longer needs.
    fn mark_written(&mut self, start: u64, end: u64) -> Result<()> {
        // Only the extents at the range's two ends can be cut, into up to
        // three pieces: two new entries in each end's leaf at most.
        let first = self.find_path(start)?;
        let last = self.find_path(end - 1)?;
        self.ctx
            .charge(insert_cost(&first, 2) + insert_cost(&last, 2))?;
        self.convert_range(start, end)?;
        self.shrink_root()
    }

    fn convert_range(&mut self, start: u64, end: u64) -> Result<()> {
        let mut cursor = start;
        for _ in 0..self.extent_visit_limit() {
            if cursor >= end {
                return Ok(());
            }
            let mut path = self.find_path(cursor)?;
            match lookup_in_path(&path, cursor) {
                Lookup::Mapped(extent) if extent.unwritten => {
                    cursor = self.convert_in_leaf(&mut path, cursor, end)?;
                }
                Lookup::Mapped(extent) => cursor = extent.end().min(end),
                Lookup::Hole { next } => match next {
                    Some(next) if next < end => cursor = next,
                    _ => return Ok(()),
                },
            }
        }
        Err(self.corrupt_loop("marking written"))
    }

    /// Make the unwritten extent containing `cursor` written over
    /// `[cursor, end)` (clipped to the extent): up to three pieces replace
    /// it in the leaf, so room for them is made first; the written piece
    /// then merges with written neighbours. Returns how far it got, which
    /// is `cursor` itself when it only made room.
    fn convert_in_leaf(&mut self, path: &mut Path, cursor: u64, end: u64) -> Result<u64> {
        let at = path.len() - 1;
        let index = path[at].pos - 1;
        let whole = leaf_extents(path)[index];
        debug_assert!(whole.unwritten && whole.logical <= cursor && cursor < whole.end());
        let to = whole.end().min(end);
        let has_left = whole.logical < cursor;
        let has_right = to < whole.end();
        let node = &path[at].node;
        if node.len() + has_left as usize + has_right as usize > node.max as usize {
            self.make_room(path)?;
            return Ok(cursor);
        }
        let first_key = node.first_key();
        let mut pieces: SmallVec<[Extent; 3]> = SmallVec::new();
        if has_left {
            pieces.push(Extent {
                len: (cursor - whole.logical) as u32,
                ..whole
            });
        }
        pieces.push(Extent {
            logical: cursor,
            physical: whole.physical_of(cursor),
            len: (to - cursor) as u32,
            unwritten: false,
        });
        if has_right {
            pieces.push(whole.trimmed_to(to));
        }
        let extents = path[at].node.extents_mut();
        extents.remove(index);
        extents.insert_many(index, pieces);
        let middle = index + has_left as usize;
        if !has_right
            && middle + 1 < extents.len()
            && can_merge(&extents[middle], &extents[middle + 1])
        {
            extents[middle].len += extents[middle + 1].len;
            extents.remove(middle + 1);
        }
        if !has_left && middle > 0 && can_merge(&extents[middle - 1], &extents[middle]) {
            extents[middle - 1].len += extents[middle].len;
            extents.remove(middle);
        }
        // Every piece starts at or after the old extent, and a merge only
        // extends an earlier entry: the leaf's first key stays.
        debug_assert_eq!(path[at].node.first_key(), first_key);
        self.write_level(&path[at])?;
        Ok(to)
    }
}

pub fn lookup(
    geo: &Geometry,
    cache: &BufferCache,
    ino: u32,
    inode: &Inode,
    lblk: u64,
) -> Result<Lookup> {
    let reader = Reader::new(geo, cache, ino, inode);
    if lblk >= LOGICAL_LIMIT {
        reader.root(inode)?;
        return Ok(Lookup::Hole { next: None });
    }
    let path = reader.find_path(inode, lblk)?;
    Ok(lookup_in_path(&path, lblk))
}

/// Tree blocks that mapping `blocks` new blocks at `lblk` (a hole), one
/// extent each at worst, may allocate (space budget).
pub fn append_cost(
    geo: &Geometry,
    cache: &BufferCache,
    ino: u32,
    inode: &Inode,
    lblk: u64,
    blocks: u32,
) -> Result<u64> {
    if lblk >= LOGICAL_LIMIT {
        return Ok(0); // the allocation fails with EFBIG
    }
    let path = Reader::new(geo, cache, ino, inode).find_path(inode, lblk)?;
    Ok(insert_cost(&path, blocks as usize))
}

pub fn allocate(
    ctx: &mut MetaCtx,
    ino: u32,
    inode: &mut Inode,
    lblk: u64,
    len: u32,
    goal: u64,
    unwritten: bool,
) -> Result<Extent> {
    let limit = max_blocks(ctx.geo);
    if lblk >= limit {
        return Err(Error::FileTooBig);
    }
    let mut tree = Writer::new(ctx, ino, inode);
    let path = tree.find_path(lblk)?;
    let Lookup::Hole { next } = lookup_in_path(&path, lblk) else {
        return Err(Error::Invalid(format!(
            "logical block {lblk} of inode {ino} is already mapped"
        )));
    };
    let hole_end = next.unwrap_or(limit).min(limit);
    let want = (len as u64)
        .min(hole_end - lblk)
        .min(max_len(unwritten) as u64);
    debug_assert!(want > 0);
    // The extent ending right at lblk, if any, is the last one at or before
    // it in this leaf: continue it physically.
    let extents = leaf_extents(&path);
    let goal = match leaf(&path).pos.checked_sub(1).map(|i| extents[i]) {
        Some(before) if before.end() == lblk => before.physical + before.len as u64,
        _ => goal,
    };
    if tree.cluster_ratio() > 1 {
        let hole_end = next.map(|_| hole_end);
        return allocate_in_clusters(&mut tree, &path, lblk, want, hole_end, goal, unwritten);
    }
    // The data run and the tree's growth, before anything changes; near
    // full the run shrinks to what the budget covers.
    let want = tree.ctx.charge_run(insert_cost(&path, 1), want)? as u32;
    debug_assert!(want > 0);
    let (physical, got) = tree.alloc_data_run(goal, want)?;
    debug_assert!(got >= 1 && got <= want);
    debug_assert!(blocks_in_filesystem(tree.ctx.geo, physical, got as u64));
    let extent = Extent {
        logical: lblk,
        physical,
        len: got.min(want),
        unwritten,
    };
    tree.inode.blocks += extent.len as u64 * tree.sectors_per_block();
    if let Err(error) = tree.insert_extent(extent) {
        // The tree is unchanged (each step of an insert is complete);
        // give the data blocks back.
        tree.free_data(extent.physical, extent.len as u64)?;
        return Err(error);
    }
    Ok(extent)
}

/// `allocate` with bigalloc: blocks of a logical cluster the file already
/// maps a block of go into that block's physical cluster, at their own
/// offsets, with nothing allocated or counted (the kernel's
/// `get_implied_cluster_alloc`); others get new clusters, the run placed
/// at its offset in the first (`ext4_ext_map_blocks`), and the clusters
/// counted in i_blocks whole. `mapped_from` is where the hole's next
/// mapped block is, if any: its cluster is not the run's to fill.
fn allocate_in_clusters(
    tree: &mut Writer,
    path: &Path,
    lblk: u64,
    want: u64,
    mapped_from: Option<u64>,
    goal: u64,
    unwritten: bool,
) -> Result<Extent> {
    let ratio = tree.cluster_ratio();
    let offset = lblk % ratio;
    let cluster_first = lblk - offset;
    let (physical, len, fresh) = match tree.first_mapped_in(cluster_first, cluster_first + ratio)? {
        Some(block) => {
            let len = want.min(cluster_first + ratio - lblk);
            tree.ctx.charge(insert_cost(path, 1))?;
            if crate::faults::active(crate::faults::Fault::BigallocImpliedCounted) {
                tree.inode.blocks += mapping::sectors_per_cluster(tree.ctx.geo);
            }
            (tree.ctx.geo.cluster_start(block) + offset, len, None)
        }
        None => {
            // Up to the cluster the next mapped block lies in.
            let end = mapped_from.map_or(u64::MAX, |next| next - next % ratio);
            debug_assert!(end > lblk, "the next block's cluster is lblk's: implied");
            let want = want.min(end - lblk);
            let clusters = (offset + want).div_ceil(ratio);
            let covered = tree.ctx.charge_run(insert_cost(path, 1), clusters)?;
            let want = want.min(covered * ratio - offset);
            let count = (covered * ratio) as u32;
            let goal = goal.div_ceil(ratio) * ratio;
            let (start, got) = tree.alloc_data_run(goal, count)?;
            assert!(
                start.is_multiple_of(ratio)
                    && (got as u64).is_multiple_of(ratio)
                    && got as u64 > offset,
                "allocator gave blocks {start}+{got}, not whole clusters of {ratio}"
            );
            debug_assert!(blocks_in_filesystem(tree.ctx.geo, start, got as u64));
            tree.inode.blocks += got as u64 * tree.sectors_per_block();
            let len = want.min(got as u64 - offset);
            (start + offset, len, Some((start, got as u64)))
        }
    };
    let extent = Extent {
        logical: lblk,
        physical,
        len: len as u32,
        unwritten,
    };
    debug_assert_eq!(extent.physical % ratio, extent.logical % ratio);
    if let Err(error) = tree.insert_extent(extent) {
        // The tree is unchanged; new clusters go back.
        if let Some((start, count)) = fresh {
            tree.free_clusters(start, count)?;
        }
        return Err(error);
    }
    Ok(extent)
}

pub fn mark_written(
    ctx: &mut MetaCtx,
    ino: u32,
    inode: &mut Inode,
    lblk: u64,
    len: u64,
) -> Result<()> {
    let end = lblk.saturating_add(len).min(LOGICAL_LIMIT);
    if lblk >= end {
        return Ok(());
    }
    Writer::new(ctx, ino, inode).mark_written(lblk, end)
}

pub fn punch(
    ctx: &mut MetaCtx,
    ino: u32,
    inode: &mut Inode,
    start: u64,
    end: Option<u64>,
) -> Result<()> {
    let end = end.unwrap_or(LOGICAL_LIMIT).min(LOGICAL_LIMIT);
    if start >= end {
        return Ok(());
    }
    Writer::new(ctx, ino, inode).remove_range(start, end)
}

pub fn init(inode: &mut Inode) {
    Node::empty_root(0).encode(&mut inode.block);
    inode.flags |= flags::EXTENTS;
}

/// The depth of the inode's tree as its root header records it.
pub fn depth(inode: &Inode) -> u16 {
    get_u16(&inode.block, 6)
}

/// The entries of the inode's root node as its header records them (0:
/// the tree maps nothing).
pub fn root_entries(inode: &Inode) -> u16 {
    get_u16(&inode.block, 2)
}

pub fn for_each_block(
    geo: &Geometry,
    cache: &BufferCache,
    ino: u32,
    inode: &Inode,
    f: &mut dyn FnMut(BlockUse) -> Result<()>,
) -> Result<()> {
    let reader = Reader::new(geo, cache, ino, inode);
    // Pending subtrees: (index entry, depth of the node holding it, upper
    // bound of the keys below it), popped in logical order.
    let mut pending: Vec<(Index, u16, u64)> = Vec::new();
    visit_node(reader.root(inode)?, LOGICAL_LIMIT, &mut pending, f)?;
    // A tree has fewer nodes than the filesystem has blocks; more visits
    // means blocks are shared between subtrees.
    let mut budget = geo.blocks_count;
    while let Some((index, parent_depth, upper)) = pending.pop() {
        ensure_format!(
            budget > 0,
            Location::Inode { ino },
            "extent tree visits more nodes than the filesystem has blocks"
        );
        budget -= 1;
        let node = reader.read_child(parent_depth, &index, upper)?;
        f(BlockUse::Meta(index.child))?;
        visit_node(node, upper, &mut pending, f)?;
    }
    Ok(())
}

/// Report a leaf's extents, or queue an index node's children.
fn visit_node(
    node: Node,
    upper: u64,
    pending: &mut Vec<(Index, u16, u64)>,
    f: &mut dyn FnMut(BlockUse) -> Result<()>,
) -> Result<()> {
    match node.entries {
        Entries::Leaf(extents) => {
            for extent in extents {
                f(BlockUse::Data(extent))?;
            }
        }
        Entries::Index(indexes) => {
            for (i, index) in indexes.iter().enumerate().rev() {
                let next = indexes.get(i + 1).map_or(upper, |n| n.logical);
                pending.push((*index, node.depth, next));
            }
        }
    }
    Ok(())
}

/// ext4_max_size: 2^32 - 1 blocks, and without huge_file no more than
/// i_blocks' 32 bits of sectors can count.
pub fn max_blocks(geo: &Geometry) -> u64 {
    MAX_LOGICAL_BLOCKS.min(mapping::max_sectors(geo) / mapping::sectors_per_block(geo))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::superblock::Superblock;

    fn geometry(log_block_size: u32, metadata_csum: bool) -> Geometry {
        // A minimal superblock: enough for Geometry's block math.
        let mut sb = vec![0u8; 1024];
        put_u16(&mut sb, 0x38, 0xEF53);
        put_u32(&mut sb, 0x4C, 1); // s_rev_level
        put_u32(&mut sb, 0x18, log_block_size);
        put_u32(&mut sb, 0x04, 1 << 20); // s_blocks_count_lo
        put_u32(&mut sb, 0x14, (log_block_size == 0) as u32); // s_first_data_block
        put_u32(&mut sb, 0x20, 8192); // s_blocks_per_group
        put_u32(&mut sb, 0x24, 8192); // s_clusters_per_group
        put_u32(&mut sb, 0x28, 2048); // s_inodes_per_group
        put_u32(&mut sb, 0x00, 2048 * 128); // s_inodes_count
        put_u32(&mut sb, 0x54, 11); // s_first_ino
        put_u16(&mut sb, 0x58, 256); // s_inode_size
        let superblock = Superblock::decode(&sb).expect("test superblock");
        let mut geo = Geometry::from_superblock(&superblock);
        geo.metadata_csum = metadata_csum;
        geo.blocks_count = 1 << 40;
        geo
    }

    fn sample_leaf(max: u16) -> Node {
        Node {
            depth: 0,
            max,
            generation: 7,
            entries: Entries::Leaf(smallvec![
                Extent {
                    logical: 0,
                    physical: 1000,
                    len: INIT_MAX_LEN,
                    unwritten: false,
                },
                Extent {
                    logical: 40_000,
                    physical: 0x1_0000_0000 >> 12,
                    len: UNWRITTEN_MAX_LEN,
                    unwritten: true,
                },
                Extent {
                    logical: MAX_LOGICAL_BLOCKS - 1,
                    physical: 5,
                    len: 1,
                    unwritten: false,
                },
            ]),
        }
    }

    #[test]
    fn leaf_round_trips_with_length_encoding() {
        let geo = geometry(2, false);
        let node = sample_leaf(ROOT_CAPACITY);
        let mut bytes = [0u8; I_BLOCK_SIZE];
        node.encode(&mut bytes);
        // ee_len 0x8000 is a full initialized extent, 0xFFFF the longest
        // unwritten one (ext4_extents.h).
        assert_eq!(get_u16(&bytes, HEADER_SIZE + 4), 0x8000);
        assert_eq!(get_u16(&bytes, HEADER_SIZE + ENTRY_SIZE + 4), 0xFFFF);
        let decoded =
            Node::decode(&bytes, ROOT_CAPACITY, &geo, Location::Inode { ino: 12 }).unwrap();
        assert_eq!(decoded, node);
    }

    #[test]
    fn index_round_trips_with_high_block_bits() {
        let geo = geometry(2, false);
        let node = Node {
            depth: 3,
            max: block_capacity(4096),
            generation: 0,
            entries: Entries::Index(smallvec![
                Index {
                    logical: 0,
                    child: 0x12_3456_789A,
                },
                Index {
                    logical: 0xFFFF_FFFE,
                    child: 77,
                },
            ]),
        };
        let mut bytes = vec![0u8; 4096];
        node.encode(&mut bytes);
        let location = Location::Block { block: 1 };
        let decoded = Node::decode(&bytes, block_capacity(4096), &geo, location).unwrap();
        assert_eq!(decoded, node);
        assert_eq!(block_capacity(4096), 340);
        assert_eq!(block_capacity(1024), 84);
    }

    #[test]
    fn decode_rejects_broken_nodes() {
        let geo = geometry(2, false);
        let location = Location::Inode { ino: 12 };
        let mut good = [0u8; I_BLOCK_SIZE];
        sample_leaf(ROOT_CAPACITY).encode(&mut good);
        type Mutation = (&'static str, fn(&mut [u8]));
        let mutations: [Mutation; 8] = [
            ("magic", |b| put_u16(b, 0, 0xF30B)),
            ("entries above max", |b| put_u16(b, 2, 5)),
            ("max above capacity", |b| put_u16(b, 4, 5)),
            ("max zero", |b| put_u16(b, 4, 0)),
            ("depth", |b| put_u16(b, 6, 6)),
            ("zero length", |b| put_u16(b, HEADER_SIZE + 4, 0)),
            ("overlap", |b| put_u32(b, HEADER_SIZE + ENTRY_SIZE, 100)),
            ("past the device", |b| put_u16(b, HEADER_SIZE + 6, 0xFFFF)),
        ];
        for (what, mutate) in mutations {
            let mut bytes = good;
            mutate(&mut bytes);
            let error = Node::decode(&bytes, ROOT_CAPACITY, &geo, location).unwrap_err();
            assert!(error.is_corruption(), "{what}: {error}");
        }
        // An index node with no entries is invalid (kernel: eh_entries 0
        // with eh_depth > 0).
        let mut bytes = [0u8; I_BLOCK_SIZE];
        Node::empty_root(0).encode(&mut bytes);
        assert!(Node::decode(&bytes, ROOT_CAPACITY, &geo, location).is_ok());
        put_u16(&mut bytes, 6, 1);
        assert!(Node::decode(&bytes, ROOT_CAPACITY, &geo, location).is_err());
    }

    #[test]
    fn block_checksum_covers_up_to_the_tail() {
        let geo = geometry(1, true);
        let seed = 0x1234_5678;
        let capacity = block_capacity(2048);
        let node = sample_leaf(capacity);
        let mut block = vec![0u8; 2048];
        node.encode(&mut block);
        set_block_checksum(seed, &mut block);
        assert!(verify_block_checksum(seed, &block));
        // The tail sits right after eh_max entries: 12 + 169 * 12 = 2040.
        assert_eq!(capacity, 169);
        assert_eq!(get_u32(&block, 2040), crc32c_raw(seed, &block[..2040]));
        assert!(!verify_block_checksum(seed ^ 1, &block));
        let mut flipped = block.clone();
        flipped[HEADER_SIZE + 1] ^= 1;
        assert!(!verify_block_checksum(seed, &flipped));
        // The 4 bytes after the tail are not covered.
        let mut beyond = block.clone();
        beyond[2047] ^= 1;
        assert!(verify_block_checksum(seed, &beyond));
        let location = Location::Block { block: 9 };
        let decoded = Node::decode(&block, capacity, &geo, location).unwrap();
        assert_eq!(decoded, node);
    }

    #[test]
    fn merge_rules_follow_length_limits() {
        let a = Extent {
            logical: 0,
            physical: 100,
            len: 10,
            unwritten: false,
        };
        let b = Extent {
            logical: 10,
            physical: 110,
            len: 5,
            unwritten: false,
        };
        assert!(can_merge(&a, &b));
        assert!(!can_merge(&a, &Extent { physical: 111, ..b }));
        assert!(!can_merge(
            &a,
            &Extent {
                unwritten: true,
                ..b
            }
        ));
        let long = Extent {
            len: INIT_MAX_LEN - 5,
            ..a
        };
        let after = Extent {
            logical: long.end(),
            physical: long.physical + long.len as u64,
            ..b
        };
        assert!(can_merge(&long, &after));
        let long_unwritten = Extent {
            unwritten: true,
            ..long
        };
        assert!(!can_merge(
            &long_unwritten,
            &Extent {
                unwritten: true,
                ..after
            }
        ));
    }
}
