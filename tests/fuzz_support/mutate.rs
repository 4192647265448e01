//! Mutations aimed at the structures of an [`ImageMap`], and the checksum
//! recomputation that lets a damaged structure past verification so that
//! the engine's structural validation is what has to catch it.
//!
//! Choices come from a [`Source`]: a seeded generator for the CI run, the
//! fuzzer's input bytes for `cargo fuzz`.

use super::map::{ImageMap, Kind, Target};
use jext4::engine::format::csum::{crc16, crc32c_raw, inode_seed};
use jext4::engine::format::{get_u16, get_u32, put_u16, put_u32};

/// Where choices come from.
pub trait Source {
    /// A value in `0..bound` (`bound` > 0).
    fn below(&mut self, bound: u64) -> u64;

    fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
}

/// The crate's seeded generator (SplitMix64).
pub use jext4::engine::rng::Rng;

impl Source for Rng {
    fn below(&mut self, bound: u64) -> u64 {
        Rng::below(self, bound)
    }
}

/// Choices read from fuzzer input, 16 bits at a time; once the input is
/// used up, from a generator seeded by the whole input, so that short
/// inputs still make full mutations and longer ones steer more of them.
pub struct Bytes<'a> {
    input: &'a [u8],
    rest: Rng,
}

impl<'a> Bytes<'a> {
    pub fn new(input: &'a [u8]) -> Self {
        // FNV-1a of the input.
        let seed = input.iter().fold(0xcbf2_9ce4_8422_2325u64, |hash, &byte| {
            (hash ^ byte as u64).wrapping_mul(0x0100_0000_01b3)
        });
        Bytes {
            input,
            rest: Rng::new(seed),
        }
    }
}

impl Source for Bytes<'_> {
    fn below(&mut self, bound: u64) -> u64 {
        if self.input.len() < 2 {
            return self.rest.below(bound);
        }
        let value = u16::from_le_bytes([self.input[0], self.input[1]]) as u64;
        self.input = &self.input[2..];
        value % bound
    }
}

/// What a field is set to.
#[derive(Debug, Clone, Copy)]
pub enum FieldValue {
    Absolute(u64),
    PlusOne,
    MinusOne,
    FlipBit(u8),
}

impl FieldValue {
    fn resolve(self, old: u64) -> u64 {
        match self {
            FieldValue::Absolute(value) => value,
            FieldValue::PlusOne => old.wrapping_add(1),
            FieldValue::MinusOne => old.wrapping_sub(1),
            FieldValue::FlipBit(bit) => old ^ 1 << bit,
        }
    }
}

/// What is done to a target.
#[derive(Debug, Clone)]
pub enum Action {
    SetField {
        field: usize,
        value: FieldValue,
    },
    FlipBit {
        byte: usize,
        bit: u8,
    },
    SetByte {
        byte: usize,
        value: u8,
    },
    /// Zero the whole target.
    Zero,
    /// Overwrite the target with the bytes of another target of the same
    /// length (a block duplicated over another).
    CopyFrom {
        source: usize,
    },
    /// Cut the image to this many bytes.
    Truncate {
        len: usize,
    },
    /// Give the superblock another geometry that still passes its own
    /// cross-checks (inode count = groups x inodes per group, first data
    /// block for the block size, sizes in range): `(offset, width, value)`
    /// writes into the superblock.
    Geometry {
        writes: Vec<(usize, usize, u64)>,
    },
}

/// One mutation of one target.
#[derive(Debug, Clone)]
pub struct Mutation {
    pub target: usize,
    pub action: Action,
    /// Recompute the target's checksum afterwards.
    pub fix_checksum: bool,
}

