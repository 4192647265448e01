//! Inodes: the 128-byte base, the extra fields (nanosecond times, creation
//! time, checksum high half, project id), the checksum, and the in-inode
//! extended attribute area that follows `i_extra_isize`.
//!
//! `Inode` keeps the raw bytes it was decoded from, so that fields this crate
//! does not interpret and the in-inode xattr area survive a rewrite as they
//! were. `encode` writes the interpreted fields back and sets the checksum.

use super::csum::{crc32c_raw, inode_seed};
use super::superblock::{GOOD_OLD_INODE_SIZE, Geometry, incompat, ro_compat};
use super::{get_u16, get_u32, put_u16, put_u32};
use crate::cache::Buffer;
use crate::ensure_format;
use crate::error::{Location, Result};
use smallvec::SmallVec;

/// ext4.h EXT4_LINK_MAX: the most links an inode counts; past it a
/// directory with dir_nlink counts 1 ("many").
pub const LINK_MAX: u16 = 65000;

// File type bits of i_mode.
pub const S_IFMT: u16 = 0o170000;
pub const S_IFSOCK: u16 = 0o140000;
pub const S_IFLNK: u16 = 0o120000;
pub const S_IFREG: u16 = 0o100000;
pub const S_IFBLK: u16 = 0o060000;
pub const S_IFDIR: u16 = 0o040000;
pub const S_IFCHR: u16 = 0o020000;
pub const S_IFIFO: u16 = 0o010000;

/// i_flags bits (ext4.h EXT4_*_FL) that this crate interprets or sets.
pub mod flags {
    pub const SYNC: u32 = 0x0000_0008;
    pub const IMMUTABLE: u32 = 0x0000_0010;
    pub const APPEND: u32 = 0x0000_0020;
    /// For dump(8) alone.
    pub const NODUMP: u32 = 0x0000_0040;
    pub const NOATIME: u32 = 0x0000_0080;
    pub const ENCRYPT: u32 = 0x0000_0800;
    /// Directory uses an htree index.
    pub const INDEX: u32 = 0x0000_1000;
    pub const JOURNAL_DATA: u32 = 0x0000_4000;
    pub const DIRSYNC: u32 = 0x0001_0000;
    pub const TOPDIR: u32 = 0x0002_0000;
    /// i_blocks counts filesystem blocks instead of 512-byte sectors.
    pub const HUGE_FILE: u32 = 0x0004_0000;
    pub const EXTENTS: u32 = 0x0008_0000;
    pub const VERITY: u32 = 0x0010_0000;
    pub const EA_INODE: u32 = 0x0020_0000;
    pub const INLINE_DATA: u32 = 0x1000_0000;
    pub const PROJINHERIT: u32 = 0x2000_0000;
    pub const CASEFOLD: u32 = 0x4000_0000;
    /// Flags a child inherits from its directory (ext4.h EXT4_FL_INHERITED).
    pub const INHERITED: u32 = 0x0000_0001
        | 0x0000_0002
        | 0x0000_0004
        | SYNC
        | NODUMP
        | NOATIME
        | 0x0000_0400
        | JOURNAL_DATA
        | 0x0000_8000
        | DIRSYNC
        | PROJINHERIT
        | CASEFOLD;

    /// ext4_mask_flags: the flags an inode of file type `mode` may have —
    /// a directory any, a regular file all but the directory ones, the
    /// rest only nodump and noatime.
    pub fn kind_mask(mode: u16) -> u32 {
        match mode & super::S_IFMT {
            super::S_IFDIR => u32::MAX,
            super::S_IFREG => !(DIRSYNC | TOPDIR | CASEFOLD | INDEX | PROJINHERIT),
            _ => NODUMP | NOATIME,
        }
    }
}

