//! A map of a pristine image: where each structure lives, which fields it
//! has, and which inode owns it, so that mutations can aim at structures
//! and fields instead of random bytes, and recompute the right checksum.
//!
//! Built from the undamaged seed with the crate's own decoders (they are
//! trusted on an image mke2fs, the kernel or jext4 made); a failure here is
//! a broken seed, not a finding.

use jext4::engine::cache::BufferCache;
use jext4::engine::dev::MemoryDevice;
use jext4::engine::format::group_desc::{BG_BLOCK_UNINIT, BG_INODE_UNINIT, GroupDesc};
use jext4::engine::format::inode::{self as fmt, Inode, flags};
use jext4::engine::format::mapping::{self, BlockUse, Lookup};
use jext4::engine::format::superblock::{Geometry, Superblock};
use jext4::engine::format::{bitmap, get_u16, get_u32};
use std::collections::{BTreeSet, HashSet};
use std::sync::Arc;

/// What a target is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Kind {
    Superblock,
    GroupDesc,
    BlockBitmap,
    InodeBitmap,
    Inode,
    ExtentBlock,
    IndirectBlock,
    DirLeaf,
    DxRoot,
    DxNode,
    XattrBlock,
    SymlinkBlock,
    OrphanBlock,
    FileData,
    /// A block the block bitmap says is free (outside uninitialised groups).
    FreeBlock,
    /// An inode slot the inode bitmap says is free, in an initialised table.
    UnusedInode,
    /// The whole image.
    Anywhere,
}

impl Kind {
    /// Nothing the engine reads lives here: damage must change nothing.
    pub fn is_unused_space(self) -> bool {
        matches!(self, Kind::FreeBlock | Kind::UnusedInode)
    }
}

/// A field of a target: `width` bytes at `offset` from the target's start.
#[derive(Debug, Clone)]
pub struct Field {
    pub name: String,
    pub offset: usize,
    pub width: usize,
}

/// One structure of the image.
#[derive(Debug, Clone)]
pub struct Target {
    pub kind: Kind,
    /// The path of the owning file, or a group number ("group 3").
    pub owner_name: String,
    /// Owning inode (0 if none), or group for group structures.
    pub owner: u32,
    /// Physical block (block-sized targets), else 0.
    pub block: u64,
    /// Byte offset of the target in the image.
    pub offset: usize,
    pub len: usize,
    pub fields: Vec<Field>,
}

impl Target {
    pub fn describe(&self) -> String {
        let mut text = format!("{:?} of {}", self.kind, self.owner_name);
        if self.block != 0 {
            text += &format!(" (block {})", self.block);
        }
        text
    }
}

pub struct ImageMap {
    pub geo: Geometry,
    pub descs: Vec<GroupDesc>,
    pub targets: Vec<Target>,
    /// Values worth planting in fields: counts, limits, in-use block and
    /// inode numbers.
    pub interesting: Vec<u64>,
    /// The image carries checksums that mutations can recompute.
    pub has_checksums: bool,
    pub image_len: usize,
}

/// Bounds that keep the map of a seed small.
const SAMPLES_PER_KIND: usize = 48;
const POINTERS_PER_BLOCK: usize = 24;
const DIR_RECORDS_PER_BLOCK: usize = 24;

fn field(name: impl Into<String>, offset: usize, width: usize) -> Field {
    Field {
        name: name.into(),
        offset,
        width,
    }
}

fn fields(list: &[(&str, usize, usize)]) -> Vec<Field> {
    list.iter()
        .map(|&(name, offset, width)| field(name, offset, width))
        .collect()
}

