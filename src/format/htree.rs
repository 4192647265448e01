//! Hash-indexed (htree, dir_index) directories: name hashes, index blocks,
//! indexed lookup, insert with leaf and index splits, hash-order readdir.
//!
//! On disk (namei.c, Documentation/filesystems/ext4/directory.rst): block 0
//! is the root, `dx_root`: a "." record of 12 bytes, a ".." record spanning
//! the rest of the block (so that a linear reader sees nothing else), then
//! `dx_root_info` at byte 24 (reserved u32, hash_version, info_length = 8,
//! indirect_levels, flags) and the index at byte 32. Interior nodes,
//! `dx_node`, start with a fake free record whose rec_len is the whole
//! block, then the index at byte 8. An index is `limit u16, count u16`
//! overlaid on the hash of entry 0, then `count` entries `(hash u32,
//! block u32)` sorted by hash; entry 0's hash is implicitly the lowest
//! of its range. With metadata_csum a `dx_tail` (reserved u32, crc u32)
//! follows `limit` entries, and `limit` is smaller by one entry.
//!
//! Leaves are ordinary entry blocks (`dir.rs`). A leaf holds the names whose
//! hash lies in its index range. A split may cut a run of equal hashes; the
//! second block's index hash then has its low bit set ("continuation"), and
//! a lookup that ends its leaf without a match goes on while the next index
//! hash, low bit cleared, equals the name's hash. Hashes themselves always
//! have the low bit clear.
//!
//! The tree has 1 + indirect_levels index levels: at most 2, or 3 with
//! large_dir (ext4_dir_htree_level). Every path from the root to a leaf has
//! that many index blocks, which e2fsck checks.

use super::casefold;
use super::csum::crc32c_raw;
use super::dir::{
    self, DirBlocks, DirEntry, DirStats, EntryLocation, Format, Records, dot_records, find_name,
    find_slot, insert_record, modify_leaf, read_dir_block, read_leaf, rec_len_from_disk,
    rec_len_to_disk, record_len, verify_leaf_csum, write_packed_leaf, write_record,
};
use super::{get_u16, get_u32, put_u16, put_u32};
use crate::cache::Buffer;
use crate::ensure_format;
use crate::error::{Error, Result};
use crate::faults::{self, Fault};
use crate::journal::Handle;
use std::collections::HashSet;
use std::sync::Arc;

/// `dx_root_info.hash_version` values (ext4.h DX_HASH_*). The stored
/// version is 0-2; the unsigned variants (+3) are what the filesystem uses
/// when the superblock says its creator's `char` was unsigned.
pub mod hash_version {
    pub const LEGACY: u8 = 0;
    pub const HALF_MD4: u8 = 1;
    pub const TEA: u8 = 2;
    pub const LEGACY_UNSIGNED: u8 = 3;
    pub const HALF_MD4_UNSIGNED: u8 = 4;
    pub const TEA_UNSIGNED: u8 = 5;
    /// Casefolded + encrypted directories only; not supported here.
    pub const SIPHASH: u8 = 6;
}

/// A name's hash: `major` orders the index (low bit always clear), `minor`
/// breaks ties in the kernel's readdir (0 for the legacy hash).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct NameHash {
    pub major: u32,
    pub minor: u32,
}

/// hash.c: the seed used when the superblock's s_hash_seed is all zeros.
const DEFAULT_SEED: [u32; 4] = [0x6745_2301, 0xefcd_ab89, 0x98ba_dcfe, 0x1032_5476];
/// ext4.h EXT4_HTREE_EOF_32BIT: the kernel keeps this hash (shifted) free
/// as its 32-bit readdir end marker.
const HTREE_EOF_32BIT: u32 = 0x7fff_ffff;

/// The kernel's `ext4fs_dirhash` for hash versions 0-5; `None` for others.
pub fn name_hash(version: u8, seed: &[u32; 4], name: &[u8]) -> Option<NameHash> {
    use hash_version::*;
    let mut buf = if seed.iter().any(|&word| word != 0) {
        *seed
    } else {
        DEFAULT_SEED
    };
    let (major, minor) = match version {
        LEGACY | LEGACY_UNSIGNED => (legacy_hash(name, version == LEGACY_UNSIGNED), 0),
        HALF_MD4 | HALF_MD4_UNSIGNED => {
            let mut input = [0u32; 8];
            for start in (0..name.len()).step_by(32) {
                name_to_words(&name[start..], version == HALF_MD4_UNSIGNED, &mut input);
                half_md4_transform(&mut buf, &input);
            }
            (buf[1], buf[2])
        }
        TEA | TEA_UNSIGNED => {
            let mut input = [0u32; 4];
            for start in (0..name.len()).step_by(16) {
                name_to_words(&name[start..], version == TEA_UNSIGNED, &mut input);
                tea_transform(&mut buf, &input);
            }
            (buf[0], buf[1])
        }
        _ => return None,
    };
    let mut major = major & !1;
    if major == HTREE_EOF_32BIT << 1 {
        major = (HTREE_EOF_32BIT - 1) << 1;
    }
    Some(NameHash { major, minor })
}

/// dx_hack_hash: the original ext3 htree hash.
fn legacy_hash(name: &[u8], unsigned: bool) -> u32 {
    let (mut hash0, mut hash1) = (0x12a3_fe2d_u32, 0x37ab_e8f9_u32);
    for &byte in name {
        let c = char_value(byte, unsigned);
        let mut hash = hash1.wrapping_add(hash0 ^ c.wrapping_mul(7_152_373) as u32);
        if hash & 0x8000_0000 != 0 {
            hash = hash.wrapping_sub(0x7fff_ffff);
        }
        hash1 = hash0;
        hash0 = hash;
    }
    hash0 << 1
}

/// A name byte as C's `char` promotes it: sign-extended where `char` is
/// signed (x86), zero-extended where unsigned (ARM, PowerPC).
fn char_value(byte: u8, unsigned: bool) -> i32 {
    if unsigned {
        byte as i32
    } else {
        byte as i8 as i32
    }
}

/// str2hashbuf: pack up to `out.len() * 4` bytes of the name, big-endian
/// within each word, padding with a pattern of the remaining length.
fn name_to_words(rest: &[u8], unsigned: bool, out: &mut [u32]) {
    let length = rest.len() as u32;
    let mut pad = length | (length << 8);
    pad |= pad << 16;
    let mut value = pad;
    let mut filled = 0;
    for (index, &byte) in rest.iter().take(out.len() * 4).enumerate() {
        value = (char_value(byte, unsigned) as u32).wrapping_add(value << 8);
        if index % 4 == 3 {
            out[filled] = value;
            filled += 1;
            value = pad;
        }
    }
    if filled < out.len() {
        out[filled] = value;
        filled += 1;
    }
    out[filled..].fill(pad);
}

/// hash.c half_md4_transform: MD4's three rounds over 8 words, keeping the
/// whole state. Each round visits the words in its own order with its own
/// shifts and constant.
fn half_md4_transform(buf: &mut [u32; 4], input: &[u32; 8]) {
    const ROUNDS: [([usize; 8], [u32; 4], u32); 3] = [
        ([0, 1, 2, 3, 4, 5, 6, 7], [3, 7, 11, 19], 0),
        ([1, 3, 5, 7, 0, 2, 4, 6], [3, 5, 9, 13], 0o13240474631),
        ([3, 7, 2, 6, 1, 5, 0, 4], [3, 9, 11, 15], 0o15666365641),
    ];
    let mut v = *buf;
    for (round, (order, shifts, constant)) in ROUNDS.iter().enumerate() {
        for step in 0..8 {
            // Steps target a, d, c, b in turn; the function takes the other
            // three in rotation order.
            let target = (4 - step % 4) % 4;
            let (x, y, z) = (
                v[(target + 1) % 4],
                v[(target + 2) % 4],
                v[(target + 3) % 4],
            );
            let mixed = match round {
                0 => z ^ (x & (y ^ z)),
                1 => (x & y).wrapping_add((x ^ y) & z),
                _ => x ^ y ^ z,
            };
            let word = input[order[step]].wrapping_add(*constant);
            v[target] = v[target]
                .wrapping_add(mixed)
                .wrapping_add(word)
                .rotate_left(shifts[step % 4]);
        }
    }
    for (state, value) in buf.iter_mut().zip(v) {
        *state = state.wrapping_add(value);
    }
}

