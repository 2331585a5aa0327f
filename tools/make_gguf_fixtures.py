#!/usr/bin/env python3
"""Make the GGUF fixtures of tests/gguf.rs with gguf-py (PyPI `gguf`), the
reference for ggml's block formats and GGUF files.

    tools/.venv/bin/python tools/make_gguf_fixtures.py   # from the repo root

Writes tests/fixtures/gguf/:

- blocks.gguf: one tensor per supported type, rows of 2048 values (2 rows,
  1 for the float types). gguf-py's `quantize` writes the types it can
  (F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, MXFP4); for the others (the
  K-quants, IQ4_NL, IQ4_XS) the blocks are random bytes with finite f16
  scales, some zero, negative or subnormal. MXFP4 gets a random row too.
- blocks_ref.gguf.xz: the same names as F32 tensors, gguf-py's
  `dequantize` of each (what moeflux must equal bit for bit).
- vocab_gpt2.gguf, vocab_qwen2.gguf: vocabulary-only files built from
  tests/fixtures/qwen3_moe/tokenizer.json the way llama.cpp's
  convert_hf_to_gguf.py writes a GPT-2-style BPE vocabulary (tokens, token
  types, merges, special ids, chat template), with `tokenizer.ggml.pre`
  `gpt-2` and `qwen2`; tokenizer_qwen2.json is the original with Qwen2's
  pre-tokenizer (the split regex, then byte-level), the reference for the
  second.
"""

import json
import lzma
import os
import sys

import numpy as np
import gguf
from gguf import GGMLQuantizationType as Q
from gguf import quants

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "tests", "fixtures", "gguf")
COLS = 2048
rng = np.random.default_rng(46)

QUANTIZED = [Q.Q8_0, Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.MXFP4]
RANDOM = [Q.Q2_K, Q.Q3_K, Q.Q4_K, Q.Q5_K, Q.Q6_K, Q.IQ4_NL, Q.IQ4_XS]
# Byte offsets of each random-block type's f16 scales.
F16_FIELDS = {
    Q.Q2_K: [80, 82],
    Q.Q3_K: [108],
    Q.Q4_K: [0, 2],
    Q.Q5_K: [0, 2],
    Q.Q6_K: [208],
    Q.IQ4_NL: [0],
    Q.IQ4_XS: [0],
}


