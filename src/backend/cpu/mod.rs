//! The CPU backend: f32 activations in `Vec<f32>`, weights read in place
//! from the mapped model file, rayon for threads.

#[cfg(target_arch = "x86_64")]
mod amx;
mod attn;
mod delta;
mod delta_conv;
#[cfg(all(test, target_arch = "x86_64"))]
mod fast_tests;
pub mod kv_cache;
mod lanes;
pub mod matmul;
pub(crate) mod moe;
#[doc(hidden)]
pub use moe::MoeStep;
mod pool;
mod profile;
mod qmatvec;
#[cfg(target_arch = "x86_64")]
mod simd;
#[cfg(target_arch = "x86_64")]
mod simd512;
mod vector;
#[cfg(target_arch = "x86_64")]
mod vnni;
#[cfg(target_arch = "x86_64")]
mod vnni_gemm;

use super::seqs::{check_segs, Seg, StatePair};
use super::{
    AttnArgs, Backend, DeltaArgs, DeltaState, DeltaWeights, KvType, MlaArgs, MoeArgs, MoeInputs, RopeArgs, Strided,
};
use crate::error::{Error, Result};
use crate::experts::ExpertStore;
use crate::format::MatrixView;
use crate::parallel::for_each_span;
use kv_cache::CpuCache;
use matmul::{CpuMatrix, Kernel};
pub use pool::PoolInfo;
pub use profile::OpTime;
use profile::{Op, OpProfile};

/// The most tokens of a forward pass whose loops run on the spinning
/// workers (a batched decode step of 16 sequences).
pub const SPIN_MAX_TOKENS: usize = 16;

/// The CPU backend. Its parallel loops run on rayon's global pool, or on
/// pools of its own ([`CpuBackend::with_options`]: rayon's, and spinning
/// workers for decode-sized passes) in which [`CpuBackend::run_for`] runs
/// a whole forward pass.
#[derive(Debug)]
pub struct CpuBackend {
    pool: Option<(rayon::ThreadPool, PoolInfo)>,
    /// Spinning workers for the short loops of a decode step (`crate::parallel`).
    spin: Option<crate::parallel::SpinPool>,
    /// The kernel of every matrix product (`Kernel::for_product` narrows
    /// it per product).
    kernel: Kernel,
    prof: OpProfile,
}

impl Default for CpuBackend {
    fn default() -> CpuBackend {
        CpuBackend::new()
    }
}

impl CpuBackend {
    /// Exact products on rayon's global pool (op tests, load checks).
    pub fn new() -> CpuBackend {
        CpuBackend {
            pool: None,
            spin: None,
            kernel: Kernel::detect(),
            prof: OpProfile::default(),
        }
    }

    /// On a pool of `threads` workers (0: one per CPU the process may
    /// use), with exact products or the fastest kernels (SPEC §6).
    pub fn with_options(threads: usize, exact: bool) -> Result<CpuBackend> {
        let (pool, info) = pool::build(threads)?;
        let spin = crate::parallel::SpinPool::new(info.threads)
            .map_err(|e| Error::Invalid(format!("cannot start {} CPU threads: {e}", info.threads)))?;
        Ok(CpuBackend {
            pool: Some((pool, info)),
            spin: Some(spin),
            kernel: Kernel::choose(exact),
            prof: OpProfile::default(),
        })
    }

    /// The kernel of the products.
    pub fn kernel(&self) -> Kernel {
        self.kernel
    }

    /// Time each kind of operation from now on (or stop).
    pub fn set_profiling(&self, on: bool) {
        self.prof.set_enabled(on);
    }

    /// Seconds and calls per kind of operation while profiling was on.
    pub fn op_times(&self) -> Vec<OpTime> {
        self.prof.snapshot()
    }

    pub fn reset_profile(&self) {
        self.prof.reset();
    }

    /// `f` on a worker of this backend's pool, so that its parallel loops
    /// are split among the workers without a hand-off per loop (on the
    /// caller's thread without a pool of its own), the loops on the
    /// spinning workers (`crate::parallel`).
    pub fn run<R: Send>(&self, f: impl FnOnce() -> R + Send) -> R {
        self.run_for(1, f)
    }

    /// `run` for a forward pass over `tokens` tokens: the loops of a
    /// decode-sized pass (up to `SPIN_MAX_TOKENS`) on the spinning
    /// workers, a prefill's on rayon's (long loops, where waking the
    /// workers costs little; on the spinning ones pp512 was 6% slower on
    /// the 16-core device host).
    pub fn run_for<R: Send>(&self, tokens: usize, f: impl FnOnce() -> R + Send) -> R {
        match (&self.pool, &self.spin) {
            (Some((p, _)), Some(s)) if tokens <= SPIN_MAX_TOKENS => p.install(|| s.install(f)),
            (Some((p, _)), _) => p.install(f),
            _ => f(),
        }
    }

