#!/usr/bin/env python3
"""The CPU training step on this machine: egeria's activation layouts side by side with
PyTorch, where the step's time goes, and what oneDNN ran.

  bench/cpu_step.py --egeria build/egeria [--models resnet56:128,resnet50:16]
                    [--precisions f32,bf16] [--layouts auto,blocked,nhwc] [--repeats 3]
                    [--iterations 8] [--threads 2] [--out cpu-step.json]

For each model (name:batch) and precision, --repeats rounds, each running back to back
`egeria bench step` under every EG_CPU_LAYOUT of --layouts and PyTorch's step with
channels_last (under torch.autocast for bf16; bench/compare_pytorch.py's models and
step), so the machine's drift falls on all of them alike: medians and per-round ratios.
Then one `bench step --profile` (Note [Op profiles] in kernels/ops.h: each op's time a
step, the layout conversions, the time outside ops) and one run under ONEDNN_VERBOSE=1
(every primitive oneDNN executed, summed by kind and implementation: the reorders, and
whether the convolutions are the AMX kernels), both at the default layout, and PyTorch's
step under torch.profiler: the two steps' times side by side by what they do (forward and
backward convolutions, batch norm with the ReLUs and residual adds egeria fuses into it,
the optimizer, autocast's casts, other ops, and the time between ops). The JSON names the
machine (egeria's `machine`, lscpu's model name and flags of interest); the tables printed
at the end are what docs/results pages quote.
PyTorch missing: egeria's figures alone.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
from collections import defaultdict

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import compare_pytorch as cp  # noqa: E402  (PyTorch's step, the same models)

WARMUP_STEPS = 3  # bench step's warm-up (train/trainer.cpp), in every verbose log


def egeria_step(exe, model, bs, precision, threads, iters, layout, extra=(), env_extra=None):
    """bench step's JSON (its last line; a verbose run prints oneDNN's lines before it) and stdout."""
    env = dict(os.environ, EG_CPU_LAYOUT=layout)
    env.update(env_extra or {})
    cmd = [exe, "bench", "step", "--model", model, "--batch-size", str(bs), "--threads", str(threads),
           "--iterations", str(iters), "--precision", precision] + list(extra)
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, env=env).stdout
    last = [line for line in out.splitlines() if line.startswith("{")][-1]
    return json.loads(last), out


def verbose_execs(text):
    """oneDNN's `exec` lines in order, as (kind, implementation, source layout or None, ms).
    Both prefixes (dnnl_verbose, onednn_verbose)."""
    execs = []
    for line in text.splitlines():
        if not (line.startswith("onednn_verbose,") or line.startswith("dnnl_verbose,")):
            continue
        parts = line.split(",")
        if "exec" not in parts:
            continue
        i = parts.index("exec")
        if len(parts) < i + 5:
            continue
        try:
            ms = float(parts[-1])
        except ValueError:
            continue
        src = None
        if parts[i + 2] == "convolution":
            for md in parts[i + 5].split():
                if md.startswith("src_"):
                    f = md.split(":")
                    src = f[3] if len(f) > 3 else md
        execs.append((parts[i + 2], parts[i + 3], src, ms))
    return execs


def parse_verbose(text, warmup=0, steps=1):
    """The `exec` lines summed: {"kind": {count, ms}}, {"kind impl": {count, ms}} and the source
    layouts the convolutions ran on. With warmup > 0, the lines of the first `warmup` of the
    warmup + steps steps logged are left out (their first executions take up to a second) where
    the lines split into that many equal steps; the number of warm-up steps left out comes last."""
    execs = verbose_execs(text)
    dropped = 0
    if warmup and execs and len(execs) % (warmup + steps) == 0:
        execs = execs[warmup * len(execs) // (warmup + steps):]
        dropped = warmup
    kinds = defaultdict(lambda: {"count": 0, "ms": 0.0})
    impls = defaultdict(lambda: {"count": 0, "ms": 0.0})
    conv_src = defaultdict(int)
    for kind, impl, src, ms in execs:
        kinds[kind]["count"] += 1
        kinds[kind]["ms"] += ms
        impls[kind + " " + impl]["count"] += 1
        impls[kind + " " + impl]["ms"] += ms
        if src is not None:
            conv_src[src] += 1
    return dict(kinds), dict(impls), dict(conv_src), dropped


def onednn_summary(text, steps, warmup=0):
    """Per step of the `steps` timed ones; the warm-up's lines left out where they can be told
    apart (parse_verbose), else every logged step counted (steps_logged says which)."""
    kinds, impls, conv_src, dropped = parse_verbose(text, warmup, steps)
    steps = steps if dropped else steps + warmup
    total = sum(k["ms"] for k in kinds.values())
    reorder = kinds.get("reorder", {"count": 0, "ms": 0.0})
    return {"steps_logged": steps, "warmup_steps_left_out": dropped, "onednn_ms_per_step": total / steps,
            "reorders_per_step": reorder["count"] / steps, "reorder_ms_per_step": reorder["ms"] / steps,
            "reorder_share_of_onednn": reorder["ms"] / total if total else 0.0,
            "by_kind": {k: {"per_step": v["count"] / steps, "ms_per_step": v["ms"] / steps} for k, v in kinds.items()},
            "by_implementation": {k: {"per_step": v["count"] / steps, "ms_per_step": v["ms"] / steps}
                                  for k, v in sorted(impls.items(), key=lambda kv: -kv[1]["ms"])},
            "convolution_source_layouts": conv_src}


def lscpu():
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    except OSError:
        return {}
    info = {}
    for line in out.splitlines():
        k, _, v = line.partition(":")
        if k.strip() == "Model name":
            info["model_name"] = v.strip()
        if k.strip() == "Flags":
            flags = v.split()
            info["flags"] = sorted(f for f in flags if f.startswith(("amx", "avx512_bf16", "avx512_vnni", "avx512f")))
    return info


# Where a step's time goes, in categories both engines have. egeria's batch norm carries the
# ReLU and the residual add it fuses, so PyTorch's ReLUs and adds (outside its optimizer) go
# beside its batch norms.
CATEGORIES = ("convolutions, forward", "convolutions, backward", "batch norm, ReLU, residual adds",
              "optimizer", "casts", "other ops", "outside ops")


def egeria_op_category(op):
    if op == "conv2d_fwd":
        return CATEGORIES[0]
    if op.startswith("conv2d_bwd"):
        return CATEGORIES[1]
    if op.startswith(("batchnorm_", "act_", "binary_")):
        return CATEGORIES[2]
    if op.startswith(("sgd_step", "adamw_step", "amp_", "clip_coef", "sum_squares")):
        return "optimizer"
    return "casts" if op == "cast" else "other ops"


def torch_op_category(name):
    n = name.lower()
    if "convolution" in n or "conv2d" in n:
        return CATEGORIES[1] if "backward" in n else CATEGORIES[0]
    if "batch_norm" in n or "batchnorm" in n or "relu" in n or "threshold" in n or n in ("aten::add", "aten::add_"):
        return CATEGORIES[2]
    if n in ("aten::to", "aten::_to_copy", "aten::copy_"):  # autocast's casts
        return "casts"
    return "other ops"


def step_breakdown(egeria_profile, torch_profile=None):
    """ms a step by category: egeria's from bench step --profile's ops (outside ops: the step's
    time no op covers), PyTorch's from compare_pytorch.profile_torch (outside ops: the step's
    wall time less every op's own time, the Python and autograd between ops)."""
    eg = dict.fromkeys(CATEGORIES, 0.0)
    for op in egeria_profile["ops"]:
        eg[egeria_op_category(op["op"])] += op["ms_per_step"]
    eg["outside ops"] = egeria_profile["outside_ops_ms_per_step"]
    out = {"egeria_ms": eg, "egeria_step_ms": egeria_profile["mean_step_ms"]}
    if torch_profile:
        pt = dict.fromkeys(CATEGORIES, 0.0)
        for name, ms in torch_profile["ops_ms"].items():
            pt[torch_op_category(name)] += ms
        pt["optimizer"] += torch_profile["optimizer_ms"]
        pt["outside ops"] = max(0.0, torch_profile["step_ms"] - sum(pt.values()))
        out.update(pytorch_ms=pt, pytorch_step_ms=torch_profile["step_ms"])
    return out


