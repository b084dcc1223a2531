#!/usr/bin/env python3
"""Algorithm 1 replayed offline on a run's recorded plasticity readings.

  bench/replay_freezing.py RUN [RUN ...] [--window W] [--tolerance C]
      [--tolerance-from first3|peak|auto] [--reading sp-loss|per-lr2|recorded]

RUN is a finished run's folder (config.json and freeze.jsonl, or freeze.jsonl.xz). The
readings a unit gets before it freezes do not depend on the freezing criterion, so the
criterion can be tried again on them without training: this replays Egeria's decisions
(freeze/tracker.cpp: the moving average over W readings, least-squares fits of the last W
full averages, T = C x the largest |slope| of a unit's first 3 fits, or with --tolerance-from
peak of its fits so far, W stale fits in a row freeze it, each unit's readings counted from
the step the unit before it froze) and prints
the step each unit would freeze at, up to the run's first unfreeze. At the run's own W and
C it gives the steps the run froze at; a step earlier than the run's is what the other
criterion would have done, a later one only a bound (the run's readings of a unit stop when
it froze). A run that read every unit throughout (--freeze-lookahead 5 --freeze-tolerance
1e-9, docs/runs/readings-zen4) replays any criterion for every unit.

--reading per-lr2 divides each SP loss by the sum of the squared LRs of the updates between
the reference's snapshot and the reading's capture (Note [Readings per squared learning
rate], freeze/tracker.h), the LRs from config.json's schedule (linear or constant, with a
linear warmup); `recorded` takes the `reading` a per-lr2 run logged.
"""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import modelled_time as mt  # noqa: E402  (its reader of a run's logs, compressed or not)


def fit_slope(ys):
    n = len(ys)
    if n < 2:
        return 0.0
    xm, ym = (n - 1) / 2, sum(ys) / n
    num = sum((i - xm) * (y - ym) for i, y in enumerate(ys))
    return num / sum((i - xm) ** 2 for i in range(n))


def first_freeze(readings, window, coef, peak=False):
    """The step of the reading that freezes a unit, or None: Algorithm 1 on (step, reading)s.
    T is C x the largest |slope| of the first 3 fits, or with peak of every fit so far, the
    current one included (freeze/tracker.cpp's tolerance())."""
    raw, smoothed, first, counter, steepest = [], [], [], 0, 0.0
    for step, p in readings:
        raw.append(p)
        k = min(len(raw), window)
        smoothed.append(sum(raw[-k:]) / k)
        full = len(smoothed) - window + 1 if len(smoothed) >= window else 0
        m = min(full, max(window, 2))
        if m >= 2:
            s = fit_slope(smoothed[-m:])
            if len(first) < 3:
                first.append(abs(s))
                counter = 0
            else:
                steepest = max(steepest, abs(s))
                counter = counter + 1 if abs(s) < coef * max(max(first), steepest if peak else 0) else 0
        if counter >= window:
            return step
    return None


def lr_schedule(cfg, steps_per_epoch):
    """lr_at(k) of optim/schedule.cpp for the run's config: k is the 0-based step. The linear
    schedule (the fine-tuning recipe's), which tests/test_replay_freezing.py checks against
    the engine's logged sums, and the constant one."""
    total, base, warmup = cfg["epochs"] * steps_per_epoch, cfg["lr"], cfg.get("warmup_steps") or 0
    kind = cfg.get("lr_schedule", "step")
    if kind == "linear":
        after = lambda k: base * max(0.0, 1 - k / total)  # noqa: E731
    elif kind == "constant":
        after = lambda k: base  # noqa: E731
    else:
        sys.exit(f"replay_freezing: --reading per-lr2 knows the linear and constant schedules, not '{kind}' "
                 "(a run with --freeze-reading per-lr2 logs its readings: --reading recorded)")
    return lambda k: after(k) * (k + 1) / warmup if k < warmup else after(k)


def events_of(run):
    if not any(os.path.exists(os.path.join(run, n)) for n in ("freeze.jsonl", "freeze.jsonl.xz")):
        sys.exit(f"replay_freezing: {run} has no freeze.jsonl")
    return mt.records_of(run, "freeze.jsonl")


def unit_readings(events, cfg, reading, steps_per_epoch):
    """{unit: [(step, reading)]} up to the run's first unfreeze."""
    lr_at = lr_schedule(cfg, steps_per_epoch) if reading == "per-lr2" else None
    out, refreshed = {}, None
    for e in events:
        if e["type"] == "unfreeze":
            break
        if e["type"] == "refresh":
            refreshed = e["step"]
        if e["type"] != "evaluation":
            continue
        s, p = e["step"], e["plasticity"]
        if reading == "recorded":
            if "reading" not in e:
                sys.exit("replay_freezing: --reading recorded needs a run with --freeze-reading per-lr2")
            p = e["reading"]
        elif reading == "per-lr2":
            # The snapshot of a refresh at step r holds r's update; the capture of step s
            # precedes s's; the update of (1-based) step t ran at lr_at(t - 1).
            own = lr_at(s - 1) ** 2
            between = sum(lr_at(t - 1) ** 2 for t in range(refreshed + 1, s)) if s > refreshed else own
            p /= max(between, own)
        out.setdefault(e["module"], []).append((s, p))
    return out


def replay(run, window=None, coef=None, reading="sp-loss", tolerance_from=None):
    """[(unit, step)] each unit would freeze at, front first, with the run's W, C and T's source
    (first3 or peak) unless given."""
    with open(os.path.join(run, "config.json")) as f:
        cfg = json.load(f)
    spe = cfg["train_limit"] // cfg["batch_size"] if cfg.get("train_limit") else None
    if reading == "per-lr2" and not spe:
        sys.exit("replay_freezing: --reading per-lr2 needs the run's train_limit for its schedule")
    window = window or cfg.get("freeze_window", 10)
    coef = coef or cfg.get("freeze_tolerance", 0.2)
    source = tolerance_from or cfg.get("freeze_tolerance_from", "first3")
    peak = source == "peak" or (source == "auto" and bool(cfg.get("init_from")))  # auto: peak when pretrained
    readings = unit_readings(events_of(run), cfg, reading, spe)
    frozen, start = [], 0
    for unit in sorted(readings):
        step = first_freeze([r for r in readings[unit] if r[0] > start], window, coef, peak)
        if step is None:
            break
        frozen.append((unit, step))
        start = step
    return frozen


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("runs", nargs="+")
    p.add_argument("--window", type=int, default=0, help="W (default: the run's)")
    p.add_argument("--tolerance", type=float, default=0, help="T's coefficient (default: the run's)")
    p.add_argument("--tolerance-from", choices=["first3", "peak", "auto"], default=None,
                   help="T from a unit's first 3 fits or its steepest so far (default: the run's)")
    p.add_argument("--reading", choices=["sp-loss", "per-lr2", "recorded"], default="sp-loss")
    args = p.parse_args()
    for run in args.runs:
        frozen = replay(run, args.window, args.tolerance, args.reading, args.tolerance_from)
        said = ", ".join(f"unit {u} at step {s}" for u, s in frozen) or "nothing"
        print(f"{run}: {said}")


if __name__ == "__main__":
    main()
