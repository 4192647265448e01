//! Orphan file blocks (the `orphan_file` feature): each block of the
//! orphan file holds an array of inode numbers (0 = free slot) and a tail
//! with a magic number and a checksum over the array, seeded with the
//! orphan file inode's seed and the block's physical number.
//!
//! The classic orphan list needs no format code: it is a chain through
//! `s_last_orphan` and each inode's `i_dtime`.

use super::csum::crc32c_raw;
use super::{get_u32, put_u32};
use crate::ensure_format;
use crate::error::{Location, Result};

pub const ORPHAN_BLOCK_MAGIC: u32 = 0x0B10_CA04;
const TAIL_SIZE: usize = 8;

/// Inode slots in one orphan file block.
pub fn slots_per_block(block_size: usize) -> usize {
    (block_size - TAIL_SIZE) / 4
}

pub fn slot(block: &[u8], index: usize) -> u32 {
    get_u32(block, index * 4)
}

pub fn set_slot(block: &mut [u8], index: usize, ino: u32) {
    put_u32(block, index * 4, ino);
}

fn checksum(block: &[u8], physical: u64, seed: u32) -> u32 {
    let crc = crc32c_raw(seed, &physical.to_le_bytes());
    crc32c_raw(crc, &block[..slots_per_block(block.len()) * 4])
}

/// Check the magic and (with metadata_csum) the checksum of a block read
/// from physical block `physical`.
pub fn verify(block: &[u8], physical: u64, seed: Option<u32>) -> Result<()> {
    let tail = block.len() - TAIL_SIZE;
    let location = Location::Block { block: physical };
    let magic = get_u32(block, tail);
    ensure_format!(
        magic == ORPHAN_BLOCK_MAGIC,
        location,
        "orphan file block has bad magic {magic:#x}"
    );
    if let Some(seed) = seed {
        let stored = get_u32(block, tail + 4);
        let computed = checksum(block, physical, seed);
        ensure_format!(
            stored == computed,
            location,
            "orphan file block checksum mismatch"
        );
    }
    Ok(())
}

/// Rewrite the tail after a slot changed.
pub fn set_tail(block: &mut [u8], physical: u64, seed: Option<u32>) {
    let tail = block.len() - TAIL_SIZE;
    put_u32(block, tail, ORPHAN_BLOCK_MAGIC);
    if let Some(seed) = seed {
        let sum = checksum(block, physical, seed);
        put_u32(block, tail + 4, sum);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tail_round_trip_and_detection() {
        let mut block = vec![0u8; 1024];
        set_slot(&mut block, 3, 77);
        set_tail(&mut block, 1234, Some(0xDEAD_BEEF));
        verify(&block, 1234, Some(0xDEAD_BEEF)).unwrap();
        assert_eq!(slot(&block, 3), 77);
        assert_eq!(slots_per_block(1024), 254);
        // Same bytes at another physical block: the checksum catches it.
        assert!(verify(&block, 1235, Some(0xDEAD_BEEF)).is_err());
        block[0] = 1;
        assert!(verify(&block, 1234, Some(0xDEAD_BEEF)).is_err());
    }
}