/// hash.c TEA_transform: 16 rounds of the Tiny Encryption Algorithm.
fn tea_transform(buf: &mut [u32; 4], input: &[u32; 4]) {
    const DELTA: u32 = 0x9E37_79B9;
    let (mut b0, mut b1) = (buf[0], buf[1]);
    let [a, b, c, d] = *input;
    let mut sum = 0u32;
    for _ in 0..16 {
        sum = sum.wrapping_add(DELTA);
        b0 = b0.wrapping_add(
            ((b1 << 4).wrapping_add(a)) ^ b1.wrapping_add(sum) ^ ((b1 >> 5).wrapping_add(b)),
        );
        b1 = b1.wrapping_add(
            ((b0 << 4).wrapping_add(c)) ^ b0.wrapping_add(sum) ^ ((b0 >> 5).wrapping_add(d)),
        );
    }
    buf[0] = buf[0].wrapping_add(b0);
    buf[1] = buf[1].wrapping_add(b1);
}

/// The hash a directory uses: its root's version, made unsigned per the
/// superblock, and the filesystem's seed.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Hasher {
    version: u8,
    seed: [u32; 4],
    /// A casefolded directory: names hash by their folded bytes (those
    /// that do not fold, by their own), as ext4fs_dirhash hashes them.
    casefold: bool,
}

impl Hasher {
    fn new(fmt: &Format, stored_version: u8) -> Self {
        debug_assert!(stored_version <= hash_version::TEA);
        let version = if fmt.hash_unsigned {
            stored_version + 3
        } else {
            stored_version
        };
        Hasher {
            version,
            seed: fmt.hash_seed,
            casefold: fmt.casefold.is_some(),
        }
    }

    /// Both halves of `name`'s hash (0 for a version it cannot compute),
    /// in a casefolded directory of its folded bytes.
    pub(crate) fn full(&self, name: &[u8]) -> NameHash {
        let folded = match self.casefold && !faults::active(Fault::CasefoldHashRaw) {
            true => casefold::fold(name),
            false => None,
        };
        let name = folded.as_deref().unwrap_or(name);
        name_hash(self.version, &self.seed, name).unwrap_or(NameHash { major: 0, minor: 0 })
    }

    fn major(&self, name: &[u8]) -> u32 {
        self.full(name).major
    }
}

/// make_indexed_dir: new trees use the superblock's default version; one we
/// cannot use (SipHash, garbage) falls back to half_md4, mke2fs's default.
fn default_root_version(fmt: &Format) -> u8 {
    match fmt.def_hash_version {
        version @ 0..=2 => version,
        _ => hash_version::HALF_MD4,
    }
}

// ---------------------------------------------------------------------------
// Index blocks

const ROOT_INFO: usize = 24;
const ROOT_INFO_LEN: usize = 8;
const ROOT_INDIRECT_LEVELS: usize = ROOT_INFO + 6;
/// Index of a root, after its info.
const ROOT_ENTRIES: usize = ROOT_INFO + ROOT_INFO_LEN;
/// Index of an interior node, after its fake record header.
const NODE_ENTRIES: usize = 8;
const ENTRY_LEN: usize = 8;
const DX_TAIL_LEN: usize = 8;
/// dx_get_block: the top four bits of a block pointer are reserved.
const BLOCK_MASK: u32 = 0x0fff_ffff;

/// dx_root_limit.
pub(crate) fn root_limit(fmt: &Format) -> usize {
    let tail = if fmt.csum { DX_TAIL_LEN } else { 0 };
    (fmt.block_size - ROOT_ENTRIES - tail) / ENTRY_LEN
}

/// dx_node_limit.
pub(crate) fn node_limit(fmt: &Format) -> usize {
    let tail = if fmt.csum { DX_TAIL_LEN } else { 0 };
    (fmt.block_size - NODE_ENTRIES - tail) / ENTRY_LEN
}

fn dx_limit(block: &[u8], base: usize) -> usize {
    get_u16(block, base) as usize
}

fn dx_count(block: &[u8], base: usize) -> usize {
    get_u16(block, base + 2) as usize
}

fn set_dx_limit(block: &mut [u8], base: usize, limit: usize) {
    put_u16(block, base, limit as u16);
}

fn set_dx_count(block: &mut [u8], base: usize, count: usize) {
    put_u16(block, base + 2, count as u16);
}

/// Entry `index`'s hash; entry 0's slot holds limit and count instead.
fn entry_hash(block: &[u8], base: usize, index: usize) -> u32 {
    if index == 0 {
        0
    } else {
        get_u32(block, base + index * ENTRY_LEN)
    }
}

fn entry_block(block: &[u8], base: usize, index: usize) -> u64 {
    (get_u32(block, base + index * ENTRY_LEN + 4) & BLOCK_MASK) as u64
}

fn set_entry(block: &mut [u8], base: usize, index: usize, hash: u32, child: u64) {
    debug_assert!(index > 0 && child <= BLOCK_MASK as u64);
    put_u32(block, base + index * ENTRY_LEN, hash);
    put_u32(block, base + index * ENTRY_LEN + 4, child as u32);
}

/// ext4_dx_csum: header and the `count` entries in use, then the tail's
/// reserved word and a zero word standing for the checksum itself.
fn dx_checksum(fmt: &Format, block: &[u8], base: usize) -> u32 {
    let tail = base + dx_limit(block, base) * ENTRY_LEN;
    let covered = base + dx_count(block, base) * ENTRY_LEN;
    let crc = crc32c_raw(fmt.seed, &block[..covered]);
    let crc = crc32c_raw(crc, &block[tail..tail + 4]);
    crc32c_raw(crc, &[0; 4])
}

/// Verify a node's checksum; its limit and count were checked already.
fn verify_dx_csum(fmt: &Format, block: &[u8], base: usize, lblk: u64) -> Result<()> {
    if !fmt.csum {
        return Ok(());
    }
    let tail = base + dx_limit(block, base) * ENTRY_LEN;
    ensure_format!(
        tail + DX_TAIL_LEN <= fmt.block_size,
        fmt.location(lblk),
        "no room for the htree checksum tail"
    );
    let stored = get_u32(block, tail + 4);
    let computed = dx_checksum(fmt, block, base);
    ensure_format!(
        stored == computed,
        fmt.location(lblk),
        "htree index checksum {stored:#010x} != computed {computed:#010x}"
    );
    Ok(())
}

fn set_dx_csum(fmt: &Format, block: &mut [u8], base: usize) {
    if !fmt.csum {
        return;
    }
    let tail = base + dx_limit(block, base) * ENTRY_LEN;
    debug_assert!(tail + DX_TAIL_LEN <= fmt.block_size);
    let checksum = dx_checksum(fmt, block, base);
    put_u32(block, tail + 4, checksum);
}

