//! A small deterministic random source (SplitMix64): the same seed gives
//! the same workloads and the same crash states on every machine, with no
//! dependency whose stream could change between versions. The one
//! generator of the crate and of its tests (workloads, fuzzing, data
//! patterns, directory models).

#[derive(Debug, Clone)]
pub struct Rng {
    state: u64,
}

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng { state: seed }
    }

    /// An independent stream for `purpose` (a workload, a lane, a plan).
    pub fn derive(seed: u64, purpose: &str) -> Self {
        let mut rng = Rng::new(seed);
        for byte in purpose.bytes() {
            rng.state ^= byte as u64;
            rng.next_u64();
        }
        rng
    }

    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `0..bound` (`bound` > 0).
    pub fn below(&mut self, bound: u64) -> u64 {
        debug_assert!(bound > 0);
        // The bias of a plain modulo is below 2^-32 for the bounds used here.
        self.next_u64() % bound
    }

    /// Uniform in `low..=high`.
    pub fn range(&mut self, low: u64, high: u64) -> u64 {
        debug_assert!(low <= high);
        low + self.below(high - low + 1)
    }

    /// True with probability `numerator / denominator`.
    pub fn chance(&mut self, numerator: u64, denominator: u64) -> bool {
        self.below(denominator) < numerator
    }

    pub fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len() as u64) as usize]
    }

    /// `len` pseudo-random bytes.
    pub fn bytes(&mut self, len: usize) -> Vec<u8> {
        let mut bytes = Vec::with_capacity(len + 8);
        while bytes.len() < len {
            bytes.extend_from_slice(&self.next_u64().to_le_bytes());
        }
        bytes.truncate(len);
        bytes
    }

    pub fn shuffle<T>(&mut self, items: &mut [T]) {
        for index in (1..items.len()).rev() {
            let other = self.below(index as u64 + 1) as usize;
            items.swap(index, other);
        }
    }
}

/// A 64-bit mix of `value` (for data patterns keyed by position).
pub fn mix(value: u64) -> u64 {
    Rng::new(value).next_u64()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deterministic_and_spread() {
        let a: Vec<u64> = (0..4).map(|_| Rng::new(7).next_u64()).collect();
        assert!(a.windows(2).all(|pair| pair[0] == pair[1]));
        let mut rng = Rng::derive(7, "plan");
        let mut seen = [0u32; 4];
        for _ in 0..4000 {
            seen[rng.below(4) as usize] += 1;
        }
        assert!(
            seen.iter().all(|&count| (800..1200).contains(&count)),
            "{seen:?}"
        );
        assert_ne!(
            Rng::derive(7, "a").next_u64(),
            Rng::derive(7, "b").next_u64()
        );
    }
}
