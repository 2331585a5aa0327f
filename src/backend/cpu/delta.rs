//! The GatedDeltaNet conv + recurrence on the CPU (SPEC.md §5).
//!
//! Three parallel passes over a call's n tokens: the conv + SiLU,
//! vectorized across channels (a token's channels are contiguous); the q/k
//! norms and the gates of every token; the recurrence. A call of a few
//! tokens (decode) runs the recurrence row by row on the state as it lies
//! (`[Dv, Dk]`); a longer one (prefill) gives each task 16 rows of one
//! head, transposed into a block that stays in L1 (`[Dk, 16]`: a
//! register's lanes are 16 rows), for all the call's tokens — no
//! horizontal sums, and the state leaves memory once per call.
//! A batched decode step (one token of each of several sequences, each
//! with its own states) runs the same three passes once over all of them
//! (`gated_delta_each`).

use super::delta_conv::{conv, conv_each, isa, Isa, SharedMut};
use super::lanes::{self, Lanes, LANES};
use super::sigmoid;
use super::vector::dot;
use super::CpuBackend;
use crate::backend::{DeltaArgs, DeltaState, DeltaWeights};
use crate::error::{Error, Result};

/// Calls of at least this many tokens run the recurrence on transposed
/// blocks; the transposes in and out cost about as much as a few tokens
/// of the row-by-row recurrence.
const BLOCK_MIN_TOKENS: usize = 4;

fn softplus(x: f32) -> f32 {
    if x > 20.0 {
        x
    } else {
        x.exp().ln_1p()
    }
}

/// The step's buffers against its shapes: an error naming the one too
/// short (the kernels would read or write past it).
fn check(
    qkv: &[f32],
    a_in: &[f32],
    b_in: &[f32],
    w: &DeltaWeights<'_, CpuBackend>,
    st: &DeltaState<'_, CpuBackend>,
    a: DeltaArgs,
    out: &[f32],
) -> Result<()> {
    if a.kernel == 0 || a.k_heads == 0 || !a.v_heads.is_multiple_of(a.k_heads) {
        return Err(Error::Invalid(format!(
            "GatedDeltaNet: kernel {}, {} value heads over {} key heads",
            a.kernel, a.v_heads, a.k_heads
        )));
    }
    let (c, hv) = (2 * a.k_heads * a.k_dim + a.v_heads * a.v_dim, a.v_heads);
    for (what, len, want) in [
        ("qkv", qkv.len(), a.n * c),
        ("a", a_in.len(), a.n * hv),
        ("b", b_in.len(), a.n * hv),
        ("conv weight", w.conv_w.len(), c * a.kernel),
        ("A_log", w.a_log.len(), hv),
        ("dt_bias", w.dt_bias.len(), hv),
        ("conv state", st.conv.len(), (a.kernel - 1) * c),
        ("recurrent state", st.ssm.len(), hv * a.v_dim * a.k_dim),
        ("output", out.len(), a.n * hv * a.v_dim),
    ] {
        if len < want {
            return Err(Error::Invalid(format!(
                "gated_delta {what} holds {len} values, needs {want}"
            )));
        }
    }
    Ok(())
}

pub fn gated_delta(
    qkv: &[f32],
    a_in: &[f32],
    b_in: &[f32],
    w: DeltaWeights<'_, CpuBackend>,
    st: DeltaState<'_, CpuBackend>,
    a: DeltaArgs,
    out: &mut [f32],
) -> Result<()> {
    check(qkv, a_in, b_in, &w, &st, a, out)?;
    let conv_dim = 2 * a.k_heads * a.k_dim + a.v_heads * a.v_dim;
    let isa = isa();
    let mut xs = crate::parallel::zeros(a.n * conv_dim); // [n, conv_dim]
    conv(qkv, w.conv_w, st.conv, a, isa, &mut xs);
    let (gates, kq) = prepare(&mut xs, a_in, b_in, &w, a);
    let x = Inputs {
        xs: &xs,
        gates: &gates,
        kq: &kq,
        a,
    };
    if a.n >= BLOCK_MIN_TOKENS {
        scan_blocks(&x, st.ssm, isa, out);
    } else {
        scan_rows(&x, st.ssm, out);
    }
    Ok(())
}