/// Limit and count of an index: the limit is what this geometry gives (the
/// kernel refuses anything else), the count within 1..=limit.
fn check_count_limit(fmt: &Format, block: &[u8], base: usize, lblk: u64) -> Result<()> {
    let expected = if base == ROOT_ENTRIES {
        root_limit(fmt)
    } else {
        node_limit(fmt)
    };
    let (count, limit) = (dx_count(block, base), dx_limit(block, base));
    ensure_format!(
        limit == expected,
        fmt.location(lblk),
        "htree limit {limit} != {expected}"
    );
    ensure_format!(
        count >= 1 && count <= limit,
        fmt.location(lblk),
        "htree count {count} outside 1..={limit}"
    );
    Ok(())
}

/// The index hashes must be sorted for the binary search to mean anything.
fn check_sorted(fmt: &Format, block: &[u8], base: usize, lblk: u64) -> Result<()> {
    for index in 2..dx_count(block, base) {
        ensure_format!(
            entry_hash(block, base, index) >= entry_hash(block, base, index - 1),
            fmt.location(lblk),
            "htree index not sorted at entry {index}"
        );
    }
    Ok(())
}

#[derive(Debug, Clone, Copy)]
struct RootInfo {
    version: u8,
    /// Index levels, root included: 1 + indirect_levels.
    levels: usize,
}

/// dx_probe's and ext4_check_dx_root's checks of block 0.
fn decode_root(fmt: &Format, block: &[u8]) -> Result<RootInfo> {
    let location = fmt.location(0);
    let (dot, dotdot) = dot_records(fmt, block, true)?;
    ensure_format!(
        dot.rec_len == 12 && dotdot.rec_len == fmt.block_size - 12,
        location,
        "htree root \".\"/\"..\" records have rec_len {}/{}",
        dot.rec_len,
        dotdot.rec_len
    );
    let info = &block[ROOT_INFO..ROOT_INFO + ROOT_INFO_LEN];
    let (version, info_length, indirect, flags) = (info[4], info[5], info[6], info[7]);
    ensure_format!(
        get_u32(info, 0) == 0 && info_length as usize == ROOT_INFO_LEN,
        location,
        "bad dx_root_info (info_length {info_length})"
    );
    ensure_format!(
        version <= hash_version::TEA,
        location,
        "unsupported htree hash version {version}"
    );
    ensure_format!(flags & 1 == 0, location, "unknown htree flags {flags:#x}");
    ensure_format!(
        (indirect as usize) < fmt.max_levels,
        location,
        "htree has {indirect} indirect levels, at most {} allowed",
        fmt.max_levels - 1
    );
    check_count_limit(fmt, block, ROOT_ENTRIES, 0)?;
    Ok(RootInfo {
        version,
        levels: indirect as usize + 1,
    })
}

fn check_node(fmt: &Format, block: &[u8], lblk: u64) -> Result<()> {
    ensure_format!(
        get_u32(block, 0) == 0
            && rec_len_from_disk(get_u16(block, 4), fmt.block_size) == fmt.block_size,
        fmt.location(lblk),
        "htree node does not start with an empty whole-block record"
    );
    check_count_limit(fmt, block, NODE_ENTRIES, lblk)
}

/// Block 0 of an htree directory, checked; checksum and order verified once.
pub(crate) fn read_root(d: &mut dyn DirBlocks, fmt: &Format) -> Result<Arc<Buffer>> {
    let buffer = read_dir_block(d, fmt, 0)?;
    {
        let block = buffer.read();
        decode_root(fmt, &block)?;
        if !buffer.is_verified() {
            verify_dx_csum(fmt, &block, ROOT_ENTRIES, 0)?;
            check_sorted(fmt, &block, ROOT_ENTRIES, 0)?;
        }
    }
    buffer.set_verified();
    Ok(buffer)
}

fn read_node(d: &mut dyn DirBlocks, fmt: &Format, lblk: u64) -> Result<Arc<Buffer>> {
    let buffer = read_dir_block(d, fmt, lblk)?;
    {
        let block = buffer.read();
        check_node(fmt, &block, lblk)?;
        if !buffer.is_verified() {
            verify_dx_csum(fmt, &block, NODE_ENTRIES, lblk)?;
            check_sorted(fmt, &block, NODE_ENTRIES, lblk)?;
        }
    }
    buffer.set_verified();
    Ok(buffer)
}

/// is_dx_internal_node: an interior node reads as one free whole-block
/// record (so does an empty leaf without metadata_csum; both hold no names).
pub(crate) fn is_index_node(d: &mut dyn DirBlocks, fmt: &Format, lblk: u64) -> Result<bool> {
    let buffer = read_dir_block(d, fmt, lblk)?;
    let block = buffer.read();
    Ok(get_u32(&block, 0) == 0
        && rec_len_from_disk(get_u16(&block, 4), fmt.block_size) == fmt.block_size)
}

fn root_hasher(d: &mut dyn DirBlocks, fmt: &Format) -> Result<Hasher> {
    let root = read_root(d, fmt)?;
    let info = decode_root(fmt, &root.read())?;
    Ok(Hasher::new(fmt, info.version))
}

// ---------------------------------------------------------------------------
// Paths through the index

/// One index block on the path to a leaf, and the entry followed.
struct Frame {
    lblk: u64,
    buffer: Arc<Buffer>,
    base: usize,
    count: usize,
    limit: usize,
    at: usize,
}

impl Frame {
    fn is_full(&self) -> bool {
        self.count >= self.limit
    }
}

/// dx_frame[]: root first; `leaf` is what the last frame's entry names.
struct Path {
    frames: Vec<Frame>,
    leaf: u64,
}

/// The last entry whose hash is at most `hash` (entry 0 if none).
fn search(block: &[u8], base: usize, count: usize, hash: u32) -> usize {
    let (mut low, mut high) = (1, count);
    while low < high {
        let middle = low + (high - low) / 2;
        if entry_hash(block, base, middle) > hash {
            high = middle;
        } else {
            low = middle + 1;
        }
    }
    low - 1
}

/// A child pointer must be inside the directory, not the root, and not
/// already on the path (dx_probe's cycle check).
fn check_child(
    d: &dyn DirBlocks,
    fmt: &Format,
    parent: u64,
    child: u64,
    frames: &[Frame],
) -> Result<()> {
    ensure_format!(
        child != 0 && child < d.block_count() && frames.iter().all(|f| f.lblk != child),
        fmt.location(parent),
        "htree entry points at block {child} ({} blocks)",
        d.block_count()
    );
    Ok(())
}

fn frame_at(buffer: Arc<Buffer>, lblk: u64, base: usize, at: usize) -> (Frame, u64) {
    let (count, limit, child) = {
        let block = buffer.read();
        (
            dx_count(&block, base),
            dx_limit(&block, base),
            entry_block(&block, base, at),
        )
    };
    let frame = Frame {
        lblk,
        buffer,
        base,
        count,
        limit,
        at,
    };
    (frame, child)
}

/// dx_probe: the path to the leaf where `hash` belongs.
fn probe(d: &mut dyn DirBlocks, fmt: &Format, hash: u32) -> Result<Path> {
    let root = read_root(d, fmt)?;
    let info = decode_root(fmt, &root.read())?;
    let mut frames: Vec<Frame> = Vec::with_capacity(info.levels);
    let (mut buffer, mut lblk, mut base) = (root, 0, ROOT_ENTRIES);
    loop {
        let at = {
            let block = buffer.read();
            search(&block, base, dx_count(&block, base), hash)
        };
        let (frame, child) = frame_at(buffer, lblk, base, at);
        check_child(d, fmt, lblk, child, &frames)?;
        frames.push(frame);
        if frames.len() == info.levels {
            return Ok(Path {
                frames,
                leaf: child,
            });
        }
        buffer = read_node(d, fmt, child)?;
        (lblk, base) = (child, NODE_ENTRIES);
    }
}

