//! Extended attributes: in the inode body and in one xattr block.
//!
//! Two places hold an inode's attributes (fs/ext4/xattr.h):
//! - the *inode body*: after `i_extra_isize`, a 4-byte magic 0xEA020000,
//!   then entries; value offsets count from the first entry. Entries keep the
//!   order they were added in and carry hash 0 (the kernel hashes only block
//!   entries).
//! - the *xattr block* named by `i_file_acl`: a 32-byte header (magic,
//!   refcount, h_blocks = 1, h_hash, h_checksum), then entries sorted by
//!   (name index, name length, name bytes) — the kernel looks block entries
//!   up with an early-stopping sorted search, so the order is part of the
//!   format. Value offsets count from the block start.
//!
//! In both, an entry is 16 bytes {name_len, name_index, value_offs,
//! value_inum, value_size, hash} and the name suffix, padded to 4 bytes; the
//! list ends with 4 zero bytes, and values (padded to 4 bytes) are packed
//! down from the end of the area.
//!
//! Setting an attribute mirrors `ext4_xattr_set_handle`: try the inode body
//! first; if the result does not fit, put the attribute in the block instead
//! (allocated on demand near the inode's group) and drop it from the body; an
//! attribute found in the other place is removed from there. A block that
//! becomes empty is released. A block whose h_refcount is above 1 is shared
//! with other inodes (the kernel's mbcache shares identical blocks): it is
//! never changed in place — this inode drops its reference and gets a
//! private copy. We never share blocks ourselves.
//!
//! Our layout differs from the kernel's in one harmless way: we re-encode a
//! whole area on every change (values packed in entry order) instead of
//! moving bytes around in place. Readers locate everything through offsets.
//!
//! Hashes: the entry hash mixes the name bytes (as unsigned chars, like
//! kernels since 6.2; e2fsck 1.47 also accepts the signed-char variant older
//! x86 kernels wrote) and the padded value as little-endian words; the block
//! hash mixes the entry hashes. Neither is checked on read, as the kernel
//! does not check them either (they only steer block sharing); every block we
//! write gets fresh ones.
//!
//! Values kept in EA inodes (ea_inode feature, `e_value_inum != 0`): a
//! value whose padded size is above `min_large_ea_size`, or one that fits
//! neither place, goes to an EA inode of its own, as
//! `ext4_xattr_set_handle` decides; its entry (no value bytes) carries the
//! hash of the EA inode's hash. The filesystem layer makes EA inodes and
//! counts their references (`BlockAllocator::ea_inode_for`,
//! `change_ea_inode_refs`): a reference is held by each inode body that
//! names the EA inode and by each xattr block (once, however many inodes
//! share it). So a change drops the references its old places held and
//! takes those of its new ones: replacing or removing the entry, copying a
//! shared block (the copy takes one more of each), freeing a block.
//! Reading goes through the filesystem layer too: `locate` names the EA
//! inode and `check_ea_inode_value` holds what it read to the kernel's
//! checks. Equal values share one EA inode, as the kernel's do: the
//! filesystem layer finds one holding the same bytes by their hash
//! (`ea_inode_for`), and the new place takes one more of its references.

use super::acl;
use super::csum::crc32c_raw;
use super::inode::Inode;
use super::superblock::{Geometry, incompat};
use super::{MetaCtx, get_u16, get_u32, put_u16, put_u32};
use crate::cache::{Buffer, BufferCache};
use crate::ensure_format;
use crate::error::{Error, Location, Result};
use crate::journal::change::{Change, Ineligible};
use std::ops::Range;
use std::sync::Arc;

pub const XATTR_MAGIC: u32 = 0xEA02_0000;
/// The longest attribute name the VFS passes (limits.h XATTR_NAME_MAX),
/// prefix included.
pub const XATTR_NAME_MAX: usize = 255;
/// Journal credits `set` may use besides the inode's own table block: the
/// old and the new xattr block, and a block bitmap and group descriptor for
/// each of the allocation and the release.
pub const SET_CREDITS: u32 = 6;

/// Name indexes (xattr.h EXT4_XATTR_INDEX_*).
pub mod name_index {
    pub const USER: u8 = 1;
    pub const POSIX_ACL_ACCESS: u8 = 2;
    pub const POSIX_ACL_DEFAULT: u8 = 3;
    pub const TRUSTED: u8 = 4;
    pub const LUSTRE: u8 = 5;
    pub const SECURITY: u8 = 6;
    /// `system.data` (inline data) and other kernel-internal names.
    pub const SYSTEM: u8 = 7;
    pub const RICHACL: u8 = 8;
    pub const ENCRYPTION: u8 = 9;
    pub const HURD: u8 = 10;
}

const BLOCK_HEADER_SIZE: usize = 32;
const IBODY_HEADER_SIZE: usize = 4;
const ENTRY_HEADER_SIZE: usize = 16;
const END_MARKER_SIZE: usize = 4;
const PAD: usize = 4;
/// Larger values are corrupt (xattr.h EXT4_XATTR_SIZE_MAX).
const VALUE_SIZE_MAX: usize = 1 << 24;

const H_MAGIC: usize = 0;
const H_REFCOUNT: usize = 4;
const H_BLOCKS: usize = 8;
const H_HASH: usize = 12;
const H_CHECKSUM: usize = 16;

const E_NAME_LEN: usize = 0;
const E_NAME_INDEX: usize = 1;
const E_VALUE_OFFS: usize = 2;
const E_VALUE_INUM: usize = 4;
const E_VALUE_SIZE: usize = 8;
const E_HASH: usize = 12;
const E_NAME: usize = 16;

/// Userspace prefixes and their indexes, as the kernel's handlers map them.
/// `exact` names (the ACLs) take no suffix; the others need one.
const NAMESPACES: &[(&[u8], u8, bool)] = &[
    (b"user.", name_index::USER, false),
    (
        b"system.posix_acl_access",
        name_index::POSIX_ACL_ACCESS,
        true,
    ),
    (
        b"system.posix_acl_default",
        name_index::POSIX_ACL_DEFAULT,
        true,
    ),
    (b"trusted.", name_index::TRUSTED, false),
    (b"security.", name_index::SECURITY, false),
    (b"gnu.", name_index::HURD, false),
];

/// What `set` requires of the attribute's current existence.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SetMode {
    Any,
    /// XATTR_CREATE: fail with `Error::Exists` if present.
    Create,
    /// XATTR_REPLACE: fail with `Error::NoAttribute` if absent.
    Replace,
}

/// Split a full name into (index, suffix) like the VFS `xattr_resolve_name`:
/// unknown namespaces (including `system.data`) are not supported, a prefix
/// without suffix is invalid.
fn resolve_name(full: &[u8]) -> Result<(u8, &[u8])> {
    if full.len() > XATTR_NAME_MAX {
        return Err(Error::Range);
    }
    if full.contains(&0) {
        // The VFS passes C strings; a NUL would make a corrupt entry.
        return Err(Error::Invalid("attribute name contains a NUL byte".into()));
    }
    for &(prefix, index, exact) in NAMESPACES {
        let Some(suffix) = full.strip_prefix(prefix) else {
            continue;
        };
        match (exact, suffix.is_empty()) {
            (false, false) | (true, true) => return Ok((index, suffix)),
            (false, true) => return Err(Error::Invalid("attribute name without suffix".into())),
            (true, false) => continue,
        }
    }
    Err(Error::NotSupported)
}

/// The prefix `listxattr` shows for an index; `None` for indexes the kernel
/// has no handler for (those entries are not listed).
fn list_prefix(index: u8) -> Option<&'static [u8]> {
    NAMESPACES
        .iter()
        .find(|&&(_, known, _)| known == index)
        .map(|&(prefix, _, _)| prefix)
}