/// `gated_delta` for one token of each of several sequences at once (a
/// batched decode step): sequence s's token is row `rows[s]` of qkv, a, b
/// and out, its states `states[s]` (conv, recurrent). The three passes
/// run once over all of them — the conv by (sequence, channel block), the
/// recurrence by (sequence, head) — instead of three per sequence.
#[allow(clippy::too_many_arguments)]
pub fn gated_delta_each(
    qkv: &[f32],
    a_in: &[f32],
    b_in: &[f32],
    w: DeltaWeights<'_, CpuBackend>,
    states: &mut [(&mut Vec<f32>, &mut Vec<f32>)],
    rows: &[usize],
    a: DeltaArgs,
    out: &mut [f32],
) -> Result<()> {
    let (hv, dk, dv) = (a.v_heads, a.k_dim, a.v_dim);
    let conv_dim = 2 * a.k_heads * a.k_dim + hv * dv;
    let one = DeltaArgs { n: 1, ..a };
    if states.len() != rows.len() {
        return Err(Error::Invalid(format!(
            "gated_delta_each: {} states for {} rows",
            states.len(),
            rows.len()
        )));
    }
    // Each sequence's row and states against the shapes, and its a and b
    // gathered (the norms and gates take the tokens in order).
    let (mut ac, mut bc) = (Vec::with_capacity(rows.len() * hv), Vec::with_capacity(rows.len() * hv));
    for ((conv, ssm), &r) in states.iter_mut().zip(rows) {
        let (q_r, a_r, b_r) = (row(qkv, r, conv_dim), row(a_in, r, hv), row(b_in, r, hv));
        let st = DeltaState {
            conv: &mut **conv,
            ssm: &mut **ssm,
        };
        check(q_r, a_r, b_r, &w, &st, one, out.get(r * hv * dv..).unwrap_or(&[]))?;
        ac.extend_from_slice(a_r);
        bc.extend_from_slice(b_r);
    }
    let n = rows.len();
    let a = DeltaArgs { n, ..a };
    let isa = isa();
    let convs: Vec<SharedMut> = states.iter_mut().map(|(c, _)| SharedMut(c.as_mut_ptr())).collect();
    let ssms: Vec<SharedMut> = states.iter_mut().map(|(_, s)| SharedMut(s.as_mut_ptr())).collect();
    let mut xs = crate::parallel::zeros(n * conv_dim); // [n, conv_dim]
    conv_each(qkv, rows, w.conv_w, &convs, a, isa, &mut xs);
    let (gates, kq) = prepare(&mut xs, &ac, &bc, &w, a);
    let x = Inputs {
        xs: &xs,
        gates: &gates,
        kq: &kq,
        a,
    };
    let out_p = SharedMut(out.as_mut_ptr());
    crate::parallel::for_each(n * hv, |task| {
        let (out_p, ssms) = (&out_p, &ssms);
        let (t, h) = (task / hv, task % hv);
        let (q, k) = x.qk(t, h);
        let (g, beta, kq) = x.gate(t, h);
        // SAFETY: head h of sequence t's state ([Hv, Dv, Dk]) and out row
        // rows[t], head h (both checked above): this task's alone.
        let (s, o) = unsafe {
            (
                std::slice::from_raw_parts_mut(ssms[t].0.add(h * dv * dk), dv * dk),
                std::slice::from_raw_parts_mut(out_p.0.add((rows[t] * hv + h) * dv), dv),
            )
        };
        let v = x.v(t, h);
        step(s, Step { q, k, v, g, beta, kq }, o);
    });
    Ok(())
}

/// Row `r` of `v` `[rows, w]` (empty past its end: `check` reports it).
fn row(v: &[f32], r: usize, w: usize) -> &[f32] {
    v.get(r * w..(r + 1) * w).unwrap_or(&[])
}

