#!/usr/bin/env python3
"""bench/replay_freezing.py against the runs kept in docs/runs: replayed at a run's own
settings, Algorithm 1 must freeze where the run froze, and the sums of squared LRs it takes
from the schedule must be the ones the engine logged.

python3 tests/test_replay_freezing.py (ctest: Bench.ReplayFreezing)
"""
import glob
import importlib.util
import json
import os
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
RUNS = os.path.join(HERE, "..", "docs", "runs")
spec = importlib.util.spec_from_file_location("replay_freezing", os.path.join(HERE, "..", "bench", "replay_freezing.py"))
rf = importlib.util.module_from_spec(spec)
spec.loader.exec_module(rf)


def logged_freezes(run):
    """[(unit, step)] of the run's freezes before its first unfreeze."""
    out = []
    for e in rf.events_of(run):
        if e["type"] == "unfreeze":
            break
        if e["type"] == "freeze" and e.get("reason") != "held":
            out.append((e["module"], e["step"]))
    return out


class ReplayFreezing(unittest.TestCase):
    def test_a_run_replayed_at_its_own_settings_freezes_where_it_froze(self):
        runs = [r for pattern in ("ft-*/*-egeria", "ft-*/*-egeria-tol0.5", "ft-*/*-egeria-bnb", "ft-*/*-egeria-peak",
                                  "ft-*/*-egeria-bnr-peak", "ft-*/*-egeria-cache-peak-v4")
                for r in sorted(glob.glob(os.path.join(RUNS, pattern))) if os.path.exists(os.path.join(r, "summary.json"))]
        self.assertGreater(len(runs), 15)
        froze = 0
        for run in runs:
            with self.subTest(run=os.path.relpath(run, RUNS)):
                logged = logged_freezes(run)
                self.assertEqual(rf.replay(run), logged)
                froze += bool(logged)
        self.assertGreater(froze, 10, "too few of the runs froze anything to test the replay on")

    def test_per_lr2_from_the_schedule_is_what_the_engine_divided_by(self):
        runs = sorted(glob.glob(os.path.join(RUNS, "ft-*", "*-egeria-bnb-lr2")))
        self.assertGreaterEqual(len(runs), 10)
        for run in runs:
            with self.subTest(run=os.path.relpath(run, RUNS)):
                with open(os.path.join(run, "config.json")) as f:
                    cfg = json.load(f)
                spe = cfg["train_limit"] // cfg["batch_size"]
                events = rf.events_of(run)
                ours = rf.unit_readings(events, cfg, "per-lr2", spe)
                logged = rf.unit_readings(events, cfg, "recorded", spe)
                self.assertEqual(sorted(ours), sorted(logged))
                for unit in logged:
                    self.assertEqual([s for s, _ in ours[unit]], [s for s, _ in logged[unit]])
                    for (s, a), (_, b) in zip(ours[unit], logged[unit]):
                        self.assertAlmostEqual(a / b, 1.0, delta=1e-9, msg=f"unit {unit} step {s}")
                self.assertEqual(rf.replay(run, reading="per-lr2"), logged_freezes(run))

    def test_readings_recorded_through_a_whole_run_replay_the_trained_criterion(self):
        # Every unit read and nothing frozen; per squared LR at the default T the front
        # freezes at the step the trained per-lr2 run froze it (its readings until then are
        # the same run's: same seed, same batches).
        for seed in (0, 1, 2):
            recorded = os.path.join(RUNS, "readings-zen4", f"resnet20-b6000-s{seed}-batch")
            trained = os.path.join(RUNS, "ft-r20-zen4", f"resnet20-b6000-s{seed}-egeria-bnb-lr2")
            with self.subTest(seed=seed):
                self.assertEqual(rf.replay(recorded), [], "the recording froze nothing at its own T")
                front = rf.replay(recorded, coef=0.2, reading="per-lr2")[0]
                self.assertEqual(front, logged_freezes(trained)[0])

    def test_a_unit_that_settles_freezes_and_one_that_keeps_slowing_does_not(self):
        settles = [(i, 1.0 + 9.0 * 0.8 ** i) for i in range(200)]
        step = rf.first_freeze(settles, 5, 0.2)
        self.assertIsNotNone(step)
        self.assertGreater(step, 10)
        slows = [(i, 1000.0 - 5.0 * i) for i in range(200)]  # the same slope throughout
        self.assertIsNone(rf.first_freeze(slows, 5, 0.2))

    def test_t_from_the_steepest_fit_so_far_freezes_a_unit_whose_first_fits_were_flat(self):
        # Flat first fits (a pretrained unit), then a rise, then as flat as at first: T from the
        # first 3 fits is under the flat part's slope for good, T from the steepest is not.
        ys = [0.01 * i for i in range(15)] + [0.15 + 1.0 * i for i in range(10)]
        ys += [ys[-1] + 0.01 * i for i in range(1, 60)]
        readings = list(enumerate(ys))
        self.assertIsNone(rf.first_freeze(readings, 5, 0.2))
        step = rf.first_freeze(readings, 5, 0.2, peak=True)
        self.assertIsNotNone(step)
        self.assertGreater(step, 25)


if __name__ == "__main__":
    unittest.main()
