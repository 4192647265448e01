//! Inline data (INCOMPAT_INLINE_DATA): files, directories and symlinks
//! small enough to live in the inode itself.
//!
//! On disk (Documentation/filesystems/ext4/inlinedata.rst, fs/ext4/inline.c)
//! an inode with EXT4_INLINE_DATA_FL keeps its bytes in the 60 bytes of
//! `i_block`, continued in the value of the in-inode extended attribute
//! `system.data` (name index 7, name "data"; `xattr::inline_data_value`).
//! The attribute is there, possibly empty, for as long as the flag is: it
//! is what tells the kernel how much room the inode holds
//! (ext4_find_inline_data_nolock sets i_inline_size = 60 + its length). The
//! inode owns no blocks: `i_blocks` is 0 unless it has an xattr block.
//!
//! - A file's data is the first `i_size` bytes of i_block + system.data;
//!   the kernel reads min(i_size, inline size) and zeros the rest of the
//!   page (ext4_read_inline_folio).
//! - A directory keeps ".." as a bare inode number in i_block's first 4
//!   bytes (EXT4_INLINE_DOTDOT_SIZE) and no "." at all. Entries follow in
//!   the ordinary `ext4_dir_entry_2` form, in two separate regions whose
//!   rec_lens each tile their own region: i_block[4..60], then the whole
//!   system.data value (ext4_find_inline_entry searches them one after the
//!   other). There is no checksum tail: the inode checksum covers it all.
//!   `i_size` is the inline size (60 + the value's length).
//! - A symlink made by e2fsprogs (`mke2fs -d`, debugfs) whose target
//!   exceeds a fast symlink may be inline too; the kernel reads it like a
//!   file (page_get_link through the inline read).
//!
//! Readdir positions follow the kernel. On a dir_index filesystem an inline
//! directory is listed in hash order (is_dx_dir counts inline directories,
//! ext4_htree_fill_tree reads them through ext4_inlinedir_to_tree), with the
//! cookies `htree::read_given_entries` gives a single-block directory, so a
//! listing goes on where it was when the directory moves to a block.
//! Without dir_index, ext4_read_inline_dir's positions: "." at 0, ".." at
//! 12, and an entry at byte `o` of the inline bytes at `o + 20` — where the
//! conversion to a block puts it (after a 12-byte "." and a 12-byte "..").

use super::dir::{self, DirEntry, DirStats, EntryLocation, FT_DIR, FT_UNKNOWN, Format, Records};
use super::htree;
use super::inode::{I_BLOCK_SIZE, Inode, flags};
use super::superblock::{Geometry, incompat};
use super::{get_u32, mapping, put_u32, xattr};
use crate::ensure_format;
use crate::error::{Error, Location, Result};

/// inline.c EXT4_INLINE_DOTDOT_SIZE: the bytes ".." takes in an inline
/// directory (its inode number alone).
pub const DOTDOT_SIZE: usize = 4;

/// ext4_read_inline_dir: the listing position of inline byte 0, for the
/// 12-byte "." and 12-byte ".." a block directory starts with, less the
/// 4 bytes ".." takes inline.
const POSITION_SHIFT: u64 = 12 + 12 - DOTDOT_SIZE as u64;
const POSITION_DOTDOT: u64 = 12;

/// The bytes inline inode `ino` holds: `i_block`, then the value of
/// `system.data`.
pub fn stored_bytes(geo: &Geometry, ino: u32, inode: &Inode) -> Result<Vec<u8>> {
    debug_assert!(inode.has_inline_data());
    let location = Location::Inode { ino };
    ensure_format!(
        geo.has_incompat(incompat::INLINE_DATA),
        location,
        "inode has the inline data flag on a filesystem without inline_data"
    );
    let Some(value) = xattr::inline_data_value(geo, ino, inode)? else {
        return Err(Error::corrupt(
            location,
            "inode has the inline data flag but no system.data attribute",
        ));
    };
    let mut bytes = Vec::with_capacity(I_BLOCK_SIZE + value.len());
    bytes.extend_from_slice(&inode.block);
    bytes.extend_from_slice(&value);
    debug_assert_eq!(bytes.len(), I_BLOCK_SIZE + value.len());
    Ok(bytes)
}

