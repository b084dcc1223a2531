#!/usr/bin/env python3
"""Time to quality of the freezing policies on English->Spanish translation (Egeria §6.2),
rerunnable by anyone and across sessions.

  bench/translation_time_to_quality.py --egeria build/egeria [--data-dir datasets/en-es]
      [--model transformer-small] [--policies none,egeria,autofreeze,static]
      [--seeds 1,2,3] [--epochs 8] [--eval-every 200] [--threads 2] [--out runs/ttq-en-es]
      [--extra "--test-limit 100"] [--step-costs FILE] [--keep DIR] [--report-only]

Every (seed, policy) run trains MODEL with the paper's schedule for Transformers (AdamW,
inverse square root with warmup, no LR drops), every layer module its own freezing unit,
the validation loss (per token, unsmoothed) and perplexity every --eval-every steps and at
every epoch's end (the last is the run's final one), and a step line per step. Runs of one
seed share it (initialisation and batch order), so each policy is compared with the `none`
run of its seed. A finished run (summary.json) is kept; an unfinished one is resumed from
its checkpoint: the experiment can span sessions.
--keep DIR (e.g. a folder in the repository) holds the logs of finished runs (config,
summary, metrics and freeze lines, not the weights): each run that finishes is copied
there, and a run found there counts as finished, so the experiment can span machines.
The metrics lines (a step line per step) are kept xz-compressed, as metrics.jsonl.xz; the
script reads a run's metrics.jsonl, or its metrics.jsonl.xz where that is all there is.

The table, per run and as medians over the seeds (a seed that never reached the target
counts as the slowest, and the table says in how many it was reached): `none`'s final
validation perplexity is the target; the time to reach it within 1% (wall: training
seconds, evaluation left out; modelled: each step's target tokens priced at the measured
cost per token of the prefix frozen then, times 1 + the run's reference overhead), the
speedups against `none` of the same seed (wall speedups only where the two ran on one
machine in one boot, summary.json's `machine`: "other machine" where they did not, or only
one says which), the same
for the whole run (all its epochs, reached or not), final test BLEU, the reference's overhead, and what froze when. Written
to OUT/table.md and OUT/table.json.

--step-costs FILE: JSON lines of `egeria bench step --model MODEL --freeze-modules layers
--frozen-units K --batch-size B --seq-len T` (one per K; repeats allowed, their median is
taken). Without it only wall times are reported. With it the bound is printed too: the
speedup if the front k units were frozen from the first step.

A policy name with -bootn appended (egeria-bootn) runs Egeria with its bootstrapping
checked every n steps, the paper's check (--freeze-bootstrap-interval n), instead of
every epoch (the default). static-kK (static-k2) freezes the front K units from the first
step (--freeze static --static-modules K --static-epoch 0), one K of a practitioner's sweep.
smartfrz-any is SmartFRZ in any order (--freeze smartfrz --smartfrz-order any).
"""
import argparse
import json
import lzma
import math
import os
import shutil
import statistics
import subprocess
import sys

NEAR = 0.01  # "within 1%" of the target perplexity


def read_jsonl(path):
    """The lines of PATH, or of PATH.xz (a kept run's metrics) where PATH is missing."""
    out = []
    if not os.path.exists(path) and os.path.exists(path + ".xz"):
        f = lzma.open(path + ".xz", "rt")
    elif os.path.exists(path):
        f = open(path)
    else:
        return out
    with f:
        for line in f:
            line = line.strip()
            if line:
                out.append(json.loads(line))
    return out


def load_step_costs(path, model):
    """Seconds per target token with k units frozen: the median over repeats of each k."""
    by_k = {}
    for e in read_jsonl(path):
        if e.get("model") != model or "tokens_per_second" not in e:
            continue
        by_k.setdefault(int(e["frozen_units"]), []).append(1.0 / float(e["tokens_per_second"]))
    if not by_k:
        raise SystemExit(f"{path}: no `egeria bench step` lines of {model}")
    return {k: statistics.median(v) for k, v in by_k.items()}


def bound(costs):
    """The speedup if the first k units were frozen for the whole run: cost(0) / cost(k)."""
    return {k: costs[0] / c for k, c in sorted(costs.items())}


def run_dir(out, model, policy, seed):
    return os.path.join(out, f"{model}-{policy}-s{seed}")


KEPT = ("config.json", "summary.json", "freeze.jsonl")  # and the metrics, compressed


