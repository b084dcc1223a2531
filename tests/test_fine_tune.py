#!/usr/bin/env python3
"""bench/fine_tune.py's rows and its choice of the best static K, on hand-made run folders.

python3 tests/test_fine_tune.py (ctest: Bench.FineTuneTable)
"""
import importlib.util
import json
import os
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "bench"))
spec = importlib.util.spec_from_file_location("fine_tune", os.path.join(HERE, "..", "bench", "fine_tune.py"))
ft = importlib.util.module_from_spec(spec)
spec.loader.exec_module(ft)


class FineTuneTable(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()

    def tearDown(self):
        self.dir.cleanup()

    def make_run(self, name, accuracies, seconds_per_epoch, saved=0.0, machine=None):
        out = os.path.join(self.dir.name, name)
        os.makedirs(out)
        with open(os.path.join(out, "metrics.jsonl"), "w") as f:
            for e, acc in enumerate(accuracies):
                f.write(json.dumps({"type": "epoch", "epoch": e + 1, "step": 10 * (e + 1), "test_accuracy": acc,
                                    "train_seconds": seconds_per_epoch * (e + 1)}) + "\n")
        with open(os.path.join(out, "summary.json"), "w") as f:
            json.dump({"model": "resnet20", "final_test_accuracy": accuracies[-1],
                       "train_seconds": seconds_per_epoch * len(accuracies), "backward_flops_saved_fraction": saved,
                       "reference_overhead_fraction": 0.01, **({"machine": machine} if machine else {})}, f)
        return out

    def test_speedup_is_against_the_seeds_none_run_at_its_target(self):
        none = self.make_run("none", [0.90, 0.95, 0.97], 10.0)
        target = 0.97 - ft.NEAR
        base = ft.row(none, target, {}, None)
        self.assertEqual(base["time_to_target"], 30.0)  # 0.95 is below 0.967
        fast = ft.row(self.make_run("egeria", [0.91, 0.968, 0.969], 8.0, 0.3), target, base, None)
        self.assertEqual(fast["time_to_target"], 16.0)
        self.assertAlmostEqual(fast["speedup"], 30.0 / 16.0)
        never = ft.row(self.make_run("static1", [0.9, 0.95, 0.96], 5.0), target, base, None)
        self.assertIsNone(never["time_to_target"])
        self.assertIsNone(never["speedup"])

    def test_wall_times_compare_only_within_one_machine_and_boot(self):
        here = {"cpu": "AMD EPYC", "host": "vm", "boot_id": "a"}
        none = self.make_run("none", [0.90, 0.95, 0.97], 10.0, machine=here)
        target = 0.97 - ft.NEAR
        base = ft.row(none, target, {}, None)
        same = ft.row(self.make_run("same", [0.91, 0.968, 0.969], 8.0, machine=here), target, base, None, none)
        self.assertFalse(same["other_machine"])
        self.assertAlmostEqual(same["speedup"], 30.0 / 16.0)
        later = dict(here, boot_id="b")  # a fresh VM of the same name
        other = ft.row(self.make_run("other", [0.91, 0.968, 0.969], 8.0, machine=later), target, base, None, none)
        self.assertTrue(other["other_machine"])
        self.assertIsNone(other["speedup"])
        self.assertEqual(other["time_to_target"], 16.0)  # its own wall time stays
        older = ft.row(self.make_run("older", [0.91, 0.968, 0.969], 8.0), target, base, None, none)
        self.assertTrue(older["other_machine"])  # one from before runs named their machine: another day's
        self.assertIsNone(older["speedup"])
        old_none = self.make_run("old-none", [0.90, 0.95, 0.97], 10.0)
        both_old = ft.row(self.make_run("both-old", [0.91, 0.968, 0.969], 8.0), target, ft.row(old_none, target, {}, None),
                          None, old_none)
        self.assertFalse(both_old["other_machine"])  # two from before: compared, as the tables before did
        self.assertAlmostEqual(both_old["speedup"], 30.0 / 16.0)

    def test_best_static_k_is_the_fastest_that_reaches_the_target_else_the_most_accurate(self):
        k1 = {"run": "static1", "time_to_target": 20.0, "final_accuracy": 0.97}
        k2 = {"run": "static2", "time_to_target": 12.0, "final_accuracy": 0.968}
        k3 = {"run": "static3", "time_to_target": None, "final_accuracy": 0.95}
        best = ft.best_static([k1, k2, k3])
        self.assertEqual(best["run"], "static2")
        self.assertEqual(best["static_sweep"], ["static1", "static2", "static3"])
        none_reach = ft.best_static([dict(k1, time_to_target=None), dict(k3, final_accuracy=0.96)])
        self.assertEqual(none_reach["run"], "static1")
        # With step costs the modelled time decides: K = 2's wall time is shorter only because it
        # ran on a faster machine.
        m1, m2 = dict(k1, modelled_time_to_target=10.0), dict(k2, modelled_time_to_target=11.0)
        self.assertEqual(ft.best_static([m1, m2, dict(k3, modelled_time_to_target=None)])["run"], "static1")
        self.assertEqual(ft.best_static([m1, dict(m2, modelled_time_to_target=None)])["run"], "static1")

    def test_the_recipe_warms_up_over_five_percent_of_the_steps(self):
        r = ft.recipe(6000, 10)  # 46 steps an epoch
        self.assertEqual(r[r.index("--warmup-steps") + 1], "23")
        self.assertIn("--init-exclude", r)

    def test_policies_take_their_suffixes(self):
        self.assertEqual(ft.policy_flags("egeria-la1"), ["egeria", "--freeze-lookahead", "1"])
        self.assertEqual(ft.policy_flags("egeria-tol0.5"), ["egeria", "--freeze-tolerance", "0.5"])
        self.assertEqual(ft.policy_flags("egeria-cache-la2-tol0.5")[-4:],
                         ["--freeze-lookahead", "2", "--freeze-tolerance", "0.5"])
        self.assertEqual(ft.policy_flags("egeria-cache")[:3], ["egeria", "--freeze-cache", "on"])
        self.assertEqual(ft.policy_flags("egeria-bnb-lr2"),
                         ["egeria", "--freeze-reference-bn", "batch", "--freeze-reading", "per-lr2"])
        self.assertEqual(ft.policy_flags("egeria-peak"), ["egeria", "--freeze-tolerance-from", "peak"])
        self.assertEqual(ft.policy_flags("egeria-bnr-peak"),
                         ["egeria", "--freeze-bn", "running", "--freeze-tolerance-from", "peak"])
        self.assertEqual(ft.policy_flags("egeria-lr2-la1")[1:], ["--freeze-reading", "per-lr2", "--freeze-lookahead", "1"])
        self.assertEqual(ft.policy_flags("egeria-cache-v4")[-2:], ["--augment-variants", "4"])
        self.assertEqual(ft.policy_flags("egeria-cache-bnb-lr2-settle20-v4")[-6:],
                         ["--freeze-reading", "per-lr2", "--freeze-bn-settle", "20", "--augment-variants", "4"])
        self.assertEqual(ft.policy_flags("none-sample-v2"), ["none", "--augment-mode", "sample", "--augment-variants", "2"])
        for bad in ("egeria-la1.5", "egeria-lax", "smartfrz-la1", "none-tol0.5", "egeria-tol", "none-lr2", "egeria-lr3",
                    "egeria-v2", "none-v2", "egeria-cache-vx", "egeria-settle1.5"):
            self.assertIsNone(ft.policy_flags(bad), bad)

    def test_a_kept_egeria_run_is_reused_only_under_the_tolerance_it_was_run_with(self):
        def kept(name, tolerance_from):
            out = os.path.join(self.dir.name, name)
            os.makedirs(out)
            with open(os.path.join(out, "config.json"), "w") as f:
                json.dump({} if tolerance_from is None else {"freeze_tolerance_from": tolerance_from}, f)
            return out
        first3, auto, older = kept("first3", "first3"), kept("auto", "auto"), kept("older", None)
        for out, policy in ((first3, "egeria-first3"), (first3, "egeria-cache-first3-v4"), (auto, "egeria"),
                            (auto, "egeria-peak"), (older, "egeria-bnb-lr2-first3"), (first3, "static")):
            with self.subTest(out=out, policy=policy):
                flags = ["static"] if policy == "static" else ft.policy_flags(policy)
                ft.check_tolerance_source(out, policy, flags)  # accepted
        ft.check_tolerance_source(first3, "egeria", ["egeria", "--freeze-tolerance-from", "first3"])  # as --extra gives
        for out, policy in ((first3, "egeria"), (older, "egeria-cache-v4"), (auto, "egeria-first3")):
            with self.subTest(out=out, policy=policy), self.assertRaises(SystemExit) as e:
                ft.check_tolerance_source(out, policy, ft.policy_flags(policy))
            self.assertIn("--freeze-tolerance-from", str(e.exception))

    def test_smartfrz_with_another_predictor_runs_under_its_tag_with_the_models_file(self):
        import types
        calls = []
        real_train, real_pretrained = ft.train, ft.pretrained
        ft.train = lambda args, cmd, out: calls.append((out, cmd)) or out
        ft.pretrained = lambda args, model: f"pre/{model}.safetensors"
        try:
            args = types.SimpleNamespace(out=self.dir.name, epochs=10, extra="", smartfrz_tag="loo",
                                         smartfrz_predictor="data/loo-{model}.safetensors")
            for policy in ("smartfrz", "smartfrz-any", "egeria", "none"):
                ft.fine_tune(args, "resnet56", 6000, 1, policy)
            ft.fine_tune(args, "resnet56", 6000, 1, "static", 2)
        finally:
            ft.train, ft.pretrained = real_train, real_pretrained
        names = [os.path.basename(out) for out, _ in calls]
        self.assertEqual(names, ["resnet56-b6000-s1-smartfrz-loo", "resnet56-b6000-s1-smartfrz-any-loo",
                                 "resnet56-b6000-s1-egeria", "resnet56-b6000-s1-none", "resnet56-b6000-s1-static2"])
        for out, cmd in calls:
            given = "--smartfrz-predictor" in cmd
            self.assertEqual(given, "smartfrz" in out, out)
            if given:
                self.assertEqual(cmd[cmd.index("--smartfrz-predictor") + 1], "data/loo-resnet56.safetensors")
        self.assertEqual(ft.label(args, "smartfrz-any"), "smartfrz-any-loo")
        self.assertEqual(ft.label(args, "static"), "static")
        args.smartfrz_predictor = args.smartfrz_tag = ""
        self.assertEqual(ft.label(args, "smartfrz"), "smartfrz")


if __name__ == "__main__":
    unittest.main()
