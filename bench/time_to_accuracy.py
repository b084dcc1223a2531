#!/usr/bin/env python3
"""Time-to-accuracy of the freezing policies (Egeria §6), rerunnable by anyone.

  bench/time_to_accuracy.py --egeria build/egeria [--models resnet20,resnet56]
      [--policies none,egeria,autofreeze,static] [--epochs 30] [--threads 2]
      (variants, as VARIANTS below: egeria-peak = egeria --freeze-tolerance-from peak;
       -wmin5: --freeze-window-min 5; -lastoff: --freeze-last-phase off;
       -keep, -scaled: --freeze-refreeze-tolerance keep, scaled;
       -firstoff: --freeze-first-phase off; -never: --freeze-unfreeze never;
       -unit, -network: --freeze-reference-scope unit (the default since
       2026-11-24; runs stored before then are network), network;
       -bnbatch, -bnrunning: --freeze-bn batch (the default), running;
       any of them with -bootn appended: --freeze-bootstrap-interval n, the paper's
       bootstrapping check every n steps (runs stored before 2026-11-24's change of
       its default to an epoch are -bootn); -dynamic: --freeze-reference-calibration 0, the
       int8 reference's activation scales from every batch (runs stored before 2026-11-25's
       static calibration are -dynamic); -settle0: --freeze-bn-settle 0, frozen batch norms
       on running statistics from the freeze (-bnrunning and -cache runs stored before
       2026-12-06's settling are -settle0);
       -cache: --freeze-cache on with what it needs; none-sampleaug: the baseline with
       the cache's per-sample augmentation)
      [--train-limit 0] [--out runs/tta] [--extra "--freeze-interval 20"] [--repeats 1]
      [--vary-seed] [--step-costs runs/step-costs.json]

For each model, trains on Fashion-MNIST (all 60,000 training images unless
--train-limit) on the CPU with the step LR schedule (decay 10x at 50% and 75% of the
epochs, rounded down: epochs 5 and 7 of 10) and the same seed, once per policy, then
prints a table with final and best test accuracy, wall time, the time to reach the
`none` run's final accuracy (and to come within 0.3 points of it: one run's final
accuracy differs from another's by about that much), and the speedups against `none`'s times to the same,
then each policy's test accuracy at every epoch end beside `none`'s, with the units frozen then. The
tables are also written to OUT/table.md (OUT/table.json: all but the epoch table).
Runs already complete in OUT are reused (delete a run's folder to redo it).

--repeats N trains every policy N times, interleaved (none, egeria, ..., none, egeria,
...), and reports the median times: on a shared or throttled machine the same run can
take 30% longer minutes later, so one run per policy says little about wall time.
With --vary-seed, repeat r uses seed + r (initialisation, data order, augmentation):
accuracies are then medians over the repeats, and the target is the median of the
`none` runs' final accuracies; a second table then compares each seed's runs with
the `none` run of the same seed, and a third the seeds' mean curves: each policy's
accuracy and times at each epoch end averaged over its seeds, the target `none`'s mean
final accuracy less 0.3 pt (table.json: {"medians": [...], "per_seed": [...],
"mean_over_seeds": [...]}). One run's accuracy at an epoch end is good to about
±0.3 pt (the test set alone: a standard error of 0.27 pt at 92%), as wide as the band.

--step-costs FILE adds *modelled* times, which this machine's drift does not move:
FILE is eg_bench_freeze's JSON (build/bench/eg_bench_freeze --benchmark_repetitions=5
--benchmark_report_aggregates_only=true --benchmark_out=FILE --benchmark_out_format=json;
EG_BENCH_IMAGE=1x28x28 for Fashion-MNIST's input, 3x32x32 when unset), the median time of one training step with k freezing units frozen (from the activation
cache for runs with --freeze-cache on). A run's modelled time is the sum over its steps
of the cost of the units frozen then (the step records of metrics.jsonl, every
--log-every steps), times 1 + its measured reference overhead; evaluation and data
loading are left out for every policy alike. The modelled speedups compare those sums.
A set that is not a front (--freeze smartfrz --smartfrz-order any) is modelled from the
fronts' costs (step_cost), and the report sets the model beside the sets FILE measured
(TrainStepFrozenSet).
"""
import argparse
import json
import os
import statistics
import shutil
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from modelled_time import (epoch_table_lines, load_step_costs, mean_curve, modelled_seconds,  # noqa: E402
                           modelled_time_to_accuracy, set_cost_lines, time_on_curve, time_to_accuracy)


