//! Directories: entry blocks, and the operations every directory supports
//! (lookup, add, remove, replace, readdir, "." and "..").
//!
//! On disk (ext4.h `ext4_dir_entry_2`, Documentation/filesystems/ext4/
//! directory.rst) a directory is a file of blocks; each block is a chain of
//! records
//!
//! ```text
//!   inode u32 | rec_len u16 | name_len u8 | file_type u8 | name, padded to 4
//! ```
//!
//! whose `rec_len`s tile the block exactly. A record with inode 0 is free
//! space; a live record may carry slack after its name, which is where new
//! entries go. Without the `filetype` feature the file_type byte is the high
//! byte of a 16-bit name_len that is always zero (names are at most 255
//! bytes), so we read only the low byte and write zero there.
//!
//! With metadata_csum every leaf block ends in a 12-byte fake record (inode 0,
//! rec_len 12, name_len 0, file_type 0xDE) whose last word is the raw CRC32C,
//! seeded with the directory inode's seed, of the block before the tail.
//!
//! Indexed (htree) directories keep these leaf blocks and add index blocks;
//! `htree.rs` owns those. This module dispatches to it when the directory has
//! the INDEX flag on a filesystem with dir_index, like the kernel's `is_dx()`.
//!
//! Errors locate damage as `InodeBlock { ino: directory, block: logical
//! block }`, the numbers the kernel prints for directory errors.
//!
//! In a casefolded directory (flag CASEFOLD on a `casefold` filesystem)
//! names are matched and hashed by their folded forms (`casefold`): a
//! lookup of "README" finds "ReadMe", adding it is EEXIST, and the htree
//! orders names by the hash of their folded bytes.
//!
//! Adding, removing and replacing a name reports the change to the handle
//! (`Handle::note`: LINK and UNLINK for fast commits); "." and ".." of a new
//! directory are not names of their own there (replay makes them).

use super::casefold::{self, Encoding};
use super::csum::crc32c_raw;
use super::htree;
use super::inline;
use super::inode::{
    I_BLOCK_SIZE, S_IFBLK, S_IFCHR, S_IFDIR, S_IFIFO, S_IFLNK, S_IFMT, S_IFREG, S_IFSOCK,
};
use super::superblock::{Geometry, compat, incompat};
use super::{get_u16, get_u32, put_u16, put_u32};
use crate::cache::{Buffer, BufferCache};
use crate::ensure_format;
use crate::error::{Error, Location, Result};
use crate::journal::Handle;
use crate::journal::change::{Change, Ineligible};
use std::borrow::Cow;
use std::sync::Arc;

// ext4.h: EXT4_FT_*, the directory entry file types.
pub const FT_UNKNOWN: u8 = 0;
pub const FT_REG_FILE: u8 = 1;
pub const FT_DIR: u8 = 2;
pub const FT_CHRDEV: u8 = 3;
pub const FT_BLKDEV: u8 = 4;
pub const FT_FIFO: u8 = 5;
pub const FT_SOCK: u8 = 6;
pub const FT_SYMLINK: u8 = 7;
/// file_type of the checksum tail record.
pub const FT_DIR_CSUM: u8 = 0xDE;

/// ext4.h EXT4_NAME_LEN: the longest name a directory entry holds (its
/// name_len is one byte), which is also POSIX NAME_MAX and statfs's
/// f_namelen.
pub const NAME_MAX: usize = 255;
/// inode, rec_len, name_len, file_type.
const RECORD_HEADER_LEN: usize = 8;
/// ext4_dir_entry_tail: the checksum record at the end of a leaf block.
pub(crate) const TAIL_LEN: usize = 12;
/// ext4_check_dir_entry: no record is shorter than one holding a 1-byte name.
const RECORD_LEN_MIN: usize = 12;

/// How the filesystem layer gives this module a directory's blocks.
pub trait DirBlocks {
    fn geo(&self) -> &Geometry;
    fn cache(&self) -> &BufferCache;
    fn dir_ino(&self) -> u32;
    /// The directory inode's checksum seed (inode.csum_seed(geo, ino)).
    fn csum_seed(&self) -> u32;
    /// Number of blocks (i_size / block_size).
    fn block_count(&self) -> u64;
    fn read_block(&mut self, lblk: u64) -> Result<Arc<Buffer>>;
    /// Allocate and map a new block at the end of the directory, grow i_size; returns (lblk, buffer)
    /// with zeroed content in the transaction (already get_create_access'ed by the implementor).
    fn append_block(&mut self, handle: &Handle<'_>) -> Result<(u64, Arc<Buffer>)>;
    /// Mapping blocks (extent-tree or indirect) that appending `blocks`
    /// blocks may allocate besides the blocks themselves (space budget).
    fn append_cost(&mut self, blocks: u32) -> Result<u64>;
    /// The inode's INDEX (htree) flag.
    fn is_indexed(&self) -> bool;
    /// The inode's CASEFOLD flag (names matched and hashed folded where
    /// the filesystem has the casefold feature).
    fn is_casefolded(&self) -> bool;
    /// The inode's ENCRYPT flag: its names are fscrypt ciphertext.
    fn is_encrypted(&self) -> bool;
    fn set_indexed(&mut self, indexed: bool);
    /// Whether this mount found the directory's htree index damaged: then
    /// its leaves are read linearly, and nothing is added through it.
    fn index_damaged(&self) -> bool;
    /// The index failed a check (`why`): remember it for this mount and
    /// say so once.
    fn note_index_damaged(&mut self, why: &Error);
    /// A listing left out `bad` and went on (`BadEntry`): the caller
    /// reports it once the listing is done.
    fn note_bad_entry(&mut self, bad: BadEntry);
    /// Where the names of this directory with a damaged index lie, if
    /// this mount has worked it out (`htree::find_in_leaves`).
    fn leaf_ranges(&self) -> Option<Arc<htree::LeafRanges>>;
    /// Keep `ranges` for the directory's later lookups (within the
    /// mount's bound).
    fn keep_leaf_ranges(&mut self, ranges: Arc<htree::LeafRanges>);
    /// An inline directory's bytes (`format::inline`: i_block, then the
    /// system.data value); `None` for a directory of blocks.
    fn inline_bytes(&self) -> Result<Option<Vec<u8>>> {
        Ok(None)
    }
    /// The most bytes the directory may keep inline (`inline::max_size`):
    /// 0 where nothing may be.
    fn inline_max(&self) -> Result<usize> {
        Ok(0)
    }
    /// Make `bytes` the directory's inline bytes, and its size
    /// (`inline::store`).
    fn store_inline(&mut self, _bytes: &[u8]) -> Result<()> {
        Err(Error::NotSupported)
    }
    /// Take the directory out of inline data (`inline::destroy`): it maps
    /// nothing and its size is 0, for `append_block` to give it block 0.
    fn destroy_inline(&mut self) -> Result<()> {
        Err(Error::NotSupported)
    }
}

/// What a listing leaves out instead of failing: one bad entry must not
/// hide the rest of its directory (the kernel's readdir reports it and
/// goes on with the next block).
#[derive(Debug)]
pub enum BadEntry {
    /// A record that fails the kernel's checks (`__ext4_check_dir_entry`:
    /// an inode past the inode count, a live record without a name):
    /// corruption, but no name is lost with it (e2fsck and debugfs do not
    /// list it either).
    Corrupt(Error),
    /// Names that could not be read: a leaf that fails its checksum, or
    /// the rest of a block after a record whose length cannot be trusted
    /// (ext4_readdir skips the same): corruption, and the listing is short.
    Lost(Error),
    /// A name no listing may carry: one with a '/' (the VFS refuses it,
    /// `verify_dirent_name`, and so does FUSE's `parse_dirfile`).
    UnlistableName { location: Location, offset: usize },
}

/// One directory entry as readdir reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DirEntry {
    pub ino: u32,
    /// `FT_*`; always `FT_UNKNOWN` without the filetype feature.
    pub file_type: u8,
    pub name: Vec<u8>,
}