const SUPERBLOCK_FIELDS: &[(&str, usize, usize)] = &[
    ("s_inodes_count", 0x00, 4),
    ("s_blocks_count_lo", 0x04, 4),
    ("s_r_blocks_count_lo", 0x08, 4),
    ("s_free_blocks_count_lo", 0x0C, 4),
    ("s_free_inodes_count", 0x10, 4),
    ("s_first_data_block", 0x14, 4),
    ("s_log_block_size", 0x18, 4),
    ("s_log_cluster_size", 0x1C, 4),
    ("s_blocks_per_group", 0x20, 4),
    ("s_clusters_per_group", 0x24, 4),
    ("s_inodes_per_group", 0x28, 4),
    ("s_magic", 0x38, 2),
    ("s_state", 0x3A, 2),
    ("s_rev_level", 0x4C, 4),
    ("s_first_ino", 0x54, 4),
    ("s_inode_size", 0x58, 2),
    ("s_feature_compat", 0x5C, 4),
    ("s_feature_incompat", 0x60, 4),
    ("s_feature_ro_compat", 0x64, 4),
    ("s_uuid", 0x68, 4),
    ("s_reserved_gdt_blocks", 0xCE, 2),
    ("s_journal_inum", 0xE0, 4),
    ("s_last_orphan", 0xE8, 4),
    ("s_hash_seed", 0xEC, 4),
    ("s_def_hash_version", 0xFC, 1),
    ("s_desc_size", 0xFE, 2),
    ("s_first_meta_bg", 0x104, 4),
    ("s_jnl_blocks[15]", 0x10C + 15 * 4, 4),
    ("s_jnl_blocks[16]", 0x10C + 16 * 4, 4),
    ("s_blocks_count_hi", 0x150, 4),
    ("s_free_blocks_count_hi", 0x158, 4),
    ("s_min_extra_isize", 0x15C, 2),
    ("s_want_extra_isize", 0x15E, 2),
    ("s_flags", 0x160, 4),
    ("s_log_groups_per_flex", 0x174, 1),
    ("s_checksum_type", 0x175, 1),
    ("s_backup_bgs[0]", 0x24C, 4),
    ("s_checksum_seed", 0x270, 4),
    ("s_orphan_file_inum", 0x280, 4),
    ("s_checksum", 0x3FC, 4),
];

const DESC_FIELDS: &[(&str, usize, usize)] = &[
    ("bg_block_bitmap", 0x00, 4),
    ("bg_inode_bitmap", 0x04, 4),
    ("bg_inode_table", 0x08, 4),
    ("bg_free_blocks_count", 0x0C, 2),
    ("bg_free_inodes_count", 0x0E, 2),
    ("bg_used_dirs_count", 0x10, 2),
    ("bg_flags", 0x12, 2),
    ("bg_block_bitmap_csum_lo", 0x18, 2),
    ("bg_inode_bitmap_csum_lo", 0x1A, 2),
    ("bg_itable_unused", 0x1C, 2),
    ("bg_checksum", 0x1E, 2),
];

const DESC_FIELDS_64: &[(&str, usize, usize)] = &[
    ("bg_block_bitmap_hi", 0x20, 4),
    ("bg_inode_bitmap_hi", 0x24, 4),
    ("bg_inode_table_hi", 0x28, 4),
    ("bg_free_blocks_count_hi", 0x2C, 2),
    ("bg_itable_unused_hi", 0x32, 2),
];

const INODE_FIELDS: &[(&str, usize, usize)] = &[
    ("i_mode", 0x00, 2),
    ("i_uid", 0x02, 2),
    ("i_size_lo", 0x04, 4),
    ("i_dtime", 0x14, 4),
    ("i_links_count", 0x1A, 2),
    ("i_blocks_lo", 0x1C, 4),
    ("i_flags", 0x20, 4),
    ("i_generation", 0x64, 4),
    ("i_file_acl_lo", 0x68, 4),
    ("i_size_high", 0x6C, 4),
    ("i_blocks_high", 0x74, 2),
    ("i_file_acl_high", 0x76, 2),
    ("i_checksum_lo", 0x7C, 2),
];

const INODE_FIELDS_LARGE: &[(&str, usize, usize)] =
    &[("i_extra_isize", 0x80, 2), ("i_checksum_hi", 0x82, 2)];