    /// The threads that compute (the global pool's when there is no own).
    pub fn pool_info(&self) -> PoolInfo {
        self.pool.as_ref().map_or(
            PoolInfo {
                threads: rayon::current_num_threads(),
            },
            |(_, i)| *i,
        )
    }
}

#[inline]
pub(crate) fn silu(x: f32) -> f32 {
    x / (1.0 + vector::exp(-x))
}

#[inline]
pub(crate) fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + vector::exp(-x))
}

pub(crate) fn rms_norm_row(x: &[f32], w: &[f32], eps: f32, y: &mut [f32]) {
    // Eight partial sums (`dot`), not one chain of dependent additions.
    let ss = vector::dot(x, x) / x.len() as f32;
    let inv = 1.0 / (ss + eps).sqrt();
    for ((o, v), g) in y.iter_mut().zip(x).zip(w) {
        *o = v * inv * g;
    }
}

impl Backend for CpuBackend {
    type Buf = Vec<f32>;
    type Matrix = CpuMatrix;
    type Cache = CpuCache;

    fn name(&self) -> &'static str {
        "cpu"
    }

    fn alloc(&self, len: usize) -> Result<Vec<f32>> {
        Ok(crate::parallel::zeros(len))
    }
    fn upload(&self, data: &[f32]) -> Result<Vec<f32>> {
        Ok(data.to_vec())
    }
    fn download(&self, buf: &Vec<f32>, off: usize, out: &mut [f32]) -> Result<()> {
        let src = off
            .checked_add(out.len())
            .and_then(|end| buf.get(off..end))
            .ok_or_else(|| {
                Error::Invalid(format!(
                    "download of {} elements from {off} of a buffer of {}",
                    out.len(),
                    buf.len()
                ))
            })?;
        out.copy_from_slice(src);
        Ok(())
    }
    fn alloc_cache(&self, t: KvType, rows: usize, width: usize) -> Result<CpuCache> {
        CpuCache::new(t, rows, width)
    }
    fn cache_store(&self, src: &Vec<f32>, src_row: usize, n: usize, cache: &mut CpuCache, row0: usize) -> Result<()> {
        let w = cache.width();
        let rows = src_row
            .checked_add(n)
            .and_then(|end| src.get(src_row * w..end * w))
            .ok_or_else(|| {
                Error::Invalid(format!(
                    "KV cache store of rows {src_row}..{} from a buffer of {} values",
                    src_row.saturating_add(n),
                    src.len()
                ))
            })?;
        self.prof.time(Op::Elementwise, || cache.store(rows, row0))
    }
    fn cache_download(&self, cache: &CpuCache, row0: usize, out: &mut [f32]) -> Result<()> {
        cache.load(row0, out)
    }
    fn cache_upload(&self, cache: &mut CpuCache, row0: usize, _width: usize, data: &[f32]) -> Result<()> {
        cache.store(data, row0)
    }
    fn matrix(&self, m: &MatrixView) -> Result<CpuMatrix> {
        CpuMatrix::new(m)
    }

    fn linear(&self, w: &CpuMatrix, x: &Vec<f32>, n: usize, y: &mut Vec<f32>) -> Result<()> {
        self.prof
            .time(Op::Products, || matmul::linear_with(self.kernel, &w.view, x, n, y))
    }
    fn linear_many(&self, ws: &[&CpuMatrix], x: &Vec<f32>, n: usize, ys: &mut [&mut Vec<f32>]) -> Result<()> {
        self.prof.time(Op::Products, || {
            if ws.len() != ys.len() {
                return Err(crate::error::Error::Invalid(format!(
                    "linear_many: {} matrices and {} outputs",
                    ws.len(),
                    ys.len()
                )));
            }
            let mut ps: Vec<matmul::Product> = ws
                .iter()
                .zip(ys.iter_mut())
                .map(|(w, y)| matmul::Product {
                    w: &w.view,
                    x,
                    n,
                    y: y.as_mut_slice(),
                })
                .collect();
            matmul::linear_set_with(self.kernel, &mut ps)
        })
    }
    fn embed(&self, table: &CpuMatrix, tokens: &[u32], y: &mut Vec<f32>) -> Result<()> {
        self.prof
            .time(Op::Elementwise, || matmul::embed(&table.view, tokens, y))
    }

    fn rms_norm(&self, x: &Vec<f32>, w: &Vec<f32>, rows: usize, dim: usize, eps: f32, y: &mut Vec<f32>) -> Result<()> {
        self.prof.time(Op::Norms, || {
            crate::parallel::for_each_chunk(&mut y[..rows * dim], dim, |t, o| {
                rms_norm_row(&x[t * dim..(t + 1) * dim], w, eps, o)
            });
            Ok(())
        })
    }

    fn gated_rms_norm(
        &self,
        x: &Vec<f32>,
        z: &Vec<f32>,
        w: &Vec<f32>,
        rows: usize,
        dim: usize,
        eps: f32,
        y: &mut Vec<f32>,
    ) -> Result<()> {
        self.prof.time(Op::Norms, || {
            crate::parallel::for_each_chunk(&mut y[..rows * dim], dim, |t, o| {
                rms_norm_row(&x[t * dim..(t + 1) * dim], w, eps, o);
                for (v, gv) in o.iter_mut().zip(&z[t * dim..(t + 1) * dim]) {
                    *v *= silu(*gv);
                }
            });
            Ok(())
        })
    }

    fn add(&self, y: &mut Vec<f32>, x: &Vec<f32>, len: usize) -> Result<()> {
        let x = &x[..len];
        self.prof.time(Op::Elementwise, || {
            for_each_span(&mut y[..len], |o, ys| {
                for (a, b) in ys.iter_mut().zip(&x[o..]) {
                    *a += b;
                }
            });
            Ok(())
        })
    }

    fn add_scaled_rows(
        &self,
        y: &mut Vec<f32>,
        x: &Vec<f32>,
        scale: &Vec<f32>,
        rows: usize,
        dim: usize,
        sigmoid_gate: bool,
    ) -> Result<()> {
        let (x, scale) = (&x[..rows * dim], &scale[..rows]);
        self.prof.time(Op::Elementwise, || {
            crate::parallel::for_each_row(&mut y[..rows * dim], dim, |r, yr| {
                let s = if sigmoid_gate { sigmoid(scale[r]) } else { scale[r] };
                for (a, b) in yr.iter_mut().zip(&x[r * dim..]) {
                    *a += s * b;
                }
            });
            Ok(())
        })
    }

    fn swiglu(&self, gate: &Vec<f32>, up: &Vec<f32>, len: usize, y: &mut Vec<f32>) -> Result<()> {
        let (gate, up) = (&gate[..len], &up[..len]);
        self.prof.time(Op::Elementwise, || {
            for_each_span(&mut y[..len], |off, ys| {
                for ((o, g), u) in ys.iter_mut().zip(&gate[off..]).zip(&up[off..]) {
                    *o = silu(*g) * u;
                }
            });
            Ok(())
        })
    }

    fn sigmoid_mul(&self, x: &mut Vec<f32>, gate: &Vec<f32>, len: usize) -> Result<()> {
        let gate = &gate[..len];
        self.prof.time(Op::Elementwise, || {
            for_each_span(&mut x[..len], |o, xs| {
                for (v, g) in xs.iter_mut().zip(&gate[o..]) {
                    *v *= sigmoid(*g);
                }
            });
            Ok(())
        })
    }

    fn copy(&self, src: &Vec<f32>, dst: &mut Vec<f32>, s: Strided) -> Result<()> {
        self.prof.time(Op::Elementwise, || {
            for r in 0..s.rows {
                let a = s.src_off + r * s.src_stride;
                let b = s.dst_off + r * s.dst_stride;
                dst[b..b + s.width].copy_from_slice(&src[a..a + s.width]);
            }
            Ok(())
        })
    }

    fn rope(&self, x: &mut Vec<f32>, inv_freq: &Vec<f32>, a: RopeArgs) -> Result<()> {
        self.prof.time(Op::Attention, || {
            attn::rope(x, inv_freq, a);
            Ok(())
        })
    }

    fn attention(&self, q: &Vec<f32>, k: &CpuCache, v: &CpuCache, a: AttnArgs, out: &mut Vec<f32>) -> Result<()> {
        self.prof.time(Op::Attention, || {
            attn::attention(q, k, v, a, out);
            Ok(())
        })
    }

    fn mla_attention(
        &self,
        q: &Vec<f32>,
        latent: &CpuCache,
        k_pe: &CpuCache,
        kv_b: &Vec<f32>,
        a: MlaArgs,
        out: &mut Vec<f32>,
    ) -> Result<()> {
        self.prof.time(Op::Attention, || {
            attn::mla_attention(q, latent, k_pe, kv_b, a, out);
            Ok(())
        })
    }

    fn gated_delta(
        &self,
        qkv: &Vec<f32>,
        a: &Vec<f32>,
        b: &Vec<f32>,
        w: DeltaWeights<'_, Self>,
        state: DeltaState<'_, Self>,
        args: DeltaArgs,
        out: &mut Vec<f32>,
    ) -> Result<()> {
        self.prof
            .time(Op::Recurrence, || delta::gated_delta(qkv, a, b, w, state, args, out))
    }

    /// The one-token sequences (a decode step's) together: each of the
    /// three passes once over all of them (`delta::gated_delta_each`; one
    /// token of 32 heads alone leaves most threads idle, and a loop inside
    /// a task of the spinning workers runs inline, so 8 sequences one after
    /// another took 8× one's time); longer ones (prefill chunks) one after
    /// another, each parallel over its heads. On their rows of the inputs
    /// in place: the arithmetic of `gated_delta` on each.
    fn gated_delta_seqs(
        &self,
        qkv: &mut Vec<f32>,
        a: &mut Vec<f32>,
        b: &mut Vec<f32>,
        w: DeltaWeights<'_, Self>,
        states: &mut [StatePair<'_, Self>],
        segs: &[Seg],
        args: DeltaArgs,
        out: &mut Vec<f32>,
    ) -> Result<()> {
        check_segs(segs, states.len(), args.n)?;
        let hv = args.v_heads;
        let conv_dim = 2 * args.k_heads * args.k_dim + hv * args.v_dim;
        let ow = hv * args.v_dim;
        let n = args.n;
        for (what, len, want) in [
            ("qkv", qkv.len(), n * conv_dim),
            ("a", a.len(), n * hv),
            ("b", b.len(), n * hv),
            ("output", out.len(), n * ow),
        ] {
            if len < want {
                return Err(Error::Invalid(format!(
                    "gated_delta_seqs: {what} holds {len} values, {n} rows need {want}"
                )));
            }
        }
        let (qkv, a, b, out) = (&qkv[..], &a[..], &b[..], &mut out[..n * ow]);
        self.prof.time(Op::Recurrence, || {
            let (mut ones, mut rows, mut longer) = (Vec::new(), Vec::new(), Vec::new());
            for (s, (conv, ssm)) in segs.iter().zip(states.iter_mut()) {
                match s.n {
                    1 => {
                        ones.push((&mut **conv, &mut **ssm));
                        rows.push(s.off);
                    }
                    _ => longer.push((
                        s,
                        DeltaState {
                            conv: &mut **conv,
                            ssm: &mut **ssm,
                        },
                    )),
                }
            }
            if !ones.is_empty() {
                delta::gated_delta_each(qkv, a, b, w, &mut ones, &rows, args, out)?;
            }
            longer.into_iter().try_for_each(|(s, st)| {
                let r = s.off..s.off + s.n;
                delta::gated_delta(
                    &qkv[r.start * conv_dim..r.end * conv_dim],
                    &a[r.start * hv..r.end * hv],
                    &b[r.start * hv..r.end * hv],
                    w,
                    st,
                    DeltaArgs { n: s.n, ..args },
                    &mut out[r.start * ow..r.end * ow],
                )
            })
        })
    }

    fn moe(&self, m: MoeInputs<'_, Vec<f32>>, a: MoeArgs<'_>, out: &mut Vec<f32>) -> Result<()> {
        let (x, logits, bias, store) = (m.x, m.logits, m.bias, m.store);
        let e = a.n_experts;
        let (Some(l), Some(b)) = (logits.get(..a.n * e), bias.map_or(Some(&[][..]), |b| b.get(..e))) else {
            return Err(crate::error::Error::Invalid(format!(
                "moe: {} router logits and {:?} bias values for {} tokens of {e} experts",
                logits.len(),
                bias.map(|b| b.len()),
                a.n
            )));
        };
        let routes = self.prof.time(Op::MoeRead, || {
            crate::model::router::route(a.routing, l, a.n, a.k, bias.map(|_| b))
        });
        // The next layer's guessed experts, each token's best first (its
        // router on this input, `[n, k]`), read while this layer computes.
        let ahead = m.hint.and_then(|h| {
            let g = h.logits.get(..a.n * e)?;
            Some((h.layer, crate::model::router::route(a.routing, g, a.n, a.k, None).ids))
        });
        moe::moe(self.kernel, &self.prof, x, &routes, store, ahead, a, out)
    }

    fn wants_moe_hint(&self, store: &ExpertStore, _n: usize) -> bool {
        store.reads_ahead()
    }
}
