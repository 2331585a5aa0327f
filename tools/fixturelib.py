"""Shared helpers for building the moeflux golden test fixtures.

Everything here is deterministic: a fixture is a function of its seed, the
pinned package versions (tools/requirements.txt) and this code.

Conventions used throughout:
  * "checkpoint tensors" are a dict name -> torch.Tensor exactly as written
    to (or read from) the safetensors files of a fixture;
  * "module tensors" are the names/layout of the live transformers module
    (transformers 5 keeps MoE experts stacked in memory as
    `mlp.experts.gate_up_proj` [E, 2I, H] and `mlp.experts.down_proj`
    [E, H, I], even for architectures whose checkpoints store one tensor per
    expert).
"""

from __future__ import annotations

import json
import math
import random
import re
import shutil
from pathlib import Path

import numpy as np
import torch
from safetensors import safe_open
from safetensors.torch import save_file

REPO = Path(__file__).resolve().parent.parent
FIXTURES = REPO / "tests" / "fixtures"

VOCAB = 512
# The golden token sequence: identical for every fixture, all ids < VOCAB.
# It deliberately contains a special-token id (506) and the ids 0 and 511.
TOKENS = [3, 101, 57, 402, 260, 19, 333, 0, 488, 150, 511, 506]
GREEDY_PROMPT_LEN = 5
GREEDY_NEW_TOKENS = 8

# Special tokens of the tiny tokenizer, appended after the BPE vocabulary so
# they take the ids VOCAB-7 .. VOCAB-1 (505 .. 511).
SPECIAL_TOKENS = [
    "<|endoftext|>",   # 505  pad / bos
    "<|im_start|>",    # 506
    "<|im_end|>",      # 507  eos
    "<|vision_start|>",  # 508
    "<|vision_end|>",  # 509
    "<|image_pad|>",   # 510
    "<|video_pad|>",   # 511
]
BOS_ID = 505
EOS_ID = 507


def versions_string() -> str:
    import transformers

    return f"transformers {transformers.__version__}, torch {torch.__version__}"


# --------------------------------------------------------------------------
# Tokenizer
# --------------------------------------------------------------------------

_WORDS = (
    "expert experts router routing gate gated delta rule linear attention key value query "
    "head heads norm layer layers hidden state token tokens vocabulary logits softmax sigmoid "
    "mixture model quantize quantized group scale bias packed weight weights rotary position "
    "embedding latent compress shared dense sparse cache checkpoint stream memory disk flash "
    "the a of to in and is that for on with as it be are this by from at or an which "
    "moeflux rust engine metal cpu gpu kernel matrix vector tensor block float bfloat half"
).split()

_ZEN = """Beautiful is better than ugly. Explicit is better than implicit. Simple is
better than complex. Complex is better than complicated. Flat is better than
nested. Sparse is better than dense. Readability counts. Special cases aren't
special enough to break the rules. Although practicality beats purity. Errors
should never pass silently. Unless explicitly silenced. In the face of
ambiguity, refuse the temptation to guess. There should be one-- and preferably
only one --obvious way to do it. Now is better than never. If the
implementation is hard to explain, it's a bad idea."""


