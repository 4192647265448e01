//! Targeted damage: one named kind applied to a copy of a base image,
//! its parameters (which node, which field, which value, which variant)
//! drawn from a seed, so that (kind, seed) always makes the same damaged
//! image. Damage is applied with `debugfs -w` where debugfs has the verb
//! (`freeb`, `freei`, `sif`, `ssv`, `ln`, `unlink`) and by byte edits
//! otherwise, located through the fuzzer's map of the undamaged image
//! (`fuzz_support::map`) and with the covering checksum recomputed
//! (`fuzz_support::mutate::fix_checksum`) unless the checksum is the
//! damage — so that what the engine has to catch is the structure.
//!
//! Each damage also says where the workload aims: the directory it
//! creates in and the file it removes (the damaged one).

use super::base::{self, Variant};
use crate::common;
use crate::fuzz_support::map::{ImageMap, Kind as MapKind, Target};
use crate::fuzz_support::mutate::fix_checksum;
use jext4::engine::format::{get_u16, get_u32, put_u16, put_u32};
use jext4::engine::rng::Rng;
use std::path::{Path, PathBuf};

/// The damage kinds. `Undamaged` is the control: both runs must then
/// agree on everything and leave clean images.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Kind {
    Undamaged,
    HtreeLimit,
    HtreeCount,
    HtreeHashOrder,
    HtreeDepth,
    HtreeBadBlock,
    BitmapFreesInUse,
    BitmapFreesMetadata,
    InodeBitmapFreesInUse,
    BitmapFreesInodeTable,
    BitmapsShareBlock,
    BitmapChecksum,
    EntryPastInitialised,
    EntryPastInodesCount,
    HugeSize,
    NameWithSlash,
    NameWithNul,
    ExtentLeafChecksum,
    ExtentLeafMagic,
    OrphanLoop,
    XattrSharedBeyondRefcount,
    Ext2NoXattrForeignOwner,
    BlocksInJournal,
}

pub const ALL: &[Kind] = &[
    Kind::Undamaged,
    Kind::HtreeLimit,
    Kind::HtreeCount,
    Kind::HtreeHashOrder,
    Kind::HtreeDepth,
    Kind::HtreeBadBlock,
    Kind::BitmapFreesInUse,
    Kind::BitmapFreesMetadata,
    Kind::InodeBitmapFreesInUse,
    Kind::BitmapFreesInodeTable,
    Kind::BitmapsShareBlock,
    Kind::BitmapChecksum,
    Kind::EntryPastInitialised,
    Kind::EntryPastInodesCount,
    Kind::HugeSize,
    Kind::NameWithSlash,
    Kind::NameWithNul,
    Kind::ExtentLeafChecksum,
    Kind::ExtentLeafMagic,
    Kind::OrphanLoop,
    Kind::XattrSharedBeyondRefcount,
    Kind::Ext2NoXattrForeignOwner,
    Kind::BlocksInJournal,
];

// Seed n damages variant (n + the kind's number) modulo the list's length.
const HTREE_VARIANTS: &[Variant] = &[
    Variant::Ext2,
    Variant::Ext4K1,
    Variant::Ext4K4,
    Variant::Ext4NoCsum,
];
pub const EVERY_VARIANT: &[Variant] = &[
    Variant::Ext4K4,
    Variant::Ext4K1,
    Variant::Ext3,
    Variant::Ext4NoCsum,
    Variant::Ext2,
];
const UNINIT_VARIANTS: &[Variant] = &[Variant::Ext4K4, Variant::Ext4K1, Variant::Ext4NoCsum];
const JOURNAL_VARIANTS: &[Variant] = &[
    Variant::Ext4K4,
    Variant::Ext4K1,
    Variant::Ext3,
    Variant::Ext4NoCsum,
];

impl Kind {
    pub fn name(self) -> String {
        let debug = format!("{self:?}");
        let mut name = String::new();
        for (index, character) in debug.chars().enumerate() {
            if character.is_ascii_uppercase() && index > 0 {
                name.push('_');
            }
            name.push(character.to_ascii_lowercase());
        }
        name
    }

