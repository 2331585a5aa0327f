#!/usr/bin/env python3
"""Time `moeflux serve` as one streaming client sees it (issue 9's rows).

    tools/serve_bench.py [BASE] [--prompt-tokens 512] [--max-tokens 128]
                         [--runs 3] [--history 4000]

1. Decode and time to first token: `/v1/completions`, streamed, with a
   prompt of exactly --prompt-tokens token ids (different in every run, so
   nothing is reused from the slot), --max-tokens generated at
   temperature 0. TTFT is from sending the request to the first token's
   event; decode tok/s is (tokens − 1) over the time from the first token
   to the last.
2. A second turn: `/v1/chat/completions` with a user message of about
   --history tokens and a short answer, then the same history with that
   answer and a short new question. The second turn's TTFT and its
   `cached_tokens` show whether only the new tokens were evaluated.

With --clients N (N > 1), instead: --runs rounds of N streamed
completions sent at once (issue 13's rows for `serve --parallel N`), each
with its own prompt of --prompt-tokens ids; per stream its decode tok/s
as above, and the aggregate: all the tokens generated over the time from
the first request to the last token.

Only the standard library; prints one JSON object (and a readable
summary on stderr).
"""

import argparse
import json
import random
import statistics
import sys
import time
import urllib.request


def post_stream(base, path, body):
    """(seconds to first token, seconds to last, token events, usage)."""
    req = urllib.request.Request(
        base + path,
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    t0 = time.perf_counter()
    first = last = None
    n = 0
    usage = None
    with urllib.request.urlopen(req, timeout=600) as r:
        for raw in r:
            line = raw.decode().strip()
            if not line.startswith("data: "):
                continue
            data = line[6:]
            if data == "[DONE]":
                break
            ev = json.loads(data)
            if ev.get("usage"):
                usage = ev["usage"]
            for c in ev.get("choices", []):
                d = c.get("delta", {})
                piece = c.get("text") or (d.get("content") or "") + (d.get("reasoning_content") or "")
                if not piece and not d.get("tool_calls"):
                    continue
                now = time.perf_counter()
                if first is None:
                    first = now
                last = now
                n += 1
    if first is None:
        raise SystemExit(f"{path}: no token came back")
    return first - t0, last - t0, n, usage


def post(base, path, body):
    req = urllib.request.Request(
        base + path,
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=600) as r:
        return json.loads(r.read())


def words(rng, n):
    vocab = ("the of and to in a is that for it as was with be by on not he this are or his from at which "
             "but have an they you were her she there been one all we their has would when if so no what "
             "river mountain city light evening morning garden letter window story music winter summer").split()
    return " ".join(rng.choice(vocab) for _ in range(n))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("base", nargs="?", default="http://127.0.0.1:8080")
    ap.add_argument("--prompt-tokens", type=int, default=512)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--history", type=int, default=4000)
    ap.add_argument("--clients", type=int, default=1)
    a = ap.parse_args()
    rng = random.Random(0)
    with urllib.request.urlopen(a.base + "/v1/models", timeout=60) as r:
        model = json.loads(r.read())["data"][0]["id"]

    # Token ids for prompts: those of ordinary words (any id would do for
    # timing; words keep the text printable).
    ids = post(a.base, "/tokenize", {"content": words(rng, 4 * a.prompt_tokens)})["tokens"]
    if len(ids) < a.prompt_tokens + a.runs + 1:
        raise SystemExit("the tokenizer gave too few tokens for the prompt")

    if a.clients > 1:
        return concurrent(a, model, ids)

    runs = []
    for i in range(a.runs + 1):  # the first is a warm-up
        prompt = ids[i : i + a.prompt_tokens]
        body = {"model": model, "prompt": prompt, "max_tokens": a.max_tokens, "temperature": 0,
                "stream": True, "stream_options": {"include_usage": True}}
        ttft, total, n, usage = post_stream(a.base, "/v1/completions", body)
        row = {"ttft_s": ttft, "tokens": n, "decode_tok_s": (n - 1) / (total - ttft) if n > 1 else None,
               "usage": usage}
        if i > 0:
            runs.append(row)
        print(f"completion run {i}{' (warm-up)' if i == 0 else ''}: TTFT {ttft * 1e3:.1f} ms, "
              f"{n} tokens, decode {row['decode_tok_s'] or 0:.2f} tok/s", file=sys.stderr)

    # Two turns of a chat with a long history.
    history = words(rng, int(a.history * 0.9))
    n_hist = len(post(a.base, "/tokenize", {"content": history})["tokens"])
    msgs = [{"role": "user", "content": history}]
    body = {"model": model, "messages": msgs, "max_tokens": 16, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}}
    t1, _, _, u1 = post_stream(a.base, "/v1/chat/completions", body)
    answer = post(a.base, "/v1/chat/completions", {**body, "stream": False})
    msgs = msgs + [
        {"role": "assistant", "content": answer["choices"][0]["message"].get("content") or ""},
        {"role": "user", "content": "And what came of it in the end?"},
    ]
    t2, _, _, u2 = post_stream(a.base, "/v1/chat/completions", {**body, "messages": msgs})
    print(f"chat turn 1: {n_hist} history tokens, TTFT {t1 * 1e3:.1f} ms; turn 2: TTFT {t2 * 1e3:.1f} ms, "
          f"{u2['prompt_tokens']} prompt tokens of which {u2['prompt_tokens_details']['cached_tokens']} cached",
          file=sys.stderr)

    ttfts = [r["ttft_s"] for r in runs]
    decs = [r["decode_tok_s"] for r in runs if r["decode_tok_s"]]
    out = {
        "model": model,
        "prompt_tokens": a.prompt_tokens,
        "max_tokens": a.max_tokens,
        "ttft_ms_mean": 1e3 * statistics.mean(ttfts),
        "ttft_ms_sd": 1e3 * statistics.stdev(ttfts) if len(ttfts) > 1 else 0.0,
        "decode_tok_s_mean": statistics.mean(decs),
        "decode_tok_s_sd": statistics.stdev(decs) if len(decs) > 1 else 0.0,
        "runs": runs,
        "chat": {"history_tokens": n_hist, "turn1_ttft_ms": 1e3 * t1, "turn1_usage": u1,
                 "turn2_ttft_ms": 1e3 * t2, "turn2_usage": u2},
    }
    print(json.dumps(out))


