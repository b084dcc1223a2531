#!/usr/bin/env python3
"""Fine-tuning with freezing on the translation transfer tasks (Egeria §2.3, §6.2), pretraining included.

  bench/fine_tune_translation.py --egeria build/egeria [--tasks es-web,web-es]
      [--model transformer-small] [--datasets datasets] [--pretrained datasets/pretrained]
      [--pretrain-epochs 4] [--budget 3000] [--epochs 5] [--lr 5e-4]
      [--policies none,egeria,autofreeze,static] [--static-k 2,4,6] [--seeds 1,2,3] [--eval-every 25]
      [--threads 2] [--out runs/ft-translation] [--extra "..."] [--step-costs FILE] [--keep DIR]

The tasks (docs/fine-tuning.md, "The translation tasks' data"; `tools/get-data` writes them):
  es-web  pretrained on DATASETS/es-kjv (Reina-Valera 1909 -> KJV), fine-tuned on DATASETS/es-web
          (Reina-Valera 1909 -> World English Bible): the source side unchanged, the target's
          English changes register, the case a front-first freezer should win.
  web-es  pretrained on DATASETS/en-es (KJV -> Reina-Valera 1909), fine-tuned on DATASETS/web-es
          (World English Bible -> Reina-Valera 1909): the source side changes, the hard case.
1. Pretraining, once per (model, pretraining data), cached in --pretrained/MODEL-DATA (delete the
   folder to redo it; an interrupted one resumes from its checkpoint): `egeria train`'s Transformer
   recipe (AdamW, inverse square root after its warmup), --freeze none, seed 0, all the pairs,
   --pretrain-epochs epochs. The SentencePiece tokenizer it trains on the pretraining pairs
   (DATA/spm-V.model, V = --vocab-size) is the task's tokenizer.
2. The fine-tuning data, OUT/data-TASK: links to DATASETS/TASK's train/valid/test.tsv and a copy of
   the pretrained tokenizer, so that the fine-tuning encodes with the vocabulary the weights were
   trained on. (A tokenizer trained on the new pairs numbers the pieces otherwise and has the same
   shapes: the weights would load and mean nothing.)
3. Fine-tuning, every policy and seed: bench/translation_time_to_quality.py on OUT/data-TASK into
   OUT/TASK, with --init-from the pretrained model.safetensors, the first --budget training pairs,
   --epochs epochs, and the fine-tuning recipe of docs/fine-tuning.md as it applies to a Transformer:
   the model's own LR (--lr, AdamW), linear decay to 0 after a linear warmup over the first 5% of
   the steps; every layer module its own freezing unit. Its table (time to within 1% of `none`'s
   final valid perplexity, wall and, with --step-costs, modelled; test BLEU; the reference's
   overhead) goes to OUT/TASK/table.md and table.json. `static` is a sweep: a row per K of
   --static-k (static-kK: the front K units, of transformer-small's 6 encoder and 6 decoder
   layers, frozen from the first step), the best of which is what a careful practitioner keeps.
"""
import argparse
import filecmp
import math
import os
import shutil
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import translation_time_to_quality as ttq  # noqa: E402  (the runs and their table)

TASKS = {"es-web": "es-kjv", "web-es": "en-es"}  # task: its pretraining data
SPLITS = ("train.tsv", "valid.tsv", "test.tsv")


def count_lines(path):
    with open(path, "rb") as f:
        return sum(1 for _ in f)