    pub fn from_name(name: &str) -> Option<Kind> {
        ALL.iter().copied().find(|kind| kind.name() == name)
    }

    /// The variants this damage makes sense on; the seed picks one.
    pub fn variants(self) -> &'static [Variant] {
        match self {
            Kind::Undamaged => EVERY_VARIANT,
            Kind::HtreeLimit
            | Kind::HtreeCount
            | Kind::HtreeHashOrder
            | Kind::HtreeDepth
            | Kind::HtreeBadBlock => HTREE_VARIANTS,
            Kind::BitmapFreesInUse
            | Kind::BitmapFreesMetadata
            | Kind::InodeBitmapFreesInUse
            | Kind::BitmapFreesInodeTable
            | Kind::BitmapsShareBlock => EVERY_VARIANT,
            Kind::BitmapChecksum => &[Variant::Ext4K4, Variant::Ext4K1],
            Kind::EntryPastInitialised => UNINIT_VARIANTS,
            Kind::EntryPastInodesCount | Kind::HugeSize => EVERY_VARIANT,
            Kind::NameWithSlash | Kind::NameWithNul => EVERY_VARIANT,
            Kind::ExtentLeafChecksum => &[Variant::Ext4K4, Variant::Ext4K1],
            Kind::ExtentLeafMagic => UNINIT_VARIANTS,
            Kind::OrphanLoop => JOURNAL_VARIANTS,
            Kind::XattrSharedBeyondRefcount => EVERY_VARIANT,
            Kind::Ext2NoXattrForeignOwner => &[Variant::Ext2NoXattr],
            Kind::BlocksInJournal => JOURNAL_VARIANTS,
        }
    }
}

/// Where the workload aims.
#[derive(Debug, Clone)]
pub struct Plan {
    /// Files and a directory are created here, and a file renamed into it.
    pub target_dir: String,
    /// The damaged file the workload removes.
    pub remove: String,
}

/// A damaged image and what was done to it.
#[derive(Debug, Clone)]
pub struct Damage {
    pub kind: Kind,
    pub seed: u64,
    pub variant: Variant,
    pub image: PathBuf,
    /// What was changed, with block and inode numbers.
    pub description: String,
    pub plan: Plan,
}

/// Copy the base image of the variant (seed, kind) picks into `dir` and
/// damage it.
pub fn make(kind: Kind, seed: u64, dir: &Path) -> Damage {
    let mut rng = Rng::derive(seed, &kind.name());
    // Consecutive seeds walk through the variants, each kind from its
    // own starting point (so one seed spreads the kinds over the
    // variants); the rest is drawn.
    let variants = kind.variants();
    let variant = variants[(seed as usize + kind as usize) % variants.len()];
    let image = dir.join(format!("{}-{seed}-{}.img", kind.name(), variant.name()));
    std::fs::copy(base::image(variant), &image).unwrap();
    let mut editor = Editor::new(&image);
    let (description, plan) = apply(kind, variant, &mut editor, &mut rng);
    editor.save();
    Damage {
        kind,
        seed,
        variant,
        image,
        description,
        plan,
    }
}

fn plan(target_dir: &str, remove: &str) -> Plan {
    Plan {
        target_dir: target_dir.into(),
        remove: remove.into(),
    }
}