impl ImageMap {
    pub fn build(image: &[u8]) -> ImageMap {
        let superblock = Superblock::decode(&image[1024..2048]).expect("seed superblock");
        let geo = Geometry::from_superblock(&superblock);
        let block_size = geo.block_size as usize;
        let descs: Vec<GroupDesc> = (0..geo.group_count)
            .map(|group| {
                let (block, offset) = geo.group_desc_location(group);
                let at = block as usize * block_size + offset;
                GroupDesc::decode(&geo, group, &image[at..at + geo.desc_size as usize])
                    .expect("seed group descriptor")
            })
            .collect();
        let device = Arc::new(MemoryDevice::from_bytes(image.to_vec()));
        let cache = BufferCache::new(device, block_size, 64 << 20);
        let mut builder = Builder {
            image,
            geo: &geo,
            descs: &descs,
            cache: &cache,
            targets: Vec::new(),
            used_blocks: HashSet::new(),
            interesting: BTreeSet::new(),
        };
        builder.group_structures();
        builder.tree();
        builder.special_inodes(&superblock);
        builder.unused_space();
        builder.targets.push(Target {
            kind: Kind::Anywhere,
            owner_name: "the image".into(),
            owner: 0,
            block: 0,
            offset: 0,
            len: image.len(),
            fields: Vec::new(),
        });
        let mut interesting = builder.interesting_values();
        interesting.sort_unstable();
        interesting.dedup();
        let targets = builder.targets;
        ImageMap {
            has_checksums: geo.metadata_csum || geo.gdt_csum,
            geo,
            descs,
            targets,
            interesting,
            image_len: image.len(),
        }
    }

    /// Byte offset of inode `ino` in the image.
    pub fn inode_offset(&self, ino: u32) -> usize {
        inode_offset(&self.geo, &self.descs, ino)
    }

    pub fn kinds(&self) -> BTreeSet<Kind> {
        self.targets.iter().map(|target| target.kind).collect()
    }

    /// The `nth` target of `kind` owned by `owner_name`.
    pub fn find(&self, kind: Kind, owner_name: &str, nth: usize) -> Option<usize> {
        self.targets
            .iter()
            .enumerate()
            .filter(|(_, target)| target.kind == kind && target.owner_name == owner_name)
            .map(|(index, _)| index)
            .nth(nth)
    }
}

pub fn inode_offset(geo: &Geometry, descs: &[GroupDesc], ino: u32) -> usize {
    let group = geo.group_of_inode(ino) as usize;
    let index = geo.inode_index_in_group(ino) as usize;
    descs[group].inode_table as usize * geo.block_size as usize + index * geo.inode_size as usize
}

struct Builder<'a> {
    image: &'a [u8],
    geo: &'a Geometry,
    descs: &'a [GroupDesc],
    cache: &'a BufferCache,
    targets: Vec<Target>,
    used_blocks: HashSet<u64>,
    interesting: BTreeSet<u64>,
}