/// Where an entry lives: logical block and byte offset of its record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EntryLocation {
    pub ino: u32,
    pub file_type: u8,
    pub lblk: u64,
    pub offset: usize,
}

/// What `check` found in a directory that passed every structural test.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DirStats {
    pub blocks: u64,
    /// Live entries, "." and ".." included.
    pub entries: u64,
    /// Htree only: index blocks (root included), leaves, and index levels
    /// (1 + indirect_levels); all zero for a linear directory.
    pub index_blocks: u64,
    pub leaves: u64,
    pub levels: u32,
}

/// The per-directory facts every record operation needs, copied out of the
/// geometry once per call.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Format {
    pub block_size: usize,
    pub filetype: bool,
    pub csum: bool,
    pub seed: u32,
    pub ino: u32,
    pub inodes_count: u32,
    pub dir_index: bool,
    /// ext4_dir_htree_level: index levels allowed (root included).
    pub max_levels: usize,
    pub hash_unsigned: bool,
    pub hash_seed: [u32; 4],
    pub def_hash_version: u8,
    /// A casefolded directory's encoding: None for the others (and for
    /// an encrypted one, whose names are matched as ciphertext without
    /// the key).
    pub casefold: Option<Encoding>,
    /// An encrypted directory: names are ciphertext, any byte included.
    pub encrypted: bool,
}

impl Format {
    pub fn of(d: &dyn DirBlocks) -> Self {
        let geo = d.geo();
        Format {
            block_size: geo.block_size as usize,
            filetype: geo.has_incompat(incompat::FILETYPE),
            csum: geo.metadata_csum,
            seed: d.csum_seed(),
            ino: d.dir_ino(),
            inodes_count: geo.inodes_count,
            dir_index: geo.has_compat(compat::DIR_INDEX),
            max_levels: if geo.has_incompat(incompat::LARGEDIR) {
                3
            } else {
                2
            },
            hash_unsigned: geo.hash_unsigned,
            hash_seed: geo.hash_seed,
            def_hash_version: geo.def_hash_version,
            casefold: geo
                .encoding
                .filter(|_| d.is_casefolded() && !d.is_encrypted()),
            encrypted: d.is_encrypted(),
        }
    }

    /// Bytes of a leaf block that records may tile: all but the checksum tail.
    pub fn leaf_space(&self) -> usize {
        if self.csum {
            self.block_size - TAIL_LEN
        } else {
            self.block_size
        }
    }

    pub fn location(&self, lblk: u64) -> Location {
        Location::InodeBlock {
            ino: self.ino,
            block: lblk,
        }
    }
}

/// The htree code is used only for INDEX-flagged directories on a filesystem
/// with dir_index (the kernel's `is_dx()`); elsewhere the flag is ignored.
pub(crate) fn uses_htree(d: &dyn DirBlocks, fmt: &Format) -> bool {
    fmt.dir_index && d.is_indexed()
}

// ---------------------------------------------------------------------------
// Records

/// ext4_dir_rec_len: the smallest record holding a name of `name_len` bytes.
pub(crate) fn record_len(name_len: usize) -> usize {
    (RECORD_HEADER_LEN + name_len + 3) & !3
}

/// ext4_rec_len_from_disk: 65536-byte blocks cannot store their own size in
/// 16 bits, so there the low two bits carry bits 16-17 and 65535 (or 0)
/// means the whole block. Smaller blocks store the length as is.
pub(crate) fn rec_len_from_disk(raw: u16, block_size: usize) -> usize {
    if block_size < 65536 {
        return raw as usize;
    }
    if raw == u16::MAX || raw == 0 {
        return block_size;
    }
    (raw as usize & 0xFFFC) | ((raw as usize & 3) << 16)
}

/// ext4_rec_len_to_disk, the inverse of `rec_len_from_disk`.
pub(crate) fn rec_len_to_disk(len: usize, block_size: usize) -> u16 {
    debug_assert!(len <= block_size && len.is_multiple_of(4), "rec_len {len}");
    if len < 65536 {
        len as u16
    } else {
        debug_assert_eq!(len, block_size);
        u16::MAX
    }
}

/// One record of a leaf block, validated.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Record {
    pub offset: usize,
    pub rec_len: usize,
    pub ino: u32,
    pub name_len: usize,
    pub file_type: u8,
}

impl Record {
    pub fn name<'b>(&self, block: &'b [u8]) -> &'b [u8] {
        let start = self.offset + RECORD_HEADER_LEN;
        &block[start..start + self.name_len]
    }

    pub fn is_live(&self) -> bool {
        self.ino != 0
    }

    /// Bytes of this record that a new entry may take.
    pub fn free_space(&self) -> usize {
        if self.is_live() {
            self.rec_len - record_len(self.name_len)
        } else {
            self.rec_len
        }
    }

    pub fn to_entry(self, block: &[u8]) -> DirEntry {
        DirEntry {
            ino: self.ino,
            file_type: self.file_type,
            name: self.name(block).to_vec(),
        }
    }
}

/// Decode and check the record at `offset` of a region ending at `end`,
/// with the kernel's `__ext4_check_dir_entry` rules.
fn parse_record(
    fmt: &Format,
    block: &[u8],
    offset: usize,
    end: usize,
    lblk: u64,
) -> std::result::Result<Record, RecordError> {
    let location = fmt.location(lblk);
    ensure_format!(
        offset + RECORD_HEADER_LEN <= end,
        location,
        "directory record at {offset} crosses the end of the block"
    );
    let ino = get_u32(block, offset);
    let rec_len = rec_len_from_disk(get_u16(block, offset + 4), fmt.block_size);
    let name_len = block[offset + 6] as usize;
    let file_type = if fmt.filetype { block[offset + 7] } else { 0 };
    ensure_format!(
        rec_len >= RECORD_LEN_MIN && rec_len.is_multiple_of(4),
        location,
        "bad rec_len {rec_len} at {offset}"
    );
    ensure_format!(
        rec_len >= record_len(name_len),
        location,
        "rec_len {rec_len} too small for name_len {name_len} at {offset}"
    );
    let next = offset + rec_len;
    ensure_format!(
        next <= end && (next == end || next + RECORD_LEN_MIN <= end),
        location,
        "record at {offset} (rec_len {rec_len}) overruns the block"
    );
    let record = Record {
        offset,
        rec_len,
        ino,
        name_len,
        file_type,
    };
    check_record_content(fmt, &record, lblk)
        .map_err(|error| RecordError::Content(record, error))?;
    Ok(record)
}

/// What a record names, once its frame (length, place) is sound.
fn check_record_content(fmt: &Format, record: &Record, lblk: u64) -> Result<()> {
    let (offset, ino) = (record.offset, record.ino);
    ensure_format!(
        ino <= fmt.inodes_count,
        fmt.location(lblk),
        "record at {offset} names inode {ino} beyond the inode count"
    );
    ensure_format!(
        ino == 0 || record.name_len > 0,
        fmt.location(lblk),
        "record at {offset} has inode {ino} and an empty name"
    );
    Ok(())
}

