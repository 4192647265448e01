//! Block group descriptors (32 bytes, or `s_desc_size` with 64bit), and
//! their checksum: CRC32C (metadata_csum) or CRC16 (gdt_csum / uninit_bg).

use super::csum::{crc16, crc32c_raw};
use super::superblock::{Geometry, incompat};
use super::{get_u16, get_u32, put_u16, put_u32};
use crate::ensure_format;
use crate::error::{Location, Result};

/// `bg_flags`: the inode table and bitmap are not initialised.
pub const BG_INODE_UNINIT: u16 = 0x0001;
/// The block bitmap is not initialised (computed from the layout).
pub const BG_BLOCK_UNINIT: u16 = 0x0002;
/// The inode table has been zeroed.
pub const BG_INODE_ZEROED: u16 = 0x0004;

const BG_BLOCK_BITMAP: usize = 0x00;
const BG_INODE_BITMAP: usize = 0x04;
const BG_INODE_TABLE: usize = 0x08;
const BG_FREE_BLOCKS: usize = 0x0C;
const BG_FREE_INODES: usize = 0x0E;
const BG_USED_DIRS: usize = 0x10;
const BG_FLAGS: usize = 0x12;
const BG_BLOCK_BITMAP_CSUM_LO: usize = 0x18;
const BG_INODE_BITMAP_CSUM_LO: usize = 0x1A;
const BG_ITABLE_UNUSED: usize = 0x1C;
const BG_CHECKSUM: usize = 0x1E;
const BG_BLOCK_BITMAP_HI: usize = 0x20;
const BG_INODE_BITMAP_HI: usize = 0x24;
const BG_INODE_TABLE_HI: usize = 0x28;
const BG_FREE_BLOCKS_HI: usize = 0x2C;
const BG_FREE_INODES_HI: usize = 0x2E;
const BG_USED_DIRS_HI: usize = 0x30;
const BG_ITABLE_UNUSED_HI: usize = 0x32;
const BG_BLOCK_BITMAP_CSUM_HI: usize = 0x38;
const BG_INODE_BITMAP_CSUM_HI: usize = 0x3A;
/// The high halves of the bitmap checksums exist when the descriptor is at
/// least this long (ext4.h EXT4_BG_*_BITMAP_CSUM_HI_END).
const BLOCK_BITMAP_CSUM_HI_END: u32 = 0x3A;
const INODE_BITMAP_CSUM_HI_END: u32 = 0x3C;

/// Where a group's bitmaps and inode table are: fixed while the
/// filesystem is mounted (jext4 does not resize).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GroupLocations {
    pub block_bitmap: u64,
    pub inode_bitmap: u64,
    pub inode_table: u64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupDesc {
    pub block_bitmap: u64,
    pub inode_bitmap: u64,
    pub inode_table: u64,
    pub free_blocks: u32,
    pub free_inodes: u32,
    pub used_dirs: u32,
    pub flags: u16,
    pub itable_unused: u32,
    pub block_bitmap_csum: u32,
    pub inode_bitmap_csum: u32,
    /// Bytes beyond the fields above (exclude bitmap, reserved), kept as is.
    raw: Vec<u8>,
}