/// q/k normalization of every token (SPEC §5), in place in xs, and per
/// token the gates `(g, β)` of each value head `[n, Hv]` and `k·q` of each
/// key head `[n, Hk]` (after the norms and q's scale).
fn prepare(
    xs: &mut [f32],
    a_in: &[f32],
    b_in: &[f32],
    w: &DeltaWeights<'_, CpuBackend>,
    a: DeltaArgs,
) -> (Vec<(f32, f32)>, Vec<f32>) {
    let (hk, hv, dk) = (a.k_heads, a.v_heads, a.k_dim);
    let conv_dim = 2 * hk * dk + hv * a.v_dim;
    let q_scale = 1.0 / (dk as f32).sqrt();
    let mut gates = vec![(0.0f32, 0.0f32); a.n * hv];
    let mut kq = vec![0.0f32; a.n * hk];
    // k·q of token t's key heads, written by its task.
    let kq_p = SharedMut(kq.as_mut_ptr());
    let kq_p = &kq_p;
    crate::parallel::for_each_chunk2(xs, conv_dim, &mut gates, hv, |t, x, gt| {
        // SAFETY: token t's k·q are this task's alone.
        let kqt = unsafe { std::slice::from_raw_parts_mut(kq_p.0.add(t * hk), hk) };
        let (q_all, rest) = x.split_at_mut(hk * dk);
        let k_all = &mut rest[..hk * dk];
        for ((qh, kh), kq) in q_all.chunks_exact_mut(dk).zip(k_all.chunks_exact_mut(dk)).zip(kqt) {
            let qn = 1.0 / (dot(qh, qh) + 1e-6).sqrt();
            let kn = 1.0 / (dot(kh, kh) + 1e-6).sqrt();
            qh.iter_mut().for_each(|v| *v *= qn * q_scale);
            kh.iter_mut().for_each(|v| *v *= kn);
            *kq = dot(kh, qh);
        }
        for (h, g) in gt.iter_mut().enumerate() {
            let decay = (-(w.a_log[h].exp()) * softplus(a_in[t * hv + h] + w.dt_bias[h])).exp();
            *g = (decay, sigmoid(b_in[t * hv + h]));
        }
    });
    (gates, kq)
}

/// The recurrence's inputs for all tokens, after `prepare`.
struct Inputs<'a> {
    xs: &'a [f32],
    gates: &'a [(f32, f32)],
    kq: &'a [f32],
    a: DeltaArgs,
}

impl Inputs<'_> {
    /// q and k of token t for value head h (key head h / (Hv/Hk)).
    fn qk(&self, t: usize, h: usize) -> (&[f32], &[f32]) {
        let (hk, dk) = (self.a.k_heads, self.a.k_dim);
        let kh = h / (self.a.v_heads / hk);
        let x = &self.xs[t * self.conv_dim()..];
        (&x[kh * dk..(kh + 1) * dk], &x[(hk + kh) * dk..(hk + kh + 1) * dk])
    }

    /// v of token t, value head h.
    fn v(&self, t: usize, h: usize) -> &[f32] {
        let off = t * self.conv_dim() + 2 * self.a.k_heads * self.a.k_dim + h * self.a.v_dim;
        &self.xs[off..off + self.a.v_dim]
    }

    /// `(g, β, k·q)` of token t, value head h.
    fn gate(&self, t: usize, h: usize) -> (f32, f32, f32) {
        let (hk, hv) = (self.a.k_heads, self.a.v_heads);
        let (g, beta) = self.gates[t * hv + h];
        (g, beta, self.kq[t * hk + h / (hv / hk)])
    }

    fn conv_dim(&self) -> usize {
        2 * self.a.k_heads * self.a.k_dim + self.a.v_heads * self.a.v_dim
    }
}

/// The recurrence of a short call: each value head on one task, token by
/// token, row by row on the state `[Hv, Dv, Dk]`, into out `[n, Hv·Dv]`.
fn scan_rows(x: &Inputs, ssm: &mut [f32], out: &mut [f32]) {
    let (hv, dk, dv) = (x.a.v_heads, x.a.k_dim, x.a.v_dim);
    let out_p = SharedMut(out.as_mut_ptr());
    crate::parallel::for_each_chunk(ssm, dv * dk, |h, s| {
        let out_p = &out_p;
        for t in 0..x.a.n {
            let (q, k) = x.qk(t, h);
            let (g, beta, kq) = x.gate(t, h);
            // SAFETY: out [n, Hv·Dv] row t, head h: this task's alone.
            let o = unsafe { std::slice::from_raw_parts_mut(out_p.0.add((t * hv + h) * dv), dv) };
            step(
                s,
                Step {
                    q,
                    k,
                    v: x.v(t, h),
                    g,
                    beta,
                    kq,
                },
                o,
            );
        }
    });
}

