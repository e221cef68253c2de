#!/usr/bin/env python3
"""bench/policies/median.py: medians over several kvgate-bench compare JSON files of the same
workload, one Markdown row per policy (hit rate, of bound, TTFT p50/p99, output tok/s, spread,
errors), plus each policy's ratios to the first policy (the baseline), or to the one named
by --vs.

  bench/policies/median.py out/a.json out/b.json out/c.json
  bench/policies/median.py --vs cache_aware out/a.json out/b.json out/c.json
"""
import json
import statistics
import sys


def main(args):
    vs = None
    if len(args) >= 2 and args[0] == "--vs":
        vs, args = args[1], args[2:]
    runs = [json.load(open(p)) for p in args]
    order = [r["policy"] for r in runs[0]["results"]]
    baseline = vs or order[0]
    rows = {p: [] for p in order}
    for run in runs:
        for r in run["results"]:
            rows.setdefault(r["policy"], []).append(r)
    med = lambda xs: statistics.median(xs)
    print(f"{runs[0]['description']}; medians of {len(runs)} runs\n")
    print("| policy | hit rate | of bound | TTFT p50 | TTFT p99 | output tok/s | spread (req) | errors |"
          " hit vs " + baseline + " | tok/s vs " + baseline + " | TTFT p50 vs " + baseline + " |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    meds = {}
    for p in order:
        rs = rows[p]
        hit = med([r["hit_rate"] for r in rs])
        bound = med([r["upper_bound"] for r in rs])
        t50 = med([r["ttft_ms"]["p50"] for r in rs])
        t99 = med([r["ttft_ms"]["p99"] for r in rs])
        tps = med([r["output_tokens_per_s"] for r in rs])
        spread = med([r["spread_requests"] for r in rs])
        errors = sum(r["errors"] for r in rs)
        meds[p] = (hit, bound, t50, t99, tps, spread, errors)
    base = meds[baseline][0], meds[baseline][4], meds[baseline][2]
    for p in order:
        hit, bound, t50, t99, tps, spread, errors = meds[p]
        ratio = lambda a, b: f"{a / b:.2f}x" if b else "-"
        print(f"| {p} | {hit * 100:.1f}% | {hit / bound * 100 if bound else 0:.0f}% | {t50:.0f} ms |"
              f" {t99:.0f} ms | {tps:.0f} | {spread:.2f} | {errors} | {ratio(hit, base[0])} |"
              f" {ratio(tps, base[1])} | {ratio(t50, base[2])} |")
    print(f"\nupper bound of the workload: {bound * 100:.1f}% of prompt tokens")


if __name__ == "__main__":
    main(sys.argv[1:])
