#!/usr/bin/env python3
"""Soak a running `moeflux serve` (not run in CI).

    tools/soak.py [BASE_URL] [--minutes M] [--clients N]

N clients (default 4) loop for M minutes (default 10) over a mix of
requests: chat whole and streamed, text completions, structured output
(json_schema), a forced tool call, streams dropped half-way, and a bad
request. Every reply is checked for its shape; at the end it prints
requests per kind, failures, the latency spread, and the server's
/metrics, and exits 1 on any failure. Standard library only.
"""

import argparse
import json
import random
import statistics
import sys
import threading
import time
import urllib.error
import urllib.request

SCHEMA = {
    "type": "object",
    "properties": {"book": {"type": "string", "enum": ["Genesis", "Exodus"]}, "chapter": {"type": "integer"}},
    "required": ["book", "chapter"],
    "additionalProperties": False,
}
TOOL = {
    "type": "function",
    "function": {
        "name": "amen",
        "parameters": {"type": "object", "properties": {"n": {"type": "integer", "minimum": 1, "maximum": 9}},
                       "required": ["n"], "additionalProperties": False},
    },
}


def post(base, path, body, stream=False, timeout=120):
    req = urllib.request.Request(base + path, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    return urllib.request.urlopen(req, timeout=timeout)


def chat(base, rnd):
    body = {"messages": [{"role": "user", "content": "Tell me of Moses"}], "max_tokens": rnd.randint(1, 48),
            "seed": rnd.randint(0, 2**31)}
    r = json.load(post(base, "/v1/chat/completions", body))
    assert r["choices"][0]["finish_reason"] in ("stop", "length"), r


def stream(base, rnd, drop=False):
    body = {"messages": [{"role": "user", "content": "Sing"}], "max_tokens": 48, "stream": True}
    with post(base, "/v1/chat/completions", body) as r:
        n = 0
        for line in r:
            if not line.startswith(b"data: "):
                continue
            n += 1
            if drop and n > 3:
                return
            if line.strip() == b"data: [DONE]":
                return
        raise AssertionError("the stream ended without [DONE]")


def completion(base, rnd):
    r = json.load(post(base, "/v1/completions", {"prompt": "In the beginning", "max_tokens": rnd.randint(1, 32)}))
    assert isinstance(r["choices"][0]["text"], str), r


def structured(base, rnd):
    fmt = {"type": "json_schema", "json_schema": {"name": "v", "schema": SCHEMA}}
    body = {"messages": [{"role": "user", "content": "Where?"}], "max_tokens": 64, "response_format": fmt}
    r = json.load(post(base, "/v1/chat/completions", body))
    v = json.loads(r["choices"][0]["message"]["content"])
    assert v["book"] in ("Genesis", "Exodus") and isinstance(v["chapter"], int), v


def tool(base, rnd):
    body = {"messages": [{"role": "user", "content": "Pray"}], "max_tokens": 64, "tools": [TOOL],
            "tool_choice": "required", "parallel_tool_calls": False}
    r = json.load(post(base, "/v1/chat/completions", body))
    calls = r["choices"][0]["message"]["tool_calls"]
    assert calls and 1 <= json.loads(calls[0]["function"]["arguments"])["n"] <= 9, r


def bad(base, rnd):
    try:
        post(base, "/v1/chat/completions", {"messages": [], "temperature": -1})
    except urllib.error.HTTPError as e:
        assert e.code == 400, e.code
        return
    raise AssertionError("a bad request was accepted")


KINDS = {
    "chat": chat,
    "stream": stream,
    "dropped_stream": lambda b, r: stream(b, r, drop=True),
    "completion": completion,
    "structured": structured,
    "tool": tool,
    "bad": bad,
}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("base", nargs="?", default="http://127.0.0.1:8080")
    ap.add_argument("--minutes", type=float, default=10)
    ap.add_argument("--clients", type=int, default=4)
    a = ap.parse_args()
    base = a.base.rstrip("/").removesuffix("/v1")
    end = time.time() + a.minutes * 60
    lock = threading.Lock()
    counts = {k: 0 for k in KINDS}
    failures = []
    latency = []

    def client(i):
        rnd = random.Random(i)
        while time.time() < end:
            kind = rnd.choice(list(KINDS))
            t = time.time()
            try:
                KINDS[kind](base, rnd)
                with lock:
                    counts[kind] += 1
                    latency.append(time.time() - t)
            except Exception as e:  # noqa: BLE001 - every failure is reported
                with lock:
                    failures.append(f"{kind}: {e!r}")

    threads = [threading.Thread(target=client, args=(i,)) for i in range(a.clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    print(json.dumps(counts))
    if latency:
        q = statistics.quantiles(latency, n=100) if len(latency) > 1 else [latency[0]] * 99
        print(f"latency s: median {statistics.median(latency):.3f} p99 {q[98]:.3f} max {max(latency):.3f}")
    for f in failures[:20]:
        print("FAIL", f)
    with urllib.request.urlopen(base + "/metrics", timeout=10) as r:
        print(r.read().decode())
    print(f"soak: {sum(counts.values())} passed, {len(failures)} failed")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