fn is_acl(index: u8) -> bool {
    index == name_index::POSIX_ACL_ACCESS || index == name_index::POSIX_ACL_DEFAULT
}

/// EXT4_XATTR_LEN: an entry header plus its name, padded.
fn entry_len(name_len: usize) -> usize {
    (ENTRY_HEADER_SIZE + name_len).next_multiple_of(PAD)
}

/// EXT4_XATTR_SIZE: a value padded.
fn value_len(size: usize) -> usize {
    size.next_multiple_of(PAD)
}

/// EXT4_XATTR_MIN_LARGE_EA_SIZE: with ea_inode, a value whose padded size
/// is above this (a block less its header, an entry with a 3-byte name and
/// the end marker) goes to an EA inode without trying the two places.
fn min_large_ea_size(geo: &Geometry) -> usize {
    geo.block_size as usize - entry_len(3) - BLOCK_HEADER_SIZE - END_MARKER_SIZE
}

/// With ea_inode, whether a value of `size` bytes goes to an EA inode
/// whatever room the inode and its block have (`min_large_ea_size`).
pub fn goes_to_ea_inode(geo: &Geometry, size: usize) -> bool {
    geo.has_incompat(incompat::EA_INODE) && value_len(size) > min_large_ea_size(geo)
}

/// What a value of `size` bytes in an EA inode adds to the `i_blocks` of
/// each inode that names it, in 512-byte units: its blocks, in whole
/// clusters with bigalloc (the kernel's `round_up_cluster`).
fn ea_charge(geo: &Geometry, size: u32) -> u64 {
    let unit = geo.cluster_bytes();
    (size as u64).div_ceil(unit) * (unit / 512)
}

/// The hash an EA inode keeps of its value in `i_atime`
/// (`ext4_xattr_inode_get_hash`): the CRC32C seeded with the filesystem's
/// checksum seed, which the kernel computes for ea_inode with or without
/// metadata_csum.
pub fn ea_value_hash(geo: &Geometry, data: &[u8]) -> u32 {
    let seed = match geo.metadata_csum {
        true => geo.csum_seed,
        false => super::csum::fs_seed(&geo.uuid, None),
    };
    crc32c_raw(seed, data)
}

