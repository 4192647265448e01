//! Quota files (RO_COMPAT_QUOTA): the usage and limits of each user,
//! group or project, in the "quota tree" format version 2, revision 1, as
//! the kernel's quota_v2.c and quota_tree.c and e2fsprogs' quotaio_v2.c
//! and quotaio_tree.c lay it out. ext4 keeps each type's file in a hidden
//! inode the superblock names (`s_usr_quota_inum`, `s_grp_quota_inum`,
//! `s_prj_quota_inum`).
//!
//! The file is a sequence of 1 KiB quota blocks, whatever the filesystem's
//! block size:
//! - block 0: the header (magic of the type, version 1) and, from byte 8,
//!   the info: block and inode grace times, flags, the file's length in
//!   quota blocks, the head of the free-block list and of the list of
//!   data blocks with a free entry;
//! - block 1: the root of a radix tree of depth 4 over the id's bytes,
//!   most significant first; each tree block holds 256 little-endian
//!   block numbers (0: none);
//! - data blocks, which the tree's last level points at: a 16-byte header
//!   (next and previous block with a free entry, entry count) and 14
//!   entries of 72 bytes: id, limits, the inodes and bytes in use, grace
//!   deadlines. An entry whose bytes are all zero is free, so an entry
//!   that would be all zeros (id 0, nothing used, no limits) carries an
//!   inode grace time of 1 (v2r1_mem2diskdqblk).
//!
//! Space is counted in bytes, limits in 1 KiB quota blocks. This module
//! parses and writes those structures; the filesystem layer reads and
//! writes the file's blocks (journaled, through `QuotaBlocks`) and keeps
//! the counts right.

use super::{get_u16, get_u32, get_u64, put_u16, put_u32, put_u64};
use crate::ensure_format;
use crate::error::{Error, Location, Result};

/// Bytes of a quota block (QT_BLKSIZE).
pub const QUOTA_BLOCK: usize = 1024;
/// The tree's root block (QT_TREEOFF).
const TREE_ROOT: u32 = 1;
/// Levels of the tree (QT_TREEDEPTH).
const TREE_DEPTH: usize = 4;
/// Block numbers in a tree block.
const REFS_PER_BLOCK: usize = QUOTA_BLOCK / 4;
/// qt_disk_dqdbheader.
const DATA_HEADER: usize = 16;
/// v2r1_disk_dqblk.
pub const ENTRY_SIZE: usize = 72;
/// Entries of a data block (qtree_dqstr_in_blk).
const ENTRIES_PER_BLOCK: usize = (QUOTA_BLOCK - DATA_HEADER) / ENTRY_SIZE;
/// Where the info starts in block 0 (V2_DQINFOOFF).
const INFO_OFFSET: usize = 8;
/// The format revision ext4 uses (V2_VERSION_R1: 64-bit counters).
const VERSION: u32 = 1;

/// One quota type: each has a file and a magic of its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum QuotaType {
    User = 0,
    Group = 1,
    Project = 2,
}

impl QuotaType {
    pub const ALL: [QuotaType; 3] = [QuotaType::User, QuotaType::Group, QuotaType::Project];

    /// V2_INITQMAGICS.
    fn magic(self) -> u32 {
        match self {
            QuotaType::User => 0xd9c0_1f11,
            QuotaType::Group => 0xd9c0_1927,
            QuotaType::Project => 0xd9c0_3f14,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            QuotaType::User => "user",
            QuotaType::Group => "group",
            QuotaType::Project => "project",
        }
    }
}

/// The file's info (v2_disk_dqinfo).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Info {
    pub block_grace: u32,
    pub inode_grace: u32,
    pub flags: u32,
    /// The file's length in quota blocks.
    pub blocks: u32,
    /// Head of the list of unused blocks.
    pub free_block: u32,
    /// Head of the list of data blocks with a free entry.
    pub free_entry: u32,
}

/// One id's usage and limits (v2r1_disk_dqblk), in memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Dquot {
    pub id: u32,
    pub inode_hard: u64,
    pub inode_soft: u64,
    pub inodes: u64,
    /// Limits in 1 KiB quota blocks.
    pub space_hard: u64,
    pub space_soft: u64,
    /// Bytes in use.
    pub space: u64,
    pub block_time: u64,
    pub inode_time: u64,
}