/// ext4_htree_next_block: step the path to the next leaf in hash order.
/// With `want`, only if that leaf continues a run of hash `want`. Returns
/// the next leaf's index hash (continuation bit included), or `None` at the
/// end (or when the run does not continue).
fn next_leaf(
    d: &mut dyn DirBlocks,
    fmt: &Format,
    path: &mut Path,
    want: Option<u32>,
) -> Result<Option<u32>> {
    let mut level = path.frames.len() - 1;
    loop {
        let frame = &mut path.frames[level];
        if frame.at + 1 < frame.count {
            frame.at += 1;
            break;
        }
        if level == 0 {
            return Ok(None);
        }
        level -= 1;
    }
    let next_hash = {
        let frame = &path.frames[level];
        entry_hash(&frame.buffer.read(), frame.base, frame.at)
    };
    if want.is_some_and(|hash| next_hash & !1 != hash) {
        return Ok(None);
    }
    for below in level + 1..path.frames.len() {
        let parent = &path.frames[below - 1];
        let child = entry_block(&parent.buffer.read(), parent.base, parent.at);
        check_child(d, fmt, parent.lblk, child, &path.frames[..below])?;
        let buffer = read_node(d, fmt, child)?;
        path.frames[below] = frame_at(buffer, child, NODE_ENTRIES, 0).0;
    }
    let last = path.frames.last().expect("a path has a root");
    let leaf = entry_block(&last.buffer.read(), last.base, last.at);
    check_child(d, fmt, last.lblk, leaf, &path.frames)?;
    path.leaf = leaf;
    Ok(Some(next_hash))
}

// ---------------------------------------------------------------------------
// Lookup

/// ext4_dx_find_entry.
pub(crate) fn lookup(
    d: &mut dyn DirBlocks,
    fmt: &Format,
    name: &[u8],
) -> Result<Option<EntryLocation>> {
    let hash = root_hasher(d, fmt)?.major(name);
    let mut path = probe(d, fmt, hash)?;
    for _ in 0..d.block_count() {
        let buffer = read_leaf(d, fmt, path.leaf)?;
        if let Some(record) = find_name(fmt, &buffer.read(), path.leaf, name)? {
            return Ok(Some(EntryLocation {
                ino: record.ino,
                file_type: record.file_type,
                lblk: path.leaf,
                offset: record.offset,
            }));
        }
        if next_leaf(d, fmt, &mut path, Some(hash))?.is_none() {
            return Ok(None);
        }
    }
    Err(Error::corrupt(
        fmt.location(0),
        "htree hash run longer than the directory",
    ))
}

// ---------------------------------------------------------------------------
// Insert

/// ext4_dx_add_entry: into the leaf the hash selects; when it is full, make
/// room in the index on its path (split a node, or add a level), then split
/// the leaf. Index changes re-probe, like the kernel's `restart`.
pub(crate) fn add(
    d: &mut dyn DirBlocks,
    handle: &Handle<'_>,
    fmt: &Format,
    entry: &DirEntry,
) -> Result<()> {
    let hasher = root_hasher(d, fmt)?;
    let hash = hasher.major(&entry.name);
    // Each pass without a leaf split adds room to one index level, so a
    // tree of at most three levels needs at most four passes.
    for _ in 0..=fmt.max_levels + 1 {
        let path = probe(d, fmt, hash)?;
        let leaf = read_leaf(d, fmt, path.leaf)?;
        if try_insert(handle, fmt, &leaf, path.leaf, entry)? {
            return Ok(());
        }
        if make_room(d, handle, fmt, &path)? {
            return split_leaf(d, handle, fmt, &hasher, &path, &leaf, entry);
        }
    }
    Err(Error::corrupt(
        fmt.location(0),
        "htree insert found no room after splitting every level",
    ))
}

/// The blocks `add` would append for `name` (space budget): none when its
/// leaf has room; else the leaf's split and one block per full index node
/// from the deepest up (each is split once, or the root adds a level,
/// whose new node has room).
pub(crate) fn add_new_blocks(d: &mut dyn DirBlocks, fmt: &Format, name: &[u8]) -> Result<u32> {
    let hasher = root_hasher(d, fmt)?;
    let path = probe(d, fmt, hasher.major(name))?;
    let leaf = read_leaf(d, fmt, path.leaf)?;
    if find_slot(fmt, &leaf.read(), path.leaf, name)?.is_some() {
        return Ok(0);
    }
    let full = path.frames.iter().rev().take_while(|frame| frame.is_full());
    Ok(1 + full.count() as u32)
}

fn try_insert(
    handle: &Handle<'_>,
    fmt: &Format,
    leaf: &Arc<Buffer>,
    lblk: u64,
    entry: &DirEntry,
) -> Result<bool> {
    let slot = find_slot(fmt, &leaf.read(), lblk, &entry.name)?;
    let Some(slot) = slot else {
        return Ok(false);
    };
    modify_leaf(handle, fmt, leaf, |block| {
        insert_record(fmt, block, slot, entry);
        Ok(())
    })?;
    Ok(true)
}

/// True when the deepest index block has room for one more leaf. Otherwise
/// split the highest full block whose parent has room, or add a level when
/// every block on the path is full, and return false to re-probe.
fn make_room(
    d: &mut dyn DirBlocks,
    handle: &Handle<'_>,
    fmt: &Format,
    path: &Path,
) -> Result<bool> {
    let deepest = path.frames.len() - 1;
    if !path.frames[deepest].is_full() {
        return Ok(true);
    }
    let mut level = deepest;
    while level > 0 && path.frames[level - 1].is_full() {
        level -= 1;
    }
    if level > 0 {
        split_node(d, handle, fmt, &path.frames[level - 1], &path.frames[level])?;
        return Ok(false);
    }
    if path.frames.len() >= fmt.max_levels {
        // The kernel's "Directory index full": ENOSPC.
        return Err(Error::NoSpace);
    }
    add_level(d, handle, fmt, &path.frames[0])?;
    Ok(false)
}

/// A new block for an indexed directory (leaf or node): index entries hold
/// 28-bit block numbers, so the directory cannot grow past that.
fn append_indexed_block(d: &mut dyn DirBlocks, handle: &Handle<'_>) -> Result<(u64, Arc<Buffer>)> {
    if d.block_count() > BLOCK_MASK as u64 {
        return Err(Error::NoSpace);
    }
    let (lblk, buffer) = d.append_block(handle)?;
    debug_assert_eq!(lblk + 1, d.block_count());
    Ok((lblk, buffer))
}

/// Start an interior node: the fake empty record spanning the block.
fn init_node(fmt: &Format, block: &mut [u8]) {
    block.fill(0);
    put_u16(block, 4, rec_len_to_disk(fmt.block_size, fmt.block_size));
    set_dx_limit(block, NODE_ENTRIES, node_limit(fmt));
}

/// dx_insert_block: add (hash, child) right after the entry the frame followed.
fn insert_index_entry(
    handle: &Handle<'_>,
    fmt: &Format,
    frame: &Frame,
    hash: u32,
    child: u64,
) -> Result<()> {
    {
        let mut block = handle.get_write_access(&frame.buffer)?;
        let (base, count) = (frame.base, dx_count(&block, frame.base));
        ensure_format!(
            count < dx_limit(&block, base) && frame.at < count,
            fmt.location(frame.lblk),
            "htree index changed under an insert"
        );
        let from = base + (frame.at + 1) * ENTRY_LEN;
        block.copy_within(from..base + count * ENTRY_LEN, from + ENTRY_LEN);
        set_entry(&mut block, base, frame.at + 1, hash, child);
        set_dx_count(&mut block, base, count + 1);
        set_dx_csum(fmt, &mut block, base);
    }
    frame.buffer.set_verified();
    Ok(())
}