/// Why `parse_record` refused a record: its frame (the walk cannot go on
/// in this block), or only its content (the walk can step over it).
enum RecordError {
    Frame(Error),
    Content(Record, Error),
}

impl From<Error> for RecordError {
    fn from(error: Error) -> Self {
        RecordError::Frame(error)
    }
}

impl From<RecordError> for Error {
    fn from(error: RecordError) -> Self {
        match error {
            RecordError::Frame(error) | RecordError::Content(_, error) => error,
        }
    }
}

/// The live records a listing shows from `block[start..end]`: a record
/// whose content is bad is left out and the walk goes on; one whose frame
/// is bad ends the block's part. What was left out goes to `bad`.
pub(crate) fn listed_records(
    fmt: &Format,
    block: &[u8],
    start: usize,
    end: usize,
    lblk: u64,
    bad: &mut Vec<BadEntry>,
) -> Vec<Record> {
    let mut records = Vec::new();
    let mut offset = start;
    while offset < end {
        match parse_record(fmt, block, offset, end, lblk) {
            Ok(record) => {
                offset += record.rec_len;
                if !record.is_live() {
                    continue;
                }
                // Ciphertext may hold any byte; a front end shows it in
                // its no-key form.
                if !fmt.encrypted && record.name(block).contains(&b'/') {
                    bad.push(BadEntry::UnlistableName {
                        location: fmt.location(lblk),
                        offset: record.offset,
                    });
                    continue;
                }
                records.push(record);
            }
            Err(RecordError::Content(record, error)) => {
                bad.push(BadEntry::Corrupt(error));
                offset += record.rec_len;
            }
            Err(RecordError::Frame(error)) => {
                bad.push(BadEntry::Lost(error));
                break;
            }
        }
    }
    records
}

/// A leaf for a listing: one that fails its checksum is left out (and
/// reported through `d`) rather than failing the listing.
pub(crate) fn read_listed_leaf(
    d: &mut dyn DirBlocks,
    fmt: &Format,
    lblk: u64,
) -> Result<Option<Arc<Buffer>>> {
    match read_leaf(d, fmt, lblk) {
        Ok(buffer) => Ok(Some(buffer)),
        Err(error) if error.is_corruption() => {
            d.note_bad_entry(BadEntry::Lost(error));
            Ok(None)
        }
        Err(error) => Err(error),
    }
}

/// The live entries of leaf `lblk` for a listing (see `listed_records`),
/// with the byte offset just past each record.
pub(crate) fn listed_leaf(
    d: &mut dyn DirBlocks,
    fmt: &Format,
    lblk: u64,
    start: usize,
) -> Result<Vec<(DirEntry, usize)>> {
    let Some(buffer) = read_listed_leaf(d, fmt, lblk)? else {
        return Ok(Vec::new());
    };
    let mut bad = Vec::new();
    let entries = {
        let block = buffer.read();
        listed_records(fmt, &block, start, fmt.leaf_space(), lblk, &mut bad)
            .into_iter()
            .map(|record| (record.to_entry(&block), record.offset + record.rec_len))
            .collect()
    };
    for bad in bad {
        d.note_bad_entry(bad);
    }
    Ok(entries)
}

/// The records of `block[start..end]`, each validated; stops after the
/// first bad one. Every record is at least 12 bytes, so the walk is bounded
/// by the block size.
pub(crate) struct Records<'b> {
    fmt: &'b Format,
    block: &'b [u8],
    offset: usize,
    end: usize,
    lblk: u64,
    failed: bool,
}

impl<'b> Records<'b> {
    /// The records of a leaf block (the checksum tail excluded).
    pub fn leaf(fmt: &'b Format, block: &'b [u8], lblk: u64) -> Self {
        Self::range(fmt, block, 0, fmt.leaf_space(), lblk)
    }

    pub fn range(fmt: &'b Format, block: &'b [u8], start: usize, end: usize, lblk: u64) -> Self {
        debug_assert!(end <= block.len());
        Records {
            fmt,
            block,
            offset: start,
            end,
            lblk,
            failed: false,
        }
    }
}

impl Iterator for Records<'_> {
    type Item = Result<Record>;

    fn next(&mut self) -> Option<Result<Record>> {
        if self.failed || self.offset >= self.end {
            return None;
        }
        match parse_record(self.fmt, self.block, self.offset, self.end, self.lblk) {
            Ok(record) => {
                debug_assert!(record.rec_len > 0);
                self.offset += record.rec_len;
                Some(Ok(record))
            }
            Err(error) => {
                self.failed = true;
                Some(Err(error.into()))
            }
        }
    }
}

/// Write one record: header, name, zeroed padding up to the name's record
/// length (the rest of `rec_len` is slack and left as is).
pub(crate) fn write_record(
    fmt: &Format,
    block: &mut [u8],
    offset: usize,
    rec_len: usize,
    entry: &DirEntry,
) {
    let name_len = entry.name.len();
    debug_assert!(name_len <= NAME_MAX && rec_len >= record_len(name_len));
    debug_assert!(offset + rec_len <= fmt.block_size);
    put_u32(block, offset, entry.ino);
    put_u16(block, offset + 4, rec_len_to_disk(rec_len, fmt.block_size));
    block[offset + 6] = name_len as u8;
    block[offset + 7] = if fmt.filetype { entry.file_type } else { 0 };
    let name_start = offset + RECORD_HEADER_LEN;
    block[name_start..name_start + name_len].copy_from_slice(&entry.name);
    block[name_start + name_len..offset + record_len(name_len)].fill(0);
}

fn set_rec_len(fmt: &Format, block: &mut [u8], offset: usize, rec_len: usize) {
    put_u16(block, offset + 4, rec_len_to_disk(rec_len, fmt.block_size));
}

// ---------------------------------------------------------------------------
// Leaf block checksums (ext4_dirblock_csum_verify / _set)

fn leaf_tail_present(fmt: &Format, block: &[u8]) -> bool {
    let tail = fmt.block_size - TAIL_LEN;
    get_u32(block, tail) == 0
        && rec_len_from_disk(get_u16(block, tail + 4), fmt.block_size) == TAIL_LEN
        && block[tail + 6] == 0
        && block[tail + 7] == FT_DIR_CSUM
}

fn leaf_checksum(fmt: &Format, block: &[u8]) -> u32 {
    crc32c_raw(fmt.seed, &block[..fmt.block_size - TAIL_LEN])
}

pub(crate) fn verify_leaf_csum(fmt: &Format, block: &[u8], lblk: u64) -> Result<()> {
    if !fmt.csum {
        return Ok(());
    }
    let location = fmt.location(lblk);
    ensure_format!(
        leaf_tail_present(fmt, block),
        location,
        "directory leaf has no checksum tail"
    );
    let stored = get_u32(block, fmt.block_size - 4);
    let computed = leaf_checksum(fmt, block);
    ensure_format!(
        stored == computed,
        location,
        "directory leaf checksum {stored:#010x} != computed {computed:#010x}"
    );
    Ok(())
}

/// Write the tail record and its checksum (metadata_csum only).
fn set_leaf_tail(fmt: &Format, block: &mut [u8]) {
    if !fmt.csum {
        return;
    }
    let tail = fmt.block_size - TAIL_LEN;
    block[tail..].fill(0);
    put_u16(block, tail + 4, rec_len_to_disk(TAIL_LEN, fmt.block_size));
    block[tail + 7] = FT_DIR_CSUM;
    let checksum = leaf_checksum(fmt, block);
    put_u32(block, fmt.block_size - 4, checksum);
}

