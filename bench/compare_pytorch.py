#!/usr/bin/env python3
"""Training-step throughput, egeria vs PyTorch, measured side by side in one run.

  bench/compare_pytorch.py --egeria build/egeria [--model resnet56] [--batch-size 128]
                           [--threads 2] [--device cpu] [--repeats 5] [--precision bf16]

Runs `egeria bench step` and the same model in PyTorch (CIFAR ResNet with option-A
shortcuts, SGD momentum 0.9, cross-entropy, random 32x32x3 inputs; ResNet-50 as
torchvision's, which ours matches parameter for parameter, on random 224x224x3 inputs of
1000 classes; MobileNetV2 as torchvision's with the CIFAR strides egeria uses at 32 pixels
(stem and first 24-channel block at stride 1), on random 32x32x3 inputs of 10 classes; or a Transformer
preset as nn.Transformer, post-LN with tied embeddings, on random ids, --seq-len tokens a
sentence), alternating the two `--repeats` times, and reports the median images/s (a
Transformer's: target tokens/s; the JSON keeps the "images" names) of each and their
ratio.
PyTorch's best eager configuration is taken: channels_last vs contiguous, whichever
is faster; on a GPU (--device cuda:0) torch.compile is measured and compared too. On the
CPU egeria runs twice per repeat, as it ships (Winograd for the 3x3 convolutions with
enough channels) and with `--cpu-winograd off` (every convolution direct, as PyTorch's),
so the ratio can be read both ways. With --precision bf16 egeria runs `bench step
--precision bf16` and PyTorch its forward and loss under torch.autocast(device,
torch.bfloat16), as its users write mixed precision; with --precision fp16 (GPUs) egeria runs
its dynamic loss scaling and PyTorch autocast to torch.float16 with a GradScaler, as AMP's
users write it; --pytorch-precision sets PyTorch's
alone (egeria f32 against PyTorch's autocast, say, where egeria has no bf16 on the device).
--configs picks PyTorch's configurations (e.g. channels_last, to skip a long compile).
--warmup-repeats N runs N more repeats first and leaves them out of every figure (the
JSON lists them apart): on the H100 and H200 of 2026-11 egeria's first ResNet-50 repeat
ran 15-28% slower than the next with its algorithms timed, PyTorch's up to 8%, so 1 on a
GPU by default, 0 on the CPU.
PyTorch missing: prints a message and exits 0.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time


# Each `egeria bench step` run's step times, in the order they ran (warm-up repeats and
# --cpu-winograd off runs included), kept in the JSON: a slow start shows apart from a
# slow run.
STEP_MS = []

# egeria's Transformer presets (models/transformer.cpp): post-LN encoder-decoder, tied
# embedding and output projection, sinusoidal positions, dropout 0.1, bench step's vocab.
TRANSFORMERS = {"transformer-tiny": (512, 8, 2048, 2), "transformer-small": (256, 4, 1024, 6),
                "transformer-base": (512, 8, 2048, 6)}
VOCAB = 8000


def torch_transformer(name, nn, torch):
    d, heads, ffn, layers = TRANSFORMERS[name]

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(VOCAB, d)
            self.core = nn.Transformer(d, heads, layers, layers, ffn, 0.1, batch_first=True)
            pos = torch.arange(256).unsqueeze(1) * torch.exp(torch.arange(0, d, 2) * (-9.210340371976184 / d))
            pe = torch.zeros(256, d)
            pe[:, 0::2], pe[:, 1::2] = torch.sin(pos), torch.cos(pos)
            self.register_buffer("pe", pe)

        def forward(self, src, tgt):
            t = tgt.size(1)
            embed = lambda ids: self.emb(ids) * d ** 0.5 + self.pe[:ids.size(1)]
            mask = torch.triu(torch.full((t, t), float("-inf"), device=src.device), 1)
            h = self.core(embed(src), embed(tgt), tgt_mask=mask)
            return h @ self.emb.weight.t()

    return Net()


def torch_resnet(depth, nn, F):
    class Block(nn.Module):
        def __init__(self, cin, cout, stride):
            super().__init__()
            self.c1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
            self.b1 = nn.BatchNorm2d(cout)
            self.c2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
            self.b2 = nn.BatchNorm2d(cout)
            self.pad = cout - cin
            self.stride = stride

        def forward(self, x):
            h = F.relu(self.b1(self.c1(x)))
            h = self.b2(self.c2(h))
            s = x
            if self.stride != 1 or self.pad:
                s = F.pad(x[:, :, ::self.stride, ::self.stride], (0, 0, 0, 0, 0, self.pad))
            return F.relu(h + s)

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            n = (depth - 2) // 6
            layers = [nn.Conv2d(3, 16, 3, 1, 1, bias=False), nn.BatchNorm2d(16), nn.ReLU()]
            cin = 16
            for i, w in enumerate((16, 32, 64)):
                for b in range(n):
                    layers.append(Block(cin, w, 2 if i > 0 and b == 0 else 1))
                    cin = w
            self.body = nn.Sequential(*layers)
            self.fc = nn.Linear(64, 10)

        def forward(self, x):
            return self.fc(F.adaptive_avg_pool2d(self.body(x), 1).flatten(1))

    return Net()


_torch_setups = {}
TF32 = False  # --tf32: both engines may use TF32 tensor cores for f32 convs/matmuls
PRECISION = "f32"  # --precision: egeria's bench step --precision
TORCH_PRECISION = "f32"  # --pytorch-precision (default --precision's): bf16/fp16 run PyTorch under torch.autocast
CUDNN = "find"  # --egeria-cudnn: how egeria picks its convolution algorithms on a GPU


def torch_setup(model_name, bs, threads, config, device, seq_len=32):
    """Model, optimizer and a fixed batch, built once per configuration (so that
    torch.compile compiles once, not once per repeat)."""
    key = (model_name, bs, config, device)
    if key in _torch_setups:
        return _torch_setups[key]
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    dev = torch.device(device)
    if model_name in TRANSFORMERS:  # (source, target input) ids and target ids, as bench step's
        m = torch_transformer(model_name, nn, torch).to(dev)
        x = (torch.randint(4, VOCAB, (bs, seq_len), device=dev), torch.randint(4, VOCAB, (bs, seq_len), device=dev))
        y = torch.randint(4, VOCAB, (bs * seq_len,), device=dev)
    elif model_name == "resnet50":  # egeria's resnet50 is torchvision's (v1.5, 25,557,032 parameters)
        import torchvision
        m = torchvision.models.resnet50().to(dev)
        x = torch.randn(bs, 3, 224, 224, device=dev)
        y = torch.arange(bs, device=dev) % 1000
    elif model_name == "mobilenetv2":  # torchvision's at egeria's 32-pixel strides (2,236,682 parameters)
        import torchvision
        m = torchvision.models.mobilenet_v2(num_classes=10)
        m.features[0][0].stride = (1, 1)  # the stem
        m.features[2].conv[1][0].stride = (1, 1)  # the first 24-channel block's depthwise convolution
        m = m.to(dev)
        x = torch.randn(bs, 3, 32, 32, device=dev)
        y = torch.arange(bs, device=dev) % 10
    else:
        m = torch_resnet(int(model_name[len("resnet"):]), nn, F).to(dev)
        x = torch.randn(bs, 3, 32, 32, device=dev)
        y = torch.arange(bs, device=dev) % 10
    opt = torch.optim.SGD(m.parameters(), lr=0.01, momentum=0.9, weight_decay=5e-4)
    if config == "channels_last" and model_name not in TRANSFORMERS:
        m = m.to(memory_format=torch.channels_last)
        x = x.to(memory_format=torch.channels_last)
    if dev.type == "cuda":
        torch.backends.cudnn.benchmark = True
        torch.backends.cudnn.allow_tf32 = TF32
        torch.backends.cuda.matmul.allow_tf32 = TF32
    fwd = torch.compile(m) if config == "compile" else m
    # fp16: GradScaler's dynamic loss scaling, as egeria's --loss-scale dynamic
    scaler = torch.cuda.amp.GradScaler() if TORCH_PRECISION == "fp16" else None
    _torch_setups[key] = (fwd, opt, x, y, F, scaler)
    return _torch_setups[key]


OPTIMIZER_LABEL = "eg::optimizer"  # the optimizer's part of a step, in profiles
TORCH_WARMUP = 3


def torch_step(model_name, bs, threads, config, device="cpu", seq_len=32):
    """One training step of the configuration as a function of no arguments (forward and loss
    under autocast where TORCH_PRECISION asks, backward, the optimizer within OPTIMIZER_LABEL's
    record_function), returning when the device is done."""
    fwd, opt, x, y, F, scaler = torch_setup(model_name, bs, threads, config, device, seq_len)
    transformer = model_name in TRANSFORMERS
    import contextlib
    import torch
    low = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(TORCH_PRECISION)
    autocast = torch.autocast(torch.device(device).type, dtype=low) if low else contextlib.nullcontext()

    def step():
        with autocast:
            out = fwd(*x) if transformer else fwd(x)
            loss = F.cross_entropy(out.reshape(-1, out.size(-1)), y)
        with torch.profiler.record_function(OPTIMIZER_LABEL):
            opt.zero_grad()
        if scaler is None:
            loss.backward()
            with torch.profiler.record_function(OPTIMIZER_LABEL):
                opt.step()
        else:
            scaler.scale(loss).backward()
            with torch.profiler.record_function(OPTIMIZER_LABEL):
                scaler.step(opt)
                scaler.update()
        loss.item()  # waits for the device, as egeria's bench step does
    return step


def bench_torch(model_name, bs, threads, iters, config, device="cpu", seq_len=32):
    """config: "contiguous", "channels_last" or "compile" (torch.compile of the model).
    Images per second, or a Transformer's target tokens per second."""
    step = torch_step(model_name, bs, threads, config, device, seq_len)
    times = []
    for i in range(TORCH_WARMUP + iters):
        t = time.perf_counter()
        step()
        if i >= TORCH_WARMUP:
            times.append(time.perf_counter() - t)
    return bs * (seq_len if model_name in TRANSFORMERS else 1) / statistics.median(times)


