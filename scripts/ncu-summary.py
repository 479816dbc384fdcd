#!/usr/bin/env python3
"""Per-kernel GPU time from `ncu --print-summary per-kernel --metrics gpu__time_duration.sum`.

Reads the text ncu prints (a file, or standard input) and lists kernels by total time: total
ms, invocations, mean us, name, grid and block, and the sum over all kernels. docs/gpu.md
gives the ncu command that the GPT step's figures came from.

  python3 scripts/ncu-summary.py ncu.txt [--top N]
"""
import argparse
import re
import sys

KERNEL = re.compile(r"^  (\S.*?) \((\d+), (\d+), (\d+)\)x\((\d+), (\d+), (\d+)\), .*Invocations (\d+)")
UNITS_US = {"ns": 1e-3, "us": 1.0, "usecond": 1.0, "ms": 1e3, "msecond": 1e3, "s": 1e6, "second": 1e6}


def parse(lines):
    rows = []
    for i, line in enumerate(lines):
        m = KERNEL.match(line)
        if not m:
            continue
        for follow in lines[i + 1:i + 12]:
            if "gpu__time_duration.sum" in follow:
                parts = follow.split()
                mean_us = float(parts[-1].replace(",", "")) * UNITS_US.get(parts[1], 1.0)
                calls = int(m.group(8))
                rows.append((calls * mean_us, calls, mean_us, m.group(1), m.group(2, 3, 4), m.group(5, 6, 7)))
                break
    return rows


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("file", nargs="?", default="-", help="ncu's output (default: standard input)")
    p.add_argument("--top", type=int, default=40, help="kernels to list")
    a = p.parse_args()
    text = sys.stdin.read() if a.file == "-" else open(a.file, encoding="utf-8", errors="replace").read()
    rows = parse(text.splitlines())
    if not rows:
        print("ncu-summary: no per-kernel gpu__time_duration.sum rows found", file=sys.stderr)
        return 1
    total = sum(r[0] for r in rows)
    print(f"{total / 1e3:.3f} ms in {sum(r[1] for r in rows)} launches of {len(rows)} kernels")
    for t, calls, mean, name, grid, block in sorted(rows, reverse=True)[:a.top]:
        print(f"{t / 1e3:9.3f} ms {calls:6d}x {mean:9.2f} us  {name[:100]}  grid {','.join(grid)} block {','.join(block)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