impl Mutation {
    pub fn describe(&self, map: &ImageMap) -> String {
        let target = &map.targets[self.target];
        let action = match &self.action {
            Action::SetField { field, value } => {
                let name = &target.fields[*field].name;
                match *value {
                    FieldValue::Absolute(value) => format!("set {name} := {value:#x}"),
                    FieldValue::PlusOne => format!("add one to {name}"),
                    FieldValue::MinusOne => format!("subtract one from {name}"),
                    FieldValue::FlipBit(bit) => format!("flip bit {bit} of {name}"),
                }
            }
            Action::FlipBit { byte, bit } => format!("flip bit {bit} of byte {byte}"),
            Action::SetByte { byte, value } => format!("set byte {byte} := {value:#04x}"),
            Action::Zero => "zero it".into(),
            Action::CopyFrom { source } => {
                format!("copy {} over it", map.targets[*source].describe())
            }
            Action::Truncate { len } => format!("truncate the image to {len} bytes"),
            Action::Geometry { writes } => {
                let names: Vec<String> = writes
                    .iter()
                    .map(|(offset, _, value)| format!("{}={value}", superblock_field_name(*offset)))
                    .collect();
                format!("reshape: {}", names.join(" "))
            }
        };
        let checksum = if self.fix_checksum {
            ", checksum recomputed"
        } else {
            ""
        };
        format!("{}: {action}{checksum}", target.describe())
    }

    /// Whether the mutation changes bytes that a checksum covers, in a
    /// structure that every walk reads, while leaving the checksum stale:
    /// then the walk must report corruption.
    pub fn must_be_detected(&self, map: &ImageMap, pristine: &[u8], image: &[u8]) -> bool {
        let target = &map.targets[self.target];
        // metadata_csum in s_feature_ro_compat, as the damaged image says.
        let still_checksummed =
            image.len() > 1024 + 0x68 && get_u32(image, 1024 + 0x64) & 0x400 != 0;
        if self.fix_checksum || !map.geo.metadata_csum || !still_checksummed {
            return false;
        }
        let verified_on_every_walk = matches!(
            target.kind,
            Kind::Superblock
                | Kind::GroupDesc
                | Kind::ExtentBlock
                | Kind::DirLeaf
                | Kind::DxRoot
                | Kind::XattrBlock
        ) || (target.kind == Kind::Inode
            && !target.owner_name.starts_with('<'));
        // A block copied from the same owner may carry a valid checksum
        // (leaf and tree block checksums do not cover the block number).
        let keeps_checksum = matches!(self.action, Action::CopyFrom { .. });
        if !verified_on_every_walk
            || keeps_checksum
            || matches!(self.action, Action::Truncate { .. })
        {
            return false;
        }
        let range = target.offset..target.offset + target.len;
        let changed: Vec<usize> = range.filter(|&at| pristine[at] != image[at]).collect();
        !changed.is_empty()
            && changed
                .iter()
                .any(|&at| checksum_covers(map, target, at - target.offset, pristine))
    }
}

/// Whether byte `at` of `target` is under its checksum (the bytes past an
/// extent block's or leaf's tail, or unused index slots, are not).
fn checksum_covers(map: &ImageMap, target: &Target, at: usize, pristine: &[u8]) -> bool {
    let bytes = &pristine[target.offset..target.offset + target.len];
    match target.kind {
        Kind::ExtentBlock => at < 12 + get_u16(bytes, 4) as usize * 12 + 4,
        Kind::DxRoot => {
            let limit = get_u16(bytes, 32) as usize;
            let count = get_u16(bytes, 34) as usize;
            at < 32 + count * 8 || (32 + limit * 8..32 + limit * 8 + 8).contains(&at)
        }
        Kind::GroupDesc => map.geo.metadata_csum,
        _ => true,
    }
}

/// Pick `count` mutations for an image with this map.
/// Pick `count` mutations for an image with this map; after the first,
/// half of them hit the same structure again (fields that must agree with
/// each other, damaged together).
pub fn choose(map: &ImageMap, source: &mut dyn Source, count: usize) -> Vec<Mutation> {
    let mut mutations: Vec<Mutation> = Vec::with_capacity(count);
    for _ in 0..count {
        let mutation = match mutations.first() {
            Some(first) if source.chance(50) => Mutation {
                target: first.target,
                action: choose_action(map, first.target, source),
                fix_checksum: first.fix_checksum,
            },
            _ => choose_one(map, source),
        };
        mutations.push(mutation);
    }
    mutations
}

