#!/usr/bin/env python3
"""Train the demo model: a tiny qwen3_moe that writes King James English.

    tools/demo/corpus.sh                       # tools/demo/.data/kjv.txt
    python3 tools/demo/train.py --out tests/fixtures/demo_kjv

Everything the model is made of comes from this file and the corpus:

1. A byte-level BPE tokenizer of 4096 entries trained on the corpus with the
   `tokenizers` library (the last four ids are special tokens).
2. A Qwen3-MoE of 4 layers (hidden 256, 16 experts of width 128, top-4,
   router renormalized, embeddings tied), built by `transformers` from its
   config and trained from a seeded initialization on two streams: the plain
   text (one verse per line) and chat turns made of the same verses (the user
   says a verse, the assistant answers with the next one), in the ChatML
   template that ships with the model.
3. The checkpoint saved by `save_pretrained` in bf16 (about 17 MB), with the
   tokenizer, `chat_template.jinja` and `generation_config.json`.
4. `reference.json`: the logits transformers computes in f32 (eager, on the
   CPU) on the saved bf16 weights, for a 12-token golden sequence, and the
   8-token greedy continuation of its first 5 tokens; the same format as the
   random fixtures of tests/fixtures.

Seeded (torch, python, the data order), so a rerun on the same GPU, torch and
transformers gives the same model up to the non-determinism of GPU kernels.
Runs in a few minutes on one H100; `--device cpu` works but takes hours.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
import time
from pathlib import Path

import numpy as np
import torch

SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|pad|>"]
VOCAB = 4096
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
# Candidate golden sequences; the first whose every top-1/top-2 logit gap is
# decisive is used, so that the argmax comparison of the golden test is robust.
GOLDEN_TEXTS = [
    "And God said, Let there be light: and there was light. And God saw the light",
    "And it came to pass, when the king heard these words, that he rent his clothes",
    "The LORD is my shepherd; I shall not want. He maketh me to lie down",
    "Blessed are the meek: for they shall inherit the earth. Blessed are they",
]
GOLDEN_LEN = 12
GREEDY_PROMPT_LEN = 5
GREEDY_NEW_TOKENS = 8


def log(msg: str) -> None:
    print(msg, flush=True)


def train_tokenizer(lines: list[str]):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB - len(SPECIAL),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(lines, trainer)
    assert tok.get_vocab_size() == VOCAB - len(SPECIAL), tok.get_vocab_size()
    tok.add_special_tokens(SPECIAL)
    assert tok.get_vocab_size() == VOCAB
    return tok


def tokenizer_config() -> dict:
    n = VOCAB - len(SPECIAL)
    added = {
        str(n + i): {
            "content": s,
            "lstrip": False,
            "normalized": False,
            "rstrip": False,
            "single_word": False,
            "special": True,
        }
        for i, s in enumerate(SPECIAL)
    }
    return {
        "add_bos_token": False,
        "add_prefix_space": False,
        "added_tokens_decoder": added,
        "bos_token": None,
        "clean_up_tokenization_spaces": False,
        "eos_token": "<|im_end|>",
        "errors": "replace",
        "model_max_length": 1024,
        "pad_token": "<|pad|>",
        "split_special_tokens": False,
        "tokenizer_class": "PreTrainedTokenizerFast",
        "unk_token": None,
    }


def model_config(tok) -> "transformers.Qwen3MoeConfig":  # noqa: F821
    from transformers import Qwen3MoeConfig

    return Qwen3MoeConfig(
        vocab_size=VOCAB,
        hidden_size=256,
        intermediate_size=512,
        moe_intermediate_size=128,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=64,
        num_experts=16,
        num_experts_per_tok=4,
        norm_topk_prob=True,
        decoder_sparse_step=1,
        mlp_only_layers=[],
        max_position_embeddings=1024,
        rope_theta=10000.0,
        rms_norm_eps=1e-6,
        tie_word_embeddings=True,
        router_aux_loss_coef=0.01,
        output_router_logits=True,
        bos_token_id=tok.token_to_id("<|endoftext|>"),
        eos_token_id=tok.token_to_id("<|im_end|>"),
        pad_token_id=tok.token_to_id("<|pad|>"),
    )


def chat_text(user: str, assistant: str) -> str:
    return f"<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n{assistant}<|im_end|>\n"


def streams(tok, lines: list[str], rng: random.Random):
    """The plain-text stream (verses, one per line) and the chat stream
    (conversations in a seeded random order), as int32 token arrays."""
    text_ids = tok.encode("\n".join(lines) + "\n").ids
    order = list(range(len(lines) - 1))
    rng.shuffle(order)
    convs = [chat_text(lines[i], lines[i + 1]) for i in order]
    chat_ids: list[int] = []
    for enc in tok.encode_batch(convs):
        chat_ids.extend(enc.ids)
    return np.array(text_ids, dtype=np.int64), np.array(chat_ids, dtype=np.int64)


def batch(stream: np.ndarray, n: int, seq: int, g: np.random.Generator) -> torch.Tensor:
    starts = g.integers(0, len(stream) - seq - 1, size=n)
    return torch.from_numpy(np.stack([stream[s : s + seq] for s in starts]))


def lr_at(step: int, steps: int, peak: float, warmup: int) -> float:
    if step < warmup:
        return peak * (step + 1) / warmup
    t = (step - warmup) / max(1, steps - warmup)
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * t)))


@torch.no_grad()
def eval_loss(model, stream: np.ndarray, seq: int, dev: str) -> float:
    g = np.random.default_rng(7)
    x = batch(stream, 32, seq, g).to(dev)
    with torch.autocast(device_type="cuda", dtype=torch.bfloat16, enabled=dev == "cuda"):
        return float(model(input_ids=x, labels=x).loss)


def train(args, tok, lines: list[str]):
    from transformers import Qwen3MoeForCausalLM

    rng = random.Random(args.seed)
    torch.manual_seed(args.seed)
    dev = args.device
    n_val = len(lines) // 50
    val_lines, train_lines = lines[:n_val], lines[n_val:]
    text, chat = streams(tok, train_lines, rng)
    val_text, _ = streams(tok, val_lines, rng)
    log(f"tokens: text {len(text):,}, chat {len(chat):,}, held-out text {len(val_text):,}")

    cfg = model_config(tok)
    model = Qwen3MoeForCausalLM(cfg).to(dev)
    n_params = sum(p.numel() for p in model.parameters())
    log(f"parameters: {n_params:,}")
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
        lr=args.lr,
        betas=(0.9, 0.95),
        fused=dev == "cuda",
    )
    g = np.random.default_rng(args.seed)
    n_chat = int(args.batch * args.chat_fraction)
    t0 = time.time()
    model.train()
    for step in range(args.steps):
        for group in opt.param_groups:
            group["lr"] = lr_at(step, args.steps, args.lr, args.warmup)
        x = torch.cat([batch(text, args.batch - n_chat, args.seq, g), batch(chat, n_chat, args.seq, g)]).to(dev)
        with torch.autocast(device_type="cuda", dtype=torch.bfloat16, enabled=dev == "cuda"):
            out = model(input_ids=x, labels=x)
        opt.zero_grad(set_to_none=True)
        out.loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step % 250 == 0 or step == args.steps - 1:
            model.eval()
            vl = eval_loss(model, val_text, args.seq, dev)
            model.train()
            aux = float(out.aux_loss.detach()) if getattr(out, "aux_loss", None) is not None else float("nan")
            log(f"step {step:5d}  loss {float(out.loss):.3f}  aux {aux:.3f}  held-out {vl:.3f}  "
                f"{time.time() - t0:6.1f} s")
        if time.time() - t0 > args.max_seconds:
            log(f"stopping at step {step}: --max-seconds {args.max_seconds} reached")
            break
    model.eval()
    model.config.output_router_logits = False
    return model


def save(model, tok, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    model.to(torch.bfloat16).save_pretrained(str(out), safe_serialization=True)
    tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps(tokenizer_config(), indent=2) + "\n")
    (out / "chat_template.jinja").write_text(CHAT_TEMPLATE)
    gen = {
        "bos_token_id": tok.token_to_id("<|endoftext|>"),
        "eos_token_id": [tok.token_to_id("<|im_end|>"), tok.token_to_id("<|endoftext|>")],
        "pad_token_id": tok.token_to_id("<|pad|>"),
        "do_sample": True,
        "temperature": 0.7,
        "top_k": 40,
        "top_p": 0.9,
        "repetition_penalty": 1.1,
        "max_new_tokens": 128,
    }
    (out / "generation_config.json").write_text(json.dumps(gen, indent=2) + "\n")


def fmt(x: float) -> str:
    # Shortest decimal that round-trips to the same f32 value.
    return np.format_float_positional(np.float32(x), unique=True, trim="0") if abs(x) >= 1e-4 or x == 0 \
        else np.format_float_scientific(np.float32(x), unique=True, trim="0")


@torch.no_grad()
def reference(out: Path, tok) -> None:
    """reference.json from the saved files, in f32 on the CPU."""
    import transformers
    from transformers import AutoModelForCausalLM, GenerationConfig

    ref = AutoModelForCausalLM.from_pretrained(
        str(out), dtype=torch.float32, attn_implementation="eager", experts_implementation="eager"
    ).eval()
    chosen = None
    for text in GOLDEN_TEXTS:
        ids = tok.encode(text).ids[:GOLDEN_LEN]
        assert len(ids) == GOLDEN_LEN, (text, ids)
        logits = ref(input_ids=torch.tensor([ids]), use_cache=False).logits[0].float()
        top2 = torch.topk(logits, 2, dim=-1).values
        gap = float((top2[:, 0] - top2[:, 1]).min())
        log(f"golden candidate {text[:40]!r}: min top-2 gap {gap:.4f}")
        if gap >= 0.05:
            chosen = (ids, logits)
            break
    if chosen is None:
        sys.exit("no golden candidate has decisive logits at every position")
    ids, logits = chosen
    prompt = ids[:GREEDY_PROMPT_LEN]
    ref.generation_config.eos_token_id = None
    gc = GenerationConfig(max_new_tokens=GREEDY_NEW_TOKENS, do_sample=False, eos_token_id=None,
                          pad_token_id=tok.token_to_id("<|pad|>"))
    new = ref.generate(torch.tensor([prompt]), generation_config=gc)[0, len(prompt):].tolist()
    note = (f"transformers {transformers.__version__}, torch {torch.__version__}, "
            "f32 eager on the saved bf16 weights (upcast), CPU")
    rows = ["[" + ",".join(fmt(float(v)) for v in row) + "]" for row in logits.numpy().astype(np.float32)]
    body = (
        "{\n"
        f'  "arch": "qwen3_moe",\n'
        f'  "reference": {json.dumps(note)},\n'
        f'  "tokens": {json.dumps(ids)},\n'
        f'  "greedy": {json.dumps({"prompt": prompt, "tokens": new})},\n'
        '  "logits": [\n    ' + ",\n    ".join(rows) + "\n  ]\n}\n"
    )
    (out / "reference.json").write_text(body)
    log(f"reference: golden {tok.decode(ids)!r}; greedy continuation {tok.decode(new)!r}")


@torch.no_grad()
def samples(model, tok, dev: str) -> None:
    torch.manual_seed(1)
    model = model.float()
    for prompt in ["And it came to pass", chat_text("Who made the heaven and the earth?", "")[:-len("<|im_end|>\n")]]:
        x = torch.tensor([tok.encode(prompt).ids], device=dev)
        y = model.generate(x, max_new_tokens=60, do_sample=True, temperature=0.7, top_k=40, top_p=0.9,
                           repetition_penalty=1.1, pad_token_id=tok.token_to_id("<|pad|>"),
                           eos_token_id=tok.token_to_id("<|im_end|>"))
        log(f"sample: {tok.decode(y[0].tolist(), skip_special_tokens=False)!r}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--corpus", type=Path, default=Path(__file__).resolve().parent / ".data" / "kjv.txt")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--steps", type=int, default=3000)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--seq", type=int, default=256)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--warmup", type=int, default=200)
    p.add_argument("--chat-fraction", type=float, default=0.25)
    p.add_argument("--seed", type=int, default=1611)
    p.add_argument("--max-seconds", type=float, default=1e9, help="stop early (and say so) after this long")
    p.add_argument("--no-reference", action="store_true", help="do not write reference.json after training")
    p.add_argument("--reference-only", action="store_true",
                   help="only (re)write OUT/reference.json from the checkpoint in OUT")
    args = p.parse_args()

    if args.reference_only:
        from tokenizers import Tokenizer

        reference(args.out, Tokenizer.from_file(str(args.out / "tokenizer.json")))
        return

    random.seed(args.seed)
    lines = [ln.strip() for ln in args.corpus.read_text().splitlines() if ln.strip()]
    log(f"corpus: {len(lines):,} lines from {args.corpus}")
    tok = train_tokenizer(lines)
    model = train(args, tok, lines)
    save(model, tok, args.out)
    samples(model, tok, args.device)
    if not args.no_reference:
        reference(args.out, tok)
    size = sum(f.stat().st_size for f in args.out.iterdir())
    log(f"wrote {args.out} ({size / 1e6:.1f} MB)")


if __name__ == "__main__":
    main()
