//! The hasher of the engine's maps keyed by block or inode number (the
//! buffer cache, the inode locks), used by every layer like `lock.rs`.
//!
//! std's SipHash guards against keys chosen to collide; these keys are
//! numbers the engine itself hands out or reads from its own image, and a
//! lookup happens several times per request: SipHash was about 5 % of the
//! server's instructions in an untar. This one mixes the number with
//! splitmix64's finaliser, so keys alike in their low bits (block numbers
//! a power of two apart) still spread over the table's buckets.

use std::collections::{HashMap, HashSet};
use std::hash::{BuildHasherDefault, Hasher};

/// A `HashMap` keyed by a block or inode number.
pub type NumberMap<K, V> = HashMap<K, V, BuildHasherDefault<NumberHasher>>;
/// A `HashSet` of block or inode numbers.
pub type NumberSet<K> = HashSet<K, BuildHasherDefault<NumberHasher>>;

/// Hashes one integer key (`write_u32` / `write_u64`); other writes fold
/// their bytes in, so any key type stays correct, only slower.
#[derive(Debug, Default, Clone, Copy)]
pub struct NumberHasher {
    state: u64,
}

impl NumberHasher {
    fn mix(&mut self, value: u64) {
        let mut z = (self.state ^ value).wrapping_add(0x9E37_79B9_7F4A_7C15);
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        self.state = z ^ (z >> 31);
    }
}

impl Hasher for NumberHasher {
    fn finish(&self) -> u64 {
        self.state
    }

    fn write(&mut self, bytes: &[u8]) {
        for chunk in bytes.chunks(8) {
            let mut word = [0u8; 8];
            word[..chunk.len()].copy_from_slice(chunk);
            self.mix(u64::from_le_bytes(word));
        }
    }

    fn write_u32(&mut self, value: u32) {
        self.mix(value as u64);
    }

    fn write_u64(&mut self, value: u64) {
        self.mix(value);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;
    use std::hash::BuildHasher;

    fn hash<T: std::hash::Hash>(value: T) -> u64 {
        BuildHasherDefault::<NumberHasher>::default().hash_one(value)
    }

    /// Keys a power of two apart (block numbers of group starts) land in
    /// distinct buckets of a small table, as sequential keys do.
    #[test]
    fn numbers_alike_in_their_low_bits_spread() {
        for stride in [1u64, 8, 1024, 32768, 1 << 20] {
            let buckets: HashSet<u64> = (0..256u64).map(|i| hash(i * stride) & 1023).collect();
            assert!(
                buckets.len() > 200,
                "stride {stride}: {} buckets",
                buckets.len()
            );
        }
        assert_ne!(hash(1u32), hash(2u32));
        assert_eq!(hash(7u64), hash(7u64));
    }

    #[test]
    fn a_map_finds_what_it_holds() {
        let mut map: NumberMap<u64, u64> = NumberMap::default();
        for key in (0..10_000u64).map(|i| i * 4096) {
            map.insert(key, key + 1);
        }
        assert!((0..10_000u64).all(|i| map.get(&(i * 4096)) == Some(&(i * 4096 + 1))));
        assert_eq!(map.get(&1), None);
    }
}
