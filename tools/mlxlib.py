"""MLX side of the fixtures: run mlx_lm.convert, read an MLX checkpoint back,
dequantize it exactly, and map it back onto the transformers module layout.

Dequantization is done here in numpy/f32 from the saved bytes (not with
mx.dequantize, which returns bf16 when the scales are bf16):
    w[o, i] = q[o, i] * scales[o, i // group] + biases[o, i // group]
with q unpacked from little-endian u32 words, lowest bits first (SPEC.md §2).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch


def convert_with_mlx_lm(src: Path, dst: Path, bits: int = 4, group_size: int = 64) -> None:
    """The same call `mlx_lm.convert --hf-path SRC --mlx-path DST -q --q-bits
    BITS --q-group-size GS` makes."""
    from mlx_lm import convert

    convert(str(src), str(dst), quantize=True, q_bits=bits, q_group_size=group_size)


def read_mlx(d: Path) -> dict[str, np.ndarray]:
    """All tensors of an MLX checkpoint as numpy arrays; bf16/f16 become f32
    (exact), u32 stays u32."""
    import mlx.core as mx

    out = {}
    for fn in sorted(d.glob("*.safetensors")):
        for k, v in mx.load(str(fn)).items():
            if v.dtype in (mx.bfloat16, mx.float16):
                v = v.astype(mx.float32)
            out[k] = np.array(v)
    return out


def mlx_dtypes(d: Path) -> dict[str, str]:
    import mlx.core as mx

    out = {}
    for fn in sorted(d.glob("*.safetensors")):
        for k, v in mx.load(str(fn)).items():
            out[k] = str(v.dtype).replace("mlx.core.", "")
    return out


def unpack(packed: np.ndarray, bits: int) -> np.ndarray:
    """[..., n_words] u32 -> [..., n_words * 32/bits] integer values."""
    per = 32 // bits
    mask = (1 << bits) - 1
    shifts = (np.arange(per, dtype=np.uint32) * bits).astype(np.uint32)
    vals = (packed[..., None] >> shifts) & np.uint32(mask)
    return vals.reshape(*packed.shape[:-1], packed.shape[-1] * per)


def dequantize_all(t: dict[str, np.ndarray], group_size: int, overrides: dict) -> tuple[dict, dict]:
    """Replace every quantized triple (X.weight u32, X.scales, X.biases) by a
    dense f32 X.weight. Returns (tensors, {module path: bits})."""
    out, qinfo = {}, {}
    for k, v in t.items():
        if k.endswith(".scales") or k.endswith(".biases"):
            continue
        base = k[: -len(".weight")] if k.endswith(".weight") else None
        if base is not None and base + ".scales" in t:
            scales, biases = t[base + ".scales"], t[base + ".biases"]
            n_in = scales.shape[-1] * group_size
            bits = v.shape[-1] * 32 // n_in
            want = overrides.get(base, {}).get("bits")
            if want is not None:
                assert want == bits, (base, want, bits)
            q = unpack(v, bits).astype(np.float32)
            assert q.shape[-1] == n_in
            s = np.repeat(scales, group_size, axis=-1)
            b = np.repeat(biases, group_size, axis=-1)
            out[k] = (q * s + b).astype(np.float32)
            qinfo[base] = bits
        else:
            out[k] = v
    return out, qinfo


def check_against_mx_dequantize(t: dict[str, np.ndarray], raw_dir: Path, group_size: int, qinfo: dict) -> None:
    """Cross-check our unpacking against mx.dequantize (done in f32 after
    upcasting scales/biases, so nothing is rounded)."""
    import mlx.core as mx

    raw = {}
    for fn in sorted(raw_dir.glob("*.safetensors")):
        raw.update(mx.load(str(fn)))
    for base, bits in qinfo.items():
        w = mx.dequantize(
            raw[base + ".weight"],
            raw[base + ".scales"].astype(mx.float32),
            raw[base + ".biases"].astype(mx.float32),
            group_size=group_size,
            bits=bits,
        )
        assert np.array_equal(np.array(w), t[base + ".weight"]), base


ZERO_CENTRED_NORMS = (
    ".input_layernorm.weight",
    ".post_attention_layernorm.weight",
    "model.norm.weight",
    ".q_norm.weight",
    ".k_norm.weight",
)


def mlx_to_module(t: dict[str, np.ndarray], *, prefix_map, zero_centred: bool) -> dict[str, torch.Tensor]:
    """Undo mlx-lm's sanitize() so the tensors load into the transformers
    module:
      * rename (prefix_map: list of (mlx prefix, module prefix));
      * switch_mlp.{gate,up,down}_proj [E, out, in] -> experts.gate_up_proj
        [E, 2I, H] (gate rows first) and experts.down_proj [E, H, I];
      * Qwen3.5/Next: conv1d [C, K, 1] -> [C, 1, K]; the five zero-centred
        norms were stored as 1 + w by mlx-lm -> subtract 1.
    """
    out = {}
    for k, v in t.items():
        for a, b in prefix_map:
            if k.startswith(a):
                k = b + k[len(a):]
                break
        out[k] = v
    res = {}
    for k, v in out.items():
        if ".switch_mlp." in k:
            continue
        if zero_centred and "conv1d.weight" in k:
            assert v.ndim == 3 and v.shape[-1] == 1, (k, v.shape)
            v = np.ascontiguousarray(np.moveaxis(v, 2, 1))
        if zero_centred and v.ndim == 1 and any(k.endswith(s) for s in ZERO_CENTRED_NORMS):
            v = v - np.float32(1.0)
        res[k] = torch.from_numpy(np.ascontiguousarray(v))
    for k in out:
        if k.endswith(".switch_mlp.gate_proj.weight"):
            p = k[: -len(".switch_mlp.gate_proj.weight")]
            gate = out[p + ".switch_mlp.gate_proj.weight"]
            up = out[p + ".switch_mlp.up_proj.weight"]
            down = out[p + ".switch_mlp.down_proj.weight"]
            res[p + ".experts.gate_up_proj"] = torch.from_numpy(np.concatenate([gate, up], axis=1))
            res[p + ".experts.down_proj"] = torch.from_numpy(np.ascontiguousarray(down))
    return res


def mlx_forward_f32(mlx_dir: Path, tokens: list[int]) -> np.ndarray:
    """Logits from mlx-lm itself on the MLX checkpoint with every floating
    tensor (incl. scales/biases) upcast to f32, i.e. the same dequantized
    weights as the transformers reference, computed by independent code."""
    import mlx.core as mx
    from mlx.utils import tree_map_with_path
    from mlx_lm.utils import load_model

    model, _ = load_model(mlx_dir)

    def up(path, v):
        if isinstance(v, mx.array) and mx.issubdtype(v.dtype, mx.floating):
            return v.astype(mx.float32)
        return v

    model.update(tree_map_with_path(up, model.parameters()))
    out = model(mx.array([tokens]))
    return np.array(out[0].astype(mx.float32))


def quantization_summary(config: dict, qinfo: dict, dtypes: dict) -> dict:
    q = config.get("quantization", {})
    default = {k: q[k] for k in ("bits", "group_size", "mode") if k in q}
    overrides = {k: v for k, v in q.items() if isinstance(v, dict)}
    unquantized = sorted(
        k for k, dt in dtypes.items()
        if k.endswith(".weight") and k[: -len(".weight")] not in qinfo and dt != "uint32"
    )
    return {"default": default, "overrides": overrides, "quantized_bits": qinfo, "unquantized_weights": unquantized}