const I_MODE: usize = 0x00;
const I_UID: usize = 0x02;
const I_SIZE_LO: usize = 0x04;
const I_ATIME: usize = 0x08;
const I_CTIME: usize = 0x0C;
const I_MTIME: usize = 0x10;
const I_DTIME: usize = 0x14;
const I_GID: usize = 0x18;
const I_LINKS_COUNT: usize = 0x1A;
const I_BLOCKS_LO: usize = 0x1C;
const I_FLAGS: usize = 0x20;
const I_VERSION_LO: usize = 0x24;
pub const I_BLOCK: usize = 0x28;
pub const I_BLOCK_SIZE: usize = 60;
const I_GENERATION: usize = 0x64;
const I_FILE_ACL_LO: usize = 0x68;
const I_SIZE_HIGH: usize = 0x6C;
const I_BLOCKS_HIGH: usize = 0x74;
const I_FILE_ACL_HIGH: usize = 0x76;
const I_UID_HIGH: usize = 0x78;
const I_GID_HIGH: usize = 0x7A;
const I_CHECKSUM_LO: usize = 0x7C;
const I_EXTRA_ISIZE: usize = 0x80;
const I_CHECKSUM_HI: usize = 0x82;
const I_CTIME_EXTRA: usize = 0x84;
const I_MTIME_EXTRA: usize = 0x88;
const I_ATIME_EXTRA: usize = 0x8C;
const I_CRTIME: usize = 0x90;
const I_CRTIME_EXTRA: usize = 0x94;
const I_VERSION_HI: usize = 0x98;
const I_PROJID: usize = 0x9C;

/// A timestamp with nanoseconds. ext4 stores the low 32 bits of the
/// seconds signed, and two "epoch" bits in the extra field extend the range
/// to 2446.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Default)]
pub struct Timestamp {
    pub sec: i64,
    pub nsec: u32,
}

impl Timestamp {
    pub fn now() -> Self {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        Timestamp {
            sec: now.as_secs() as i64,
            nsec: now.subsec_nanos(),
        }
    }

    fn decode(seconds: u32, extra: Option<u32>) -> Self {
        let mut sec = seconds as i32 as i64;
        let mut nsec = 0;
        if let Some(extra) = extra {
            sec += ((extra & 3) as i64) << 32;
            nsec = (extra >> 2).min(999_999_999);
        }
        Timestamp { sec, nsec }
    }

    fn encode(self) -> (u32, u32) {
        let low = self.sec as i32;
        let epoch = (((self.sec - low as i64) >> 32) & 3) as u32;
        (low as u32, epoch | (self.nsec << 2))
    }
}

#[derive(Clone)]
pub struct Inode {
    pub mode: u16,
    pub uid: u32,
    pub gid: u32,
    pub size: u64,
    pub atime: Timestamp,
    pub ctime: Timestamp,
    pub mtime: Timestamp,
    pub crtime: Timestamp,
    /// Deletion time; also the next-orphan link while on the orphan list.
    pub dtime: u32,
    pub links_count: u16,
    /// Allocated space in 512-byte units (converted if HUGE_FILE_FL is set).
    pub blocks: u64,
    pub flags: u32,
    pub version: u64,
    /// `i_block`: extent root, block map, inline symlink target.
    pub block: [u8; I_BLOCK_SIZE],
    pub generation: u32,
    pub file_acl: u64,
    pub extra_isize: u16,
    pub projid: u32,
    raw: RawInode,
}

/// The stored bytes of an inode: in place up to the size mke2fs makes
/// (256 bytes), so that reading an inode (several per request) allocates
/// nothing; larger inodes spill to the heap.
type RawInode = SmallVec<[u8; INODE_COPY_ON_STACK]>;

impl std::fmt::Debug for Inode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Inode")
            .field("mode", &format_args!("{:o}", self.mode))
            .field("size", &self.size)
            .field("links", &self.links_count)
            .field("flags", &format_args!("{:#x}", self.flags))
            .finish_non_exhaustive()
    }
}

impl Inode {
    /// A fresh inode with no fields set beyond the extra size we want.
    pub fn new(geo: &Geometry) -> Self {
        Inode {
            mode: 0,
            uid: 0,
            gid: 0,
            size: 0,
            atime: Timestamp::default(),
            ctime: Timestamp::default(),
            mtime: Timestamp::default(),
            crtime: Timestamp::default(),
            dtime: 0,
            links_count: 0,
            blocks: 0,
            flags: 0,
            version: 0,
            block: [0; I_BLOCK_SIZE],
            generation: 0,
            file_acl: 0,
            extra_isize: geo.want_extra_isize,
            projid: 0,
            raw: SmallVec::from_elem(0, geo.inode_size as usize),
        }
    }

    /// Decode `geo.inode_size` bytes of inode `ino`, verifying its checksum.
    pub fn decode(geo: &Geometry, ino: u32, bytes: &[u8]) -> Result<Self> {
        Self::decode_checking(geo, ino, bytes, true)
    }