/// One token's inputs to a head's recurrence.
struct Step<'a> {
    q: &'a [f32],
    k: &'a [f32],
    v: &'a [f32],
    g: f32,
    beta: f32,
    kq: f32,
}

/// One token of one value head: state `s` [Dv, Dk], row i = value channel
/// i, S ← g·S; δ = β(v − S k); S ← S + δ kᵀ; o = S q — computed from two
/// dot products of the old row and one update, all vectorized:
/// `sk = g·(S_i·k)`, `o_i = g·(S_i·q) + δ·(k·q)`, `S_i ← g·S_i + δ·k`.
fn step(s: &mut [f32], x: Step, o: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if super::simd::available() {
        // SAFETY: the CPU has AVX2 and FMA.
        return unsafe { step_avx2(s, x, o) };
    }
    step_body(s, x, o)
}

/// `step` compiled for AVX2 (eight lanes where the baseline has four).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn step_avx2(s: &mut [f32], x: Step, o: &mut [f32]) {
    step_body(s, x, o)
}

#[inline(always)]
fn step_body(s: &mut [f32], x: Step, o: &mut [f32]) {
    let (k, g) = (x.k, x.g);
    for (i, row) in s.chunks_exact_mut(k.len()).enumerate() {
        let sk = g * dot(row, k);
        let delta = x.beta * (x.v[i] - sk);
        o[i] = g * dot(row, x.q) + delta * x.kq;
        for (sv, kv) in row.iter_mut().zip(k) {
            *sv = g * *sv + delta * kv;
        }
    }
}

/// The recurrence of a long call: tasks of `LANES` rows of one head (fewer
/// at the end of a head), each transposed into a block `[Dk, LANES]` and
/// run through all the tokens, into out `[n, Hv·Dv]`.
fn scan_blocks(x: &Inputs, ssm: &mut [f32], isa: Isa, out: &mut [f32]) {
    let (dk, dv) = (x.a.k_dim, x.a.v_dim);
    let out_p = SharedMut(out.as_mut_ptr());
    // Tasks: the row blocks of every head (a head's last may be short).
    let per = dv.div_ceil(LANES);
    let ssm_p = SharedMut(ssm.as_mut_ptr());
    let ssm_p = &ssm_p;
    crate::parallel::for_each(x.a.v_heads * per, |task| {
        let (h, rb) = (task / per, task % per);
        let r0 = rb * LANES;
        let m = LANES.min(dv - r0);
        let out_p = &out_p;
        // SAFETY: rows r0..r0 + m of head h are this task's alone, in the
        // state as in out.
        unsafe {
            let rows = std::slice::from_raw_parts_mut(ssm_p.0.add((h * dv + r0) * dk), m * dk);
            match isa {
                #[cfg(target_arch = "x86_64")]
                Isa::Avx512 => scan_block_avx512(x, h, r0, rows, out_p),
                #[cfg(target_arch = "x86_64")]
                Isa::Avx2 => scan_block_avx2(x, h, r0, rows, out_p),
                _ => scan_block::<lanes::Plain, 1>(x, h, r0, rows, out_p),
            }
        }
    });
}

/// `scan_block` on AVX-512 registers.
///
/// # Safety
/// As `scan_block`; the CPU has AVX-512 F.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2,fma")]
unsafe fn scan_block_avx512(x: &Inputs, h: usize, r0: usize, rows: &mut [f32], out: &SharedMut) {
    scan_block::<lanes::Avx512, 4>(x, h, r0, rows, out)
}

/// `scan_block` on pairs of AVX2 registers: two pairs of sums in flight,
/// within AVX2's sixteen registers.
///
/// # Safety
/// As `scan_block`; the CPU has AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn scan_block_avx2(x: &Inputs, h: usize, r0: usize, rows: &mut [f32], out: &SharedMut) {
    scan_block::<lanes::Avx2, 2>(x, h, r0, rows, out)
}

