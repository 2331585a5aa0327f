"""DeepSeek-V3-style fp8 block quantization (float8_e4m3fn weights with a
float32 `weight_scale_inv` per 128x128 block).

`weight_scale_inv` is a multiplier: w = fp8_value * scale_inv[row // 128,
col // 128]; the grid is ceil(out/128) x ceil(in/128) and edge blocks are
partial. We pick every block scale as a power of two, so that fp8 * scale is
exact in bf16 and f32, and vary it per block so a wrong block mapping shows.
"""

from __future__ import annotations

import math

import torch

BLOCK = 128
FP8_MAX = 448.0


def quantize_fp8_blocks(w: torch.Tensor, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    out_f, in_f = w.shape
    gr, gc = math.ceil(out_f / BLOCK), math.ceil(in_f / BLOCK)
    scale = torch.empty(gr, gc, dtype=torch.float32)
    q = torch.empty(out_f, in_f, dtype=torch.float8_e4m3fn)
    for i in range(gr):
        for j in range(gc):
            blk = w[i * BLOCK:(i + 1) * BLOCK, j * BLOCK:(j + 1) * BLOCK].float()
            amax = float(blk.abs().max())
            # smallest power of two that fits the block, then 0..2 extra
            # octaves at random (coarser grid, distinct scales per block)
            e = math.ceil(math.log2(amax / FP8_MAX)) + int(torch.randint(0, 3, (1,), generator=g))
            s = 2.0 ** e
            scale[i, j] = s
            q[i * BLOCK:(i + 1) * BLOCK, j * BLOCK:(j + 1) * BLOCK] = (blk / s).clamp(-FP8_MAX, FP8_MAX).to(
                torch.float8_e4m3fn
            )
    return q, scale


def dequantize_fp8_blocks(q: torch.Tensor, scale_inv: torch.Tensor) -> torch.Tensor:
    out_f, in_f = q.shape
    s = scale_inv.repeat_interleave(BLOCK, 0).repeat_interleave(BLOCK, 1)[:out_f, :in_f]
    w = q.float() * s
    # the choice of power-of-two scales makes this exact in bf16 as well
    assert torch.equal(w.to(torch.bfloat16).float(), w)
    return w