/// Read a block that must exist (below i_size).
pub(crate) fn read_dir_block(
    d: &mut dyn DirBlocks,
    fmt: &Format,
    lblk: u64,
) -> Result<Arc<Buffer>> {
    let blocks = d.block_count();
    ensure_format!(
        lblk < blocks,
        fmt.location(lblk),
        "directory block beyond i_size ({blocks} blocks)"
    );
    let buffer = d.read_block(lblk)?;
    debug_assert_eq!(buffer.read().len(), fmt.block_size);
    Ok(buffer)
}

/// Read a leaf block, verifying its checksum the first time it is seen.
pub(crate) fn read_leaf(d: &mut dyn DirBlocks, fmt: &Format, lblk: u64) -> Result<Arc<Buffer>> {
    let buffer = read_dir_block(d, fmt, lblk)?;
    if fmt.csum && !buffer.is_verified() {
        verify_leaf_csum(fmt, &buffer.read(), lblk)?;
        buffer.set_verified();
    }
    Ok(buffer)
}

/// Change a leaf block inside the handle, then re-checksum it. `change`
/// validates before it writes, so an error leaves the bytes consistent.
pub(crate) fn modify_leaf<R>(
    handle: &Handle<'_>,
    fmt: &Format,
    buffer: &Arc<Buffer>,
    change: impl FnOnce(&mut [u8]) -> Result<R>,
) -> Result<R> {
    let result = {
        let mut guard = handle.get_write_access(buffer)?;
        let result = change(&mut guard);
        set_leaf_tail(fmt, &mut guard);
        result
    };
    buffer.set_verified();
    result
}

// ---------------------------------------------------------------------------
// Leaf block operations on bytes

/// A name looked for among a directory's records: in a casefolded
/// directory, any record whose name folds alike is it (ext4_match).
pub(crate) struct Wanted<'n> {
    name: &'n [u8],
    /// casefold: the name folded, None if it does not fold.
    folded: Option<Vec<u8>>,
    casefold: bool,
}

impl<'n> Wanted<'n> {
    pub fn new(fmt: &Format, name: &'n [u8]) -> Self {
        let casefold = fmt.casefold.is_some();
        Wanted {
            name,
            folded: if casefold { casefold::fold(name) } else { None },
            casefold,
        }
    }

    pub fn matches(&self, stored: &[u8]) -> bool {
        if self.casefold {
            casefold::matches(stored, self.name, self.folded.as_deref())
        } else {
            stored == self.name
        }
    }
}

/// The live record named `name`, if any.
pub(crate) fn find_name(
    fmt: &Format,
    block: &[u8],
    lblk: u64,
    name: &[u8],
) -> Result<Option<Record>> {
    let wanted = Wanted::new(fmt, name);
    for record in Records::leaf(fmt, block, lblk) {
        let record = record?;
        if record.is_live() && wanted.matches(record.name(block)) {
            return Ok(Some(record));
        }
    }
    Ok(None)
}

/// ext4_find_dest_de: the first record with room for a name of `name_len`
/// bytes. Meeting the name itself on the way is `Error::Exists`.
pub(crate) fn find_slot(
    fmt: &Format,
    block: &[u8],
    lblk: u64,
    name: &[u8],
) -> Result<Option<Record>> {
    find_slot_in(fmt, block, 0, fmt.leaf_space(), lblk, name)
}

/// `find_slot` among the records tiling `block[start..end]` (a leaf, or a
/// region of an inline directory).
pub(crate) fn find_slot_in(
    fmt: &Format,
    block: &[u8],
    start: usize,
    end: usize,
    lblk: u64,
    name: &[u8],
) -> Result<Option<Record>> {
    let needed = record_len(name.len());
    let wanted = Wanted::new(fmt, name);
    for record in Records::range(fmt, block, start, end, lblk) {
        let record = record?;
        if record.is_live() && wanted.matches(record.name(block)) {
            return Err(Error::Exists);
        }
        if record.free_space() >= needed {
            return Ok(Some(record));
        }
    }
    Ok(None)
}

/// ext4_insert_dentry: put `entry` into `slot` (found by `find_slot`),
/// splitting off a live record's slack. Returns the new record's offset.
pub(crate) fn insert_record(
    fmt: &Format,
    block: &mut [u8],
    slot: Record,
    entry: &DirEntry,
) -> usize {
    debug_assert!(slot.free_space() >= record_len(entry.name.len()));
    if slot.is_live() {
        let used = record_len(slot.name_len);
        set_rec_len(fmt, block, slot.offset, used);
        write_record(fmt, block, slot.offset + used, slot.rec_len - used, entry);
        slot.offset + used
    } else {
        write_record(fmt, block, slot.offset, slot.rec_len, entry);
        slot.offset
    }
}

/// ext4_generic_delete_entry: merge the record at `offset` into the previous
/// one, or mark it free when it is the first of the block.
pub(crate) fn delete_record(
    fmt: &Format,
    block: &mut [u8],
    lblk: u64,
    offset: usize,
) -> Result<()> {
    delete_record_in(fmt, block, 0, fmt.leaf_space(), lblk, offset)
}

/// `delete_record` among the records tiling `block[start..end]`.
pub(crate) fn delete_record_in(
    fmt: &Format,
    block: &mut [u8],
    start: usize,
    end: usize,
    lblk: u64,
    offset: usize,
) -> Result<()> {
    let mut previous: Option<Record> = None;
    let mut found = None;
    for record in Records::range(fmt, block, start, end, lblk) {
        let record = record?;
        if record.offset == offset {
            found = Some(record);
            break;
        }
        previous = Some(record);
    }
    let record = found.ok_or_else(|| {
        Error::corrupt(
            fmt.location(lblk),
            format!("no directory record at {offset}"),
        )
    })?;
    match previous {
        Some(previous) => {
            set_rec_len(
                fmt,
                block,
                previous.offset,
                previous.rec_len + record.rec_len,
            );
            block[record.offset..record.offset + record.rec_len].fill(0);
        }
        None => {
            put_u32(block, record.offset, 0);
            block[record.offset + 6..record.offset + record.rec_len].fill(0);
        }
    }
    Ok(())
}

/// Rewrite a leaf block with `entries` packed from the start, the last
/// record taking the rest of the space. False (block untouched) if they do
/// not fit.
pub(crate) fn write_packed_leaf(fmt: &Format, block: &mut [u8], entries: &[&DirEntry]) -> bool {
    let total: usize = entries.iter().map(|e| record_len(e.name.len())).sum();
    if total > fmt.leaf_space() {
        return false;
    }
    block.fill(0);
    if entries.is_empty() {
        put_u16(block, 4, rec_len_to_disk(fmt.leaf_space(), fmt.block_size));
        return true;
    }
    let mut offset = 0;
    for (index, entry) in entries.iter().enumerate() {
        let rec_len = if index + 1 == entries.len() {
            fmt.leaf_space() - offset
        } else {
            record_len(entry.name.len())
        };
        write_record(fmt, block, offset, rec_len, entry);
        offset += rec_len;
    }
    debug_assert_eq!(offset, fmt.leaf_space());
    true
}