/// Rows `r0..` of head h (`rows` [m, Dk], m ≤ LANES) through all the
/// tokens; a block's missing lanes are zero rows, which stay zero.
///
/// # Safety
/// No other task writes out's columns of these rows; out is `[n, Hv·Dv]`;
/// the CPU runs `V`'s instructions.
#[inline(always)]
unsafe fn scan_block<V: Lanes, const U: usize>(x: &Inputs, h: usize, r0: usize, rows: &mut [f32], out: &SharedMut) {
    let (hv, dk, dv) = (x.a.v_heads, x.a.k_dim, x.a.v_dim);
    let m = rows.len() / dk;
    let mut blk = vec![0.0f32; dk * LANES]; // [Dk, LANES]
    transpose(rows, dk, &mut blk, false);
    let (mut v, mut o) = ([0.0f32; LANES], [0.0f32; LANES]);
    for t in 0..x.a.n {
        let (q, k) = x.qk(t, h);
        let (g, beta, kq) = x.gate(t, h);
        v[..m].copy_from_slice(&x.v(t, h)[r0..r0 + m]);
        // SAFETY: the caller's.
        unsafe {
            block_step::<V, U>(
                &mut blk,
                Step {
                    q,
                    k,
                    v: &v,
                    g,
                    beta,
                    kq,
                },
                &mut o,
            )
        };
        // SAFETY: out row t, head h, channels r0..r0 + m: this task's.
        let dst = unsafe { std::slice::from_raw_parts_mut(out.0.add((t * hv + h) * dv + r0), m) };
        dst.copy_from_slice(&o[..m]);
    }
    transpose(rows, dk, &mut blk, true);
}

/// Rows `[m, Dk]` into the block `[Dk, LANES]`, or back (`back`). Not
/// inlined into the AVX-512 kernels, where it became scatters and gathers
/// (slow on Zen 4).
#[inline(never)]
fn transpose(rows: &mut [f32], dk: usize, blk: &mut [f32], back: bool) {
    for (i, row) in rows.chunks_exact_mut(dk).enumerate() {
        for (j, v) in row.iter_mut().enumerate() {
            if back {
                *v = blk[j * LANES + i];
            } else {
                blk[j * LANES + i] = *v;
            }
        }
    }
}