/// Split a full interior node in two halves by count; the parent, which has
/// room, gets the upper half's first hash.
fn split_node(
    d: &mut dyn DirBlocks,
    handle: &Handle<'_>,
    fmt: &Format,
    parent: &Frame,
    node: &Frame,
) -> Result<()> {
    let (count, keep) = (node.count, node.count / 2);
    debug_assert!(keep >= 1 && count > keep);
    let (moved, split_hash) = {
        let block = node.buffer.read();
        let range = node.base + keep * ENTRY_LEN..node.base + count * ENTRY_LEN;
        (block[range].to_vec(), entry_hash(&block, node.base, keep))
    };
    let (lblk, buffer) = append_indexed_block(d, handle)?;
    {
        let mut block = handle.get_write_access(&buffer)?;
        init_node(fmt, &mut block);
        // The first moved entry's hash slot becomes limit/count: its hash
        // lives on in the parent.
        block[NODE_ENTRIES + 4..NODE_ENTRIES + moved.len()].copy_from_slice(&moved[4..]);
        set_dx_count(&mut block, NODE_ENTRIES, count - keep);
        set_dx_csum(fmt, &mut block, NODE_ENTRIES);
    }
    buffer.set_verified();
    {
        let mut block = handle.get_write_access(&node.buffer)?;
        set_dx_count(&mut block, node.base, keep);
        set_dx_csum(fmt, &mut block, node.base);
    }
    node.buffer.set_verified();
    insert_index_entry(handle, fmt, parent, split_hash, lblk)
}

/// Grow the tree by one level: the root's entries move to a new node, and
/// the root keeps a single entry pointing at it.
fn add_level(d: &mut dyn DirBlocks, handle: &Handle<'_>, fmt: &Format, root: &Frame) -> Result<()> {
    debug_assert_eq!((root.lblk, root.base), (0, ROOT_ENTRIES));
    let moved = {
        let block = root.buffer.read();
        block[ROOT_ENTRIES..ROOT_ENTRIES + root.count * ENTRY_LEN].to_vec()
    };
    let (lblk, buffer) = append_indexed_block(d, handle)?;
    {
        let mut block = handle.get_write_access(&buffer)?;
        init_node(fmt, &mut block);
        block[NODE_ENTRIES + 2..NODE_ENTRIES + moved.len()].copy_from_slice(&moved[2..]);
        debug_assert_eq!(dx_count(&block, NODE_ENTRIES), root.count);
        set_dx_csum(fmt, &mut block, NODE_ENTRIES);
    }
    buffer.set_verified();
    {
        let mut block = handle.get_write_access(&root.buffer)?;
        set_dx_count(&mut block, ROOT_ENTRIES, 1);
        put_u32(&mut block, ROOT_ENTRIES + 4, lblk as u32);
        block[ROOT_INDIRECT_LEVELS] += 1;
        set_dx_csum(fmt, &mut block, ROOT_ENTRIES);
    }
    root.buffer.set_verified();
    Ok(())
}

/// Where to cut a hash-sorted leaf: move entries from the top while the
/// moved part stays within half the names' bytes (do_split), keeping at
/// least one entry on each side.
fn split_point(sorted: &[(u32, DirEntry)]) -> usize {
    let sizes: Vec<usize> = sorted
        .iter()
        .map(|(_, e)| record_len(e.name.len()))
        .collect();
    let total: usize = sizes.iter().sum();
    let mut moved = 0;
    let mut split = sorted.len();
    while split > 0 && moved + sizes[split - 1] / 2 <= total / 2 {
        moved += sizes[split - 1];
        split -= 1;
    }
    split.clamp(1, sorted.len() - 1)
}

/// do_split: sort the full leaf's names by hash, move the upper part to a
/// new block, index it (with the continuation bit when the cut falls inside
/// a run of equal hashes), and insert `entry` on its side.
fn split_leaf(
    d: &mut dyn DirBlocks,
    handle: &Handle<'_>,
    fmt: &Format,
    hasher: &Hasher,
    path: &Path,
    leaf: &Arc<Buffer>,
    entry: &DirEntry,
) -> Result<()> {
    let mut sorted = Vec::new();
    {
        let block = leaf.read();
        for record in Records::leaf(fmt, &block, path.leaf) {
            let record = record?;
            if record.is_live() {
                sorted.push((hasher.major(record.name(&block)), record.to_entry(&block)));
            }
        }
    }
    ensure_format!(
        sorted.len() >= 2,
        fmt.location(path.leaf),
        "full htree leaf with {} names",
        sorted.len()
    );
    sorted.sort_by_key(|(hash, _)| *hash);
    let split = split_point(&sorted);
    let split_hash = sorted[split].0;
    let continued = sorted[split - 1].0 == split_hash;
    let (new_lblk, new_leaf) = append_indexed_block(d, handle)?;
    let (low, high) = sorted.split_at(split);
    rewrite_leaf(handle, fmt, &new_leaf, new_lblk, high)?;
    rewrite_leaf(handle, fmt, leaf, path.leaf, low)?;
    let frame = path.frames.last().expect("a path has a root");
    insert_index_entry(handle, fmt, frame, split_hash | continued as u32, new_lblk)?;
    let (target, target_lblk) = if hasher.major(&entry.name) >= split_hash {
        (&new_leaf, new_lblk)
    } else {
        (leaf, path.leaf)
    };
    ensure_format!(
        try_insert(handle, fmt, target, target_lblk, entry)?,
        fmt.location(target_lblk),
        "no room for a name in a freshly split htree leaf"
    );
    Ok(())
}

fn rewrite_leaf(
    handle: &Handle<'_>,
    fmt: &Format,
    leaf: &Arc<Buffer>,
    lblk: u64,
    entries: &[(u32, DirEntry)],
) -> Result<()> {
    let entries: Vec<&DirEntry> = entries.iter().map(|(_, e)| e).collect();
    modify_leaf(handle, fmt, leaf, |block| {
        ensure_format!(
            write_packed_leaf(fmt, block, &entries),
            fmt.location(lblk),
            "names of one leaf do not fit a leaf"
        );
        Ok(())
    })
}

/// The blocks `make_indexed` appends to add `name` (space budget): the
/// leaf the names move to, and a second when the packed names leave no
/// room for the new one there (the leaf then splits).
pub(crate) fn make_indexed_new_blocks(fmt: &Format, block0: &[u8], name: &[u8]) -> Result<u32> {
    let (_, dotdot) = dot_records(fmt, block0, false)?;
    let start = dotdot.offset + dotdot.rec_len;
    let mut bytes = record_len(name.len());
    for record in Records::range(fmt, block0, start, fmt.leaf_space(), 0) {
        let record = record?;
        if record.is_live() {
            bytes += record_len(record.name(block0).len());
        }
    }
    Ok(if bytes <= fmt.leaf_space() { 1 } else { 2 })
}

