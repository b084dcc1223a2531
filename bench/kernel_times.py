#!/usr/bin/env python3
"""Kernel times from Nsight Compute's CSV, summed per kernel and sorted.

  ncu --csv --print-units base --metrics gpu__time_duration.sum ... > prof.log
  bench/kernel_times.py prof.log [--title TEXT] > kernels.txt

prof.log may hold the profiled program's own output too: only ncu's CSV rows (lines that
begin with a quote) are read. A kernel is its name up to the parameter list, template
arguments kept, so each instantiation is a row of its own. The output is the layout of
docs/runs/gpu-h100/*/*-kernels-*.txt: a title, the unit and kernel count, the total, then
per kernel its share, milliseconds, calls and name.
"""
import argparse
import csv
import sys
from collections import defaultdict


def kernel_name(full):
    # "void eg::(anonymous namespace)::f<8, true>(const void *, int)" -> the text before
    # the parameter list: the parenthesis group that ends the name, matched from the end.
    s = full.strip()
    if not s.endswith(")"):
        return s
    depth = 0
    for i in range(len(s) - 1, -1, -1):
        if s[i] == ")":
            depth += 1
        elif s[i] == "(":
            depth -= 1
            if depth == 0:
                return s[:i].strip() or s
    return s


def read(lines):
    rows = [line for line in lines if line.startswith('"')]
    if not rows:
        return {}, {}, 0
    times, calls = defaultdict(float), defaultdict(int)
    reader = csv.DictReader(rows)
    n = 0
    for r in reader:
        if r.get("Metric Name") != "gpu__time_duration.sum":
            continue
        unit = r.get("Metric Unit", "ns")
        scale = {"ns": 1.0, "nsecond": 1.0, "us": 1e3, "usecond": 1e3, "ms": 1e6, "msecond": 1e6}.get(unit)
        if scale is None:
            raise SystemExit(f"kernel_times: unknown unit {unit!r}")
        value = float(r["Metric Value"].replace(",", ""))
        name = kernel_name(r["Kernel Name"])
        times[name] += value * scale
        calls[name] += 1
        n += 1
    return times, calls, n


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("log")
    ap.add_argument("--title", default="ncu gpu__time_duration")
    ap.add_argument("--top", type=int, default=60)
    a = ap.parse_args()
    with open(a.log, errors="replace") as f:
        times, calls, n = read(f.readlines())
    if not n:
        sys.exit(f"kernel_times: no gpu__time_duration rows in {a.log}")
    total = sum(times.values())
    print(f"# {a.title}")
    print(f"unit ns kernels {n}")
    print(f"total {total:.1f}")
    for name, t in sorted(times.items(), key=lambda kv: -kv[1])[: a.top]:
        print(f"{100 * t / total:5.1f}% {t / 1e6:9.3f}ms {calls[name]:5d}  {name[:160]}")


if __name__ == "__main__":
    main()