/// The hash of an entry whose value is in an EA inode: the name and the
/// EA inode's hash, as one little-endian word (the kernel feeds that
/// instead of the value, body and block entries alike).
fn ea_entry_hash(name: &[u8], value_hash: u32) -> u32 {
    entry_hash(name, &value_hash.to_le_bytes())
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Value {
    Stored(Vec<u8>),
    /// The value lives in an EA inode; kept as found, never read.
    InInode {
        ino: u32,
        size: u32,
    },
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Entry {
    index: u8,
    name: Vec<u8>,
    value: Value,
    /// `e_hash` as stored; in-inode entries keep it across rewrites, block
    /// entries get it recomputed when written.
    hash: u32,
}

impl Entry {
    fn is(&self, index: u8, name: &[u8]) -> bool {
        self.index == index && self.name == name
    }

    /// Bytes the entry takes in its area: header, name and value.
    fn footprint(&self) -> usize {
        let value = match &self.value {
            Value::Stored(bytes) => value_len(bytes.len()),
            Value::InInode { .. } => 0,
        };
        entry_len(self.name.len()) + value
    }

    fn stored_value(&self) -> Result<&[u8]> {
        match &self.value {
            Value::Stored(bytes) => Ok(bytes),
            Value::InInode { .. } => Err(Error::NotSupported),
        }
    }

    /// The EA inode holding the value, if one does.
    fn ea_inode(&self) -> Option<u32> {
        match self.value {
            Value::InInode { ino, .. } => Some(ino),
            Value::Stored(_) => None,
        }
    }

    /// Kernel order of block entries (xattr_find_entry with `sorted`).
    fn sort_key(&self) -> (u8, usize, &[u8]) {
        (self.index, self.name.len(), &self.name)
    }
}

/// Bytes a list of entries needs, end marker included.
fn needed_bytes(entries: &[Entry]) -> usize {
    entries.iter().map(Entry::footprint).sum::<usize>() + END_MARKER_SIZE
}

// ---------------------------------------------------------------------------
// Hashes and the block checksum.

/// ext4_xattr_hash_entry over the name (unsigned bytes) and the value padded
/// with zeros to whole little-endian words.
fn entry_hash(name: &[u8], value: &[u8]) -> u32 {
    let mut hash = 0u32;
    for &byte in name {
        hash = hash.rotate_left(5) ^ byte as u32;
    }
    for chunk in value.chunks(PAD) {
        let mut word = [0u8; PAD];
        word[..chunk.len()].copy_from_slice(chunk);
        hash = hash.rotate_left(16) ^ u32::from_le_bytes(word);
    }
    hash
}

/// `entry_hash` with the name's bytes taken as signed chars, as x86
/// kernels before 6.2 hashed them (`ext4_xattr_hash_entry_signed`): a hash
/// the kernel still accepts where it checks one.
fn entry_hash_signed(name: &[u8], value: &[u8]) -> u32 {
    let mut hash = 0u32;
    for &byte in name {
        hash = hash.rotate_left(5) ^ (byte as i8 as i32 as u32);
    }
    for chunk in value.chunks(PAD) {
        let mut word = [0u8; PAD];
        word[..chunk.len()].copy_from_slice(chunk);
        hash = hash.rotate_left(16) ^ u32::from_le_bytes(word);
    }
    hash
}

/// ext4_xattr_rehash: 0 ("never share") if any entry hash is 0.
fn block_hash(hashes: impl Iterator<Item = u32>) -> u32 {
    let mut hash = 0u32;
    for entry in hashes {
        if entry == 0 {
            return 0;
        }
        hash = hash.rotate_left(16) ^ entry;
    }
    hash
}

/// ext4_xattr_block_csum: the filesystem seed, the block number as le64,
/// then the whole block with h_checksum taken as zero.
fn block_checksum(geo: &Geometry, block: u64, bytes: &[u8]) -> u32 {
    let mut crc = crc32c_raw(geo.csum_seed, &block.to_le_bytes());
    crc = crc32c_raw(crc, &bytes[..H_CHECKSUM]);
    crc = crc32c_raw(crc, &[0; 4]);
    crc32c_raw(crc, &bytes[H_CHECKSUM + 4..])
}

fn verify_block_checksum(geo: &Geometry, block: u64, bytes: &[u8]) -> bool {
    !geo.metadata_csum || get_u32(bytes, H_CHECKSUM) == block_checksum(geo, block, bytes)
}

fn set_block_checksum(geo: &Geometry, block: u64, bytes: &mut [u8]) {
    if geo.metadata_csum {
        let sum = block_checksum(geo, block, bytes);
        put_u32(bytes, H_CHECKSUM, sum);
    }
}

// ---------------------------------------------------------------------------
// Decoding an entry list, with the checks of ext4_xattr_check_entries and
// e2fsck's region checks.

struct EntryHeader {
    index: u8,
    name: Range<usize>,
    value_offs: usize,
    value_inum: u32,
    value_size: usize,
    hash: u32,
}

/// Decode the entries of `bytes[first..]`; value offsets count from
/// `value_base`. Values must lie after the end marker, inside the area, and
/// must not overlap each other.
fn parse_entries(
    geo: &Geometry,
    bytes: &[u8],
    first: usize,
    value_base: usize,
    location: Location,
) -> Result<Vec<Entry>> {
    let end = bytes.len();
    debug_assert!(first + END_MARKER_SIZE <= end);
    let mut headers = Vec::new();
    let mut offset = first;
    let mut terminated = false;
    // Every entry takes at least ENTRY_HEADER_SIZE bytes.
    for _ in 0..=(end - first) / ENTRY_HEADER_SIZE {
        ensure_format!(
            offset + END_MARKER_SIZE <= end,
            location,
            "xattr entries run past the end of their area (byte {offset})"
        );
        if get_u32(bytes, offset) == 0 {
            terminated = true;
            break;
        }
        let header = parse_entry_header(bytes, offset, location)?;
        offset += entry_len(header.name.len());
        headers.push(header);
    }
    ensure_format!(terminated, location, "xattr entry list has no end marker");
    let names_end = offset + END_MARKER_SIZE;
    let mut ranges = Vec::with_capacity(headers.len());
    let mut entries = Vec::with_capacity(headers.len());
    for header in &headers {
        let value = entry_value(geo, bytes, header, value_base, names_end, location)?;
        if let Value::Stored(data) = &value
            && !data.is_empty()
        {
            let start = value_base + header.value_offs;
            ranges.push(start..start + value_len(data.len()));
        }
        entries.push(Entry {
            index: header.index,
            name: bytes[header.name.clone()].to_vec(),
            value,
            hash: header.hash,
        });
    }
    ranges.sort_by_key(|range| range.start);
    for pair in ranges.windows(2) {
        ensure_format!(
            pair[0].end <= pair[1].start,
            location,
            "xattr values at bytes {:?} and {:?} overlap",
            pair[0],
            pair[1]
        );
    }
    Ok(entries)
}

fn parse_entry_header(bytes: &[u8], offset: usize, location: Location) -> Result<EntryHeader> {
    let end = bytes.len();
    ensure_format!(
        offset + ENTRY_HEADER_SIZE <= end,
        location,
        "xattr entry at byte {offset} runs past the end of its area"
    );
    let name_len = bytes[offset + E_NAME_LEN] as usize;
    // The next entry (or the end marker) must fit too.
    ensure_format!(
        offset + entry_len(name_len) + END_MARKER_SIZE <= end,
        location,
        "xattr entry at byte {offset} (name length {name_len}) runs past the end of its area"
    );
    let index = bytes[offset + E_NAME_INDEX];
    ensure_format!(
        index != 0,
        location,
        "xattr entry at byte {offset} has name index 0"
    );
    let name = offset + E_NAME..offset + E_NAME + name_len;
    ensure_format!(
        !bytes[name.clone()].contains(&0),
        location,
        "xattr name at byte {offset} contains a NUL byte"
    );
    Ok(EntryHeader {
        index,
        name,
        value_offs: get_u16(bytes, offset + E_VALUE_OFFS) as usize,
        value_inum: get_u32(bytes, offset + E_VALUE_INUM),
        value_size: get_u32(bytes, offset + E_VALUE_SIZE) as usize,
        hash: get_u32(bytes, offset + E_HASH),
    })
}

fn entry_value(
    geo: &Geometry,
    bytes: &[u8],
    header: &EntryHeader,
    value_base: usize,
    names_end: usize,
    location: Location,
) -> Result<Value> {
    let size = header.value_size;
    ensure_format!(
        size <= VALUE_SIZE_MAX,
        location,
        "xattr value size {size} is too large"
    );
    if header.value_inum != 0 {
        ensure_format!(
            geo.has_incompat(incompat::EA_INODE),
            location,
            "xattr value in inode {} without the ea_inode feature",
            header.value_inum
        );
        return Ok(Value::InInode {
            ino: header.value_inum,
            size: size as u32,
        });
    }
    if size == 0 {
        return Ok(Value::Stored(Vec::new()));
    }
    let start = value_base + header.value_offs;
    ensure_format!(
        start >= names_end,
        location,
        "xattr value at byte {start} overlaps the entry list (which ends at {names_end})"
    );
    ensure_format!(
        start + value_len(size) <= bytes.len(),
        location,
        "xattr value at byte {start} ({size} bytes) runs past the end of its area"
    );
    Ok(Value::Stored(bytes[start..start + size].to_vec()))
}

// ---------------------------------------------------------------------------
// Encoding an entry list.

/// Write `entries` into `bytes[first..]` (which the caller zeroed), values
/// packed down from the end; `hash_of` gives each entry's e_hash.
fn encode_entries(
    entries: &[Entry],
    bytes: &mut [u8],
    first: usize,
    value_base: usize,
    hash_of: impl Fn(&Entry) -> u32,
) {
    debug_assert!(first + needed_bytes(entries) <= bytes.len());
    let mut offset = first;
    let mut values_start = bytes.len();
    for entry in entries {
        let (offs, inum, size) = match &entry.value {
            Value::Stored(data) if !data.is_empty() => {
                values_start -= value_len(data.len());
                bytes[values_start..values_start + data.len()].copy_from_slice(data);
                (values_start - value_base, 0, data.len() as u32)
            }
            Value::Stored(_) => (0, 0, 0),
            Value::InInode { ino, size } => (0, *ino, *size),
        };
        debug_assert!(offs <= u16::MAX as usize && entry.name.len() <= u8::MAX as usize);
        bytes[offset + E_NAME_LEN] = entry.name.len() as u8;
        bytes[offset + E_NAME_INDEX] = entry.index;
        put_u16(bytes, offset + E_VALUE_OFFS, offs as u16);
        put_u32(bytes, offset + E_VALUE_INUM, inum);
        put_u32(bytes, offset + E_VALUE_SIZE, size);
        put_u32(bytes, offset + E_HASH, hash_of(entry));
        bytes[offset + E_NAME..offset + E_NAME + entry.name.len()].copy_from_slice(&entry.name);
        offset += entry_len(entry.name.len());
    }
    // The end marker is the zeroed word at `offset`.
    debug_assert!(offset + END_MARKER_SIZE <= values_start);
    debug_assert_eq!(get_u32(bytes, offset), 0);
}

/// The hash a block entry carries.
fn block_entry_hash(entry: &Entry) -> u32 {
    match &entry.value {
        Value::Stored(data) => entry_hash(&entry.name, data),
        // Mixed with the EA inode's own hash, which we do not read.
        Value::InInode { .. } => entry.hash,
    }
}

/// Fill a whole xattr block: header with refcount 1, sorted entries,
/// hashes, checksum.
fn encode_block(geo: &Geometry, block: u64, entries: &[Entry], bytes: &mut [u8]) {
    debug_assert!(entries.is_sorted_by(|a, b| a.sort_key() <= b.sort_key()));
    bytes.fill(0);
    put_u32(bytes, H_MAGIC, XATTR_MAGIC);
    put_u32(bytes, H_REFCOUNT, 1);
    put_u32(bytes, H_BLOCKS, 1);
    encode_entries(entries, bytes, BLOCK_HEADER_SIZE, 0, block_entry_hash);
    put_u32(
        bytes,
        H_HASH,
        block_hash(entries.iter().map(block_entry_hash)),
    );
    set_block_checksum(geo, block, bytes);
}

// ---------------------------------------------------------------------------
// The two places, loaded.

/// The inode body's attributes, when the inode has room for any
/// (EXT4_INODE_HAS_XATTR_SPACE).
struct Ibody {
    entries: Vec<Entry>,
    /// Bytes available to entries, values and the end marker.
    capacity: usize,
}

fn load_ibody(geo: &Geometry, ino: u32, inode: &Inode) -> Result<Option<Ibody>> {
    let area = inode.inline_xattr_area();
    if inode.extra_isize == 0 || area.len() < IBODY_HEADER_SIZE + END_MARKER_SIZE {
        return Ok(None);
    }
    let capacity = area.len() - IBODY_HEADER_SIZE;
    // Without the magic the area holds nothing (the kernel's EXT4_STATE_XATTR).
    if get_u32(area, 0) != XATTR_MAGIC {
        return Ok(Some(Ibody {
            entries: Vec::new(),
            capacity,
        }));
    }
    let location = Location::Inode { ino };
    let entries = parse_entries(geo, area, IBODY_HEADER_SIZE, IBODY_HEADER_SIZE, location)?;
    debug_assert!(needed_bytes(&entries) <= capacity);
    Ok(Some(Ibody { entries, capacity }))
}

/// Write the body's entries back into the inode (zeroing the area first, and
/// leaving it without magic when empty, as ext4_xattr_ibody_set does).
fn store_ibody(inode: &mut Inode, entries: &[Entry]) {
    let area = inode.inline_xattr_area_mut();
    area.fill(0);
    if entries.is_empty() {
        return;
    }
    debug_assert!(IBODY_HEADER_SIZE + needed_bytes(entries) <= area.len());
    put_u32(area, 0, XATTR_MAGIC);
    encode_entries(entries, area, IBODY_HEADER_SIZE, IBODY_HEADER_SIZE, |e| {
        e.hash
    });
}

struct XattrBlock {
    block: u64,
    buffer: Arc<Buffer>,
    entries: Vec<Entry>,
    refcount: u32,
}

/// How many of inode `ino`'s attributes, in its body and its block, keep
/// their values in EA inodes: each counts one inode more for the owner's
/// quota (the kernel's `ext4_get_inode_usage`, e2fsck's ea_ibody_quota
/// and ea_block_quota), a shared block's for every inode sharing it.
pub fn ea_inode_entries(
    geo: &Geometry,
    cache: &BufferCache,
    ino: u32,
    inode: &Inode,
) -> Result<u64> {
    if !geo.has_incompat(incompat::EA_INODE) {
        return Ok(0);
    }
    let body = load_ibody(geo, ino, inode)?.map_or(0, |ibody| ea_inodes(&ibody.entries).len());
    let block =
        load_block(geo, cache, ino, inode)?.map_or(0, |block| ea_inodes(&block.entries).len());
    Ok((body + block) as u64)
}

/// The EA inodes `entries` name, one per entry.
fn ea_inodes(entries: &[Entry]) -> Vec<u32> {
    entries.iter().filter_map(Entry::ea_inode).collect()
}

fn block_capacity(geo: &Geometry) -> usize {
    geo.block_size as usize - BLOCK_HEADER_SIZE
}

/// 512-byte units one xattr block adds to `i_blocks` of each inode that
/// names it: a cluster with bigalloc, whose first block it is.
fn block_sectors(geo: &Geometry) -> u64 {
    geo.cluster_bytes() / 512
}

fn load_block(
    geo: &Geometry,
    cache: &BufferCache,
    ino: u32,
    inode: &Inode,
) -> Result<Option<XattrBlock>> {
    let block = inode.file_acl;
    if block == 0 {
        return Ok(None);
    }
    ensure_format!(
        block >= geo.first_data_block as u64 && block < geo.blocks_count,
        Location::Inode { ino },
        "i_file_acl {block} is outside the filesystem"
    );
    let location = Location::InodeBlock { ino, block };
    let buffer = cache.read(block)?;
    let (entries, refcount) = {
        let bytes = buffer.read();
        let magic = get_u32(&bytes, H_MAGIC);
        ensure_format!(
            magic == XATTR_MAGIC,
            location,
            "bad xattr block magic {magic:#010x}"
        );
        let blocks = get_u32(&bytes, H_BLOCKS);
        ensure_format!(blocks == 1, location, "xattr block claims {blocks} blocks");
        let refcount = get_u32(&bytes, H_REFCOUNT);
        ensure_format!(refcount >= 1, location, "xattr block has refcount 0");
        ensure_format!(
            buffer.is_verified() || verify_block_checksum(geo, block, &bytes),
            location,
            "xattr block checksum mismatch"
        );
        let entries = parse_entries(geo, &bytes, BLOCK_HEADER_SIZE, 0, location)?;
        (entries, refcount)
    };
    buffer.set_verified();
    Ok(Some(XattrBlock {
        block,
        buffer,
        entries,
        refcount,
    }))
}

// ---------------------------------------------------------------------------
// Reading.

/// The value of attribute `name` ("user.foo", "system.posix_acl_access", ...)
/// as userspace sees it, or `None` if the inode has no such attribute. ACLs
/// come back in the VFS xattr format.
/// Where an attribute's value is: in the inode body or xattr block (read),
/// or in an EA inode that the caller reads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Located {
    Value(Vec<u8>),
    InInode(EaValue),
}

/// A value kept in an EA inode: the inode, the size the entry records,
/// and what its checks need.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EaValue {
    pub ino: u32,
    pub size: u32,
    index: u8,
    name: Vec<u8>,
    entry_hash: u32,
}

