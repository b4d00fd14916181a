//! SplitMix64, the seeded generator of the tests and of `benches/outage.rs`:
//! a seed fixes every number drawn, so a run can be repeated exactly.
//!
//! The tests reach it as `common::rng`; the outage bench includes it by
//! path (`#[path = "../tests/common/rng.rs"] mod rng;`), without the rest
//! of `tests/common`. Each one uses a different subset, hence the
//! `dead_code` allowance.
#![allow(dead_code)]

/// SplitMix64 (Steele, Lea and Flood): small and well mixed; plenty for
/// picking which calls fail. The field is the state, and at first the seed.
pub struct SplitMix64(pub u64);

impl SplitMix64 {
    /// The next 64 bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `[0, 1)`, from the top 53 bits of the next number.
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
}