def concurrent(a, model, ids):
    """--clients N streams at once, --runs times (after one warm-up)."""
    import threading

    rounds = []
    for i in range(a.runs + 1):
        res = [None] * a.clients

        def one(c):
            prompt = ids[i * a.clients + c : i * a.clients + c + a.prompt_tokens]
            body = {"model": model, "prompt": prompt, "max_tokens": a.max_tokens, "temperature": 0,
                    "stream": True}
            res[c] = post_stream(a.base, "/v1/completions", body)

        t0 = time.perf_counter()
        threads = [threading.Thread(target=one, args=(c,)) for c in range(a.clients)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        wall = time.perf_counter() - t0
        if any(r is None for r in res):
            raise SystemExit("a client failed")
        tokens = sum(r[2] for r in res)
        per = [(r[2] - 1) / (r[1] - r[0]) for r in res if r[2] > 1]
        row = {"wall_s": wall, "tokens": tokens, "aggregate_tok_s": tokens / wall,
               "per_stream_decode_tok_s": per, "ttft_ms": [1e3 * r[0] for r in res]}
        if i > 0:
            rounds.append(row)
        print(f"round {i}{' (warm-up)' if i == 0 else ''}: {a.clients} streams, {tokens} tokens in {wall:.2f} s: "
              f"{tokens / wall:.1f} tok/s aggregate, {statistics.mean(per):.2f} tok/s per stream", file=sys.stderr)
    agg = [r["aggregate_tok_s"] for r in rounds]
    per = [statistics.mean(r["per_stream_decode_tok_s"]) for r in rounds]
    print(json.dumps({"model": model, "clients": a.clients, "prompt_tokens": a.prompt_tokens,
                      "max_tokens": a.max_tokens, "aggregate_tok_s_mean": statistics.mean(agg),
                      "aggregate_tok_s_sd": statistics.stdev(agg) if len(agg) > 1 else 0.0,
                      "per_stream_tok_s_mean": statistics.mean(per), "rounds": rounds}))


if __name__ == "__main__":
    main()