/// The "." and ".." records that open block 0, linear or htree root.
pub(crate) fn dot_records(fmt: &Format, block: &[u8], root: bool) -> Result<(Record, Record)> {
    let location = fmt.location(0);
    let end = if root {
        fmt.block_size
    } else {
        fmt.leaf_space()
    };
    let mut records = Records::range(fmt, block, 0, end, 0);
    let dot = records
        .next()
        .ok_or_else(|| Error::corrupt(location, "empty first directory block"))??;
    ensure_format!(
        dot.name(block) == b"." && dot.is_live(),
        location,
        "first directory record is not \".\""
    );
    let dotdot = records
        .next()
        .ok_or_else(|| Error::corrupt(location, "no \"..\" record"))??;
    ensure_format!(
        dotdot.name(block) == b".." && dotdot.is_live(),
        location,
        "second directory record is not \"..\""
    );
    Ok((dot, dotdot))
}

// ---------------------------------------------------------------------------
// Public operations

fn check_name(name: &[u8]) -> Result<()> {
    if name.is_empty() {
        return Err(Error::Invalid("empty file name".into()));
    }
    if name.len() > NAME_MAX {
        return Err(Error::NameTooLong);
    }
    Ok(())
}

/// A casefolded directory in strict mode holds only names that are UTF-8:
/// the kernel refuses others in lookups and adds alike (EINVAL).
fn check_encoded_name(fmt: &Format, name: &[u8]) -> Result<()> {
    match fmt.casefold {
        Some(encoding) if !encoding.allows(name) => Err(Error::Invalid(format!(
            "name {:?} is not valid UTF-8, which a strict casefolded directory requires",
            String::from_utf8_lossy(name)
        ))),
        _ => Ok(()),
    }
}

/// The name a change at `location`, found by `name`, is noted under: the
/// name as stored, which in a casefolded directory may be spelled
/// otherwise than the name it was found by.
fn noted_name<'n>(
    d: &mut dyn DirBlocks,
    fmt: &Format,
    location: &EntryLocation,
    name: &'n [u8],
) -> Result<Cow<'n, [u8]>> {
    if fmt.casefold.is_none() {
        return Ok(Cow::Borrowed(name));
    }
    let name_at = |bytes: &[u8]| -> Option<Vec<u8>> {
        let len = *bytes.get(location.offset + 6)? as usize;
        let start = location.offset + RECORD_HEADER_LEN;
        bytes.get(start..start + len).map(<[u8]>::to_vec)
    };
    let stored = match d.inline_bytes()? {
        Some(bytes) => name_at(&bytes),
        None => name_at(&read_leaf(d, fmt, location.lblk)?.read()),
    };
    stored
        .map(Cow::Owned)
        .ok_or_else(|| Error::corrupt(fmt.location(location.lblk), "entry past its block"))
}

fn is_dot_or_dotdot(name: &[u8]) -> bool {
    name == b"." || name == b".."
}

/// Find `name`.
pub fn lookup(d: &mut dyn DirBlocks, name: &[u8]) -> Result<Option<EntryLocation>> {
    check_name(name)?;
    let fmt = Format::of(d);
    check_encoded_name(&fmt, name)?;
    if let Some(bytes) = d.inline_bytes()? {
        return inline::lookup(&fmt, &bytes, name);
    }
    if uses_htree(d, &fmt) {
        // "." and ".." live only in the root; the index never leads to them.
        if is_dot_or_dotdot(name) {
            return lookup_dots(d, &fmt, name);
        }
        // Through the index first, even a damaged one: a name it leads to
        // is a name on disk, and most paths of a damaged index are still
        // good (a search of every leaf per lookup would make a walk of the
        // directory quadratic). A trusted index that does not find the
        // name is believed, as the kernel believes it.
        match htree::lookup(d, &fmt, name) {
            Ok(Some(found)) => return Ok(Some(found)),
            Ok(None) if !d.index_damaged() => return Ok(None),
            Ok(None) => {}
            Err(error) if error.is_corruption() => d.note_index_damaged(&error),
            Err(error) => return Err(error),
        }
        // ext4_find_entry: a bad index (ERR_BAD_DX_DIR) falls back to a
        // linear search of the leaves.
        return htree::find_in_leaves(d, &fmt, name);
    }
    for lblk in 0..d.block_count() {
        let buffer = read_leaf(d, &fmt, lblk)?;
        let block = buffer.read();
        if let Some(record) = find_name(&fmt, &block, lblk, name)? {
            return Ok(Some(location_of(&record, lblk)));
        }
    }
    Ok(None)
}

fn location_of(record: &Record, lblk: u64) -> EntryLocation {
    EntryLocation {
        ino: record.ino,
        file_type: record.file_type,
        lblk,
        offset: record.offset,
    }
}

fn lookup_dots(d: &mut dyn DirBlocks, fmt: &Format, name: &[u8]) -> Result<Option<EntryLocation>> {
    let buffer = read_block0(d, fmt)?;
    let block = buffer.read();
    let (dot, dotdot) = dot_records(fmt, &block, uses_htree(d, fmt))?;
    let record = if name == b"." { dot } else { dotdot };
    Ok(Some(location_of(&record, 0)))
}

/// Add an entry (caller checked it does not exist). Uses free space in
/// existing blocks; a full single-block directory becomes an htree when the
/// filesystem has dir_index (the kernel's make_indexed_dir); otherwise a
/// block is appended.
pub fn add_entry(
    d: &mut dyn DirBlocks,
    handle: &Handle<'_>,
    name: &[u8],
    ino: u32,
    file_type: u8,
) -> Result<()> {
    check_name(name)?;
    let fmt = Format::of(d);
    check_encoded_name(&fmt, name)?;
    debug_assert!(ino != 0 && ino <= fmt.inodes_count, "entry for inode {ino}");
    let entry = DirEntry {
        ino,
        file_type: if fmt.filetype { file_type } else { FT_UNKNOWN },
        name: name.to_vec(),
    };
    match d.inline_bytes()? {
        Some(bytes) => add_inline(d, handle, &fmt, bytes, &entry)?,
        None => insert_entry(d, handle, &fmt, &entry)?,
    }
    handle.note(Change::Link {
        parent: d.dir_ino(),
        ino,
        name,
        dir: file_type == FT_DIR,
    });
    Ok(())
}

/// Add `entry` to an inline directory: in the inode while it has room
/// (`inline::add`), else after moving the directory to a block.
fn add_inline(
    d: &mut dyn DirBlocks,
    handle: &Handle<'_>,
    fmt: &Format,
    mut bytes: Vec<u8>,
    entry: &DirEntry,
) -> Result<()> {
    if inline::add(fmt, &mut bytes, entry, inline_room(d)?)? {
        return d.store_inline(&bytes);
    }
    convert_inline(d, handle, fmt, &bytes)?;
    insert_entry(d, handle, fmt, entry)
}

/// The bytes an inline directory's `system.data` value may grow to.
fn inline_room(d: &dyn DirBlocks) -> Result<usize> {
    Ok(d.inline_max()?.saturating_sub(I_BLOCK_SIZE))
}

/// Move an inline directory to a block of its own
/// (ext4_convert_inline_dir_to_block), in the caller's transaction: the
/// inode loses its inline bytes in the same commit that logs the block
/// holding them. The block is worked out before anything changes.
fn convert_inline(
    d: &mut dyn DirBlocks,
    handle: &Handle<'_>,
    fmt: &Format,
    bytes: &[u8],
) -> Result<()> {
    let mut converted = vec![0u8; fmt.block_size];
    inline::to_block(fmt, bytes, &mut converted)?;
    d.destroy_inline()?;
    debug_assert_eq!(d.block_count(), 0);
    let (lblk, buffer) = d.append_block(handle)?;
    debug_assert_eq!(lblk, 0);
    modify_leaf(handle, fmt, &buffer, |block| {
        block.copy_from_slice(&converted);
        Ok(())
    })
}

