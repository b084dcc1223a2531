#!/usr/bin/env python3
"""bench/time_to_accuracy.py's modelled times, its mean curves over seeds, its epoch table, and its reuse of
stored runs, on hand-made run folders.

python3 tests/test_time_to_accuracy.py (ctest: Bench.TimeToAccuracyModelledTimes)
"""
import importlib.util
import json
import lzma
import os
import shutil
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
spec = importlib.util.spec_from_file_location("tta", os.path.join(HERE, "..", "bench", "time_to_accuracy.py"))
tta = importlib.util.module_from_spec(spec)
spec.loader.exec_module(tta)
import modelled_time as mt  # noqa: E402  (bench/, on the path time_to_accuracy.py gives)


def bench_entry(kind, model, k, ms, aggregate=None):
    e = {"name": f"{kind}/{model}/k:{k}" + (f"_{aggregate}" if aggregate else ""),
         "run_name": f"{kind}/{model}/k:{k}", "real_time": ms, "time_unit": "ms",
         "run_type": "aggregate" if aggregate else "iteration"}
    if aggregate:
        e["aggregate_name"] = aggregate
    return e


class ModelledTimes(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        self.costs_path = os.path.join(self.dir.name, "costs.json")
        # Medians of repetitions, with means that must be ignored; the cached k=1 step
        # as plain iterations, whose median is taken.
        b = [bench_entry("TrainStepFrozen", "resnet20", 0, 100, "median"),
             bench_entry("TrainStepFrozen", "resnet20", 0, 999, "mean"),
             bench_entry("TrainStepFrozen", "resnet20", 1, 50, "median"),
             bench_entry("TrainStepFrozen", "resnet20", 1, 999, "mean"),
             bench_entry("TrainStepFrozenCached", "resnet20", 1, 30),
             bench_entry("TrainStepFrozenCached", "resnet20", 1, 10),
             bench_entry("TrainStepFrozenCached", "resnet20", 1, 20)]
        json.dump({"context": {}, "benchmarks": b}, open(self.costs_path, "w"))

    def tearDown(self):
        self.dir.cleanup()

    def make_run(self, name, frozen, accuracies, overhead=0.1, cached=False, served=None):
        """Four steps an epoch, a step record every 2 steps: frozen[i] units after step 2(i+1),
        a front of that many, or a list: a set as the trainer writes one that is not a front.
        served: each epoch's (samples from the cache, samples computed), as a cached run logs them."""
        out = os.path.join(self.dir.name, name)
        os.makedirs(out)
        with open(os.path.join(out, "metrics.jsonl"), "w") as f:
            for i, k in enumerate(frozen):
                step = 2 * (i + 1)
                r = {"type": "step", "step": step, "frozen_modules": k, "train_seconds": step}
                if isinstance(k, list):
                    r = {"type": "step", "step": step, "frozen_modules": mt.prefix_of(tuple(k)), "frozen_units": k,
                         "train_seconds": step}
                f.write(json.dumps(r) + "\n")
                if step % 4 == 0:
                    e = {"type": "epoch", "step": step, "test_accuracy": accuracies[step // 4 - 1],
                         "train_seconds": step}
                    if served:
                        e["cache_hit_samples"], e["cache_miss_samples"] = served[step // 4 - 1][:2]
                        if len(served[step // 4 - 1]) > 2:
                            e["cache_lower_samples"], e["cache_lower_forward_skipped"] = served[step // 4 - 1][2:]
                    f.write(json.dumps(e) + "\n")
        summary = {"model": "resnet20", "reference_overhead_fraction": overhead}
        if cached:
            summary["activation_cache"] = {"forward_flops_saved_fraction": 0.5}
        json.dump(summary, open(os.path.join(out, "summary.json"), "w"))
        return out

    def test_costs_are_the_medians(self):
        costs = mt.load_step_costs(self.costs_path)
        self.assertAlmostEqual(costs[(False, "resnet20", 0)], 0.100)
        self.assertAlmostEqual(costs[(False, "resnet20", 1)], 0.050)
        self.assertAlmostEqual(costs[(True, "resnet20", 1)], 0.020)

    def test_each_step_costs_the_prefix_frozen_before_it(self):
        costs = mt.load_step_costs(self.costs_path)
        # Steps 1-2 nothing frozen; one unit from step 2's record to step 6's; steps 7-8 none.
        out = self.make_run("egeria", [1, 1, 0, 0], [0.5, 0.9])
        marks, total = mt.modelled_seconds(out, costs)
        self.assertAlmostEqual(marks[4], (2 * 0.1 + 2 * 0.05) * 1.1)
        self.assertAlmostEqual(total, (2 * 0.1 + 4 * 0.05 + 2 * 0.1) * 1.1)
        self.assertAlmostEqual(mt.modelled_time_to_accuracy(out, 0.5, costs), marks[4])
        self.assertAlmostEqual(mt.modelled_time_to_accuracy(out, 0.8, costs), total)
        self.assertIsNone(mt.modelled_time_to_accuracy(out, 0.95, costs))

    def test_a_run_kept_compressed_reads_the_same(self):
        """A run kept in docs/runs has its metrics as metrics.jsonl.xz only."""
        costs = mt.load_step_costs(self.costs_path)
        out = self.make_run("plain", [1, 1, 0, 0], [0.5, 0.9])
        kept = shutil.copytree(out, os.path.join(self.dir.name, "kept"))
        with open(os.path.join(kept, "metrics.jsonl"), "rb") as f, \
                lzma.open(os.path.join(kept, "metrics.jsonl.xz"), "wb") as z:
            z.write(f.read())
        os.remove(os.path.join(kept, "metrics.jsonl"))
        self.assertEqual(mt.records_of(kept), mt.records_of(out))
        self.assertEqual(mt.modelled_seconds(kept, costs), mt.modelled_seconds(out, costs))

    def test_a_cached_run_costs_the_cached_steps(self):
        costs = mt.load_step_costs(self.costs_path)
        out = self.make_run("cached", [1, 1, 1, 1], [0.5, 0.9], overhead=0.0, cached=True)
        _, total = mt.modelled_seconds(out, costs)
        self.assertAlmostEqual(total, 2 * 0.1 + 6 * 0.02)

    def test_a_cached_step_costs_the_share_of_its_epoch_the_cache_served(self):
        """A sample the cache has not yet stored (the epoch after the freeze; another of its
        --augment-variants) is computed: its step's share costs the recomputing frozen step."""
        costs = mt.load_step_costs(self.costs_path)
        out = self.make_run("variants", [1, 1, 1, 1], [0.5, 0.9], overhead=0.0, cached=True,
                            served=[(0, 100), (75, 25)])
        _, total = mt.modelled_seconds(out, costs)
        self.assertAlmostEqual(total, 2 * 0.1 + 2 * 0.05 + 4 * (0.75 * 0.02 + 0.25 * 0.05))

    def test_a_sample_from_a_shorter_prefixs_entry_costs_by_the_forward_it_skipped(self):
        """40 samples computed from the entries of a prefix with half the front's forward:
        each counts as half served, half computed."""
        costs = mt.load_step_costs(self.costs_path)
        out = self.make_run("lower", [1, 1, 1, 1], [0.5, 0.9], overhead=0.0, cached=True,
                            served=[(0, 100), (40, 20, 40, 0.5)])
        _, total = mt.modelled_seconds(out, costs)
        self.assertAlmostEqual(total, 2 * 0.1 + 2 * 0.05 + 4 * (0.6 * 0.02 + 0.4 * 0.05))

    def test_a_prefix_the_benchmark_lacks_is_named(self):
        costs = mt.load_step_costs(self.costs_path)
        out = self.make_run("deep", [2, 2, 2, 2], [0.5, 0.9])
        with self.assertRaises(SystemExit) as e:
            mt.modelled_seconds(out, costs)
        self.assertIn("resnet20 step with 2 units frozen", str(e.exception))

    def test_a_set_behind_trainable_units_saves_half_their_share(self):
        """Unit 2 behind trainable 1 saves half of what it saves as the last of a front of 3;
        unit 0 frozen with it is a front of one, at its measured cost."""
        path = os.path.join(self.dir.name, "costs4.json")
        b = [bench_entry("TrainStepFrozen", "resnet20", k, ms, "median") for k, ms in enumerate([100, 80, 70, 40])]
        b += [{"name": "TrainStepFrozenSet/resnet20/units:2_median", "run_name": "TrainStepFrozenSet/resnet20/units:2",
               "real_time": 90, "time_unit": "ms", "run_type": "aggregate", "aggregate_name": "median"},
              {"name": "TrainStepFrozenSet/resnet20/units:1-2", "run_name": "TrainStepFrozenSet/resnet20/units:1-2",
               "real_time": 70, "time_unit": "ms", "run_type": "iteration"}]
        json.dump({"benchmarks": b}, open(path, "w"))
        costs = mt.load_step_costs(path)
        self.assertAlmostEqual(costs[("set", "resnet20", (2,))], 0.090)
        self.assertAlmostEqual(costs[("set", "resnet20", (1, 2))], 0.070)
        self.assertAlmostEqual(mt.step_cost(costs, "resnet20", (2,)), 0.100 - 0.5 * 0.030)
        self.assertAlmostEqual(mt.step_cost(costs, "resnet20", (0, 2)), 0.080 - 0.5 * 0.030)
        self.assertAlmostEqual(mt.step_cost(costs, "resnet20", (1, 2)), 0.100 - 0.5 * (0.010 + 0.030))
        self.assertAlmostEqual(mt.step_cost(costs, "resnet20", (0, 1, 2)), 0.040)
        out = self.make_run("any", [[2], [2], [0, 2], [0, 2]], [0.5, 0.9], overhead=0.0)
        _, total = mt.modelled_seconds(out, costs)
        self.assertAlmostEqual(total, 2 * 0.100 + 2 * 0.085 + 2 * 0.085 + 2 * 0.065)
        self.assertEqual(mt.frozen_at_epoch_ends(out), [1, 2])
        lines = mt.set_cost_lines(costs)
        self.assertIn("| resnet20 | 2 | 90.0 | 85.0 | 0.944 |", lines)
        self.assertIn("| resnet20 | 1-2 | 70.0 | 80.0 | 1.143 |", lines)

    def test_a_file_without_the_benchmark_is_refused(self):
        path = os.path.join(self.dir.name, "other.json")
        json.dump({"benchmarks": [bench_entry("BM_Conv", "x", 0, 1.0)]}, open(path, "w"))
        with self.assertRaises(SystemExit) as e:
            mt.load_step_costs(path)
        self.assertIn("eg_bench_freeze", str(e.exception))


    def test_the_mean_curve_averages_the_seeds_at_each_epoch_end(self):
        costs = mt.load_step_costs(self.costs_path)
        a = self.make_run("seed0", [0, 0, 0, 0], [0.50, 0.90])
        b = self.make_run("seed1", [1, 1, 1, 1], [0.70, 0.94])
        curve = mt.mean_curve([a, b], costs)
        self.assertEqual([c["epoch"] for c in curve], [1, 2])
        self.assertAlmostEqual(curve[0]["acc"], 0.60)
        self.assertAlmostEqual(curve[1]["acc"], 0.92)
        self.assertAlmostEqual(curve[1]["seconds"], 8)  # both runs' epoch 2 ends at "8 s"
        # seed0: 8 steps at 0.1; seed1: 2 steps at 0.1 and 6 at 0.05 (frozen from step 2).
        self.assertAlmostEqual(curve[1]["modelled"], (0.8 * 1.1 + (0.2 + 0.3) * 1.1) / 2)
        # Reached where the mean is, not where one seed alone is: 0.90 at epoch 2 only.
        self.assertEqual(mt.time_on_curve(curve, 0.65, "epoch"), 2)
        self.assertAlmostEqual(mt.time_on_curve(curve, 0.60, "seconds"), 4)
        self.assertIsNone(mt.time_on_curve(curve, 0.93, "epoch"))
        self.assertIsNone(mt.mean_curve([a])[0]["modelled"])  # no costs, no modelled times

    def test_the_epoch_table_shows_each_epochs_accuracy_difference_and_freezes(self):
        none = self.make_run("none", [0, 0, 0, 0], [0.50, 0.90])
        # Frozen after step 2, unfrozen after step 6: one unit at epoch 1's end, none at 2's.
        eg = self.make_run("eg", [1, 1, 0, 0], [0.55, 0.85])
        eg2 = self.make_run("eg2", [0, 0, 1, 1], [0.45, 0.85])
        self.assertEqual(mt.frozen_at_epoch_ends(eg), [1, 0])
        lines = mt.epoch_table_lines("resnet20", {"none": [none], "egeria": [eg, eg2]}, ["none", "egeria"])
        self.assertEqual(lines[0], "| resnet20: epoch | none | egeria: acc (Δ), units frozen |")
        self.assertEqual(lines[2], "| 1 | 50.00 | 50.00 (+0.00), 0.5 |")
        self.assertEqual(lines[3], "| 2 | 90.00 | 85.00 (-5.00), 0.5 |")
        lines = mt.epoch_table_lines("resnet20", {"none": [none], "egeria": [eg]}, ["none", "egeria"])
        self.assertEqual(lines[2:], ["| 1 | 50.00 | 55.00 (+5.00), 1 |", "| 2 | 90.00 | 85.00 (-5.00), 0 |"])


class StoredRunScope(unittest.TestCase):
    """A stored egeria run is reused only under a policy with its reference scope and
    bootstrapping check."""

    def run_dir(self, config):
        d = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, d)
        if config is not None:
            json.dump(config, open(os.path.join(d, "config.json"), "w"))
        return d

    def test_a_run_from_before_the_flag_read_with_the_network(self):
        old = self.run_dir({"freeze": "egeria"})
        with self.assertRaises(SystemExit) as e:
            tta.check_scope(old, "egeria")
        self.assertIn("--freeze-reference-scope network", str(e.exception))
        tta.check_scope(old, "egeria-network-bootn-dynamic")
        tta.check_scope(old, "autofreeze")  # no reference

    def test_a_run_from_before_the_bootstrapping_flag_checked_every_n(self):
        old = self.run_dir({"freeze": "egeria", "freeze_reference_scope": "unit"})
        with self.assertRaises(SystemExit) as e:
            tta.check_scope(old, "egeria-firstoff-never-unit")
        self.assertIn("--freeze-bootstrap-interval n", str(e.exception))
        self.assertIn("egeria-firstoff-never-unit-bootn", str(e.exception))
        tta.check_scope(old, "egeria-firstoff-never-unit-bootn-dynamic")
        self.assertEqual(tta.policy_args("egeria-firstoff-bootn"),
                         ["egeria", "--freeze-first-phase", "off", "--freeze-bootstrap-interval", "n"])
        with self.assertRaises(SystemExit):
            tta.check_scope(self.run_dir({"freeze": "egeria", "freeze_reference_scope": "unit",
                                          "freeze_bootstrap_interval": 0}), "egeria-bootn")

    def test_a_run_from_before_the_calibration_flag_used_per_batch_scales(self):
        old = self.run_dir({"freeze": "egeria", "freeze_reference_scope": "unit", "freeze_bootstrap_interval": 0})
        with self.assertRaises(SystemExit) as e:
            tta.check_scope(old, "egeria")
        self.assertIn("--freeze-reference-calibration 0", str(e.exception))
        self.assertIn("egeria-dynamic", str(e.exception))
        tta.check_scope(old, "egeria-dynamic")
        self.assertEqual(tta.policy_args("egeria-keep-bootn-dynamic"),
                         ["egeria", "--freeze-refreeze-tolerance", "keep", "--freeze-bootstrap-interval", "n",
                          "--freeze-reference-calibration", "0"])

    def test_a_cached_run_from_before_settling_switched_at_the_freeze(self):
        old = self.run_dir({"freeze": "egeria", "freeze_reference_scope": "unit", "freeze_bootstrap_interval": 0,
                            "freeze_reference_calibration": 3, "freeze_bn": "running"})
        with self.assertRaises(SystemExit) as e:
            tta.check_scope(old, "egeria-cache")
        self.assertIn("egeria-cache-settle0", str(e.exception))
        tta.check_scope(old, "egeria-cache-settle0")
        self.assertEqual(tta.policy_args("egeria-bnrunning-settle0")[-2:], ["--freeze-bn-settle", "0"])
        new = self.run_dir({"freeze": "egeria", "freeze_reference_scope": "unit", "freeze_bootstrap_interval": 0,
                            "freeze_reference_calibration": 3, "freeze_bn": "running", "freeze_bn_settle": "auto"})
        tta.check_scope(new, "egeria-cache")
        tta.check_scope(new, "egeria")  # batch statistics: nothing settles, nothing to compare

    def test_a_unit_run_is_the_default_egeria(self):
        new = self.run_dir({"freeze": "egeria", "freeze_reference_scope": "unit", "freeze_bootstrap_interval": 0,
                            "freeze_reference_calibration": 3})
        tta.check_scope(new, "egeria")
        tta.check_scope(new, "egeria-firstoff-never-unit")
        with self.assertRaises(SystemExit):
            tta.check_scope(new, "egeria-firstoff-never-network")
        tta.check_scope(self.run_dir(None), "egeria")  # nothing to compare

    def test_a_smartfrz_run_from_before_the_limit_froze_every_named_unit(self):
        old = self.run_dir({"freeze": "smartfrz"})
        with self.assertRaises(SystemExit) as e:
            tta.check_scope(old, "smartfrz-s0")
        self.assertIn("--smartfrz-max-per-stage 0", str(e.exception))
        self.assertIn("smartfrz-all", str(e.exception))
        tta.check_scope(old, "smartfrz-all-s0")
        tta.check_scope(old, "smartfrz-any-all-s0")
        one = self.run_dir({"freeze": "smartfrz", "smartfrz_max_per_stage": 1, "smartfrz_order": "any"})
        tta.check_scope(one, "smartfrz-any-p1-s0")
        with self.assertRaises(SystemExit):
            tta.check_scope(one, "smartfrz-any-all-s0")

    def test_a_smartfrz_run_from_before_patience_named_at_one_stage(self):
        old = self.run_dir({"freeze": "smartfrz", "smartfrz_max_per_stage": 1})
        tta.check_scope(old, "smartfrz-p1-s0")
        with self.assertRaises(SystemExit) as e:
            tta.check_scope(old, "smartfrz-s0")
        self.assertIn("--smartfrz-patience 1", str(e.exception))
        self.assertIn("smartfrz-p1", str(e.exception))
        two = self.run_dir({"freeze": "smartfrz", "smartfrz_max_per_stage": 1, "smartfrz_patience": 2})
        tta.check_scope(two, "smartfrz-s0")
        tta.check_scope(two, "smartfrz-any-s0")
        with self.assertRaises(SystemExit):
            tta.check_scope(two, "smartfrz-any-p1-s0")

    def test_a_smartfrz_run_from_before_the_wait_ran_its_stages_from_the_first(self):
        self.assertEqual(tta.policy_args("smartfrz-any-s0"),
                         ["smartfrz", "--smartfrz-order", "any", "--smartfrz-start-below", "0"])
        self.assertEqual(tta.policy_args("smartfrz-p1-s0")[-2:], ["--smartfrz-start-below", "0"])
        old = self.run_dir({"freeze": "smartfrz", "smartfrz_max_per_stage": 1, "smartfrz_patience": 2})
        with self.assertRaises(SystemExit) as e:
            tta.check_scope(old, "smartfrz")
        self.assertIn("--smartfrz-start-below 0,", str(e.exception))
        self.assertIn("smartfrz-s0", str(e.exception))
        waits = self.run_dir({"freeze": "smartfrz", "smartfrz_max_per_stage": 1, "smartfrz_patience": 2,
                              "smartfrz_start_below": 0.75})
        tta.check_scope(waits, "smartfrz")
        tta.check_scope(waits, "smartfrz-any")
        with self.assertRaises(SystemExit):
            tta.check_scope(waits, "smartfrz-s0")


class UnfinishedRuns(unittest.TestCase):
    """An unfinished run's folder is deleted to run it again, unless it is being written to."""

    def test_an_old_unfinished_run_is_cleared_and_a_live_one_kept(self):
        d = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, d, True)
        run = os.path.join(d, "resnet20-egeria")
        os.makedirs(run)
        metrics = os.path.join(run, "metrics.jsonl")
        open(metrics, "w").write("{}\n")
        with self.assertRaises(SystemExit) as e:
            tta.clear_unfinished(run)
        self.assertIn("another process is probably still training there", str(e.exception))
        self.assertTrue(os.path.exists(metrics))
        old = os.path.getmtime(metrics) - 2 * tta.RECENT_SECONDS
        os.utime(metrics, (old, old))
        tta.clear_unfinished(run)
        self.assertFalse(os.path.exists(run))
        tta.clear_unfinished(run)  # nothing there: nothing to do


if __name__ == "__main__":
    unittest.main()