# The accuracy tolerance: "final accuracy within 0.3 points" of the baseline's.
NEAR = 0.003


# Policy variants: a name for a policy run with extra flags.
VARIANTS = {"egeria-peak": ["egeria", "--freeze-tolerance-from", "peak"],
            "egeria-wmin5": ["egeria", "--freeze-window-min", "5"],
            "egeria-peak-wmin5": ["egeria", "--freeze-tolerance-from", "peak", "--freeze-window-min", "5"],
            "egeria-lastoff": ["egeria", "--freeze-last-phase", "off"],
            "egeria-keep": ["egeria", "--freeze-refreeze-tolerance", "keep"],
            "egeria-scaled": ["egeria", "--freeze-refreeze-tolerance", "scaled"],
            # Freezes held until the first LR decay (Note [Egeria's freezing decisions]).
            "egeria-firstoff": ["egeria", "--freeze-first-phase", "off"],
            "egeria-firstoff-keep": ["egeria", "--freeze-first-phase", "off", "--freeze-refreeze-tolerance", "keep"],
            # ... and what froze stays frozen (Note [Egeria's freezing decisions]).
            "egeria-firstoff-never": ["egeria", "--freeze-first-phase", "off", "--freeze-unfreeze", "never"],
            # The reference runs only the front unit, on the training model's input to it
            # (the default), or the network from the images (Note [The reference's scope]).
            "egeria-unit": ["egeria", "--freeze-reference-scope", "unit"],
            "egeria-network": ["egeria", "--freeze-reference-scope", "network"],
            "egeria-firstoff-network": ["egeria", "--freeze-first-phase", "off", "--freeze-reference-scope", "network"],
            "egeria-firstoff-never-network": ["egeria", "--freeze-first-phase", "off", "--freeze-unfreeze", "never",
                                              "--freeze-reference-scope", "network"],
            "egeria-firstoff-unit": ["egeria", "--freeze-first-phase", "off", "--freeze-reference-scope", "unit"],
            "egeria-firstoff-never-unit": ["egeria", "--freeze-first-phase", "off", "--freeze-unfreeze", "never",
                                           "--freeze-reference-scope", "unit"],
            "egeria-bnbatch": ["egeria", "--freeze-bn", "batch"],
            "egeria-bnrunning": ["egeria", "--freeze-bn", "running"],
            "egeria-peak-bnbatch": ["egeria", "--freeze-tolerance-from", "peak", "--freeze-bn", "batch"],
            "egeria-peak-lastoff": ["egeria", "--freeze-tolerance-from", "peak", "--freeze-last-phase", "off"],
            "egeria-keep-lastoff": ["egeria", "--freeze-refreeze-tolerance", "keep", "--freeze-last-phase", "off"],
            # The activation cache (§4.3) and what it needs: one crop/flip per sample
            # for the whole run, frozen BatchNorms on running statistics.
            "none-sampleaug": ["none", "--augment-mode", "sample"],
            "egeria-cache": ["egeria", "--freeze-cache", "on", "--freeze-bn", "running", "--augment-mode", "sample"],
            "egeria-peak-cache": ["egeria", "--freeze-tolerance-from", "peak", "--freeze-cache", "on",
                                  "--freeze-bn", "running", "--augment-mode", "sample"],
            # SmartFRZ (the shipped predictor) in its two orders; smartfrz alone is prefix.
            "smartfrz-any": ["smartfrz", "--smartfrz-order", "any"],
            # ... freezing a unit at the first stage that names it, not the second in a row.
            "smartfrz-p1": ["smartfrz", "--smartfrz-patience", "1"],
            "smartfrz-any-p1": ["smartfrz", "--smartfrz-order", "any", "--smartfrz-patience", "1"],
            # ... and every unit a stage names, not one a stage.
            "smartfrz-all": ["smartfrz", "--smartfrz-max-per-stage", "0", "--smartfrz-patience", "1"],
            "smartfrz-any-all": ["smartfrz", "--smartfrz-order", "any", "--smartfrz-max-per-stage", "0",
                                 "--smartfrz-patience", "1"]}


