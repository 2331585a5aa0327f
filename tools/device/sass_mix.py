"""The instruction mix of one kernel launch from Nsight Compute's source
page (`ncu --section SourceCounters --page source --print-source sass
--csv`, as `tools/device/run.sh profile-sass` writes it): warp
instructions executed by opcode (share of the launch and of the warp
stall samples), then the loop bodies, the runs of instructions executed
the same number of times, most executed first.
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
    ie, src, st = head.index("Instructions Executed"), head.index("Source"), head.index("Warp Stall Sampling (All Samples)")
    out = []
    for r in table[1:]:
        if len(r) <= max(ie, src, st) or r[0] in ("Kernel Name", "Address"):
            continue
        try:
            n = int(r[ie].replace(",", ""))
        except ValueError:
            continue
        if n:
            out.append((n, r[src].strip(), int(r[st].replace(",", "") or 0)))
    return out


def opcode(text):
    """The opcode of a SASS line, without its predicate and modifiers."""
    words = text.split()
    op = words[1] if words[0].startswith("@") and len(words) > 1 else words[0]
    return op.split(".")[0]


def main(path, top=25):
    insts = rows(path)
    total = sum(n for n, _, _ in insts)
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
    # Runs of the same count: the loop bodies (a body is executed once per
    # pass of every warp, so all its instructions share the count).
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
