"""A finished run's logs read back, and its training time modelled from measured step costs.

The readers of a run folder's metrics.jsonl and freeze.jsonl (kept runs' .xz too) and of the
machine it ran on (wall times compare only within one), and the time
model bench/time_to_accuracy.py describes under --step-costs: each step priced at
eg_bench_freeze's median cost of a step with the units frozen then (the activation cache's
served share of each epoch at the cached cost), times 1 + the run's reference overhead. Used by
time_to_accuracy.py, fine_tune.py and replay_freezing.py.
"""
import bisect
import functools
import json
import lzma
import os
import re
import statistics
import sys

@functools.lru_cache(maxsize=None)
def records_of(out, name="metrics.jsonl"):
    """A run's metrics.jsonl, or another of its JSON-lines logs (freeze.jsonl), or, for a run
    kept compressed, its NAME.xz, read once: the table asks for each run several times."""
    path = os.path.join(out, name)
    if not os.path.exists(path) and os.path.exists(path + ".xz"):
        with lzma.open(path + ".xz", "rt") as f:
            return tuple(json.loads(line) for line in f)
    with open(path) as f:
        return tuple(json.loads(line) for line in f)


def epochs_of(out):
    return [r for r in records_of(out) if r.get("type") == "epoch"]


def time_to_accuracy(out, acc):
    """Training seconds at the first epoch end with test accuracy >= acc, or None."""
    return next((e["train_seconds"] for e in epochs_of(out) if e["test_accuracy"] >= acc - 1e-12), None)


def machine_of(out):
    """The machine a finished run ran on, (host, boot id) from its summary.json's `machine`; None
    for a run from before summary.json named it (2026-12-07)."""
    try:
        with open(os.path.join(out, "summary.json")) as f:
            m = json.load(f).get("machine")
    except (OSError, ValueError):
        return None
    return (m.get("host"), m.get("boot_id")) if m else None


def same_machine(a, b):
    """Whether two runs ran on one machine in one boot, so that their wall times compare: None
    where neither says (runs from before), False where only one does (made with builds of
    different days, on this project's fresh VMs another machine)."""
    ma, mb = machine_of(a), machine_of(b)
    return None if ma is None and mb is None else ma == mb


def frozen_records(out):
    """[(step, the units frozen after it, a sorted tuple)] from the run's step records (every
    --log-every steps): a front is its frozen_modules; a set that is not one (--freeze
    smartfrz --smartfrz-order any, --static-units) its frozen_units."""
    steps = [r for r in records_of(out) if r.get("type") == "step"]
    return [(r["step"], tuple(sorted(r["frozen_units"])) if "frozen_units" in r
             else tuple(range(r.get("frozen_modules", 0)))) for r in steps]


def prefix_of(units):
    """How many of the front units a sorted tuple of frozen units holds."""
    k = 0
    while k < len(units) and units[k] == k:
        k += 1
    return k


def load_step_costs(path):
    """{(cached, model, k): seconds} from eg_bench_freeze's Google Benchmark JSON, and
    {("set", model, units): seconds} for its TrainStepFrozenSet sets (units:3, units:1-4)."""
    scale = {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1.0}
    costs, seen = {}, {}
    for b in json.load(open(path))["benchmarks"]:
        name = b.get("run_name", b["name"])
        m = re.match(r"(TrainStepFrozen|TrainStepFrozenCached)/(\w+)/k:(\d+)", name)
        ms = re.match(r"TrainStepFrozenSet/(\w+)/units:(\d+)(?:-(\d+))?", name)
        if (not m and not ms) or b.get("error_occurred"):
            continue
        if m:
            key = (m.group(1) == "TrainStepFrozenCached", m.group(2), int(m.group(3)))
        else:
            lo = int(ms.group(2))
            key = ("set", ms.group(1), tuple(range(lo, int(ms.group(3) or lo) + 1)))
        t = b["real_time"] * scale[b.get("time_unit", "ns")]
        if b.get("run_type") == "aggregate":
            if b.get("aggregate_name") == "median":
                costs[key] = t
        else:
            seen.setdefault(key, []).append(t)
    for key, ts in seen.items():
        costs.setdefault(key, statistics.median(ts))
    if not any(k[0] != "set" for k in costs):
        sys.exit(f"modelled_time: {path} holds no TrainStepFrozen benchmark; "
                 "it should be the JSON output of eg_bench_freeze")
    return costs


def step_cost(costs, model, units, cached=False):
    """Modelled seconds of one step with `units` (a sorted tuple) frozen. A front of k units
    is eg_bench_freeze's k. A unit frozen behind trainable ones still runs its backward to
    its input and skips only its weight gradients and update, so it saves half of what it
    saves as the last unit of a front (the halving of Note [Backward FLOPs a frozen set
    saves], freeze/policy.h): cost(k) - 1/2 sum over such u of (cost(u) - cost(u + 1)),
    with k the set's front. set_cost_lines sets this beside the measured sets."""
    def cost(k, cache):
        key = (cache and k > 0, model, k)
        if key not in costs:
            sys.exit(f"modelled_time: the step costs have no {'cached ' if key[0] else ''}{model} step "
                     f"with {k} units frozen; rerun eg_bench_freeze for {model}")
        return costs[key]

    k = prefix_of(units)
    return cost(k, cached) - 0.5 * sum(cost(u, False) - cost(u + 1, False) for u in units[k:])


def set_cost_lines(costs):
    """Markdown rows: each TrainStepFrozenSet set's measured step time beside step_cost's."""
    sets = sorted(k for k in costs if k[0] == "set")
    if not sets:
        return []
    lines = ["| model | frozen units | measured ms | modelled ms | modelled / measured |", "|---|---|---|---|---|"]
    for _, model, units in sets:
        t, mt = costs[("set", model, units)], step_cost(costs, model, units)
        label = str(units[0]) if len(units) == 1 else f"{units[0]}-{units[-1]}"
        lines.append(f"| {model} | {label} | {1e3 * t:.1f} | {1e3 * mt:.1f} | {mt / t:.3f} |")
    return lines