/// Bytes `offset..end` of an inline file (`end` at most its size): past
/// what the inode stores, zeros, as the kernel reads them.
pub fn read_range(
    geo: &Geometry,
    ino: u32,
    inode: &Inode,
    offset: u64,
    end: u64,
) -> Result<Vec<u8>> {
    debug_assert!(offset <= end && end <= inode.size);
    let stored = stored_bytes(geo, ino, inode)?;
    let mut data = vec![0u8; (end - offset) as usize];
    let available = (stored.len() as u64).min(end);
    if offset < available {
        let span = (available - offset) as usize;
        data[..span].copy_from_slice(&stored[offset as usize..available as usize]);
    }
    Ok(data)
}

/// Where an inline file's data ends for SEEK_DATA / SEEK_HOLE: the kernel
/// reports one inline extent of min(inline size, i_size) bytes
/// (ext4_inline_data_iomap); the rest, if any, is a hole.
pub fn data_end(geo: &Geometry, ino: u32, inode: &Inode) -> Result<u64> {
    let stored = stored_bytes(geo, ino, inode)?;
    Ok((stored.len() as u64).min(inode.size))
}

/// The target of an inline symlink.
pub fn symlink_target(geo: &Geometry, ino: u32, inode: &Inode) -> Result<Vec<u8>> {
    let stored = stored_bytes(geo, ino, inode)?;
    let len = inode.size as usize;
    ensure_format!(
        len > 0 && len <= stored.len(),
        Location::Inode { ino },
        "inline symlink of {len} bytes in {} inline bytes",
        stored.len()
    );
    Ok(stored[..len].to_vec())
}

// ---------------------------------------------------------------------------
// Inline directories

/// The two regions of an inline directory whose records tile them, as
/// byte ranges of the inline bytes: i_block after "..", then system.data
/// (absent while its value is empty).
fn regions(bytes: &[u8]) -> impl Iterator<Item = (usize, usize)> {
    debug_assert!(bytes.len() >= I_BLOCK_SIZE);
    [(DOTDOT_SIZE, I_BLOCK_SIZE), (I_BLOCK_SIZE, bytes.len())]
        .into_iter()
        .filter(|(start, end)| start < end)
}

/// Every record of the inline directory, free ones included, each checked
/// as the kernel's ext4_check_dir_entry checks it.
fn records(fmt: &Format, bytes: &[u8]) -> Result<Vec<dir::Record>> {
    let mut found = Vec::new();
    for (start, end) in regions(bytes) {
        for record in Records::range(fmt, bytes, start, end, 0) {
            found.push(record?);
        }
    }
    Ok(found)
}

/// The inode ".." names (empty_inline_dir: 0 is "no `..'", damage).
pub(crate) fn parent(fmt: &Format, bytes: &[u8]) -> Result<u32> {
    let parent = get_u32(bytes, 0);
    ensure_format!(
        parent != 0 && parent <= fmt.inodes_count,
        Location::Inode { ino: fmt.ino },
        "inline directory names \"..\" inode {parent}"
    );
    Ok(parent)
}

fn dots(fmt: &Format, bytes: &[u8]) -> Result<(DirEntry, DirEntry)> {
    let file_type = if fmt.filetype { FT_DIR } else { FT_UNKNOWN };
    let dot = DirEntry {
        ino: fmt.ino,
        file_type,
        name: b".".to_vec(),
    };
    let dotdot = DirEntry {
        ino: parent(fmt, bytes)?,
        file_type,
        name: b"..".to_vec(),
    };
    Ok((dot, dotdot))
}