/// make_indexed_dir: block 0 of a full single-block directory becomes the
/// root, its names move to a new leaf (block 1), then `entry` is added the
/// indexed way (which splits that leaf if it is still too full).
pub(crate) fn make_indexed(
    d: &mut dyn DirBlocks,
    handle: &Handle<'_>,
    fmt: &Format,
    block0: Arc<Buffer>,
    entry: &DirEntry,
) -> Result<()> {
    debug_assert!(d.block_count() == 1 && !d.is_indexed());
    let (dot, dotdot, names) = {
        let block = block0.read();
        let (dot, dotdot) = dot_records(fmt, &block, false)?;
        let mut names = Vec::new();
        let start = dotdot.offset + dotdot.rec_len;
        for record in Records::range(fmt, &block, start, fmt.leaf_space(), 0) {
            let record = record?;
            if record.is_live() {
                names.push(record.to_entry(&block));
            }
        }
        (dot.to_entry(&block), dotdot.to_entry(&block), names)
    };
    let (lblk, leaf) = d.append_block(handle)?;
    debug_assert_eq!(lblk, 1);
    let names: Vec<&DirEntry> = names.iter().collect();
    modify_leaf(handle, fmt, &leaf, |block| {
        let fitted = write_packed_leaf(fmt, block, &names);
        debug_assert!(fitted, "names of one block fit one block");
        Ok(())
    })?;
    {
        let mut block = handle.get_write_access(&block0)?;
        write_root(
            fmt,
            &mut block,
            &dot,
            &dotdot,
            default_root_version(fmt),
            lblk,
        );
    }
    block0.set_verified();
    d.set_indexed(true);
    add(d, handle, fmt, entry)
}

fn write_root(
    fmt: &Format,
    block: &mut [u8],
    dot: &DirEntry,
    dotdot: &DirEntry,
    version: u8,
    leaf: u64,
) {
    block.fill(0);
    write_record(fmt, block, 0, 12, dot);
    write_record(fmt, block, 12, fmt.block_size - 12, dotdot);
    block[ROOT_INFO + 4] = version;
    block[ROOT_INFO + 5] = ROOT_INFO_LEN as u8;
    set_dx_limit(block, ROOT_ENTRIES, root_limit(fmt));
    set_dx_count(block, ROOT_ENTRIES, 1);
    put_u32(block, ROOT_ENTRIES + 4, leaf as u32);
    set_dx_csum(fmt, block, ROOT_ENTRIES);
}

/// Point the root's ".." at `parent` (the record was located by the caller).
pub(crate) fn set_root_parent(
    handle: &Handle<'_>,
    fmt: &Format,
    root: &Arc<Buffer>,
    offset: usize,
    parent: u32,
) -> Result<()> {
    {
        let mut block = handle.get_write_access(root)?;
        put_u32(&mut block, offset, parent);
        set_dx_csum(fmt, &mut block, ROOT_ENTRIES);
    }
    root.set_verified();
    Ok(())
}

// ---------------------------------------------------------------------------
// Readdir in hash order
//
// Cookies: 0 is the start, 1 resumes at "..", and c >= 2 resumes at the
// first entry whose position is >= c - 2, so an entry's next cookie is its
// position + 3. A position is
//
//   bits 61..31  major hash >> 1 (the order of the index)
//   bits 30..8   top 23 bits of a secondary hash (CRC32C of the name)
//   bits  7..0   rank among entries equal in the bits above, sorted by
//                secondary hash then name
//
// It depends only on the name, so splits, which move names between leaves
// but never out of hash order, cannot make a listing repeat or skip a name
// that stayed. Only names that also agree in 54 hash bits share a group and
// rank; a name added into such a group can shift the others by one rank.
// Positions stay below 2^62, so cookies fit the i64 offsets of FUSE.

const POSITION_END: u64 = 1 << 62;
const COOKIE_DOTDOT: u64 = 1;
const COOKIE_ENTRIES: u64 = 2;
/// Cookies from here on are byte positions in block order (block ×
/// block size + offset), for a listing that started on a directory whose
/// index is damaged: such a listing reads its leaves in order, as the
/// kernel's linear readdir does, instead of sorting every name again at
/// each call. Below 2^63 whatever the directory's size (i_size < 2^32
/// blocks of at most 64 KiB).
const COOKIE_LEAVES: u64 = POSITION_END + 4;

struct Listed {
    major: u32,
    secondary: u32,
    entry: DirEntry,
}

impl Listed {
    fn new(hasher: &Hasher, entry: DirEntry) -> Self {
        Listed {
            major: hasher.major(&entry.name),
            secondary: crc32c_raw(!0, &entry.name),
            entry,
        }
    }
}

/// Hash-order readdir for htree directories and single-block directories
/// on dir_index filesystems (see `dir::read_entries`).
pub(crate) fn read_entries(
    d: &mut dyn DirBlocks,
    fmt: &Format,
    cookie: u64,
    emit: &mut dyn FnMut(&DirEntry, u64) -> bool,
) -> Result<()> {
    let indexed = dir::uses_htree(d, fmt);
    let block0 = dir::read_block0(d, fmt)?;
    let (dot, dotdot, rest) = {
        let block = block0.read();
        let (dot, dotdot) = dot_records(fmt, &block, indexed)?;
        let rest = dotdot.offset + dotdot.rec_len;
        (dot.to_entry(&block), dotdot.to_entry(&block), rest)
    };
    if cookie == 0 && !emit(&dot, COOKIE_DOTDOT) {
        return Ok(());
    }
    if cookie <= COOKIE_DOTDOT && !emit(&dotdot, COOKIE_ENTRIES) {
        return Ok(());
    }
    if cookie >= COOKIE_LEAVES {
        return read_leaves_in_order(d, fmt, cookie - COOKIE_LEAVES, emit);
    }
    let target = cookie.max(COOKIE_ENTRIES) - COOKIE_ENTRIES;
    if target >= POSITION_END {
        return Ok(());
    }
    if indexed {
        return read_indexed_or_leaves(d, fmt, target, emit);
    }
    let hasher = Hasher::new(fmt, default_root_version(fmt));
    let mut bad = Vec::new();
    let listed: Vec<Listed> = {
        let block = block0.read();
        dir::listed_records(fmt, &block, rest, fmt.leaf_space(), 0, &mut bad)
            .into_iter()
            .map(|record| Listed::new(&hasher, record.to_entry(&block)))
            .collect()
    };
    for bad in bad {
        d.note_bad_entry(bad);
    }
    emit_in_order(listed, target, emit);
    Ok(())
}

/// Hash-order readdir of a directory whose names come whole, an inline
/// directory's (`format::inline`): "." and ".." first, then the names with
/// the positions `read_entries` gives a single-block directory.
pub(crate) fn read_given_entries(
    fmt: &Format,
    dot: &DirEntry,
    dotdot: &DirEntry,
    entries: Vec<DirEntry>,
    cookie: u64,
    emit: &mut dyn FnMut(&DirEntry, u64) -> bool,
) {
    if cookie == 0 && !emit(dot, COOKIE_DOTDOT) {
        return;
    }
    if cookie <= COOKIE_DOTDOT && !emit(dotdot, COOKIE_ENTRIES) {
        return;
    }
    let target = cookie.max(COOKIE_ENTRIES) - COOKIE_ENTRIES;
    if target >= POSITION_END {
        return;
    }
    let hasher = Hasher::new(fmt, default_root_version(fmt));
    let listed = entries
        .into_iter()
        .map(|entry| Listed::new(&hasher, entry))
        .collect();
    emit_in_order(listed, target, emit);
}

/// The entries of leaf `lblk` for a listing, with their hashes (see
/// `dir::listed_leaf`: what is bad is left out and reported).
fn listed_leaf(
    d: &mut dyn DirBlocks,
    fmt: &Format,
    hasher: &Hasher,
    lblk: u64,
) -> Result<Vec<Listed>> {
    Ok(dir::listed_leaf(d, fmt, lblk, 0)?
        .into_iter()
        .map(|(entry, _)| Listed::new(hasher, entry))
        .collect())
}

