"""The instruction mix of one kernel launch from Nsight Compute's source
page (`ncu --section SourceCounters --page source --print-source sass
--csv`, as `tools/device/run.sh profile-sass` writes it): warp
instructions executed by opcode (share of the launch and of the warp
stall samples), then the instructions grouped by how many times each
ran (a loop body's instructions share one count), largest share first.
Usage: python3 sass_mix.py sass.csv [TOP]"""
import csv
import sys
from collections import Counter


def rows(path):
    """(executions, SASS text, stall samples) of each instruction executed."""
    with open(path, newline="") as f:
        lines = f.read().splitlines()
    start = next((i for i, l in enumerate(lines) if l.startswith('"Address"')), None)
    if start is None:
        sys.exit(f"{path}: no source table (a CSV of `ncu --page source --print-source sass`?)")
    table = list(csv.reader(lines[start:]))
    head = table[0]
    want = ["Instructions Executed", "Source", "Warp Stall Sampling (All Samples)"]
    missing = [w for w in want if w not in head]
    if missing:
        sys.exit(f"{path}: no column {missing} among {head}")
    ie, src, st = (head.index(w) for w in want)

    def number(text):
        try:
            return int(float(text.replace(",", "")))
        except ValueError:
            return 0

    out = []
    for r in table[1:]:
        if len(r) <= max(ie, src, st) or r[0] in ("Kernel Name", "Address") or not r[src].strip():
            continue
        n = number(r[ie])
        if n:
            out.append((n, r[src].strip(), number(r[st])))
    return out


def opcode(text):
    """The opcode of a SASS line, without its predicate and modifiers."""
    words = text.split()
    op = words[1] if words[0].startswith("@") and len(words) > 1 else words[0]
    return op.split(".")[0]


def main(path, top=25):
    insts = rows(path)
    total = sum(n for n, _, _ in insts) or 1
    stalls = sum(s for _, _, s in insts) or 1
    by_op, stall_op = Counter(), Counter()
    for n, text, s in insts:
        by_op[opcode(text)] += n
        stall_op[opcode(text)] += s
    print(f"{total:,} warp instructions, {stalls:,} stall samples\n")
    print("| opcode | executed | share | stall samples |")
    print("|---|---|---|---|")
    for op, n in by_op.most_common(top):
        print(f"| {op} | {n:,} | {100 * n / total:.1f}% | {100 * stall_op[op] / stalls:.1f}% |")
    # Instructions by how many times they ran: a loop body's share one
    # count (one execution a pass of every warp); other code may share it.
    runs = Counter(n for n, _, _ in insts)
    print("\n| times executed | instructions | share of the launch | top opcodes |")
    print("|---|---|---|---|")
    for n, k in sorted(runs.items(), key=lambda kv: -kv[0] * kv[1])[:5]:
        ops = Counter(opcode(t) for c, t, _ in insts if c == n)
        top_ops = ", ".join(f"{o} {c}" for o, c in ops.most_common(6))
        print(f"| {n:,} | {k} | {100 * n * k / total:.1f}% | {top_ops} |")


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 25)