/// Find `name` ("." and ".." included); the location's offset is the
/// record's byte in the inline bytes (0 for "." and "..", which have none).
pub(crate) fn lookup(fmt: &Format, bytes: &[u8], name: &[u8]) -> Result<Option<EntryLocation>> {
    let at = |entry: &DirEntry| EntryLocation {
        ino: entry.ino,
        file_type: entry.file_type,
        lblk: 0,
        offset: 0,
    };
    if name == b"." || name == b".." {
        let (dot, dotdot) = dots(fmt, bytes)?;
        return Ok(Some(at(if name == b"." { &dot } else { &dotdot })));
    }
    let wanted = dir::Wanted::new(fmt, name);
    for record in records(fmt, bytes)? {
        if record.is_live() && wanted.matches(record.name(bytes)) {
            return Ok(Some(EntryLocation {
                ino: record.ino,
                file_type: record.file_type,
                lblk: 0,
                offset: record.offset,
            }));
        }
    }
    Ok(None)
}

/// Only ".." and free records.
pub(crate) fn is_empty(fmt: &Format, bytes: &[u8]) -> Result<bool> {
    parent(fmt, bytes)?;
    Ok(!records(fmt, bytes)?.iter().any(|record| record.is_live()))
}

/// readdir from `cookie`, with the kernel's positions (module comment).
pub(crate) fn read_entries(
    fmt: &Format,
    bytes: &[u8],
    cookie: u64,
    emit: &mut dyn FnMut(&DirEntry, u64) -> bool,
) -> Result<()> {
    let (dot, dotdot) = dots(fmt, bytes)?;
    let live: Vec<dir::Record> = records(fmt, bytes)?
        .into_iter()
        .filter(|record| record.is_live())
        .collect();
    if fmt.dir_index {
        let entries = live.iter().map(|record| record.to_entry(bytes)).collect();
        htree::read_given_entries(fmt, &dot, &dotdot, entries, cookie, emit);
        return Ok(());
    }
    if cookie == 0 && !emit(&dot, POSITION_DOTDOT) {
        return Ok(());
    }
    if cookie <= POSITION_DOTDOT && !emit(&dotdot, POSITION_SHIFT + DOTDOT_SIZE as u64) {
        return Ok(());
    }
    for record in &live {
        let position = record.offset as u64 + POSITION_SHIFT;
        let next = position + record.rec_len as u64;
        if position >= cookie && !emit(&record.to_entry(bytes), next) {
            return Ok(());
        }
    }
    Ok(())
}

/// Check the whole inline directory: ".." and every record.
pub(crate) fn check(fmt: &Format, bytes: &[u8]) -> Result<DirStats> {
    parent(fmt, bytes)?;
    let live = records(fmt, bytes)?
        .iter()
        .filter(|record| record.is_live())
        .count();
    Ok(DirStats {
        entries: live as u64 + 2,
        ..DirStats::default()
    })
}

// ---------------------------------------------------------------------------
// Writing

/// The most bytes inode `ino` can keep inline (ext4_get_max_inline_size):
/// i_block's 60 and the longest `system.data` value its body has room for
/// beside its other attributes. 0 — nothing inline — when the body has no
/// room for a value at all, as the kernel decides it: i_block alone is
/// never used, since the empty attribute is what marks the inode inline.
pub fn max_size(geo: &Geometry, ino: u32, inode: &Inode) -> Result<usize> {
    if !geo.has_incompat(incompat::INLINE_DATA) || inode.extra_isize == 0 {
        return Ok(0);
    }
    let room = xattr::inline_data_room(geo, ino, inode)?;
    Ok(if room == 0 { 0 } else { I_BLOCK_SIZE + room })
}