/// Relative weights of the kinds of targets.
fn weight(kind: Kind) -> u64 {
    match kind {
        Kind::Superblock => 6,
        Kind::GroupDesc => 6,
        Kind::BlockBitmap | Kind::InodeBitmap => 3,
        Kind::Inode => 16,
        Kind::ExtentBlock => 8,
        Kind::IndirectBlock => 5,
        Kind::DirLeaf => 12,
        Kind::DxRoot => 8,
        Kind::DxNode => 6,
        Kind::XattrBlock => 8,
        Kind::SymlinkBlock => 2,
        Kind::OrphanBlock => 4,
        Kind::FileData => 2,
        Kind::FreeBlock | Kind::UnusedInode => 3,
        Kind::Anywhere => 4,
    }
}

fn choose_one(map: &ImageMap, source: &mut dyn Source) -> Mutation {
    let kinds: Vec<Kind> = map.kinds().into_iter().collect();
    let total: u64 = kinds.iter().map(|&kind| weight(kind)).sum();
    let mut pick = source.below(total);
    let mut kind = kinds[0];
    for &candidate in &kinds {
        if pick < weight(candidate) {
            kind = candidate;
            break;
        }
        pick -= weight(candidate);
    }
    let of_kind: Vec<usize> = (0..map.targets.len())
        .filter(|&index| map.targets[index].kind == kind)
        .collect();
    let target = of_kind[source.below(of_kind.len() as u64) as usize];
    let action = choose_action(map, target, source);
    let fix_checksum = map.has_checksums && source.chance(75);
    Mutation {
        target,
        action,
        fix_checksum,
    }
}

fn choose_action(map: &ImageMap, index: usize, source: &mut dyn Source) -> Action {
    let target = &map.targets[index];
    let roll = source.below(100);
    if target.kind == Kind::Anywhere {
        return if roll < 3 {
            let len = target.len / 2 + source.below(target.len as u64 / 2) as usize;
            Action::Truncate {
                len: len / 512 * 512,
            }
        } else {
            let byte = source.below(target.len as u64) as usize;
            Action::FlipBit {
                byte,
                bit: source.below(8) as u8,
            }
        };
    }
    if target.kind == Kind::Superblock && roll < 12 {
        return reshape(map, source);
    }
    if !target.fields.is_empty() && roll < 62 {
        let field = source.below(target.fields.len() as u64) as usize;
        let width = target.fields[field].width;
        let value = choose_value(map, source, width);
        return Action::SetField { field, value };
    }
    let byte = source.below(target.len as u64) as usize;
    match roll {
        0..=79 => Action::FlipBit {
            byte,
            bit: source.below(8) as u8,
        },
        80..=87 => Action::SetByte {
            byte,
            value: source.below(256) as u8,
        },
        88..=93 => Action::Zero,
        _ => {
            let same_len: Vec<usize> = (0..map.targets.len())
                .filter(|&other| other != index && map.targets[other].len == target.len)
                .collect();
            if same_len.is_empty() {
                Action::Zero
            } else {
                let source_index = same_len[source.below(same_len.len() as u64) as usize];
                Action::CopyFrom {
                    source: source_index,
                }
            }
        }
    }
}

/// A value for a field of `width` bytes: boundaries, the image's own
/// numbers, small multiples of four (record lengths, offsets), noise, or
/// the original value changed a little.
fn choose_value(map: &ImageMap, source: &mut dyn Source, width: usize) -> FieldValue {
    let max = if width >= 8 {
        u64::MAX
    } else {
        (1u64 << (width * 8)) - 1
    };
    let value = match source.below(14) {
        0 => 0,
        1 => 1,
        2 => max,
        3 => max / 2 + 1,
        4 => return FieldValue::PlusOne,
        5 => return FieldValue::MinusOne,
        6 | 7 => return FieldValue::FlipBit(source.below(width as u64 * 8) as u8),
        8 | 9 => map.interesting[source.below(map.interesting.len() as u64) as usize],
        10 | 11 => 4 * source.below(map.geo.block_size as u64 / 4 + 4),
        _ => source.below(max.saturating_add(1).max(2)),
    };
    FieldValue::Absolute(value & max)
}