def cache_hit_shares(out):
    """{epoch-end step: the share of the epoch's cached samples served from the activation cache}
    from the epoch records' cache_hit_samples / cache_miss_samples (runs since 2026-12-06; 0 for
    an epoch that used the cache for nothing). A sample computed from the entries of a shorter
    prefix (cache_lower_samples) counts as served for the share of the prefix's forward it
    skipped (cache_lower_forward_skipped), as computed for the rest. None for a run without the
    cache or from before, whose frozen steps are all taken as served."""
    epochs = epochs_of(out)
    if not epochs or "cache_hit_samples" not in epochs[-1]:
        return None

    def share(e):
        hits, lower = e["cache_hit_samples"], e.get("cache_lower_samples", 0)
        served = hits + lower * e.get("cache_lower_forward_skipped", 0.0)
        return served / max(1, hits + lower + e["cache_miss_samples"])
    return {e["step"]: share(e) for e in epochs}


def modelled_seconds(out, costs):
    """({epoch-end step: modelled training seconds to it}, modelled seconds in all). With the
    activation cache, a step with a front frozen costs the cached step for the share of its
    epoch's samples the cache served (cache_hit_shares), the recomputing frozen step for the rest."""
    summary = json.load(open(os.path.join(out, "summary.json")))
    model = summary["model"]
    cached = bool(summary.get("activation_cache"))
    hits = cache_hit_shares(out) if cached else None
    frozen_at = frozen_records(out)
    epoch_steps = {r["step"] for r in epochs_of(out)}
    overhead = 1.0 + (summary.get("reference_overhead_fraction") or 0.0)
    total, units, i, marks, memo = 0.0, (), 0, {}, {}
    last = max(epoch_steps, default=0)
    ends = sorted(epoch_steps)
    for step in range(1, last + 1):
        if units not in memo:
            memo[units] = (step_cost(costs, model, units, cached),
                           step_cost(costs, model, units, False) if cached else 0.0)
        served, computed = memo[units]
        if hits is None:
            total += served
        else:
            share = hits[ends[bisect.bisect_left(ends, step)]]  # the epoch the step is in
            total += share * served + (1 - share) * computed
        if step in epoch_steps:
            marks[step] = total * overhead
        while i < len(frozen_at) and frozen_at[i][0] <= step:
            units = frozen_at[i][1]
            i += 1
    return marks, total * overhead


def modelled_time_to_accuracy(out, acc, costs):
    marks, _ = modelled_seconds(out, costs)
    return next((marks[e["step"]] for e in epochs_of(out) if e["test_accuracy"] >= acc - 1e-12), None)


def mean_curve(outs, costs=None):
    """The runs' test accuracy, training seconds and (with costs) modelled seconds at each
    epoch end, averaged over the runs (seeds): [{"epoch", "acc", "seconds", "modelled"}].
    A single run's accuracy at one epoch end is noisy (the 10,000 test images alone give
    it a standard error of about 0.27 pt at 92%), as much as the 0.3 pt band."""
    runs = [epochs_of(o) for o in outs]
    n = min(len(r) for r in runs)
    marks = [modelled_seconds(o, costs)[0] for o in outs] if costs else None
    curve = []
    for i in range(n):
        curve.append({"epoch": i + 1,
                      "acc": statistics.fmean(r[i]["test_accuracy"] for r in runs),
                      "seconds": statistics.fmean(r[i]["train_seconds"] for r in runs),
                      "modelled": (statistics.fmean(m[r[i]["step"]] for m, r in zip(marks, runs))
                                   if costs else None)})
    return curve


def frozen_at_epoch_ends(out):
    """The number of units frozen at each epoch end: the last step record's at or before it."""
    steps = frozen_records(out)
    ks, i, k = [], 0, 0
    for e in epochs_of(out):
        while i < len(steps) and steps[i][0] <= e["step"]:
            k = len(steps[i][1])
            i += 1
        ks.append(k)
    return ks


def epoch_table_lines(model, outs, policies):
    """Markdown rows: each policy's test accuracy at each epoch end (mean over its runs), its
    difference from `none`'s, and the units frozen then (mean over the runs): where a
    policy falls behind, and what it had frozen when it did."""
    curves = {pol: mean_curve(outs[pol]) for pol in policies}
    frozen = {pol: [frozen_at_epoch_ends(o) for o in outs[pol]] for pol in policies}
    others = [pol for pol in policies if pol != "none"]
    lines = [f"| {model}: epoch | none | " + " | ".join(f"{pol}: acc (Δ), units frozen" for pol in others) + " |",
             "|---|---|" + "---|" * len(others)]
    for i, base in enumerate(curves["none"]):
        cells = []
        for pol in others:
            if i >= len(curves[pol]):
                cells.append("")
                continue
            ks = [fr[i] for fr in frozen[pol] if i < len(fr)]
            k = statistics.fmean(ks)
            cells.append(f"{100 * curves[pol][i]['acc']:.2f} ({100 * (curves[pol][i]['acc'] - base['acc']):+.2f}), "
                         + (f"{k:.0f}" if k == int(k) else f"{k:.1f}"))
        lines.append(f"| {i + 1} | {100 * base['acc']:.2f} | " + " | ".join(cells) + " |")
    return lines


def time_on_curve(curve, acc, key):
    """curve[key] at the first epoch end whose accuracy is >= acc, or None."""
    return next((c[key] for c in curve if c["acc"] >= acc - 1e-12), None)