/// Make `bytes` the inode's inline bytes (ext4_create_inline_data and
/// ext4_update_inline_data, then ext4_write_inline_data): the first 60 in
/// i_block, the rest the value of `system.data`, which has exactly that
/// length. The inode is inline from now on (EXT4_INLINE_DATA_FL, and no
/// EXT4_EXTENTS_FL: i_block holds no extent root). `Error::NoSpace`, the
/// inode unchanged, when they do not fit (`max_size`). The caller sets
/// `i_size` and writes the inode.
pub fn store(geo: &Geometry, ino: u32, inode: &mut Inode, bytes: &[u8]) -> Result<()> {
    assert!(
        bytes.len() >= I_BLOCK_SIZE,
        "inline bytes are i_block at least"
    );
    debug_assert!(geo.has_incompat(incompat::INLINE_DATA));
    xattr::set_inline_data_value(geo, ino, inode, Some(&bytes[I_BLOCK_SIZE..]))?;
    inode.block.copy_from_slice(&bytes[..I_BLOCK_SIZE]);
    inode.flags = (inode.flags & !flags::EXTENTS) | flags::INLINE_DATA;
    Ok(())
}

/// Take the inode out of inline data (ext4_destroy_inline_data_nolock):
/// `system.data` removed, i_block cleared, and a file, directory or
/// symlink given an empty extent tree where the filesystem has extents
/// (else an empty block map). It maps nothing yet: the caller writes what
/// the inline bytes held (`stored_bytes`, read before) to a block.
pub fn destroy(geo: &Geometry, ino: u32, inode: &mut Inode) -> Result<()> {
    debug_assert!(inode.has_inline_data());
    xattr::set_inline_data_value(geo, ino, inode, None)?;
    inode.block = [0; I_BLOCK_SIZE];
    inode.flags &= !flags::INLINE_DATA;
    let mapped = inode.is_reg() || inode.is_dir() || inode.is_symlink();
    mapping::init(inode, mapped && geo.has_incompat(incompat::EXTENTS));
    debug_assert!(!inode.has_inline_data());
    Ok(())
}

/// An inline file's bytes after writing `data` at `offset`
/// (ext4_update_inline_data grows the value to the write's end, zeros
/// between): never shorter than i_block.
pub fn written(mut stored: Vec<u8>, offset: u64, data: &[u8]) -> Vec<u8> {
    let end = offset as usize + data.len();
    if stored.len() < end {
        stored.resize(end, 0);
    }
    if stored.len() < I_BLOCK_SIZE {
        stored.resize(I_BLOCK_SIZE, 0);
    }
    stored[offset as usize..end].copy_from_slice(data);
    stored
}

/// An inline file's bytes after a cut to `size` (ext4_inline_data_truncate):
/// the value shortened to what lies past i_block below `size`, the bytes of
/// i_block from `size` on zeroed. A file grown by truncation keeps its
/// bytes: reads past them are zeros.
pub fn truncated(mut stored: Vec<u8>, size: u64) -> Vec<u8> {
    let size = size as usize;
    if size < stored.len() {
        stored.truncate(size.max(I_BLOCK_SIZE));
        if size < I_BLOCK_SIZE {
            stored[size..].fill(0);
        }
    }
    stored
}

/// A new inline directory (ext4_try_create_inline_dir): ".." naming
/// `parent`, one free record over the rest of i_block, no value.
pub(crate) fn new_dir(parent: u32) -> Vec<u8> {
    let mut bytes = vec![0u8; I_BLOCK_SIZE];
    put_u32(&mut bytes, 0, parent);
    let free = (I_BLOCK_SIZE - DOTDOT_SIZE) as u16;
    bytes[DOTDOT_SIZE + 4..DOTDOT_SIZE + 6].copy_from_slice(&free.to_le_bytes());
    bytes
}

/// The region (start, end) of the inline bytes that holds offset `at`.
fn region_of(bytes: &[u8], at: usize) -> (usize, usize) {
    regions(bytes)
        .find(|&(start, end)| start <= at && at < end)
        .unwrap_or((DOTDOT_SIZE, I_BLOCK_SIZE))
}