fn apply(kind: Kind, variant: Variant, editor: &mut Editor, rng: &mut Rng) -> (String, Plan) {
    let big_entry = format!(
        "/big/{}",
        base::big_name(rng.below(base::BIG_ENTRIES as u64) as usize)
    );
    match kind {
        Kind::Undamaged | Kind::Ext2NoXattrForeignOwner => {
            ("nothing changed".into(), plan("/tree", "/tree/small"))
        }
        Kind::HtreeLimit
        | Kind::HtreeCount
        | Kind::HtreeHashOrder
        | Kind::HtreeDepth
        | Kind::HtreeBadBlock => (htree(kind, editor, rng), plan("/big", &big_entry)),
        Kind::BitmapFreesInUse => bitmap_frees_in_use(editor, rng),
        Kind::BitmapFreesMetadata => (
            bitmap_frees_metadata(editor, rng),
            plan("/tree", "/tree/medium"),
        ),
        Kind::InodeBitmapFreesInUse => inode_bitmap_frees(editor, rng),
        Kind::BitmapFreesInodeTable => (
            bitmap_frees_inode_table(editor, rng),
            plan("/tree", "/tree/medium"),
        ),
        Kind::BitmapsShareBlock => (
            bitmaps_share_block(editor, rng),
            plan("/tree", "/tree/medium"),
        ),
        Kind::BitmapChecksum => (bitmap_checksum(editor, rng), plan("/tree", "/tree/medium")),
        Kind::EntryPastInitialised => (
            entry_past_initialised(editor, rng),
            plan("/tree", "/tree/past-init"),
        ),
        Kind::EntryPastInodesCount => (
            entry_past_inodes_count(editor, rng),
            plan("/tree", "/tree/past-count"),
        ),
        Kind::HugeSize => (huge_size(editor, rng), plan("/tree", "/tree/medium")),
        Kind::NameWithSlash | Kind::NameWithNul => {
            let (description, victim) = bad_name(kind, editor, rng);
            (description, plan("/tree/names", &victim))
        }
        Kind::ExtentLeafChecksum | Kind::ExtentLeafMagic => (
            extent_leaf(kind, variant, editor, rng),
            plan("/tree", "/tree/fragmented"),
        ),
        Kind::OrphanLoop => (orphan_loop(editor, rng), plan("/tree/sub", "/tree/small")),
        Kind::XattrSharedBeyondRefcount => (
            xattr_shared(editor, variant),
            plan("/tree", "/tree/xattr-a"),
        ),
        Kind::BlocksInJournal => (
            blocks_in_journal(variant, editor, rng),
            plan("/tree", "/tree/medium"),
        ),
    }
}

/// The image in memory with its map, for byte edits; debugfs commands go
/// to the file, so the two are kept in step.
struct Editor {
    path: PathBuf,
    bytes: Vec<u8>,
    map: ImageMap,
    dirty: bool,
}

impl Editor {
    fn new(path: &Path) -> Editor {
        let bytes = std::fs::read(path).unwrap();
        let map = ImageMap::build(&bytes);
        Editor {
            path: path.to_path_buf(),
            bytes,
            map,
            dirty: false,
        }
    }

    fn save(&mut self) {
        if self.dirty {
            std::fs::write(&self.path, &self.bytes).unwrap();
            self.dirty = false;
        }
    }

    /// Run debugfs commands on the file and reload its bytes; the map
    /// stays that of the undamaged image (a map of the damaged one may
    /// not build), unless `remap`.
    fn debugfs(&mut self, commands: &str) -> String {
        self.debugfs_then(commands, false)
    }

    fn debugfs_then(&mut self, commands: &str, remap: bool) -> String {
        self.save();
        let said = common::journal::debugfs_commands(&self.path, commands);
        for complaint in ["Invalid", "not found", "Couldn't", "bad inode", "Usage"] {
            assert!(
                !said.contains(complaint),
                "debugfs refused the damage:\n{commands}\n{said}"
            );
        }
        if remap {
            *self = Editor::new(&self.path);
        } else {
            self.bytes = std::fs::read(&self.path).unwrap();
        }
        said
    }

    fn targets(&self, kind: MapKind, owner: &str) -> Vec<Target> {
        self.map
            .targets
            .iter()
            .filter(|target| target.kind == kind && target.owner_name == owner)
            .cloned()
            .collect()
    }

    fn target(&self, kind: MapKind, owner: &str) -> Target {
        self.targets(kind, owner)
            .into_iter()
            .next()
            .unwrap_or_else(|| panic!("the base image has no {kind:?} of {owner}"))
    }

    fn ino(&self, path: &str) -> u32 {
        self.target(MapKind::Inode, path).owner
    }

    /// `width` bytes of a little-endian field at `offset` in the image.
    fn get(&self, offset: usize, width: usize) -> u32 {
        match width {
            1 => self.bytes[offset] as u32,
            2 => get_u16(&self.bytes, offset) as u32,
            _ => get_u32(&self.bytes, offset),
        }
    }

