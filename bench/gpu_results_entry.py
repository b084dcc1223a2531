#!/usr/bin/env python3
"""One GPU session's object for docs/gpu-results.json, from tools/gpu-experiments' results.

  bench/gpu_results_entry.py --results DIR [--commit SHA] [--gpu NAME] > entry.json

DIR holds what the experiments wrote: r50.json, r50-nchw.json (the bf16 step with
EG_CUDA_CHANNELS_LAST=0: NCHW throughout) and r50-f32.json (bench/compare_pytorch.py
--out: egeria's ResNet-50 step in bf16 against PyTorch AMP, and in f32 against PyTorch
f32; each figure is filed under the precision its JSON records), folder/
summary.json (an `egeria train` from a JPEG folder made on the machine), tfm.json
(transformer-small against PyTorch AMP), r50-fp16.json and tfm-fp16.json (both in fp16
against PyTorch's float16 autocast with a GradScaler), mnv2.json and mnv2-grouped-nhwc.json (MobileNetV2 bf16 against PyTorch AMP; the second with
EG_CUDA_GROUPED_NHWC=1), graphs.jsonl (`egeria bench step` lines,
--cuda-graphs off and on alternating), dest-<on|off>.jsonl (the same for ResNet-50 bf16, gradients added where
they live against EG_GRAD_DESTINATIONS=0), tgraphs-<off|on>-<rep>/summary.json (translation training,
--cuda-graphs off and on alternating), gpuref-<inline|side>-<rep>/summary.json (training runs with
Egeria's reference on the GPU, inline and on its side stream), and tools/gpu-check's outputs where they ran
(gpu-check-tests/tests.log, gpu-check-bench/compare_pytorch_cuda.json). A figure that was not measured, or that the
engine cannot produce yet, is null, and "missing" says why; nothing is filled in.
"""
import argparse
import datetime
import json
import os
import re
import subprocess


