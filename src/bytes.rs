//! Byte helpers every layer shares: little-endian field access (the ext4
//! on-disk format is little-endian everywhere; JBD2's big-endian fields
//! have their own helpers in `journal::format`) and the raw CRC32C update
//! both ext4 and JBD2 checksum with. They sit below the layers, so that
//! the journal, which frames ext4's fast-commit records, and the on-disk
//! format, which writes through the journal, need not import each other
//! for them.

/// Raw CRC32C update, as `ext4_chksum` / `jbd2_chksum` compute it: no
/// inversion on entry or exit (the kernel seeds it with `~0` where a
/// standard CRC would start, and stores the raw register). The `crc32c`
/// crate computes standard CRCs (inverted in and out), so the raw form is
/// its complement taken on both sides.
#[inline]
pub fn crc32c_raw(seed: u32, data: &[u8]) -> u32 {
    !crc32c::crc32c_append(!seed, data)
}

#[inline]
pub fn get_u8(bytes: &[u8], offset: usize) -> u8 {
    bytes[offset]
}

#[inline]
pub fn get_u16(bytes: &[u8], offset: usize) -> u16 {
    u16::from_le_bytes([bytes[offset], bytes[offset + 1]])
}

#[inline]
pub fn get_u32(bytes: &[u8], offset: usize) -> u32 {
    u32::from_le_bytes(bytes[offset..offset + 4].try_into().unwrap())
}

#[inline]
pub fn get_u64(bytes: &[u8], offset: usize) -> u64 {
    u64::from_le_bytes(bytes[offset..offset + 8].try_into().unwrap())
}

#[inline]
pub fn put_u8(bytes: &mut [u8], offset: usize, value: u8) {
    bytes[offset] = value;
}

#[inline]
pub fn put_u16(bytes: &mut [u8], offset: usize, value: u16) {
    bytes[offset..offset + 2].copy_from_slice(&value.to_le_bytes());
}

#[inline]
pub fn put_u32(bytes: &mut [u8], offset: usize, value: u32) {
    bytes[offset..offset + 4].copy_from_slice(&value.to_le_bytes());
}

#[inline]
pub fn put_u64(bytes: &mut [u8], offset: usize, value: u64) {
    bytes[offset..offset + 8].copy_from_slice(&value.to_le_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_are_little_endian() {
        let mut bytes = [0u8; 16];
        put_u16(&mut bytes, 0, 0x0102);
        put_u32(&mut bytes, 2, 0x0304_0506);
        put_u64(&mut bytes, 6, 0x0708_090a_0b0c_0d0e);
        put_u8(&mut bytes, 14, 0xff);
        assert_eq!(&bytes[..6], &[0x02, 0x01, 0x06, 0x05, 0x04, 0x03]);
        assert_eq!(get_u16(&bytes, 0), 0x0102);
        assert_eq!(get_u32(&bytes, 2), 0x0304_0506);
        assert_eq!(get_u64(&bytes, 6), 0x0708_090a_0b0c_0d0e);
        assert_eq!(get_u8(&bytes, 14), 0xff);
    }
}