    /// `decode` without the checksum: bytes the caller trusts (a slot of
    /// a cached table block it is about to overwrite).
    pub fn decode_unchecked(geo: &Geometry, ino: u32, bytes: &[u8]) -> Result<Self> {
        Self::decode_checking(geo, ino, bytes, false)
    }

    /// Decode inode `ino` from its slot at byte `offset` of its cached
    /// table block (`bytes`, read under `buffer`'s lock). The checksum is
    /// verified the first time the slot is read after the block came from
    /// the device, not at every later read: every change of a slot goes
    /// through `encode_in_table`, which leaves it matching (debug builds
    /// check at every read that it still does).
    pub fn decode_in_table(
        geo: &Geometry,
        ino: u32,
        buffer: &Buffer,
        bytes: &[u8],
        offset: usize,
    ) -> Result<Self> {
        let size = geo.inode_size as usize;
        let slot = offset / size;
        debug_assert_eq!(offset % size, 0, "inode {ino} at a slot's start");
        let slot_bytes = &bytes[offset..offset + size];
        if buffer.is_slot_verified(slot) {
            return Self::decode_checking(geo, ino, slot_bytes, false);
        }
        let inode = Self::decode_checking(geo, ino, slot_bytes, true)?;
        buffer.set_slot_verified(slot);
        Ok(inode)
    }

    /// Encode into the slot at byte `offset` of the table block `bytes`
    /// (held with write access to `buffer`), and remember the slot as
    /// verified: it matches its checksum until the next encode.
    pub fn encode_in_table(
        &self,
        geo: &Geometry,
        ino: u32,
        buffer: &Buffer,
        bytes: &mut [u8],
        offset: usize,
    ) {
        let size = geo.inode_size as usize;
        debug_assert_eq!(offset % size, 0, "inode {ino} at a slot's start");
        self.encode(geo, ino, &mut bytes[offset..offset + size]);
        buffer.set_slot_verified(offset / size);
    }

    /// `decode`, verifying the checksum only when `verify` (otherwise the
    /// caller knows the bytes match it, and debug builds check that).
    fn decode_checking(geo: &Geometry, ino: u32, bytes: &[u8], verify: bool) -> Result<Self> {
        let size = geo.inode_size as usize;
        let raw = RawInode::from_slice(&bytes[..size]);
        let location = Location::Inode { ino };
        let extra_isize = if size > GOOD_OLD_INODE_SIZE as usize {
            get_u16(&raw, I_EXTRA_ISIZE)
        } else {
            0
        };
        ensure_format!(
            GOOD_OLD_INODE_SIZE as usize + extra_isize as usize <= size && extra_isize % 4 == 0,
            location,
            "i_extra_isize {extra_isize} does not fit an inode of {size} bytes"
        );
        if geo.metadata_csum && verify {
            verify_checksum(geo, ino, &raw, extra_isize)?;
        } else if geo.metadata_csum {
            // An injected fault may write a block where the engine never
            // would (MetaBgFlatDescriptor over an inode table): the crash
            // checker, not this assertion, is to find what that breaks.
            debug_assert!(
                crate::faults::any_active() || verify_checksum(geo, ino, &raw, extra_isize).is_ok(),
                "inode {ino}: a slot remembered as verified no longer matches its checksum"
            );
        }
        let fits =
            |offset: usize| GOOD_OLD_INODE_SIZE as usize + extra_isize as usize >= offset + 4;
        let extra = |offset: usize| fits(offset).then(|| get_u32(&raw, offset));
        let mut flags = get_u32(&raw, I_FLAGS);
        let mut blocks = get_u32(&raw, I_BLOCKS_LO) as u64;
        if geo.has_ro_compat(ro_compat::HUGE_FILE) {
            blocks |= (get_u16(&raw, I_BLOCKS_HIGH) as u64) << 32;
            if flags & flags::HUGE_FILE != 0 {
                blocks <<= geo.log_block_size + 1;
                // From here on the count is in sectors; encode picks the unit.
                flags &= !flags::HUGE_FILE;
            }
        }
        Ok(Inode {
            mode: get_u16(&raw, I_MODE),
            uid: get_u16(&raw, I_UID) as u32 | (get_u16(&raw, I_UID_HIGH) as u32) << 16,
            gid: get_u16(&raw, I_GID) as u32 | (get_u16(&raw, I_GID_HIGH) as u32) << 16,
            size: decode_size(geo, &raw),
            atime: Timestamp::decode(get_u32(&raw, I_ATIME), extra(I_ATIME_EXTRA)),
            ctime: Timestamp::decode(get_u32(&raw, I_CTIME), extra(I_CTIME_EXTRA)),
            mtime: Timestamp::decode(get_u32(&raw, I_MTIME), extra(I_MTIME_EXTRA)),
            crtime: match extra(I_CRTIME) {
                Some(seconds) => Timestamp::decode(seconds, extra(I_CRTIME_EXTRA)),
                None => Timestamp::default(),
            },
            dtime: get_u32(&raw, I_DTIME),
            links_count: get_u16(&raw, I_LINKS_COUNT),
            blocks,
            flags,
            version: get_u32(&raw, I_VERSION_LO) as u64
                | (extra(I_VERSION_HI).unwrap_or(0) as u64) << 32,
            block: raw[I_BLOCK..I_BLOCK + I_BLOCK_SIZE].try_into().unwrap(),
            generation: get_u32(&raw, I_GENERATION),
            file_acl: get_u32(&raw, I_FILE_ACL_LO) as u64
                | (get_u16(&raw, I_FILE_ACL_HIGH) as u64) << 32,
            extra_isize,
            projid: extra(I_PROJID).unwrap_or(0),
            raw,
        })
    }