/// Superblock offsets (ext4.h) that `reshape` writes.
const S_INODES_COUNT: usize = 0x00;
const S_BLOCKS_COUNT_LO: usize = 0x04;
const S_FIRST_DATA_BLOCK: usize = 0x14;
const S_LOG_BLOCK_SIZE: usize = 0x18;
const S_LOG_CLUSTER_SIZE: usize = 0x1C;
const S_BLOCKS_PER_GROUP: usize = 0x20;
const S_CLUSTERS_PER_GROUP: usize = 0x24;
const S_INODES_PER_GROUP: usize = 0x28;
const S_INODE_SIZE: usize = 0x58;

fn superblock_field_name(offset: usize) -> &'static str {
    match offset {
        S_INODES_COUNT => "s_inodes_count",
        S_BLOCKS_COUNT_LO => "s_blocks_count_lo",
        S_FIRST_DATA_BLOCK => "s_first_data_block",
        S_LOG_BLOCK_SIZE => "s_log_block_size",
        S_LOG_CLUSTER_SIZE => "s_log_cluster_size",
        S_BLOCKS_PER_GROUP => "s_blocks_per_group",
        S_CLUSTERS_PER_GROUP => "s_clusters_per_group",
        S_INODES_PER_GROUP => "s_inodes_per_group",
        S_INODE_SIZE => "s_inode_size",
        _ => "?",
    }
}

/// A geometry the superblock's own checks accept: block size 1-64 KiB,
/// groups of 8..8*block size blocks and 1..8*block size inodes, inode size
/// a power of two up to the block size, and the inode count to match.
fn reshape(map: &ImageMap, source: &mut dyn Source) -> Action {
    let geo = &map.geo;
    let log_block_size = if source.chance(30) {
        geo.log_block_size as u64
    } else {
        source.below(7)
    };
    let block_size = 1024u64 << log_block_size;
    let pick = |source: &mut dyn Source, original: u64, max: u64| match source.below(4) {
        0 => original.clamp(1, max),
        1 => max,
        2 => 1,
        _ => 1 + source.below(max),
    };
    let blocks_per_group = pick(source, geo.blocks_per_group as u64, block_size) * 8;
    let inodes_per_group = pick(source, geo.inodes_per_group as u64, 8 * block_size);
    let inode_size = 128u64 << source.below(log_block_size + 4);
    let first_data_block = (block_size == 1024) as u64;
    let blocks_count = match source.below(3) {
        0 => geo.blocks_count,
        1 => map.image_len as u64 / block_size,
        _ => first_data_block + 1 + source.below(1 << 32),
    }
    .clamp(first_data_block + 1, u32::MAX as u64);
    let groups = (blocks_count - first_data_block).div_ceil(blocks_per_group);
    let inodes_count = (groups * inodes_per_group).min(u32::MAX as u64);
    Action::Geometry {
        writes: vec![
            (S_LOG_BLOCK_SIZE, 4, log_block_size),
            (S_LOG_CLUSTER_SIZE, 4, log_block_size),
            (S_FIRST_DATA_BLOCK, 4, first_data_block),
            (S_BLOCKS_PER_GROUP, 4, blocks_per_group),
            (S_CLUSTERS_PER_GROUP, 4, blocks_per_group),
            (S_INODES_PER_GROUP, 4, inodes_per_group),
            (S_INODE_SIZE, 2, inode_size.min(block_size)),
            (S_BLOCKS_COUNT_LO, 4, blocks_count),
            (S_INODES_COUNT, 4, inodes_count),
        ],
    }
}

fn read_field(image: &[u8], at: usize, width: usize) -> u64 {
    (0..width).fold(0, |value, i| value | (image[at + i] as u64) << (8 * i))
}

fn write_field(image: &mut [u8], at: usize, width: usize, value: u64) {
    for i in 0..width {
        image[at + i] = (value >> (8 * i)) as u8;
    }
}