/// List an htree directory from `target` in hash order through its index
/// when it is sound. A listing that starts checks the whole index first
/// (the walk reads every leaf anyway): an index that passes each node's
/// own checks can still send two entries to one leaf and none to another,
/// and a walk through it would list names twice and lose others without
/// an error. On a damaged index (ext4_readdir's fallback after
/// ERR_BAD_DX_DIR) a listing that starts reads the leaves in block order
/// (`COOKIE_LEAVES`); one that meets the damage half way reads every leaf
/// and goes on in hash order from where it was.
fn read_indexed_or_leaves(
    d: &mut dyn DirBlocks,
    fmt: &Format,
    target: u64,
    emit: &mut dyn FnMut(&DirEntry, u64) -> bool,
) -> Result<()> {
    if target == 0 && !d.index_damaged() {
        match check(d, fmt) {
            Err(error) if error.is_corruption() => d.note_index_damaged(&error),
            checked => {
                checked?;
            }
        }
    }
    let mut resume = target;
    if !d.index_damaged() {
        let walked = read_indexed(d, fmt, target, &mut |entry, next| {
            resume = next - COOKIE_ENTRIES;
            emit(entry, next)
        });
        match walked {
            Err(error) if error.is_corruption() => d.note_index_damaged(&error),
            walked => return walked,
        }
    }
    if resume == 0 {
        return read_leaves_in_order(d, fmt, 0, emit);
    }
    let hasher = Hasher::new(fmt, root_version_or_default(d, fmt));
    let mut listed = Vec::new();
    for lblk in leaf_blocks(d, fmt)? {
        listed.extend(listed_leaf(d, fmt, &hasher, lblk)?);
    }
    emit_in_order(listed, resume, emit);
    Ok(())
}

/// The leaves of a directory with a damaged index in block order from
/// byte `position` (block × block size + offset), with `COOKIE_LEAVES`
/// cookies; records never move while the index is damaged (no name is
/// added through it), so positions stay valid.
fn read_leaves_in_order(
    d: &mut dyn DirBlocks,
    fmt: &Format,
    position: u64,
    emit: &mut dyn FnMut(&DirEntry, u64) -> bool,
) -> Result<()> {
    let block_size = fmt.block_size as u64;
    let (first, start) = (position / block_size, (position % block_size) as usize);
    for lblk in leaf_blocks(d, fmt)? {
        if lblk < first {
            continue;
        }
        let from = if lblk == first { start } else { 0 };
        for (entry, end) in dir::listed_leaf(d, fmt, lblk, from)? {
            if !emit(&entry, COOKIE_LEAVES + lblk * block_size + end as u64) {
                return Ok(());
            }
        }
    }
    Ok(())
}

/// The hasher of the kernel's hash-order listing (ext4_htree_fill_tree:
/// the root's version in an indexed directory, the superblock's default
/// in a one-block one).
pub(crate) fn listing_hasher(d: &mut dyn DirBlocks, fmt: &Format) -> Hasher {
    let version = match dir::uses_htree(d, fmt) {
        true => root_version_or_default(d, fmt),
        false => default_root_version(fmt),
    };
    Hasher::new(fmt, version)
}

/// The hash version the root names, or the filesystem's default when the
/// root itself does not decode (the names are still listed in some order).
fn root_version_or_default(d: &mut dyn DirBlocks, fmt: &Format) -> u8 {
    read_dir_block(d, fmt, 0)
        .ok()
        .and_then(|root| decode_root(fmt, &root.read()).ok())
        .map_or_else(|| default_root_version(fmt), |info| info.version)
}

/// Where the names of a directory with a damaged index lie: each leaf
/// with the lowest and highest hash of the names it holds. Leaves of an
/// htree hold disjoint hash ranges, so a lookup reads one or two of them
/// instead of every leaf; a leaf that could not be read whole is given
/// every hash, so that a lookup still reads it (and meets its error).
#[derive(Debug, Default)]
pub struct LeafRanges {
    leaves: Vec<(u64, u32, u32)>,
}

impl LeafRanges {
    pub fn len(&self) -> usize {
        self.leaves.len()
    }

    pub fn is_empty(&self) -> bool {
        self.leaves.is_empty()
    }
}

/// Read every leaf once for `LeafRanges`.
fn leaf_ranges(d: &mut dyn DirBlocks, fmt: &Format, hasher: &Hasher) -> Result<LeafRanges> {
    let mut ranges = LeafRanges::default();
    for lblk in leaf_blocks(d, fmt)? {
        let range = read_leaf(d, fmt, lblk).ok().and_then(|buffer| {
            let block = buffer.read();
            let mut range: Option<(u32, u32)> = None;
            for record in Records::leaf(fmt, &block, lblk) {
                let record = record.ok()?;
                if record.is_live() {
                    let hash = hasher.major(record.name(&block));
                    range = Some(
                        range.map_or((hash, hash), |(low, high)| (low.min(hash), high.max(hash))),
                    );
                }
            }
            Some(range)
        });
        match range {
            Some(Some((low, high))) => ranges.leaves.push((lblk, low, high)),
            Some(None) => {} // no names
            None => ranges.leaves.push((lblk, 0, u32::MAX)),
        }
    }
    Ok(ranges)
}

/// ext4_find_entry's linear search of a directory whose index is damaged,
/// read only where the name's hash can lie (`LeafRanges`, built once per
/// directory and mount).
pub(crate) fn find_in_leaves(
    d: &mut dyn DirBlocks,
    fmt: &Format,
    name: &[u8],
) -> Result<Option<EntryLocation>> {
    let hasher = Hasher::new(fmt, root_version_or_default(d, fmt));
    let ranges = match d.leaf_ranges() {
        Some(ranges) => ranges,
        None => {
            let ranges = Arc::new(leaf_ranges(d, fmt, &hasher)?);
            d.keep_leaf_ranges(Arc::clone(&ranges));
            ranges
        }
    };
    let hash = hasher.major(name);
    for &(lblk, low, high) in &ranges.leaves {
        if hash < low || hash > high {
            continue;
        }
        let buffer = read_leaf(d, fmt, lblk)?;
        if let Some(record) = find_name(fmt, &buffer.read(), lblk, name)? {
            return Ok(Some(EntryLocation {
                ino: record.ino,
                file_type: record.file_type,
                lblk,
                offset: record.offset,
            }));
        }
    }
    Ok(None)
}

/// The blocks of an htree directory that may hold names: all but the root
/// and the interior index nodes, in block order (the linear view of
/// ext4_readdir and ext4_find_entry when the index cannot be trusted).
pub(crate) fn leaf_blocks(d: &mut dyn DirBlocks, fmt: &Format) -> Result<Vec<u64>> {
    let mut leaves = Vec::new();
    for lblk in 1..d.block_count() {
        if !is_index_node(d, fmt, lblk)? {
            leaves.push(lblk);
        }
    }
    Ok(leaves)
}

/// Walk the leaves from the one holding `target`'s hash. Leaves joined by
/// continuation bits are listed together, since their names share hashes.
fn read_indexed(
    d: &mut dyn DirBlocks,
    fmt: &Format,
    target: u64,
    emit: &mut dyn FnMut(&DirEntry, u64) -> bool,
) -> Result<()> {
    let hasher = root_hasher(d, fmt)?;
    let mut path = probe(d, fmt, ((target >> 31) as u32) << 1)?;
    let mut leaves_left = d.block_count();
    loop {
        let mut listed = Vec::new();
        let more = loop {
            ensure_format!(
                leaves_left > 0,
                fmt.location(0),
                "htree walk longer than the directory"
            );
            leaves_left -= 1;
            listed.extend(listed_leaf(d, fmt, &hasher, path.leaf)?);
            match next_leaf(d, fmt, &mut path, None)? {
                None => break false,
                Some(hash) if hash & 1 == 1 => continue,
                Some(_) => break true,
            }
        };
        if !emit_in_order(listed, target, emit) || !more {
            return Ok(());
        }
    }
}

