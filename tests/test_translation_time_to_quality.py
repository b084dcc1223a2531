#!/usr/bin/env python3
"""bench/translation_time_to_quality.py on hand-made run folders: the target (none's final
validation perplexity), wall and modelled times to it, speedups against the same seed's
none run, the bound from step costs, the medians over seeds, and the report of stored runs.

python3 tests/test_translation_time_to_quality.py (ctest: Bench.TranslationTimeToQuality)
"""
import importlib.util
import json
import math
import os
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
spec = importlib.util.spec_from_file_location(
    "ttq", os.path.join(HERE, "..", "bench", "translation_time_to_quality.py"))
ttq = importlib.util.module_from_spec(spec)
spec.loader.exec_module(ttq)

MODEL = "transformer-small"


class TranslationTimeToQuality(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        self.out = self.dir.name
        # 1 ms a token with nothing frozen, 0.5 ms with 1 unit, 0.25 ms with 2 (repeats: medians).
        with open(os.path.join(self.out, "costs.jsonl"), "w") as f:
            for k, tps in [(0, 1000), (0, 900), (0, 1100), (1, 2000), (2, 4000), (0, 1)]:
                model = MODEL if tps != 1 else "transformer-tiny"  # another model's line: ignored
                f.write(json.dumps({"model": model, "frozen_units": k, "tokens_per_second": tps}) + "\n")

    def tearDown(self):
        self.dir.cleanup()

    def make_run(self, policy, seed, frozen, ppl, bleu, overhead=0.0, machine=None):
        """Ten steps of 100 tokens, one second each; frozen[i] units after step i + 1;
        an evaluation every 2 steps with ppl[i]."""
        d = ttq.run_dir(self.out, MODEL, policy, seed)
        os.makedirs(d)
        with open(os.path.join(d, "metrics.jsonl"), "w") as f:
            for i, k in enumerate(frozen):
                step = i + 1
                f.write(json.dumps({"type": "step", "step": step, "tokens": 100, "frozen_modules": k,
                                    "train_seconds": float(step)}) + "\n")
                if i > 0 and frozen[i - 1] != k:
                    f.write(json.dumps({"type": "freeze", "step": step, "frozen_modules": k}) + "\n")
                if step % 2 == 0:
                    f.write(json.dumps({"type": "eval", "step": step, "train_seconds": float(step),
                                        "valid_loss": math.log(ppl[step // 2 - 1]),
                                        "valid_perplexity": ppl[step // 2 - 1]}) + "\n")
        with open(os.path.join(d, "summary.json"), "w") as f:
            json.dump({"final_test_bleu": bleu, "train_seconds": 10.0, "reference_overhead_fraction": overhead,
                       **({"machine": machine} if machine else {})}, f)

    def test_times_speedups_bound_and_report(self):
        self.make_run("none", 1, [0] * 10, [9, 7, 6, 5.5, 5.0], 20.0)
        # Reaches 5.0 x 1.01 at step 8 (wall 8 s); frozen 2 units from step 3 on (after step 2).
        self.make_run("egeria", 1, [0, 2, 2, 2, 2, 2, 2, 2, 2, 2], [9, 7, 6, 5.04, 4.9], 19.5, overhead=0.1)
        self.make_run("none", 2, [0] * 10, [9, 8, 7, 6, 6.0], 21.0)
        self.make_run("egeria", 2, [0] * 10, [9, 8, 7, 6.5, 6.1], 18.0)  # never within 1% of 6.0
        costs = ttq.load_step_costs(os.path.join(self.out, "costs.jsonl"), MODEL)
        self.assertAlmostEqual(costs[0], 0.001)
        self.assertEqual(ttq.bound(costs), {0: 1.0, 1: 2.0, 2: 4.0})

        runs = {(p, s): ttq.analyse(ttq.run_dir(self.out, MODEL, p, s), costs)
                for p in ("none", "egeria") for s in (1, 2)}
        rows, med = ttq.table(runs, [1, 2], ["none", "egeria"], True)
        e1 = next(r for r in rows if r["policy"] == "egeria" and r["seed"] == 1)
        self.assertEqual(e1["target_ppl"], 5.0)
        self.assertEqual(e1["time_seconds"], 8.0)
        self.assertAlmostEqual(e1["speedup_seconds"], 10.0 / 8.0)
        # Modelled: steps 1-2 at 0.1 s, steps 3-8 at 0.025 s (2 frozen), x 1.1 for the reference;
        # none: 10 steps at 0.1 s.
        self.assertAlmostEqual(e1["time_modelled"], (0.2 + 6 * 0.025) * 1.1)
        self.assertAlmostEqual(e1["speedup_modelled"], 1.0 / ((0.2 + 6 * 0.025) * 1.1))
        self.assertEqual(e1["freezes"], [(2, 2)])  # frozen after step 2
        # The whole run: steps 1-2 at 0.1 s, 3-10 at 0.025 s, x 1.1; wall: both 10 s.
        self.assertAlmostEqual(e1["run_speedup_modelled"], 1.0 / ((0.2 + 8 * 0.025) * 1.1))
        self.assertAlmostEqual(e1["run_speedup_seconds"], 1.0)
        e2 = next(r for r in rows if r["policy"] == "egeria" and r["seed"] == 2)
        self.assertIsNone(e2["time_seconds"])
        self.assertIsNone(e2["speedup_seconds"])
        self.assertAlmostEqual(e2["run_speedup_modelled"], 1.0)  # never reached, nothing frozen
        m = next(x for x in med if x["policy"] == "egeria")
        self.assertEqual(m["seeds"], 2)
        # One seed of two never got there: the median counts it as the slowest.
        self.assertEqual(m["reached"], 1)
        self.assertIsNone(m["speedup_seconds"])
        self.assertEqual(ttq.median_never_last([1.2, None, 1.1]), 1.1)
        self.assertIsNone(ttq.median_never_last([None, 1.3, None]))
        self.assertAlmostEqual(ttq.median_never_last([1.0, 1.2]), 1.1)
        self.assertAlmostEqual(ttq.median_never_last([1.4, 1.0, None, 1.2]), 1.1)
        self.assertEqual(m["test_bleu_band"], [18.0, 19.5])
        self.assertAlmostEqual(m["test_bleu"], 18.75)

        # The report of the stored runs trains nothing and writes the tables.
        ttq.main(["--egeria", "/nonexistent/egeria", "--model", MODEL, "--out", self.out, "--policies", "egeria",
                  "--seeds", "1,2", "--step-costs", os.path.join(self.out, "costs.jsonl"), "--report-only"])
        with open(os.path.join(self.out, "table.md")) as f:
            md = f.read()
        self.assertIn("| egeria | 2 |", md)
        self.assertIn("| 1 of 2 | never | never |", md)
        self.assertNotIn("—×", md)
        self.assertIn("k=2: 4.00×", md)
        with open(os.path.join(self.out, "table.json")) as f:
            self.assertEqual(len(json.load(f)["per_seed"]), 4)

    def test_wall_times_compare_only_within_one_machine_and_boot(self):
        vm = {"host": "vm", "boot_id": "a"}
        self.make_run("none", 1, [0] * 10, [9, 7, 6, 5.5, 5.0], 20.0, machine=vm)
        self.make_run("egeria", 1, [0, 2, 2, 2, 2, 2, 2, 2, 2, 2], [9, 7, 6, 5.04, 4.9], 19.5,
                      machine=dict(vm, boot_id="b"))  # the next VM, of the same name
        costs = ttq.load_step_costs(os.path.join(self.out, "costs.jsonl"), MODEL)
        runs = {(p, 1): ttq.analyse(ttq.run_dir(self.out, MODEL, p, 1), costs) for p in ("none", "egeria")}
        rows, med = ttq.table(runs, [1], ["none", "egeria"], True)
        e1 = next(r for r in rows if r["policy"] == "egeria")
        self.assertTrue(e1["other_machine"])
        self.assertEqual(e1["time_seconds"], 8.0)  # its own wall time stays
        self.assertIsNone(e1["speedup_seconds"])
        self.assertIsNone(e1["run_speedup_seconds"])
        self.assertAlmostEqual(e1["speedup_modelled"], 1.0 / (0.2 + 6 * 0.025))  # modelled times compare anywhere
        md = ttq.markdown(rows, med, {})
        self.assertIn("| egeria | 1 | 4.90 | 19.50 (19.50–19.50) | 1 of 1 | other machine |", md)

    def test_epoch_ends_are_points_of_the_curve(self):
        """The epoch-end validation is a point of the curve (the same per-token loss), and
        the last one, after the last --eval-every point, is the run's final perplexity."""
        self.make_run("none", 1, [0] * 10, [9, 7, 6, 5.5, 5.0], 20.0)
        d = ttq.run_dir(self.out, MODEL, "none", 1)
        with open(os.path.join(d, "metrics.jsonl"), "a") as f:  # ends at step 10; the epoch at step 11
            f.write(json.dumps({"type": "step", "step": 11, "tokens": 100, "frozen_modules": 0,
                                "train_seconds": 11.0}) + "\n")
            f.write(json.dumps({"type": "epoch", "step": 11, "train_seconds": 11.0,
                                "valid_loss": math.log(4.0), "valid_bleu": 1.0}) + "\n")
        r = ttq.analyse(d)
        self.assertEqual([p["step"] for p in r["curve"]], [2, 4, 6, 8, 10, 11])
        self.assertAlmostEqual(r["final_ppl"], 4.0)
        # An epoch's end at an --eval-every step is one point, not two.
        with open(os.path.join(d, "metrics.jsonl"), "a") as f:
            f.write(json.dumps({"type": "step", "step": 12, "tokens": 100, "frozen_modules": 0,
                                "train_seconds": 12.0}) + "\n")
            f.write(json.dumps({"type": "eval", "step": 12, "train_seconds": 12.0,
                                "valid_loss": math.log(3.9), "valid_perplexity": 3.9}) + "\n")
            f.write(json.dumps({"type": "epoch", "step": 12, "train_seconds": 12.0,
                                "valid_loss": math.log(3.9), "valid_bleu": 1.0}) + "\n")
        r = ttq.analyse(d)
        self.assertEqual([p["step"] for p in r["curve"]], [2, 4, 6, 8, 10, 11, 12])
        self.assertAlmostEqual(r["final_ppl"], 3.9)

    def test_finished_runs_are_kept_elsewhere_and_found_there(self):
        """--keep: a finished run's logs are copied (not its weights; the metrics
        xz-compressed), and a run found there is not trained again, in the same place or on
        another machine."""
        self.make_run("none", 1, [0] * 10, [9, 7, 6, 5.5, 5.0], 20.0)
        d = ttq.run_dir(self.out, MODEL, "none", 1)
        with open(os.path.join(d, "model.safetensors"), "w") as f:
            f.write("weights")
        kept = os.path.join(self.out, "kept")
        args = ["--egeria", "/nonexistent/egeria", "--model", MODEL, "--policies", "none", "--seeds", "1",
                "--keep", kept]
        ttq.main(args + ["--out", self.out])  # finished in --out: kept, not trained
        k = ttq.run_dir(kept, MODEL, "none", 1)
        # The metrics are kept compressed and read back line for line.
        self.assertEqual(sorted(os.listdir(k)), ["metrics.jsonl.xz", "summary.json"])
        self.assertEqual(ttq.read_jsonl(os.path.join(k, "metrics.jsonl")),
                         ttq.read_jsonl(os.path.join(d, "metrics.jsonl")))
        self.assertEqual(ttq.analyse(k)["curve"], ttq.analyse(d)["curve"])
        # Another machine: an empty --out, the kept logs only; nothing is trained, the
        # table is the same.
        other = os.path.join(self.out, "elsewhere")
        ttq.main(args + ["--out", other])
        with open(os.path.join(other, "table.json")) as f:
            self.assertEqual(json.load(f)["per_seed"][0]["final_ppl"], 5.0)
        ttq.main(args + ["--out", other, "--report-only"])
        self.assertFalse(os.path.exists(ttq.run_dir(other, MODEL, "none", 1)))

    def test_a_kept_fine_tuning_run_is_reused_only_under_the_tolerance_it_was_run_with(self):
        # The kept es-web runs were fine-tuned before a pretrained run's T came from its steepest
        # fit (auto = peak since 2026-12-07): they took the first 3 fits.
        kept = os.path.join(HERE, "..", "docs", "runs", "ft-translation", "es-web")
        egeria = ttq.run_dir(kept, MODEL, "egeria", 1)
        with self.assertRaises(SystemExit) as e:
            ttq.check_tolerance_source(egeria, ttq.policy_args("egeria"))
        self.assertIn("--freeze-tolerance-from first3", str(e.exception))
        ttq.check_tolerance_source(egeria, ttq.policy_args("egeria") + ["--freeze-tolerance-from", "first3"])
        ttq.check_tolerance_source(ttq.run_dir(kept, MODEL, "none", 1), ttq.policy_args("none"))
        args = ["--egeria", "/nonexistent/egeria", "--model", MODEL, "--policies", "egeria", "--seeds", "1",
                "--keep", kept, "--out", self.out, "--report-only"]
        with self.assertRaises(SystemExit):
            ttq.main(args)
        ttq.main(args + ["--extra", "--freeze-tolerance-from first3"])
        with open(os.path.join(self.out, "table.json")) as f:
            self.assertIn("egeria", [r.get("policy") for r in json.load(f)["per_seed"]])

    def test_policy_variants_run_with_their_flags(self):
        args = ttq.argparse.Namespace(egeria="egeria", model=MODEL, data_dir="data", epochs=2, threads=2,
                                      eval_every=5, extra="--train-limit 100")
        cmd = ttq.command(args, "egeria-bootn", 3, "out")
        self.assertEqual(cmd[cmd.index("--freeze") + 1], "egeria")
        self.assertEqual(cmd[cmd.index("--freeze-bootstrap-interval") + 1], "n")
        self.assertEqual(cmd[cmd.index("--seed") + 1], "3")
        self.assertEqual(cmd[-2:], ["--train-limit", "100"])
        plain = ttq.command(args, "static", 1, "out")
        self.assertEqual(plain[plain.index("--freeze") + 1], "static")
        self.assertNotIn("--freeze-bootstrap-interval", plain)
        self.assertEqual(ttq.run_dir("o", MODEL, "egeria-bootn", 1), os.path.join("o", MODEL + "-egeria-bootn-s1"))
        swept = ttq.command(args, "static-k4", 1, "out")  # one K of a static sweep, frozen from step 0
        self.assertEqual(swept[swept.index("--freeze") + 1], "static")
        self.assertEqual(swept[swept.index("--static-modules") + 1], "4")
        self.assertEqual(swept[swept.index("--static-epoch") + 1], "0")
        anyorder = ttq.command(args, "smartfrz-any", 1, "out")
        self.assertEqual(anyorder[anyorder.index("--freeze") + 1], "smartfrz")
        self.assertEqual(anyorder[anyorder.index("--smartfrz-order") + 1], "any")
        with self.assertRaises(SystemExit):
            ttq.command(args, "static-kx", 1, "out")


if __name__ == "__main__":
    unittest.main()