def build_tokenizer(out_dir: Path) -> None:
    """Train a tiny byte-level BPE tokenizer with exactly VOCAB entries and
    write tokenizer.json + tokenizer_config.json into out_dir."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    rng = random.Random(1234)
    corpus = [_ZEN] * 4
    for _ in range(3000):
        corpus.append(" ".join(rng.choice(_WORDS) for _ in range(rng.randint(3, 12))) + ".")

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    n_bpe = VOCAB - len(SPECIAL_TOKENS)
    trainer = trainers.BpeTrainer(
        vocab_size=n_bpe,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus, trainer)
    assert tok.get_vocab_size() == n_bpe, tok.get_vocab_size()
    tok.add_special_tokens(SPECIAL_TOKENS)
    assert tok.get_vocab_size() == VOCAB
    for i, s in enumerate(SPECIAL_TOKENS):
        assert tok.token_to_id(s) == n_bpe + i
    out_dir.mkdir(parents=True, exist_ok=True)
    tok.save(str(out_dir / "tokenizer.json"))
    added = {
        str(n_bpe + i): {
            "content": s,
            "lstrip": False,
            "normalized": False,
            "rstrip": False,
            "single_word": False,
            "special": True,
        }
        for i, s in enumerate(SPECIAL_TOKENS)
    }
    cfg = {
        "add_bos_token": False,
        "add_prefix_space": False,
        "added_tokens_decoder": added,
        "bos_token": None,
        "clean_up_tokenization_spaces": False,
        "eos_token": "<|im_end|>",
        "errors": "replace",
        "model_max_length": 4096,
        "pad_token": "<|endoftext|>",
        "split_special_tokens": False,
        "tokenizer_class": "PreTrainedTokenizerFast",
        "unk_token": None,
    }
    write_json(out_dir / "tokenizer_config.json", cfg)


def write_generation_config(out_dir: Path, extra: dict | None = None) -> None:
    cfg = {"bos_token_id": BOS_ID, "eos_token_id": EOS_ID, "pad_token_id": BOS_ID, "do_sample": False}
    if extra:
        cfg.update(extra)
    write_json(out_dir / "generation_config.json", cfg)


def copy_tokenizer(src: Path, dst: Path) -> None:
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(src / name, dst / name)


# --------------------------------------------------------------------------
# JSON / files
# --------------------------------------------------------------------------


def write_json(path: Path, obj, indent: int = 2) -> None:
    with open(path, "w") as f:
        json.dump(obj, f, indent=indent)
        f.write("\n")


def fresh_dir(path: Path) -> Path:
    if path.exists():
        shutil.rmtree(path)
    path.mkdir(parents=True)
    return path


def dir_size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


# --------------------------------------------------------------------------
# safetensors I/O
# --------------------------------------------------------------------------


def read_checkpoint(d: Path) -> dict[str, torch.Tensor]:
    """All tensors of every *.safetensors file of a directory."""
    out = {}
    for fn in sorted(d.glob("*.safetensors")):
        with safe_open(str(fn), "pt") as f:
            for k in f.keys():
                assert k not in out, k
                out[k] = f.get_tensor(k)
    return out


def write_checkpoint(d: Path, tensors: dict[str, torch.Tensor], n_shards: int = 1) -> None:
    """Write tensors the way Hugging Face checkpoints are laid out:
    model.safetensors, or model-0000i-of-0000n.safetensors plus
    model.safetensors.index.json. Metadata {"format": "pt"} like
    transformers' save_pretrained. Tensors are sorted by name."""
    names = sorted(tensors)
    tensors = {k: tensors[k].contiguous() for k in names}
    if n_shards == 1:
        save_file(tensors, str(d / "model.safetensors"), metadata={"format": "pt"})
        return
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    target = total / n_shards
    shards: list[list[str]] = [[]]
    acc = 0
    for k in names:
        sz = tensors[k].numel() * tensors[k].element_size()
        if acc >= target * len(shards) and len(shards) < n_shards:
            shards.append([])
        shards[-1].append(k)
        acc += sz
    assert len(shards) == n_shards, len(shards)
    weight_map = {}
    for i, keys in enumerate(shards):
        fn = f"model-{i + 1:05d}-of-{n_shards:05d}.safetensors"
        save_file({k: tensors[k] for k in keys}, str(d / fn), metadata={"format": "pt"})
        for k in keys:
            weight_map[k] = fn
    write_json(d / "model.safetensors.index.json", {"metadata": {"total_size": total}, "weight_map": weight_map})


# --------------------------------------------------------------------------
# Random initialisation
# --------------------------------------------------------------------------