/// The attribute `name` of `inode`, its value read where it is stored
/// (ACLs in the xattr form), or None. A value in an EA inode answers
/// `NotSupported` here: `locate` is for callers that can read it.
pub fn get(
    geo: &Geometry,
    cache: &BufferCache,
    ino: u32,
    inode: &Inode,
    name: &[u8],
) -> Result<Option<Vec<u8>>> {
    match locate(geo, cache, ino, inode, name)? {
        Some(Located::Value(value)) => Ok(Some(value)),
        Some(Located::InInode(_)) => Err(Error::NotSupported),
        None => Ok(None),
    }
}

/// `get`, with a value kept in an EA inode named instead of refused.
pub fn locate(
    geo: &Geometry,
    cache: &BufferCache,
    ino: u32,
    inode: &Inode,
    name: &[u8],
) -> Result<Option<Located>> {
    let (index, suffix) = resolve_name(name)?;
    let Some(entry) = find_entry(geo, cache, ino, inode, index, suffix)? else {
        return Ok(None);
    };
    match entry.value {
        Value::Stored(raw) => {
            value_as_read(ino, index, raw).map(|value| Some(Located::Value(value)))
        }
        Value::InInode { ino: ea, size } => Ok(Some(Located::InInode(EaValue {
            ino: ea,
            size,
            index,
            name: entry.name,
            entry_hash: entry.hash,
        }))),
    }
}

/// A stored value as getxattr returns it: ACLs turned into their xattr
/// form.
fn value_as_read(ino: u32, index: u8, raw: Vec<u8>) -> Result<Vec<u8>> {
    if !is_acl(index) {
        return Ok(raw);
    }
    acl::acl_to_xattr(&raw)
        .map_err(|error| Error::corrupt(Location::Inode { ino }, format!("{error}")))
}

/// The value `data` read from the EA inode `ea` (`ea_inode`), held to the
/// kernel's checks (`ext4_xattr_inode_iget`, `ext4_xattr_inode_get`,
/// `ext4_xattr_inode_verify_hashes`): the inode is flagged EA_INODE, its
/// size is the entry's, the CRC32C of the value is the hash the EA inode
/// keeps in `i_atime`, and the entry's hash covers that hash. Old Lustre
/// EA inodes, which point back to their owner instead of keeping a hash,
/// skip the hashes as in the kernel. Returns the value as getxattr gives
/// it.
pub fn check_ea_inode_value(
    geo: &Geometry,
    owner: u32,
    owner_generation: u32,
    value: &EaValue,
    ea_inode: &Inode,
    data: Vec<u8>,
) -> Result<Vec<u8>> {
    let location = Location::Inode { ino: value.ino };
    ensure_format!(
        ea_inode.has_flag(super::inode::flags::EA_INODE),
        location,
        "EA inode {} of inode {owner} does not have the EA_INODE flag",
        value.ino
    );
    ensure_format!(
        ea_inode.size == value.size as u64 && data.len() == value.size as usize,
        location,
        "EA inode size {} differs from its entry's value size {}",
        ea_inode.size,
        value.size
    );
    let lustre = ea_inode.mtime.sec as u32 == owner && ea_inode.generation == owner_generation;
    if !lustre {
        let hash = ea_value_hash(geo, &data);
        ensure_format!(
            hash == ea_inode.atime.sec as u32,
            location,
            "EA inode value hash {hash:#x} differs from the one it keeps ({:#x})",
            ea_inode.atime.sec as u32
        );
        let words = hash.to_le_bytes();
        let signed = entry_hash_signed(&value.name, &words);
        ensure_format!(
            entry_hash(&value.name, &words) == value.entry_hash || signed == value.entry_hash,
            location,
            "the xattr entry's hash {:#x} does not cover its EA inode's value",
            value.entry_hash
        );
    }
    value_as_read(owner, value.index, data)
}