impl Dquot {
    pub fn decode(bytes: &[u8]) -> Dquot {
        debug_assert_eq!(bytes.len(), ENTRY_SIZE);
        // v2r1_disk2memdqblk: the all-zero entry `encode` marked with an
        // inode grace time of 1 reads back as all zeros.
        let marked = get_u64(bytes, 64) == 1 && bytes[..64].iter().all(|&byte| byte == 0);
        if marked {
            return Dquot::default();
        }
        Dquot {
            id: get_u32(bytes, 0),
            inode_hard: get_u64(bytes, 8),
            inode_soft: get_u64(bytes, 16),
            inodes: get_u64(bytes, 24),
            space_hard: get_u64(bytes, 32),
            space_soft: get_u64(bytes, 40),
            space: get_u64(bytes, 48),
            block_time: get_u64(bytes, 56),
            inode_time: get_u64(bytes, 64),
        }
    }

    pub fn encode(&self, bytes: &mut [u8]) {
        debug_assert_eq!(bytes.len(), ENTRY_SIZE);
        bytes.fill(0);
        put_u32(bytes, 0, self.id);
        put_u64(bytes, 8, self.inode_hard);
        put_u64(bytes, 16, self.inode_soft);
        put_u64(bytes, 24, self.inodes);
        put_u64(bytes, 32, self.space_hard);
        put_u64(bytes, 40, self.space_soft);
        put_u64(bytes, 48, self.space);
        put_u64(bytes, 56, self.block_time);
        put_u64(bytes, 64, self.inode_time);
        // v2r1_mem2diskdqblk: an entry must never read as free.
        if bytes.iter().all(|&byte| byte == 0) {
            put_u64(bytes, 64, 1);
        }
    }
}

/// How this module reaches a quota file: by 1 KiB quota block. Reads past
/// the file's end are zeros; a write there grows it (the caller maps the
/// filesystem blocks it needs).
pub trait QuotaBlocks {
    /// The quota inode, for messages.
    fn ino(&self) -> u32;
    fn read(&mut self, block: u32) -> Result<[u8; QUOTA_BLOCK]>;
    fn write(&mut self, block: u32, bytes: &[u8; QUOTA_BLOCK]) -> Result<()>;
}

fn location(file: &dyn QuotaBlocks) -> Location {
    Location::Inode { ino: file.ino() }
}

/// The header and info of a quota file of type `qtype`, checked.
pub fn read_info(file: &mut dyn QuotaBlocks, qtype: QuotaType) -> Result<Info> {
    let block = file.read(0)?;
    ensure_format!(
        get_u32(&block, 0) == qtype.magic() && get_u32(&block, 4) == VERSION,
        location(file),
        "{} quota file has magic {:#x}, version {} (not the v2r1 format)",
        qtype.name(),
        get_u32(&block, 0),
        get_u32(&block, 4)
    );
    let at = INFO_OFFSET;
    let info = Info {
        block_grace: get_u32(&block, at),
        inode_grace: get_u32(&block, at + 4),
        flags: get_u32(&block, at + 8),
        blocks: get_u32(&block, at + 12),
        free_block: get_u32(&block, at + 16),
        free_entry: get_u32(&block, at + 20),
    };
    ensure_format!(
        info.blocks > TREE_ROOT && info.free_block < info.blocks && info.free_entry < info.blocks,
        location(file),
        "{} quota file info names blocks past its {} blocks",
        qtype.name(),
        info.blocks
    );
    Ok(info)
}

/// Write `info` back into block 0.
pub fn write_info(file: &mut dyn QuotaBlocks, info: &Info) -> Result<()> {
    let mut block = file.read(0)?;
    let at = INFO_OFFSET;
    put_u32(&mut block, at, info.block_grace);
    put_u32(&mut block, at + 4, info.inode_grace);
    put_u32(&mut block, at + 8, info.flags);
    put_u32(&mut block, at + 12, info.blocks);
    put_u32(&mut block, at + 16, info.free_block);
    put_u32(&mut block, at + 20, info.free_entry);
    file.write(0, &block)
}

/// The tree's index of `id` at `depth` (get_index).
fn index(id: u32, depth: usize) -> usize {
    ((id >> ((TREE_DEPTH - depth - 1) * 8)) & 0xff) as usize
}

