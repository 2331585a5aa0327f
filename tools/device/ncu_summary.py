"""Sum Nsight Compute's per-kernel durations (`ncu --csv --metrics
gpu__time_duration.sum`) by kernel name: launches, total and mean µs,
share of the total. Usage: python3 ncu_summary.py ncu.csv"""
import csv
import sys
from collections import defaultdict


def main(path):
    total = defaultdict(float)
    count = defaultdict(int)
    with open(path, newline="") as f:
        lines = [l for l in f if l.startswith('"')]
    for row in csv.DictReader(lines):
        if row.get("Metric Name") != "gpu__time_duration.sum":
            continue
        name = row["Kernel Name"].split("(")[0]
        value = float(row["Metric Value"].replace(",", ""))
        unit = row.get("Metric Unit", "nsecond")
        us = value / 1000.0 if unit.startswith("n") else value if unit.startswith("u") else value * 1000.0
        total[name] += us
        count[name] += 1
    all_us = sum(total.values())
    print(f"| kernel | launches | total µs | mean µs | share |")
    for name, us in sorted(total.items(), key=lambda kv: -kv[1]):
        print(f"| {name} | {count[name]} | {us:.1f} | {us / count[name]:.2f} | {100 * us / all_us:.1f}% |")
    print(f"| all | {sum(count.values())} | {all_us:.1f} | | |")


if __name__ == "__main__":
    main(sys.argv[1])