def policy_args(policy):
    """The policy's --freeze value and its extra flags: VARIANTS, and -bootn, -dynamic or -settle0
    appended to any (-settle0: frozen batch norms on running statistics from the freeze on, as before
    --freeze-bn-settle), -s0 to a smartfrz one (its stages from the first, as published:
    --smartfrz-start-below 0)."""
    if policy.startswith("smartfrz") and policy.endswith("-s0"):
        return policy_args(policy[:-len("-s0")]) + ["--smartfrz-start-below", "0"]
    if policy.endswith("-dynamic"):
        return policy_args(policy[:-len("-dynamic")]) + ["--freeze-reference-calibration", "0"]
    if policy.endswith("-bootn"):
        return policy_args(policy[:-len("-bootn")]) + ["--freeze-bootstrap-interval", "n"]
    if policy.endswith("-settle0"):
        return policy_args(policy[:-len("-settle0")]) + ["--freeze-bn-settle", "0"]
    return list(VARIANTS.get(policy, [policy]))


def flag(args, name, default):
    return args[args.index(name) + 1] if name in args else default


def check_scope(out, policy):
    """A stored egeria run is reused only if its reference scope, bootstrapping check and
    reference calibration are the policy's (a run from before --freeze-reference-scope
    existed, or before unit became its default, read with the network; one from before
    --freeze-bootstrap-interval existed checked every n steps; one from before
    --freeze-reference-calibration existed quantised with every batch's own scales; one with
    running batch norms from before --freeze-bn-settle switched at the freeze); a
    stored smartfrz run only if its --smartfrz-max-per-stage, --smartfrz-patience and
    --smartfrz-start-below are (one from before the first froze every unit a stage named,
    one from before the second had a patience of 1, one from before the third ran its
    stages from the first)."""
    args = policy_args(policy)
    if args[0] not in ("egeria", "smartfrz"):
        return
    try:
        with open(os.path.join(out, "config.json")) as f:
            config = json.load(f)
    except (OSError, ValueError):
        return  # no readable config.json: nothing to compare
    if args[0] == "smartfrz":
        # (flag, its default now, its value in runs from before it existed, a policy named for that)
        for name, now, before, example in (("--smartfrz-max-per-stage", 1, 0, "smartfrz-all for 0"),
                                           ("--smartfrz-patience", 2, 1, "smartfrz-p1 for 1"),
                                           ("--smartfrz-start-below", 0.75, 0.0, f"{policy}-s0 for 0")):
            want = type(now)(flag(args, name, str(now)))
            had = config.get(name[2:].replace("-", "_"), before)
            if had != want:
                sys.exit(f"time_to_accuracy: {out} was trained with {name} {had:g}, but the policy "
                         f"'{policy}' asks for {want:g}; name the policy for the value it was run with "
                         f"(e.g. {example}), or use another --out")
        return
    want = flag(args, "--freeze-reference-scope", "unit")
    had = config.get("freeze_reference_scope", "network")
    if had != want:
        sys.exit(f"time_to_accuracy: {out} was trained with --freeze-reference-scope {had}, but the policy "
                 f"'{policy}' asks for {want}; name the policy for the scope it was run with "
                 f"(e.g. egeria-network), or use another --out")
    boot = {"auto": 0, "n": -1}
    want = flag(args, "--freeze-bootstrap-interval", "auto")
    want = boot[want] if want in boot else int(want)
    had = config.get("freeze_bootstrap_interval", -1)
    if had != want:
        name = {0: "auto", -1: "n"}.get(had, str(had))
        sys.exit(f"time_to_accuracy: {out} was trained with --freeze-bootstrap-interval {name}, but the policy "
                 f"'{policy}' asks for another; name the policy for the check it was run with "
                 f"(e.g. {policy}-bootn), or use another --out")
    if flag(args, "--freeze-bn", "batch") == "running":
        want = flag(args, "--freeze-bn-settle", "auto")
        had = str(config.get("freeze_bn_settle", 0))
        if had != want:
            sys.exit(f"time_to_accuracy: {out} was trained with --freeze-bn-settle {had}, but the policy "
                     f"'{policy}' asks for {want}; name the policy for the settling it was run with "
                     f"(e.g. {policy}-settle0 for 0), or use another --out")
    want = int(flag(args, "--freeze-reference-calibration", "3"))
    had = config.get("freeze_reference_calibration", 0)
    if had != want:
        sys.exit(f"time_to_accuracy: {out} was trained with --freeze-reference-calibration {had}, but the policy "
                 f"'{policy}' asks for {want}; name the policy for the calibration it was run with "
                 f"(e.g. {policy}-dynamic for 0), or use another --out")


