//! The element types of the KV caches (`--cache-type-k`, `--cache-type-v`;
//! SPEC.md §4 and §6) and their row encoding, the same on every backend
//! and in snapshots:
//!
//! | type | a row of `width` values |
//! |---|---|
//! | `f32` | `width` f32, little-endian |
//! | `f16` | `width` IEEE half |
//! | `bf16` | `width` bfloat16 |
//! | `q8_0` | `width` i8, then `width / 32` f16 scales: value `i` is `q[i] · d[i / 32]` |
//!
//! q8_0 rounds as llama.cpp's block of the same name: `d = max|x| / 127`,
//! `q = round(x / d)`, d kept as f16. Decoding and encoding again gives the
//! same bytes, so a snapshot round-trips through f32.

use crate::error::{Error, Result};
use half::{bf16, f16};

/// Values per q8_0 block (one scale).
pub const Q8_BLOCK: usize = 32;

/// The element type of a KV cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum KvType {
    F32,
    F16,
    Bf16,
    Q8_0,
}

impl KvType {
    pub const ALL: [KvType; 4] = [KvType::F32, KvType::F16, KvType::Bf16, KvType::Q8_0];

    /// llama.cpp's name (`-ctk`/`-ctv`).
    pub fn name(self) -> &'static str {
        match self {
            KvType::F32 => "f32",
            KvType::F16 => "f16",
            KvType::Bf16 => "bf16",
            KvType::Q8_0 => "q8_0",
        }
    }

    /// The code of the type in snapshots and kernels.
    pub fn code(self) -> u32 {
        match self {
            KvType::F32 => 0,
            KvType::F16 => 1,
            KvType::Bf16 => 2,
            KvType::Q8_0 => 3,
        }
    }

    pub fn from_code(c: u32) -> Option<KvType> {
        KvType::ALL.into_iter().find(|t| t.code() == c)
    }

    /// Bytes of one row of `width` values.
    pub fn row_bytes(self, width: usize) -> usize {
        match self {
            KvType::F32 => 4 * width,
            KvType::F16 | KvType::Bf16 => 2 * width,
            KvType::Q8_0 => width + 2 * (width / Q8_BLOCK),
        }
    }

    /// Whether rows of `width` values (heads of `head` values each, a head
    /// being the unit one attention reads) can be kept in this type.
    pub fn check_width(self, width: usize, head: usize, what: &str) -> Result<()> {
        if self == KvType::Q8_0 && (!width.is_multiple_of(Q8_BLOCK) || !head.is_multiple_of(Q8_BLOCK)) {
            return Err(Error::Invalid(format!(
                "a q8_0 KV cache needs rows of whole blocks of {Q8_BLOCK}: {what} has heads of {head} values \
                 (use f16, bf16 or f32)"
            )));
        }
        Ok(())
    }

    /// Encode `src` (rows of `width`) into `dst` (`rows · row_bytes`).
    pub fn encode(self, src: &[f32], width: usize, dst: &mut [u8]) {
        let rb = self.row_bytes(width);
        for (x, out) in src.chunks_exact(width).zip(dst.chunks_exact_mut(rb)) {
            match self {
                KvType::F32 => {
                    for (v, o) in x.iter().zip(out.chunks_exact_mut(4)) {
                        o.copy_from_slice(&v.to_le_bytes());
                    }
                }
                KvType::F16 => {
                    for (v, o) in x.iter().zip(out.chunks_exact_mut(2)) {
                        o.copy_from_slice(&f16::from_f32(*v).to_le_bytes());
                    }
                }
                KvType::Bf16 => {
                    for (v, o) in x.iter().zip(out.chunks_exact_mut(2)) {
                        o.copy_from_slice(&bf16::from_f32(*v).to_le_bytes());
                    }
                }
                KvType::Q8_0 => {
                    let (qs, ds) = out.split_at_mut(width);
                    for ((blk, q), d) in x
                        .chunks_exact(Q8_BLOCK)
                        .zip(qs.chunks_exact_mut(Q8_BLOCK))
                        .zip(ds.chunks_exact_mut(2))
                    {
                        let (scale, codes) = q8_block(blk);
                        d.copy_from_slice(&scale.to_le_bytes());
                        for (o, c) in q.iter_mut().zip(codes) {
                            *o = c as u8;
                        }
                    }
                }
            }
        }
    }

    /// Decode `src` (rows of `width` in this type) into `dst`.
    pub fn decode(self, src: &[u8], width: usize, dst: &mut [f32]) {
        let rb = self.row_bytes(width);
        for (row, out) in src.chunks_exact(rb).zip(dst.chunks_exact_mut(width)) {
            match self {
                KvType::F32 => {
                    for (o, b) in out.iter_mut().zip(row.chunks_exact(4)) {
                        *o = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
                    }
                }
                KvType::F16 => {
                    for (o, b) in out.iter_mut().zip(row.chunks_exact(2)) {
                        *o = f16::from_le_bytes([b[0], b[1]]).to_f32();
                    }
                }
                KvType::Bf16 => {
                    for (o, b) in out.iter_mut().zip(row.chunks_exact(2)) {
                        *o = bf16::from_le_bytes([b[0], b[1]]).to_f32();
                    }
                }
                KvType::Q8_0 => {
                    let (qs, ds) = row.split_at(width);
                    for ((o, q), d) in out
                        .chunks_exact_mut(Q8_BLOCK)
                        .zip(qs.chunks_exact(Q8_BLOCK))
                        .zip(ds.chunks_exact(2))
                    {
                        let d = f16::from_le_bytes([d[0], d[1]]).to_f32();
                        for (v, &c) in o.iter_mut().zip(q) {
                            *v = c as i8 as f32 * d;
                        }
                    }
                }
            }
        }
    }
}