impl GroupDesc {
    pub fn decode(geo: &Geometry, group: u32, bytes: &[u8]) -> Result<Self> {
        let size = geo.desc_size as usize;
        let wide = size >= 64;
        let hi32 = |offset: usize| if wide { get_u32(bytes, offset) } else { 0 };
        let hi16 = |offset: usize| if wide { get_u16(bytes, offset) } else { 0 };
        let desc = GroupDesc {
            block_bitmap: get_u32(bytes, BG_BLOCK_BITMAP) as u64
                | (hi32(BG_BLOCK_BITMAP_HI) as u64) << 32,
            inode_bitmap: get_u32(bytes, BG_INODE_BITMAP) as u64
                | (hi32(BG_INODE_BITMAP_HI) as u64) << 32,
            inode_table: get_u32(bytes, BG_INODE_TABLE) as u64
                | (hi32(BG_INODE_TABLE_HI) as u64) << 32,
            free_blocks: get_u16(bytes, BG_FREE_BLOCKS) as u32
                | (hi16(BG_FREE_BLOCKS_HI) as u32) << 16,
            free_inodes: get_u16(bytes, BG_FREE_INODES) as u32
                | (hi16(BG_FREE_INODES_HI) as u32) << 16,
            used_dirs: get_u16(bytes, BG_USED_DIRS) as u32 | (hi16(BG_USED_DIRS_HI) as u32) << 16,
            flags: get_u16(bytes, BG_FLAGS),
            itable_unused: get_u16(bytes, BG_ITABLE_UNUSED) as u32
                | (hi16(BG_ITABLE_UNUSED_HI) as u32) << 16,
            block_bitmap_csum: get_u16(bytes, BG_BLOCK_BITMAP_CSUM_LO) as u32
                | if geo.desc_size >= BLOCK_BITMAP_CSUM_HI_END + 2 {
                    (get_u16(bytes, BG_BLOCK_BITMAP_CSUM_HI) as u32) << 16
                } else {
                    0
                },
            inode_bitmap_csum: get_u16(bytes, BG_INODE_BITMAP_CSUM_LO) as u32
                | if geo.desc_size >= INODE_BITMAP_CSUM_HI_END {
                    (get_u16(bytes, BG_INODE_BITMAP_CSUM_HI) as u32) << 16
                } else {
                    0
                },
            raw: bytes[..size].to_vec(),
        };
        let location = Location::GroupDescriptor { group };
        if geo.has_group_csum() {
            let stored = get_u16(bytes, BG_CHECKSUM);
            let computed = checksum(geo, group, &bytes[..size]);
            ensure_format!(
                stored == computed,
                location,
                "checksum mismatch (stored {stored:#06x}, computed {computed:#06x})"
            );
        }
        desc.validate(geo, group)?;
        Ok(desc)
    }

    /// Pointers must land where ext4_check_descriptors accepts them, and
    /// counts inside the group.
    fn validate(&self, geo: &Geometry, group: u32) -> Result<()> {
        let location = Location::GroupDescriptor { group };
        let (first, last) = self.allowed_blocks(geo, group);
        // The primary superblock and the descriptor blocks after it (the
        // whole table, or with meta_bg those of group 0), as
        // ext4_check_descriptors bounds them with ext4_bg_num_gdb(sb, 0).
        let table_end = geo.primary_superblock_location().0 + geo.group_gdt_blocks(0) as u64;
        let allowed = |block: u64, count: u64| {
            block > table_end
                && block >= first
                && block.checked_add(count - 1).is_some_and(|end| end <= last)
        };
        ensure_format!(
            allowed(self.block_bitmap, 1),
            location,
            "block bitmap at {} is outside blocks {first}..={last} or on the descriptor table",
            self.block_bitmap
        );
        ensure_format!(
            allowed(self.inode_bitmap, 1),
            location,
            "inode bitmap at {} is outside blocks {first}..={last} or on the descriptor table",
            self.inode_bitmap
        );
        ensure_format!(
            allowed(self.inode_table, geo.inode_table_blocks as u64),
            location,
            "inode table at {} is outside blocks {first}..={last} or on the descriptor table",
            self.inode_table
        );
        ensure_format!(
            self.free_blocks <= geo.clusters_per_group,
            location,
            "free block count {} exceeds the group size (in clusters)",
            self.free_blocks
        );
        ensure_format!(
            self.free_inodes <= geo.inodes_per_group && self.itable_unused <= geo.inodes_per_group,
            location,
            "free inode count {} exceeds the group size",
            self.free_inodes
        );
        Ok(())
    }

    /// The blocks a group's bitmaps and inode table may occupy: anywhere
    /// with flex_bg, else inside the group (the last group running to the
    /// end of the filesystem), as ext4_check_descriptors checks.
    fn allowed_blocks(&self, geo: &Geometry, group: u32) -> (u64, u64) {
        let last_block = geo.blocks_count - 1;
        if geo.has_incompat(incompat::FLEX_BG) {
            return (geo.first_data_block as u64, last_block);
        }
        let first = geo.group_first_block(group);
        if group + 1 == geo.group_count {
            (first, last_block)
        } else {
            (first, first + geo.blocks_per_group as u64 - 1)
        }
    }