/// Add `entry` to the inline directory `bytes` as ext4_try_add_inline_entry
/// does: into i_block's records; else, while the directory has no value
/// yet, into a value grown to `room` bytes (ext4_update_inline_dir, only
/// when that gains more than a one-byte name's record) made one free
/// record; else into the value's records. False, `bytes` unchanged, when
/// neither has room: the directory must move to a block.
pub(crate) fn add(
    fmt: &Format,
    bytes: &mut Vec<u8>,
    entry: &DirEntry,
    room: usize,
) -> Result<bool> {
    debug_assert!(bytes.len() >= I_BLOCK_SIZE);
    if let Some(at) = insert_in(fmt, bytes, DOTDOT_SIZE, I_BLOCK_SIZE, entry)? {
        debug_assert!(at < I_BLOCK_SIZE);
        return Ok(true);
    }
    if bytes.len() == I_BLOCK_SIZE {
        if room <= dir::record_len(1) {
            return Ok(false);
        }
        let mut grown = bytes.clone();
        grown.resize(I_BLOCK_SIZE + room, 0);
        let free = dir::rec_len_to_disk(room, fmt.block_size);
        grown[I_BLOCK_SIZE + 4..I_BLOCK_SIZE + 6].copy_from_slice(&free.to_le_bytes());
        if insert_in(fmt, &mut grown, I_BLOCK_SIZE, I_BLOCK_SIZE + room, entry)?.is_none() {
            return Ok(false);
        }
        *bytes = grown;
        return Ok(true);
    }
    let end = bytes.len();
    Ok(insert_in(fmt, bytes, I_BLOCK_SIZE, end, entry)?.is_some())
}

/// `entry` put into the first record of `bytes[start..end]` with room for
/// it; None when none has. Meeting the name is `Error::Exists`.
fn insert_in(
    fmt: &Format,
    bytes: &mut [u8],
    start: usize,
    end: usize,
    entry: &DirEntry,
) -> Result<Option<usize>> {
    let slot = dir::find_slot_in(fmt, bytes, start, end, 0, &entry.name)?;
    Ok(slot.map(|slot| dir::insert_record(fmt, bytes, slot, entry)))
}

/// Remove the record at `offset` (found by `lookup`): merged into the one
/// before it in its region, or freed when it opens the region
/// (ext4_delete_inline_entry, through ext4_generic_delete_entry).
pub(crate) fn remove(fmt: &Format, bytes: &mut [u8], offset: usize) -> Result<()> {
    let (start, end) = region_of(bytes, offset);
    dir::delete_record_in(fmt, bytes, start, end, 0, offset)
}

/// Point ".." at `parent`.
pub(crate) fn set_parent(bytes: &mut [u8], parent: u32) {
    put_u32(bytes, 0, parent);
}