    fn put(&mut self, offset: usize, width: usize, value: u32) {
        match width {
            1 => self.bytes[offset] = value as u8,
            2 => put_u16(&mut self.bytes, offset, value as u16),
            _ => put_u32(&mut self.bytes, offset, value),
        }
        self.dirty = true;
    }

    fn fix_checksum(&mut self, target: &Target) {
        fix_checksum(&self.map, &mut self.bytes, target);
        self.dirty = true;
    }

    /// The offset in the image of the live entry `name` in `dir`'s leaves,
    /// and its leaf.
    fn find_entry(&self, dir: &str, name: &[u8]) -> (usize, Target) {
        for leaf in self.targets(MapKind::DirLeaf, dir) {
            let block = &self.bytes[leaf.offset..leaf.offset + leaf.len];
            let mut at = 0;
            while at + 8 <= block.len() {
                let rec_len = get_u16(block, at + 4) as usize;
                let name_len = block[at + 6] as usize;
                if get_u32(block, at) != 0 && &block[at + 8..at + 8 + name_len] == name {
                    return (leaf.offset + at, leaf);
                }
                if rec_len < 8 {
                    break;
                }
                at += rec_len;
            }
        }
        panic!("no entry {} in {dir}", String::from_utf8_lossy(name))
    }
}

/// Offsets of an htree node's count/limit header: 32 in the root (after
/// the fake "." and ".." entries and dx_root_info), 8 in an interior node.
fn dx_base(target: &Target) -> usize {
    if target.kind == MapKind::DxRoot {
        32
    } else {
        8
    }
}

fn htree(kind: Kind, editor: &mut Editor, rng: &mut Rng) -> String {
    let root = editor.target(MapKind::DxRoot, "/big");
    let levels = editor.get(root.offset + 30, 1);
    if kind == Kind::HtreeDepth {
        let mut choices = vec![levels + 1, 3];
        if levels > 0 {
            choices.push(levels - 1);
        }
        let value = *rng.pick(&choices);
        editor.put(root.offset + 30, 1, value);
        editor.fix_checksum(&root);
        return format!(
            "/big htree root (block {}): indirect_levels {levels} set to {value}",
            root.block
        );
    }
    // Interior nodes are chosen as often as the root where there are any.
    let nodes = editor.targets(MapKind::DxNode, "/big");
    let node = if !nodes.is_empty() && rng.chance(1, 2) {
        rng.pick(&nodes).clone()
    } else {
        root.clone()
    };
    let base = node.offset + dx_base(&node);
    let (limit, count) = (editor.get(base, 2), editor.get(base + 2, 2));
    let where_ = format!(
        "/big {} (block {}; limit {limit}, count {count}; {levels} index levels under the root)",
        if node.kind == MapKind::DxRoot {
            "htree root"
        } else {
            "htree interior node"
        },
        node.block,
    );
    let change = htree_node_change(kind, editor, rng, &node, &root);
    editor.fix_checksum(&node);
    format!("{where_}: {change}")
}

/// Change the count/limit header or an entry of one index node.
fn htree_node_change(
    kind: Kind,
    editor: &mut Editor,
    rng: &mut Rng,
    node: &Target,
    root: &Target,
) -> String {
    let base = node.offset + dx_base(node);
    let (limit, count) = (editor.get(base, 2), editor.get(base + 2, 2));
    match kind {
        Kind::HtreeLimit => {
            let value = if rng.chance(1, 2) {
                limit - 1
            } else {
                limit + 1
            };
            editor.put(base, 2, value);
            format!("limit set to {value}")
        }
        Kind::HtreeCount => {
            let value = *rng.pick(&[0, limit + 1, count - 1]);
            editor.put(base + 2, 2, value);
            format!("count set to {value}")
        }
        Kind::HtreeHashOrder => {
            // Entry 0 has no hash; swap the hashes of entries i and i+1.
            let i = rng.range(1, count as u64 - 2) as usize;
            let (a, b) = (base + 8 * i, base + 8 * (i + 1));
            let (hash_a, hash_b) = (editor.get(a, 4), editor.get(b, 4));
            editor.put(a, 4, hash_b);
            editor.put(b, 4, hash_a);
            format!(
                "hashes of entries {i} and {} swapped ({hash_a:#x}, {hash_b:#x})",
                i + 1
            )
        }
        Kind::HtreeBadBlock => {
            let dir_blocks = {
                let inode = editor.target(MapKind::Inode, "/big");
                editor.get(inode.offset + 4, 4) / editor.map.geo.block_size
            };
            let i = rng.below(count as u64) as usize;
            let mut choices = vec![dir_blocks + 3, 0];
            if node.kind == MapKind::DxNode {
                // Back up the tree: a cycle through the interior level.
                choices.push(editor.get(root.offset + 36, 4));
            }
            let value = *rng.pick(&choices);
            editor.put(base + 8 * i + 4, 4, value);
            format!("entry {i} points to directory block {value} (the directory has {dir_blocks})")
        }
        _ => unreachable!("{kind:?} is not a change of an htree node"),
    }
}