/// Apply `mutation` to `image` (which may shrink).
pub fn apply(map: &ImageMap, image: &mut Vec<u8>, mutation: &Mutation) {
    let target = &map.targets[mutation.target];
    let start = target.offset;
    let within = |target: &Target, image: &[u8]| target.offset + target.len <= image.len();
    let cut_short = image.len() < map.image_len;
    if cut_short && target.kind == Kind::Anywhere
        || !within(target, image)
        || matches!(&mutation.action, Action::CopyFrom { source } if !within(&map.targets[*source], image))
    {
        return; // an earlier mutation cut the image short
    }
    match &mutation.action {
        Action::SetField { field, value } => {
            let field = &target.fields[*field];
            let at = start + field.offset;
            if at + field.width > image.len() || field.offset + field.width > target.len {
                return;
            }
            let old = read_field(image, at, field.width);
            write_field(image, at, field.width, value.resolve(old));
        }
        Action::FlipBit { byte, bit } => image[start + byte] ^= 1 << bit,
        Action::SetByte { byte, value } => image[start + byte] = *value,
        Action::Zero => image[start..start + target.len].fill(0),
        Action::CopyFrom { source } => {
            let from = &map.targets[*source];
            let bytes = image[from.offset..from.offset + from.len].to_vec();
            image[start..start + target.len].copy_from_slice(&bytes);
        }
        Action::Truncate { len } => image.truncate(*len),
        Action::Geometry { writes } => {
            for &(offset, width, value) in writes {
                write_field(image, start + offset, width, value);
            }
        }
    }
    if mutation.fix_checksum && !cut_short && !matches!(mutation.action, Action::Truncate { .. }) {
        fix_checksum(map, image, target);
    }
}

/// Recompute whatever checksum covers `target`, from the damaged bytes,
/// wherever the damaged layout still says where the checksum lives.
pub fn fix_checksum(map: &ImageMap, image: &mut [u8], target: &Target) {
    let geo = &map.geo;
    let start = target.offset;
    match target.kind {
        Kind::GroupDesc => fix_desc(map, image, target.owner),
        Kind::BlockBitmap | Kind::InodeBitmap => fix_bitmap(map, image, target),
        _ if !geo.metadata_csum => {}
        Kind::Superblock => {
            let bytes = &mut image[start..start + target.len];
            let sum = crc32c_raw(!0, &bytes[..0x3FC]);
            put_u32(bytes, 0x3FC, sum);
        }
        Kind::Inode | Kind::UnusedInode => {
            fix_inode(map, &mut image[start..start + target.len], target.owner)
        }
        Kind::XattrBlock => {
            let bytes = &mut image[start..start + target.len];
            let mut sum = crc32c_raw(geo.csum_seed, &target.block.to_le_bytes());
            sum = crc32c_raw(sum, &bytes[..16]);
            sum = crc32c_raw(sum, &[0; 4]);
            sum = crc32c_raw(sum, &bytes[20..]);
            put_u32(bytes, 16, sum);
        }
        Kind::ExtentBlock | Kind::DirLeaf | Kind::DxRoot | Kind::DxNode | Kind::OrphanBlock => {
            let seed = owner_seed(map, image, target.owner);
            fix_owned_block(&mut image[start..start + target.len], target, seed);
        }
        _ => {}
    }
}

/// A bitmap's checksum lives in its group descriptor (metadata_csum),
/// whose own checksum then changes too.
fn fix_bitmap(map: &ImageMap, image: &mut [u8], target: &Target) {
    let geo = &map.geo;
    if geo.metadata_csum {
        let start = target.offset;
        let sum = crc32c_raw(geo.csum_seed, &image[start..start + target.len]);
        let desc = desc_offset(map, target.owner);
        let (lo, hi) = if target.kind == Kind::BlockBitmap {
            (0x18, 0x38)
        } else {
            (0x1A, 0x3A)
        };
        put_u16(image, desc + lo, sum as u16);
        if geo.desc_size >= 64 {
            put_u16(image, desc + hi, (sum >> 16) as u16);
        }
    }
    fix_desc(map, image, target.owner);
}