RECENT_SECONDS = 120  # a run folder written to this recently is taken for a run in progress


def clear_unfinished(out):
    """Deletes the folder of an unfinished run, to run it again from the beginning (its wall
    time is a measurement; egeria refuses a new run over an earlier one's checkpoints), unless a
    file in it changed in the last RECENT_SECONDS: then another process is likely still training
    there (a second script on the same --out), and deleting its folder would kill that run."""
    newest = max((os.path.getmtime(os.path.join(d, f)) for d, _, fs in os.walk(out) for f in fs), default=0)
    age = time.time() - newest
    if age < RECENT_SECONDS:
        sys.exit(f"{out} holds an unfinished run written to {age:.0f} s ago: another process is probably "
                 "still training there. Wait for it to finish, or delete the folder to run it again.")
    shutil.rmtree(out, ignore_errors=True)


def run(args, model, policy, rep=0):
    seed = args.seed + (rep if args.vary_seed else 0)
    out = os.path.join(args.out, f"{model}-{policy}" + (f"-r{rep}" if rep else ""))
    summary = os.path.join(out, "summary.json")
    if os.path.exists(summary):
        check_scope(out, policy)
        return out
    clear_unfinished(out)
    cmd = [args.egeria, "train", "--model", model, "--dataset", "fashion-mnist", "--epochs", str(args.epochs),
           "--threads", str(args.threads), "--seed", str(seed), "--freeze", policy_args(policy)[0],
           "--out", out, "--lr-schedule", "step", "--checkpoint-every", "0"] + policy_args(policy)[1:]
    if args.train_limit:
        cmd += ["--train-limit", str(args.train_limit)]
    if args.data_dir:
        cmd += ["--data-dir", args.data_dir]
    if args.extra:
        cmd += args.extra.split()
    print("+", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL if args.quiet else None)
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--egeria", default="build/egeria")
    p.add_argument("--models", default="resnet20,resnet56")
    p.add_argument("--policies", default="none,egeria,autofreeze,static")
    p.add_argument("--epochs", type=int, default=30)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--train-limit", type=int, default=0)
    p.add_argument("--data-dir", default="")
    p.add_argument("--out", default="runs/tta")
    p.add_argument("--extra", default="", help="extra flags for every run")
    p.add_argument("--quiet", action="store_true")
    p.add_argument("--repeats", type=int, default=1, help="runs per policy, interleaved; times are medians")
    p.add_argument("--vary-seed", action="store_true", help="repeat r runs with seed + r")
    p.add_argument("--step-costs", default="", help="eg_bench_freeze JSON: adds modelled times")
    args = p.parse_args()
    costs = load_step_costs(args.step_costs) if args.step_costs else None
    if not os.path.exists(args.egeria):
        sys.exit(f"time_to_accuracy: {args.egeria} does not exist; build egeria first (tools/test-all or cmake)")
    policies = args.policies.split(",")
    if "none" not in policies:
        policies = ["none"] + policies
    table, per_seed, mean_rows, epoch_lines = [], [], [], []
    for model in args.models.split(","):
        outs = {pol: [] for pol in policies}
        for rep in range(args.repeats):
            for pol in policies:
                outs[pol].append(run(args, model, pol, rep))
        def summaries(pol):
            return [json.load(open(os.path.join(o, "summary.json"))) for o in outs[pol]]

        target = statistics.median(s["final_test_accuracy"] for s in summaries("none"))

        def time_to(out, slack=0.0):
            return time_to_accuracy(out, target - slack)

        def median(v):
            v = sorted(x for x in v if x is not None)
            return statistics.median(v) if v else None

        base_time = median([time_to(o) for o in outs["none"]])
        base_time_near = median([time_to(o, NEAR) for o in outs["none"]])
        if costs:
            base_model = median([modelled_seconds(o, costs)[1] for o in outs["none"]])
            base_model_near = median([modelled_time_to_accuracy(o, target - NEAR, costs) for o in outs["none"]])
        for pol in policies:
            ss = summaries(pol)
            times = [x["train_seconds"] for x in ss]
            finals = [100 * x["final_test_accuracy"] for x in ss]
            tts = [time_to(o) for o in outs[pol]]
            tt = median(tts) if all(t is not None for t in tts) else None
            tns = [time_to(o, NEAR) for o in outs[pol]]
            tn = median(tns) if all(t is not None for t in tns) else None
            table.append({
                "model": model, "policy": pol, "runs": len(outs[pol]),
                "final_acc": statistics.median(finals), "final_acc_all": finals,
                "best_acc": statistics.median(100 * x["best_test_accuracy"] for x in ss),
                "train_seconds": statistics.median(times), "train_seconds_all": times,
                "time_to_baseline_final": tt,
                "speedup_to_target": (base_time / tt) if (tt and base_time) else None,
                "time_to_within_0.3pt": tn,
                "speedup_to_within_0.3pt": (base_time_near / tn) if (tn and base_time_near) else None,
                "wall_speedup": None,
                "frozen_fraction_final": median([x.get("frozen_fraction_final") for x in ss]),
                "backward_flops_saved_fraction": median([x.get("backward_flops_saved_fraction") for x in ss]),
                "reference_overhead_fraction": median([x.get("reference_overhead_fraction") for x in ss]),
                "forward_flops_cached_fraction": median([(x.get("activation_cache") or {}).get(
                    "forward_flops_saved_fraction", 0.0) for x in ss]),
                "evaluations_dropped": sum(x.get("evaluations_dropped") or 0 for x in ss),
            })
            if costs:
                mt = median([modelled_seconds(o, costs)[1] for o in outs[pol]])
                mns = [modelled_time_to_accuracy(o, target - NEAR, costs) for o in outs[pol]]
                mn = median(mns) if all(t is not None for t in mns) else None
                table[-1].update({"modelled_seconds": mt, "modelled_speedup": base_model / mt,
                                  "modelled_time_to_within_0.3pt": mn,
                                  "modelled_speedup_to_within_0.3pt":
                                      (base_model_near / mn) if (mn and base_model_near) else None})
        if len(policies) > 1:
            epoch_lines += ([""] if epoch_lines else []) + epoch_table_lines(model, outs, policies)
        base_wall = next(r["train_seconds"] for r in table if r["model"] == model and r["policy"] == "none")
        for r in table:
            if r["model"] == model:
                r["wall_speedup"] = base_wall / r["train_seconds"]
        if args.vary_seed and args.repeats > 1:
            # The seeds' mean curves: the target is the mean of `none`'s final
            # accuracies less 0.3 pt, reached at the first epoch end where a policy's
            # mean accuracy is there, at its mean time to that epoch end.
            base_curve = mean_curve(outs["none"], costs)
            target_mean = base_curve[-1]["acc"] - NEAR
            for pol in policies:
                cv = mean_curve(outs[pol], costs)
                row = {"model": model, "policy": pol, "runs": len(outs[pol]),
                       "final_acc": 100 * cv[-1]["acc"], "delta_pt": 100 * (cv[-1]["acc"] - base_curve[-1]["acc"]),
                       "wall_speedup": base_curve[-1]["seconds"] / cv[-1]["seconds"]}
                for key, name in (("seconds", "wall"), ("modelled", "modelled")):
                    if key == "modelled" and not costs:
                        continue
                    t, bt = time_on_curve(cv, target_mean, key), time_on_curve(base_curve, target_mean, key)
                    row[f"{name}_to_within_0.3pt"] = t
                    row[f"{name}_speedup_to_within_0.3pt"] = (bt / t) if (t and bt) else None
                row["epoch_within_0.3pt"] = time_on_curve(cv, target_mean, "epoch")
                if costs:
                    row["modelled_speedup"] = base_curve[-1]["modelled"] / cv[-1]["modelled"]
                mean_rows.append(row)
            # Each seed against the `none` run of the same seed: medians over seeds
            # hide that one seed's loss can be another's gain.
            for rep in range(args.repeats):
                base = outs["none"][rep]
                bs = json.load(open(os.path.join(base, "summary.json")))
                base_final = bs["final_test_accuracy"]
                bn = time_to_accuracy(base, base_final - NEAR)
                for pol in policies:
                    o = outs[pol][rep]
                    ps = json.load(open(os.path.join(o, "summary.json")))
                    tn = time_to_accuracy(o, base_final - NEAR)
                    seed = json.load(open(os.path.join(o, "config.json"))).get("seed")
                    per_seed.append({"model": model, "policy": pol, "seed": seed,
                                     "final_acc": 100 * ps["final_test_accuracy"],
                                     "delta_pt": 100 * (ps["final_test_accuracy"] - base_final),
                                     "wall_speedup": bs["train_seconds"] / ps["train_seconds"],
                                     "time_to_within_0.3pt": tn,
                                     "speedup_to_within_0.3pt": (bn / tn) if (bn and tn) else None,
                                     "reference_overhead_fraction": ps.get("reference_overhead_fraction")})
                    if costs:
                        bm = modelled_time_to_accuracy(base, base_final - NEAR, costs)
                        mn = modelled_time_to_accuracy(o, base_final - NEAR, costs)
                        per_seed[-1].update({
                            "modelled_speedup": modelled_seconds(base, costs)[1] / modelled_seconds(o, costs)[1],
                            "modelled_speedup_to_within_0.3pt": (bm / mn) if (bm and mn) else None})
    lines = ["| model | policy | final acc | best acc | train s | time to none's final (s) | speedup to it "
             "| time to within 0.3 pt of it (s) | speedup to that | wall speedup | bwd FLOPs saved | fwd FLOPs cached | ref overhead | dropped |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    f = lambda v, fmt: "n/a" if v is None else fmt.format(v)
    for r in table:
        lines.append(f"| {r['model']} | {r['policy']} | {r['final_acc']:.2f} | {r['best_acc']:.2f} | {r['train_seconds']:.0f} | "
                     f"{f(r['time_to_baseline_final'], '{:.0f}')} | {f(r['speedup_to_target'], '{:.2f}x')} | "
                     f"{f(r['time_to_within_0.3pt'], '{:.0f}')} | {f(r['speedup_to_within_0.3pt'], '{:.2f}x')} | "
                     f"{r['wall_speedup']:.2f}x | {f(r['backward_flops_saved_fraction'], '{:.1%}')} | "
                     f"{f(r['forward_flops_cached_fraction'], '{:.1%}')} | "
                     f"{f(r['reference_overhead_fraction'], '{:.2%}')} | {f(r['evaluations_dropped'], '{}')} |")
    if costs:
        lines += ["", "Modelled from eg_bench_freeze's step times (" + args.step_costs + "), free of this machine's drift:", "",
                  "| model | policy | modelled s | modelled speedup | modelled s to within 0.3 pt | speedup to that |",
                  "|---|---|---|---|---|---|"]
        for r in table:
            lines.append(f"| {r['model']} | {r['policy']} | {r['modelled_seconds']:.0f} | {r['modelled_speedup']:.2f}x | "
                         f"{f(r['modelled_time_to_within_0.3pt'], '{:.0f}')} | "
                         f"{f(r['modelled_speedup_to_within_0.3pt'], '{:.2f}x')} |")
        if set_cost_lines(costs):
            lines += ["", "Step times of frozen sets that are not fronts, measured and as the model has them:", ""]
            lines += set_cost_lines(costs)
    if per_seed:
        lines += ["", "Per seed, against `none` with the same seed:", "",
                  "| model | policy | seed | final acc | Δ (pt) | wall speedup | time to within 0.3 pt (s) | speedup to that | ref overhead |"
                  + (" modelled speedup | modelled, to 0.3 pt |" if costs else ""),
                  "|---|---|---|---|---|---|---|---|---|" + ("---|---|" if costs else "")]
        for r in per_seed:
            lines.append(f"| {r['model']} | {r['policy']} | {r['seed']} | {r['final_acc']:.2f} | {r['delta_pt']:+.2f} | "
                         f"{r['wall_speedup']:.2f}x | {f(r['time_to_within_0.3pt'], '{:.0f}')} | "
                         f"{f(r['speedup_to_within_0.3pt'], '{:.2f}x')} | {f(r['reference_overhead_fraction'], '{:.2%}')} |"
                         + (f" {r['modelled_speedup']:.2f}x | "
                            f"{f(r['modelled_speedup_to_within_0.3pt'], '{:.2f}x')} |" if costs else ""))
    if mean_rows:
        lines += ["", "Mean over the seeds: each policy's test accuracy and times at each epoch end averaged "
                  "over its runs; the target is `none`'s mean final accuracy less 0.3 pt:", "",
                  "| model | policy | runs | mean final acc | Δ (pt) | wall speedup | epoch within 0.3 pt "
                  "| wall speedup to it |" + (" modelled speedup | modelled, to 0.3 pt |" if costs else ""),
                  "|---|---|---|---|---|---|---|---|" + ("---|---|" if costs else "")]
        for r in mean_rows:
            lines.append(f"| {r['model']} | {r['policy']} | {r['runs']} | {r['final_acc']:.2f} | {r['delta_pt']:+.2f} | "
                         f"{r['wall_speedup']:.2f}x | {f(r['epoch_within_0.3pt'], '{}')} | "
                         f"{f(r['wall_speedup_to_within_0.3pt'], '{:.2f}x')} |"
                         + (f" {r['modelled_speedup']:.2f}x | "
                            f"{f(r['modelled_speedup_to_within_0.3pt'], '{:.2f}x')} |" if costs else ""))
    if epoch_lines:
        lines += ["", "Test accuracy at each epoch end (the mean over a policy's runs), its difference from "
                  "`none`'s, and the units frozen then (likewise):", ""] + epoch_lines
    os.makedirs(args.out, exist_ok=True)
    open(os.path.join(args.out, "table.md"), "w").write("\n".join(lines) + "\n")
    json.dump({"medians": table, "per_seed": per_seed, "mean_over_seeds": mean_rows} if per_seed else table,
              open(os.path.join(args.out, "table.json"), "w"), indent=2)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