/// Physical blocks of a file, from `debugfs -R "blocks PATH"`.
fn file_blocks(image: &Path, path: &str) -> Vec<u64> {
    let (code, text) = common::journal::run(
        "debugfs",
        &["-R", &format!("blocks {path}"), image.to_str().unwrap()],
    );
    assert_eq!(code, 0, "debugfs blocks {path}: {text}");
    text.split_whitespace()
        .filter_map(|word| word.parse().ok())
        .collect()
}

fn bitmap_frees_in_use(editor: &mut Editor, rng: &mut Rng) -> (String, Plan) {
    let medium = file_blocks(&editor.path, "/tree/medium");
    let sub = file_blocks(&editor.path, "/tree/sub");
    let (what, blocks, target_dir) = match rng.below(3) {
        0 => ("data blocks of /tree/medium", medium[..8].to_vec(), "/tree"),
        1 => ("the directory block of /tree/sub", sub.clone(), "/tree/sub"),
        _ => {
            let mut both = medium[..4].to_vec();
            both.extend(&sub);
            (
                "data of /tree/medium and the block of /tree/sub",
                both,
                "/tree/sub",
            )
        }
    };
    let counts = free_blocks(editor, &blocks, rng);
    (
        format!("block bitmap frees {what}: blocks {blocks:?} ({counts})"),
        plan(target_dir, "/tree/medium"),
    )
}

/// `freeb` each block; mostly with the free counts of their groups and
/// of the superblock raised to match (debugfs's `freeb` changes only the
/// bitmap, and a count that disagrees with its bitmap is a damage the
/// kernel catches by itself when it builds the group's buddy), sometimes
/// with the counts left stale.
fn free_blocks(editor: &mut Editor, blocks: &[u64], rng: &mut Rng) -> &'static str {
    let mut commands: String = blocks
        .iter()
        .map(|block| format!("freeb {block}\n"))
        .collect();
    if !rng.chance(3, 4) {
        editor.debugfs(&commands);
        return "group free counts left stale";
    }
    let geo = &editor.map.geo;
    let mut per_group = std::collections::BTreeMap::<u32, u32>::new();
    for &block in blocks {
        *per_group.entry(geo.group_of_block(block)).or_default() += 1;
    }
    for (group, freed) in per_group {
        let free = editor.map.descs[group as usize].free_blocks + freed;
        commands += &format!("set_bg {group} free_blocks_count {free}\n");
    }
    let total =
        common::journal::fs_superblock(&editor.path).free_blocks_count + blocks.len() as u64;
    commands += &format!("ssv free_blocks_count {total}\n");
    editor.debugfs(&commands);
    "group free counts raised to match"
}

fn bitmap_frees_metadata(editor: &mut Editor, rng: &mut Rng) -> String {
    let geo = &editor.map.geo;
    let group = geo.group_of_inode(editor.ino("/tree"));
    let desc = editor.map.descs[group as usize].clone();
    let (what, first, count) = match rng.below(3) {
        0 => ("its block bitmap", desc.block_bitmap, 1),
        1 => ("its inode bitmap", desc.inode_bitmap, 1),
        _ => (
            "the first two blocks of its inode table",
            desc.inode_table,
            2,
        ),
    };
    let blocks: Vec<u64> = (first..first + count).collect();
    let counts = free_blocks(editor, &blocks, rng);
    format!(
        "block bitmap of group {group} (that of /tree) frees {what}: {count} block(s) from {first} ({counts})"
    )
}