    /// `i_dtime` of the inode encoded in `bytes` (its slot in its table
    /// block), without decoding the rest.
    pub fn stored_dtime(bytes: &[u8]) -> u32 {
        get_u32(bytes, I_DTIME)
    }

    /// Encode into `bytes` (the inode's slot in its table block) and set the
    /// checksum.
    pub fn encode(&self, geo: &Geometry, ino: u32, bytes: &mut [u8]) {
        let size = geo.inode_size as usize;
        debug_assert_eq!(self.raw.len(), size);
        let raw = &mut bytes[..size];
        raw.copy_from_slice(&self.raw);
        let extra_isize = if size > GOOD_OLD_INODE_SIZE as usize {
            self.extra_isize
        } else {
            0
        };
        let fits =
            |offset: usize| GOOD_OLD_INODE_SIZE as usize + extra_isize as usize >= offset + 4;
        put_u16(raw, I_MODE, self.mode);
        put_u16(raw, I_UID, self.uid as u16);
        put_u16(raw, I_UID_HIGH, (self.uid >> 16) as u16);
        put_u16(raw, I_GID, self.gid as u16);
        put_u16(raw, I_GID_HIGH, (self.gid >> 16) as u16);
        put_u32(raw, I_SIZE_LO, self.size as u32);
        put_u32(raw, I_SIZE_HIGH, (self.size >> 32) as u32);
        for (base, extra, time) in [
            (I_ATIME, I_ATIME_EXTRA, self.atime),
            (I_CTIME, I_CTIME_EXTRA, self.ctime),
            (I_MTIME, I_MTIME_EXTRA, self.mtime),
        ] {
            let (seconds, extra_bits) = time.encode();
            put_u32(raw, base, seconds);
            if fits(extra) {
                put_u32(raw, extra, extra_bits);
            }
        }
        if fits(I_CRTIME_EXTRA) {
            let (seconds, extra_bits) = self.crtime.encode();
            put_u32(raw, I_CRTIME, seconds);
            put_u32(raw, I_CRTIME_EXTRA, extra_bits);
        }
        put_u32(raw, I_DTIME, self.dtime);
        put_u16(raw, I_LINKS_COUNT, self.links_count);
        let mut flags = self.flags & !flags::HUGE_FILE;
        let mut blocks = self.blocks;
        if geo.has_ro_compat(ro_compat::HUGE_FILE) && blocks >= 1 << 48 {
            // Beyond 48 bits of sectors, count filesystem blocks instead.
            blocks >>= geo.log_block_size + 1;
            flags |= flags::HUGE_FILE;
        }
        put_u32(raw, I_BLOCKS_LO, blocks as u32);
        if geo.has_ro_compat(ro_compat::HUGE_FILE) {
            put_u16(raw, I_BLOCKS_HIGH, (blocks >> 32) as u16);
        }
        put_u32(raw, I_FLAGS, flags);
        put_u32(raw, I_VERSION_LO, self.version as u32);
        if fits(I_VERSION_HI) {
            put_u32(raw, I_VERSION_HI, (self.version >> 32) as u32);
        }
        raw[I_BLOCK..I_BLOCK + I_BLOCK_SIZE].copy_from_slice(&self.block);
        put_u32(raw, I_GENERATION, self.generation);
        put_u32(raw, I_FILE_ACL_LO, self.file_acl as u32);
        put_u16(raw, I_FILE_ACL_HIGH, (self.file_acl >> 32) as u16);
        if size > GOOD_OLD_INODE_SIZE as usize {
            put_u16(raw, I_EXTRA_ISIZE, extra_isize);
        }
        if fits(I_PROJID) {
            put_u32(raw, I_PROJID, self.projid);
        }
        if geo.metadata_csum {
            let sum = checksum(geo.csum_seed, ino, raw, extra_isize);
            put_u16(raw, I_CHECKSUM_LO, sum as u16);
            if has_checksum_hi(extra_isize) {
                put_u16(raw, I_CHECKSUM_HI, (sum >> 16) as u16);
            }
        }
    }