def weights(rows):
    """Normal values whose scale changes from one 32-block to the next."""
    x = rng.standard_normal((rows, COLS)).astype(np.float32)
    scale = np.exp(rng.uniform(-4, 1, size=(rows, COLS // 32, 1))).astype(np.float32)
    return (x.reshape(rows, COLS // 32, 32) * scale).reshape(rows, COLS)


def f16_scales(n):
    v = rng.uniform(-1, 1, n) * 10.0 ** rng.uniform(-4, -1, n)
    v[0] = 0.0
    v[1] = -v[1]
    v[2] = 3e-6  # subnormal in f16
    return v.astype(np.float16).view(np.uint8).reshape(n, 2)


def random_blocks(qtype, rows):
    bs, ts = gguf.GGML_QUANT_SIZES[qtype]
    nb = rows * COLS // bs
    b = rng.integers(0, 256, size=(nb, ts), dtype=np.uint8)
    for off in F16_FIELDS[qtype]:
        b[:, off : off + 2] = f16_scales(nb)
    return b.reshape(rows, -1)


def mxfp4_random(rows):
    bs, ts = gguf.GGML_QUANT_SIZES[Q.MXFP4]
    nb = rows * COLS // bs
    b = rng.integers(0, 256, size=(nb, ts), dtype=np.uint8)
    b[:, 0] = rng.integers(110, 130, size=nb)
    b[:4, 0] = [0, 1, 2, 127]  # subnormal halves, the smallest normal, 1
    return b.reshape(rows, -1)


def blocks():
    tensors = {}
    x = weights(1)
    tensors["F32"] = (x, Q.F32)
    f16 = x.astype(np.float16)
    f16.reshape(-1)[:4] = [6e-8, -6e-8, 65504, 0]  # subnormals and the largest
    tensors["F16"] = (f16, Q.F16)
    tensors["BF16"] = (quants.quantize(x, Q.BF16), Q.BF16)
    for t in QUANTIZED:
        tensors[t.name] = (quants.quantize(weights(2), t), t)
    tensors["MXFP4_random"] = (mxfp4_random(2), Q.MXFP4)
    for t in RANDOM:
        tensors[t.name] = (random_blocks(t, 2), t)

    w = gguf.GGUFWriter(os.path.join(OUT, "blocks.gguf"), "blocks")
    ref = gguf.GGUFWriter(os.path.join(OUT, "blocks_ref.gguf"), "blocks")
    for name, (data, t) in tensors.items():
        if t in (Q.F32, Q.F16):
            w.add_tensor(name, data)
        else:
            w.add_tensor(name, data, raw_dtype=t)
        raw = data.view(np.uint8) if t not in (Q.F32, Q.F16) else data
        deq = quants.dequantize(raw, t).astype(np.float32, copy=False)
        assert deq.shape[-1] == COLS, (name, deq.shape)
        ref.add_tensor(name, np.ascontiguousarray(deq))
    for writer in (w, ref):
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
    path = os.path.join(OUT, "blocks_ref.gguf")
    with open(path, "rb") as f:
        data = f.read()
    with open(path + ".xz", "wb") as f:
        f.write(lzma.compress(data, preset=9 | lzma.PRESET_EXTREME))
    os.remove(path)


QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

CHATML = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def add_vocab(w, pre):
    """tests/fixtures/qwen3_moe's tokenizer into writer `w` as llama.cpp's
    convert_hf_to_gguf.py writes a GPT-2-style BPE vocabulary (tokens,
    token types, merges, special ids, chat template), with
    `tokenizer.ggml.pre` `pre`; returns the original tokenizer.json."""
    src = os.path.join(ROOT, "tests", "fixtures", "qwen3_moe")
    tok = json.load(open(os.path.join(src, "tokenizer.json")))
    cfg = json.load(open(os.path.join(src, "config.json")))
    gen = json.load(open(os.path.join(src, "generation_config.json")))
    n = cfg["vocab_size"]
    by_id = {i: t for t, i in tok["model"]["vocab"].items()}
    added = {a["id"]: a for a in tok["added_tokens"]}
    tokens, types = [], []
    for i in range(n):
        if i in added:
            tokens.append(added[i]["content"])
            looks_special = tokens[-1].startswith("<|") and tokens[-1].endswith("|>")
            special = added[i]["special"] or looks_special
            types.append(gguf.TokenType.CONTROL if special else gguf.TokenType.USER_DEFINED)
        elif i in by_id:
            tokens.append(by_id[i])
            types.append(gguf.TokenType.NORMAL)
        else:
            tokens.append(f"[PAD{i}]")
            types.append(gguf.TokenType.UNUSED)
    merges = [m if isinstance(m, str) else " ".join(m) for m in tok["model"]["merges"]]
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(pre)
    w.add_token_list(tokens)
    w.add_token_types([int(t) for t in types])
    w.add_token_merges(merges)
    w.add_eos_token_id(gen["eos_token_id"])
    w.add_pad_token_id(gen["pad_token_id"])
    w.add_bos_token_id(cfg["bos_token_id"])
    w.add_add_bos_token(False)
    w.add_chat_template(CHATML)
    return tok


def vocab(pre, name):
    w = gguf.GGUFWriter(os.path.join(OUT, name), "qwen3moe")
    tok = add_vocab(w, pre)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()

    if pre == "qwen2":
        ref = dict(tok)
        ref["pre_tokenizer"] = {
            "type": "Sequence",
            "pretokenizers": [
                {"type": "Split", "pattern": {"Regex": QWEN2_SPLIT}, "behavior": "Isolated", "invert": False},
                {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False},
            ],
        }
        with open(os.path.join(OUT, "tokenizer_qwen2.json"), "w") as f:
            json.dump(ref, f, ensure_ascii=False)


def main():
    os.makedirs(OUT, exist_ok=True)
    blocks()
    vocab("gpt-2", "vocab_gpt2.gguf")
    vocab("qwen2", "vocab_qwen2.gguf")
    for f in sorted(os.listdir(OUT)):
        print(f"{f}: {os.path.getsize(os.path.join(OUT, f))} bytes", file=sys.stderr)


if __name__ == "__main__":
    main()