impl Builder<'_> {
    fn block_target(&mut self, kind: Kind, owner_name: &str, owner: u32, block: u64) -> usize {
        let block_size = self.geo.block_size as usize;
        self.used_blocks.insert(block);
        self.interesting.insert(block);
        self.targets.push(Target {
            kind,
            owner_name: owner_name.to_string(),
            owner,
            block,
            offset: block as usize * block_size,
            len: block_size,
            fields: Vec::new(),
        });
        self.targets.len() - 1
    }

    fn block_bytes(&self, block: u64) -> &[u8] {
        let block_size = self.geo.block_size as usize;
        &self.image[block as usize * block_size..(block as usize + 1) * block_size]
    }

    fn group_structures(&mut self) {
        let geo = self.geo;
        self.targets.push(Target {
            kind: Kind::Superblock,
            owner_name: "the filesystem".into(),
            owner: 0,
            block: 0,
            offset: 1024,
            len: 1024,
            fields: fields(SUPERBLOCK_FIELDS),
        });
        for group in 0..geo.group_count {
            let (block, offset) = geo.group_desc_location(group);
            let mut list = fields(DESC_FIELDS);
            if geo.desc_size >= 64 {
                list.extend(fields(DESC_FIELDS_64));
            }
            let name = format!("group {group}");
            self.targets.push(Target {
                kind: Kind::GroupDesc,
                owner_name: name.clone(),
                owner: group,
                block: 0,
                offset: block as usize * geo.block_size as usize + offset,
                len: geo.desc_size as usize,
                fields: list,
            });
            let desc = &self.descs[group as usize];
            let (block_bitmap, inode_bitmap) = (desc.block_bitmap, desc.inode_bitmap);
            let bitmap_bytes = [geo.block_bitmap_bytes(), geo.inode_bitmap_bytes()];
            for (kind, block, bytes) in [
                (Kind::BlockBitmap, block_bitmap, bitmap_bytes[0]),
                (Kind::InodeBitmap, inode_bitmap, bitmap_bytes[1]),
            ] {
                let index = self.block_target(kind, &name, group, block);
                self.targets[index].len = bytes;
            }
            for table_block in 0..geo.inode_table_blocks as u64 {
                self.used_blocks.insert(desc.inode_table + table_block);
            }
        }
    }

    fn inode(&self, ino: u32) -> Inode {
        let at = inode_offset(self.geo, self.descs, ino);
        Inode::decode(
            self.geo,
            ino,
            &self.image[at..at + self.geo.inode_size as usize],
        )
        .expect("seed inode")
    }

    fn inode_is_used(&self, ino: u32) -> bool {
        let geo = self.geo;
        let group = geo.group_of_inode(ino) as usize;
        let desc = &self.descs[group];
        if geo.has_group_csum() && desc.flags & BG_INODE_UNINIT != 0 {
            return false;
        }
        let bits = self.block_bytes(desc.inode_bitmap);
        bitmap::test_bit(bits, geo.inode_index_in_group(ino) as usize)
    }

    /// Every inode reachable from the root, depth first, names sorted.
    fn tree(&mut self) {
        let mut pending = vec![(2u32, "/".to_string())];
        let mut seen = HashSet::new();
        while let Some((ino, path)) = pending.pop() {
            if !seen.insert(ino) {
                continue;
            }
            self.interesting.insert(ino as u64);
            let inode = self.inode(ino);
            self.inode_structures(ino, &path, &inode);
            if inode.is_dir() {
                let mut children = self.dir_children(ino, &path, &inode);
                children.sort();
                children.reverse();
                for (name, child) in children {
                    let child_path = if path == "/" {
                        format!("/{name}")
                    } else {
                        format!("{path}/{name}")
                    };
                    pending.push((child, child_path));
                }
            }
        }
    }

    fn special_inodes(&mut self, superblock: &Superblock) {
        let geo = self.geo;
        let mut specials = vec![(7, "<resize inode>".to_string())];
        if geo.orphan_file_inum != 0 {
            specials.push((geo.orphan_file_inum, "<orphan file>".into()));
        }
        let mut orphan = superblock.last_orphan;
        for _ in 0..16 {
            if orphan == 0 || !geo.is_valid_ino(orphan) {
                break;
            }
            specials.push((orphan, format!("<orphan {orphan}>")));
            orphan = self.inode(orphan).dtime;
        }
        for (ino, name) in specials {
            if self.inode_is_used(ino) || ino == superblock.last_orphan {
                let inode = self.inode(ino);
                if inode.mode != 0 {
                    self.inode_structures(ino, &name, &inode);
                }
            }
        }
        if geo.journal_inum != 0 {
            // The journal is not read yet by the engine; only mark its
            // blocks used so that they are not taken for free space.
            let inode = self.inode(geo.journal_inum);
            let mut used = Vec::new();
            let _ = mapping::for_each_block(geo, self.cache, geo.journal_inum, &inode, &mut |u| {
                used.push(u);
                Ok(())
            });
            for block_use in used {
                match block_use {
                    BlockUse::Data(extent) => {
                        (0..extent.len as u64).for_each(|i| {
                            self.used_blocks.insert(extent.physical + i);
                        });
                    }
                    BlockUse::Meta(block) => {
                        self.used_blocks.insert(block);
                    }
                }
            }
        }
    }

    fn inode_structures(&mut self, ino: u32, path: &str, inode: &Inode) {
        let geo = self.geo;
        let mut list = fields(INODE_FIELDS);
        if geo.inode_size > 128 {
            list.extend(fields(INODE_FIELDS_LARGE));
        }
        list.extend(i_block_fields(inode));
        let at = inode_offset(geo, self.descs, ino);
        let raw = &self.image[at..at + geo.inode_size as usize];
        list.extend(ibody_xattr_fields(raw, inode.extra_isize as usize));
        self.targets.push(Target {
            kind: Kind::Inode,
            owner_name: path.to_string(),
            owner: ino,
            block: 0,
            offset: at,
            len: geo.inode_size as usize,
            fields: list,
        });
        if inode.file_acl != 0 {
            let index = self.block_target(Kind::XattrBlock, path, ino, inode.file_acl);
            self.targets[index].fields = xattr_block_fields(self.block_bytes(inode.file_acl));
        }
        if inode.is_symlink() && inode.is_fast_symlink(geo) {
            return;
        }
        if !inode.has_data_blocks(geo) && !inode.uses_extents() {
            return;
        }
        self.mapping_structures(ino, path, inode);
    }

    fn mapping_structures(&mut self, ino: u32, path: &str, inode: &Inode) {
        let geo = self.geo;
        let mut uses = Vec::new();
        mapping::for_each_block(geo, self.cache, ino, inode, &mut |block_use| {
            uses.push(block_use);
            Ok(())
        })
        .expect("seed mapping");
        let mut data_targets = 0;
        let dir_or_special = inode.is_dir() || inode.is_symlink() || Some(ino) == orphan(geo);
        for block_use in uses {
            match block_use {
                BlockUse::Meta(block) => {
                    let kind = if inode.uses_extents() {
                        Kind::ExtentBlock
                    } else {
                        Kind::IndirectBlock
                    };
                    let index = self.block_target(kind, path, ino, block);
                    let bytes = self.block_bytes(block);
                    self.targets[index].fields = if kind == Kind::ExtentBlock {
                        extent_node_fields(bytes, 0)
                    } else {
                        pointer_fields(bytes)
                    };
                }
                BlockUse::Data(extent) => {
                    for i in 0..extent.len as u64 {
                        self.used_blocks.insert(extent.physical + i);
                    }
                    if !dir_or_special && data_targets < 2 {
                        data_targets += 1;
                        self.block_target(Kind::FileData, path, ino, extent.physical);
                    }
                }
            }
        }
        if inode.is_symlink() {
            if let Ok(Lookup::Mapped(extent)) = mapping::lookup(geo, self.cache, ino, inode, 0) {
                let index = self.block_target(Kind::SymlinkBlock, path, ino, extent.physical);
                let len = inode.size as usize;
                self.targets[index].fields = vec![field("target[0]", 0, 1), field("nul", len, 1)];
            }
        } else if Some(ino) == orphan(geo) {
            self.orphan_blocks(ino, path, inode);
        }
    }

    fn orphan_blocks(&mut self, ino: u32, path: &str, inode: &Inode) {
        let geo = self.geo;
        let block_size = geo.block_size as usize;
        for lblk in 0..inode.size / block_size as u64 {
            if let Ok(Lookup::Mapped(extent)) = mapping::lookup(geo, self.cache, ino, inode, lblk) {
                let index = self.block_target(Kind::OrphanBlock, path, ino, extent.physical);
                let mut list = vec![
                    field("magic", block_size - 8, 4),
                    field("checksum", block_size - 4, 4),
                ];
                list.extend((0..4).map(|slot| field(format!("slot[{slot}]"), slot * 4, 4)));
                self.targets[index].fields = list;
            }
        }
    }

    /// The directory's blocks as targets; its live entries as (name, ino).
    fn dir_children(&mut self, ino: u32, path: &str, inode: &Inode) -> Vec<(String, u32)> {
        let geo = self.geo;
        let block_size = geo.block_size as usize;
        let mut index_blocks = BTreeSet::new();
        let indexed = inode.has_flag(flags::INDEX);
        let mut children = Vec::new();
        for lblk in 0..inode.size / block_size as u64 {
            let Ok(Lookup::Mapped(extent)) = mapping::lookup(geo, self.cache, ino, inode, lblk)
            else {
                continue;
            };
            let block = extent.physical;
            let bytes = self.block_bytes(block).to_vec();
            if indexed && lblk == 0 {
                let index = self.block_target(Kind::DxRoot, path, ino, block);
                self.targets[index].fields = dx_fields(&bytes, true);
                if bytes[30] > 0 {
                    index_blocks.extend(dx_children(&bytes, 32));
                }
                continue;
            }
            if index_blocks.contains(&lblk) {
                let index = self.block_target(Kind::DxNode, path, ino, block);
                self.targets[index].fields = dx_fields(&bytes, false);
                continue;
            }
            let index = self.block_target(Kind::DirLeaf, path, ino, block);
            let (list, names) = leaf_records(&bytes);
            self.targets[index].fields = list;
            children.extend(
                names
                    .into_iter()
                    .filter(|(name, _)| name != "." && name != ".."),
            );
        }
        children
    }

    /// Free blocks and free inode slots, sampled evenly.
    fn unused_space(&mut self) {
        let geo = self.geo;
        let mut free_blocks = Vec::new();
        let mut unused_inodes = Vec::new();
        for group in 0..geo.group_count {
            let desc = &self.descs[group as usize];
            if !geo.has_group_csum() || desc.flags & BG_BLOCK_UNINIT == 0 {
                let bits = self.block_bytes(desc.block_bitmap).to_vec();
                let first = geo.group_first_block(group);
                for bit in 0..geo.blocks_in_group(group) as usize {
                    let block = first + bit as u64;
                    if !bitmap::test_bit(&bits, bit) && !self.used_blocks.contains(&block) {
                        free_blocks.push(block);
                    }
                }
            }
            if !geo.has_group_csum() || desc.flags & BG_INODE_UNINIT == 0 {
                let bits = self.block_bytes(desc.inode_bitmap).to_vec();
                let initialised = if geo.has_group_csum() {
                    geo.inodes_per_group - desc.itable_unused
                } else {
                    geo.inodes_per_group
                };
                for bit in 0..initialised as usize {
                    let ino = group * geo.inodes_per_group + bit as u32 + 1;
                    if ino >= geo.first_ino && !bitmap::test_bit(&bits, bit) {
                        unused_inodes.push(ino);
                    }
                }
            }
        }
        for block in sample(&free_blocks) {
            let index = self.block_target(Kind::FreeBlock, "free space", 0, block);
            self.used_blocks.remove(&block);
            self.targets[index].fields = Vec::new();
        }
        for ino in sample(&unused_inodes) {
            self.targets.push(Target {
                kind: Kind::UnusedInode,
                owner_name: format!("<unused inode {ino}>"),
                owner: ino,
                block: 0,
                offset: inode_offset(geo, self.descs, ino),
                len: geo.inode_size as usize,
                fields: fields(INODE_FIELDS),
            });
        }
    }

    fn interesting_values(&self) -> Vec<u64> {
        let geo = self.geo;
        let mut values: Vec<u64> = self.interesting.iter().copied().collect();
        values.extend([
            geo.blocks_count,
            geo.blocks_count - 1,
            geo.blocks_count + 1,
            geo.inodes_count as u64,
            geo.inodes_count as u64 + 1,
            geo.first_data_block as u64,
            geo.block_size as u64,
            geo.block_size as u64 / 4,
            geo.blocks_per_group as u64,
            geo.inodes_per_group as u64,
            geo.first_ino as u64,
            geo.inode_size as u64,
            12,
            60,
            0x7fff,
            0x8000,
            0xF30A,
            0xEA02_0000,
            0x0fff_ffff,
            0xffff_ffff,
            1 << 32,
        ]);
        values
    }
}