/// The block bitmap holding /tree's group's inode table (the group's own
/// without flex_bg, its flex group's first with it) frees a run of that
/// table: the kernel skips the check with flex_bg and would hand the
/// blocks out (its system zone stops it at allocation).
fn bitmap_frees_inode_table(editor: &mut Editor, rng: &mut Rng) -> String {
    let geo = &editor.map.geo;
    let group = geo.group_of_inode(editor.ino("/tree"));
    let desc = editor.map.descs[group as usize].clone();
    let table = geo.inode_table_blocks as u64;
    let count = rng.range(1, table.min(8));
    let first = desc.inode_table + rng.below(table - count + 1);
    let blocks: Vec<u64> = (first..first + count).collect();
    let holder = geo.group_of_block(first);
    let counts = free_blocks(editor, &blocks, rng);
    format!(
        "the block bitmap of group {holder} frees blocks {first}..{} of group {group}'s inode table \
         (that of /tree, blocks {}..{}; {counts})",
        first + count,
        desc.inode_table,
        desc.inode_table + table,
    )
}

/// A group descriptor points two of its group's metadata at one block
/// (the descriptor's checksum recomputed): the kernel refuses the mount
/// ("failed to initialize system zone").
fn bitmaps_share_block(editor: &mut Editor, rng: &mut Rng) -> String {
    let geo = &editor.map.geo;
    let group = geo.group_of_inode(editor.ino("/tree"));
    let desc = editor.map.descs[group as usize].clone();
    let table = geo.inode_table_blocks as u64;
    let (field, value, what) = match rng.below(4) {
        0 => ("inode_bitmap", desc.block_bitmap, "its block bitmap"),
        1 => ("block_bitmap", desc.inode_bitmap, "its inode bitmap"),
        2 => (
            "inode_bitmap",
            desc.inode_table + rng.below(table),
            "a block of its inode table",
        ),
        _ => (
            "block_bitmap",
            desc.inode_table + rng.below(table),
            "a block of its inode table",
        ),
    };
    editor.debugfs(&format!(
        "set_bg {group} {field} {value}\nset_bg {group} checksum calc\n"
    ));
    format!("group {group} (that of /tree): {field} set to block {value}, {what}")
}

/// A bitmap checksum of /tree's group flipped in its descriptor (the
/// descriptor's own checksum recomputed): the kernel's
/// ext4_validate_block_bitmap / ext4_validate_inode_bitmap fail.
fn bitmap_checksum(editor: &mut Editor, rng: &mut Rng) -> String {
    let geo = &editor.map.geo;
    let group = geo.group_of_inode(editor.ino("/tree"));
    let (field, which) = match rng.below(3) {
        0 | 1 => ("block_bitmap_csum", "block"),
        _ => ("inode_bitmap_csum", "inode"),
    };
    let flip = 1u32 << rng.below(16);
    editor.debugfs(&format!(
        "set_bg {group} {field} {flip:#x}\nset_bg {group} checksum calc\n"
    ));
    format!("group {group} (that of /tree): the {which} bitmap checksum set to {flip:#x}")
}