/// One q8_0 block: its f16 scale and codes.
pub fn q8_block(x: &[f32]) -> (f16, [i8; Q8_BLOCK]) {
    let amax = x.iter().fold(0.0f32, |m, v| m.max(v.abs()));
    let d = amax / 127.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    let mut q = [0i8; Q8_BLOCK];
    for (o, v) in q.iter_mut().zip(x) {
        *o = (v * id).round() as i8;
    }
    (f16::from_f32(d), q)
}

impl std::fmt::Display for KvType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for KvType {
    type Err = Error;
    fn from_str(s: &str) -> Result<KvType> {
        let t = s.trim().to_ascii_lowercase();
        KvType::ALL
            .into_iter()
            .find(|k| k.name() == t || (t == "q8" && *k == KvType::Q8_0))
            .ok_or_else(|| {
                Error::Invalid(format!(
                    "unknown KV cache type `{s}` (expected f32, f16, bf16 or q8_0; llama.cpp's q4_0 and \
                     other types are not kept here)"
                ))
            })
    }
}

/// The element types of a model's two caches: K (and MLA's latent and
/// rotated key), and V.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KvTypes {
    pub k: KvType,
    pub v: KvType,
}

impl KvTypes {
    pub fn both(t: KvType) -> KvTypes {
        KvTypes { k: t, v: t }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn values(n: usize) -> Vec<f32> {
        let mut s = 0x9e37_79b9u32;
        (0..n)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 17;
                s ^= s << 5;
                (s as f32 / u32::MAX as f32 - 0.5) * 6.0
            })
            .collect()
    }

    /// Each type decodes what it encoded within its precision, and a second
    /// encoding of the decoded values gives the same bytes.
    #[test]
    fn every_type_round_trips() {
        let width = 64;
        let x = values(3 * width);
        for t in KvType::ALL {
            let mut bytes = vec![0u8; 3 * t.row_bytes(width)];
            t.encode(&x, width, &mut bytes);
            let mut y = vec![0.0f32; x.len()];
            t.decode(&bytes, width, &mut y);
            let tol = match t {
                KvType::F32 => 0.0,
                KvType::F16 => 3.0 * 2f32.powi(-11),
                KvType::Bf16 => 3.0 * 2f32.powi(-8),
                // Half a step of the largest value of a block over 127.
                KvType::Q8_0 => 3.0 / 127.0 * 0.51,
            };
            for (a, b) in x.iter().zip(&y) {
                assert!((a - b).abs() <= tol * a.abs().max(1.0), "{t}: {a} became {b}");
            }
            let mut again = vec![0u8; bytes.len()];
            t.encode(&y, width, &mut again);
            assert_eq!(bytes, again, "{t}: a second encoding differs");
        }
    }

    #[test]
    fn names_parse_and_bad_ones_are_named() {
        for t in KvType::ALL {
            assert_eq!(t.name().parse::<KvType>().unwrap(), t);
            assert_eq!(KvType::from_code(t.code()), Some(t));
        }
        let e = "q4_0".parse::<KvType>().unwrap_err().to_string();
        assert!(e.contains("q4_0") && e.contains("f16"), "{e}");
        assert!(KvType::Q8_0.check_width(40, 40, "this model").is_err());
        assert!(KvType::Q8_0.check_width(256, 128, "this model").is_ok());
        assert_eq!(KvType::Q8_0.row_bytes(128), 136);
    }
}