fn orphan(geo: &Geometry) -> Option<u32> {
    (geo.orphan_file_inum != 0).then_some(geo.orphan_file_inum)
}

fn sample<T: Copy>(items: &[T]) -> Vec<T> {
    if items.len() <= SAMPLES_PER_KIND {
        return items.to_vec();
    }
    let step = items.len() / SAMPLES_PER_KIND;
    items
        .iter()
        .step_by(step)
        .take(SAMPLES_PER_KIND)
        .copied()
        .collect()
}

/// Fields of the mapping in `i_block` (an extent root or block pointers).
fn i_block_fields(inode: &Inode) -> Vec<Field> {
    let base = fmt::I_BLOCK;
    if inode.uses_extents() {
        let mut list = extent_node_fields(&inode.block, base);
        list.retain(|f| f.offset + f.width <= base + fmt::I_BLOCK_SIZE);
        return list;
    }
    if inode.is_symlink() && inode.size < 60 {
        return vec![field("i_block.target[0]", base, 1)];
    }
    (0..15)
        .map(|slot| field(format!("i_block[{slot}]"), base + slot * 4, 4))
        .collect()
}

/// Header and entries of an extent node whose header is at `bytes[0]`;
/// field offsets are shifted by `base`.
fn extent_node_fields(bytes: &[u8], base: usize) -> Vec<Field> {
    let mut list = vec![
        field("eh_magic", base, 2),
        field("eh_entries", base + 2, 2),
        field("eh_max", base + 4, 2),
        field("eh_depth", base + 6, 2),
    ];
    let entries = (get_u16(bytes, 2) as usize).min(POINTERS_PER_BLOCK);
    let depth = get_u16(bytes, 6);
    let max = get_u16(bytes, 4) as usize;
    for i in 0..entries {
        let at = base + 12 + i * 12;
        list.push(field(format!("e[{i}].logical"), at, 4));
        if depth == 0 {
            list.push(field(format!("e[{i}].ee_len"), at + 4, 2));
            list.push(field(format!("e[{i}].ee_start_hi"), at + 6, 2));
            list.push(field(format!("e[{i}].ee_start_lo"), at + 8, 4));
        } else {
            list.push(field(format!("e[{i}].ei_leaf_lo"), at + 4, 4));
            list.push(field(format!("e[{i}].ei_leaf_hi"), at + 8, 2));
        }
    }
    if base == 0 {
        list.push(field("et_checksum", 12 + max * 12, 4));
    }
    list
}