/// A block number the file holds, or corruption.
fn checked(ino: u32, info: &Info, block: u32) -> Result<u32> {
    ensure_format!(
        block < info.blocks,
        Location::Inode { ino },
        "quota tree names block {block} of a file of {} blocks",
        info.blocks
    );
    Ok(block)
}

/// The byte offset in the file of `id`'s entry, if it has one.
pub fn find(file: &mut dyn QuotaBlocks, info: &Info, id: u32) -> Result<Option<u64>> {
    let mut block = TREE_ROOT;
    for depth in 0..TREE_DEPTH {
        let tree = file.read(block)?;
        let next = get_u32(&tree, index(id, depth) * 4);
        if next == 0 {
            return Ok(None);
        }
        block = checked(file.ino(), info, next)?;
    }
    let data = file.read(block)?;
    for slot in 0..ENTRIES_PER_BLOCK {
        let at = DATA_HEADER + slot * ENTRY_SIZE;
        let entry = &data[at..at + ENTRY_SIZE];
        if entry.iter().any(|&byte| byte != 0) && get_u32(entry, 0) == id {
            return Ok(Some(block as u64 * QUOTA_BLOCK as u64 + at as u64));
        }
    }
    Err(Error::corrupt(
        location(file),
        format!("quota tree names block {block} for id {id}, which holds no entry for it"),
    ))
}

/// Read the entry at `offset` (from `find` or `insert`).
pub fn read_entry(file: &mut dyn QuotaBlocks, offset: u64) -> Result<Dquot> {
    let (block, at) = split(offset);
    let data = file.read(block)?;
    Ok(Dquot::decode(&data[at..at + ENTRY_SIZE]))
}

/// Write `dquot` at `offset`.
pub fn write_entry(file: &mut dyn QuotaBlocks, offset: u64, dquot: &Dquot) -> Result<()> {
    let (block, at) = split(offset);
    let mut data = file.read(block)?;
    dquot.encode(&mut data[at..at + ENTRY_SIZE]);
    file.write(block, &data)
}

fn split(offset: u64) -> (u32, usize) {
    let block = (offset / QUOTA_BLOCK as u64) as u32;
    let at = (offset % QUOTA_BLOCK as u64) as usize;
    debug_assert!(at >= DATA_HEADER && (at - DATA_HEADER).is_multiple_of(ENTRY_SIZE));
    (block, at)
}

/// The quota blocks `insert` of a new id may add to the file at most: a
/// tree block for each level below the root and a data block.
pub const INSERT_BLOCKS_MAX: u32 = TREE_DEPTH as u32;

/// Give `id` an entry (qtree_write_dquot's dq_insert_tree): a free entry
/// of a data block on the free-entry list, or a new data block; tree
/// blocks made on the way. New blocks come off the free-block list, or
/// from the end of the file. Returns the entry's offset; the entry holds
/// the id and nothing else. `info` is updated; the caller writes it.
pub fn insert(file: &mut dyn QuotaBlocks, info: &mut Info, id: u32) -> Result<u64> {
    let mut path = [TREE_ROOT; TREE_DEPTH];
    for depth in 1..TREE_DEPTH {
        let parent = path[depth - 1];
        let mut tree = file.read(parent)?;
        let slot = index(id, depth - 1) * 4;
        let next = get_u32(&tree, slot);
        path[depth] = match next {
            0 => {
                let made = new_block(file, info)?;
                put_u32(&mut tree, slot, made);
                file.write(parent, &tree)?;
                made
            }
            next => checked(file.ino(), info, next)?,
        };
    }
    let leaf = path[TREE_DEPTH - 1];
    let mut tree = file.read(leaf)?;
    let slot = index(id, TREE_DEPTH - 1) * 4;
    ensure_format!(
        get_u32(&tree, slot) == 0,
        location(file),
        "quota id {id} inserted twice"
    );
    let (data_block, offset) = free_entry(file, info, id)?;
    put_u32(&mut tree, slot, data_block);
    file.write(leaf, &tree)?;
    Ok(offset)
}

/// A block for the tree or for entries, zeroed: off the free-block list
/// (get_free_dqblk), or appended.
fn new_block(file: &mut dyn QuotaBlocks, info: &mut Info) -> Result<u32> {
    let block = match info.free_block {
        0 => {
            let block = info.blocks;
            info.blocks += 1;
            block
        }
        free => {
            let listed = file.read(checked(file.ino(), info, free)?)?;
            info.free_block = get_u32(&listed, 0);
            free
        }
    };
    file.write(block, &[0; QUOTA_BLOCK])?;
    Ok(block)
}

