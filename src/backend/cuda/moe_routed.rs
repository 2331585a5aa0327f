//! The launches of the device-routed expert kernels
//! (`kernels/moe_routed.cu`): gate/up per (token, expert) pair, then
//! down and each token's weighted sum in one launch. A resident step
//! finds each pair's expert through the device's table; a streamed step
//! of few pairs carries their addresses in the launch.

use super::buf::CudaBuf;
use super::driver::Gpu;
use super::moe_groups::ELayout;
use crate::backend::MoeArgs;
use crate::cuda_args;
use crate::error::Result;

/// Most rows of a token per `moe_down_combine` block (`DC_ROWS` in
/// kernels/moe_routed.cu).
const DC_ROWS: usize = 32;

/// Rows of a token per `moe_down_combine` block for `n` tokens: the most
/// (4, 8, 16 or DC_ROWS) that still make two blocks per SM, or for one
/// token one block per SM. With DC_ROWS for one token the 64 blocks of a
/// 2048-row layer left half the H100's SMs idle; with 4 for 8 tokens, 4,096
/// blocks did little each. On the H200 (132 SMs), one token's 8 pairs in blocks
/// of 4 rows left half of a block's lane sets idle, and blocks of 8 were the
/// fastest; 4 streams with one block per SM were slower, so several tokens keep
/// two (docs/notes/2026-11-22-to-12-02-benchmark-log.md, "One token's
/// `moe_down_combine` in blocks of 8 rows on the H200").
fn dc_rows(gpu: &Gpu, n: usize, hidden: usize) -> usize {
    let blocks = match n {
        1 => gpu.sms,
        _ => 2 * gpu.sms,
    };
    [DC_ROWS, 16, 8, 4]
        .into_iter()
        .find(|&r| hidden.div_ceil(r) * n >= blocks)
        .unwrap_or(4)
}

/// Most pairs whose expert addresses a launch carries (`PB_MAX` in
/// kernels/moe_routed.cu): a streamed step of up to this many pairs
/// runs `moe_up_routed` and `moe_down_combine` (4 decode tokens of 8
/// experts).
pub(crate) const PAIR_BASES: usize = 32;

/// The `PairBases` kernel argument (kernels/moe_routed.cu): pair p's
/// expert address, 0 for a pair the CPU computes; unused (zeros) with a
/// resident table.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub(crate) struct PairBases {
    pub p: [u64; PAIR_BASES],
}

/// Where the pairs' experts are for [`routed_pairs`].
pub(crate) enum Pairs<'a> {
    /// Every expert resident: the layer's row of expert addresses, and
    /// the routed ids `[n, k]` (u32) on the device.
    Table { table: u64, ids: u64 },
    /// Each pair's expert address (0: computed on the CPU).
    Carried(&'a PairBases),
}

/// gate/up per pair (`moe_up_routed`), then down and the weighted sum
/// per token (`moe_down_combine`) into `op` (`assign`: out reads as
/// zeros and is written, not added to).
#[allow(clippy::too_many_arguments)]
pub(crate) fn routed_pairs(
    gpu: &Gpu,
    el: ELayout,
    x: &CudaBuf,
    h: &CudaBuf,
    wts: &CudaBuf,
    pairs: Pairs<'_>,
    a: &MoeArgs,
    op: u64,
    assign: i32,
) -> Result<()> {
    let (t, ip, pb) = match pairs {
        Pairs::Table { table, ids } => (table, ids, PairBases::default()),
        Pairs::Carried(pb) => (0, 0, *pb),
    };
    let (kk, hid, inter) = (a.k as i32, a.hidden as i32, a.inter as i32);
    let (xp, hw) = (x.read(gpu)?, h.write(gpu, a.n * a.k * a.inter)?);
    // 8 warps × 2 rows of gate and of up per block, one pair per block row.
    let up_grid = (a.inter.div_ceil(16) as u32, (a.n * a.k) as u32, 1);
    gpu.launch(
        gpu.k.fmt(el.fmt)?.moe_up_routed,
        up_grid,
        256,
        0,
        cuda_args![el, xp, hw, ip, t, pb, kk, hid, inter],
    )?;
    let (hp, wp) = (h.read(gpu)?, wts.read(gpu)?);
    // One block per `rpb` rows of a token; its warps' lane sets split the
    // (pair, 4 rows) items.
    let rpb = dc_rows(gpu, a.n, a.hidden);
    let grid = (a.hidden.div_ceil(rpb) as u32, a.n as u32, 1);
    let rpb = rpb as i32;
    gpu.launch(
        gpu.k.fmt(el.fmt)?.moe_down_combine,
        grid,
        256,
        0,
        cuda_args![el, hp, op, wp, ip, t, pb, kk, hid, inter, assign, rpb],
    )
}

#[cfg(test)]
mod tests {
    use super::super::compile::define;
    use super::*;

    #[test]
    fn sizes_match_the_kernels() {
        let src = include_str!("kernels/moe_routed.cu");
        assert_eq!(define(src, "PB_MAX"), Some(PAIR_BASES), "PairBases must match PB_MAX");
        assert_eq!(define(src, "DC_ROWS"), Some(DC_ROWS));
        assert_eq!(std::mem::size_of::<PairBases>(), 8 * PAIR_BASES);
    }
}