fn pointer_fields(bytes: &[u8]) -> Vec<Field> {
    (0..bytes.len() / 4)
        .filter(|slot| get_u32(bytes, slot * 4) != 0)
        .take(POINTERS_PER_BLOCK)
        .map(|slot| field(format!("ptr[{slot}]"), slot * 4, 4))
        .collect()
}

/// Fields of the entries of an xattr area: `start` is the first entry.
fn xattr_entry_fields(bytes: &[u8], start: usize, prefix: &str) -> Vec<Field> {
    let mut list = Vec::new();
    let mut at = start;
    for i in 0..16 {
        if at + 16 > bytes.len() || get_u32(bytes, at) == 0 {
            break;
        }
        let name_len = bytes[at] as usize;
        list.push(field(format!("{prefix}e[{i}].e_name_len"), at, 1));
        list.push(field(format!("{prefix}e[{i}].e_name_index"), at + 1, 1));
        list.push(field(format!("{prefix}e[{i}].e_value_offs"), at + 2, 2));
        list.push(field(format!("{prefix}e[{i}].e_value_inum"), at + 4, 4));
        list.push(field(format!("{prefix}e[{i}].e_value_size"), at + 8, 4));
        list.push(field(format!("{prefix}e[{i}].e_hash"), at + 12, 4));
        at += (16 + name_len).div_ceil(4) * 4;
    }
    list
}

