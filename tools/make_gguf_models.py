#!/usr/bin/env python3
"""Make the GGUF model fixtures of tests/gguf_convert.rs: the `qwen3_moe`
golden fixture written as a GGUF file the way llama.cpp's
convert_hf_to_gguf.py writes a Qwen3-MoE model (its metadata keys, its
tensor names, the vocabulary of tokenizer.json), with its matrices in one
block format, and the logits that transformers computes on the weights
gguf-py dequantizes from that file.

    tools/.venv/bin/python tools/make_gguf_models.py    # from the repo root

Writes tests/fixtures/gguf_models/<name>/model.gguf and reference.json:

- qwen3_moe_q8_0: every matrix Q8_0 (norms and the router F32).
- qwen3_moe_q4_0: every matrix Q4_0.
- qwen3_moe_q5_0: the routed experts Q5_0 (a format the packed model does
  not hold exactly: `convert --requantize` territory), the rest Q8_0.
"""

import json
import os
import sys
from pathlib import Path

import numpy as np
import torch
import gguf
from gguf import GGMLQuantizationType as Q
from gguf import quants

sys.path.insert(0, str(Path(__file__).resolve().parent))
import fixturelib as fl  # noqa: E402
import make_fixtures as mf  # noqa: E402
import make_gguf_fixtures as mg  # noqa: E402

SRC = fl.FIXTURES / "qwen3_moe"
OUT = fl.FIXTURES / "gguf_models"


def gguf_names(cfg: dict) -> dict[str, str]:
    """HF module names (per-expert checkpoint layout) -> llama.cpp names;
    stacked experts are handled apart."""
    m = {
        "model.embed_tokens.weight": "token_embd.weight",
        "model.norm.weight": "output_norm.weight",
        "lm_head.weight": "output.weight",
    }
    for i in range(cfg["num_hidden_layers"]):
        p, b = f"model.layers.{i}", f"blk.{i}"
        for hf, gg in [
            ("input_layernorm.weight", "attn_norm.weight"),
            ("post_attention_layernorm.weight", "ffn_norm.weight"),
            ("self_attn.q_proj.weight", "attn_q.weight"),
            ("self_attn.k_proj.weight", "attn_k.weight"),
            ("self_attn.v_proj.weight", "attn_v.weight"),
            ("self_attn.o_proj.weight", "attn_output.weight"),
            ("self_attn.q_norm.weight", "attn_q_norm.weight"),
            ("self_attn.k_norm.weight", "attn_k_norm.weight"),
            ("mlp.gate.weight", "ffn_gate_inp.weight"),
            ("mlp.gate_proj.weight", "ffn_gate.weight"),
            ("mlp.up_proj.weight", "ffn_up.weight"),
            ("mlp.down_proj.weight", "ffn_down.weight"),
        ]:
            m[f"{p}.{hf}"] = f"{b}.{gg}"
    return m


def write(name: str, dense_type, expert_type):
    cfg = json.loads((SRC / "config.json").read_text())
    weights = {k: v.float().numpy() for k, v in fl.read_checkpoint(SRC).items()}
    if cfg["tie_word_embeddings"]:
        weights.pop("lm_head.weight", None)
    names = gguf_names(cfg)
    d = fl.fresh_dir(OUT / name)
    w = gguf.GGUFWriter(str(d / "model.gguf"), "qwen3moe")
    w.add_name(name)
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(cfg["hidden_size"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(cfg["num_attention_heads"])
    w.add_head_count_kv(cfg["num_key_value_heads"])
    w.add_key_length(cfg["head_dim"])
    w.add_value_length(cfg["head_dim"])
    w.add_rope_freq_base(cfg["rope_theta"])
    w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    w.add_expert_count(cfg["num_experts"])
    w.add_expert_used_count(cfg["num_experts_per_tok"])
    w.add_expert_feed_forward_length(cfg["moe_intermediate_size"])
    w.add_expert_weights_norm(cfg["norm_topk_prob"])
    mg.add_vocab(w, "gpt-2")

    deq = {}  # HF name -> what gguf-py dequantizes from the file

    def put(gname, arr, qtype):
        arr = np.ascontiguousarray(arr.astype(np.float32))
        if qtype == Q.F32:
            data = arr
        else:
            data = quants.quantize(arr, qtype)
        w.add_tensor(gname, data, raw_dtype=qtype)
        return quants.dequantize(data, qtype).reshape(arr.shape) if qtype != Q.F32 else arr

    layers = {}
    for k, v in sorted(weights.items()):
        if ".mlp.experts." in k:
            i = int(k.split(".")[2])
            e = int(k.split(".")[5])
            proj = k.split(".")[6]
            layers.setdefault(i, {}).setdefault(proj, {})[e] = v
            continue
        qtype = Q.F32 if v.ndim == 1 or k.endswith("mlp.gate.weight") else dense_type
        deq[k] = put(names[k], v, qtype)
    for i, projs in sorted(layers.items()):
        for proj, gg in [("gate_proj", "ffn_gate_exps"), ("up_proj", "ffn_up_exps"), ("down_proj", "ffn_down_exps")]:
            stack = np.stack([projs[proj][e] for e in sorted(projs[proj])])
            back = put(f"blk.{i}.{gg}.weight", stack, expert_type)
            for e in range(stack.shape[0]):
                deq[f"model.layers.{i}.mlp.experts.{e}.{proj}.weight"] = back[e]

    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()

    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(str(SRC))
    model = mf.hf_model(config)
    tensors = {k: torch.from_numpy(np.asarray(v, dtype=np.float32)) for k, v in deq.items()}
    fl.load_module_state(model, fl.per_expert_to_module(tensors))
    ref = fl.run_reference(model)
    fl.write_reference(
        d, "qwen3_moe", ref,
        f"{fl.versions_string()}, gguf {gguf.__version__ if hasattr(gguf, '__version__') else ''}: f32 eager "
        f"on gguf-py's dequantization of model.gguf (matrices {dense_type.name}, experts {expert_type.name})",
    )
    print(f"  [{name}] greedy {ref['greedy']}  {os.path.getsize(d / 'model.gguf') / 1e6:.2f} MB")


def main():
    torch.set_num_threads(2)
    write("qwen3_moe_q8_0", Q.Q8_0, Q.Q8_0)
    write("qwen3_moe_q4_0", Q.Q4_0, Q.Q4_0)
    write("qwen3_moe_q5_0", Q.Q8_0, Q.Q5_0)


if __name__ == "__main__":
    main()
