#!/usr/bin/env python3
"""SmartFRZ's predictor trained offline, reproducibly, by egeria itself (issue 65 item 3).

    bench/train_smartfrz_predictor.py [--egeria build/egeria] [--datasets datasets]
        [--out runs/smartfrz-data] [--predictor share/smartfrz-predictor.safetensors]
        [--seeds 1,2] [--threads 2] [--quick] [--long-finetune-from datasets/pretrained]
        [--input movement|movement-per-lr]

1. Source runs, each with --freeze none --smartfrz-record on (train/smartfrz_record.h):
   ResNet-20, ResNet-56 and MobileNetV2 on Fashion-MNIST from scratch (the first 3,072
   training images, 8 epochs, a warmup over the first, LR /10 at half and three quarters;
   ResNet-56 at LR 0.1 without it does not learn from so few steps), and
   fine-tuned (pretrained on 3,072 images of classes 0-4 for 4 epochs, fine-tuned on
   1,536 of 5-9 for 8 epochs with a fresh head, the recipe of docs/fine-tuning.md);
   transformer-tiny on 2,000 pairs of en-es from scratch (5 epochs, the first seed), and
   pretrained on 4,000 pairs of en-es then fine-tuned on 2,000 of web-es (linear decay
   after a 5% warmup). A finished run (its smartfrz-records.safetensors) is kept; delete
   its folder to run it again. About 40 minutes on 2 cores.
   With --long-finetune-from DIR, also each image model fine-tuned as bench/fine_tune.py
   fine-tunes it (its pretraining on all 30,000 images of classes 0-4, 10 epochs, cached in
   DIR and made there if missing; 6,000 images of classes 5-9, 10 epochs, its recipe,
   seed 3, beside the seeds 0-2 its tables run): a front that starts converged, which the
   short pretraining above gives less of. About 10 minutes more.
2. Leave-one-model-out: for each model, `egeria smartfrz-train --hold-out MODEL` trains
   the predictor on the other models' runs and scores "freeze" on the held-out model's
   (precision and recall, labels of Note [SmartFRZ's labels] in train/smartfrz_train.h);
   that predictor is kept as OUT/loo-MODEL.safetensors, one that has never seen MODEL
   (bench/fine_tune.py --smartfrz-predictor OUT/loo-{model}.safetensors runs it).
3. The predictor trained on every run, written to --predictor (the file that ships).
--input chooses what the predictors read (Note [SmartFRZ's predictor input] in
freeze/smartfrz.h): movement (the shipped one's) or movement-per-lr, which needs records
with their LRs (an egeria of 2026-12-07 or later; delete older source runs to record them
again).
Results: OUT/summary.json and OUT/summary.md (the table), each LOO run's JSON beside.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import types

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import fine_tune  # noqa: E402  (the fine-tuning task, its recipe and pretrained models)

IMAGE_MODELS = ("resnet20", "resnet56", "mobilenetv2")
MODELS = IMAGE_MODELS + ("transformer-tiny",)


def run(args, name, cmd):
    """One source run (kept when its records exist); returns its records file."""
    out = os.path.join(args.out, name)
    rec = os.path.join(out, "smartfrz-records.safetensors")
    if os.path.exists(rec):
        return rec
    full = [args.egeria, "train", "--threads", str(args.threads), "--checkpoint-every", "0", "--out", out] + cmd
    print("+", " ".join(full), flush=True)
    subprocess.run(full, check=True, stdout=subprocess.DEVNULL)
    return rec


def pretrain(args, name, cmd):
    """A pretraining run (no records), its model.safetensors."""
    out = os.path.join(args.out, "pretrained", name)
    model = os.path.join(out, "model.safetensors")
    if not os.path.exists(os.path.join(out, "summary.json")):
        full = [args.egeria, "train", "--threads", str(args.threads), "--checkpoint-every", "0", "--freeze", "none",
                "--out", out] + cmd
        print("+", " ".join(full), flush=True)
        subprocess.run(full, check=True, stdout=subprocess.DEVNULL)
    return model


def source_runs(args):
    q = args.quick
    n_img, ep = (1024, 3) if q else (3072, 8)
    fm = ["--dataset", "fashion-mnist", "--data-dir", os.path.join(args.datasets, "fashion-mnist")]
    records = []
    for model in IMAGE_MODELS:
        for s in args.seeds:
            records.append(run(args, f"{model}-scratch-s{s}",
                               ["--model", model, "--seed", str(s), "--train-limit", str(n_img), "--epochs", str(ep),
                                "--milestones", f"{ep // 2},{(3 * ep) // 4}", "--warmup-steps", str(n_img // 128),
                                "--freeze", "none", "--smartfrz-record", "on"] + fm))
        pre = pretrain(args, f"{model}-fm01234", ["--model", model, "--seed", "0", "--classes", "0,1,2,3,4",
                                                  "--train-limit", str(n_img), "--epochs", str(max(2, ep // 2)),
                                                  "--warmup-steps", str(n_img // 128)] + fm)
        steps = (n_img // 2 // 128) * ep
        records.append(run(args, f"{model}-finetune-s1",
                           ["--model", model, "--seed", "1", "--classes", "5,6,7,8,9", "--train-limit", str(n_img // 2),
                            "--epochs", str(ep), "--init-from", pre, "--init-exclude", "head", "--lr", "0.1",
                            "--lr-schedule", "linear", "--warmup-steps", str(max(1, steps // 20)), "--freeze", "none",
                            "--smartfrz-record", "on"] + fm))
    if args.long_finetune_from:
        for model in IMAGE_MODELS:
            records.append(long_finetune(args, model))
    n_tr, ep_tr = (600, 2) if q else (2000, 5)
    steps = (n_tr // 64) * ep_tr
    tr = ["--model", "transformer-tiny", "--dataset", "en-es", "--lr-schedule", "linear",
          "--warmup-steps", str(max(1, steps // 20)), "--test-limit", "64", "--eval-every", "0"]
    for s in args.seeds[:1]:  # a seed: transformer-tiny's recorded steps cost the most
        records.append(run(args, f"transformer-tiny-scratch-s{s}",
                           tr + ["--data-dir", os.path.join(args.datasets, "en-es"), "--seed", str(s), "--train-limit",
                                 str(n_tr), "--epochs", str(ep_tr), "--freeze", "none", "--smartfrz-record", "on"]))
    pre = pretrain(args, "transformer-tiny-en-es",
                   tr + ["--data-dir", os.path.join(args.datasets, "en-es"), "--seed", "0", "--train-limit",
                         str(2 * n_tr), "--epochs", str(max(2, ep_tr // 2))])
    ft = tr + ["--data-dir", web_es_with_en_es_tokenizer(args), "--seed", "1", "--train-limit", str(n_tr),
               "--epochs", str(ep_tr), "--init-from", pre, "--freeze", "none", "--smartfrz-record", "on"]
    records.append(run(args, "transformer-tiny-finetune-s1", ft))
    return records


LONG_FT_BUDGET, LONG_FT_EPOCHS, LONG_FT_SEED = 6000, 10, 3


def long_finetune(args, model):
    """A recorded fine-tuning run of bench/fine_tune.py's task from its pretrained model (made in
    --long-finetune-from if missing, as fine_tune.py makes it)."""
    q = args.quick  # a one-epoch pretraining of its own, never cached beside the real ones
    ft = types.SimpleNamespace(egeria=args.egeria, threads=args.threads, quiet=True,
                               data_dir=os.path.join(args.datasets, "fashion-mnist"),
                               pretrained=os.path.join(args.out, "pretrained-quick") if q else args.long_finetune_from,
                               pretrain_epochs=1 if q else 10)
    epochs = 2 if q else LONG_FT_EPOCHS
    budget = 1024 if q else LONG_FT_BUDGET
    return run(args, f"{model}-finetune-long-s{LONG_FT_SEED}",
               ["--model", model, "--dataset", "fashion-mnist", "--data-dir", ft.data_dir,
                "--classes", fine_tune.TASK_CLASSES, "--train-limit", str(budget), "--epochs", str(epochs),
                "--seed", str(LONG_FT_SEED), "--init-from", fine_tune.pretrained(ft, model), "--freeze", "none",
                "--smartfrz-record", "on"] + fine_tune.recipe(budget, epochs))


def web_es_with_en_es_tokenizer(args):
    """OUT/data-web-es: web-es's pairs (linked) with the tokenizer the pretraining on en-es
    trained (copied), as bench/fine_tune_translation.py makes its task folders."""
    d = os.path.join(args.out, "data-web-es")
    os.makedirs(d, exist_ok=True)
    for split in ("train.tsv", "valid.tsv", "test.tsv"):
        target = os.path.abspath(os.path.join(args.datasets, "web-es", split))
        if not os.path.exists(target):
            sys.exit(f"train_smartfrz_predictor: {target} is missing: run tools/get-data {args.datasets}")
        if not os.path.lexists(os.path.join(d, split)):
            os.symlink(target, os.path.join(d, split))
    spm = os.path.join(args.datasets, "en-es", "spm-8000.model")
    if not os.path.exists(spm):
        sys.exit(f"train_smartfrz_predictor: the pretraining on en-es left no tokenizer at {spm}")
    shutil.copyfile(spm, os.path.join(d, "spm-8000.model"))
    return d


def smartfrz_train(args, records, extra, json_out):
    cmd = [args.egeria, "smartfrz-train", "--records"] + records + [
        "--threads", str(args.threads), "--window", str(args.window), "--stride", str(args.stride), "--epochs",
        str(args.epochs), "--cka-tolerance", str(args.cka_tolerance), "--input", args.input, "--json",
        json_out] + extra
    print("+", " ".join(cmd[:3]), f"({len(records)} files)", " ".join(cmd[3 + len(records):]), flush=True)
    subprocess.run(cmd, check=True)
    with open(json_out) as f:
        return json.load(f)


def fmt(v):
    return "—" if v is None else f"{v:.3f}"


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--egeria", default="build/egeria")
    p.add_argument("--datasets", default="datasets")
    p.add_argument("--out", default="runs/smartfrz-data")
    p.add_argument("--predictor", default="share/smartfrz-predictor.safetensors")
    p.add_argument("--seeds", default="1,2")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--window", type=int, default=None, help="records in a window (30; 8 with --quick, whose "
                   "short runs record 16-24)")
    p.add_argument("--stride", type=int, default=2)
    p.add_argument("--epochs", type=int, default=6)
    p.add_argument("--cka-tolerance", type=float, default=0.02)
    p.add_argument("--quick", action="store_true", help="short runs (a smoke test of the pipeline)")
    p.add_argument("--input", choices=("movement", "movement-per-lr"), default="movement",
                   help="what the predictors read (egeria smartfrz-train --input)")
    p.add_argument("--long-finetune-from", default="",
                   help="pretrained models of bench/fine_tune.py (made there if missing): add its fine-tuning runs")
    args = p.parse_args(argv)
    args.seeds = [int(s) for s in args.seeds.split(",") if s]
    if args.window is None:
        args.window = 8 if args.quick else 30
    os.makedirs(args.out, exist_ok=True)
    records = source_runs(args)
    loo = {}
    for model in MODELS:
        loo[model] = smartfrz_train(args, records, ["--hold-out", model, "--out",
                                                    os.path.join(args.out, f"loo-{model}.safetensors")],
                                    os.path.join(args.out, f"loo-{model}.json"))
    final = smartfrz_train(args, records, ["--out", args.predictor], os.path.join(args.out, "final.json"))
    rows = []
    for model, r in loo.items():
        s = r["held_out"]["scores"]
        at = {b["threshold"]: b for b in s["by_threshold"]}
        rows.append({"held_out": model, "samples": s["samples"], "positives": s["positives"],
                     "precision": s["precision"], "recall": s["recall"], "train_precision": r["train"]["precision"],
                     "train_recall": r["train"]["recall"],
                     "by_threshold": {str(t): [b["precision"], b["recall"]] for t, b in at.items()}})
    summary = {"rows": rows, "final_train": final["train"], "gain": final["gain"], "runs": [
        {"file": r["file"], "model": r["model"], "pretrained": r["pretrained"], "records": r["records"],
         "positive_share": r["positive_share"]} for r in final["runs"]], "options": vars(args)}
    with open(os.path.join(args.out, "summary.json"), "w") as f:
        json.dump(summary, f, indent=1)
    thresholds = ["0.5", "0.9", "0.95", "0.99"]
    md = ["| held out | samples | freeze labels | " + " | ".join(f"P ≥ {t}: precision, recall" for t in thresholds)
          + " | (training set at 0.5) |", "|---|---:|---:|" + "---|" * len(thresholds) + "---|"]
    for r in rows:
        cells = " | ".join(f"{fmt(r['by_threshold'][t][0])}, {fmt(r['by_threshold'][t][1])}" for t in thresholds)
        md.append(f"| {r['held_out']} | {r['samples']} | {r['positives']} | {cells} "
                  f"| {fmt(r['train_precision'])}, {fmt(r['train_recall'])} |")
    text = "\n".join(md) + "\n"
    with open(os.path.join(args.out, "summary.md"), "w") as f:
        f.write(text)
    print(text)


if __name__ == "__main__":
    sys.exit(main())
