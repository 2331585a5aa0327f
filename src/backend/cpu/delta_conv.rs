//! The GatedDeltaNet's causal conv + SiLU on the CPU (SPEC §5),
//! vectorized across channels (a token's channels are contiguous), and
//! what it shares with the recurrence (`delta.rs`): the instruction set
//! chosen per call and the pointer that parallel tasks write through.

use super::silu;
use crate::backend::DeltaArgs;

/// Channels per conv task: a few rows of 2 KiB per token, in L1.
const CONV_CHANNELS: usize = 512;

/// Tokens per conv task (at least kernel − 1, see `conv`): with
/// `CONV_CHANNELS`, about 20 µs of work, so that a decode step (one
/// token's 8192 channels: 16 tasks) is split among the threads too.
const CONV_TOKENS: usize = 16;

/// The instruction set the kernels are compiled for, chosen per call.
#[derive(Clone, Copy)]
pub(super) enum Isa {
    Avx512,
    Avx2,
    Plain,
}

pub(super) fn isa() -> Isa {
    #[cfg(target_arch = "x86_64")]
    {
        if super::simd512::available() {
            return Isa::Avx512;
        }
        if super::simd::available() {
            return Isa::Avx2;
        }
    }
    Isa::Plain
}

/// `a·b + c`, fused where the kernel is compiled with FMA (a call to a
/// software fma elsewhere).
#[inline(always)]
fn madd<const FMA: bool>(a: f32, b: f32, c: f32) -> f32 {
    if FMA {
        a.mul_add(b, c)
    } else {
        a * b + c
    }
}

/// A pointer that parallel tasks write through, each to its own elements.
pub(super) struct SharedMut(pub(super) *mut f32);
// SAFETY: the tasks that share it write disjoint elements (see its uses).
unsafe impl Sync for SharedMut {}

/// Conv + SiLU of every channel (SPEC §5): xs `[n, conv_dim]` from qkv
/// `[n, conv_dim]` and the state `[kernel−1, conv_dim]` (the last inputs,
/// oldest first), which it then advances by n tokens. Tasks are channel
/// blocks × token chunks; a chunk's outputs read only inputs, so chunks
/// are independent. Only the first chunk of a block reads the state
/// (its tokens t < kernel−1 look back before the call), and it alone
/// writes the block's new state, after its outputs.
pub(super) fn conv(qkv: &[f32], conv_w: &[f32], state: &mut [f32], a: DeltaArgs, isa: Isa, xs: &mut [f32]) {
    let cd = 2 * a.k_heads * a.k_dim + a.v_heads * a.v_dim;
    let chunk = CONV_TOKENS.max(a.kernel - 1);
    let (blocks, chunks) = (cd.div_ceil(CONV_CHANNELS), a.n.div_ceil(chunk));
    let (xs_p, st_p) = (SharedMut(xs.as_mut_ptr()), SharedMut(state.as_mut_ptr()));
    crate::parallel::for_each(blocks * chunks, |task| {
        let (blk, ch) = (task % blocks, task / blocks);
        let c0 = blk * CONV_CHANNELS;
        let task = ConvTask {
            qkv,
            conv_w,
            state: &st_p,
            xs: &xs_p,
            a,
            c0,
            c1: (c0 + CONV_CHANNELS).min(cd),
            t0: ch * chunk,
            t1: ((ch + 1) * chunk).min(a.n),
        };
        // SAFETY: tasks cover disjoint (channel block, token chunk)
        // rectangles of xs, and only the first chunk of a block touches
        // the block's columns of the state (see `conv`); the buffers are
        // sized for `a` (checked by the caller of the op).
        unsafe { run(isa, &task) }
    });
}

/// `conv` for one token of each of several sequences: sequence s's token
/// is row `rows[s]` of qkv and its output row s of xs `[n, conv_dim]`,
/// with `states[s]` (each `[kernel−1, conv_dim]`). Tasks are (sequence,
/// channel block).
pub(super) fn conv_each(
    qkv: &[f32],
    rows: &[usize],
    conv_w: &[f32],
    states: &[SharedMut],
    a: DeltaArgs,
    isa: Isa,
    xs: &mut [f32],
) {
    let cd = 2 * a.k_heads * a.k_dim + a.v_heads * a.v_dim;
    let blocks = cd.div_ceil(CONV_CHANNELS);
    let xs_p = SharedMut(xs.as_mut_ptr());
    let one = DeltaArgs { n: 1, ..a };
    crate::parallel::for_each(states.len() * blocks, |task| {
        let xs_p = &xs_p;
        let (s, blk) = (task / blocks, task % blocks);
        let c0 = blk * CONV_CHANNELS;
        // SAFETY: row s of xs, a row of `cd` values.
        let xs_s = SharedMut(unsafe { xs_p.0.add(s * cd) });
        let r = rows[s];
        let task = ConvTask {
            qkv: &qkv[r * cd..(r + 1) * cd],
            conv_w,
            state: &states[s],
            xs: &xs_s,
            a: one,
            c0,
            c1: (c0 + CONV_CHANNELS).min(cd),
            t0: 0,
            t1: 1,
        };
        // SAFETY: each task has its own (sequence, channel block): its
        // columns of that sequence's state and row of xs; every buffer
        // is sized for `a` (checked by the caller).
        unsafe { run(isa, &task) }
    });
}

