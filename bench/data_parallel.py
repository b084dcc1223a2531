#!/usr/bin/env python3
"""Data-parallel training step on one machine: egeria under mpirun against one process,
and what PyTorch DDP sends, measured in one run.

  bench/data_parallel.py --egeria build/egeria [--model resnet56] [--global-batch 128]
                         [--ranks 2] [--repeats 5] [--iterations 10] [--no-torch]

1. Throughput: `egeria bench step` as 1 process x `ranks` threads against `ranks`
   processes x 1 thread (mpirun), with the gradient all-reduce overlapped with backward
   and after it, the same global batch; the three alternate `--repeats` times, and the
   medians are reported with the median per-repeat ratios. For the data-parallel runs:
   each step's wait for communication after backward and the time inside the
   all-reduces; what the all-reduces took beyond the wait was hidden behind backward.
2. Bytes per step with the first 0..3 freezing units frozen (the paper's partition, as
   --freeze static freezes them): egeria's all-reduced bytes, checked to fall by exactly
   the frozen parameters' bytes, and PyTorch DDP's for the same parameters frozen after
   wrapping (find_unused_parameters=True, which DDP needs for that; a comm hook counts
   the bytes of each bucket it all-reduces), plus DDP's step time beside egeria's.
PyTorch missing (or --no-torch): the DDP columns are left out.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys


def mpirun(ranks):
    return ["mpirun", "--allow-run-as-root", "--oversubscribe", "--mca", "btl", "self,vader", "-np", str(ranks)]


def egeria_step(args, ranks, threads, overlap="on", frozen=0, iterations=None):
    cmd = ([] if ranks == 1 else mpirun(ranks)) + [
        args.egeria, "bench", "step", "--model", args.model, "--batch-size", str(args.global_batch // ranks),
        "--threads", str(threads), "--iterations", str(iterations or args.iterations),
        "--grad-sync-overlap", overlap, "--frozen-units", str(frozen), "--bucket-cap-mb", str(args.bucket_cap_mb)]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return json.loads([l for l in out.splitlines() if l.startswith("{")][-1])


def ddp_worker(rank, world, depth, batch, frozen_params, iterations, port, result):
    import time
    import torch
    import torch.distributed as dist
    import torch.nn as nn
    import torch.nn.functional as F
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from compare_pytorch import torch_resnet
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.set_num_threads(1)
    torch.manual_seed(0)
    m = nn.parallel.DistributedDataParallel(torch_resnet(depth, nn, F), find_unused_parameters=True)
    # Frozen after wrapping, as a freezing policy freezes during training: the first
    # parameters in registration order (the network's front), as many as egeria froze.
    left = frozen_params
    for p in m.module.parameters():
        if left <= 0:
            break
        p.requires_grad_(False)
        left -= p.numel()
    assert left == 0, "the frozen prefix does not end at a parameter boundary"
    sent = [0]

    def counting_allreduce(state, bucket):
        sent[0] += bucket.buffer().numel() * bucket.buffer().element_size()
        fut = dist.all_reduce(bucket.buffer(), async_op=True).get_future()
        return fut.then(lambda f: f.value()[0])

    m.register_comm_hook(None, counting_allreduce)
    opt = torch.optim.SGD([p for p in m.parameters() if p.requires_grad], lr=0.01, momentum=0.9)
    x = torch.randn(batch, 3, 32, 32)
    y = torch.randint(0, 10, (batch,))
    times = []
    for i in range(3 + iterations):
        dist.barrier()
        t0 = time.perf_counter()
        sent[0] = 0
        loss = F.cross_entropy(m(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if i >= 3:
            times.append(1000 * (time.perf_counter() - t0))
    if rank == 0:
        result.put({"bytes_per_step": sent[0], "median_step_ms": statistics.median(times),
                    "parameters": sum(p.numel() for p in m.module.parameters())})
    dist.destroy_process_group()


def ddp(depth, world, batch, frozen_params, iterations):
    import torch.multiprocessing as mp
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    port = 29500 + os.getpid() % 1000
    procs = [ctx.Process(target=ddp_worker, args=(r, world, depth, batch, frozen_params, iterations, port, q))
             for r in range(world)]
    for p in procs:
        p.start()
    r = q.get(timeout=600)
    for p in procs:
        p.join()
    return r


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--egeria", required=True)
    ap.add_argument("--model", default="resnet56")
    ap.add_argument("--global-batch", type=int, default=128)
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--iterations", type=int, default=10)
    ap.add_argument("--bucket-cap-mb", type=float, default=25)
    ap.add_argument("--no-torch", action="store_true")
    ap.add_argument("--no-bytes", action="store_true", help="only the throughput table")
    args = ap.parse_args()
    torch_ok = not args.no_torch
    if torch_ok:
        try:
            import torch  # noqa: F401
        except ImportError:
            print("PyTorch is not installed: the DDP columns are left out")
            torch_ok = False

    # 1. throughput, interleaved
    runs = {"1 process": [], "overlap": [], "after backward": []}
    for _ in range(args.repeats):
        runs["1 process"].append(egeria_step(args, 1, args.ranks))
        runs["overlap"].append(egeria_step(args, args.ranks, 1, "on"))
        runs["after backward"].append(egeria_step(args, args.ranks, 1, "off"))
    med = lambda rs, k: statistics.median(r[k] for r in rs)
    print(f"{args.model}, global batch {args.global_batch}: 1 process x {args.ranks} threads against "
          f"{args.ranks} ranks x 1 thread, buckets of {args.bucket_cap_mb} MiB (the first 1 MiB at most), "
          f"{args.repeats} interleaved repeats (medians)")
    print(f"{'':16} {'img/s':>8} {'step ms':>8} {'vs 1 proc':>9} {'wait ms':>8} {'allreduce ms':>12} {'hidden':>7}")
    for name, rs in runs.items():
        ratio = statistics.median(r["images_per_second"] / b["images_per_second"]
                                  for r, b in zip(rs, runs["1 process"]))
        line = f"{name:16} {med(rs, 'images_per_second'):8.1f} {med(rs, 'median_step_ms'):8.1f} {ratio:8.3f}x"
        if name != "1 process":
            wait, comm = med(rs, "median_sync_wait_ms"), med(rs, "median_allreduce_ms")
            hidden = 1 - wait / comm if comm > 0 else 0
            line += f" {wait:8.2f} {comm:12.2f} {100 * hidden:6.0f}%"
        print(line)

    if args.no_bytes:
        return
    # 2. bytes per step with frozen units
    print("\nbytes all-reduced per step and rank, the first k freezing units frozen (--frozen-units k)")
    print(f"{'k':>2} {'frozen params':>13} {'egeria bytes':>12} {'drop':>9} {'= frozen x 4':>12}"
          + (f" {'DDP bytes':>10} {'DDP step ms':>11} {'egeria step ms':>14}" if torch_ok else ""))
    base = None
    for k in range(4):
        r = egeria_step(args, args.ranks, 1, "on", k, iterations=3)
        b = r["gradient_sync_bytes_per_step"]
        base = b if base is None else base
        exact = base - b == 4 * r["frozen_parameters"]
        line = f"{k:2} {r['frozen_parameters']:13} {b:12} {base - b:9} {str(exact):>12}"
        if torch_ok:
            d = ddp(int(args.model[len("resnet"):]), args.ranks, args.global_batch // args.ranks,
                    r["frozen_parameters"], 3)
            line += f" {d['bytes_per_step']:10} {d['median_step_ms']:11.1f} {r['median_step_ms']:14.1f}"
        print(line, flush=True)
        if not exact:
            sys.exit("egeria's bytes per step did not fall by exactly the frozen parameters' bytes")


if __name__ == "__main__":
    main()
