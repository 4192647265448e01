//! The multi-mount protection block (`mmp` feature; ext4.h `struct
//! mmp_struct`, e2fsprogs lib/ext2fs/mmp.c): one block, named by the
//! superblock's `s_mmp_block`, whose sequence number a mounted filesystem
//! keeps changing every `s_mmp_update_interval` seconds. A would-be second
//! user reads it, waits longer than an update takes, and reads it again:
//! a changed sequence means the filesystem is in use elsewhere.
//!
//! Layout (little-endian): magic u32, seq u32, time u64, nodename u8 × 64,
//! bdevname u8 × 32, check_interval u16, pad u16, pad u32 × 226, checksum
//! u32 at byte 1020 — CRC32C with the filesystem's checksum seed over the
//! bytes before it, when the filesystem has metadata_csum.

use super::{get_u16, get_u32, get_u64, put_u16, put_u32, put_u64};
use crate::error::{Error, Location, Result};
use crate::format::csum::crc32c_raw;

/// "MMP" in ASCII.
pub const MMP_MAGIC: u32 = 0x004D_4D50;
/// `mmp_seq` of a cleanly unmounted filesystem.
pub const SEQ_CLEAN: u32 = 0xFF4D_4D50;
/// `mmp_seq` while e2fsck runs.
pub const SEQ_FSCK: u32 = 0xE24D_4D50;
/// The largest sequence number of a live mount.
pub const SEQ_MAX: u32 = 0xE24D_4D4F;
/// The kernel's EXT4_MMP_MIN_CHECK_INTERVAL, in seconds.
pub const MIN_CHECK_INTERVAL: u16 = 5;
/// EXT4_MMP_MAX_CHECK_INTERVAL, in seconds.
pub const MAX_CHECK_INTERVAL: u16 = 300;
/// EXT4_MMP_CHECK_MULT: the check interval is this many update intervals.
pub const CHECK_MULT: u16 = 2;

const MAGIC: usize = 0;
const SEQ: usize = 4;
const TIME: usize = 8;
const NODENAME: usize = 16;
const NODENAME_SIZE: usize = 64;
const BDEVNAME: usize = NODENAME + NODENAME_SIZE;
const BDEVNAME_SIZE: usize = 32;
const CHECK_INTERVAL: usize = BDEVNAME + BDEVNAME_SIZE;
/// Where the checksum lives: the end of `struct mmp_struct` (1024 bytes).
const CHECKSUM: usize = 1020;
/// Bytes of the block the structure occupies.
pub const MMP_SIZE: usize = CHECKSUM + 4;

/// The contents of an MMP block.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mmp {
    pub seq: u32,
    /// Seconds since the epoch of the last update.
    pub time: u64,
    /// The host name of the last updater (not NUL-terminated when full).
    pub nodename: [u8; NODENAME_SIZE],
    /// The device the last updater used.
    pub bdevname: [u8; BDEVNAME_SIZE],
    /// Seconds a checker must wait at least (the updater's own measure).
    pub check_interval: u16,
}

impl Mmp {
    /// A block naming `nodename` and `bdevname` (truncated to fit).
    pub fn new(seq: u32, time: u64, nodename: &str, bdevname: &str, check_interval: u16) -> Mmp {
        let mut mmp = Mmp {
            seq,
            time,
            nodename: [0; NODENAME_SIZE],
            bdevname: [0; BDEVNAME_SIZE],
            check_interval,
        };
        copy_name(&mut mmp.nodename, nodename);
        copy_name(&mut mmp.bdevname, bdevname);
        mmp
    }

    /// Decode `bytes` (the start of the MMP block), checking the magic and,
    /// with metadata_csum (`seed`), the checksum.
    pub fn decode(bytes: &[u8], block: u64, seed: Option<u32>) -> Result<Mmp> {
        let location = Location::Block { block };
        if bytes.len() < MMP_SIZE {
            return Err(Error::corrupt(
                location,
                "MMP block shorter than its structure",
            ));
        }
        let magic = get_u32(bytes, MAGIC);
        if magic != MMP_MAGIC {
            return Err(Error::corrupt(
                location,
                format!("bad MMP magic {magic:#010x}"),
            ));
        }
        if let Some(seed) = seed {
            let stored = get_u32(bytes, CHECKSUM);
            let computed = checksum(bytes, seed);
            if stored != computed {
                return Err(Error::corrupt(
                    location,
                    format!(
                        "MMP checksum mismatch (stored {stored:#010x}, computed {computed:#010x})"
                    ),
                ));
            }
        }
        let mut mmp = Mmp {
            seq: get_u32(bytes, SEQ),
            time: get_u64(bytes, TIME),
            nodename: [0; NODENAME_SIZE],
            bdevname: [0; BDEVNAME_SIZE],
            check_interval: get_u16(bytes, CHECK_INTERVAL),
        };
        mmp.nodename
            .copy_from_slice(&bytes[NODENAME..NODENAME + NODENAME_SIZE]);
        mmp.bdevname
            .copy_from_slice(&bytes[BDEVNAME..BDEVNAME + BDEVNAME_SIZE]);
        Ok(mmp)
    }