def profile_torch(model_name, bs, threads, iters, config, device="cpu", seq_len=32):
    """The step on the CPU under torch.profiler, after the warm-up: {"step_ms": the step's wall
    time under the profiler, "optimizer_ms": the CPU time of everything under OPTIMIZER_LABEL,
    "ops_ms": the rest by the op the user's code or autograd called (each event's own CPU time
    counted to the outermost aten:: op it ran within: a convolution's backward takes its fills,
    a ReLU its clamp_min; autograd's own wrappers by their names)}, a step's worth of each (the
    profiler adds a few microseconds an op)."""
    import torch
    step = torch_step(model_name, bs, threads, config, device, seq_len)
    for _ in range(TORCH_WARMUP):
        step()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        t = time.perf_counter()
        for _ in range(iters):
            step()
        wall = time.perf_counter() - t
    ops, optimizer = {}, 0.0
    for e in prof.events():
        called, up = e.name, e
        while up is not None and called != OPTIMIZER_LABEL:
            if up.name.startswith("aten::") or up.name == OPTIMIZER_LABEL:
                called = up.name
            up = up.cpu_parent
        if called == OPTIMIZER_LABEL:
            optimizer += e.self_cpu_time_total
        else:
            ops[called] = ops.get(called, 0.0) + e.self_cpu_time_total
    per_step = 1e-3 / iters  # microseconds in all -> ms a step
    return {"step_ms": 1e3 * wall / iters, "optimizer_ms": optimizer * per_step,
            "ops_ms": {k: v * per_step for k, v in sorted(ops.items(), key=lambda kv: -kv[1])}}


