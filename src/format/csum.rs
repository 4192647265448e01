//! Checksum primitives shared by every structure.
//!
//! ext4's `ext4_chksum(crc, buf)` is a raw CRC32C update
//! (`crate::bytes::crc32c_raw`, which the journal shares). Each structure
//! module then exposes the same trio — `compute`, `verify`, `set` — built
//! on these.

pub use crate::bytes::crc32c_raw;

/// The filesystem-wide seed: `s_checksum_seed` with metadata_csum_seed, else
/// the raw CRC of the UUID.
pub fn fs_seed(uuid: &[u8; 16], stored_seed: Option<u32>) -> u32 {
    match stored_seed {
        Some(seed) => seed,
        None => crc32c_raw(!0, uuid),
    }
}

/// Per-inode seed used by inodes, extent blocks, directory blocks, htree
/// nodes and the orphan file: raw CRC of the inode number then generation.
pub fn inode_seed(fs_seed: u32, ino: u32, generation: u32) -> u32 {
    // One CRC over both numbers, as the kernel's two in turn give (a CRC
    // continues over concatenated input): computed for every inode read
    // or written, several per request.
    let mut bytes = [0u8; 8];
    bytes[..4].copy_from_slice(&ino.to_le_bytes());
    bytes[4..].copy_from_slice(&generation.to_le_bytes());
    crc32c_raw(fs_seed, &bytes)
}

/// CRC-16 (ANSI, reflected polynomial 0xA001) as the kernel's `crc16()`,
/// used only by the older gdt_csum (uninit_bg) group descriptor checksum.
pub fn crc16(mut crc: u16, data: &[u8]) -> u16 {
    for &byte in data {
        crc ^= byte as u16;
        for _ in 0..8 {
            crc = if crc & 1 != 0 {
                (crc >> 1) ^ 0xA001
            } else {
                crc >> 1
            };
        }
    }
    crc
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn raw_crc_is_complement_of_standard() {
        // Standard CRC32C("123456789") = 0xE3069283; raw from ~0 is its complement.
        assert_eq!(crc32c::crc32c(b"123456789"), 0xE306_9283);
        assert_eq!(crc32c_raw(!0, b"123456789"), !0xE306_9283);
        // Chaining raw updates equals one update over the concatenation.
        let chained = crc32c_raw(crc32c_raw(!0, b"1234"), b"56789");
        assert_eq!(chained, crc32c_raw(!0, b"123456789"));
    }

    #[test]
    fn inode_seed_is_the_number_then_the_generation() {
        // ext4_iget: csum = ext4_chksum(s_csum_seed, &inum, 4), then over
        // &gen, 4 from there.
        for (seed, ino, generation) in [
            (!0u32, 2u32, 0u32),
            (0x1234_5678, 12, 0xDEAD_BEEF),
            (7, u32::MAX, 1),
        ] {
            let two_steps = crc32c_raw(
                crc32c_raw(seed, &ino.to_le_bytes()),
                &generation.to_le_bytes(),
            );
            assert_eq!(inode_seed(seed, ino, generation), two_steps);
        }
        assert_ne!(
            inode_seed(!0, 12, 1),
            inode_seed(!0, 1, 12),
            "order matters"
        );
    }

    #[test]
    fn crc16_matches_reference_vector() {
        // CRC-16/ARC("123456789") with init 0 is 0xBB3D.
        assert_eq!(crc16(0, b"123456789"), 0xBB3D);
    }
}