/// The inode body first, then the block, like ext4_xattr_get.
fn find_entry(
    geo: &Geometry,
    cache: &BufferCache,
    ino: u32,
    inode: &Inode,
    index: u8,
    name: &[u8],
) -> Result<Option<Entry>> {
    let ibody = load_ibody(geo, ino, inode)?;
    let mut body_entries = ibody.into_iter().flat_map(|body| body.entries);
    if let Some(entry) = body_entries.find(|e| e.is(index, name)) {
        return Ok(Some(entry));
    }
    let block = load_block(geo, cache, ino, inode)?;
    let mut block_entries = block.into_iter().flat_map(|block| block.entries);
    Ok(block_entries.find(|e| e.is(index, name)))
}

/// The name of inline data's attribute, `system.data` (inline.c
/// EXT4_XATTR_SYSTEM_DATA, under EXT4_XATTR_INDEX_SYSTEM).
pub const INLINE_DATA_NAME: &[u8] = b"data";

/// The value of `system.data`, the part of an inline inode's data past
/// `i_block`. The kernel looks for it in the inode body only
/// (ext4_find_inline_data_nolock): one in the block is no inline data.
pub fn inline_data_value(geo: &Geometry, ino: u32, inode: &Inode) -> Result<Option<Vec<u8>>> {
    let Some(ibody) = load_ibody(geo, ino, inode)? else {
        return Ok(None);
    };
    let found = ibody
        .entries
        .iter()
        .find(|entry| entry.is(name_index::SYSTEM, INLINE_DATA_NAME));
    match found {
        Some(entry) => entry.stored_value().map(|value| Some(value.to_vec())),
        None => Ok(None),
    }
}

/// The longest value `system.data` can have in the inode body next to the
/// body's other attributes (get_max_inline_xattr_value_size): the body's
/// room less theirs and the entry's own, in whole 4-byte words. 0 for an
/// inode without a body area (128-byte inodes, `i_extra_isize` 0).
pub fn inline_data_room(geo: &Geometry, ino: u32, inode: &Inode) -> Result<usize> {
    let Some(ibody) = load_ibody(geo, ino, inode)? else {
        return Ok(0);
    };
    let others: Vec<Entry> = ibody
        .entries
        .into_iter()
        .filter(|entry| !entry.is(name_index::SYSTEM, INLINE_DATA_NAME))
        .collect();
    let taken = needed_bytes(&others) + entry_len(INLINE_DATA_NAME.len());
    Ok(ibody.capacity.saturating_sub(taken) / PAD * PAD)
}

/// Set `system.data` to `value`, or remove it (`None`), in the inode body
/// and only there (the kernel never looks for it in the block); the
/// body's other entries stay as they are. `Error::NoSpace` when it does not
/// fit (`inline_data_room` says how much does). Its `e_hash` is 0: the
/// kernel rewrites inline bytes in place without rehashing, and e2fsck
/// takes 0 for "not hashed" in the body.
pub fn set_inline_data_value(
    geo: &Geometry,
    ino: u32,
    inode: &mut Inode,
    value: Option<&[u8]>,
) -> Result<()> {
    let Some(ibody) = load_ibody(geo, ino, inode)? else {
        return match value {
            Some(_) => Err(Error::NoSpace),
            None => Ok(()),
        };
    };
    let mut entries = ibody.entries;
    let at = entries
        .iter()
        .position(|entry| entry.is(name_index::SYSTEM, INLINE_DATA_NAME));
    match (at, value) {
        (Some(at), Some(value)) => {
            entries[at].value = Value::Stored(value.to_vec());
            entries[at].hash = 0;
        }
        (None, Some(value)) => entries.push(Entry {
            index: name_index::SYSTEM,
            name: INLINE_DATA_NAME.to_vec(),
            value: Value::Stored(value.to_vec()),
            hash: 0,
        }),
        (Some(at), None) => {
            entries.remove(at);
        }
        (None, None) => return Ok(()),
    }
    if needed_bytes(&entries) > ibody.capacity {
        return Err(Error::NoSpace);
    }
    store_ibody(inode, &entries);
    Ok(())
}

/// Full names of the inode's attributes, body entries first, then block
/// entries, like ext4_listxattr. Names of namespaces the kernel has no
/// handler for (`system.data`, encryption contexts) are left out. Filtering
/// by mount options and privileges (user_xattr, acl, CAP_SYS_ADMIN for
/// trusted.*) is the caller's business.
pub fn list(geo: &Geometry, cache: &BufferCache, ino: u32, inode: &Inode) -> Result<Vec<Vec<u8>>> {
    let mut entries = Vec::new();
    if let Some(ibody) = load_ibody(geo, ino, inode)? {
        entries.extend(ibody.entries);
    }
    if let Some(block) = load_block(geo, cache, ino, inode)? {
        entries.extend(block.entries);
    }
    let mut names = Vec::with_capacity(entries.len());
    for entry in &entries {
        let Some(prefix) = list_prefix(entry.index) else {
            continue;
        };
        let name = [prefix, &entry.name].concat();
        // Every listed name must read back: the kernel never stores an
        // empty suffix under a prefix ("user."), a suffix under an exact
        // name (the ACLs), or a full name past XATTR_NAME_MAX.
        ensure_format!(
            resolve_name(&name).is_ok(),
            Location::Inode { ino },
            "xattr entry {:?} (index {}) names no attribute",
            String::from_utf8_lossy(&name),
            entry.index
        );
        names.push(name);
    }
    Ok(names)
}

// ---------------------------------------------------------------------------
// Changing.

/// Set (`value` Some) or remove (`None`) attribute `name` of inode `ino`.
/// ACL values come in the VFS xattr format and are stored in ext4's.
/// Updates `inode` (its body area, `file_acl`, `blocks`); the caller writes
/// the inode back, sets its ctime, and makes sure the superblock has the
/// ext_attr feature (ext4_xattr_update_super_block).
pub fn set(
    ctx: &mut MetaCtx,
    ino: u32,
    inode: &mut Inode,
    name: &[u8],
    value: Option<&[u8]>,
    mode: SetMode,
) -> Result<()> {
    // As the kernel's ext4_xattr_set_handle: marked before anything changes.
    ctx.handle.note(Change::Ineligible(Ineligible::Xattr));
    let (index, suffix) = resolve_name(name)?;
    if !is_acl(index) {
        return set_stored(ctx, ino, inode, index, suffix, value, mode);
    }
    // An ACL without entries means "no ACL" (posix_acl_from_xattr).
    let disk = value
        .map(acl::acl_from_xattr)
        .transpose()?
        .filter(|disk| !acl::is_empty_disk(disk));
    if index == name_index::POSIX_ACL_DEFAULT && !inode.is_dir() {
        // Only directories have default ACLs (__ext4_set_acl).
        return match disk {
            Some(_) => Err(Error::PermissionDenied),
            None => Ok(()),
        };
    }
    // The VFS ignores XATTR_CREATE / XATTR_REPLACE for ACLs, and removing an
    // absent ACL succeeds (set_posix_acl → ext4_set_acl).
    match set_stored(
        ctx,
        ino,
        inode,
        index,
        suffix,
        disk.as_deref(),
        SetMode::Any,
    ) {
        Err(Error::NoAttribute) if disk.is_none() => Ok(()),
        result => result,
    }
}