/// An entry for `id` in a data block (find_free_dqentry): the first data
/// block with room, or a new one that joins the free-entry list; a block
/// it fills leaves the list. Returns the block and the entry's offset.
fn free_entry(file: &mut dyn QuotaBlocks, info: &mut Info, id: u32) -> Result<(u32, u64)> {
    let (block, mut data) = match info.free_entry {
        0 => {
            let block = new_block(file, info)?;
            info.free_entry = block;
            (block, [0; QUOTA_BLOCK])
        }
        block => (block, file.read(checked(file.ino(), info, block)?)?),
    };
    let entries = get_u16(&data, 8) as usize;
    ensure_format!(
        entries < ENTRIES_PER_BLOCK,
        location(file),
        "quota data block {block} on the free-entry list holds {entries} entries"
    );
    if entries + 1 == ENTRIES_PER_BLOCK {
        unlink_free_entry(file, info, block, &mut data)?;
    }
    put_u16(&mut data, 8, (entries + 1) as u16);
    let slot = (0..ENTRIES_PER_BLOCK)
        .find(|slot| {
            let at = DATA_HEADER + slot * ENTRY_SIZE;
            data[at..at + ENTRY_SIZE].iter().all(|&byte| byte == 0)
        })
        .ok_or_else(|| {
            Error::corrupt(
                location(file),
                format!("quota data block {block} counts {entries} entries but has no free one"),
            )
        })?;
    let at = DATA_HEADER + slot * ENTRY_SIZE;
    Dquot {
        id,
        ..Dquot::default()
    }
    .encode(&mut data[at..at + ENTRY_SIZE]);
    file.write(block, &data)?;
    Ok((block, block as u64 * QUOTA_BLOCK as u64 + at as u64))
}

/// Take data block `block` (its bytes in `data`) off the free-entry list
/// (remove_free_dqentry).
fn unlink_free_entry(
    file: &mut dyn QuotaBlocks,
    info: &mut Info,
    block: u32,
    data: &mut [u8; QUOTA_BLOCK],
) -> Result<()> {
    let next = get_u32(data, 0);
    let previous = get_u32(data, 4);
    if next != 0 {
        let mut other = file.read(checked(file.ino(), info, next)?)?;
        put_u32(&mut other, 4, previous);
        file.write(next, &other)?;
    }
    if previous != 0 {
        let mut other = file.read(checked(file.ino(), info, previous)?)?;
        put_u32(&mut other, 0, next);
        file.write(previous, &other)?;
    } else {
        debug_assert_eq!(info.free_entry, block);
        info.free_entry = next;
    }
    put_u32(data, 0, 0);
    put_u32(data, 4, 0);
    Ok(())
}

/// Every entry of the file, in tree order (for reports and checks).
pub fn entries(file: &mut dyn QuotaBlocks, info: &Info) -> Result<Vec<Dquot>> {
    let mut found = Vec::new();
    let mut seen = std::collections::BTreeSet::new();
    walk(file, info, TREE_ROOT, 0, &mut seen, &mut found)?;
    Ok(found)
}

