#!/usr/bin/env python3
"""Fine-tuning with freezing on a transfer task from real data (Egeria §2.3, §6.2), rerunnable.

  bench/fine_tune.py --egeria build/egeria [--models resnet20] [--seeds 0,1,2]
      [--budgets 6000,30000] [--policies none,static,autofreeze,egeria,egeria-cache,smartfrz,smartfrz-any]
      [--static-k 1,2,3] [--epochs 10] [--pretrain-epochs 10] [--threads 2]
      [--pretrained datasets/pretrained] [--out runs/ft] [--step-costs FILE] [--extra "..."]
      [--smartfrz-predictor FILE --smartfrz-tag NAME]

The task: Fashion-MNIST's classes 0-4 (T-shirt, trouser, pullover, dress, coat) are the
pretraining task, its classes 5-9 (sandal, shirt, sneaker, bag, ankle boot) the new one.
1. Pretraining, once per model (cached in --pretrained: delete a model's folder to redo
   it): the from-scratch recipe (`egeria train`'s defaults: SGD 0.1, step decay) on the
   30,000 training images of classes 0-4, seed 0, --pretrain-epochs epochs.
2. Fine-tuning, for each budget (the first N training images of classes 5-9), seed and
   policy: --init-from the pretrained model.safetensors with its head initialised
   afresh (--init-exclude head), the fine-tuning recipe of docs/fine-tuning.md (SGD 0.1,
   linear decay to 0 after a 5% linear warmup), the test images of classes 5-9.
   `static` runs once per K of --static-k (the first K freezing units frozen from step
   0: what a careful practitioner hand-tunes); the table keeps the best K (the fastest
   to the target at the target accuracy, else the most accurate). smartfrz and
   smartfrz-any are SmartFRZ with the shipped predictor in its two orders, or with
   --smartfrz-predictor FILE ("{model}" in it replaced by the model's name: a predictor left
   out of that model's runs, bench/train_smartfrz_predictor.py's loo-MODEL.safetensors), their
   runs and rows then named smartfrz-NAME, smartfrz-any-NAME by --smartfrz-tag. An Egeria policy
   with -laN appended (egeria-la1, egeria-cache-la2) reads N units ahead of the front
   (--freeze-lookahead N); with -tolX its T is X times its largest early slope
   (--freeze-tolerance X; egeria-tol0.5); -lr2 reads the SP loss per squared LR
   (--freeze-reading per-lr2), -bnb with the batch's statistics (--freeze-reference-bn batch);
   -bnr has the frozen units' batch norms normalise with their running statistics, as the
   cache's do (--freeze-bn running; egeria-bnr-peak);
   -settleN settles the frozen batch norms' running statistics over N steps (--freeze-bn-settle N:
   egeria-cache or -bnr, the policies with running statistics, whose default since 2026-12-06 is 20;
   -settle0 switches at the freeze, as the egeria-cache runs kept from before did); -peak and
   -first3 take T from a unit's steepest fit so far or from its first 3 (--freeze-tolerance-from:
   peak, the default for a pretrained run since 2026-12-07; Egeria runs kept from before took
   first3, and are refused under a name without -first3).
Each run's final accuracy, wall time, the time to come within 0.3 pt of the seed's
`none` run's final accuracy (wall, at epoch ends, and modelled from eg_bench_freeze's
step costs with --step-costs, as bench/time_to_accuracy.py), the speedups, the share of
backward FLOPs saved and the reference's overhead; then the means over the seeds. The
tables go to OUT/table.md and OUT/table.json. Runs already complete in OUT are reused.
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import modelled_time as mt  # noqa: E402  (epoch times, modelled step costs)
import time_to_accuracy as tta  # noqa: E402  (the policies' flags, run folders)

NEAR = tta.NEAR  # 0.3 pt: "to within 0.3 pt of none's final accuracy"
PRETRAIN_CLASSES, TASK_CLASSES = "0,1,2,3,4", "5,6,7,8,9"
BATCH = 128  # egeria train's default --batch-size


def recipe(budget, epochs):
    """docs/fine-tuning.md's recipe: SGD at the from-scratch LR (0.1: measured best of 0.003-0.1
    there), linear decay to 0 after a linear warmup over the first 5% of the steps, the head
    initialised afresh."""
    warmup = max(1, round(0.05 * (budget // BATCH) * epochs))
    return ["--lr", "0.1", "--lr-schedule", "linear", "--warmup-steps", str(warmup), "--init-exclude", "head"]


POLICIES = {"none": ["none"], "none-sample": ["none", "--augment-mode", "sample"], "autofreeze": ["autofreeze"],
            "egeria": ["egeria"],
            "egeria-cache": ["egeria", "--freeze-cache", "on", "--freeze-bn", "running", "--augment-mode", "sample"],
            "smartfrz": ["smartfrz"], "smartfrz-any": ["smartfrz", "--smartfrz-order", "any"]}


SUFFIXES = {"lr2": ["--freeze-reading", "per-lr2"], "bnb": ["--freeze-reference-bn", "batch"],
            "bnr": ["--freeze-bn", "running"],
            "peak": ["--freeze-tolerance-from", "peak"], "first3": ["--freeze-tolerance-from", "first3"]}
SETTINGS = {"la": "--freeze-lookahead", "tol": "--freeze-tolerance", "settle": "--freeze-bn-settle"}


def policy_flags(policy):
    """A policy's `egeria train` flags. An Egeria policy may carry suffixes: -laN reads N units
    ahead of the front (--freeze-lookahead N), -tolX sets T's coefficient (--freeze-tolerance X),
    -lr2 reads the SP loss per squared LR (--freeze-reading per-lr2), -bnb gives the reference
    the batch's statistics (--freeze-reference-bn batch), -bnr has the frozen units' batch norms
    normalise with their running statistics (--freeze-bn running, settled first as the cache's
    are: --freeze-bn-settle auto), -peak takes T from a unit's steepest fit
    so far (--freeze-tolerance-from peak, a pretrained run's default since 2026-12-07), -first3 from
    its first 3 fits (the paper's, the default before), -settleN settles the frozen batch norms over N steps
    (--freeze-bn-settle N); e.g. egeria-la1, egeria-cache-tol0.5, egeria-peak,
    egeria-bnb-lr2. A policy with fixed augmentations (egeria-cache, none-sample) may end in -vN: each
    sample's N of them, in turn (--augment-variants N), e.g. egeria-cache-v4."""
    m = re.fullmatch(r"(.*)-v(\d+)", policy)
    if m:
        flags = policy_flags(m.group(1))
        return flags + ["--augment-variants", m.group(2)] if flags and "sample" in flags else None
    extra = []
    while True:
        m = re.fullmatch(r"(egeria.*)-(la|tol|settle)(\d+(?:\.\d+)?)", policy)
        if m and not (m.group(2) in ("la", "settle") and not m.group(3).isdigit()):
            policy = m.group(1)
            extra = [SETTINGS[m.group(2)], m.group(3)] + extra
            continue
        m = re.fullmatch(r"(egeria.*)-(%s)" % "|".join(SUFFIXES), policy)
        if not m:
            break
        policy = m.group(1)
        extra = SUFFIXES[m.group(2)] + extra
    flags = POLICIES.get(policy)
    return flags + extra if flags else None


def train(args, cmd, out):
    if os.path.exists(os.path.join(out, "summary.json")):
        return out
    tta.clear_unfinished(out)
    cmd = [args.egeria, "train", "--dataset", "fashion-mnist", "--threads", str(args.threads),
           "--checkpoint-every", "0", "--out", out] + cmd
    if args.data_dir:
        cmd += ["--data-dir", args.data_dir]
    print("+", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL if args.quiet else None)
    return out


def pretrained(args, model):
    out = os.path.join(args.pretrained, f"{model}-fashion-mnist-{PRETRAIN_CLASSES.replace(',', '')}")
    train(args, ["--model", model, "--classes", PRETRAIN_CLASSES, "--epochs", str(args.pretrain_epochs),
                 "--seed", "0", "--freeze", "none"], out)
    return os.path.join(out, "model.safetensors")


def check_tolerance_source(out, policy, flags):
    """A finished Egeria run is reused only if its T came from the slopes its flags (the policy's,
    then --extra's) now mean: a fine-tuning run's default is peak since 2026-12-07 (auto: peak
    from --init-from), and the runs kept from before took the first 3 fits (a policy with
    -first3, or --extra "--freeze-tolerance-from first3", reuses them)."""
    if flags[0] != "egeria":
        return
    given = [i for i, f in enumerate(flags) if f == "--freeze-tolerance-from"]
    want = flags[given[-1] + 1] if given else "auto"
    with open(os.path.join(out, "config.json")) as f:
        had = json.load(f).get("freeze_tolerance_from", "first3")
    peak = {"auto": "peak", "peak": "peak", "first3": "first3"}  # every run here starts from --init-from
    if peak.get(had) != peak.get(want):
        sys.exit(f"fine_tune: {out} was trained with --freeze-tolerance-from {had}, but the policy '{policy}' "
                 f"means {want} ({peak.get(want)} for a pretrained run); name the policy for what it was run "
                 f"with (e.g. {policy}-first3, or --extra \"--freeze-tolerance-from {had}\"), or use another --out")


def label(args, policy):
    """A policy's name in run folders and the table: a SmartFRZ policy with another predictor
    carries its tag."""
    flags = policy_flags(policy) if policy != "static" else ["static"]
    return f"{policy}-{args.smartfrz_tag}" if flags[0] == "smartfrz" and args.smartfrz_predictor else policy


def fine_tune(args, model, budget, seed, policy, k=None):
    name = f"{model}-b{budget}-s{seed}-{label(args, policy)}" + (f"{k}" if k is not None else "")
    out = os.path.join(args.out, name)
    flags = policy_flags(policy) if policy != "static" else ["static", "--static-modules", str(k), "--static-epoch", "0"]
    if flags[0] == "smartfrz" and args.smartfrz_predictor:
        flags = flags + ["--smartfrz-predictor", args.smartfrz_predictor.replace("{model}", model)]
    if os.path.exists(os.path.join(out, "summary.json")):
        check_tolerance_source(out, policy, flags + args.extra.split())
        return out  # finished (a kept run's report needs no pretrained model)
    cmd = ["--model", model, "--classes", TASK_CLASSES, "--train-limit", str(budget), "--epochs", str(args.epochs),
           "--seed", str(seed), "--init-from", pretrained(args, model), "--freeze", flags[0]] + flags[1:] + recipe(budget, args.epochs)
    if args.extra:
        cmd += args.extra.split()
    return train(args, cmd, out)


def summary(out):
    with open(os.path.join(out, "summary.json")) as f:
        return json.load(f)


def row(out, target, base, costs, base_out=None):
    """One run's figures against its seed's `none` (base, from base_out). No wall speedup where the
    two ran on different machines or boots, or only one says which (other_machine: a kept `none`
    from an earlier VM, say); two runs from before summary.json named its machine are compared."""
    s = summary(out)
    r = {"run": os.path.basename(out), "final_accuracy": s["final_test_accuracy"], "train_seconds": s["train_seconds"],
         "time_to_target": mt.time_to_accuracy(out, target),
         "backward_flops_saved": s.get("backward_flops_saved_fraction", 0.0),
         "reference_overhead": s.get("reference_overhead_fraction", 0.0),
         "other_machine": base_out is not None and mt.same_machine(out, base_out) is False}
    if costs:
        r["modelled_time_to_target"] = mt.modelled_time_to_accuracy(out, target, costs)
    for key in ("time_to_target", "modelled_time_to_target"):
        if key in r:
            mine, theirs = r[key], base.get(key)
            r["speedup" if key == "time_to_target" else "modelled_speedup"] = (
                theirs / mine if mine and theirs and not (key == "time_to_target" and r["other_machine"]) else None)
    return r


def best_static(cands):
    """The static K a careful practitioner keeps: the fastest to the target among the Ks that
    reach it, else the most accurate; with the sweep's runs beside. Fastest by the modelled
    time where every candidate has one: the sweep's runs may come from different machines or
    boots (a kept K = 1 beside a K = 2 of today), whose wall times do not compare."""
    key = "modelled_time_to_target" if all("modelled_time_to_target" in c for c in cands) else "time_to_target"
    reached = [c for c in cands if c[key] is not None]
    r = dict(min(reached, key=lambda c: c[key]) if reached
             else max(cands, key=lambda c: c["final_accuracy"]))
    r["static_sweep"] = [c["run"] for c in cands]
    return r


def fmt(v, pct=False, x=False):
    if v is None:
        return "—"
    return f"{100 * v:.2f}" if pct else (f"{v:.2f}×" if x else f"{v:.1f}")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--egeria", default="build/egeria")
    p.add_argument("--models", default="resnet20")
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--budgets", default="6000,30000")
    p.add_argument("--policies", default="none,static,autofreeze,egeria,egeria-cache")
    p.add_argument("--static-k", default="1,2,3", help="static: the numbers of front units to sweep")
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--pretrain-epochs", type=int, default=10)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--data-dir", default="")
    p.add_argument("--pretrained", default="datasets/pretrained")
    p.add_argument("--out", default="runs/ft")
    p.add_argument("--step-costs", default="")
    p.add_argument("--extra", default="", help="flags added to every fine-tuning run")
    p.add_argument("--smartfrz-predictor", default="",
                   help="SmartFRZ's predictor for the smartfrz policies ({model}: the model's name)")
    p.add_argument("--smartfrz-tag", default="", help="with --smartfrz-predictor: its name in run folders")
    p.add_argument("--quiet", action="store_true")
    args = p.parse_args()
    if bool(args.smartfrz_predictor) != bool(args.smartfrz_tag):
        sys.exit("fine_tune: --smartfrz-predictor and --smartfrz-tag go together (the tag names its runs apart "
                 "from the shipped predictor's)")
    if not re.fullmatch(r"[A-Za-z0-9_.]*", args.smartfrz_tag):
        sys.exit(f"fine_tune: --smartfrz-tag '{args.smartfrz_tag}': letters, digits, '_' and '.' only")
    costs = mt.load_step_costs(args.step_costs) if args.step_costs else None
    policies = args.policies.split(",")
    for pol in policies:
        if pol != "static" and policy_flags(pol) is None:
            sys.exit(f"fine_tune: unknown policy '{pol}' (static, {', '.join(POLICIES)}; egeria's with -laN, -tolX, -settleN, -lr2, -bnb, -peak, -first3)")
    table = {"runs": [], "means": []}
    lines = ["| model | budget | policy | seeds | final acc. % | wall s | to target s (wall) | speedup (wall) |"
             + (" speedup (modelled) |" if costs else "") + " backward FLOPs saved | reference overhead |",
             "|---|---:|---|---:|---:|---:|---:|---:|" + ("---:|" if costs else "") + "---:|---:|"]
    for model in args.models.split(","):
        for budget in (int(b) for b in args.budgets.split(",")):
            by_policy = {}
            for seed in (int(s) for s in args.seeds.split(",")):
                base_out = fine_tune(args, model, budget, seed, "none")
                target = summary(base_out)["final_test_accuracy"] - NEAR
                base = row(base_out, target, {}, costs)
                for pol in policies:
                    if pol == "static":
                        cands = [row(fine_tune(args, model, budget, seed, "static", int(k)), target, base, costs,
                                     base_out) for k in args.static_k.split(",")]
                        r = best_static(cands)
                    else:
                        r = row(fine_tune(args, model, budget, seed, pol), target, base, costs, base_out)
                    r.update(model=model, budget=budget, seed=seed, policy=label(args, pol), target=target)
                    table["runs"].append(r)
                    by_policy.setdefault(label(args, pol), []).append(r)
            for pol, rs in by_policy.items():
                def mean(key):
                    vals = [r.get(key) for r in rs]
                    return None if any(v is None for v in vals) else statistics.mean(vals)
                m = {k: mean(k) for k in ("final_accuracy", "train_seconds", "time_to_target", "speedup",
                                          "modelled_speedup", "backward_flops_saved", "reference_overhead")}
                m.update(model=model, budget=budget, policy=pol, seeds=len(rs),
                         other_machine=any(r["other_machine"] for r in rs),
                         static_k=[r["run"].rsplit("static", 1)[1] for r in rs] if pol == "static" else None)
                table["means"].append(m)
                lines.append(f"| {model} | {budget} | {pol}" + (f" (best K per seed: {','.join(m['static_k'])})"
                                                                 if pol == "static" else "")
                             + f" | {len(rs)} | {fmt(m['final_accuracy'], pct=True)} | {fmt(m['train_seconds'])} | "
                             f"{fmt(m['time_to_target'])} | "
                             + ("other machine |" if m["other_machine"] else f"{fmt(m['speedup'], x=True)} |")
                             + (f" {fmt(m['modelled_speedup'], x=True)} |" if costs else "")
                             + f" {fmt(m['backward_flops_saved'], pct=True)}% | "
                             f"{fmt(m['reference_overhead'], pct=True)}% |")
    os.makedirs(args.out, exist_ok=True)
    text = ("Means over the seeds; the target is each seed's `none` run's final accuracy less 0.3 pt, times at "
            "epoch ends; a mean with a dash has a seed that never reached it. Wall speedups compare runs of one "
            "machine in one boot (summary.json's machine): \"other machine\" where a seed's run and its `none` "
            "ran on different ones, or only one of them says which.\n\n" + "\n".join(lines) + "\n")
    with open(os.path.join(args.out, "table.md"), "w") as f:
        f.write(text)
    with open(os.path.join(args.out, "table.json"), "w") as f:
        json.dump(table, f, indent=1)
    print(text)


if __name__ == "__main__":
    main()