def finished(args, policy, seed):
    """The folder of the finished run of (policy, seed), in --keep first, or None."""
    for root in ([args.keep] if args.keep else []) + [args.out]:
        d = run_dir(root, args.model, policy, seed)
        if os.path.exists(os.path.join(d, "summary.json")):
            check_tolerance_source(d, policy_args(policy) + args.extra.split())
            return d
    return None


def check_tolerance_source(d, flags):
    """A finished Egeria fine-tuning run is reused only if its T came from the slopes its flags
    now mean: since 2026-12-07 a run from --init-from takes peak by default (auto), and the runs
    kept from before took the first 3 fits (--extra "--freeze-tolerance-from first3" reuses them)."""
    try:
        with open(os.path.join(d, "config.json")) as f:
            config = json.load(f)
    except (OSError, ValueError):
        return  # no readable config.json: nothing to compare
    if config.get("freeze") != "egeria" or not config.get("init_from"):
        return
    given = [i for i, f in enumerate(flags) if f == "--freeze-tolerance-from"]
    want = flags[given[-1] + 1] if given else "auto"
    had = config.get("freeze_tolerance_from", "first3")
    if {"auto": "peak"}.get(had, had) != {"auto": "peak"}.get(want, want):
        sys.exit(f"translation_time_to_quality: {d} was fine-tuned with --freeze-tolerance-from {had}, but this "
                 f"run asks for {want}; add --extra \"--freeze-tolerance-from {had}\" to report it, or use "
                 f"another --out/--keep")


def keep(args, d):
    """Copies a finished run's logs to --keep (whole or not at all: written beside, renamed)."""
    dest = os.path.join(args.keep, os.path.basename(d))
    if os.path.exists(os.path.join(dest, "summary.json")):
        return dest
    tmp = dest + ".partial"
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    for name in KEPT:
        if os.path.exists(os.path.join(d, name)):
            shutil.copy2(os.path.join(d, name), tmp)
    metrics = os.path.join(d, "metrics.jsonl")
    if os.path.exists(metrics):
        with open(metrics, "rb") as f, lzma.open(os.path.join(tmp, "metrics.jsonl.xz"), "wb",
                                                 preset=9 | lzma.PRESET_EXTREME) as z:
            shutil.copyfileobj(f, z)
    elif os.path.exists(metrics + ".xz"):
        shutil.copy2(metrics + ".xz", tmp)
    shutil.rmtree(dest, ignore_errors=True)
    os.rename(tmp, dest)
    return dest


def policy_args(policy):
    """The policy's --freeze value and its flags: a policy name, one with -bootn appended
    (Egeria's bootstrapping checked every n steps, the paper's check, instead of every epoch),
    or static-kK (the front K units frozen from the first step, a hand-tuned static K); smartfrz-any
    is SmartFRZ freezing any unit its predictor names (smartfrz alone: the front only)."""
    if policy == "smartfrz-any":
        return ["--freeze", "smartfrz", "--smartfrz-order", "any"]
    if policy.endswith("-bootn"):
        return policy_args(policy[:-len("-bootn")]) + ["--freeze-bootstrap-interval", "n"]
    if policy.startswith("static-k"):
        k = policy[len("static-k"):]
        if not k.isdigit() or int(k) < 1:
            sys.exit(f"translation_time_to_quality: '{policy}': static-kK takes a number of units K >= 1")
        return ["--freeze", "static", "--static-modules", k, "--static-epoch", "0"]
    return ["--freeze", policy]


def command(args, policy, seed, d):
    return ([args.egeria, "train", "--model", args.model, "--dataset", "en-es", "--data-dir", args.data_dir,
             "--epochs", str(args.epochs), "--seed", str(seed), "--threads", str(args.threads),
             "--eval-every", str(args.eval_every), "--log-every", "1", "--checkpoint-every", str(args.eval_every)]
            + policy_args(policy) + ["--freeze-modules", "layers", "--out", d] + args.extra.split())