/// `conv_task` compiled for `isa`.
///
/// # Safety
/// As `conv_task`; the CPU runs `isa`'s instructions.
unsafe fn run(isa: Isa, task: &ConvTask) {
    match isa {
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 => conv_task_avx512(task),
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => conv_task_avx2(task),
        _ => conv_task::<false>(task),
    }
}

/// One conv task: channels `c0..c1` of tokens `t0..t1`.
struct ConvTask<'a> {
    qkv: &'a [f32],
    conv_w: &'a [f32],
    state: &'a SharedMut,
    xs: &'a SharedMut,
    a: DeltaArgs,
    c0: usize,
    c1: usize,
    t0: usize,
    t1: usize,
}

/// `conv_task` compiled for AVX-512.
///
/// # Safety
/// As `conv_task`; the CPU has AVX-512 F.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2,fma")]
unsafe fn conv_task_avx512(task: &ConvTask) {
    conv_task::<true>(task)
}

/// `conv_task` compiled for AVX2.
///
/// # Safety
/// As `conv_task`; the CPU has AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn conv_task_avx2(task: &ConvTask) {
    conv_task::<true>(task)
}

/// # Safety
/// No other task touches xs's rectangle of this task, nor (when
/// `t0 == 0`) the state's columns `c0..c1`; xs and the state are sized
/// for `a`.
#[inline(always)]
unsafe fn conv_task<const FMA: bool>(task: &ConvTask) {
    let (a, kern) = (task.a, task.a.kernel);
    let cd = 2 * a.k_heads * a.k_dim + a.v_heads * a.v_dim;
    let (c0, wb) = (task.c0, task.c1 - task.c0);
    // The block's weights by tap: wt [kernel, wb].
    let mut wt = vec![0.0f32; kern * wb];
    for (c, wc) in task.conv_w[c0 * kern..task.c1 * kern].chunks_exact(kern).enumerate() {
        for (j, &v) in wc.iter().enumerate() {
            wt[j * wb + c] = v;
        }
    }
    // Input τ − (kernel−1), τ = t + j for tap j: a qkv row, or before
    // the call a state row.
    let input = |tau: usize| -> &[f32] {
        match tau.checked_sub(kern - 1) {
            Some(t) => &task.qkv[t * cd + c0..t * cd + c0 + wb],
            // SAFETY: row τ < kernel−1 of the state, columns c0..c1,
            // which only this task touches and writes only below.
            None => unsafe { std::slice::from_raw_parts(task.state.0.add(tau * cd + c0), wb) },
        }
    };
    for t in task.t0..task.t1 {
        // SAFETY: xs row t, columns c0..c1: this task's alone.
        let o = unsafe { std::slice::from_raw_parts_mut(task.xs.0.add(t * cd + c0), wb) };
        for ((o, w), x) in o.iter_mut().zip(&wt[(kern - 1) * wb..]).zip(input(t + kern - 1)) {
            *o = w * x;
        }
        for j in 0..kern - 1 {
            for ((o, w), x) in o.iter_mut().zip(&wt[j * wb..]).zip(input(t + j)) {
                *o = madd::<FMA>(*w, *x, *o);
            }
        }
        o.iter_mut().for_each(|v| *v = silu(*v));
    }
    if task.t0 > 0 {
        return;
    }
    // The new state: row j is input n + j − (kernel−1), rows in
    // increasing order (a row read from the old state lies below none
    // written before it: n + j > j).
    for j in 0..kern - 1 {
        let src = input(a.n + j).as_ptr();
        // SAFETY: state row j, columns c0..c1 (this task's); `src` is a
        // row of qkv or a later row of the state, `ptr::copy` allows
        // overlap.
        unsafe { std::ptr::copy(src, task.state.0.add(j * cd + c0), wb) };
    }
}