def pretrain(args, data):
    """The pretrained run's folder for pretraining data `data` (trained here when it is missing)."""
    src = os.path.join(args.datasets, data)
    for s in SPLITS:
        if not os.path.exists(os.path.join(src, s)):
            sys.exit(f"fine_tune_translation: {src}/{s} is missing: run tools/get-data {args.datasets}")
    out = os.path.join(args.pretrained, f"{args.model}-{data}")
    if os.path.exists(os.path.join(out, "summary.json")):
        return out
    cmd = [args.egeria, "train", "--model", args.model, "--dataset", "en-es", "--data-dir", src,
           "--epochs", str(args.pretrain_epochs), "--seed", "0", "--threads", str(args.threads),
           "--vocab-size", str(args.vocab_size), "--freeze", "none", "--out", out] + args.pretrain_extra.split()
    if os.path.exists(os.path.join(out, "checkpoint.safetensors")):
        cmd.append("--resume")
    print("$ " + " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True)
    return out


def tokenizer(args, data):
    path = os.path.join(args.datasets, data, f"spm-{args.vocab_size}.model")
    if not os.path.exists(path):
        sys.exit(f"fine_tune_translation: the pretraining left no tokenizer at {path}")
    return path


def task_data(args, task, spm):
    """OUT/data-TASK: the task's pairs (linked) with the pretrained tokenizer (copied)."""
    d = os.path.join(args.out, f"data-{task}")
    os.makedirs(d, exist_ok=True)
    for s in SPLITS:
        link, target = os.path.join(d, s), os.path.abspath(os.path.join(args.datasets, task, s))
        if not os.path.exists(target):
            sys.exit(f"fine_tune_translation: {target} is missing: run tools/get-data {args.datasets}")
        if os.path.islink(link) and os.readlink(link) == target:
            continue
        if os.path.lexists(link):
            os.remove(link)
        os.symlink(target, link)
    dest = os.path.join(d, os.path.basename(spm))
    if not (os.path.exists(dest) and filecmp.cmp(spm, dest, shallow=False)):
        tmp = dest + ".partial"
        shutil.copyfile(spm, tmp)
        os.replace(tmp, dest)
    return d


def steps(args, data_dir):
    """The fine-tuning run's optimizer steps, for the warmup: the budget's batches times the epochs."""
    pairs = count_lines(os.path.join(data_dir, "train.tsv"))
    if args.budget > 0:
        pairs = min(pairs, args.budget)
    return math.ceil(pairs / args.batch_size) * args.epochs


def recipe(args, model_file, data_dir):
    warmup = max(1, round(0.05 * steps(args, data_dir)))
    return ["--init-from", model_file, "--train-limit", str(args.budget), "--batch-size", str(args.batch_size),
            "--vocab-size", str(args.vocab_size), "--lr", str(args.lr), "--lr-schedule", "linear",
            "--warmup-steps", str(warmup)]


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--egeria", default="build/egeria")
    p.add_argument("--tasks", default="es-web,web-es")
    p.add_argument("--model", default="transformer-small")
    p.add_argument("--datasets", default="datasets")
    p.add_argument("--pretrained", default="datasets/pretrained")
    p.add_argument("--pretrain-epochs", type=int, default=4)
    p.add_argument("--pretrain-extra", default="", help="flags added to the pretraining runs")
    p.add_argument("--vocab-size", type=int, default=8000)
    p.add_argument("--budget", type=int, default=3000, help="the first N training pairs of the task (0: all)")
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--batch-size", type=int, default=64, help="egeria train's Transformer default")
    p.add_argument("--lr", type=float, default=5e-4, help="egeria train's Transformer default")
    p.add_argument("--policies", default="none,egeria,autofreeze,static")
    p.add_argument("--static-k", default="2,4,6", help="static: the numbers of front units to sweep")
    p.add_argument("--seeds", default="1,2,3")
    p.add_argument("--eval-every", type=int, default=25)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", default="runs/ft-translation")
    p.add_argument("--extra", default="", help="flags added to every fine-tuning run")
    p.add_argument("--step-costs", default="", help="as translation_time_to_quality.py's")
    p.add_argument("--keep", default="", help="as translation_time_to_quality.py's, a folder per task beneath")
    args = p.parse_args(argv)
    policies = []
    for pol in (q for q in args.policies.split(",") if q):
        policies += [f"static-k{k}" for k in args.static_k.split(",") if k] if pol == "static" else [pol]
    tasks = [t for t in args.tasks.split(",") if t]
    for t in tasks:
        if t not in TASKS:
            sys.exit(f"fine_tune_translation: unknown task '{t}' (es-web, web-es)")
    for task in tasks:
        data = TASKS[task]
        model_file = os.path.join(pretrain(args, data), "model.safetensors")
        data_dir = task_data(args, task, tokenizer(args, data))
        extra = " ".join(recipe(args, model_file, data_dir) + args.extra.split())
        sub = ["--egeria", args.egeria, "--data-dir", data_dir, "--model", args.model, "--policies", ",".join(policies),
               "--seeds", args.seeds, "--epochs", str(args.epochs), "--eval-every", str(args.eval_every),
               "--threads", str(args.threads), "--out", os.path.join(args.out, task), "--extra", extra]
        if args.step_costs:
            sub += ["--step-costs", args.step_costs]
        if args.keep:
            sub += ["--keep", os.path.join(args.keep, task)]
        print(f"== {task}: pretrained on {data}, fine-tuned on {task}", flush=True)
        ttq.main(sub)


if __name__ == "__main__":
    sys.exit(main())