fn ibody_xattr_fields(raw: &[u8], extra_isize: usize) -> Vec<Field> {
    let start = 128 + extra_isize;
    if raw.len() < start + 4 || get_u32(raw, start) != 0xEA02_0000 {
        return Vec::new();
    }
    let mut list = vec![field("ibody.magic", start, 4)];
    list.extend(xattr_entry_fields(raw, start + 4, "ibody."));
    list
}

fn xattr_block_fields(bytes: &[u8]) -> Vec<Field> {
    let mut list = fields(&[
        ("h_magic", 0, 4),
        ("h_refcount", 4, 4),
        ("h_blocks", 8, 4),
        ("h_hash", 12, 4),
        ("h_checksum", 16, 4),
    ]);
    list.extend(xattr_entry_fields(bytes, 32, ""));
    list
}

/// Records of a directory leaf as fields, and its live (name, inode) pairs.
fn leaf_records(bytes: &[u8]) -> (Vec<Field>, Vec<(String, u32)>) {
    let mut list = Vec::new();
    let mut names = Vec::new();
    let mut at = 0;
    let mut record = 0;
    while at + 8 <= bytes.len() {
        let ino = get_u32(bytes, at);
        let rec_len = get_u16(bytes, at + 4) as usize;
        let name_len = bytes[at + 6] as usize;
        if ino != 0 && at + 8 + name_len <= bytes.len() {
            let name = String::from_utf8_lossy(&bytes[at + 8..at + 8 + name_len]).into_owned();
            names.push((name, ino));
        }
        if record < DIR_RECORDS_PER_BLOCK {
            list.push(field(format!("d[{record}].inode"), at, 4));
            list.push(field(format!("d[{record}].rec_len"), at + 4, 2));
            list.push(field(format!("d[{record}].name_len"), at + 6, 1));
            list.push(field(format!("d[{record}].file_type"), at + 7, 1));
            if name_len > 0 {
                list.push(field(format!("d[{record}].name[0]"), at + 8, 1));
            }
        }
        record += 1;
        if rec_len < 8 {
            break;
        }
        at += rec_len;
    }
    (list, names)
}