def bench_egeria(exe, model, bs, threads, device, iters, winograd=None, seq_len=32):
    env = dict(os.environ)
    extra = ([] if winograd is None else ["--cpu-winograd", winograd]) + ["--precision", PRECISION]
    if model in TRANSFORMERS:
        extra += ["--seq-len", str(seq_len)]
    if device.startswith("cuda"):
        # find: timed once per shape, as torch.backends.cudnn.benchmark above; heuristic:
        # cuDNN's own ranking, the engine's default
        env["EG_CUDNN_BENCHMARK"] = "1" if CUDNN == "find" else "0"
        env["EG_ALLOW_TF32"] = "1" if TF32 else "0"
    out = subprocess.run([exe, "bench", "step", "--model", model, "--batch-size", str(bs), "--threads", str(threads),
                          "--device", device, "--iterations", str(iters)] + extra, check=True, capture_output=True, text=True, env=env)
    j = json.loads(out.stdout.strip().splitlines()[-1])
    STEP_MS.append(j.get("step_ms"))
    return j["tokens_per_second" if model in TRANSFORMERS else "images_per_second"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--egeria", required=True)
    ap.add_argument("--model", default="resnet56")
    ap.add_argument("--batch-size", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--iterations", type=int, default=10)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--warmup-repeats", type=int,
                    help="repeats run first and left out of the figures (default: 1 on a GPU, 0 on the CPU)")
    ap.add_argument("--tf32", action="store_true", help="GPU: allow TF32 in both engines (default: exact f32)")
    ap.add_argument("--seq-len", type=int, default=32, help="Transformers: tokens per sentence (throughput in target tokens)")
    ap.add_argument("--precision", choices=["f32", "bf16", "fp16"], default="f32",
                    help="bf16: egeria's --precision bf16 against PyTorch under torch.autocast; fp16 (GPUs): "
                    "egeria's --precision fp16 (dynamic loss scaling) against autocast to float16 with a GradScaler")
    ap.add_argument("--pytorch-precision", choices=["f32", "bf16", "fp16"],
                    help="PyTorch's precision when it differs from egeria's (default: --precision)")
    ap.add_argument("--egeria-cudnn", choices=["find", "heuristic"], default="find",
                    help="GPU: egeria's convolution algorithms timed per shape (EG_CUDNN_BENCHMARK=1, as PyTorch's "
                    "cudnn.benchmark) or cuDNN's heuristic ranking (egeria's default)")
    ap.add_argument("--out", help="also write the JSON result to this file")
    ap.add_argument("--configs", help="PyTorch's configurations, comma-separated, of contiguous, channels_last, "
                    "compile (default: both eager layouts, and compile on a GPU)")
    a = ap.parse_args()
    global TF32, PRECISION, TORCH_PRECISION, CUDNN
    TF32 = a.tf32
    CUDNN = a.egeria_cudnn
    PRECISION = a.precision
    TORCH_PRECISION = a.pytorch_precision or a.precision
    try:
        import torch
    except ImportError:
        print("compare_pytorch: PyTorch is not installed (Debian: python3-torch); egeria only")
        torch = None
    gpu = a.device.startswith("cuda")
    if "fp16" in (PRECISION, TORCH_PRECISION) and not gpu:
        ap.error("--precision fp16 needs a GPU (--device cuda:0): egeria and PyTorch's CPU autocast run bf16 only")
    if torch is not None and gpu and not torch.cuda.is_available():
        print("compare_pytorch: this PyTorch has no CUDA device; egeria only")
        torch = None
    # On the GPU also torch.compile (PyTorch >= 2); on the CPU eager in both layouts.
    configs = ["contiguous"] if a.model in TRANSFORMERS else ["contiguous", "channels_last"]
    if gpu and torch is not None and hasattr(torch, "compile"):
        configs.append("compile")
    if a.configs:
        configs = a.configs.split(",")
        bad = [c for c in configs if c not in ("contiguous", "channels_last", "compile")]
        if bad or not [c for c in configs if c != "compile"]:
            ap.error(f"--configs: {a.configs!r} needs one of contiguous, channels_last (and may add compile)")
    if a.model == "resnet50" and not gpu:
        print("compare_pytorch: note: ResNet-50 at 224 px on the CPU takes seconds a step", file=sys.stderr)
    warmup = a.warmup_repeats if a.warmup_repeats is not None else (1 if gpu else 0)
    if a.repeats < 1 or warmup < 0:
        ap.error("--repeats must be at least 1 and --warmup-repeats at least 0")
    eg, eg_direct, pt = [], [], {c: [] for c in configs}
    for _ in range(warmup + a.repeats):
        eg.append(bench_egeria(a.egeria, a.model, a.batch_size, a.threads, a.device, a.iterations, None, a.seq_len))
        if not gpu and PRECISION == "f32" and a.model not in TRANSFORMERS:  # bf16 has no Winograd: "off" is the same run
            eg_direct.append(bench_egeria(a.egeria, a.model, a.batch_size, a.threads, a.device, a.iterations, "off"))
        if torch is not None:
            for c in configs:
                pt[c].append(bench_torch(a.model, a.batch_size, a.threads, a.iterations, c, a.device, a.seq_len))
    # The warm-up repeats, apart: every figure below is of the others.
    warm = {"egeria": eg[:warmup], "egeria_direct": eg_direct[:warmup], **{c: v[:warmup] for c, v in pt.items()}}
    eg, eg_direct, pt = eg[warmup:], eg_direct[warmup:], {c: v[warmup:] for c, v in pt.items()}
    res = {"model": a.model, "batch_size": a.batch_size, "threads": a.threads, "device": a.device, "tf32": a.tf32,
           "seq_len": a.seq_len if a.model in TRANSFORMERS else None,
           "precision": a.precision, "pytorch_precision": TORCH_PRECISION,
           "egeria_cudnn": a.egeria_cudnn if gpu else None,
           "egeria_images_per_second": statistics.median(eg), "repeats": a.repeats, "warmup_repeats": warmup}
    if warmup:
        res["warmup_images_per_second"] = {k: v for k, v in warm.items() if v}
    res["egeria_step_ms_by_run"] = STEP_MS
    if eg_direct:
        res["egeria_direct_images_per_second"] = statistics.median(eg_direct)
    if torch is not None:
        res["pytorch_version"] = torch.__version__
        res["pytorch_images_per_second_by_config"] = {c: statistics.median(v) for c, v in pt.items()}
        eager = [c for c in configs if c != "compile"]
        best = max(eager, key=lambda c: statistics.median(pt[c]))
        res["pytorch_images_per_second"] = statistics.median(pt[best])
        res["pytorch_config"] = best
        res["ratio_egeria_over_pytorch"] = res["egeria_images_per_second"] / res["pytorch_images_per_second"]
        # The VM's speed drifts by up to 30% within minutes; each repeat runs both engines
        # back to back, so the per-repeat ratios are the drift-robust figure.
        res["egeria_images_per_second_by_repeat"] = eg
        res["pytorch_images_per_second_by_repeat"] = pt[best]
        res["ratio_by_repeat"] = [e / p for e, p in zip(eg, pt[best])]
        res["ratio_median_of_repeats"] = statistics.median(res["ratio_by_repeat"])
        if eg_direct:
            res["egeria_direct_images_per_second_by_repeat"] = eg_direct
            res["ratio_direct_by_repeat"] = [e / p for e, p in zip(eg_direct, pt[best])]
            res["ratio_direct_median_of_repeats"] = statistics.median(res["ratio_direct_by_repeat"])
        if "compile" in pt:
            res["ratio_egeria_over_torch_compile"] = res["egeria_images_per_second"] / statistics.median(pt["compile"])
    print(json.dumps(res, indent=2))
    if a.out:
        with open(a.out, "w") as f:
            json.dump(res, f, indent=2)


if __name__ == "__main__":
    main()