    /// Encode into `bytes` (the start of the MMP block; the padding is
    /// zeroed), with the checksum when `seed` is given.
    pub fn encode(&self, bytes: &mut [u8], seed: Option<u32>) {
        debug_assert!(bytes.len() >= MMP_SIZE);
        bytes[..MMP_SIZE].fill(0);
        put_u32(bytes, MAGIC, MMP_MAGIC);
        put_u32(bytes, SEQ, self.seq);
        put_u64(bytes, TIME, self.time);
        bytes[NODENAME..NODENAME + NODENAME_SIZE].copy_from_slice(&self.nodename);
        bytes[BDEVNAME..BDEVNAME + BDEVNAME_SIZE].copy_from_slice(&self.bdevname);
        put_u16(bytes, CHECK_INTERVAL, self.check_interval);
        if let Some(seed) = seed {
            put_u32(bytes, CHECKSUM, checksum(bytes, seed));
        }
    }

    pub fn nodename(&self) -> String {
        name_text(&self.nodename)
    }

    pub fn bdevname(&self) -> String {
        name_text(&self.bdevname)
    }
}

/// `ext4_mmp_csum`: CRC32C of the structure before its checksum field.
fn checksum(bytes: &[u8], seed: u32) -> u32 {
    crc32c_raw(seed, &bytes[..CHECKSUM])
}

fn copy_name(field: &mut [u8], name: &str) {
    let bytes = name.as_bytes();
    let length = bytes.len().min(field.len());
    field[..length].copy_from_slice(&bytes[..length]);
}

fn name_text(field: &[u8]) -> String {
    let end = field.iter().position(|&b| b == 0).unwrap_or(field.len());
    String::from_utf8_lossy(&field[..end]).into_owned()
}

/// How long a checker waits between its two reads (ext4_multi_mount_protect,
/// ext2fs_mmp_start): the check interval is the superblock's update
/// interval, at least `MIN_CHECK_INTERVAL`, or the block's own if longer;
/// the wait is twice that plus one second, at most a minute more than it.
pub fn wait_seconds(update_interval: u16, block_check_interval: u16) -> u64 {
    let check = update_interval
        .max(MIN_CHECK_INTERVAL)
        .max(block_check_interval) as u64;
    (2 * check + 1).min(check + 60)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_with_and_without_checksum() {
        let mmp = Mmp::new(
            42,
            1_700_000_000,
            "a-host-name-that-is-much-longer-than-sixty-four-bytes-so-it-gets-cut",
            "disk.img",
            10,
        );
        let mut block = vec![0xAAu8; 1024];
        mmp.encode(&mut block, Some(0x1234_5678));
        let decoded = Mmp::decode(&block, 7, Some(0x1234_5678)).unwrap();
        assert_eq!(decoded, mmp);
        assert_eq!(decoded.nodename().len(), 64);
        assert_eq!(decoded.bdevname(), "disk.img");
        // A damaged byte fails the checksum, not without metadata_csum.
        block[500] ^= 1;
        assert!(Mmp::decode(&block, 7, Some(0x1234_5678)).is_err());
        assert!(Mmp::decode(&block, 7, None).is_ok());
        block[0] = 0;
        assert!(Mmp::decode(&block, 7, None).is_err());
        assert!(Mmp::decode(&block[..100], 7, None).is_err());
    }

    #[test]
    fn waits_as_the_kernel_does() {
        // mke2fs's default interval (5 s): 11 s; a block asking for more.
        assert_eq!(wait_seconds(5, 0), 11);
        assert_eq!(wait_seconds(1, 5), 11);
        assert_eq!(wait_seconds(5, 20), 41);
        assert_eq!(wait_seconds(300, 0), 360);
    }
}