fn inode_bitmap_frees(editor: &mut Editor, rng: &mut Rng) -> (String, Plan) {
    let victims: &[&str] = match rng.below(2) {
        0 => &["/tree/medium"],
        _ => &["/tree/small", "/tree/medium", "/tree/sub"],
    };
    let inodes: Vec<u32> = victims.iter().map(|path| editor.ino(path)).collect();
    let mut commands: String = victims
        .iter()
        .map(|path| format!("freei {path}\n"))
        .collect();
    // As for blocks: mostly with the free counts raised to match.
    let consistent = rng.chance(3, 4);
    if consistent {
        let geo = &editor.map.geo;
        let mut per_group = std::collections::BTreeMap::<u32, u32>::new();
        for &ino in &inodes {
            *per_group.entry(geo.group_of_inode(ino)).or_default() += 1;
        }
        for (group, freed) in per_group {
            let free = editor.map.descs[group as usize].free_inodes + freed;
            commands += &format!("set_bg {group} free_inodes_count {free}\n");
        }
        let total =
            common::journal::fs_superblock(&editor.path).free_inodes_count + inodes.len() as u32;
        commands += &format!("ssv free_inodes_count {total}\n");
    }
    editor.debugfs(&commands);
    let counts = if consistent {
        "group free counts raised to match"
    } else {
        "group free counts left stale"
    };
    (
        format!("inode bitmap frees in-use inodes {inodes:?} ({victims:?}; {counts})"),
        plan("/tree", "/tree/small"),
    )
}

fn entry_past_initialised(editor: &mut Editor, rng: &mut Rng) -> String {
    let geo = &editor.map.geo;
    let per_group = geo.inodes_per_group;
    let groups: Vec<u32> = (0..geo.group_count)
        .filter(|&group| editor.map.descs[group as usize].itable_unused > 0)
        .collect();
    assert!(!groups.is_empty(), "no group has uninitialised inodes");
    let group = *rng.pick(&groups);
    let unused = editor.map.descs[group as usize].itable_unused;
    let first_uninitialised = group * per_group + (per_group - unused) + 1;
    let ino = first_uninitialised + rng.below(unused as u64) as u32;
    editor.debugfs(&format!("ln <{ino}> /tree/past-init\n"));
    format!(
        "/tree/past-init names inode {ino}, past the {} initialised inodes of group {group} (bg_itable_unused {unused})",
        per_group - unused
    )
}

fn entry_past_inodes_count(editor: &mut Editor, rng: &mut Rng) -> String {
    let placeholder = editor.ino("/tree/small");
    // A valid inode first, so that the map of the result builds and
    // shows where debugfs put the entry.
    editor.debugfs_then(&format!("ln <{placeholder}> /tree/past-count\n"), true);
    let (offset, leaf) = editor.find_entry("/tree", b"past-count");
    let ino = editor.map.geo.inodes_count + 1 + rng.below(1000) as u32;
    editor.put(offset, 4, ino);
    editor.fix_checksum(&leaf);
    format!(
        "/tree/past-count names inode {ino}, past s_inodes_count {} (directory block {})",
        editor.map.geo.inodes_count, leaf.block
    )
}

fn huge_size(editor: &mut Editor, rng: &mut Rng) -> String {
    let size: u64 = *rng.pick(&[1 << 63, (1 << 63) + 4096, u64::MAX - 511]);
    editor.debugfs(&format!("sif /tree/medium size {size:#x}\n"));
    format!("/tree/medium i_size set to {size:#x} (above 2^63)")
}

fn bad_name(kind: Kind, editor: &mut Editor, rng: &mut Rng) -> (String, String) {
    let name = *rng.pick(&["name-one", "name-two", "name-three"]);
    let (offset, leaf) = editor.find_entry("/tree/names", name.as_bytes());
    let position = rng.range(1, name.len() as u64 - 2) as usize;
    let byte = if kind == Kind::NameWithSlash { b'/' } else { 0 };
    editor.put(offset + 8 + position, 1, byte as u32);
    editor.fix_checksum(&leaf);
    let mut damaged = name.as_bytes().to_vec();
    damaged[position] = byte;
    let shown = String::from_utf8_lossy(&damaged).replace('\0', "\\0");
    (
        format!(
            "/tree/names/{name} renamed on disk to {shown:?} (directory block {})",
            leaf.block
        ),
        format!(
            "/tree/names/{}",
            String::from_utf8_lossy(&damaged[..position])
        ),
    )
}

