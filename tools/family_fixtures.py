"""Golden fixtures of the families added with the one-file-per-family
layout: mixtral, qwen2_moe, glm4_moe, minimax_m2_fp8 (MiniMax-M2 ships fp8
only), deepseek_v2; and qwen3_moe_yarn (YaRN on a GQA model).

Each is written with the tensor names of the family's official Hugging Face
checkpoints (Mixtral and MiniMax-M2: `block_sparse_moe.experts.N.w1/w3/w2`;
the others: one tensor per expert), and checked to load in transformers
through `from_pretrained` (its own key conversions) to the same parameters
and logits as the reference.
"""

from __future__ import annotations

import re

import torch

import fixturelib as fl

BF16 = torch.bfloat16


def _common(model_type: str, arch: str, **extra) -> dict:
    cfg = {
        "architectures": [arch],
        "model_type": model_type,
        "bos_token_id": fl.BOS_ID,
        "eos_token_id": fl.EOS_ID,
        "hidden_act": "silu",
        "hidden_size": 128,
        "initializer_range": 0.02,
        "max_position_embeddings": 4096,
        "num_attention_heads": 4,
        "num_hidden_layers": 3,
        "num_key_value_heads": 2,
        "rms_norm_eps": 1e-06,
        "rope_theta": 1000000.0,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "use_cache": True,
        "vocab_size": fl.VOCAB,
    }
    cfg.update(extra)
    return cfg


MIXTRAL_CONFIG = _common(
    "mixtral", "MixtralForCausalLM",
    intermediate_size=64,
    num_local_experts=8,
    num_experts_per_tok=2,
    sliding_window=None,
    router_aux_loss_coef=0.02,
    output_router_logits=False,
    attention_dropout=0.0,
)

QWEN2_MOE_CONFIG = _common(
    "qwen2_moe", "Qwen2MoeForCausalLM",
    intermediate_size=192,
    moe_intermediate_size=64,
    shared_expert_intermediate_size=96,
    num_experts=16,
    num_experts_per_tok=4,
    decoder_sparse_step=1,
    mlp_only_layers=[1],
    norm_topk_prob=False,
    use_sliding_window=False,
    sliding_window=4096,
    max_window_layers=3,
    qkv_bias=True,
    output_router_logits=False,
    router_aux_loss_coef=0.001,
    attention_dropout=0.0,
    tie_word_embeddings=True,
)

GLM4_MOE_CONFIG = _common(
    "glm4_moe", "Glm4MoeForCausalLM",
    head_dim=48,  # != hidden/heads; rotary dim 48*0.5 = 24
    partial_rotary_factor=0.5,
    attention_bias=True,
    use_qk_norm=True,
    intermediate_size=192,
    moe_intermediate_size=64,
    n_routed_experts=16,
    num_experts_per_tok=4,
    n_shared_experts=1,
    n_group=1,
    topk_group=1,
    first_k_dense_replace=1,
    norm_topk_prob=True,
    routed_scaling_factor=2.5,
    num_nextn_predict_layers=0,
    attention_dropout=0.0,
)

MINIMAX_M2_CONFIG = _common(
    "minimax_m2", "MiniMaxM2ForCausalLM",
    head_dim=48,
    rotary_dim=24,
    intermediate_size=64,
    num_local_experts=16,
    num_experts_per_tok=4,
    scoring_func="sigmoid",
    use_routing_bias=True,
    use_qk_norm=True,
    qk_norm_type="per_layer",
    attn_type_list=[1, 1, 1],
    sliding_window=None,
    output_router_logits=False,
    router_aux_loss_coef=0.001,
    attention_dropout=0.0,
)


# As MiniMax-M2 ships: fp8 e4m3 with 128x128 block scales; hidden 256 so
# that some blocks are partial (q_proj rows 192, down_proj cols 64).
MINIMAX_M2_FP8_CONFIG = dict(
    MINIMAX_M2_CONFIG,
    hidden_size=256,
    quantization_config={
        "activation_scheme": "dynamic",
        "fmt": "float8_e4m3fn",
        "quant_method": "fp8",
        "weight_block_size": [128, 128],
    },
)