fn dx_fields(bytes: &[u8], root: bool) -> Vec<Field> {
    let base = if root { 32 } else { 8 };
    let mut list = if root {
        fields(&[
            ("dot.inode", 0, 4),
            ("dot.rec_len", 4, 2),
            ("dotdot.inode", 12, 4),
            ("dotdot.rec_len", 16, 2),
            ("info.reserved", 24, 4),
            ("info.hash_version", 28, 1),
            ("info.info_length", 29, 1),
            ("info.indirect_levels", 30, 1),
            ("info.unused_flags", 31, 1),
        ])
    } else {
        fields(&[("fake.inode", 0, 4), ("fake.rec_len", 4, 2)])
    };
    list.push(field("dx.limit", base, 2));
    list.push(field("dx.count", base + 2, 2));
    list.push(field("dx[0].block", base + 4, 4));
    let count = (get_u16(bytes, base + 2) as usize).min(POINTERS_PER_BLOCK);
    for i in 1..count {
        list.push(field(format!("dx[{i}].hash"), base + i * 8, 4));
        list.push(field(format!("dx[{i}].block"), base + i * 8 + 4, 4));
    }
    let limit = get_u16(bytes, base) as usize;
    if base + limit * 8 + 8 <= bytes.len() {
        list.push(field("dx_tail.checksum", base + limit * 8 + 4, 4));
    }
    list
}

/// Logical blocks an index node points to.
fn dx_children(bytes: &[u8], base: usize) -> Vec<u64> {
    let count = get_u16(bytes, base + 2) as usize;
    (0..count)
        .filter(|i| base + i * 8 + 8 <= bytes.len())
        .map(|i| (get_u32(bytes, base + i * 8 + 4) & 0x0fff_ffff) as u64)
        .collect()
}