/// The block an inline directory becomes (ext4_finish_convert_inline_dir):
/// "." and ".." of 12 bytes each, then the inline bytes past ".." as they
/// are — i_block's records, then the value's, which tile it between them —
/// the last record stretched to the end of the leaf space. So an entry at
/// inline byte `o` lands at `o + 20`, its readdir position before and
/// after. `block` is zeroed and `fmt.block_size` long; the caller adds the
/// checksum tail.
pub(crate) fn to_block(fmt: &Format, bytes: &[u8], block: &mut [u8]) -> Result<()> {
    let parent = parent(fmt, bytes)?;
    // A fault for the crash tests: the value's records left behind.
    let bytes = if crate::faults::active(crate::faults::Fault::InlineDirConvertDropsValue) {
        &bytes[..I_BLOCK_SIZE]
    } else {
        bytes
    };
    let file_type = if fmt.filetype { FT_DIR } else { FT_UNKNOWN };
    let dot_len = dir::record_len(1);
    let header = 2 * dot_len;
    debug_assert_eq!(header as u64, POSITION_SHIFT + DOTDOT_SIZE as u64);
    let dot = DirEntry {
        ino: fmt.ino,
        file_type,
        name: b".".to_vec(),
    };
    let dotdot = DirEntry {
        ino: parent,
        file_type,
        name: b"..".to_vec(),
    };
    dir::write_record(fmt, block, 0, dot_len, &dot);
    dir::write_record(fmt, block, dot_len, dot_len, &dotdot);
    let body = &bytes[DOTDOT_SIZE..];
    ensure_format!(
        header + body.len() <= fmt.leaf_space(),
        Location::Inode { ino: fmt.ino },
        "inline directory of {} bytes does not fit a block",
        bytes.len()
    );
    block[header..header + body.len()].copy_from_slice(body);
    // The last record of the copied ones takes the rest of the leaf.
    let mut last = None;
    for record in Records::range(fmt, block, header, header + body.len(), 0) {
        last = Some(record?);
    }
    let last = last.expect("i_block past \"..\" holds one record at least");
    let stretched = fmt.leaf_space() - last.offset;
    block[last.offset + 4..last.offset + 6]
        .copy_from_slice(&dir::rec_len_to_disk(stretched, fmt.block_size).to_le_bytes());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn format(dir_index: bool) -> Format {
        Format {
            block_size: 4096,
            filetype: true,
            csum: true,
            seed: 0,
            ino: 12,
            inodes_count: 100,
            dir_index,
            max_levels: 2,
            hash_unsigned: false,
            hash_seed: [0; 4],
            def_hash_version: 1,
            casefold: None,
            encrypted: false,
        }
    }

    fn record(bytes: &mut [u8], offset: usize, ino: u32, rec_len: u16, name: &[u8]) {
        put_u32(bytes, offset, ino);
        bytes[offset + 4..offset + 6].copy_from_slice(&rec_len.to_le_bytes());
        bytes[offset + 6] = name.len() as u8;
        bytes[offset + 7] = dir::FT_REG_FILE;
        bytes[offset + 8..offset + 8 + name.len()].copy_from_slice(name);
    }

    /// ".." = 2; "a" and "bb" in i_block, "ccc" in a 20-byte system.data.
    fn sample() -> Vec<u8> {
        let mut bytes = vec![0u8; I_BLOCK_SIZE + 20];
        put_u32(&mut bytes, 0, 2);
        record(&mut bytes, 4, 20, 12, b"a");
        record(&mut bytes, 16, 21, 44, b"bb");
        record(&mut bytes, 60, 22, 20, b"ccc");
        bytes
    }

    fn listing(fmt: &Format, bytes: &[u8], cookie: u64) -> Vec<(Vec<u8>, u32, u64)> {
        let mut seen = Vec::new();
        read_entries(fmt, bytes, cookie, &mut |entry, next| {
            seen.push((entry.name.clone(), entry.ino, next));
            true
        })
        .unwrap();
        seen
    }

    #[test]
    fn both_regions_are_searched() {
        let fmt = format(false);
        let bytes = sample();
        assert_eq!(parent(&fmt, &bytes).unwrap(), 2);
        for (name, ino, offset) in [(&b"a"[..], 20, 4), (b"bb", 21, 16), (b"ccc", 22, 60)] {
            let found = lookup(&fmt, &bytes, name).unwrap().unwrap();
            assert_eq!((found.ino, found.offset), (ino, offset));
        }
        assert_eq!(lookup(&fmt, &bytes, b"..").unwrap().unwrap().ino, 2);
        assert_eq!(lookup(&fmt, &bytes, b".").unwrap().unwrap().ino, 12);
        assert!(lookup(&fmt, &bytes, b"zz").unwrap().is_none());
        assert!(!is_empty(&fmt, &bytes).unwrap());
        assert_eq!(check(&fmt, &bytes).unwrap().entries, 5);
    }

    /// ext4_read_inline_dir's positions: an entry at inline byte o sits at
    /// o + 20, where converting the directory to a block puts it.
    #[test]
    fn positions_without_dir_index_are_the_kernels() {
        let fmt = format(false);
        let bytes = sample();
        let all = listing(&fmt, &bytes, 0);
        let expected: Vec<(Vec<u8>, u32, u64)> = vec![
            (b".".to_vec(), 12, 12),
            (b"..".to_vec(), 2, 24),
            (b"a".to_vec(), 20, 36),
            (b"bb".to_vec(), 21, 80),
            (b"ccc".to_vec(), 22, 100),
        ];
        assert_eq!(all, expected);
        for (at, (_, _, next)) in expected.iter().enumerate() {
            assert_eq!(listing(&fmt, &bytes, *next), expected[at + 1..]);
        }
    }

    #[test]
    fn hash_order_cookies_resume() {
        let fmt = format(true);
        let bytes = sample();
        let all = listing(&fmt, &bytes, 0);
        assert_eq!(all.len(), 5);
        assert_eq!(&all[0].0[..], b".");
        assert_eq!(&all[1].0[..], b"..");
        for (at, (_, _, next)) in all.iter().enumerate() {
            assert_eq!(listing(&fmt, &bytes, *next), all[at + 1..]);
        }
    }

    #[test]
    fn damage_is_an_error_not_a_panic() {
        let fmt = format(false);
        // A record running out of i_block into system.data.
        let mut bytes = sample();
        bytes[16 + 4..16 + 6].copy_from_slice(&48u16.to_le_bytes());
        assert!(lookup(&fmt, &bytes, b"ccc").unwrap_err().is_corruption());
        // No "..".
        let mut bytes = sample();
        put_u32(&mut bytes, 0, 0);
        assert!(parent(&fmt, &bytes).unwrap_err().is_corruption());
        assert!(is_empty(&fmt, &bytes).unwrap_err().is_corruption());
        // An entry past the inode count.
        let mut bytes = sample();
        put_u32(&mut bytes, 60, 1000);
        assert!(check(&fmt, &bytes).unwrap_err().is_corruption());
    }

    fn entry(ino: u32, name: &[u8]) -> DirEntry {
        DirEntry {
            ino,
            file_type: dir::FT_REG_FILE,
            name: name.to_vec(),
        }
    }

    fn names(fmt: &Format, bytes: &[u8]) -> Vec<Vec<u8>> {
        let mut names: Vec<Vec<u8>> = records(fmt, bytes)
            .unwrap()
            .into_iter()
            .filter(|record| record.is_live())
            .map(|record| record.name(bytes).to_vec())
            .collect();
        names.sort();
        names
    }

    /// ext4_try_add_inline_entry: i_block first, then a value grown to
    /// the whole room at once, then no room (the caller moves it).
    #[test]
    fn names_fill_i_block_then_the_value_then_nothing() {
        let fmt = format(false);
        let mut bytes = new_dir(2);
        // 56 bytes: four records of 12 (one-to-four-byte names) and 8 left.
        for (i, name) in [&b"a"[..], b"b", b"c", b"d"].iter().enumerate() {
            assert!(add(&fmt, &mut bytes, &entry(20 + i as u32, name), 68).unwrap());
            assert_eq!(bytes.len(), I_BLOCK_SIZE, "{i}: still in i_block");
        }
        assert!(add(&fmt, &mut bytes, &entry(30, b"e"), 68).unwrap());
        assert_eq!(
            bytes.len(),
            I_BLOCK_SIZE + 68,
            "the value takes all the room"
        );
        for name in [&b"f"[..], b"g", b"h", b"i"] {
            assert!(add(&fmt, &mut bytes, &entry(31, name), 68).unwrap());
        }
        // 68 bytes hold five 12-byte records: the sixth does not fit.
        let full = bytes.clone();
        assert!(!add(&fmt, &mut bytes, &entry(33, b"k"), 68).unwrap());
        assert_eq!(bytes, full, "unchanged when there is no room");
        assert_eq!(names(&fmt, &bytes).len(), 9);
        assert!(matches!(
            add(&fmt, &mut bytes, &entry(34, b"a"), 68),
            Err(Error::Exists)
        ));
        // Without a value's room (or 12 bytes of it), no value at all.
        let mut small = new_dir(2);
        for name in [&b"a"[..], b"b", b"c", b"d"] {
            assert!(add(&fmt, &mut small, &entry(20, name), 12).unwrap());
        }
        assert!(!add(&fmt, &mut small, &entry(21, b"e"), 12).unwrap());
    }

    #[test]
    fn removal_merges_within_a_region_only() {
        let fmt = format(false);
        let mut bytes = sample();
        // "ccc" opens the value's region: freed in place, rec_len kept.
        remove(&fmt, &mut bytes, 60).unwrap();
        assert_eq!(get_u32(&bytes, 60), 0);
        assert_eq!(u16::from_le_bytes([bytes[64], bytes[65]]), 20);
        // "bb" merges into "a", across nothing but its own region.
        remove(&fmt, &mut bytes, 16).unwrap();
        assert_eq!(u16::from_le_bytes([bytes[8], bytes[9]]), 56);
        assert_eq!(names(&fmt, &bytes), vec![b"a".to_vec()]);
        assert!(remove(&fmt, &mut bytes, 16).unwrap_err().is_corruption());
    }

    /// ext4_finish_convert_inline_dir: "." and "..", then the inline bytes
    /// past ".." where listing positions put them (o + 20), the last
    /// record stretched over the leaf.
    #[test]
    fn a_directory_moves_to_a_block_where_its_positions_say() {
        let fmt = format(false);
        let bytes = sample();
        let mut block = vec![0u8; fmt.block_size];
        to_block(&fmt, &bytes, &mut block).unwrap();
        let records: Vec<dir::Record> = Records::leaf(&fmt, &block, 0)
            .map(|record| record.unwrap())
            .collect();
        let at: Vec<(usize, u32, Vec<u8>)> = records
            .iter()
            .map(|record| (record.offset, record.ino, record.name(&block).to_vec()))
            .collect();
        assert_eq!(
            at,
            vec![
                (0, 12, b".".to_vec()),
                (12, 2, b"..".to_vec()),
                (24, 20, b"a".to_vec()),
                (36, 21, b"bb".to_vec()),
                (80, 22, b"ccc".to_vec()),
            ]
        );
        let last = records.last().unwrap();
        assert_eq!(last.offset + last.rec_len, fmt.leaf_space());
    }

    #[test]
    fn file_bytes_grow_to_the_write_and_shrink_to_the_cut() {
        let stored = written(vec![0; I_BLOCK_SIZE], 0, b"hello");
        assert_eq!(stored.len(), I_BLOCK_SIZE);
        let stored = written(stored, 70, b"xyz");
        assert_eq!(stored.len(), 73);
        assert_eq!(&stored[..5], b"hello");
        assert_eq!(&stored[70..], b"xyz");
        assert!(stored[5..70].iter().all(|&byte| byte == 0));
        let cut = truncated(stored.clone(), 65);
        assert_eq!(cut.len(), 65);
        let cut = truncated(cut, 3);
        assert_eq!(cut.len(), I_BLOCK_SIZE);
        assert_eq!(&cut[..3], b"hel");
        assert!(cut[3..].iter().all(|&byte| byte == 0));
        // Growing leaves the bytes: reads past them are zeros.
        assert_eq!(truncated(stored.clone(), 500), stored);
    }

    #[test]
    fn a_fresh_directory_is_empty() {
        // ext4_try_create_inline_dir: "..", then one free record over the
        // rest of i_block.
        let fmt = format(false);
        let mut bytes = vec![0u8; I_BLOCK_SIZE];
        put_u32(&mut bytes, 0, 2);
        bytes[8..10].copy_from_slice(&56u16.to_le_bytes());
        assert!(is_empty(&fmt, &bytes).unwrap());
        assert_eq!(listing(&fmt, &bytes, 0).len(), 2);
    }
}
