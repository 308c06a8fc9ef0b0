//! The seeded randomness of a run (SplitMix64): the same seed gives the same
//! fault kinds, durations and gaps, and the same contender behaviour choices.

use std::time::Duration;

/// A small seeded generator; not for cryptography.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// A generator for `seed`, mixed with `stream` so that several generators
    /// from one seed (the nemesis, each contender) do not repeat each other.
    pub fn new(seed: u64, stream: u64) -> Self {
        let mut rng = Rng(seed ^ stream.wrapping_mul(0x9E37_79B9_7F4A_7C15));
        rng.next_u64();
        rng
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A number in `0..n` (`n > 0`).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n.max(1) as u64) as usize
    }

    /// True with probability `p`.
    pub fn chance(&mut self, p: f64) -> bool {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64 <= p
    }

    /// A duration between `lo` and `hi` milliseconds.
    pub fn millis(&mut self, lo: u64, hi: u64) -> Duration {
        Duration::from_millis(lo + self.next_u64() % (hi.saturating_sub(lo) + 1))
    }
}

#[cfg(test)]
mod tests {
    use super::Rng;

    #[test]
    fn one_seed_gives_one_sequence_and_streams_differ() {
        let a: Vec<u64> = (0..4)
            .map({
                let mut rng = Rng::new(7, 0);
                move |_| rng.next_u64()
            })
            .collect();
        let b: Vec<u64> = (0..4)
            .map({
                let mut rng = Rng::new(7, 0);
                move |_| rng.next_u64()
            })
            .collect();
        let c: Vec<u64> = (0..4)
            .map({
                let mut rng = Rng::new(7, 1);
                move |_| rng.next_u64()
            })
            .collect();
        assert_eq!(a, b);
        assert_ne!(a, c);
        let mut rng = Rng::new(1, 2);
        for _ in 0..1000 {
            let d = rng.millis(10, 20);
            assert!((10..=20).contains(&d.as_millis()), "{d:?}");
            assert!(rng.below(3) < 3);
        }
    }
}
