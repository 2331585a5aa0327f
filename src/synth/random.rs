//! The random numbers synth draws from: a small seedable generator, the
//! mixing of names and seeds into keys, and the spread of group scales.

/// SplitMix64: a tiny, fast generator with good statistics for this use.
pub struct SplitMix64(u64);

impl SplitMix64 {
    pub fn new(seed: u64) -> SplitMix64 {
        SplitMix64(seed)
    }
    #[inline]
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// Uniform in `[0, 1)`.
    #[inline]
    pub fn unit(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 * (1.0 / (1u64 << 24) as f32)
    }
}

/// Mix two words into a seed.
pub fn mix(a: u64, b: u64) -> u64 {
    SplitMix64::new(a ^ b.rotate_left(32).wrapping_mul(0xD6E8_FEB8_6659_FD93)).next_u64()
}

/// A stable key for a name (FNV-1a), mixed with the run's seed.
pub fn key(seed: u64, name: &str) -> u64 {
    let mut h: u64 = 0xCBF2_9CE4_8422_2325;
    for b in name.bytes() {
        h = (h ^ b as u64).wrapping_mul(0x0000_0100_0000_01B3);
    }
    mix(seed, h)
}

/// Jitter of a group's scale: `base · [0.75, 1.25)`.
const SCALE_JITTER: f32 = 0.5;

/// A group's scale jitter, in `[0.75, 1.25)`.
#[inline]
pub fn jitter(rng: &mut SplitMix64) -> f32 {
    1.0 - SCALE_JITTER / 2.0 + SCALE_JITTER * rng.unit()
}

/// The group scale (before jitter) and the top level `2^bits − 1` of
/// values quantized at `bits`, uniform on the levels, centred on zero,
/// with standard deviation `std`.
pub fn group_scale(std: f32, bits: u32) -> (f32, f32) {
    let levels = ((1u32 << bits) - 1) as f32;
    // q uniform on {0..levels}: variance ((levels+1)² − 1)/12.
    let q_std = (((levels + 1.0) * (levels + 1.0) - 1.0) / 12.0).sqrt();
    (std / q_std, levels)
}

/// `n` deterministic token ids (xorshift) spread over `[0, vocab)`: the
/// inputs of `bench` and of measurements that need any tokens at all.
pub fn token_ids(n: usize, vocab: usize, seed: u64) -> Vec<u32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s % vocab.max(1) as u64) as u32
        })
        .collect()
}