def train(args, policy, seed):
    done = finished(args, policy, seed)
    if done:
        return keep(args, done) if args.keep else done
    d = run_dir(args.out, args.model, policy, seed)
    cmd = command(args, policy, seed, d)
    if os.path.exists(os.path.join(d, "checkpoint.safetensors")):
        cmd.append("--resume")
    print("$ " + " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True)
    return keep(args, d) if args.keep else d


def analyse(d, costs=None):
    """One run's curve and figures from its files."""
    metrics = read_jsonl(os.path.join(d, "metrics.jsonl"))
    with open(os.path.join(d, "summary.json")) as f:
        summary = json.load(f)
    overhead = float(summary.get("reference_overhead_fraction", 0.0))
    modelled, t, k, curve = {}, 0.0, 0, []
    for m in metrics:
        if m["type"] == "step" and costs is not None:
            # The step's tokens at the cost of the prefix frozen during it: the line's
            # frozen_modules is after the step, so the step ran with the previous line's.
            t += float(m["tokens"]) * costs[k]
            if "frozen_units" in m:  # the step costs are of frozen fronts
                raise SystemExit(f"{d}: step {m['step']} ran with units {m['frozen_units']} frozen, not a front; "
                                 "the step-cost model covers fronts only")
            k = int(m.get("frozen_modules", 0))
            modelled[m["step"]] = t * (1 + overhead)
        elif m["type"] in ("eval", "epoch") and "valid_loss" in m:
            # An epoch's end is evaluated on the same split with the same per-token loss as
            # the --eval-every points, and the last one is the run's final perplexity.
            if curve and curve[-1]["step"] == m["step"]:
                continue
            ppl = m.get("valid_perplexity", math.exp(m["valid_loss"]))
            curve.append({"step": m["step"], "seconds": m["train_seconds"], "ppl": ppl,
                          "modelled": modelled.get(m["step"])})
    freezes = [(m["step"], m.get("frozen_modules", 0)) for m in metrics if m["type"] == "freeze"]
    return {"dir": d, "curve": curve, "freezes": freezes, "overhead": overhead,
            "final_ppl": curve[-1]["ppl"] if curve else math.nan,
            "test_bleu": summary.get("final_test_bleu"), "train_seconds": summary.get("train_seconds"),
            "machine": (lambda m: (m.get("host"), m.get("boot_id")) if m else None)(summary.get("machine")),
            "run_modelled": t * (1 + overhead) if modelled else None,
            "backward_flops_saved": summary.get("backward_flops_saved_fraction", 0.0)}


def time_to(run, target, key):
    """The first evaluation's time (`seconds` or `modelled`) at or below target x (1 + NEAR)."""
    for p in run["curve"]:
        if p["ppl"] <= target * (1 + NEAR) and p[key] is not None:
            return p[key]
    return None


def median_never_last(values):
    """The median of speedups where None (never reached) ranks below every number; None if
    the middle falls on a never."""
    ranked = sorted(values, key=lambda v: (v is not None, v or 0.0))
    n = len(ranked)
    if n == 0:
        return None
    middle = ranked[(n - 1) // 2:n // 2 + 1]
    return None if None in middle else statistics.mean(middle)


def table(runs, seeds, policies, modelled):
    """Per seed and policy, then medians over the seeds."""
    rows = []
    for seed in seeds:
        base = runs.get(("none", seed))
        if not base:
            continue
        target = base["final_ppl"]
        for policy in policies:
            r = runs.get((policy, seed))
            if not r:
                continue
            row = {"seed": seed, "policy": policy, "final_ppl": r["final_ppl"], "test_bleu": r["test_bleu"],
                   "overhead": r["overhead"], "target_ppl": target, "freezes": r["freezes"],
                   "backward_flops_saved": r["backward_flops_saved"],
                   # wall times compare within one machine and boot; two runs from before summary.json
                   # named it are compared, one from before and one since are not
                   "other_machine": r["machine"] != base["machine"]}
            for key in ["seconds"] + (["modelled"] if modelled else []):
                mine, theirs = time_to(r, target, key), time_to(base, target, key)
                row["time_" + key] = mine
                comparable = key == "modelled" or not row["other_machine"]
                row["speedup_" + key] = theirs / mine if mine and theirs and comparable else None
            # The whole run (all its epochs), whether or not it reached the target.
            for key, field in (("seconds", "train_seconds"), ("modelled", "run_modelled")):
                mine, theirs = r.get(field), base.get(field)
                comparable = key == "modelled" or not row["other_machine"]
                row["run_speedup_" + key] = theirs / mine if mine and theirs and comparable else None
            rows.append(row)
    med = []
    for policy in policies:
        mine = [r for r in rows if r["policy"] == policy]
        if not mine:
            continue
        m = {"policy": policy, "seeds": len(mine), "other_machine": any(r["other_machine"] for r in mine)}
        for k in ("final_ppl", "test_bleu", "overhead", "run_speedup_seconds", "run_speedup_modelled"):
            v = [r[k] for r in mine if r.get(k) is not None]
            m[k] = statistics.median(v) if v else None
        for k in ("speedup_seconds", "speedup_modelled"):
            m[k] = median_never_last([r.get(k) for r in mine]) if any(k in r for r in mine) else None
        m["reached"] = sum(r["time_seconds"] is not None for r in mine)
        bleus = [r["test_bleu"] for r in mine if r["test_bleu"] is not None]
        m["test_bleu_band"] = [min(bleus), max(bleus)] if bleus else None
        med.append(m)
    return rows, med


def fmt(v, spec):
    return "—" if v is None else format(v, spec)


def times(v, missing="—"):
    return missing if v is None else f"{v:.3f}×"


def markdown(rows, med, bounds):
    out = ["| policy | seeds | final valid ppl | test BLEU (band) | reached none's ppl | speedup to it, wall | "
           "modelled | whole run, wall | modelled | reference overhead |",
           "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for m in med:
        band = m["test_bleu_band"]
        out.append(f"| {m['policy']} | {m['seeds']} | {fmt(m['final_ppl'], '.2f')} | {fmt(m['test_bleu'], '.2f')}"
                   f" ({fmt(band[0], '.2f') if band else '—'}–{fmt(band[1], '.2f') if band else '—'}) | "
                   f"{m['reached']} of {m['seeds']} | "
                   + ("other machine | " if m["other_machine"] else f"{times(m['speedup_seconds'], 'never')} | ")
                   + f"{times(m['speedup_modelled'], 'never')} | "
                   + ("other machine | " if m["other_machine"] else f"{times(m['run_speedup_seconds'])} | ")
                   + f"{times(m['run_speedup_modelled'])} | "
                   f"{fmt(m['overhead'] and 100 * m['overhead'], '.1f')}% |")
    out += ["", "| seed | policy | final ppl | target | time to it (s) | speedup | modelled speedup | "
            "whole run, modelled | BLEU | froze (step: units) |", "|---:|---|---:|---:|---:|---:|---:|---:|---:|---|"]
    for r in rows:
        froze = ", ".join(f"{s}: {k}" for s, k in r["freezes"][:8]) + (" ..." if len(r["freezes"]) > 8 else "")
        out.append(f"| {r['seed']} | {r['policy']} | {fmt(r['final_ppl'], '.2f')} | {fmt(r['target_ppl'], '.2f')} | "
                   f"{fmt(r['time_seconds'], '.0f')} | "
                   f"{'other machine' if r['other_machine'] else fmt(r['speedup_seconds'], '.3f')} | "
                   f"{fmt(r.get('speedup_modelled'), '.3f')} | {fmt(r.get('run_speedup_modelled'), '.3f')} | "
                   f"{fmt(r['test_bleu'], '.2f')} | {froze or '—'} |")
    if bounds:
        out += ["", "Bound: the speedup if the front k units were frozen from the first step (measured step costs): "
                + ", ".join(f"k={k}: {b:.2f}×" for k, b in bounds.items())]
    return "\n".join(out) + "\n"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--egeria", default="build/egeria")
    ap.add_argument("--data-dir", default="datasets/en-es")
    ap.add_argument("--model", default="transformer-small")
    ap.add_argument("--policies", default="none,egeria,autofreeze,static")
    ap.add_argument("--seeds", default="1,2,3")
    ap.add_argument("--epochs", type=int, default=8)
    ap.add_argument("--eval-every", type=int, default=200)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default="runs/ttq-en-es")
    ap.add_argument("--extra", default="")
    ap.add_argument("--step-costs")
    ap.add_argument("--keep", help="a folder for the finished runs' logs (see above)")
    ap.add_argument("--report-only", action="store_true", help="analyse the stored runs, train nothing")
    args = ap.parse_args(argv)
    policies = [p for p in args.policies.split(",") if p]
    if "none" not in policies:
        policies.insert(0, "none")
    seeds = [int(s) for s in args.seeds.split(",") if s]
    costs = load_step_costs(args.step_costs, args.model) if args.step_costs else None
    runs = {}
    for seed in seeds:  # seed by seed, so that a partial experiment already pairs its runs
        for policy in policies:
            d = finished(args, policy, seed) if args.report_only else train(args, policy, seed)
            if d:
                runs[(policy, seed)] = analyse(d, costs)
    rows, med = table(runs, seeds, policies, costs is not None)
    md = markdown(rows, med, bound(costs) if costs else None)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "table.md"), "w") as f:
        f.write(md)
    with open(os.path.join(args.out, "table.json"), "w") as f:
        json.dump({"per_seed": rows, "medians": med}, f, indent=1)
    print(md)


if __name__ == "__main__":
    sys.exit(main())