/// Put `entry` in free space of an existing block, turn a full
/// single-block directory into an htree, or append a block.
fn insert_entry(
    d: &mut dyn DirBlocks,
    handle: &Handle<'_>,
    fmt: &Format,
    entry: &DirEntry,
) -> Result<()> {
    if uses_htree(d, fmt) {
        refuse_damaged_index(d, fmt)?;
        if !d.index_damaged() {
            return htree::add(d, handle, fmt, entry);
        }
        // Without checksums the kernel gives up a damaged index and goes
        // on with the directory as a linear one (ext4_add_entry's
        // dx_fallback): the root's ".." and the interior nodes read as
        // records with free space, which is what a linear directory is.
        d.set_indexed(false);
        handle.note(Change::Ineligible(Ineligible::DirAttributes));
    }
    let blocks = d.block_count();
    for lblk in 0..blocks {
        let buffer = read_leaf(d, fmt, lblk)?;
        let slot = find_slot(fmt, &buffer.read(), lblk, &entry.name)?;
        if let Some(slot) = slot {
            modify_leaf(handle, fmt, &buffer, |block| {
                insert_record(fmt, block, slot, entry);
                Ok(())
            })?;
            return Ok(());
        }
        if blocks == 1 && fmt.dir_index && !d.is_indexed() {
            return htree::make_indexed(d, handle, fmt, buffer, entry);
        }
    }
    let (lblk, buffer) = d.append_block(handle)?;
    debug_assert_eq!(lblk, blocks);
    modify_leaf(handle, fmt, &buffer, |block| {
        let fitted = write_packed_leaf(fmt, block, &[entry]);
        debug_assert!(fitted);
        Ok(())
    })
}

/// The most blocks one `add_entry` appends to the directory: a leaf plus
/// one index block per level it splits or adds (at most the level count),
/// or two when a block becomes an htree (a leaf for the old names and one
/// from splitting it).
pub fn add_entry_max_new_blocks(geo: &Geometry) -> u32 {
    let levels = if geo.has_incompat(incompat::LARGEDIR) {
        3
    } else {
        2
    };
    1 + levels
}

/// What `add_entry` of `name` may allocate, for the space budget: the
/// blocks it would append (none when a leaf has room for the name, as
/// `insert_entry` and `htree::add` decide it) and the mapping blocks
/// behind them. Reads only; an operation charges this before its first
/// change, so that a full volume fails it whole.
pub fn add_entry_cost(d: &mut dyn DirBlocks, name: &[u8]) -> Result<u64> {
    check_name(name)?;
    let fmt = Format::of(d);
    if let Some(mut bytes) = d.inline_bytes()? {
        // A stand-in entry: only the name's length decides where it goes.
        let entry = DirEntry {
            ino: fmt.ino,
            file_type: FT_UNKNOWN,
            name: name.to_vec(),
        };
        // Moved to a block, the directory maps that one block from an
        // empty root in i_block: no mapping block behind it.
        return Ok(if inline::add(&fmt, &mut bytes, &entry, inline_room(d)?)? {
            0
        } else {
            1
        });
    }
    let blocks = if uses_htree(d, &fmt) && !d.index_damaged() {
        htree::add_new_blocks(d, &fmt, name)?
    } else {
        linear_add_new_blocks(d, &fmt, name)?
    };
    debug_assert!(blocks <= add_entry_max_new_blocks(d.geo()));
    if blocks == 0 {
        return Ok(0);
    }
    Ok(blocks as u64 + d.append_cost(blocks)?)
}

/// A name goes into an htree through its index: into a damaged one it
/// could land in a leaf no lookup reaches. The kernel refuses then too
/// ("Directory has corrupted htree index", EFSCORRUPTED) on metadata_csum
/// filesystems, whose index blocks cannot pass for checksummed leaves;
/// without checksums the directory turns linear (`insert_entry`).
fn refuse_damaged_index(d: &dyn DirBlocks, fmt: &Format) -> Result<()> {
    if !uses_htree(d, fmt) || !fmt.csum {
        return Ok(());
    }
    if d.index_damaged() {
        return Err(Error::corrupt(
            fmt.location(0),
            "directory has a damaged htree index (e2fsck -fD rebuilds it)",
        ));
    }
    Ok(())
}

/// Whether a name may be added to the directory, as far as this mount
/// knows the directory: callers ask before they change anything, so that
/// a refusal leaves nothing to undo.
pub fn check_addable(d: &dyn DirBlocks) -> Result<()> {
    refuse_damaged_index(d, &Format::of(d))
}

/// `insert_entry`'s choice for a linear directory, without the change.
fn linear_add_new_blocks(d: &mut dyn DirBlocks, fmt: &Format, name: &[u8]) -> Result<u32> {
    let blocks = d.block_count();
    for lblk in 0..blocks {
        let buffer = read_leaf(d, fmt, lblk)?;
        if find_slot(fmt, &buffer.read(), lblk, name)?.is_some() {
            return Ok(0);
        }
        if blocks == 1 && fmt.dir_index && !d.is_indexed() {
            return htree::make_indexed_new_blocks(fmt, &buffer.read(), name);
        }
    }
    Ok(1)
}

/// The most directory blocks one `add_entry` changes, new ones included:
/// the leaf, every index block on its path, and the new blocks. For journal
/// credits (the inode, its block map and the allocator's blocks are the fs
/// layer's to count).
pub fn add_entry_max_dirtied_blocks(geo: &Geometry) -> u32 {
    let levels = if geo.has_incompat(incompat::LARGEDIR) {
        3
    } else {
        2
    };
    1 + levels + add_entry_max_new_blocks(geo)
}

/// Remove an entry; returns what it pointed to. `Error::NotFound` if absent.
pub fn remove_entry(
    d: &mut dyn DirBlocks,
    handle: &Handle<'_>,
    name: &[u8],
) -> Result<EntryLocation> {
    check_name(name)?;
    if is_dot_or_dotdot(name) {
        return Err(Error::Invalid("cannot remove \".\" or \"..\"".into()));
    }
    let fmt = Format::of(d);
    let location = lookup(d, name)?.ok_or(Error::NotFound)?;
    let name = &*noted_name(d, &fmt, &location, name)?;
    if let Some(mut bytes) = d.inline_bytes()? {
        inline::remove(&fmt, &mut bytes, location.offset)?;
        d.store_inline(&bytes)?;
    } else {
        let buffer = read_leaf(d, &fmt, location.lblk)?;
        modify_leaf(handle, &fmt, &buffer, |block| {
            delete_record(&fmt, block, location.lblk, location.offset)
        })?;
    }
    handle.note(Change::Unlink {
        parent: d.dir_ino(),
        ino: location.ino,
        name,
        dir: location.file_type == FT_DIR,
    });
    Ok(location)
}