    pub fn file_type(&self) -> u16 {
        self.mode & S_IFMT
    }
    pub fn is_dir(&self) -> bool {
        self.file_type() == S_IFDIR
    }
    pub fn is_reg(&self) -> bool {
        self.file_type() == S_IFREG
    }
    pub fn is_symlink(&self) -> bool {
        self.file_type() == S_IFLNK
    }
    /// The blocks this inode maps are metadata: directory blocks are
    /// journaled, so freeing them must revoke them and drop their cached
    /// and checkpoint copies, or a replay or checkpoint writes them over
    /// the block's next owner. The kernel's rule (extents.c
    /// `get_default_free_blocks_flags`): directories and symlinks.
    pub fn blocks_are_metadata(&self) -> bool {
        self.is_dir() || self.is_symlink()
    }
    pub fn uses_extents(&self) -> bool {
        self.flags & flags::EXTENTS != 0
    }
    pub fn has_flag(&self, flag: u32) -> bool {
        self.flags & flag != 0
    }
    /// Data kept in `i_block` and the `system.data` attribute
    /// (`format::inline`), not in blocks.
    pub fn has_inline_data(&self) -> bool {
        self.has_flag(flags::INLINE_DATA)
    }

    /// Whether the inode's data lives in blocks (as opposed to inline data,
    /// a fast symlink's target in `i_block`, or a device number).
    pub fn has_data_blocks(&self, geo: &Geometry) -> bool {
        if self.has_inline_data() {
            return false;
        }
        match self.file_type() {
            S_IFREG | S_IFDIR => true,
            S_IFLNK => !self.is_fast_symlink(geo),
            _ => false,
        }
    }

    /// fscrypt encrypted (flag ENCRYPT on a filesystem with the encrypt
    /// feature; without it the flag means nothing, and the kernel finds no
    /// context to use).
    pub fn is_encrypted(&self, geo: &Geometry) -> bool {
        self.has_flag(flags::ENCRYPT) && geo.has_incompat(incompat::ENCRYPT)
    }

    /// A symlink whose target is stored in `i_block`: it owns no blocks
    /// besides, possibly, its xattr block (ext4_inode_is_fast_symlink).
    pub fn is_fast_symlink(&self, geo: &Geometry) -> bool {
        if !self.is_symlink() || self.has_flag(flags::INLINE_DATA) {
            return false;
        }
        // With ea_inode, a value in an EA inode adds its blocks to the
        // owner's i_blocks, so a fast symlink with such an xattr owns
        // "blocks" too: the size decides, as in the kernel since "ext4:
        // check fast symlink for ea_inode correctly" and in e2fsprogs.
        if geo.has_incompat(incompat::EA_INODE) || self.has_flag(flags::EA_INODE) {
            return self.size > 0 && self.size < I_BLOCK_SIZE as u64;
        }
        // An xattr block counts a cluster (EXT4_CLUSTER_SIZE >> 9).
        let xattr_sectors = if self.file_acl != 0 {
            geo.cluster_bytes() / 512
        } else {
            0
        };
        self.blocks.saturating_sub(xattr_sectors) == 0
    }