/// One token through a transposed block `[Dk, LANES]` (column j = S[·, j]
/// of LANES rows), as `step`: both sums of each lane over the columns in
/// U interleaved partial sums, then the update column by column.
///
/// # Safety
/// The CPU runs `V`'s instructions.
#[inline(always)]
unsafe fn block_step<V: Lanes, const U: usize>(blk: &mut [f32], x: Step, o: &mut [f32; LANES]) {
    // SAFETY: the CPU runs V's instructions (the caller's), and every
    // load and store is of LANES floats: a column of blk, x.v (a block's
    // LANES values), o.
    unsafe {
        let (mut sk, mut sq) = ([V::splat(0.0); U], [V::splat(0.0); U]);
        let cols = blk.chunks_exact(U * LANES);
        let tail = cols.remainder();
        for ((c, k), q) in cols.zip(x.k.chunks_exact(U)).zip(x.q.chunks_exact(U)) {
            for u in 0..U {
                let cu = V::load(c[u * LANES..].as_ptr());
                sk[u] = V::madd(cu, V::splat(k[u]), sk[u]);
                sq[u] = V::madd(cu, V::splat(q[u]), sq[u]);
            }
        }
        let j0 = x.k.len() - tail.len() / LANES;
        for ((c, k), q) in tail.chunks_exact(LANES).zip(&x.k[j0..]).zip(&x.q[j0..]) {
            let c = V::load(c.as_ptr());
            sk[0] = V::madd(c, V::splat(*k), sk[0]);
            sq[0] = V::madd(c, V::splat(*q), sq[0]);
        }
        for u in 1..U {
            sk[0] = V::add(sk[0], sk[u]);
            sq[0] = V::add(sq[0], sq[u]);
        }
        // δ = β·(v − g·(S k)), o = g·(S q) + δ·(k·q)
        let g = V::splat(x.g);
        let delta = V::mul(V::splat(x.beta), V::sub(V::load(x.v.as_ptr()), V::mul(g, sk[0])));
        V::madd(delta, V::splat(x.kq), V::mul(g, sq[0])).store(o.as_mut_ptr());
        for (c, k) in blk.chunks_exact_mut(LANES).zip(x.k) {
            let cv = V::mul(g, V::load(c.as_ptr()));
            V::madd(delta, V::splat(*k), cv).store(c.as_mut_ptr());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The block recurrence against the row one on shapes the op tests
    /// do not reach: Dk not a multiple of the sums in flight, Dv not a
    /// multiple of LANES (a partial block).
    #[test]
    fn blocks_match_rows() {
        for (hk, hv, dk, dv, n) in [(1, 2, 7, 20, 9), (2, 2, 13, 37, 5)] {
            let a = DeltaArgs {
                n,
                k_heads: hk,
                v_heads: hv,
                k_dim: dk,
                v_dim: dv,
                kernel: 4,
            };
            let xs = rnd(n * (2 * hk * dk + hv * dv), 1);
            let gates: Vec<(f32, f32)> = rnd(n * hv, 2).iter().map(|&g| (0.6 + g, 0.5 - g)).collect();
            let kq = rnd(n * hk, 3);
            let x = Inputs {
                xs: &xs,
                gates: &gates,
                kq: &kq,
                a,
            };
            let ssm0 = rnd(hv * dv * dk, 4);
            let mut s_rows = ssm0.clone();
            let mut o_rows = vec![0.0; n * hv * dv];
            scan_rows(&x, &mut s_rows, &mut o_rows);
            for isa in isas() {
                let mut s_blocks = ssm0.clone();
                let mut o_blocks = vec![0.0; n * hv * dv];
                scan_blocks(&x, &mut s_blocks, isa, &mut o_blocks);
                close(&o_rows, &o_blocks, 1e-5);
                close(&s_rows, &s_blocks, 1e-5);
            }
        }
    }

    /// The conv compiled for each instruction set this CPU has, against
    /// the plain one, over several token chunks and calls shorter than
    /// the kernel.
    #[test]
    fn conv_isas_agree() {
        let a = |n| DeltaArgs {
            n,
            k_heads: 2,
            v_heads: 3,
            k_dim: 100,
            v_dim: 120,
            kernel: 4,
        };
        let cd = 2 * 2 * 100 + 3 * 120;
        let w = rnd(cd * 4, 1);
        let state0 = rnd(3 * cd, 2);
        let mut want_state = state0.clone();
        let mut states: Vec<Vec<f32>> = isas().iter().map(|_| state0.clone()).collect();
        for (call, n) in [2, 37, 1].into_iter().enumerate() {
            let qkv = rnd(n * cd, 3 + call as u32);
            let mut want = vec![0.0; n * cd];
            conv(&qkv, &w, &mut want_state, a(n), Isa::Plain, &mut want);
            for (isa, state) in isas().into_iter().zip(&mut states) {
                let mut got = vec![0.0; n * cd];
                conv(&qkv, &w, state, a(n), isa, &mut got);
                close(&want, &got, 1e-6);
                assert_eq!(state, &want_state);
            }
        }
    }

    fn isas() -> Vec<Isa> {
        let mut all = vec![Isa::Plain];
        #[cfg(target_arch = "x86_64")]
        {
            if super::super::simd::available() {
                all.push(Isa::Avx2);
            }
            if super::super::simd512::available() {
                all.push(Isa::Avx512);
            }
        }
        all
    }

    fn rnd(len: usize, seed: u32) -> Vec<f32> {
        let mut s = seed;
        (0..len)
            .map(|_| {
                s = s.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
                (s >> 8) as f32 / (1u32 << 24) as f32 - 0.5
            })
            .collect()
    }

    fn close(want: &[f32], got: &[f32], tol: f32) {
        assert_eq!(want.len(), got.len());
        for (w, g) in want.iter().zip(got) {
            assert!((w - g).abs() <= tol * (1.0 + w.abs()), "{w} vs {g}");
        }
    }
}