fn walk(
    file: &mut dyn QuotaBlocks,
    info: &Info,
    block: u32,
    depth: usize,
    seen: &mut std::collections::BTreeSet<u32>,
    found: &mut Vec<Dquot>,
) -> Result<()> {
    let bytes = file.read(block)?;
    if depth == TREE_DEPTH {
        // Several ids share a data block: read it once.
        if seen.insert(block) {
            for slot in 0..ENTRIES_PER_BLOCK {
                let at = DATA_HEADER + slot * ENTRY_SIZE;
                let entry = &bytes[at..at + ENTRY_SIZE];
                if entry.iter().any(|&byte| byte != 0) {
                    found.push(Dquot::decode(entry));
                }
            }
        }
        return Ok(());
    }
    for slot in 0..REFS_PER_BLOCK {
        let next = get_u32(&bytes, slot * 4);
        if next != 0 {
            let next = checked(file.ino(), info, next)?;
            walk(file, info, next, depth + 1, seen, found)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A quota file in memory.
    struct Memory(Vec<[u8; QUOTA_BLOCK]>);

    impl QuotaBlocks for Memory {
        fn ino(&self) -> u32 {
            3
        }
        fn read(&mut self, block: u32) -> Result<[u8; QUOTA_BLOCK]> {
            Ok(self
                .0
                .get(block as usize)
                .copied()
                .unwrap_or([0; QUOTA_BLOCK]))
        }
        fn write(&mut self, block: u32, bytes: &[u8; QUOTA_BLOCK]) -> Result<()> {
            let block = block as usize;
            if self.0.len() <= block {
                self.0.resize(block + 1, [0; QUOTA_BLOCK]);
            }
            self.0[block] = *bytes;
            Ok(())
        }
    }

    /// What mke2fs writes: header, info, an empty root.
    fn empty(qtype: QuotaType) -> (Memory, Info) {
        let mut header = [0u8; QUOTA_BLOCK];
        put_u32(&mut header, 0, qtype.magic());
        put_u32(&mut header, 4, VERSION);
        let mut file = Memory(vec![header, [0; QUOTA_BLOCK]]);
        let info = Info {
            block_grace: 604800,
            inode_grace: 604800,
            blocks: 2,
            ..Info::default()
        };
        write_info(&mut file, &info).unwrap();
        assert_eq!(read_info(&mut file, qtype).unwrap(), info);
        (file, info)
    }

    #[test]
    fn ids_inserted_are_found_and_read_back() {
        let (mut file, mut info) = empty(QuotaType::User);
        let ids = [0u32, 1, 1000, 65534, 0x0102_0304, u32::MAX - 1];
        for (n, &id) in ids.iter().enumerate() {
            assert_eq!(find(&mut file, &info, id).unwrap(), None);
            let at = insert(&mut file, &mut info, id).unwrap();
            let dquot = Dquot {
                id,
                inodes: n as u64,
                space: 4096 * n as u64,
                ..Dquot::default()
            };
            write_entry(&mut file, at, &dquot).unwrap();
            assert_eq!(find(&mut file, &info, id).unwrap(), Some(at));
            assert_eq!(read_entry(&mut file, at).unwrap().space, dquot.space);
        }
        let mut all: Vec<u32> = entries(&mut file, &info)
            .unwrap()
            .iter()
            .map(|d| d.id)
            .collect();
        all.sort();
        let mut expected = ids.to_vec();
        expected.sort();
        assert_eq!(all, expected);
        // id 0 with nothing used does not read as a free entry, and reads
        // back as nothing used.
        let zero = find(&mut file, &info, 0).unwrap().unwrap();
        let (block, at) = split(zero);
        assert_eq!(get_u64(&file.read(block).unwrap(), at + 64), 1);
        assert_eq!(read_entry(&mut file, zero).unwrap(), Dquot::default());
    }

    #[test]
    fn a_full_data_block_leaves_the_free_list_and_a_new_one_takes_over() {
        let (mut file, mut info) = empty(QuotaType::Group);
        for id in 0..ENTRIES_PER_BLOCK as u32 {
            insert(&mut file, &mut info, id).unwrap();
        }
        assert_eq!(info.free_entry, 0, "the first data block is full");
        let blocks = info.blocks;
        let at = insert(&mut file, &mut info, ENTRIES_PER_BLOCK as u32).unwrap();
        assert_eq!(info.blocks, blocks + 1, "a second data block");
        assert_eq!(info.free_entry as u64, at / QUOTA_BLOCK as u64);
        assert_eq!(
            entries(&mut file, &info).unwrap().len(),
            ENTRIES_PER_BLOCK + 1
        );
    }

    #[test]
    fn damage_is_an_error() {
        let (mut file, mut info) = empty(QuotaType::Project);
        assert!(
            read_info(&mut file, QuotaType::User)
                .unwrap_err()
                .is_corruption()
        );
        insert(&mut file, &mut info, 7).unwrap();
        // A tree reference past the file's end.
        let mut root = file.read(TREE_ROOT).unwrap();
        put_u32(&mut root, 0, 999);
        file.write(TREE_ROOT, &root).unwrap();
        assert!(find(&mut file, &info, 7).unwrap_err().is_corruption());
        assert!(entries(&mut file, &info).unwrap_err().is_corruption());
    }
}