DEEPSEEK_V2_CONFIG = _common(
    "deepseek_v2", "DeepseekV2ForCausalLM",
    num_key_value_heads=4,
    max_position_embeddings=1024,
    intermediate_size=320,
    moe_intermediate_size=64,
    n_routed_experts=16,
    num_experts_per_tok=4,
    n_shared_experts=2,
    first_k_dense_replace=1,
    moe_layer_freq=1,
    n_group=4,
    topk_group=2,
    topk_method="group_limited_greedy",
    routed_scaling_factor=2.0,
    scoring_func="softmax",
    norm_topk_prob=False,
    q_lora_rank=96,
    kv_lora_rank=64,
    qk_nope_head_dim=32,
    qk_rope_head_dim=16,
    v_head_dim=32,
    rope_theta=10000,
    rope_scaling={
        "beta_fast": 32,
        "beta_slow": 1,
        "factor": 4,
        "mscale": 0.707,
        "mscale_all_dim": 0.707,
        "original_max_position_embeddings": 256,
        "type": "yarn",
    },
    attention_bias=False,
    attention_dropout=0.0,
    aux_loss_alpha=0.001,
    seq_aux=True,
)


def _hub_block_sparse(t: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """transformers' per-expert names -> Mixtral / MiniMax-M2 hub names."""
    out = {}
    for k, v in t.items():
        k = k.replace(".mlp.", ".block_sparse_moe.")
        m = re.match(r"^(.*\.experts\.\d+)\.(gate_proj|up_proj|down_proj)\.weight$", k)
        if m:
            k = f"{m.group(1)}.{ {'gate_proj': 'w1', 'up_proj': 'w3', 'down_proj': 'w2'}[m.group(2)] }.weight"
        out[k] = v
    return out


def _from_hub_block_sparse(t: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    out = {}
    for k, v in t.items():
        k = k.replace(".block_sparse_moe.", ".mlp.")
        m = re.match(r"^(.*\.experts\.\d+)\.(w1|w2|w3)\.weight$", k)
        if m:
            k = f"{m.group(1)}.{ {'w1': 'gate_proj', 'w3': 'up_proj', 'w2': 'down_proj'}[m.group(2)] }.weight"
        out[k] = v
    return out


def _rules(base):
    """The shared init rules, with larger projection biases (so that a
    missed bias shows in the logits)."""

    def rules(name, p):
        if p.ndim == 1 and name.endswith("_proj.bias"):
            return fl.randn(p.shape, 0.1)
        return base(name, p)

    return rules


def _is_fp8_linear(name: str) -> bool:
    """Which tensors an official fp8 checkpoint (MiniMax-M2, GLM-4.5-FP8)
    stores as float8_e4m3fn: the Linear weights of the layers except the
    router; not embeddings, lm_head or norms."""
    if not name.endswith(".weight") or not name.startswith("model.layers."):
        return False
    return not (name.endswith("norm.weight") or name.endswith(".gate.weight"))


def build(mf, name: str, config: dict, seed: int, to_hub=None, from_hub=None, keep_f32=(), fp8=False):
    """Write `config`, a random checkpoint in the hub's names, and the
    transformers reference on exactly the saved weights; the first of ten
    seeds from `seed` whose logits discriminate (check_not_degenerate)."""
    for s in range(seed, seed + 10):
        try:
            return _build(mf, name, config, s, to_hub, from_hub, keep_f32, fp8)
        except fl.Degenerate as e:
            print(f"  seed {s}: {e}; next seed")
    raise fl.Degenerate(f"{name}: ten seeds from {seed} all degenerate")


def _build(mf, name, config, seed, to_hub, from_hub, keep_f32, fp8):
    from transformers import AutoConfig

    import fp8lib

    d = fl.fresh_dir(fl.FIXTURES / name)
    fl.write_json(d / "config.json", config)
    mf.common_files(d)
    hf_config = AutoConfig.from_pretrained(str(d))
    if fp8:
        # the reference runs on the dequantized weights
        del hf_config.quantization_config
    model = mf.hf_model(hf_config)
    fl.init_params(model, seed, _rules(mf.make_rules(0.1, zero_centred_norms=False, embed_std=0.05)))
    module = mf.to_ckpt_dtype(fl.module_state(model), keep_f32=keep_f32)
    if config.get("tie_word_embeddings"):
        module.pop("lm_head.weight", None)
    ckpt = fl.module_to_per_expert(module)
    if to_hub:
        ckpt = to_hub(ckpt)
    if fp8:
        g = torch.Generator().manual_seed(seed + 2)
        for k in sorted(ckpt):
            if _is_fp8_linear(k):
                ckpt[k], ckpt[k + "_scale_inv"] = fp8lib.quantize_fp8_blocks(ckpt[k].float(), g)
    fl.write_checkpoint(d, ckpt)

    saved = fl.read_checkpoint(d)
    for k in [k for k in saved if k.endswith("_scale_inv")]:
        w = k[: -len("_scale_inv")]
        saved[w] = fp8lib.dequantize_fp8_blocks(saved[w], saved.pop(k))
    if from_hub:
        saved = from_hub(saved)
    module_saved = fl.per_expert_to_module(saved)
    ref_model = mf.hf_model(hf_config)
    fl.load_module_state(ref_model, mf.upcast(module_saved))
    ref = fl.run_reference(ref_model)
    if fl.EOS_ID in ref["greedy"]:
        # `run` stops at EOS: the greedy test needs a continuation without it.
        raise fl.Degenerate(f"{name}: greedy tokens {ref['greedy']} hold EOS {fl.EOS_ID}")
    if not fp8:
        mf.cross_check_from_pretrained(d, ref, module_saved)
    note = ("f32 eager on the saved weights: fp8 e4m3 values times their weight_scale_inv block "
            "(128x128) multiplier, other tensors upcast" if fp8 else
            "f32 eager on the saved bf16 weights (upcast)")
    mf.finish(name, d, config["model_type"], ref, f"{fl.versions_string()}, {note}")


def qwen3_moe_yarn_config(mf) -> dict:
    """Qwen3-MoE with the YaRN scaling its model cards tell users to add
    for long contexts (here a factor of 4 over 1,024 positions); two layers
    of 8 experts, to stay small."""
    return {
        **mf.QWEN3_MOE_CONFIG,
        "num_hidden_layers": 2,
        "max_window_layers": 2,
        "mlp_only_layers": [],
        "num_experts": 8,
        "num_experts_per_tok": 2,
        "rope_scaling": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 1024},
    }


def builders(mf) -> dict:
    """The builders, keyed by fixture name; `mf` is make_fixtures."""
    return {
        "mixtral": lambda: build(mf, "mixtral", MIXTRAL_CONFIG, 811, _hub_block_sparse, _from_hub_block_sparse),
        "qwen2_moe": lambda: build(mf, "qwen2_moe", QWEN2_MOE_CONFIG, 823),
        "glm4_moe": lambda: build(mf, "glm4_moe", GLM4_MOE_CONFIG, 839, keep_f32=("e_score_correction_bias",)),
        "deepseek_v2": lambda: build(mf, "deepseek_v2", DEEPSEEK_V2_CONFIG, 877),
        "qwen3_moe_yarn": lambda: build(mf, "qwen3_moe_yarn", qwen3_moe_yarn_config(mf), 901),
        "minimax_m2_fp8": lambda: build(mf, "minimax_m2_fp8", MINIMAX_M2_FP8_CONFIG, 863, _hub_block_sparse,
                                        _from_hub_block_sparse, keep_f32=("e_score_correction_bias",), fp8=True),
    }
