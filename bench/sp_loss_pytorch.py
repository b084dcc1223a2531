#!/usr/bin/env python3
"""The SP-loss Gram (Egeria's plasticity, §4.2.1) written as a PyTorch op sequence,
timed on the shapes of egeria's op table (tests/op_cases_sp.cpp), so that the figures
sit beside `eg_bench_ops --benchmark_filter=sp_gram`:

    G = Q Q^T with Q = A.reshape(b, -1); each row of G divided by its L2 norm.

  bench/sp_loss_pytorch.py [--device cuda:0] [--repeats 5]

Prints one JSON line per shape: median milliseconds and GFLOP/s (2 b^2 F flops). Each
iteration waits for the device, as egeria's benchmark harness does (bench/bench_ops.cpp).
PyTorch missing, or no GPU for a cuda device: prints a message and exits 0.
"""
import argparse
import json
import statistics
import time

SHAPES = {
    "b128_16x32x32": (128, 16, 32, 32),
    "b128_32x16x16": (128, 32, 16, 16),
    "b128_64x8x8": (128, 64, 8, 8),
    "b64_32tok_d512": (64, 32, 512),
}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda:0")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--iterations", type=int, default=200)
    a = ap.parse_args()
    try:
        import torch
    except ImportError:
        print("sp_loss_pytorch: PyTorch is not installed")
        return
    dev = torch.device(a.device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        print("sp_loss_pytorch: no CUDA device")
        return
    torch.backends.cuda.matmul.allow_tf32 = False  # egeria's kernel is exact f32

    def sync():
        if dev.type == "cuda":
            torch.cuda.synchronize()

    def gram(x):
        q = x.reshape(x.shape[0], -1)
        g = q @ q.t()
        return torch.nn.functional.normalize(g, p=2, dim=1, eps=1e-12)

    for name, shape in SHAPES.items():
        x = torch.randn(*shape, device=dev)
        for _ in range(10):
            gram(x)
        sync()
        runs = []
        for _ in range(a.repeats):
            t = time.perf_counter()
            for _ in range(a.iterations):
                gram(x)
                sync()  # one wait per iteration, as egeria's benchmark harness does
            runs.append((time.perf_counter() - t) / a.iterations)
        ms = statistics.median(runs) * 1e3
        b = shape[0]
        f = x.numel() // b
        print(json.dumps({"case": "sp_gram/" + name, "engine": "pytorch " + torch.__version__, "device": a.device,
                          "median_ms": ms, "gflops": 2 * b * b * f / (ms * 1e-3) / 1e9}))


if __name__ == "__main__":
    main()
