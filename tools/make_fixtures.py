#!/usr/bin/env python3
"""Build the golden test fixtures of moeflux under tests/fixtures/.

Each fixture is a tiny random model written the way real checkpoints of its
architecture are written, plus reference.json with the logits that Hugging
Face transformers computes in f32 (eager attention) on exactly the saved
weights (dequantized for the MLX 4-bit and fp8 fixtures).

    tools/.venv/bin/python tools/make_fixtures.py            # all fixtures
    tools/.venv/bin/python tools/make_fixtures.py qwen3_moe  # some of them

MLX fixtures are made from their bf16 source fixture with mlx_lm.convert, so
building `qwen3_moe_mlx4` also needs `qwen3_moe` (it is rebuilt if missing).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

import fixturelib as fl  # noqa: E402
import fp8lib  # noqa: E402
import family_fixtures  # noqa: E402
import mlxlib  # noqa: E402

torch.set_num_threads(2)
BF16 = torch.bfloat16
SUMMARY: dict[str, dict] = {}


def hf_model(config, cls=None):
    """An f32 transformers model with eager attention and eager experts."""
    from transformers import AutoModelForCausalLM

    cls = cls or AutoModelForCausalLM
    make = cls.from_config if cls is AutoModelForCausalLM else cls._from_config
    return make(
        config, dtype=torch.float32, attn_implementation="eager", experts_implementation="eager"
    ).eval()


def hf_from_pretrained(d: Path, cls=None):
    from transformers import AutoModelForCausalLM

    cls = cls or AutoModelForCausalLM
    return cls.from_pretrained(
        str(d), dtype=torch.float32, attn_implementation="eager", experts_implementation="eager"
    ).eval()


def common_files(d: Path) -> None:
    fl.build_tokenizer(d)
    fl.write_generation_config(d)


def to_ckpt_dtype(t: dict[str, torch.Tensor], keep_f32=()) -> dict[str, torch.Tensor]:
    return {k: (v.float() if any(s in k for s in keep_f32) else v.to(BF16)) for k, v in t.items()}


def upcast(t: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {k: v.float() for k, v in t.items()}


def finish(name: str, d: Path, arch: str, ref: dict, note: str, extra: dict | None = None) -> None:
    stats = fl.check_not_degenerate(name, ref)
    fl.write_reference(d, arch, ref, note)
    SUMMARY[name] = {"size": fl.dir_size(d), "stats": stats, **(extra or {})}
    print(f"  [{name}] greedy {ref['greedy']}  size {fl.dir_size(d) / 1e6:.2f} MB")


# Init rules ---------------------------------------------------------------


def make_rules(std: float, zero_centred_norms: bool, embed_std: float | None = None):
    """Weights ~ N(0, std); every norm weight perturbed: plain RMSNorms
    1 + 0.1 N(0,1), zero-centred (Qwen3.5/Next `x*(1+w)`) ones 0.1 N(0,1)."""
    zc_suffix = ("input_layernorm.weight", "post_attention_layernorm.weight", "q_norm.weight", "k_norm.weight")

    def rules(name: str, p: torch.Tensor):
        shape = p.shape
        if name.endswith("e_score_correction_bias"):
            return fl.randn(shape, 0.1)
        if name.endswith("A_log"):
            return lambda g: torch.log(torch.rand(shape, generator=g) * 1.9 + 0.1)
        if name.endswith("dt_bias"):
            return fl.randn(shape, 0.5)
        if name.endswith("conv1d.weight"):
            return fl.randn(shape, 0.3)
        if p.ndim == 1 and ("norm" in name or name.endswith("layernorm.weight")):
            if name.startswith("model.visual") or name.startswith("visual"):
                return fl.randn(shape, 0.1, 1.0)
            is_zc = zero_centred_norms and (
                any(name.endswith(s) for s in zc_suffix) or name.endswith("model.norm.weight")
                or name.endswith("language_model.norm.weight")
            )
            return fl.randn(shape, 0.1, 0.0 if is_zc else 1.0)
        if p.ndim == 1:  # biases (vision tower only)
            return fl.randn(shape, 0.02)
        if embed_std is not None and name.endswith("embed_tokens.weight"):
            return fl.randn(shape, embed_std)
        return fl.randn(shape, std)

    return rules


# 1. qwen3_moe -------------------------------------------------------------

QWEN3_MOE_CONFIG = {
    "architectures": ["Qwen3MoeForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "bos_token_id": fl.BOS_ID,
    "decoder_sparse_step": 1,
    "eos_token_id": fl.EOS_ID,
    "head_dim": 40,  # != hidden/heads (32); o_proj input 160 is not a multiple of 64
    "hidden_act": "silu",
    "hidden_size": 128,
    "initializer_range": 0.02,
    "intermediate_size": 192,
    "max_position_embeddings": 4096,
    "max_window_layers": 3,
    "mlp_only_layers": [1],
    "model_type": "qwen3_moe",
    "moe_intermediate_size": 64,
    "norm_topk_prob": False,
    "num_attention_heads": 4,
    "num_experts": 16,
    "num_experts_per_tok": 4,
    "num_hidden_layers": 3,
    "num_key_value_heads": 2,
    "output_router_logits": False,
    "rms_norm_eps": 1e-06,
    "rope_scaling": None,
    "rope_theta": 1000000.0,
    "router_aux_loss_coef": 0.001,
    "sliding_window": None,
    "tie_word_embeddings": True,
    "torch_dtype": "bfloat16",
    "transformers_version": "4.51.0",
    "use_cache": True,
    "use_sliding_window": False,
    "vocab_size": fl.VOCAB,
}


def build_qwen3_moe(name="qwen3_moe", seed=135):
    from transformers import AutoConfig

    d = fl.fresh_dir(fl.FIXTURES / name)
    fl.write_json(d / "config.json", QWEN3_MOE_CONFIG)
    common_files(d)
    config = AutoConfig.from_pretrained(str(d))
    assert config.rope_parameters["rope_theta"] == 1e6 and config.num_experts == 16

    model = hf_model(config)
    fl.init_params(model, seed, make_rules(0.1, zero_centred_norms=False, embed_std=0.05))
    module = to_ckpt_dtype(fl.module_state(model))
    module.pop("lm_head.weight")  # tied to model.embed_tokens.weight
    ckpt = fl.module_to_per_expert(module)
    fl.write_checkpoint(d, ckpt)

    ref_model = hf_model(config)
    fl.load_module_state(ref_model, upcast(fl.per_expert_to_module(fl.read_checkpoint(d))))
    ref = fl.run_reference(ref_model)
    cross_check_from_pretrained(d, ref, fl.per_expert_to_module(fl.read_checkpoint(d)))
    finish(name, d, "qwen3_moe", ref, f"{fl.versions_string()}, f32 eager on the saved bf16 weights (upcast)")


def cross_check_from_pretrained(d: Path, ref: dict, module_tensors, cls=None) -> None:
    """The checkpoint loads in transformers as written (from_pretrained
    applies its own key conversions) to bit-identical parameters and the
    same logits."""
    m = hf_from_pretrained(d, cls)
    fl.assert_model_matches(m, module_tensors)
    with torch.no_grad():
        lg = m(input_ids=torch.tensor([fl.TOKENS]), use_cache=False).logits[0].float()
    err = fl.rel_l2(lg, ref["logits"])
    assert err < 1e-6, err
    print(f"  from_pretrained cross-check ok (rel L2 {err:.1e})")


# 2. qwen3_next ------------------------------------------------------------

QWEN3_NEXT_CONFIG = {
    "architectures": ["Qwen3NextForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "bos_token_id": fl.BOS_ID,
    "decoder_sparse_step": 1,
    "eos_token_id": fl.EOS_ID,
    "head_dim": 48,  # != hidden/heads; rotary dim int(48*0.25) = 12
    "hidden_act": "silu",
    "hidden_size": 128,
    "initializer_range": 0.02,
    "intermediate_size": 256,
    # irregular: full attention at layers 1 and 4, not (i+1) % n == 0 for any n
    "layer_types": ["linear_attention", "full_attention", "linear_attention", "linear_attention", "full_attention"],
    "linear_conv_kernel_dim": 4,
    "linear_key_head_dim": 48,
    "linear_num_key_heads": 2,
    "linear_num_value_heads": 4,
    "linear_value_head_dim": 32,
    "max_position_embeddings": 4096,
    "mlp_only_layers": [3],
    "model_type": "qwen3_next",
    "moe_intermediate_size": 64,
    "norm_topk_prob": True,
    "num_attention_heads": 4,
    "num_experts": 8,
    "num_experts_per_tok": 2,
    "num_hidden_layers": 5,
    "num_key_value_heads": 2,
    "output_router_logits": False,
    "partial_rotary_factor": 0.25,  # top level, as in Qwen3-Next-80B-A3B
    "rms_norm_eps": 1e-06,
    "rope_scaling": None,
    "rope_theta": 1000000,
    "router_aux_loss_coef": 0.001,
    "shared_expert_intermediate_size": 64,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "transformers_version": "4.57.0.dev0",
    "use_cache": True,
    "use_sliding_window": False,
    "vocab_size": fl.VOCAB,
}


def build_qwen3_next(name="qwen3_next", seed=207):
    from transformers import AutoConfig

    d = fl.fresh_dir(fl.FIXTURES / name)
    fl.write_json(d / "config.json", QWEN3_NEXT_CONFIG)
    common_files(d)
    config = AutoConfig.from_pretrained(str(d))
    assert config.rope_parameters["partial_rotary_factor"] == 0.25
    assert config.layer_types == QWEN3_NEXT_CONFIG["layer_types"]

    model = hf_model(config)
    fl.init_params(model, seed, make_rules(0.06, zero_centred_norms=True))
    # A_log kept in f32 (as e.g. the official Qwen3-Next checkpoints do)
    module = to_ckpt_dtype(fl.module_state(model), keep_f32=("A_log",))
    ckpt = fl.module_to_per_expert(module)
    fl.write_checkpoint(d, ckpt, n_shards=2)

    ref_model = hf_model(config)
    saved = fl.per_expert_to_module(fl.read_checkpoint(d))
    fl.load_module_state(ref_model, upcast(saved))
    ref = fl.run_reference(ref_model)
    cross_check_from_pretrained(d, ref, saved)
    finish(name, d, "qwen3_next", ref, f"{fl.versions_string()}, f32 eager on the saved bf16 weights (upcast)")


# 3. qwen3_5_moe -----------------------------------------------------------

QWEN3_5_MOE_CONFIG = {
    "architectures": ["Qwen3_5MoeForConditionalGeneration"],
    "image_token_id": 510,
    "language_model_only": False,
    "model_type": "qwen3_5_moe",
    "text_config": {
        "attention_bias": False,
        "attention_dropout": 0.0,
        "attn_output_gate": True,
        "bos_token_id": fl.BOS_ID,
        "dtype": "bfloat16",
        "eos_token_id": fl.EOS_ID,
        # mlx-lm builds the layer mix from full_attention_interval only (it
        # ignores layer_types), so this fixture -- the source of
        # qwen3_5_moe_mlx4 -- keeps the two consistent, as official
        # checkpoints do. Interval 2 (not the default 4) still catches an
        # engine that ignores both.
        "full_attention_interval": 2,
        "head_dim": 64,  # != hidden/heads (32); rotary dim 16
        "hidden_act": "silu",
        "hidden_size": 128,
        "initializer_range": 0.02,
        "layer_types": ["linear_attention", "full_attention", "linear_attention", "full_attention"],
        "linear_conv_kernel_dim": 4,
        "linear_key_head_dim": 32,
        "linear_num_key_heads": 2,
        "linear_num_value_heads": 4,
        "linear_value_head_dim": 48,
        "mamba_ssm_dtype": "float32",
        "max_position_embeddings": 4096,
        "model_type": "qwen3_5_moe_text",
        "moe_intermediate_size": 64,
        "mtp_num_hidden_layers": 1,
        "mtp_use_dedicated_embeddings": False,
        "num_attention_heads": 4,
        "num_experts": 8,
        "num_experts_per_tok": 2,
        "num_hidden_layers": 4,
        "num_key_value_heads": 2,
        "output_router_logits": False,
        "pad_token_id": None,
        "partial_rotary_factor": 0.25,
        "rms_norm_eps": 1e-06,
        "rope_parameters": {
            "mrope_interleaved": True,
            "mrope_section": [3, 3, 2],
            "partial_rotary_factor": 0.25,
            "rope_theta": 10000000,
            "rope_type": "default",
        },
        "router_aux_loss_coef": 0.001,
        # shared_expert.down_proj input 96 is not a multiple of 64: MLX keeps it bf16
        "shared_expert_intermediate_size": 96,
        "tie_word_embeddings": False,
        "use_cache": True,
        "vocab_size": fl.VOCAB,
    },
    "tie_word_embeddings": False,
    "transformers_version": "4.57.1",
    "video_token_id": 511,
    "vision_config": {
        "deepstack_visual_indexes": [],
        "depth": 1,
        "hidden_act": "gelu_pytorch_tanh",
        "hidden_size": 64,
        "in_channels": 3,
        "initializer_range": 0.02,
        "intermediate_size": 128,
        "model_type": "qwen3_5_moe",
        "num_heads": 2,
        "num_position_embeddings": 16,
        "out_hidden_size": 128,
        "patch_size": 8,
        "spatial_merge_size": 2,
        "temporal_patch_size": 2,
    },
    "vision_end_token_id": 509,
    "vision_start_token_id": 508,
}


def qwen3_5_mtp_tensors(cfg: dict, g: torch.Generator) -> dict[str, torch.Tensor]:
    """An MTP head with the tensor names of the official Qwen3.5 MoE
    checkpoints (mtp.*). Nothing reads it: it must be skipped."""
    h, e, i = cfg["hidden_size"], cfg["num_experts"], cfg["moe_intermediate_size"]
    hd, nh, nkv, si = cfg["head_dim"], cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg[
        "shared_expert_intermediate_size"]
    shapes = {
        "mtp.fc.weight": (h, 2 * h),
        "mtp.norm.weight": (h,),
        "mtp.pre_fc_norm_embedding.weight": (h,),
        "mtp.pre_fc_norm_hidden.weight": (h,),
        "mtp.layers.0.input_layernorm.weight": (h,),
        "mtp.layers.0.post_attention_layernorm.weight": (h,),
        "mtp.layers.0.self_attn.q_proj.weight": (nh * hd * 2, h),
        "mtp.layers.0.self_attn.k_proj.weight": (nkv * hd, h),
        "mtp.layers.0.self_attn.v_proj.weight": (nkv * hd, h),
        "mtp.layers.0.self_attn.o_proj.weight": (h, nh * hd),
        "mtp.layers.0.self_attn.q_norm.weight": (hd,),
        "mtp.layers.0.self_attn.k_norm.weight": (hd,),
        "mtp.layers.0.mlp.gate.weight": (e, h),
        "mtp.layers.0.mlp.experts.gate_up_proj": (e, 2 * i, h),
        "mtp.layers.0.mlp.experts.down_proj": (e, h, i),
        "mtp.layers.0.mlp.shared_expert.gate_proj.weight": (si, h),
        "mtp.layers.0.mlp.shared_expert.up_proj.weight": (si, h),
        "mtp.layers.0.mlp.shared_expert.down_proj.weight": (h, si),
        "mtp.layers.0.mlp.shared_expert_gate.weight": (1, h),
    }
    return {k: (torch.randn(s, generator=g) * (0.1 if len(s) == 1 else 0.06)).to(BF16) for k, s in shapes.items()}


def build_qwen3_5_moe(name="qwen3_5_moe", seed=310):
    from transformers import AutoConfig, Qwen3_5MoeForCausalLM, Qwen3_5MoeForConditionalGeneration

    d = fl.fresh_dir(fl.FIXTURES / name)
    fl.write_json(d / "config.json", QWEN3_5_MOE_CONFIG)
    common_files(d)
    config = AutoConfig.from_pretrained(str(d))
    tc = config.text_config
    assert tc.layer_types == QWEN3_5_MOE_CONFIG["text_config"]["layer_types"]
    assert tc.rope_parameters["partial_rotary_factor"] == 0.25

    model = hf_model(config, Qwen3_5MoeForConditionalGeneration)
    fl.init_params(model, seed, make_rules(0.06, zero_centred_norms=True))
    # The module layout of transformers 5 is the official checkpoint layout
    # here: model.language_model.*, model.visual.*, lm_head.weight, experts
    # stacked as mlp.experts.gate_up_proj [E, 2I, H] / down_proj [E, H, I].
    module = to_ckpt_dtype(fl.module_state(model))
    assert any(k.endswith("mlp.experts.gate_up_proj") for k in module)
    ckpt = dict(module)
    ckpt.update(qwen3_5_mtp_tensors(QWEN3_5_MOE_CONFIG["text_config"], torch.Generator().manual_seed(seed + 1)))
    fl.write_checkpoint(d, ckpt)

    saved = {k: v for k, v in fl.read_checkpoint(d).items() if not k.startswith("mtp.")}
    ref_model = hf_model(config, Qwen3_5MoeForConditionalGeneration)
    fl.load_module_state(ref_model, upcast(saved))
    ref = fl.run_reference(ref_model)
    cross_check_from_pretrained(d, ref, saved, Qwen3_5MoeForConditionalGeneration)

    # The text-only class gives the same numbers (used for the MLX fixture,
    # which has no vision tower).
    text = hf_model(tc, Qwen3_5MoeForCausalLM)
    fl.load_module_state(text, upcast(qwen3_5_text_only(saved)))
    with torch.no_grad():
        lg = text(input_ids=torch.tensor([fl.TOKENS]), use_cache=False).logits[0]
    err = fl.rel_l2(lg, ref["logits"])
    assert err < 1e-6, err
    finish(name, d, "qwen3_5_moe", ref, f"{fl.versions_string()}, f32 eager on the saved bf16 weights (upcast)")


def qwen3_5_text_only(t: dict) -> dict:
    out = {}
    for k, v in t.items():
        if k.startswith("model.visual."):
            continue
        if k.startswith("model.language_model."):
            k = "model." + k[len("model.language_model."):]
        out[k] = v
    return out


# 4./5. MLX 4-bit ------------------------------------------------------------


def build_mlx4(name: str, src_name: str, arch: str, zero_centred: bool, text_cls, prefix_map):
    """mlx_lm.convert -q (4 bits, group 64) of a bf16 fixture, and the
    reference on the exactly dequantized weights."""
    from transformers import AutoConfig

    src = fl.FIXTURES / src_name
    if not (src / "reference.json").exists():
        BUILDERS[src_name]()
    d = fl.FIXTURES / name
    if d.exists():
        shutil.rmtree(d)
    mlxlib.convert_with_mlx_lm(src, d, bits=4, group_size=64)
    (d / "README.md").unlink(missing_ok=True)  # mlx-lm's model card template
    fl.write_generation_config(d)  # mlx-lm copies it; keep ours identical

    mcfg = json.loads((d / "config.json").read_text())
    q = mcfg["quantization"]
    assert q["bits"] == 4 and q["group_size"] == 64 and q.get("mode", "affine") == "affine"
    raw = mlxlib.read_mlx(d)
    deq, qinfo = mlxlib.dequantize_all(raw, 64, {k: v for k, v in q.items() if isinstance(v, dict)})
    mlxlib.check_against_mx_dequantize(deq, d, 64, qinfo)
    module = mlxlib.mlx_to_module(deq, prefix_map=prefix_map, zero_centred=zero_centred)

    config = AutoConfig.from_pretrained(str(src))
    tconf = config.get_text_config() if text_cls is not None else config
    ref_model = hf_model(tconf, text_cls)
    fl.load_module_state(ref_model, module)
    ref = fl.run_reference(ref_model)

    # Independent check: mlx-lm's own forward pass with all tensors upcast to
    # f32 computes the same logits from the same checkpoint.
    mlx_logits = mlxlib.mlx_forward_f32(d, fl.TOKENS)
    err = fl.rel_l2(torch.from_numpy(mlx_logits), ref["logits"])
    print(f"  mlx-lm f32 forward vs transformers reference: rel L2 {err:.2e}")
    assert err < 1e-4, err

    # how far the 4-bit model is from its bf16 source
    src_logits = torch.tensor(json.loads((src / "reference.json").read_text())["logits"])
    print(f"  4-bit vs bf16 source logits: rel L2 {fl.rel_l2(ref['logits'], src_logits):.3f}")
    summary = mlxlib.quantization_summary(mcfg, qinfo, mlxlib.mlx_dtypes(d))
    finish(
        name, d, arch, ref,
        f"{fl.versions_string()}, f32 eager on the MLX weights dequantized exactly "
        f"(w = q*scale + bias per group of 64, bf16 scales/biases upcast); made with "
        f"mlx-lm {mlx_lm_version()} convert -q --q-bits 4 --q-group-size 64 from {src_name}",
        {"quantization": summary, "mlx_vs_ref_rel_l2": err},
    )


def mlx_lm_version() -> str:
    import mlx_lm

    return mlx_lm.__version__


def build_qwen3_moe_mlx4():
    build_mlx4("qwen3_moe_mlx4", "qwen3_moe", "qwen3_moe", False, None, [])


def build_qwen3_5_moe_mlx4():
    from transformers import Qwen3_5MoeForCausalLM

    build_mlx4(
        "qwen3_5_moe_mlx4", "qwen3_5_moe", "qwen3_5_moe", True, Qwen3_5MoeForCausalLM,
        [("language_model.model.", "model."), ("language_model.lm_head.", "lm_head.")],
    )


# 6./7. deepseek_v3 ------------------------------------------------------------


def deepseek_config(hidden: int, q_lora_rank, fp8: bool) -> dict:
    cfg = {
        "architectures": ["DeepseekV3ForCausalLM"],
        "attention_bias": False,
        "attention_dropout": 0.0,
        "aux_loss_alpha": 0.001,
        "bos_token_id": fl.BOS_ID,
        "eos_token_id": fl.EOS_ID,
        "ep_size": 1,
        "first_k_dense_replace": 1,
        "hidden_act": "silu",
        "hidden_size": hidden,
        "initializer_range": 0.02,
        "intermediate_size": 320,  # dense layer 0; 320 rows = 3 fp8 blocks, the last partial
        "kv_lora_rank": 64,
        "max_position_embeddings": 1024,
        "model_type": "deepseek_v3",
        "moe_intermediate_size": 64,
        "moe_layer_freq": 1,
        "n_group": 4,
        "n_routed_experts": 16,
        "n_shared_experts": 2,
        "norm_topk_prob": True,
        "num_attention_heads": 4,
        "num_experts_per_tok": 4,
        "num_hidden_layers": 3,
        "num_key_value_heads": 4,
        "num_nextn_predict_layers": 1,
        "pretraining_tp": 1,
        "q_lora_rank": q_lora_rank,
        "qk_nope_head_dim": 32,
        "qk_rope_head_dim": 16,
        "rms_norm_eps": 1e-06,
        "rope_scaling": {
            "beta_fast": 32,
            "beta_slow": 1,
            "factor": 4,
            "mscale": 0.707,
            "mscale_all_dim": 1.0,
            "original_max_position_embeddings": 256,
            "type": "yarn",
        },
        "rope_theta": 10000,
        "routed_scaling_factor": 2.5,
        "scoring_func": "sigmoid",
        "seq_aux": True,
        "tie_word_embeddings": False,
        "topk_group": 2,
        "topk_method": "noaux_tc",
        "torch_dtype": "bfloat16",
        "transformers_version": "4.33.1",
        "use_cache": True,
        "v_head_dim": 32,
        "vocab_size": fl.VOCAB,
    }
    if fp8:
        cfg["quantization_config"] = {
            "activation_scheme": "dynamic",
            "fmt": "e4m3",
            "quant_method": "fp8",
            "weight_block_size": [128, 128],
        }
        cfg["rope_interleave"] = True  # explicit here, left to its default in deepseek_v3
    return cfg


def deepseek_mtp_tensors(cfg: dict, g: torch.Generator) -> dict[str, torch.Tensor]:
    """Layer model.layers.{num_hidden_layers}.* = DeepSeek's MTP module (a
    subset of its tensors, real names). Must be skipped."""
    n, h = cfg["num_hidden_layers"], cfg["hidden_size"]
    i, e, nh = cfg["moe_intermediate_size"], cfg["n_routed_experts"], cfg["num_attention_heads"]
    kv, dr = cfg["kv_lora_rank"], cfg["qk_rope_head_dim"]
    p = f"model.layers.{n}."
    shapes = {
        "enorm.weight": (h,),
        "hnorm.weight": (h,),
        "eh_proj.weight": (h, 2 * h),
        "shared_head.norm.weight": (h,),
        "input_layernorm.weight": (h,),
        "post_attention_layernorm.weight": (h,),
        "self_attn.kv_a_proj_with_mqa.weight": (kv + dr, h),
        "self_attn.kv_a_layernorm.weight": (kv,),
        "self_attn.o_proj.weight": (h, nh * cfg["v_head_dim"]),
        "mlp.gate.weight": (e, h),
        "mlp.experts.0.gate_proj.weight": (i, h),
        "mlp.experts.0.up_proj.weight": (i, h),
        "mlp.experts.0.down_proj.weight": (h, i),
        "mlp.shared_experts.down_proj.weight": (h, i * cfg["n_shared_experts"]),
    }
    out = {p + k: torch.randn(s, generator=g) * (0.1 if len(s) == 1 else 0.06) for k, s in shapes.items()}
    out[p + "mlp.gate.e_score_correction_bias"] = torch.randn(e, generator=g) * 0.1
    return out


DS_KEEP_F32 = ("e_score_correction_bias",)


def is_fp8_linear(name: str) -> bool:
    """Which tensors DeepSeek-V3's fp8 checkpoint stores as float8_e4m3fn:
    the weights of the Linear layers except the router (mlp.gate) and
    lm_head; not embeddings, not norms."""
    if not name.endswith(".weight") or not name.startswith("model.layers."):
        return False
    if name.endswith("norm.weight") or name.endswith("mlp.gate.weight"):
        return False
    return True


def build_deepseek_v3(name="deepseek_v3", seed=609, fp8=False):
    from transformers import AutoConfig

    cfgd = deepseek_config(hidden=192 if fp8 else 128, q_lora_rank=None if fp8 else 96, fp8=fp8)
    d = fl.fresh_dir(fl.FIXTURES / name)
    fl.write_json(d / "config.json", cfgd)
    common_files(d)
    config = AutoConfig.from_pretrained(str(d))
    rp = config.rope_parameters
    assert rp["rope_type"] == "yarn" and rp["mscale"] == 0.707 and rp["mscale_all_dim"] == 1.0, rp
    if fp8:
        # the reference model runs on dequantized weights: drop the fp8 config
        del config.quantization_config
    model = hf_model(config)
    fl.init_params(model, seed, make_rules(0.06, zero_centred_norms=False))
    ckpt = to_ckpt_dtype(fl.module_to_per_expert(fl.module_state(model)), keep_f32=DS_KEEP_F32)
    ckpt.update(to_ckpt_dtype(deepseek_mtp_tensors(cfgd, torch.Generator().manual_seed(seed + 1)), DS_KEEP_F32))

    fp8_info = {}
    if fp8:
        g = torch.Generator().manual_seed(seed + 2)
        for k in sorted(ckpt):
            if is_fp8_linear(k):
                q, s = fp8lib.quantize_fp8_blocks(ckpt[k].float(), g)
                ckpt[k] = q
                ckpt[k + "_scale_inv"] = s
                fp8_info[k] = list(s.shape)
        partial = [k for k in fp8_info if any(x % 128 for x in ckpt[k].shape)]
        grid2d = [k for k, s in fp8_info.items() if s[0] > 1 and s[1] > 1]
        assert partial and grid2d
        scales = sorted({float(v) for k in fp8_info for v in ckpt[k + "_scale_inv"].flatten()})
        print(f"  fp8: {len(fp8_info)} tensors, scale_inv values {scales}, 2-D grids e.g. {grid2d[:2]}")
    fl.write_checkpoint(d, ckpt)

    saved = fl.read_checkpoint(d)
    n = cfgd["num_hidden_layers"]
    weights = {}
    for k, v in saved.items():
        if k.startswith(f"model.layers.{n}."):
            continue  # MTP layer
        if k.endswith("_scale_inv"):
            continue
        if v.dtype == torch.float8_e4m3fn:
            v = fp8lib.dequantize_fp8_blocks(v, saved[k + "_scale_inv"])
        weights[k] = v.float()
    if fp8:
        check_fp8_against_mlx_lm(d, cfgd, weights)
    ref_model = hf_model(config)
    fl.load_module_state(ref_model, fl.per_expert_to_module(weights))
    routing = deepseek_routing_diagnostics(ref_model)
    ref = fl.run_reference(ref_model)
    if not fp8:
        cross_check_from_pretrained(d, ref, fl.per_expert_to_module(
            {k: v for k, v in saved.items() if not k.startswith(f"model.layers.{n}.")}))
    note = (f"{fl.versions_string()}, f32 eager on the saved weights: fp8 e4m3 values times their "
            f"weight_scale_inv block (128x128) multiplier, other tensors upcast" if fp8 else
            f"{fl.versions_string()}, f32 eager on the saved bf16 weights (upcast; e_score_correction_bias is f32)")
    extra = {"routing": routing}
    if fp8:
        extra["fp8_tensors"] = len(fp8_info)
    finish(name, d, "deepseek_v3", ref, note, extra)


def check_fp8_against_mlx_lm(d: Path, cfgd: dict, weights: dict) -> None:
    """Independent check of the fp8 convention: mlx-lm's DeepSeek sanitize()
    (mx.from_fp8, pad to 128, multiply by weight_scale_inv per block)
    dequantizes the saved checkpoint to the same values we use.
    (transformers 5's own FP8 dequantizer rejects partial edge blocks, so it
    cannot serve here.)"""
    import mlx.core as mx
    from mlx_lm.models.deepseek_v3 import Model, ModelArgs

    n = cfgd["num_hidden_layers"]
    raw = {k: v for k, v in mx.load(str(d / "model.safetensors")).items() if not k.startswith(f"model.layers.{n}.")}
    san = Model(ModelArgs.from_dict(cfgd)).sanitize(raw)
    fp8_names = {k[: -len("_scale_inv")] for k in fl.read_checkpoint(d) if k.endswith("_scale_inv")}
    checked = 0
    for k, v in weights.items():
        if k not in fp8_names or ".experts." in k:
            continue  # experts are stacked by sanitize(): checked below
        if k.endswith("kv_b_proj.weight"):  # split by sanitize() into embed_q / unembed_out
            p = k[: -len("kv_b_proj.weight")]
            wk = np.array(san[p + "embed_q.weight"].astype(mx.float32))
            wv = np.array(san[p + "unembed_out.weight"].astype(mx.float32))
            got = np.concatenate([wk.transpose(0, 2, 1), wv], axis=1).reshape(-1, wk.shape[1])
        else:
            got = np.array(san[k].astype(mx.float32))
        assert np.array_equal(got, v.numpy()), k
        checked += 1
    for k, v in san.items():
        if ".switch_mlp." in k:
            layer, proj = k.split(".")[2], k.split(".")[-2]
            for e in range(v.shape[0]):
                mine = weights[f"model.layers.{layer}.mlp.experts.{e}.{proj}.weight"].numpy()
                assert np.array_equal(np.array(v[e].astype(mx.float32)), mine), (k, e)
                checked += 1
    print(f"  fp8 dequantization agrees with mlx-lm's on {checked} matrices")


@torch.no_grad()
def deepseek_routing_diagnostics(model) -> dict:
    """Show that the golden sequence exercises the grouped, biased routing:
    count tokens whose expert set would change if the group restriction or
    the e_score_correction_bias were ignored."""
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3TopkRouter

    seen = []
    hooks = [m.register_forward_hook(lambda m, a, o: seen.append((m, a[0].detach().clone())))
             for m in model.modules() if isinstance(m, DeepseekV3TopkRouter)]
    model(input_ids=torch.tensor([fl.TOKENS]), use_cache=False)
    for h in hooks:
        h.remove()
    changed_group = changed_bias = total = 0
    for m, x in seen:
        x = x.reshape(-1, m.hidden_dim)
        _, _, idx = m(x)
        s = torch.sigmoid(x.float() @ m.weight.float().T)
        no_group = torch.topk(s + m.e_score_correction_bias, m.top_k, dim=-1).indices
        bias, m.e_score_correction_bias = m.e_score_correction_bias.clone(), torch.zeros_like(m.e_score_correction_bias)
        _, _, idx_nobias = m(x)
        m.e_score_correction_bias = bias
        for a, b, c in zip(idx.tolist(), no_group.tolist(), idx_nobias.tolist()):
            total += 1
            changed_group += set(a) != set(b)
            changed_bias += set(a) != set(c)
    print(f"  routing: {total} token-layer choices; group limit changes {changed_group}, "
          f"bias changes {changed_bias}")
    assert changed_group > 0 and changed_bias > 0
    return {"token_layer_choices": total, "changed_by_group_limit": changed_group, "changed_by_bias": changed_bias}


def build_deepseek_v3_fp8():
    build_deepseek_v3("deepseek_v3_fp8", seed=724, fp8=True)


def build_deepseek_v3_mlx4(name="deepseek_v3_mlx4", src_name="deepseek_v3"):
    """mlx_lm.convert -q of deepseek_v3. mlx-lm's DeepSeek sanitize() drops
    the MTP layer only under its real index (`model.layers.61`), so the
    conversion reads a temporary copy of the source without our MTP layer
    (model.layers.3.*) -- as if it were a 61-layer model. mlx-lm rewrites
    kv_b_proj into per-head `embed_q` [H, kv_lora, nope] (left bf16 here:
    its input size 32 is not a multiple of 64) and `unembed_out`
    [H, v_head, kv_lora] (4-bit)."""
    from transformers import AutoConfig

    src = fl.FIXTURES / src_name
    if not (src / "reference.json").exists():
        BUILDERS[src_name]()
    cfg = json.loads((src / "config.json").read_text())
    n = cfg["num_hidden_layers"]
    d = fl.FIXTURES / name
    if d.exists():
        shutil.rmtree(d)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        for f in src.iterdir():
            if f.suffix != ".safetensors" and f.name != "reference.json":
                shutil.copy(f, tmp / f.name)
        t = {k: v for k, v in fl.read_checkpoint(src).items() if not k.startswith(f"model.layers.{n}.")}
        fl.write_checkpoint(tmp, t)
        mlxlib.convert_with_mlx_lm(tmp, d, bits=4, group_size=64)
    (d / "README.md").unlink(missing_ok=True)
    fl.write_generation_config(d)

    mcfg = json.loads((d / "config.json").read_text())
    q = mcfg["quantization"]
    raw = mlxlib.read_mlx(d)
    deq, qinfo = mlxlib.dequantize_all(raw, 64, {k: v for k, v in q.items() if isinstance(v, dict)})
    mlxlib.check_against_mx_dequantize(deq, d, 64, qinfo)
    module = mlxlib.mlx_to_module(deq, prefix_map=[], zero_centred=False)
    # embed_q [H, kv_lora, nope] / unembed_out [H, v, kv_lora] -> kv_b_proj
    # [H*(nope+v), kv_lora] with row block h = [k_nope_h | v_h]
    for k in [k for k in module if k.endswith(".embed_q.weight")]:
        p = k[: -len(".embed_q.weight")]
        wk = module.pop(k)
        wv = module.pop(p + ".unembed_out.weight")
        module[p + ".kv_b_proj.weight"] = torch.cat([wk.transpose(1, 2), wv], dim=1).reshape(-1, wk.shape[1])
    config = AutoConfig.from_pretrained(str(src))
    ref_model = hf_model(config)
    fl.load_module_state(ref_model, module)
    routing = deepseek_routing_diagnostics(ref_model)
    ref = fl.run_reference(ref_model)
    mlx_logits = mlxlib.mlx_forward_f32(d, fl.TOKENS)
    err = fl.rel_l2(torch.from_numpy(mlx_logits), ref["logits"])
    print(f"  mlx-lm f32 forward vs transformers reference: rel L2 {err:.2e}")
    assert err < 1e-4, err
    src_logits = torch.tensor(json.loads((src / "reference.json").read_text())["logits"])
    print(f"  4-bit vs bf16 source logits: rel L2 {fl.rel_l2(ref['logits'], src_logits):.3f}")
    summary = mlxlib.quantization_summary(mcfg, qinfo, mlxlib.mlx_dtypes(d))
    finish(
        name, d, "deepseek_v3", ref,
        f"{fl.versions_string()}, f32 eager on the MLX weights dequantized exactly "
        f"(w = q*scale + bias per group of 64, bf16 scales/biases upcast; kv_b_proj rebuilt from "
        f"embed_q/unembed_out); made with mlx-lm {mlx_lm_version()} convert -q --q-bits 4 "
        f"--q-group-size 64 from {src_name} without its MTP layer",
        {"quantization": summary, "mlx_vs_ref_rel_l2": err, "routing": routing},
    )


BUILDERS = {
    "qwen3_moe": build_qwen3_moe,
    "qwen3_next": build_qwen3_next,
    "qwen3_5_moe": build_qwen3_5_moe,
    "qwen3_5_moe_mlx4": build_qwen3_5_moe_mlx4,
    "qwen3_moe_mlx4": build_qwen3_moe_mlx4,
    "deepseek_v3": build_deepseek_v3,
    "deepseek_v3_fp8": build_deepseek_v3_fp8,
    "deepseek_v3_mlx4": build_deepseek_v3_mlx4,
}
BUILDERS.update(family_fixtures.builders(sys.modules[__name__]))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("names", nargs="*", help=f"fixtures to build (default: all): {', '.join(BUILDERS)}")
    args = ap.parse_args()
    names = args.names or list(BUILDERS)
    for n in names:
        if n not in BUILDERS:
            ap.error(f"unknown fixture {n}")
    fl.FIXTURES.mkdir(parents=True, exist_ok=True)
    for n in names:
        print(f"== {n}")
        torch.manual_seed(0)
        BUILDERS[n]()
    for n, v in SUMMARY.items():
        print(f"{n:18s} {v['size'] / 1e6:6.2f} MB")
    total = fl.dir_size(fl.FIXTURES)
    print(f"total tests/fixtures: {total / 1e6:.2f} MB")


if __name__ == "__main__":
    main()