/// Point an existing entry at another inode (rename over). Returns the old target.
pub fn replace_entry(
    d: &mut dyn DirBlocks,
    handle: &Handle<'_>,
    name: &[u8],
    ino: u32,
    file_type: u8,
) -> Result<EntryLocation> {
    check_name(name)?;
    if is_dot_or_dotdot(name) {
        return Err(Error::Invalid("replace \"..\" with set_parent".into()));
    }
    let fmt = Format::of(d);
    debug_assert!(ino != 0 && ino <= fmt.inodes_count);
    let location = lookup(d, name)?.ok_or(Error::NotFound)?;
    let name = &*noted_name(d, &fmt, &location, name)?;
    let repoint = |block: &mut [u8]| {
        put_u32(block, location.offset, ino);
        block[location.offset + 7] = if fmt.filetype { file_type } else { 0 };
    };
    if let Some(mut bytes) = d.inline_bytes()? {
        repoint(&mut bytes);
        d.store_inline(&bytes)?;
    } else {
        let buffer = read_leaf(d, &fmt, location.lblk)?;
        modify_leaf(handle, &fmt, &buffer, |block| {
            repoint(block);
            Ok(())
        })?;
    }
    let parent = d.dir_ino();
    handle.note(Change::Unlink {
        parent,
        ino: location.ino,
        name,
        dir: location.file_type == FT_DIR,
    });
    handle.note(Change::Link {
        parent,
        ino,
        name,
        dir: file_type == FT_DIR,
    });
    Ok(location)
}

/// A new directory's "." and "..": in the inode where the filesystem
/// keeps small directories inline and the inode has room
/// (ext4_try_create_inline_dir), else in a first block (appended via
/// d.append_block).
pub fn init_dir(
    d: &mut dyn DirBlocks,
    handle: &Handle<'_>,
    self_ino: u32,
    parent_ino: u32,
) -> Result<()> {
    let fmt = Format::of(d);
    if d.block_count() != 0 {
        return Err(Error::Invalid("directory already has blocks".into()));
    }
    debug_assert!(
        d.inline_bytes()?.is_none(),
        "a new directory is not inline yet"
    );
    if d.inline_max()? >= I_BLOCK_SIZE {
        return d.store_inline(&inline::new_dir(parent_ino));
    }
    let (lblk, buffer) = d.append_block(handle)?;
    debug_assert_eq!(lblk, 0);
    let file_type = if fmt.filetype { FT_DIR } else { FT_UNKNOWN };
    let dot = DirEntry {
        ino: self_ino,
        file_type,
        name: b".".to_vec(),
    };
    let dotdot = DirEntry {
        ino: parent_ino,
        file_type,
        name: b"..".to_vec(),
    };
    modify_leaf(handle, &fmt, &buffer, |block| {
        let fitted = write_packed_leaf(&fmt, block, &[&dot, &dotdot]);
        debug_assert!(fitted);
        Ok(())
    })
}

/// Block 0, verified as an htree root or as a leaf.
/// Block 0, for its "." and "..": checked as the htree root while the
/// index is trusted; once it is not, only the two records are (the kernel
/// finds them in block 0 without the index, too).
pub(crate) fn read_block0(d: &mut dyn DirBlocks, fmt: &Format) -> Result<Arc<Buffer>> {
    if !uses_htree(d, fmt) {
        return read_leaf(d, fmt, 0);
    }
    if !d.index_damaged() {
        match htree::read_root(d, fmt) {
            Err(error) if error.is_corruption() => d.note_index_damaged(&error),
            root => return root,
        }
    }
    read_dir_block(d, fmt, 0)
}

/// The inode ".." names.
pub fn parent(d: &mut dyn DirBlocks) -> Result<u32> {
    let fmt = Format::of(d);
    if let Some(bytes) = d.inline_bytes()? {
        return inline::parent(&fmt, &bytes);
    }
    let buffer = read_block0(d, &fmt)?;
    let block = buffer.read();
    let (_, dotdot) = dot_records(&fmt, &block, uses_htree(d, &fmt))?;
    Ok(dotdot.ino)
}

/// Point ".." at `parent_ino`: the directory moved to another parent,
/// which fast commits cannot express (`EXT4_FC_REASON_RENAME_DIR`).
pub fn set_parent(d: &mut dyn DirBlocks, handle: &Handle<'_>, parent_ino: u32) -> Result<()> {
    handle.note(Change::Ineligible(Ineligible::RenameDir));
    let fmt = Format::of(d);
    debug_assert!(parent_ino != 0 && parent_ino <= fmt.inodes_count);
    if let Some(mut bytes) = d.inline_bytes()? {
        inline::parent(&fmt, &bytes)?;
        inline::set_parent(&mut bytes, parent_ino);
        return d.store_inline(&bytes);
    }
    let buffer = read_block0(d, &fmt)?;
    let indexed = uses_htree(d, &fmt);
    let (_, dotdot) = dot_records(&fmt, &buffer.read(), indexed)?;
    if indexed {
        return htree::set_root_parent(handle, &fmt, &buffer, dotdot.offset, parent_ino);
    }
    modify_leaf(handle, &fmt, &buffer, |block| {
        put_u32(block, dotdot.offset, parent_ino);
        Ok(())
    })
}

/// Only "." and ".." remain.
pub fn is_empty(d: &mut dyn DirBlocks) -> Result<bool> {
    let fmt = Format::of(d);
    if let Some(bytes) = d.inline_bytes()? {
        return inline::is_empty(&fmt, &bytes);
    }
    let indexed = uses_htree(d, &fmt);
    let buffer = read_block0(d, &fmt)?;
    if !indexed {
        let block = buffer.read();
        let (_, dotdot) = dot_records(&fmt, &block, false)?;
        let start = dotdot.offset + dotdot.rec_len;
        for record in Records::range(&fmt, &block, start, fmt.leaf_space(), 0) {
            if record?.is_live() {
                return Ok(false);
            }
        }
    }
    for lblk in 1..d.block_count() {
        if indexed && htree::is_index_node(d, &fmt, lblk)? {
            continue;
        }
        let buffer = read_leaf(d, &fmt, lblk)?;
        let block = buffer.read();
        for record in Records::leaf(&fmt, &block, lblk) {
            if record?.is_live() {
                return Ok(false);
            }
        }
    }
    Ok(true)
}

/// The hasher whose hashes the kernel's listing of this directory gives
/// its entries, where it lists in hash order (an indexed directory, or
/// one block on a dir_index filesystem: `is_dx_dir`); None where it lists
/// in block order, with hashes of 0. fscrypt's no-key names carry them.
pub(crate) fn listing_hasher(d: &mut dyn DirBlocks) -> Result<Option<htree::Hasher>> {
    let fmt = Format::of(d);
    let hash_order = fmt.dir_index
        && (uses_htree(d, &fmt) || d.block_count() == 1 || d.inline_bytes()?.is_some());
    Ok(hash_order.then(|| htree::listing_hasher(d, &fmt)))
}

/// readdir from `cookie` (0 = start): calls `emit(entry, next_cookie)` until
/// it returns false or the directory ends.
///
/// `emit` returning false means it could not take this entry (the caller's
/// buffer is full, as fuser's `ReplyDirectory::add` reports): the listing
/// stops, and resuming from the previous entry's `next_cookie` offers it
/// again.
///
/// Cookies stay valid while the directory changes. Multi-block linear
/// directories use byte positions (records never move there). Htree
/// directories, and single-block directories on a dir_index filesystem
/// (which may become htrees between two calls, like the kernel's
/// `is_dx_dir`), use hash positions: "." and ".." first, then entries in hash
/// order; see `htree::read_entries`.
pub fn read_entries(
    d: &mut dyn DirBlocks,
    cookie: u64,
    emit: &mut dyn FnMut(&DirEntry, u64) -> bool,
) -> Result<()> {
    let fmt = Format::of(d);
    if let Some(bytes) = d.inline_bytes()? {
        return inline::read_entries(&fmt, &bytes, cookie, emit);
    }
    if uses_htree(d, &fmt) || (fmt.dir_index && d.block_count() == 1) {
        return htree::read_entries(d, &fmt, cookie, emit);
    }
    let block_size = fmt.block_size as u64;
    let mut lblk = cookie / block_size;
    let mut start = (cookie % block_size) as usize;
    while lblk < d.block_count() {
        // Copied out first: `emit` runs without the buffer lock.
        for (entry, end) in listed_leaf(d, &fmt, lblk, start)? {
            if !emit(&entry, lblk * block_size + end as u64) {
                return Ok(());
            }
        }
        lblk += 1;
        start = 0;
    }
    Ok(())
}