def measure(a, model, bs, precision, torch_ok):
    layouts = a.layouts.split(",")
    eg = {lay: [] for lay in layouts}
    pt = []
    cp.PRECISION = cp.TORCH_PRECISION = precision
    machine = None
    for _ in range(a.repeats):
        for lay in layouts:
            j, _ = egeria_step(a.egeria, model, bs, precision, a.threads, a.iterations, lay)
            eg[lay].append(j.get("images_per_second", j.get("tokens_per_second")))
            machine = j.get("machine", machine)
        if torch_ok:
            pt.append(cp.bench_torch(model, bs, a.threads, a.iterations, "channels_last"))
    res = {"model": model, "batch_size": bs, "precision": precision, "threads": a.threads, "repeats": a.repeats,
           "iterations": a.iterations, "machine": machine,
           "egeria_images_per_second": {lay: statistics.median(v) for lay, v in eg.items()},
           "egeria_images_per_second_by_repeat": eg}
    if torch_ok:
        res["pytorch"] = "channels_last" + (", torch.autocast bf16" if precision == "bf16" else "")
        res["pytorch_images_per_second"] = statistics.median(pt)
        res["pytorch_images_per_second_by_repeat"] = pt
        res["ratio_median_of_repeats"] = {lay: statistics.median([e / p for e, p in zip(v, pt)])
                                          for lay, v in eg.items()}
    j, _ = egeria_step(a.egeria, model, bs, precision, a.threads, a.iterations, "auto", ["--profile"])
    res["profile"] = j["profile"]
    res["cpu_layout_profiled"] = j.get("cpu_layout")
    res["breakdown"] = step_breakdown(j["profile"], cp.profile_torch(model, bs, a.threads, a.iterations,
                                                                     "channels_last") if torch_ok else None)
    _, text = egeria_step(a.egeria, model, bs, precision, a.threads, a.iterations, "auto",
                          env_extra={"ONEDNN_VERBOSE": "1", "DNNL_VERBOSE": "1"})
    res["onednn"] = onednn_summary(text, a.iterations, WARMUP_STEPS)
    return res