def load(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def test_counts(path):
    """A GoogleTest log's passed count and failed tests (parametrised ones by name), or None."""
    try:
        with open(path) as f:
            log = f.read()
    except OSError:
        return None
    passed = re.findall(r"^\[  PASSED  \] (\d+) test", log, re.M)
    return {"passed": int(passed[-1]) if passed else 0,
            "failed": sorted(set(re.findall(r"^\[  FAILED  \] ([^\s,]+\.[^\s,]+)", log, re.M)))}


def folder_steady_rate(path, batch):
    """Images a second between the first epoch's last step record and the run's last one,
    from metrics.jsonl's cumulative train_seconds (evaluation not counted), or None."""
    try:
        with open(path) as f:
            steps = [j for j in map(json.loads, f) if j.get("type") == "step"]
    except (OSError, ValueError):
        return None
    if not batch or not steps:
        return None
    first = [j for j in steps if j.get("epoch") == steps[0].get("epoch")][-1]
    last = steps[-1]
    dt = last.get("train_seconds", 0) - first.get("train_seconds", 0)
    return (last["step"] - first["step"]) * batch / dt if dt > 0 else None


def graph_figures(path):
    """From `egeria bench step` lines with --cuda-graphs off and on alternating: per model,
    the median images a second each way and the on/off ratio of each pair, or None."""
    try:
        with open(path) as f:
            lines = [json.loads(l) for l in f if l.strip()]
    except (OSError, ValueError):
        return None
    out = {}
    for model in sorted({l.get("model") for l in lines}):
        runs = {g: [l["images_per_second"] for l in lines if l.get("model") == model and l.get("cuda_graphs") == g]
                for g in ("off", "on")}
        pairs = list(zip(runs["off"], runs["on"]))
        if not pairs:
            continue
        med = lambda v: sorted(v)[len(v) // 2]
        out[f"{model}_f32_cuda_graphs_img_s"] = med(runs["on"])
        out[f"{model}_f32_eager_img_s"] = med(runs["off"])
        out[f"{model}_cuda_graphs_ratio_by_pair"] = [on / off for off, on in pairs]
    return out or None


def destination_figures(results):
    """From dest-<off|on|graphs>.jsonl (`egeria bench step` ResNet-50 bf16 lines, gradients
    added where they live against EG_GRAD_DESTINATIONS=0 and against --cuda-graphs on,
    alternating): the median images a second of each, the ratio of each round, and the
    eager step's host time against its step time; or None."""
    runs = {}
    for v in ("off", "on", "graphs"):
        try:
            with open(os.path.join(results, f"dest-{v}.jsonl")) as f:
                runs[v] = [json.loads(l) for l in f if l.strip()]
        except (OSError, ValueError):
            runs[v] = []
    med = lambda v: sorted(v)[len(v) // 2]
    img = lambda v: [r["images_per_second"] for r in runs[v] if "images_per_second" in r]
    pairs = list(zip(img("off"), img("on")))
    if not pairs:
        return None
    e = {
        "resnet50_bf16_grad_destinations_img_s": med(img("on")),
        "resnet50_bf16_no_grad_destinations_img_s": med(img("off")),
        "resnet50_grad_destinations_ratio_by_pair": [on / off for off, on in pairs],
    }
    host = [r["median_host_ms"] for r in runs["on"] if "median_host_ms" in r]
    if host:  # near the step time: the eager step waits for its launches
        e["resnet50_bf16_host_ms_per_step"] = med(host)
        e["resnet50_bf16_step_ms"] = med([r["median_step_ms"] for r in runs["on"]])
        # cudaMalloc/cudaFree in the timed steps (each may wait for the device): 0 expected
        e["resnet50_bf16_system_allocs_frees"] = max(r.get("system_allocs", 0) + r.get("system_frees", 0)
                                                     for r in runs["on"])
    graphed = list(zip(img("on"), img("graphs")))
    if graphed:
        e["resnet50_bf16_cuda_graphs_img_s"] = med(img("graphs"))
        e["resnet50_cuda_graphs_ratio_by_pair"] = [g / on for on, g in graphed]
    return e


def translation_graph_figures(results):
    """From tgraphs-<off|on>-<rep>/summary.json (translation training, --cuda-graphs off and
    on alternating): the median target tokens a second each way, on/off of each pair, and
    the graphed runs' captures and replayed steps; or None."""
    runs = {"off": [], "on": []}
    for rep in range(1, 10):
        for g in ("off", "on"):
            sj = load(os.path.join(results, f"tgraphs-{g}-{rep}", "summary.json"))
            if sj:
                runs[g].append(sj)
    pairs = list(zip(runs["off"], runs["on"]))
    if not pairs:
        return None
    med = lambda v: sorted(v)[len(v) // 2]
    return {
        "transformer_small_bf16_training_tok_s": med([s["tokens_per_second"] for s in runs["off"]]),
        "transformer_small_bf16_training_cuda_graphs_tok_s": med([s["tokens_per_second"] for s in runs["on"]]),
        "transformer_small_cuda_graphs_ratio_by_pair": [on["tokens_per_second"] / off["tokens_per_second"]
                                                        for off, on in pairs],
        "transformer_small_cuda_graph_captures": [s.get("cuda_graph_captures") for s in runs["on"]],
        "transformer_small_cuda_graph_replayed_steps": [s.get("cuda_graph_replayed_steps") for s in runs["on"]],
        "transformer_small_cuda_graphs_host_syncs_per_step": [s.get("host_syncs_per_step") for s in runs["on"]],
    }


def gpu_reference_figures(results, batch=128):
    """From gpuref-<inline|side>-<rep>/ (summary.json, metrics.jsonl): per way, the median
    images a second after the first epoch, host syncs a step, readings and overhead, and
    side/inline for each rep both ran; or None."""
    runs = {}
    for how in ("inline", "side"):
        for rep in range(1, 10):
            d = os.path.join(results, f"gpuref-{how}-{rep}")
            s = load(os.path.join(d, "summary.json"))
            if s:
                rate = folder_steady_rate(os.path.join(d, "metrics.jsonl"), batch)
                runs.setdefault(how, {})[rep] = dict(s, steady_img_s=rate)
    if not runs:
        return None

    def med(v):
        w = sorted(x for x in v if isinstance(x, (int, float)))
        return w[len(w) // 2] if w else None

    out = {}
    for how, key in (("inline", "inline"), ("side", "side_stream")):
        r = list(runs.get(how, {}).values())
        out[f"gpu_reference_{key}_resnet56_bf16_img_s"] = med([s.get("steady_img_s") for s in r])
        out[f"gpu_reference_{key}_host_syncs_per_step"] = med([s.get("host_syncs_per_step") for s in r])
        out[f"gpu_reference_{key}_readings"] = med([(s.get("freeze_stats") or {}).get("evaluations_completed") for s in r])
        out[f"gpu_reference_{key}_overhead_fraction"] = med([s.get("reference_overhead_fraction") for s in r])
    inline, side = runs.get("inline", {}), runs.get("side", {})
    out["gpu_reference_side_stream_ratio_by_pair"] = [
        side[k]["steady_img_s"] / inline[k]["steady_img_s"] for k in sorted(set(inline) & set(side))
        if inline[k].get("steady_img_s") and side[k].get("steady_img_s")]
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--results", required=True)
    ap.add_argument("--commit", default=os.environ.get("EG_COMMIT"))
    ap.add_argument("--gpu")
    a = ap.parse_args()
    gpu = a.gpu
    if gpu is None:
        try:
            gpu = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                                 text=True, check=True).stdout.strip().splitlines()[0]
        except (OSError, subprocess.CalledProcessError, IndexError):
            gpu = None
    r50, r50f, folder, tfm = (load(os.path.join(a.results, n))
                              for n in ("r50.json", "r50-f32.json", "folder/summary.json", "tfm.json"))
    e = {"date": datetime.date.today().isoformat(), "gpu": gpu, "commit": a.commit, "missing": {}}

    def put(key, src, field, why):
        v = src.get(field) if src else None
        e[key] = v
        if v is None:
            e["missing"][key] = why

    def by_precision(key_fmt, src, field, what):  # the figure under the name of the precision it ran in
        p = (src or {}).get("precision", "bf16")
        put(key_fmt.format("f32" if p == "f32" else "bf16"), src, field, f"the {what} step did not finish")

    for p in ("bf16", "f32"):
        for key in ("resnet50_{}_synthetic_img_s", "resnet50_{}_folder_img_s", "transformer_small_{}_tok_s"):
            e[key.format(p)] = None
    by_precision("resnet50_{}_synthetic_img_s", r50, "egeria_images_per_second", "r50")
    by_precision("resnet50_{}_folder_img_s", folder, "images_per_second", "folder")
    by_precision("transformer_small_{}_tok_s", tfm, "egeria_images_per_second", "tfm")
    put("resnet50_f32_vs_pytorch_f32_img_s", r50f, "egeria_images_per_second", "the r50-f32 step did not finish")
    for key in [k for k, v in e.items() if v is None and k not in e["missing"]]:
        e["missing"][key] = "not run in this configuration (see the experiments' precision)"
    put("pytorch_amp_resnet50_img_s", r50, "pytorch_images_per_second", "the r50 step did not finish")
    put("pytorch_f32_resnet50_img_s", r50f, "pytorch_images_per_second", "the r50-f32 step did not finish")
    steady = folder_steady_rate(os.path.join(a.results, "folder", "metrics.jsonl"), (folder or {}).get("batch_size"))
    if steady:  # images/s after the first epoch (summary.json's figure counts the warm-up steps too)
        e["resnet50_bf16_folder_steady_img_s"] = steady
        if r50 and r50.get("egeria_images_per_second"):
            e["folder_steady_over_synthetic"] = steady / r50["egeria_images_per_second"]
    # The steady-state step of the JPEG-folder training run (summary.json, Note [Host syncs]).
    put("host_syncs_per_step", folder, "host_syncs_per_step", "the folder step did not finish (or predates the count)")
    put("pytorch_amp_transformer_small_tok_s", tfm, "pytorch_images_per_second", "the tfm step did not finish")
    if r50:
        e["resnet50_batch_size"] = r50.get("batch_size")
        e["resnet50_ratio_by_repeat_vs_pytorch_amp"] = r50.get("ratio_by_repeat")
        # Since 2026-11-30 a first repeat of both engines is left out of the figures above
        # (0 or absent before: the slow first repeat was in them).
        e["resnet50_warmup_repeats"] = r50.get("warmup_repeats", 0)
        e["resnet50_warmup_img_s"] = r50.get("warmup_images_per_second")
        e["resnet50_egeria_step_ms_by_run"] = r50.get("egeria_step_ms_by_run")
    if r50f:
        e["resnet50_ratio_by_repeat_vs_pytorch_f32"] = r50f.get("ratio_by_repeat")
    if tfm:
        e["transformer_small_batch"] = [tfm.get("batch_size"), tfm.get("seq_len")]
        e["transformer_small_ratio_by_repeat_vs_pytorch_amp"] = tfm.get("ratio_by_repeat")
        e["transformer_small_warmup_repeats"] = tfm.get("warmup_repeats", 0)
    if folder:
        e["resnet50_folder_run"] = {k: folder.get(k) for k in ("steps", "train_seconds", "batch_size", "threads",
                                                               "workers", "precision") if k in folder}
    loader = load(os.path.join(a.results, "loader.json"))
    if loader:  # BM_Loader: images a second by workers, f32 batches and 8-bit pixel batches
        by = {}
        for b in loader.get("benchmarks", []):
            m = re.match(r"BM_Loader/workers:(\d+)/pixels:(\d)", b.get("name", ""))
            if m and b.get("items_per_second"):
                by.setdefault(m.group(1), {})["pixels" if m.group(2) == "1" else "f32"] = b["items_per_second"]
        e["loader_img_s_by_workers"] = by
    heur = load(os.path.join(a.results, "r50-heuristic.json"))
    if heur:  # cuDNN's heuristic algorithms (egeria's default), against PyTorch AMP in the same run
        e["resnet50_bf16_heuristic_synthetic_img_s"] = heur.get("egeria_images_per_second")
        e["pytorch_amp_resnet50_img_s_beside_heuristic"] = heur.get("pytorch_images_per_second")
        e["resnet50_heuristic_ratio_by_repeat_vs_pytorch_amp"] = heur.get("ratio_by_repeat")
    nchw = load(os.path.join(a.results, "r50-nchw.json"))
    if nchw:  # the ResNet-50 bf16 step with EG_CUDA_CHANNELS_LAST=0, against PyTorch AMP in the same run
        e["resnet50_bf16_nchw_synthetic_img_s"] = nchw.get("egeria_images_per_second")
        e["pytorch_amp_resnet50_img_s_beside_nchw"] = nchw.get("pytorch_images_per_second")
        e["resnet50_nchw_ratio_by_repeat_vs_pytorch_amp"] = nchw.get("ratio_by_repeat")
    mnv2 = load(os.path.join(a.results, "mnv2.json"))
    if mnv2:  # MobileNetV2 (32 px) in bf16 against PyTorch AMP's faster eager layout, same run
        e[f"mobilenetv2_{mnv2.get('precision', 'bf16')}_img_s"] = mnv2.get("egeria_images_per_second")
        e["pytorch_amp_mobilenetv2_img_s"] = mnv2.get("pytorch_images_per_second")
        e["mobilenetv2_batch_size"] = mnv2.get("batch_size")
        e["mobilenetv2_pytorch_config"] = mnv2.get("pytorch_config")
        e["mobilenetv2_ratio_by_repeat_vs_pytorch_amp"] = mnv2.get("ratio_by_repeat")
    mnv2n = load(os.path.join(a.results, "mnv2-grouped-nhwc.json"))
    if mnv2n:  # the same with EG_CUDA_GROUPED_NHWC=1 (its grouped parity cases passed first)
        e["mobilenetv2_bf16_grouped_nhwc_img_s"] = mnv2n.get("egeria_images_per_second")
        e["pytorch_amp_mobilenetv2_img_s_beside_grouped_nhwc"] = mnv2n.get("pytorch_images_per_second")
        e["mobilenetv2_grouped_nhwc_ratio_by_repeat_vs_pytorch_amp"] = mnv2n.get("ratio_by_repeat")
    for name, model in (("r50-fp16.json", "resnet50"), ("tfm-fp16.json", "transformer_small")):
        f16 = load(os.path.join(a.results, name))
        if f16:  # fp16 with loss scaling against PyTorch's float16 autocast and GradScaler, same run
            unit = "img_s" if model == "resnet50" else "tok_s"
            e[f"{model}_fp16_{'synthetic_' if model == 'resnet50' else ''}{unit}"] = f16.get("egeria_images_per_second")
            e[f"pytorch_amp_fp16_{model}_{unit}"] = f16.get("pytorch_images_per_second")
            e[f"{model}_fp16_ratio_by_repeat_vs_pytorch_amp_fp16"] = f16.get("ratio_by_repeat")
    graphs = graph_figures(os.path.join(a.results, "graphs.jsonl"))
    if graphs:  # CUDA graphs on against off, egeria's own step (no PyTorch beside it)
        e.update(graphs)
    dest = destination_figures(a.results)
    if dest:  # gradients added where they live against added separately, egeria's own step
        e.update(dest)
    tgraphs = translation_graph_figures(a.results)
    if tgraphs:  # translation training with a graph per batch shape, against eager
        e.update(tgraphs)
    gpuref = gpu_reference_figures(a.results)
    if gpuref:  # Egeria's reference on the training GPU: inline against on its side stream
        e.update(gpuref)
    else:
        e["missing"]["gpu_reference_*"] = "the gpuref step did not run (EG_GPU_STEPS)"
    r56 = load(os.path.join(a.results, "gpu-check-bench", "compare_pytorch_cuda.json"))
    if r56:  # tools/gpu-check's ResNet-56 step, exact f32 in both engines
        e["resnet56_f32_img_s"] = r56.get("egeria_images_per_second")
        e["pytorch_f32_resnet56_img_s"] = r56.get("pytorch_images_per_second")
    cuda_tests = test_counts(os.path.join(a.results, "gpu-check-tests", "tests.log"))
    if cuda_tests:
        e["cuda_tests"] = cuda_tests
    e["layout"] = "16-bit convolutions' activations NHWC (channels-last) unless a resnet50_*nchw* figure says NCHW"
    e["tf32"] = "on in both engines for the ResNet-50 and transformer-small figures, off for ResNet-56's"
    e["pytorch_version"] = (r50 or tfm or {}).get("pytorch_version")
    print(json.dumps(e, indent=2))


if __name__ == "__main__":
    main()