/// Walk the whole directory and check every structure, checksums
/// recomputed even for cached blocks (what e2fsck pass 2 would object to).
pub fn check(d: &mut dyn DirBlocks) -> Result<DirStats> {
    let fmt = Format::of(d);
    if let Some(bytes) = d.inline_bytes()? {
        return inline::check(&fmt, &bytes);
    }
    if uses_htree(d, &fmt) {
        return htree::check(d, &fmt);
    }
    let mut stats = DirStats {
        blocks: d.block_count(),
        ..DirStats::default()
    };
    for lblk in 0..d.block_count() {
        let buffer = read_dir_block(d, &fmt, lblk)?;
        let block = buffer.read();
        verify_leaf_csum(&fmt, &block, lblk)?;
        if lblk == 0 {
            dot_records(&fmt, &block, false)?;
        }
        for record in Records::leaf(&fmt, &block, lblk) {
            stats.entries += record?.is_live() as u64;
        }
    }
    Ok(stats)
}

/// ext4_type_by_mode: the entry file type for an inode mode.
pub fn file_type_from_mode(mode: u16) -> u8 {
    match mode & S_IFMT {
        S_IFREG => FT_REG_FILE,
        S_IFDIR => FT_DIR,
        S_IFCHR => FT_CHRDEV,
        S_IFBLK => FT_BLKDEV,
        S_IFIFO => FT_FIFO,
        S_IFSOCK => FT_SOCK,
        S_IFLNK => FT_SYMLINK,
        _ => FT_UNKNOWN,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn format(block_size: usize, csum: bool) -> Format {
        Format {
            block_size,
            filetype: true,
            csum,
            seed: 7,
            ino: 12,
            inodes_count: 1000,
            dir_index: true,
            max_levels: 2,
            hash_unsigned: false,
            hash_seed: [0; 4],
            def_hash_version: 1,
            casefold: None,
            encrypted: false,
        }
    }

    fn entry(name: &str, ino: u32) -> DirEntry {
        DirEntry {
            ino,
            file_type: FT_REG_FILE,
            name: name.as_bytes().to_vec(),
        }
    }

    #[test]
    fn rec_len_encoding_of_64k_blocks() {
        for len in [12, 4096, 65532] {
            assert_eq!(rec_len_from_disk(rec_len_to_disk(len, 65536), 65536), len);
        }
        assert_eq!(rec_len_to_disk(65536, 65536), u16::MAX);
        assert_eq!(rec_len_from_disk(u16::MAX, 65536), 65536);
        assert_eq!(rec_len_from_disk(0, 65536), 65536);
        // Smaller blocks store the length itself; 0 stays invalid there.
        assert_eq!(rec_len_from_disk(0, 4096), 0);
        // A whole-block empty record in a 64 KiB block parses.
        let fmt = format(65536, false);
        let mut block = vec![0u8; 65536];
        assert!(write_packed_leaf(&fmt, &mut block, &[]));
        let records: Vec<_> = Records::leaf(&fmt, &block, 0)
            .collect::<Result<_>>()
            .unwrap();
        assert_eq!((records.len(), records[0].rec_len), (1, 65536));
    }

    #[test]
    fn insert_splits_slack_and_delete_merges_backwards() {
        let fmt = format(1024, true);
        let mut block = vec![0u8; 1024];
        assert!(write_packed_leaf(
            &fmt,
            &mut block,
            &[&entry("a", 20), &entry("bb", 21)]
        ));
        let slot = find_slot(&fmt, &block, 0, b"ccc").unwrap().unwrap();
        assert_eq!(slot.offset, 12); // "bb" carries the slack
        let at = insert_record(&fmt, &mut block, slot, &entry("ccc", 22));
        assert_eq!(at, 24);
        assert!(matches!(
            find_slot(&fmt, &block, 0, b"bb"),
            Err(Error::Exists)
        ));
        delete_record(&fmt, &mut block, 0, 12).unwrap();
        let records: Vec<_> = Records::leaf(&fmt, &block, 0)
            .collect::<Result<_>>()
            .unwrap();
        let shape: Vec<_> = records
            .iter()
            .map(|r| (r.offset, r.rec_len, r.ino))
            .collect();
        assert_eq!(shape, vec![(0, 24, 20), (24, 1024 - 12 - 24, 22)]);
        // Deleting the first record keeps it as free space.
        delete_record(&fmt, &mut block, 0, 0).unwrap();
        let first = Records::leaf(&fmt, &block, 0).next().unwrap().unwrap();
        assert_eq!((first.ino, first.rec_len, first.name_len), (0, 24, 0));
        set_leaf_tail(&fmt, &mut block);
        verify_leaf_csum(&fmt, &block, 0).unwrap();
        block[30] ^= 1;
        assert!(
            verify_leaf_csum(&fmt, &block, 0)
                .unwrap_err()
                .is_corruption()
        );
    }

    #[test]
    fn bad_records_are_corruption() {
        let fmt = format(1024, false);
        let good = |block: &mut Vec<u8>| {
            block.fill(0);
            assert!(write_packed_leaf(
                &fmt,
                block,
                &[&entry("name", 20), &entry("x", 21)]
            ));
        };
        let mut block = vec![0u8; 1024];
        type Damage = fn(&mut [u8]);
        let cases: [(&str, Damage); 6] = [
            ("rec_len not a multiple of 4", |b| b[4] = 14),
            ("rec_len below 12", |b| b[4] = 8),
            ("name longer than the record", |b| b[6] = 200),
            ("record overruns the block", |b| put_u16(b, 16, 1020)),
            ("inode beyond the inode count", |b| put_u32(b, 0, 5000)),
            ("live record without a name", |b| b[6] = 0),
        ];
        for (what, damage) in cases {
            good(&mut block);
            damage(&mut block);
            let result: Result<Vec<_>> = Records::leaf(&fmt, &block, 3).collect();
            let error = result.expect_err(what);
            assert!(
                matches!(
                    error,
                    Error::Corrupt {
                        location: Location::InodeBlock { ino: 12, block: 3 },
                        ..
                    }
                ),
                "{what}: {error}"
            );
        }
    }

    #[test]
    fn file_types_from_modes() {
        assert_eq!(file_type_from_mode(0o100644), FT_REG_FILE);
        assert_eq!(file_type_from_mode(0o040755), FT_DIR);
        assert_eq!(file_type_from_mode(0o120777), FT_SYMLINK);
        assert_eq!(file_type_from_mode(0o020600), FT_CHRDEV);
        assert_eq!(file_type_from_mode(0o060600), FT_BLKDEV);
        assert_eq!(file_type_from_mode(0o010600), FT_FIFO);
        assert_eq!(file_type_from_mode(0o140600), FT_SOCK);
        assert_eq!(file_type_from_mode(0), FT_UNKNOWN);
    }
}