/// Drop the inode's reference to its xattr block when the inode is deleted:
/// free the block, or decrement the refcount of a shared one.
/// A freed block drops the references its entries held to EA inodes
/// (`ext4_xattr_inode_dec_ref_all`).
pub fn release_block(ctx: &mut MetaCtx, ino: u32, inode: &mut Inode) -> Result<()> {
    let Some(block) = load_block(ctx.geo, ctx.cache, ino, inode)? else {
        return Ok(());
    };
    if release(ctx, ino, &block)? {
        change_refs(ctx, ino, &[], &ea_inodes(&block.entries))?;
    }
    inode.file_acl = 0;
    inode.blocks = inode.blocks.saturating_sub(block_sectors(ctx.geo));
    Ok(())
}

/// Drop the references the inode body's entries hold to EA inodes, when
/// the inode is deleted (`ext4_xattr_delete_inode`); the body itself goes
/// with the inode.
pub fn release_body_ea_inodes(ctx: &mut MetaCtx, ino: u32, inode: &Inode) -> Result<()> {
    if !ctx.geo.has_incompat(incompat::EA_INODE) {
        return Ok(());
    }
    let Some(ibody) = load_ibody(ctx.geo, ino, inode)? else {
        return Ok(());
    };
    change_refs(ctx, ino, &[], &ea_inodes(&ibody.entries))
}

/// Take a reference to each EA inode `taken` names and drop one of each
/// `dropped` names; one named by both is left as it is (the entry moved,
/// or stayed). Takes first, so that no count touches zero on the way.
fn change_refs(ctx: &mut MetaCtx, owner: u32, taken: &[u32], dropped: &[u32]) -> Result<()> {
    let mut dropped = dropped.to_vec();
    let mut taken_only = Vec::new();
    for &ino in taken {
        match dropped.iter().position(|&other| other == ino) {
            Some(at) => {
                dropped.swap_remove(at);
            }
            None => taken_only.push(ino),
        }
    }
    for ino in taken_only {
        ctx.alloc.change_ea_inode_refs(owner, ino, 1)?;
    }
    for ino in dropped {
        ctx.alloc.change_ea_inode_refs(owner, ino, -1)?;
    }
    Ok(())
}

/// `set` for a value already in its on-disk form.
fn set_stored(
    ctx: &mut MetaCtx,
    ino: u32,
    inode: &mut Inode,
    index: u8,
    name: &[u8],
    value: Option<&[u8]>,
    mode: SetMode,
) -> Result<()> {
    let ibody = load_ibody(ctx.geo, ino, inode)?;
    let block = load_block(ctx.geo, ctx.cache, ino, inode)?;
    let found = Found {
        ibody: ibody
            .as_ref()
            .and_then(|body| body.entries.iter().position(|e| e.is(index, name))),
        block: block
            .as_ref()
            .and_then(|block| block.entries.iter().position(|e| e.is(index, name))),
    };
    let existing = match (found.ibody, found.block) {
        (Some(at), _) => ibody.as_ref().map(|body| &body.entries[at]),
        (None, Some(at)) => block.as_ref().map(|block| &block.entries[at]),
        (None, None) => None,
    };
    match (existing, mode, value) {
        (None, SetMode::Replace, _) | (None, _, None) => return Err(Error::NoAttribute),
        (Some(_), SetMode::Create, _) => return Err(Error::Exists),
        _ => {}
    }
    let old_ea_size = match existing.map(|entry| &entry.value) {
        Some(Value::InInode { size, .. }) => Some(*size),
        _ => None,
    };
    if let (Some(Value::Stored(old)), Some(new)) = (existing.map(|entry| &entry.value), value)
        && old == new
    {
        return Ok(()); // ext4_xattr_value_same: nothing to do
    }
    // Where the value goes, as ext4_xattr_set_handle decides it: to an EA
    // inode at once when large, else to the body or the block, and to an
    // EA inode after all when neither has room. Planned with a stand-in
    // for the EA inode (its entry's size does not depend on it), so that
    // no EA inode is made for an attribute that fits nowhere.
    let geo = ctx.geo;
    let ea_feature = geo.has_incompat(incompat::EA_INODE);
    let stand_in = |value: &[u8]| NewValue::InInode {
        ino: 0,
        size: value.len() as u32,
        value_hash: 0,
    };
    let plan_for = |new: Option<NewValue<'_>>| {
        let target = new.map(|new| (index, name, new));
        plan_change(geo, ibody.as_ref(), block.as_ref(), found, target)
    };
    let mut new = value.map(|value| {
        if goes_to_ea_inode(geo, value.len()) {
            stand_in(value)
        } else {
            NewValue::Stored(value)
        }
    });
    let plan = match (plan_for(new), value) {
        (Err(Error::NoSpace), Some(value))
            if ea_feature && !value.is_empty() && matches!(new, Some(NewValue::Stored(_))) =>
        {
            new = Some(stand_in(value));
            plan_for(new)?
        }
        (plan, _) => plan?,
    };
    let mut created = None;
    let plan = match (new, value) {
        (Some(NewValue::InInode { size, .. }), Some(value)) => {
            let value_hash = ea_value_hash(geo, value);
            // The block the plan writes anew (none, or a first or private
            // copy), charged with the EA inode (see `store_block`).
            let new_block = plan
                .block
                .as_ref()
                .is_some_and(|entries| !entries.is_empty())
                && block.as_ref().is_none_or(|old| old.refcount != 1);
            let ea = ctx
                .alloc
                .ea_inode_for(ino, value, value_hash, u64::from(new_block))?;
            created = Some(ea);
            let real = NewValue::InInode {
                ino: ea,
                size,
                value_hash,
            };
            plan_for(Some(real))?
        }
        _ => plan,
    };
    // The references the changed places held, and those they will hold
    // (the new or shared EA inode's is the one `ea_inode_for` took).
    let mut held = Vec::new();
    let mut holding = Vec::new();
    if let Some(entries) = &plan.ibody {
        held.extend(
            ibody
                .as_ref()
                .map_or(Vec::new(), |body| ea_inodes(&body.entries)),
        );
        holding.extend(ea_inodes(entries));
    }
    if let Some(entries) = plan.block {
        let (gave_up, took) = store_block(ctx, ino, inode, block, entries)?;
        held.extend(gave_up);
        holding.extend(took);
    }
    // Last: nothing can fail any more, so a failed block change leaves the
    // inode as it was.
    if let Some(entries) = plan.ibody {
        store_ibody(inode, &entries);
    }
    // The inode's i_blocks counts the blocks of each value it names in an
    // EA inode, shared or not, as the kernel charges them to it
    // (`ext4_xattr_inode_alloc_quota`, `_free_quota`; e2fsck checks).
    if let Some(size) = old_ea_size {
        inode.blocks = inode.blocks.saturating_sub(ea_charge(geo, size));
    }
    if let Some(NewValue::InInode { size, .. }) = new {
        inode.blocks += ea_charge(geo, size);
    }
    if let Some(ea) = created {
        let at = holding.iter().position(|&other| other == ea);
        debug_assert!(at.is_some(), "the new or shared EA inode is named");
        if let Some(at) = at {
            holding.swap_remove(at);
        }
    }
    change_refs(ctx, ino, &holding, &held)
}