def init_params(model: torch.nn.Module, seed: int, rules) -> None:
    """Overwrite every parameter/buffer of `model` deterministically.

    rules(name, tensor) returns a callable gen -> tensor (same shape) or
    None to fall back to normal(0, 0.05)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in sorted(list(model.named_parameters()) + list(model.named_buffers())):
            if name.endswith("inv_freq"):
                continue  # rotary buffers are derived from the config
            fn = rules(name, p)
            if fn is None:
                fn = lambda g, s=p.shape: torch.randn(s, generator=g) * 0.05
            v = fn(g)
            assert v.shape == p.shape, (name, v.shape, p.shape)
            p.copy_(v.to(p.dtype))


def randn(shape, std, mean=0.0):
    return lambda g: torch.randn(shape, generator=g) * std + mean


# --------------------------------------------------------------------------
# Expert layouts
# --------------------------------------------------------------------------

_PER_EXPERT = re.compile(r"^(.*\.mlp\.experts)\.(\d+)\.(gate_proj|up_proj|down_proj)\.weight$")


def per_expert_to_module(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """checkpoint layout (one tensor per expert) -> transformers module layout
    (stacked gate_up_proj [E, 2I, H] with gate first, down_proj [E, H, I])."""
    out, groups = {}, {}
    for k, v in tensors.items():
        m = _PER_EXPERT.match(k)
        if m:
            groups.setdefault(m.group(1), {}).setdefault(m.group(3), {})[int(m.group(2))] = v
        else:
            out[k] = v
    for prefix, parts in groups.items():
        n = len(parts["gate_proj"])
        gate = torch.stack([parts["gate_proj"][e] for e in range(n)])
        up = torch.stack([parts["up_proj"][e] for e in range(n)])
        out[prefix + ".gate_up_proj"] = torch.cat([gate, up], dim=1)
        out[prefix + ".down_proj"] = torch.stack([parts["down_proj"][e] for e in range(n)])
    return out


def module_to_per_expert(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Inverse of per_expert_to_module."""
    out = {}
    for k, v in tensors.items():
        if k.endswith(".mlp.experts.gate_up_proj"):
            prefix = k[: -len(".gate_up_proj")]
            inter = v.shape[1] // 2
            for e in range(v.shape[0]):
                out[f"{prefix}.{e}.gate_proj.weight"] = v[e, :inter].clone()
                out[f"{prefix}.{e}.up_proj.weight"] = v[e, inter:].clone()
        elif k.endswith(".mlp.experts.down_proj"):
            prefix = k[: -len(".down_proj")]
            for e in range(v.shape[0]):
                out[f"{prefix}.{e}.down_proj.weight"] = v[e].clone()
        else:
            out[k] = v
    return out


def module_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Parameters and persistent buffers of a module (rotary inv_freq is
    non-persistent and not included)."""
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def load_module_state(model: torch.nn.Module, tensors: dict[str, torch.Tensor]) -> None:
    """Strictly load module-layout tensors (upcast to the parameter dtype) and
    check that every value arrived bit-exactly."""
    sd = model.state_dict()
    want = set(sd)
    have = set(tensors)
    # tied lm_head appears in the state dict although checkpoints omit it
    missing = want - have
    if "lm_head.weight" in missing and getattr(model.config.get_text_config(), "tie_word_embeddings", False):
        missing.discard("lm_head.weight")
    unexpected = have - want
    assert not missing and not unexpected, (sorted(missing)[:10], sorted(unexpected)[:10])
    with torch.no_grad():
        for k, v in tensors.items():
            assert sd[k].shape == v.shape, (k, sd[k].shape, v.shape)
            sd[k].copy_(v.to(sd[k].dtype))
    sd = model.state_dict()
    for k, v in tensors.items():
        assert torch.equal(sd[k], v.to(sd[k].dtype)), k


def assert_model_matches(model: torch.nn.Module, tensors: dict[str, torch.Tensor]) -> None:
    """Every module-layout tensor equals the model's (f32) parameter."""
    sd = model.state_dict()
    for k, v in tensors.items():
        assert k in sd, k
        assert torch.equal(sd[k].float(), v.float()), k


# --------------------------------------------------------------------------
# Reference logits
# --------------------------------------------------------------------------