def table(results):
    rows = ["| model | batch | precision | " + " | ".join(f"egeria {lay}" for lay in results[0]["egeria_images_per_second"])
            + " | PyTorch | egeria auto / PyTorch | oneDNN reorders a step (ms) | layout conversions a step (ms) |",
            "|---|---:|---|" + "---:|" * (len(results[0]["egeria_images_per_second"]) + 4)]
    for r in results:
        eg = " | ".join(f"{v:.0f}" for v in r["egeria_images_per_second"].values())
        pt = f"{r['pytorch_images_per_second']:.0f}" if "pytorch_images_per_second" in r else "—"
        ratio = (f"{r['ratio_median_of_repeats']['auto']:.2f}×"
                 if "ratio_median_of_repeats" in r and "auto" in r["ratio_median_of_repeats"] else "—")
        o, p = r["onednn"], r["profile"]
        rows.append(f"| {r['model']} | {r['batch_size']} | {r['precision']} | {eg} | {pt} | {ratio} | "
                    f"{o['reorders_per_step']:.0f} ({o['reorder_ms_per_step']:.1f}) | "
                    f"{p['layout_conversions_per_step']:.0f} ({p['layout_conversion_ms_per_step']:.1f}) |")
    return "\n".join(rows)


def breakdown_table(results):
    """ms a step by category, egeria beside PyTorch, a column pair per run."""
    runs = [r for r in results if "breakdown" in r]
    head = "| ms a step | " + " | ".join(f"{r['model']} {r['precision']} egeria | PyTorch" for r in runs) + " |"
    rows = [head, "|---|" + "---:|---:|" * len(runs)]

    def cell(b, key, cat=None):
        v = b.get(key)
        if v is None:
            return "—"
        return f"{(v[cat] if cat else v):.1f}"
    for cat in CATEGORIES + ("step",):
        cells = []
        for r in runs:
            b = r["breakdown"]
            if cat == "step":
                cells += [cell(b, "egeria_step_ms"), cell(b, "pytorch_step_ms")]
            else:
                cells += [cell(b, "egeria_ms", cat), cell(b, "pytorch_ms", cat)]
        rows.append(f"| {cat} | " + " | ".join(cells) + " |")
    return "\n".join(rows)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--egeria", required=True)
    ap.add_argument("--models", default="resnet56:128,resnet50:16", help="name:batch, comma-separated")
    ap.add_argument("--precisions", default="f32,bf16")
    ap.add_argument("--layouts", default="auto,blocked,nhwc", help="EG_CPU_LAYOUT values, each run every round")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--iterations", type=int, default=8)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", help="also write the JSON here")
    a = ap.parse_args()
    if a.repeats < 1 or a.iterations < 1:
        ap.error("--repeats and --iterations must be at least 1")
    bad = [lay for lay in a.layouts.split(",") if lay not in ("auto", "blocked", "nhwc")]
    if bad:
        ap.error(f"--layouts: {','.join(bad)} (each of auto, blocked, nhwc)")
    models = []
    for m in a.models.split(","):
        name, _, bs = m.partition(":")
        if not bs.isdigit() or int(bs) < 1:
            ap.error(f"--models: {m!r} is not name:batch")
        models.append((name, int(bs)))
    try:
        import torch  # noqa: F401
        torch_ok = True
    except ImportError:
        print("cpu_step: PyTorch is not installed (Debian: python3-torch); egeria only", file=sys.stderr)
        torch_ok = False
    results = []
    for name, bs in models:
        for precision in a.precisions.split(","):
            print(f"cpu_step: {name} b{bs} {precision}", file=sys.stderr)
            results.append(measure(a, name, bs, precision, torch_ok))
    # Debian's PyTorch runs its matmuls on the generic BLAS without it (25x slower).
    blas = subprocess.run(["dpkg", "-s", "libopenblas0-pthread"], capture_output=True, text=True).returncode == 0
    if torch_ok and not blas:
        print("cpu_step: libopenblas0-pthread is not installed: PyTorch's figures are not its users'", file=sys.stderr)
    out = {"lscpu": lscpu(), "libopenblas0_pthread": blas, "results": results, "table": table(results),
           "breakdown_table": breakdown_table(results)}
    print(json.dumps(out, indent=2))
    print(out["table"] + "\n\n" + out["breakdown_table"], file=sys.stderr)
    if a.out:
        with open(a.out, "w") as f:
            json.dump(out, f, indent=2)


if __name__ == "__main__":
    main()