/// Checksums seeded by the owning inode, where the damaged layout still
/// says where they live: extent tail after eh_max entries, leaf tail,
/// htree tail after `limit` entries, orphan block tail.
fn fix_owned_block(block: &mut [u8], target: &Target, seed: u32) {
    let len = block.len();
    match target.kind {
        Kind::ExtentBlock => {
            let tail = 12 + get_u16(block, 4) as usize * 12;
            if tail + 4 <= len {
                let sum = crc32c_raw(seed, &block[..tail]);
                put_u32(block, tail, sum);
            }
        }
        // Only where the tail record (inode 0, rec_len 12) is still there.
        Kind::DirLeaf if get_u32(block, len - 12) == 0 && get_u16(block, len - 8) == 12 => {
            let sum = crc32c_raw(seed, &block[..len - 12]);
            put_u32(block, len - 4, sum);
        }
        Kind::DxRoot | Kind::DxNode => {
            let base = if target.kind == Kind::DxRoot { 32 } else { 8 };
            let limit = get_u16(block, base) as usize;
            let count = get_u16(block, base + 2) as usize;
            let tail = base + limit * 8;
            if tail + 8 <= len && count <= limit {
                let mut sum = crc32c_raw(seed, &block[..base + count * 8]);
                sum = crc32c_raw(sum, &block[tail..tail + 4]);
                sum = crc32c_raw(sum, &[0; 4]);
                put_u32(block, tail + 4, sum);
            }
        }
        Kind::OrphanBlock => {
            let mut sum = crc32c_raw(seed, &target.block.to_le_bytes());
            sum = crc32c_raw(sum, &block[..len - 8]);
            put_u32(block, len - 4, sum);
        }
        _ => {}
    }
}

fn desc_offset(map: &ImageMap, group: u32) -> usize {
    let (block, offset) = map.geo.group_desc_location(group);
    block as usize * map.geo.block_size as usize + offset
}

fn fix_desc(map: &ImageMap, image: &mut [u8], group: u32) {
    let geo = &map.geo;
    let at = desc_offset(map, group);
    let bytes = &mut image[at..at + geo.desc_size as usize];
    let group_le = group.to_le_bytes();
    let sum = if geo.metadata_csum {
        let mut crc = crc32c_raw(geo.csum_seed, &group_le);
        crc = crc32c_raw(crc, &bytes[..0x1E]);
        crc = crc32c_raw(crc, &[0, 0]);
        crc = crc32c_raw(crc, &bytes[0x20..]);
        crc as u16
    } else if geo.gdt_csum {
        let mut crc = crc16(!0, &geo.uuid);
        crc = crc16(crc, &group_le);
        crc = crc16(crc, &bytes[..0x1E]);
        if bytes.len() > 0x20 {
            crc = crc16(crc, &bytes[0x20..]);
        }
        crc
    } else {
        return;
    };
    put_u16(bytes, 0x1E, sum);
}

/// The checksum seed of inode `ino` as its (possibly damaged) bytes say.
fn owner_seed(map: &ImageMap, image: &[u8], ino: u32) -> u32 {
    let at = map.inode_offset(ino);
    inode_seed(map.geo.csum_seed, ino, get_u32(image, at + 0x64))
}

fn fix_inode(map: &ImageMap, raw: &mut [u8], ino: u32) {
    let seed = inode_seed(map.geo.csum_seed, ino, get_u32(raw, 0x64));
    let large = raw.len() > 128;
    let extra_isize = if large {
        get_u16(raw, 0x80) as usize
    } else {
        0
    };
    let has_hi = large && extra_isize >= 4;
    put_u16(raw, 0x7C, 0);
    if has_hi {
        put_u16(raw, 0x82, 0);
    }
    let sum = crc32c_raw(seed, raw);
    put_u16(raw, 0x7C, sum as u16);
    if has_hi {
        put_u16(raw, 0x82, (sum >> 16) as u16);
    }
}