    /// Device number stored in i_block for character and block devices, in
    /// the Linux `new_encode_dev` form when the old 16-bit form is empty.
    pub fn device_number(&self) -> u32 {
        let old = get_u32(&self.block, 0);
        if old != 0 {
            // old_decode_dev: major in bits 8..15, minor in 0..7.
            let major = (old >> 8) & 0xFF;
            let minor = old & 0xFF;
            return libc::makedev(major, minor) as u32;
        }
        let new = get_u32(&self.block, 4);
        let major = (new & 0xFFF00) >> 8;
        let minor = (new & 0xFF) | ((new >> 12) & 0xFFF00);
        libc::makedev(major, minor) as u32
    }

    /// Store a device number as the kernel does: the old form when both
    /// numbers fit in a byte, otherwise the new form in `i_block[1]`.
    pub fn set_device_number(&mut self, rdev: u64) {
        let major = libc::major(rdev as libc::dev_t);
        let minor = libc::minor(rdev as libc::dev_t);
        self.block = [0; I_BLOCK_SIZE];
        if major < 256 && minor < 256 {
            put_u32(&mut self.block, 0, (major << 8) | minor);
        } else {
            let new = (minor & 0xFF) | (major << 8) | ((minor & !0xFF) << 12);
            put_u32(&mut self.block, 4, new);
        }
    }

    /// The in-inode extended attribute area: from the end of the extra
    /// fields to the end of the on-disk inode (empty for 128-byte inodes).
    pub fn inline_xattr_area(&self) -> &[u8] {
        let start = GOOD_OLD_INODE_SIZE as usize + self.extra_isize as usize;
        if self.raw.len() > GOOD_OLD_INODE_SIZE as usize && start < self.raw.len() {
            &self.raw[start..]
        } else {
            &[]
        }
    }

    pub fn inline_xattr_area_mut(&mut self) -> &mut [u8] {
        let start = GOOD_OLD_INODE_SIZE as usize + self.extra_isize as usize;
        if self.raw.len() > GOOD_OLD_INODE_SIZE as usize && start < self.raw.len() {
            &mut self.raw[start..]
        } else {
            &mut []
        }
    }

    /// Forget every stored byte (used when an inode is freed and when a new
    /// one is set up over a slot that held garbage).
    pub fn clear_raw(&mut self) {
        self.raw.fill(0);
    }

    pub fn csum_seed(&self, geo: &Geometry, ino: u32) -> u32 {
        inode_seed(geo.csum_seed, ino, self.generation)
    }
}

/// ext4_inode_csum_verify: the stored checksum (its low half only when the
/// extra fields end before the high half) against the computed one.
/// `i_size`: its high half counts for regular files, and for every inode
/// with large_dir, as the kernel's `ext4_isize` reads it; elsewhere the
/// field is old ext2's `i_dir_acl`, which no reader takes for a size.
fn decode_size(geo: &Geometry, raw: &[u8]) -> u64 {
    let low = get_u32(raw, I_SIZE_LO) as u64;
    let regular = get_u16(raw, I_MODE) & S_IFMT == S_IFREG;
    match regular || geo.has_incompat(incompat::LARGEDIR) {
        true => low | (get_u32(raw, I_SIZE_HIGH) as u64) << 32,
        false => low,
    }
}

fn verify_checksum(geo: &Geometry, ino: u32, raw: &[u8], extra_isize: u16) -> Result<()> {
    let stored = stored_checksum(raw, extra_isize);
    let computed = checksum(geo.csum_seed, ino, raw, extra_isize);
    let mask = if has_checksum_hi(extra_isize) {
        !0
    } else {
        0xFFFF
    };
    ensure_format!(
        stored == computed & mask,
        Location::Inode { ino },
        "checksum mismatch (stored {stored:#010x}, computed {:#010x})",
        computed & mask
    );
    Ok(())
}

fn has_checksum_hi(extra_isize: u16) -> bool {
    extra_isize as usize >= I_CHECKSUM_HI + 2 - GOOD_OLD_INODE_SIZE as usize
}

fn stored_checksum(raw: &[u8], extra_isize: u16) -> u32 {
    let low = get_u16(raw, I_CHECKSUM_LO) as u32;
    if raw.len() > GOOD_OLD_INODE_SIZE as usize && has_checksum_hi(extra_isize) {
        low | (get_u16(raw, I_CHECKSUM_HI) as u32) << 16
    } else {
        low
    }
}