/// Sort, rank and emit the entries at or after `target`; false when `emit`
/// refused one.
fn emit_in_order(
    mut listed: Vec<Listed>,
    target: u64,
    emit: &mut dyn FnMut(&DirEntry, u64) -> bool,
) -> bool {
    listed.sort_unstable_by(|a, b| {
        (a.major, a.secondary, &a.entry.name).cmp(&(b.major, b.secondary, &b.entry.name))
    });
    let mut previous_group = None;
    let mut rank = 0u64;
    for item in &listed {
        let group = ((item.major >> 1) as u64) << 23 | (item.secondary >> 9) as u64;
        if previous_group == Some(group) {
            rank = (rank + 1).min(255);
        } else {
            (previous_group, rank) = (Some(group), 0);
        }
        let position = group << 8 | rank;
        debug_assert!(position < POSITION_END);
        if position >= target && !emit(&item.entry, position + COOKIE_ENTRIES + 1) {
            return false;
        }
    }
    true
}

// ---------------------------------------------------------------------------
// Whole-tree check

struct Pending {
    lblk: u64,
    /// Index levels above this block.
    depth: usize,
    low: u32,
    high: Option<u32>,
}

/// Walk every index block and leaf: limits, counts, order, checksums
/// (recomputed), each leaf's names inside its hash range, uniform depth,
/// every block referenced exactly once.
pub(crate) fn check(d: &mut dyn DirBlocks, fmt: &Format) -> Result<DirStats> {
    let blocks = d.block_count();
    let root = read_dir_block(d, fmt, 0)?;
    let info = {
        let block = root.read();
        let info = decode_root(fmt, &block)?;
        verify_dx_csum(fmt, &block, ROOT_ENTRIES, 0)?;
        info
    };
    let hasher = Hasher::new(fmt, info.version);
    let mut stats = DirStats {
        blocks,
        entries: 2,
        index_blocks: 1,
        leaves: 0,
        levels: info.levels as u32,
    };
    // A set, not a bitmap of i_size: a corrupt size must not cost memory.
    let mut referenced = HashSet::from([0u64]);
    let mut pending = Vec::new();
    let first = Pending {
        lblk: 0,
        depth: 0,
        low: 0,
        high: None,
    };
    queue_children(
        fmt,
        &root.read(),
        &first,
        blocks,
        &mut referenced,
        &mut pending,
    )?;
    while let Some(item) = pending.pop() {
        let buffer = read_dir_block(d, fmt, item.lblk)?;
        let block = buffer.read();
        if item.depth == info.levels {
            stats.entries += check_leaf(fmt, &hasher, &block, &item)?;
            stats.leaves += 1;
        } else {
            check_node(fmt, &block, item.lblk)?;
            verify_dx_csum(fmt, &block, NODE_ENTRIES, item.lblk)?;
            queue_children(fmt, &block, &item, blocks, &mut referenced, &mut pending)?;
            stats.index_blocks += 1;
        }
    }
    let unreferenced = blocks - referenced.len() as u64;
    ensure_format!(
        unreferenced == 0,
        fmt.location(0),
        "{unreferenced} directory blocks are not in the htree"
    );
    Ok(stats)
}

fn queue_children(
    fmt: &Format,
    block: &[u8],
    node: &Pending,
    blocks: u64,
    referenced: &mut HashSet<u64>,
    pending: &mut Vec<Pending>,
) -> Result<()> {
    let base = if node.lblk == 0 {
        ROOT_ENTRIES
    } else {
        NODE_ENTRIES
    };
    let location = fmt.location(node.lblk);
    let count = dx_count(block, base);
    for index in 0..count {
        let child = entry_block(block, base, index);
        ensure_format!(
            child < blocks && referenced.insert(child),
            location,
            "htree entry {index} points at block {child}: outside or referenced twice"
        );
        let hash = entry_hash(block, base, index);
        let low = if index == 0 { node.low } else { hash };
        ensure_format!(
            index == 0
                || (hash >= entry_hash(block, base, index - 1)
                    && hash & !1 >= node.low & !1
                    && node.high.is_none_or(|high| hash & !1 <= high & !1)),
            location,
            "htree hash {hash:#x} of entry {index} out of order or out of range"
        );
        let high = if index + 1 < count {
            Some(entry_hash(block, base, index + 1))
        } else {
            node.high
        };
        pending.push(Pending {
            lblk: child,
            depth: node.depth + 1,
            low,
            high,
        });
    }
    Ok(())
}

/// Names in a leaf hash within [low, high), or to high itself when the next
/// leaf continues that hash. Returns the number of names.
fn check_leaf(fmt: &Format, hasher: &Hasher, block: &[u8], leaf: &Pending) -> Result<u64> {
    verify_leaf_csum(fmt, block, leaf.lblk)?;
    let mut names = 0;
    for record in Records::leaf(fmt, block, leaf.lblk) {
        let record = record?;
        if !record.is_live() {
            continue;
        }
        let hash = hasher.major(record.name(block));
        let above_low = hash >= leaf.low & !1;
        let below_high = leaf
            .high
            .is_none_or(|high| hash < high & !1 || (hash == high & !1 && high & 1 == 1));
        ensure_format!(
            above_low && below_high,
            fmt.location(leaf.lblk),
            "name with hash {hash:#x} outside the leaf's range {:#x}..{:?}",
            leaf.low,
            leaf.high
        );
        names += 1;
    }
    Ok(names)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn name_words_pad_with_length_pattern() {
        let mut out = [0u32; 4];
        name_to_words(b"abcde", false, &mut out);
        let pad = 0x0505_0505;
        assert_eq!(out[0], 0x6162_6364);
        assert_eq!(out[1], (pad << 8) + 0x65);
        assert_eq!(&out[2..], &[pad, pad]);
    }

    #[test]
    fn signedness_matters_only_for_high_bytes() {
        let seed = [1, 2, 3, 4];
        for version in 0..3u8 {
            let ascii = name_hash(version, &seed, b"plain-ascii").unwrap();
            assert_eq!(
                ascii,
                name_hash(version + 3, &seed, b"plain-ascii").unwrap()
            );
            let high = name_hash(version, &seed, "café".as_bytes()).unwrap();
            assert_ne!(
                high,
                name_hash(version + 3, &seed, "café".as_bytes()).unwrap()
            );
            assert_eq!(high.major & 1, 0);
        }
        assert!(name_hash(hash_version::SIPHASH, &seed, b"x").is_none());
    }

    #[test]
    fn search_finds_last_entry_not_above_hash() {
        // count 4: entries 1..3 hash 10, 20, 20|1.
        let mut block = vec![0u8; 64];
        set_dx_count(&mut block, 0, 4);
        for (index, hash) in [(1, 10), (2, 20), (3, 21)] {
            put_u32(&mut block, index * 8, hash);
        }
        assert_eq!(search(&block, 0, 4, 5), 0);
        assert_eq!(search(&block, 0, 4, 10), 1);
        assert_eq!(search(&block, 0, 4, 20), 2);
        assert_eq!(search(&block, 0, 4, 22), 3);
    }
}