/// A new value: its bytes, or the EA inode that holds them.
#[derive(Clone, Copy)]
enum NewValue<'v> {
    Stored(&'v [u8]),
    InInode {
        ino: u32,
        size: u32,
        value_hash: u32,
    },
}

/// Where the named attribute sits now.
#[derive(Clone, Copy)]
struct Found {
    ibody: Option<usize>,
    block: Option<usize>,
}

/// The new entry lists of the places that change (`None`: unchanged).
struct Plan {
    ibody: Option<Vec<Entry>>,
    block: Option<Vec<Entry>>,
}

fn without(entries: &[Entry], at: usize) -> Vec<Entry> {
    let mut rest = entries.to_vec();
    rest.remove(at);
    rest
}

/// Decide where the attribute goes, like ext4_xattr_set_handle: removal
/// from where it is (the body first); a value goes to the body if the body
/// then fits, else to the block, and leaves the other place.
fn plan_change(
    geo: &Geometry,
    ibody: Option<&Ibody>,
    block: Option<&XattrBlock>,
    found: Found,
    target: Option<(u8, &[u8], NewValue<'_>)>,
) -> Result<Plan> {
    let body_entries = ibody.map_or(&[][..], |body| &body.entries);
    let block_entries = block.map_or(&[][..], |block| &block.entries);
    let body_without = found.ibody.map(|at| without(body_entries, at));
    let block_without = found.block.map(|at| without(block_entries, at));
    let Some((index, name, value)) = target else {
        debug_assert!(found.ibody.is_some() || found.block.is_some());
        return Ok(match body_without {
            Some(entries) => Plan {
                ibody: Some(entries),
                block: None,
            },
            None => Plan {
                ibody: None,
                block: block_without,
            },
        });
    };
    // Body entries with their value in place carry hash 0, as the kernel
    // writes them; an entry naming an EA inode carries its hash in both.
    let entry = |in_block: bool| match value {
        NewValue::Stored(value) => Entry {
            index,
            name: name.to_vec(),
            value: Value::Stored(value.to_vec()),
            hash: if in_block { entry_hash(name, value) } else { 0 },
        },
        NewValue::InInode {
            ino,
            size,
            value_hash,
        } => Entry {
            index,
            name: name.to_vec(),
            value: Value::InInode { ino, size },
            hash: ea_entry_hash(name, value_hash),
        },
    };
    if let Some(ibody) = ibody {
        let entries = replaced_or_added(body_entries, found.ibody, entry(false));
        if needed_bytes(&entries) <= ibody.capacity {
            return Ok(Plan {
                ibody: Some(entries),
                block: block_without,
            });
        }
    }
    let entries = replaced_or_added(block_entries, found.block, entry(true));
    if needed_bytes(&entries) > block_capacity(geo) {
        return Err(Error::NoSpace);
    }
    Ok(Plan {
        ibody: body_without,
        block: Some(entries),
    })
}

fn replaced_or_added(entries: &[Entry], at: Option<usize>, entry: Entry) -> Vec<Entry> {
    let mut result = entries.to_vec();
    match at {
        Some(at) => result[at] = entry,
        None => result.push(entry),
    }
    result
}

/// Make the inode's xattr block hold `entries`: allocate, rewrite in place,
/// copy (when shared) or release (when empty), and account the block in
/// `i_file_acl` and `i_blocks`. Returns the EA inodes the old block's
/// entries held references to and no longer do (it was rewritten or
/// freed; a shared block that stays keeps its own), and those the block
/// the inode now has holds anew.
fn store_block(
    ctx: &mut MetaCtx,
    ino: u32,
    inode: &mut Inode,
    old: Option<XattrBlock>,
    mut entries: Vec<Entry>,
) -> Result<(Vec<u32>, Vec<u32>)> {
    entries.sort_by(|a, b| a.sort_key().cmp(&b.sort_key()));
    debug_assert!(needed_bytes(&entries) <= block_capacity(ctx.geo));
    let Some(old) = old else {
        if !entries.is_empty() {
            inode.file_acl = write_new_block(ctx, ino, &entries)?;
            inode.blocks += block_sectors(ctx.geo);
        }
        return Ok((Vec::new(), ea_inodes(&entries)));
    };
    debug_assert_eq!(inode.file_acl, old.block);
    if old.refcount == 1 && !entries.is_empty() {
        // Ours alone: nobody else can change the refcount meanwhile.
        let mut bytes = ctx.handle.get_write_access(&old.buffer)?;
        debug_assert_eq!(get_u32(&bytes, H_REFCOUNT), 1);
        encode_block(ctx.geo, old.block, &entries, &mut bytes);
        return Ok((ea_inodes(&old.entries), ea_inodes(&entries)));
    }
    let freed_refs = |freed: bool| match freed {
        true => ea_inodes(&old.entries),
        false => Vec::new(),
    };
    if entries.is_empty() {
        let freed = release(ctx, ino, &old)?;
        inode.file_acl = 0;
        inode.blocks = inode.blocks.saturating_sub(block_sectors(ctx.geo));
        return Ok((freed_refs(freed), Vec::new()));
    }
    // Shared: a private copy first (allocation may fail, and then nothing
    // has changed), then drop our reference to the shared block (the last
    // one, if the other inodes dropped theirs meanwhile).
    let copy = write_new_block(ctx, ino, &entries)?;
    let freed = release(ctx, ino, &old)?;
    inode.file_acl = copy;
    Ok((freed_refs(freed), ea_inodes(&entries)))
}

/// Allocate a block near the inode's group (the kernel's goal is the
/// group's first block) and fill it with `entries`.
fn write_new_block(ctx: &mut MetaCtx, ino: u32, entries: &[Entry]) -> Result<u64> {
    debug_assert!(!entries.is_empty());
    // Nothing has changed yet (`store_block` allocates first).
    ctx.charge(1)?;
    let goal = ctx.geo.group_first_block(ctx.geo.group_of_inode(ino));
    let buffer = ctx.new_meta_block(goal)?;
    let block = buffer.block();
    {
        let mut bytes = ctx.handle.get_create_access(&buffer)?;
        encode_block(ctx.geo, block, entries, &mut bytes);
    }
    buffer.set_verified();
    Ok(block)
}

/// ext4_xattr_release_block: free the block if this was its last
/// reference (and say so), else decrement its refcount. The refcount is read under the
/// write guard: another inode may have dropped its reference since we read
/// the block.
fn release(ctx: &mut MetaCtx, ino: u32, old: &XattrBlock) -> Result<bool> {
    let location = Location::InodeBlock {
        ino,
        block: old.block,
    };
    let last_reference = {
        let mut bytes = ctx.handle.get_write_access(&old.buffer)?;
        let refcount = get_u32(&bytes, H_REFCOUNT);
        ensure_format!(refcount >= 1, location, "xattr block has refcount 0");
        if refcount > 1 {
            put_u32(&mut bytes, H_REFCOUNT, refcount - 1);
            set_block_checksum(ctx.geo, old.block, &mut bytes);
        }
        refcount == 1
    };
    if last_reference {
        ctx.free_meta_block(old.block)?;
    }
    Ok(last_reference)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::superblock::Superblock;

    fn geometry(metadata_csum: bool) -> Geometry {
        // A minimal 4 KiB-block superblock; only the fields this module
        // reads matter.
        let mut sb = vec![0u8; 1024];
        put_u16(&mut sb, 0x38, 0xEF53);
        put_u32(&mut sb, 0x4C, 1); // s_rev_level
        put_u32(&mut sb, 0x18, 2); // s_log_block_size
        put_u32(&mut sb, 0x04, 32768); // s_blocks_count_lo
        put_u32(&mut sb, 0x20, 32768); // s_blocks_per_group
        put_u32(&mut sb, 0x24, 32768); // s_clusters_per_group
        put_u32(&mut sb, 0x28, 8192); // s_inodes_per_group
        put_u32(&mut sb, 0x00, 8192); // s_inodes_count
        put_u32(&mut sb, 0x54, 11); // s_first_ino
        put_u16(&mut sb, 0x58, 256); // s_inode_size
        let mut geo = Geometry::from_superblock(&Superblock::decode(&sb).unwrap());
        if metadata_csum {
            geo.metadata_csum = true;
            geo.csum_seed = 0x5EED_5EED;
        }
        geo
    }

    fn stored(index: u8, name: &[u8], value: &[u8]) -> Entry {
        Entry {
            index,
            name: name.to_vec(),
            value: Value::Stored(value.to_vec()),
            hash: entry_hash(name, value),
        }
    }

    #[test]
    fn entry_hash_matches_a_kernel_written_block() {
        // From a block written by Linux 6.18: user.\xe9\xe8abc = 'v' * 100
        // carried e_hash 0xfe557893 (unsigned-char name hashing).
        assert_eq!(entry_hash(b"\xe9\xe8abc", &[b'v'; 100]), 0xfe55_7893);
        assert_eq!(block_hash([0xfe55_7893].into_iter()), 0xfe55_7893);
        assert_eq!(block_hash([1, 0, 2].into_iter()), 0);
    }

    #[test]
    fn signed_name_hashing_differs_only_for_high_bytes() {
        let value = 0x1234_5678u32.to_le_bytes();
        assert_eq!(
            entry_hash(b"big", &value),
            entry_hash_signed(b"big", &value)
        );
        assert_ne!(
            entry_hash(b"\xe9t\xe9", &value),
            entry_hash_signed(b"\xe9t\xe9", &value)
        );
    }

    #[test]
    fn resolves_names_like_the_vfs() {
        assert_eq!(
            resolve_name(b"user.x").unwrap(),
            (name_index::USER, &b"x"[..])
        );
        assert_eq!(
            resolve_name(b"system.posix_acl_access").unwrap(),
            (name_index::POSIX_ACL_ACCESS, &b""[..])
        );
        assert_eq!(
            resolve_name(b"gnu.t").unwrap(),
            (name_index::HURD, &b"t"[..])
        );
        assert!(matches!(resolve_name(b"user."), Err(Error::Invalid(_))));
        assert!(matches!(
            resolve_name(b"system.data"),
            Err(Error::NotSupported)
        ));
        assert!(matches!(
            resolve_name(b"system.posix_acl_accessx"),
            Err(Error::NotSupported)
        ));
        assert!(matches!(resolve_name(b"foo.bar"), Err(Error::NotSupported)));
        assert!(matches!(resolve_name(b"user.a\0b"), Err(Error::Invalid(_))));
        let long = [b"user.".as_slice(), &[b'a'; 250]].concat();
        assert!(resolve_name(&long).is_ok());
        let too_long = [b"user.".as_slice(), &[b'a'; 251]].concat();
        assert!(matches!(resolve_name(&too_long), Err(Error::Range)));
    }

    #[test]
    fn block_round_trips_and_checksums() {
        let geo = geometry(true);
        let mut entries = vec![
            stored(name_index::USER, b"b", b"1"),
            stored(name_index::USER, b"aa", &[7; 300]),
            stored(name_index::SECURITY, b"selinux", b"system_u:object_r:x\0"),
            stored(name_index::POSIX_ACL_ACCESS, b"", b""),
        ];
        entries.sort_by(|a, b| a.sort_key().cmp(&b.sort_key()));
        // Sorted by index, then name length: "b" before "aa".
        assert_eq!(entries[0].name, b"b");
        let mut bytes = vec![0u8; 4096];
        encode_block(&geo, 1234, &entries, &mut bytes);
        assert!(verify_block_checksum(&geo, 1234, &bytes));
        assert!(!verify_block_checksum(&geo, 1235, &bytes));
        let location = Location::Block { block: 1234 };
        let parsed = parse_entries(&geo, &bytes, BLOCK_HEADER_SIZE, 0, location).unwrap();
        assert_eq!(parsed, entries);
        let hashes = entries.iter().map(block_entry_hash);
        assert_eq!(get_u32(&bytes, H_HASH), block_hash(hashes));
    }

    #[test]
    fn rejects_corrupt_entry_lists() {
        let geo = geometry(false);
        let entries = vec![
            stored(name_index::USER, b"one", &[1; 40]),
            stored(name_index::USER, b"two", &[2; 40]),
        ];
        let mut good = vec![0u8; 4096];
        encode_block(&geo, 9, &entries, &mut good);
        let location = Location::Block { block: 9 };
        let parse = |bytes: &[u8]| parse_entries(&geo, bytes, BLOCK_HEADER_SIZE, 0, location);
        assert!(parse(&good).is_ok());
        let second = BLOCK_HEADER_SIZE + entry_len(3);
        let first_value = get_u16(&good, BLOCK_HEADER_SIZE + E_VALUE_OFFS);
        let mut cases: Vec<(&str, Vec<u8>)> = Vec::new();
        let mut bytes = good.clone();
        put_u16(&mut bytes, second + E_VALUE_OFFS, first_value + 4);
        cases.push(("overlapping values", bytes));
        let mut bytes = good.clone();
        put_u16(&mut bytes, BLOCK_HEADER_SIZE + E_VALUE_OFFS, 40);
        cases.push(("value over the entries", bytes));
        let mut bytes = good.clone();
        put_u32(&mut bytes, BLOCK_HEADER_SIZE + E_VALUE_SIZE, 5000);
        cases.push(("value past the end", bytes));
        let mut bytes = good.clone();
        put_u32(&mut bytes, BLOCK_HEADER_SIZE + E_VALUE_SIZE, u32::MAX);
        cases.push(("huge value", bytes));
        let mut bytes = good.clone();
        bytes[BLOCK_HEADER_SIZE + E_NAME + 1] = 0;
        cases.push(("NUL in name", bytes));
        let mut bytes = good.clone();
        bytes[second + E_NAME_INDEX] = 0;
        cases.push(("index 0", bytes));
        let mut bytes = good.clone();
        put_u32(&mut bytes, BLOCK_HEADER_SIZE + E_VALUE_INUM, 12);
        cases.push(("EA inode without the feature", bytes));
        // No end marker: entries with long names all the way to the end.
        let mut bytes = vec![0xAAu8; 4096];
        bytes[..BLOCK_HEADER_SIZE].copy_from_slice(&good[..BLOCK_HEADER_SIZE]);
        cases.push(("no end marker", bytes));
        for (what, bytes) in cases {
            let error = parse(&bytes).expect_err(what);
            assert!(error.is_corruption(), "{what}: {error}");
        }
    }

    #[test]
    fn garbage_never_panics() {
        // Bounded loops and checked offsets: arbitrary bytes parse or fail.
        let geo = geometry(false);
        let mut rng = crate::rng::Rng::new(0x1234_5678);
        for round in 0..2000 {
            let mut bytes = vec![0u8; 256];
            for byte in bytes.iter_mut() {
                let value = rng.next_u64();
                *byte = if value.is_multiple_of(3) {
                    0
                } else {
                    value as u8
                };
            }
            let first = 4 + (round % 8) * 4;
            let _ = parse_entries(&geo, &bytes, first, first, Location::Inode { ino: 1 });
        }
    }
}