@torch.no_grad()
def run_reference(model: torch.nn.Module) -> dict:
    """Logits for every position of TOKENS and the greedy continuation of the
    first GREEDY_PROMPT_LEN tokens, in f32 with eager attention."""
    from transformers import GenerationConfig

    model.eval()
    ids = torch.tensor([TOKENS])
    logits = model(input_ids=ids, use_cache=False).logits[0].float()
    prompt = TOKENS[:GREEDY_PROMPT_LEN]
    gc = GenerationConfig(
        max_new_tokens=GREEDY_NEW_TOKENS,
        do_sample=False,
        eos_token_id=None,
        pad_token_id=BOS_ID,
        bos_token_id=BOS_ID,
    )
    # EOS must not stop the 8-token continuation (the model may well pick
    # it): clear the model's own eos default, which generate() merges in.
    model.generation_config.eos_token_id = None
    out = model.generate(torch.tensor([prompt]), generation_config=gc)
    new = out[0, len(prompt):].tolist()
    assert len(new) == GREEDY_NEW_TOKENS, new
    # Cross-check the cached greedy decode against full recomputation, and
    # record how decisive every greedy choice is.
    seq = list(prompt)
    greedy_gaps = []
    for t in new:
        full = model(input_ids=torch.tensor([seq]), use_cache=False).logits[0, -1].float()
        top2 = torch.topk(full, 2).values
        greedy_gaps.append(float(top2[0] - top2[1]))
        assert int(full.argmax()) == t, ("greedy decode disagrees with recomputation", seq, t)
        seq.append(t)
    return {"logits": logits, "greedy": new, "greedy_gaps": greedy_gaps}


def logit_stats(ref: dict) -> dict:
    lg = ref["logits"]
    top2 = torch.topk(lg, 2, dim=-1).values
    gaps = (top2[:, 0] - top2[:, 1]).tolist()
    return {
        "std": float(lg.std()),
        "max_abs": float(lg.abs().max()),
        "distinct_argmax": len(set(lg.argmax(-1).tolist())),
        "min_gap": min(gaps),
        "min_greedy_gap": min(ref["greedy_gaps"]),
    }


class Degenerate(Exception):
    pass


def check_not_degenerate(name: str, ref: dict) -> dict:
    """The fixture must discriminate: the argmax changes along the sequence,
    every top-1/top-2 gap (golden positions and greedy steps) is far above
    the 1e-4 relative tolerance, and the greedy continuation is not a single
    repeated token."""
    s = logit_stats(ref)
    ok = (
        s["distinct_argmax"] >= 5
        and s["min_gap"] >= 0.02 * s["std"]
        and s["min_greedy_gap"] >= 0.02 * s["std"]
        and s["std"] > 0.1
        and len(set(ref["greedy"])) >= 3
    )
    print(f"  [{name}] logits std {s['std']:.3f} max|.| {s['max_abs']:.2f} "
          f"distinct argmax {s['distinct_argmax']}/{len(TOKENS)} min top-2 gap {s['min_gap']:.4f} "
          f"min greedy gap {s['min_greedy_gap']:.4f} -> {'ok' if ok else 'DEGENERATE'}")
    if not ok:
        raise Degenerate(f"{name}: degenerate logits {s}, greedy {ref['greedy']}")
    return s


def _fmt(x: float) -> str:
    # Shortest decimal that round-trips to the same f32 value.
    assert math.isfinite(x)
    return np.format_float_positional(np.float32(x), unique=True, trim="0") if abs(x) >= 1e-4 or x == 0 \
        else np.format_float_scientific(np.float32(x), unique=True, trim="0")


def write_reference(d: Path, arch: str, ref: dict, note: str) -> None:
    lg = ref["logits"].numpy().astype(np.float32)
    rows = ["[" + ",".join(_fmt(float(v)) for v in row) + "]" for row in lg]
    body = (
        "{\n"
        f'  "arch": {json.dumps(arch)},\n'
        f'  "reference": {json.dumps(note)},\n'
        f'  "tokens": {json.dumps(TOKENS)},\n'
        f'  "greedy": {json.dumps({"prompt": TOKENS[:GREEDY_PROMPT_LEN], "tokens": ref["greedy"]})},\n'
        '  "logits": [\n    ' + ",\n    ".join(rows) + "\n  ]\n}\n"
    )
    (d / "reference.json").write_text(body)
    # Round-trip check: the JSON holds the f32 logits exactly.
    back = json.loads((d / "reference.json").read_text())
    arr = np.array(back["logits"], dtype=np.float64).astype(np.float32)
    assert arr.shape == lg.shape and np.array_equal(arr, lg)


def rel_l2(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double(), b.double()
    return float((a - b).norm() / b.norm())