    pub fn locations(&self) -> GroupLocations {
        GroupLocations {
            block_bitmap: self.block_bitmap,
            inode_bitmap: self.inode_bitmap,
            inode_table: self.inode_table,
        }
    }

    /// Inodes of the group's table that hold something: none while the
    /// table is INODE_UNINIT, else all but `itable_unused` (with group
    /// checksums; without them, lazy init does not exist).
    pub fn initialised_inodes(&self, geo: &Geometry) -> u32 {
        if !geo.has_group_csum() {
            geo.inodes_per_group
        } else if self.flags & BG_INODE_UNINIT != 0 {
            0
        } else {
            geo.inodes_per_group.saturating_sub(self.itable_unused)
        }
    }

    /// Encode into `bytes` (the descriptor's slot in the table block),
    /// preserving fields we do not interpret, and set the checksum.
    pub fn encode(&self, geo: &Geometry, group: u32, bytes: &mut [u8]) {
        let size = geo.desc_size as usize;
        let wide = size >= 64;
        bytes[..size].copy_from_slice(&self.raw[..size]);
        put_u32(bytes, BG_BLOCK_BITMAP, self.block_bitmap as u32);
        put_u32(bytes, BG_INODE_BITMAP, self.inode_bitmap as u32);
        put_u32(bytes, BG_INODE_TABLE, self.inode_table as u32);
        put_u16(bytes, BG_FREE_BLOCKS, self.free_blocks as u16);
        put_u16(bytes, BG_FREE_INODES, self.free_inodes as u16);
        put_u16(bytes, BG_USED_DIRS, self.used_dirs as u16);
        put_u16(bytes, BG_FLAGS, self.flags);
        put_u16(bytes, BG_ITABLE_UNUSED, self.itable_unused as u16);
        put_u16(
            bytes,
            BG_BLOCK_BITMAP_CSUM_LO,
            self.block_bitmap_csum as u16,
        );
        put_u16(
            bytes,
            BG_INODE_BITMAP_CSUM_LO,
            self.inode_bitmap_csum as u16,
        );
        if wide {
            put_u32(bytes, BG_BLOCK_BITMAP_HI, (self.block_bitmap >> 32) as u32);
            put_u32(bytes, BG_INODE_BITMAP_HI, (self.inode_bitmap >> 32) as u32);
            put_u32(bytes, BG_INODE_TABLE_HI, (self.inode_table >> 32) as u32);
            put_u16(bytes, BG_FREE_BLOCKS_HI, (self.free_blocks >> 16) as u16);
            put_u16(bytes, BG_FREE_INODES_HI, (self.free_inodes >> 16) as u16);
            put_u16(bytes, BG_USED_DIRS_HI, (self.used_dirs >> 16) as u16);
            put_u16(
                bytes,
                BG_ITABLE_UNUSED_HI,
                (self.itable_unused >> 16) as u16,
            );
            if geo.desc_size >= BLOCK_BITMAP_CSUM_HI_END + 2 {
                put_u16(
                    bytes,
                    BG_BLOCK_BITMAP_CSUM_HI,
                    (self.block_bitmap_csum >> 16) as u16,
                );
            }
            if geo.desc_size >= INODE_BITMAP_CSUM_HI_END {
                put_u16(
                    bytes,
                    BG_INODE_BITMAP_CSUM_HI,
                    (self.inode_bitmap_csum >> 16) as u16,
                );
            }
        }
        if geo.has_group_csum() {
            let sum = checksum(geo, group, &bytes[..size]);
            put_u16(bytes, BG_CHECKSUM, sum);
        }
    }

    /// Record the checksum of a freshly changed block bitmap.
    pub fn set_block_bitmap_csum(&mut self, geo: &Geometry, bitmap: &[u8]) {
        if geo.metadata_csum {
            self.block_bitmap_csum = crc32c_raw(geo.csum_seed, &bitmap[..geo.block_bitmap_bytes()]);
        }
    }

    pub fn set_inode_bitmap_csum(&mut self, geo: &Geometry, bitmap: &[u8]) {
        if geo.metadata_csum {
            self.inode_bitmap_csum = crc32c_raw(geo.csum_seed, &bitmap[..geo.inode_bitmap_bytes()]);
        }
    }