fn extent_leaf(kind: Kind, variant: Variant, editor: &mut Editor, rng: &mut Rng) -> String {
    assert!(variant.has_extents());
    let leaf = editor.target(MapKind::ExtentBlock, "/tree/fragmented");
    let max = editor.get(leaf.offset + 4, 2) as usize;
    if kind == Kind::ExtentLeafChecksum {
        let tail = leaf.offset + 12 + 12 * max;
        let flip = 1u32 << rng.below(32);
        let sum = editor.get(tail, 4);
        editor.put(tail, 4, sum ^ flip);
        return format!(
            "extent leaf of /tree/fragmented (block {}): checksum {sum:#x} flipped to {:#x}",
            leaf.block,
            sum ^ flip
        );
    }
    let value = *rng.pick(&[0, 0xF30B, 0x0AF3]);
    editor.put(leaf.offset, 2, value);
    editor.fix_checksum(&leaf);
    format!(
        "extent leaf of /tree/fragmented (block {}): eh_magic set to {value:#x}",
        leaf.block
    )
}

/// /tree/medium's first block (its in-inode extent's start, or its
/// first direct block without extents) moved into the journal's blocks:
/// the kernel refuses the mapping (`ext4_inode_block_valid`, the journal
/// being in its system zone), and removing the file must not free
/// journal blocks.
fn blocks_in_journal(variant: Variant, editor: &mut Editor, rng: &mut Rng) -> String {
    // Far enough from the journal's end for the extent's whole run.
    let lblk = rng.range(0, 512);
    let said = editor.debugfs(&format!("bmap <8> {lblk}\n"));
    let journal_block: u64 = said
        .lines()
        .filter_map(|line| line.trim().parse().ok())
        .next()
        .unwrap_or_else(|| panic!("debugfs bmap <8> {lblk}: {said}"));
    // i_block[5] is the first extent's ee_start_lo after the 12-byte
    // header and ee_block, ee_len/ee_start_hi (a depth-0 tree: 50,000
    // bytes in one run).
    let field = match variant.has_extents() {
        true => "block[5]",
        false => "block[0]",
    };
    editor.debugfs(&format!("sif /tree/medium {field} {journal_block}\n"));
    format!("/tree/medium's {field} set to block {journal_block}, journal block {lblk}")
}

fn orphan_loop(editor: &mut Editor, rng: &mut Rng) -> String {
    let (a, b) = (editor.ino("/tree/sub/a"), editor.ino("/tree/sub/b"));
    let (commands, chain) = match rng.below(3) {
        // Two unlinked inodes, each naming the other as the next orphan.
        0 => (
            format!(
                "unlink /tree/sub/a\nunlink /tree/sub/b\nsif <{a}> links_count 0\nsif <{b}> links_count 0\nsif <{a}> dtime {b}\nsif <{b}> dtime {a}\nssv last_orphan {a}\n"
            ),
            format!("unlinked {a} -> {b} -> {a}"),
        ),
        // One unlinked inode naming itself.
        1 => (
            format!(
                "unlink /tree/sub/a\nsif <{a}> links_count 0\nsif <{a}> dtime {a}\nssv last_orphan {a}\n"
            ),
            format!("unlinked {a} -> {a}"),
        ),
        // Linked files (truncation orphans) in a loop.
        _ => (
            format!("sif <{a}> dtime {b}\nsif <{b}> dtime {a}\nssv last_orphan {a}\n"),
            format!("linked /tree/sub/a ({a}) -> /tree/sub/b ({b}) -> {a}"),
        ),
    };
    editor.debugfs(&commands);
    format!("orphan chain loops: s_last_orphan -> {chain}")
}

fn xattr_shared(editor: &mut Editor, variant: Variant) -> String {
    assert!(variant.has_xattrs());
    let block = editor.target(MapKind::XattrBlock, "/tree/xattr-a").block;
    let other = editor.target(MapKind::Inode, "/tree/xattr-b");
    let sectors = editor.get(other.offset + 0x1C, 4) + editor.map.geo.block_size / 512;
    let refcount = editor.get(block as usize * editor.map.geo.block_size as usize + 4, 4);
    editor.debugfs(&format!(
        "sif /tree/xattr-b file_acl {block}\nsif /tree/xattr-b blocks {sectors}\n"
    ));
    format!(
        "xattr block {block} of /tree/xattr-a (h_refcount {refcount}) also named by /tree/xattr-b"
    )
}