/// ext4_inode_csum: the per-inode seed, then the whole on-disk inode with
/// both checksum halves read as zero. One CRC over a copy with the halves
/// zeroed: each call into the CRC costs about as much as 100 bytes of it,
/// and an inode is checksummed on every read and write of it.
fn checksum(csum_seed: u32, ino: u32, raw: &[u8], extra_isize: u16) -> u32 {
    let generation = get_u32(raw, I_GENERATION);
    let mut seed_input = [0u8; 8];
    seed_input[..4].copy_from_slice(&ino.to_le_bytes());
    seed_input[4..].copy_from_slice(&generation.to_le_bytes());
    // inode_seed, in one call: a raw CRC appends.
    let seed = crc32c_raw(csum_seed, &seed_input);
    debug_assert_eq!(seed, inode_seed(csum_seed, ino, generation));
    let mut stack = [0u8; INODE_COPY_ON_STACK];
    let mut heap = Vec::new();
    let copy: &mut [u8] = if raw.len() <= stack.len() {
        &mut stack[..raw.len()]
    } else {
        heap.extend_from_slice(raw);
        &mut heap
    };
    copy.copy_from_slice(raw);
    put_u16(copy, I_CHECKSUM_LO, 0);
    if raw.len() > GOOD_OLD_INODE_SIZE as usize && has_checksum_hi(extra_isize) {
        put_u16(copy, I_CHECKSUM_HI, 0);
    }
    crc32c_raw(seed, copy)
}

/// Inodes up to this size (mke2fs makes 256 bytes) are checksummed from a
/// copy on the stack (zeroed first: keep it no larger than needed).
const INODE_COPY_ON_STACK: usize = 256;

#[cfg(test)]
mod tests {
    use super::*;

    /// The one-pass checksum is ext4_inode_csum's piecewise definition:
    /// seed, the inode up to the low half, two zeros, on to the high half,
    /// two zeros, the rest.
    #[test]
    fn checksum_in_one_pass_is_the_piecewise_one() {
        let seed = 0x1234_5678;
        let mut raw: Vec<u8> = (0..256u32).map(|i| (i * 7 + 3) as u8).collect();
        for extra_isize in [0u16, 4, 28, 32] {
            put_u16(&mut raw, I_EXTRA_ISIZE, extra_isize);
            let mut crc = inode_seed(seed, 77, get_u32(&raw, I_GENERATION));
            crc = crc32c_raw(crc, &raw[..I_CHECKSUM_LO]);
            crc = crc32c_raw(crc, &[0, 0]);
            crc = crc32c_raw(crc, &raw[I_CHECKSUM_LO + 2..GOOD_OLD_INODE_SIZE as usize]);
            crc = crc32c_raw(crc, &raw[GOOD_OLD_INODE_SIZE as usize..I_CHECKSUM_HI]);
            let mut offset = I_CHECKSUM_HI;
            if has_checksum_hi(extra_isize) {
                crc = crc32c_raw(crc, &[0, 0]);
                offset += 2;
            }
            crc = crc32c_raw(crc, &raw[offset..]);
            assert_eq!(
                checksum(seed, 77, &raw, extra_isize),
                crc,
                "extra_isize {extra_isize}"
            );
        }
        let small = &raw[..GOOD_OLD_INODE_SIZE as usize];
        let mut crc = inode_seed(seed, 5, get_u32(small, I_GENERATION));
        crc = crc32c_raw(crc, &small[..I_CHECKSUM_LO]);
        crc = crc32c_raw(crc, &[0, 0]);
        crc = crc32c_raw(crc, &small[I_CHECKSUM_LO + 2..]);
        assert_eq!(checksum(seed, 5, small, 0), crc);
    }

    #[test]
    fn timestamps_round_trip_with_epoch_bits() {
        for sec in [
            0i64,
            1,
            -1,
            i32::MAX as i64,
            i32::MIN as i64,
            1 << 32,
            (1 << 33) + 12345,
            -(1 << 31) + (3 << 32),
        ] {
            let time = Timestamp {
                sec,
                nsec: 123_456_789,
            };
            let (lo, extra) = time.encode();
            assert_eq!(Timestamp::decode(lo, Some(extra)), time, "sec {sec}");
        }
    }
}
