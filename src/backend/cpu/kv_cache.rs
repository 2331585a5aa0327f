//! The CPU's KV cache: rows of one [`KvType`], allocated zeroed (the pages
//! of a long context are only taken as they are written), read back a
//! head at a time by the attention kernels.

use crate::backend::kv::{q8_block, KvType, Q8_BLOCK};
use crate::error::{Error, Result};
use half::slice::HalfFloatSliceExt;
use half::{bf16, f16};

enum Store {
    F32(Vec<f32>),
    /// f16 or bf16 bits.
    Half(Vec<u16>),
    /// Codes `[rows, width]` and scales `[rows, width / 32]` (f16 bits).
    Q8 {
        qs: Vec<i8>,
        d: Vec<u16>,
    },
}

pub struct CpuCache {
    t: KvType,
    width: usize,
    rows: usize,
    data: Store,
}

impl CpuCache {
    pub fn new(t: KvType, rows: usize, width: usize) -> Result<CpuCache> {
        t.check_width(width, width, "this cache")?;
        let n = rows
            .checked_mul(width)
            .ok_or_else(|| Error::Invalid(format!("a KV cache of {rows} rows of {width} overflows")))?;
        let data = match t {
            KvType::F32 => Store::F32(vec![0.0; n]),
            KvType::F16 | KvType::Bf16 => Store::Half(vec![0; n]),
            KvType::Q8_0 => Store::Q8 {
                qs: vec![0; n],
                d: vec![0; n / Q8_BLOCK],
            },
        };
        Ok(CpuCache { t, width, rows, data })
    }

    pub fn width(&self) -> usize {
        self.width
    }

    fn check(&self, row0: usize, n: usize, what: &str) -> Result<()> {
        match row0.checked_add(n) {
            Some(end) if end <= self.rows => Ok(()),
            _ => Err(Error::Invalid(format!(
                "{what}: rows {row0}..{} of a KV cache of {} rows",
                row0.saturating_add(n),
                self.rows
            ))),
        }
    }

    /// Rows from `row0` = `src` (whole rows of `width`).
    pub fn store(&mut self, src: &[f32], row0: usize) -> Result<()> {
        let n = src.len() / self.width.max(1);
        self.check(row0, n, "KV cache store")?;
        let at = row0 * self.width;
        match &mut self.data {
            Store::F32(v) => v[at..at + src.len()].copy_from_slice(src),
            Store::Half(v) => {
                let dst = &mut v[at..at + src.len()];
                if self.t == KvType::F16 {
                    bytemuck::cast_slice_mut::<u16, f16>(dst).convert_from_f32_slice(src);
                } else {
                    bytemuck::cast_slice_mut::<u16, bf16>(dst).convert_from_f32_slice(src);
                }
            }
            Store::Q8 { qs, d } => {
                for (b, x) in src.chunks_exact(Q8_BLOCK).enumerate() {
                    let (scale, codes) = q8_block(x);
                    d[at / Q8_BLOCK + b] = scale.to_bits();
                    qs[at + b * Q8_BLOCK..][..Q8_BLOCK].copy_from_slice(&codes);
                }
            }
        }
        Ok(())
    }

    /// Rows from `row0`, decoded into `out` (whole rows).
    pub fn load(&self, row0: usize, out: &mut [f32]) -> Result<()> {
        let n = out.len() / self.width.max(1);
        self.check(row0, n, "KV cache read")?;
        let at = row0 * self.width;
        let mut tmp = Vec::new();
        for (r, o) in out.chunks_exact_mut(self.width).enumerate() {
            let got = self.span(at + r * self.width, self.width, &mut tmp);
            o.copy_from_slice(got);
        }
        Ok(())
    }

    /// Values `[at, at + len)` of the cache (`at` and `len` whole q8_0
    /// blocks for that type): a slice of the cache itself when it is f32,
    /// else decoded into `tmp`.
    #[inline]
    pub fn span<'a>(&'a self, at: usize, len: usize, tmp: &'a mut Vec<f32>) -> &'a [f32] {
        match &self.data {
            Store::F32(v) => &v[at..at + len],
            Store::Half(v) => {
                tmp.resize(len, 0.0);
                let src = &v[at..at + len];
                if self.t == KvType::F16 {
                    bytemuck::cast_slice::<u16, f16>(src).convert_to_f32_slice(tmp);
                } else {
                    bytemuck::cast_slice::<u16, bf16>(src).convert_to_f32_slice(tmp);
                }
                tmp
            }
            Store::Q8 { qs, d } => {
                tmp.resize(len, 0.0);
                for (b, (o, q)) in tmp
                    .chunks_exact_mut(Q8_BLOCK)
                    .zip(qs[at..at + len].chunks_exact(Q8_BLOCK))
                    .enumerate()
                {
                    let s = f16::from_bits(d[at / Q8_BLOCK + b]).to_f32();
                    for (x, &c) in o.iter_mut().zip(q) {
                        *x = c as f32 * s;
                    }
                }
                tmp
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each type stores and reads back what the shared row encoding gives.
    #[test]
    fn rows_read_back_as_the_row_encoding_decodes_them() {
        let width = 64;
        let x: Vec<f32> = (0..3 * width).map(|i| ((i * 37 % 101) as f32 - 50.0) / 7.0).collect();
        for t in KvType::ALL {
            let mut c = CpuCache::new(t, 8, width).unwrap();
            c.store(&x, 4).unwrap();
            let mut got = vec![0.0; x.len()];
            c.load(4, &mut got).unwrap();
            let mut bytes = vec![0u8; 3 * t.row_bytes(width)];
            t.encode(&x, width, &mut bytes);
            let mut want = vec![0.0; x.len()];
            t.decode(&bytes, width, &mut want);
            assert_eq!(got, want, "{t}");
            assert!(c.store(&x, 6).is_err(), "{t}: rows past the end are refused");
        }
    }
}