    /// Whether a block bitmap read from disk matches the stored checksum
    /// (only the bits the descriptor's width can hold are compared).
    pub fn block_bitmap_csum_ok(&self, geo: &Geometry, bitmap: &[u8]) -> bool {
        if !geo.metadata_csum {
            return true;
        }
        let computed = crc32c_raw(geo.csum_seed, &bitmap[..geo.block_bitmap_bytes()]);
        let mask = if geo.desc_size >= BLOCK_BITMAP_CSUM_HI_END + 2 {
            !0
        } else {
            0xFFFF
        };
        computed & mask == self.block_bitmap_csum & mask
    }

    pub fn inode_bitmap_csum_ok(&self, geo: &Geometry, bitmap: &[u8]) -> bool {
        if !geo.metadata_csum {
            return true;
        }
        let computed = crc32c_raw(geo.csum_seed, &bitmap[..geo.inode_bitmap_bytes()]);
        let mask = if geo.desc_size >= INODE_BITMAP_CSUM_HI_END {
            !0
        } else {
            0xFFFF
        };
        computed & mask == self.inode_bitmap_csum & mask
    }
}

/// Descriptors up to this long (every descriptor of a 32- or 64-bit
/// filesystem made with the default `-D`) are checksummed in one CRC call.
const INLINE_DESC: usize = 64;

/// The raw CRC32C over the group number, then the descriptor with its
/// checksum field zeroed. A CRC continues over concatenated input, so one
/// call over a stack copy gives what the kernel's four calls give: taken on
/// every descriptor written (each allocation), where the four short calls
/// cost more in per-call setup than in bytes.
fn crc32c_descriptor(seed: u32, group_le: &[u8; 4], bytes: &[u8]) -> u32 {
    if bytes.len() <= INLINE_DESC {
        let mut buf = [0u8; 4 + INLINE_DESC];
        buf[..4].copy_from_slice(group_le);
        buf[4..4 + bytes.len()].copy_from_slice(bytes);
        buf[4 + BG_CHECKSUM..4 + BG_CHECKSUM + 2].fill(0);
        return crc32c_raw(seed, &buf[..4 + bytes.len()]);
    }
    let mut crc = crc32c_raw(seed, group_le);
    crc = crc32c_raw(crc, &bytes[..BG_CHECKSUM]);
    crc = crc32c_raw(crc, &[0, 0]);
    crc32c_raw(crc, &bytes[BG_CHECKSUM + 2..])
}

/// The descriptor checksum over `bytes` (one descriptor), with the checksum
/// field itself taken as zero.
fn checksum(geo: &Geometry, group: u32, bytes: &[u8]) -> u16 {
    let group_le = group.to_le_bytes();
    if geo.metadata_csum {
        (crc32c_descriptor(geo.csum_seed, &group_le, bytes) & 0xFFFF) as u16
    } else {
        let mut crc = crc16(!0, &geo.uuid);
        crc = crc16(crc, &group_le);
        crc = crc16(crc, &bytes[..BG_CHECKSUM]);
        if geo.has_incompat(super::superblock::incompat::BIT64) && bytes.len() > BG_CHECKSUM + 2 {
            crc = crc16(crc, &bytes[BG_CHECKSUM + 2..]);
        }
        crc
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The kernel's four calls in turn, as the reference for the one call.
    fn four_calls(seed: u32, group_le: &[u8; 4], bytes: &[u8]) -> u32 {
        let mut crc = crc32c_raw(seed, group_le);
        crc = crc32c_raw(crc, &bytes[..BG_CHECKSUM]);
        crc = crc32c_raw(crc, &[0, 0]);
        crc32c_raw(crc, &bytes[BG_CHECKSUM + 2..])
    }

    #[test]
    fn one_call_descriptor_crc_matches_four_calls() {
        for len in [32usize, 64, 128] {
            let bytes: Vec<u8> = (0..len).map(|i| (i * 37 + 11) as u8).collect();
            let group_le = 0x0102_0304u32.to_le_bytes();
            let seed = 0xDEAD_BEEF;
            assert_eq!(
                crc32c_descriptor(seed, &group_le, &bytes),
                four_calls(seed, &group_le, &bytes),
                "descriptor of {len} bytes"
            );
        }
    }
}
