"""Time a zoo of linear probes trained as probe stacks, after one feature extraction, and
compute this machine's limit for that work.

    python scripts/bench_probe_stack.py                      # 500 heads, 1,000 steps
    python scripts/bench_probe_stack.py --heads 20 --steps 50 --no_record

The zoo is the study's (`domainbed.launch.zoo.draw_probe_zoo`: ERM heads on
efficientnet_lite0 features of ColoredMNIST, each its own learning rate, weight decay,
batch size and seed; test environments in turn), every split evaluated at each of 5
checkpoints. First one run extracts and caches the features (timed apart), then the other
heads train through the fused launcher (`--max_workers` group processes, each one
stack of heads per test environment) into ordinary run directories.

The limit: every head-step gathers its minibatch rows (float16 features, widened to
float32), and two matmuls read them (logits, weight gradient); every checkpoint reads each
evaluated feature row once per chunk of heads. Bytes over the memory bandwidth measured here
(a numpy copy: main memory, and a copy that fits in the L3 cache, where the 12.8 MB feature
table lives) and flops over the measured sgemm rate, both on `--workers` cores.
"""
import json
import os
import shutil
import sys
import tempfile
import time

import numpy as np

REPO = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path.insert(0, REPO)

from oodutils.cli import ArgumentParser, add_option  # noqa: E402


def copy_bandwidth(n_bytes, repeats=5):
    """GB/s of a numpy copy (read + write) of n_bytes, best of `repeats`."""
    src = np.ones(n_bytes // 4, np.float32)
    dst = np.empty_like(src)
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        np.copyto(dst, src)
        best = min(best, time.perf_counter() - start)
    return 2 * n_bytes / best / 1e9


def sgemm_rate(n=1024, repeats=3):
    """GFLOP/s of a float32 n x n matmul on one thread, best of `repeats`."""
    import torch
    torch.set_num_threads(1)
    a, b = torch.randn(n, n), torch.randn(n, n)
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - start)
    return 2 * n ** 3 / best / 1e9


def workload(runs, n_features, n_classes, env_sizes, n_checkpoints):
    """Bytes moved and flops of training and evaluating `runs` (their train arguments)."""
    n_envs = len(env_sizes)
    step_bytes = step_flops = 0.0
    for run in runs:
        rows = json.loads(run["hparams"])["batch_size"] * (n_envs - 1)
        # gather float16 rows, write them as float32, read them in two matmuls
        step_bytes += rows * n_features * (2 + 4 + 4 + 4)
        step_flops += 2 * 2 * rows * n_features * n_classes
    steps = runs[0]["steps"]
    eval_rows = sum(env_sizes)   # every split: each example once
    eval_bytes = n_checkpoints * eval_rows * n_features * 4 * len(runs)
    eval_flops = n_checkpoints * 2 * eval_rows * n_features * n_classes * len(runs)
    return steps * step_bytes + eval_bytes, steps * step_flops + eval_flops


def main():
    ap = ArgumentParser(description=__doc__.split("\n\n")[0])
    add_option(ap, "--heads", type=int, default=500)
    add_option(ap, "--steps", type=int, default=1000)
    add_option(ap, "--checkpoint_freq", type=int, default=250, help="5 checkpoints of 1,000")
    add_option(ap, "--dataset", default="ColoredMNIST")
    add_option(ap, "--backbone", default="efficientnet_lite0")
    add_option(ap, "--workers", type=int, default=2)
    add_option(ap, "--data_dir", default=os.path.join(REPO, "data"))
    add_option(ap, "--cache", default="", help="feature cache (default: a fresh temporary one)")
    add_option(ap, "--no_record", action="store_true",
               help="print only (no docs/benchmarks entry)")
    opts = ap.parse_args()
    work = tempfile.mkdtemp(prefix="bench_probe_stack_")
    os.environ["DOMAINBED_FEATURE_CACHE"] = opts.cache or os.path.join(work, "cache")
    from domainbed.launch import fused, sweep, zoo
    runs = zoo.draw_probe_zoo(opts.dataset, opts.heads, opts.data_dir, opts.steps,
                              opts.checkpoint_freq, ["all"], opts.backbone)
    jobs = [sweep.Job(r, os.path.join(work, "runs")) for r in runs]
    try:
        start = time.perf_counter()
        fused.fused_launcher([jobs[0].command], max_workers=1, echo=lambda line: None)
        extraction = time.perf_counter() - start
        start = time.perf_counter()
        outcomes = fused.fused_launcher([j.command for j in jobs[1:]],
                                        max_workers=opts.workers, echo=print)
        stacked = time.perf_counter() - start
        ok = sum(o.status == "ok" for o in outcomes)
        with open(os.path.join(jobs[1].output_dir, "results.jsonl")) as f:
            record = json.loads(f.readline())
        args = record["args"]
        n_checkpoints = sum(1 for _ in open(os.path.join(jobs[1].output_dir, "results.jsonl")))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    n_features = {"efficientnet_lite0": 1280}.get(opts.backbone)
    env_sizes = args.get("env_sizes") or _env_sizes(opts.dataset, opts.data_dir)
    n_bytes, n_flops = workload(runs[1:], n_features, args["num_classes"], env_sizes,
                                n_checkpoints)
    dram = copy_bandwidth(512 << 20)
    l3 = copy_bandwidth(8 << 20, repeats=50)
    gflops = sgemm_rate()
    limit_dram = n_bytes / (dram * 1e9)
    limit_l3 = n_bytes / (l3 * 1e9)
    limit_flops = n_flops / (gflops * 1e9 * opts.workers)
    report = {
        "machine": f"{os.cpu_count()} cpus, load average {os.getloadavg()[0]:.1f} at the end",
        "heads": len(runs) - 1, "finished": ok, "steps": opts.steps,
        "checkpoints": n_checkpoints, "workers": opts.workers,
        "feature_extraction_first_run_s": round(extraction, 1),
        "stacked_heads_wall_s": round(stacked, 1),
        "bytes_moved_gb": round(n_bytes / 1e9, 1), "gflop": round(n_flops / 1e9, 1),
        "copy_bandwidth_dram_gb_s": round(dram, 1), "copy_bandwidth_l3_gb_s": round(l3, 1),
        "sgemm_gflop_s_per_core": round(gflops, 1),
        "limit_s_memory_dram": round(limit_dram, 1), "limit_s_memory_l3": round(limit_l3, 1),
        "limit_s_flops": round(limit_flops, 1),
    }
    print(json.dumps(report, indent=2))
    if not opts.no_record:
        from benchfigures import record
        record("probe_stack", what=f"{len(runs) - 1} linear-probe runs ({opts.steps} steps, "
                                   f"{n_checkpoints} checkpoints, every split) on cached "
                                   f"{opts.backbone} features of {opts.dataset}, stacked",
               command="python scripts/bench_probe_stack.py",
               result=f"{stacked:.0f} s for {ok} runs after a {extraction:.0f} s first run "
                      f"(extraction); limit {max(limit_l3, limit_flops):.0f} s (L3) to "
                      f"{max(limit_dram, limit_flops):.0f} s (DRAM)",
               method=json.dumps(report))


def _env_sizes(dataset, data_dir):
    from domainbed.registry import get_dataset_class
    from domainbed.training.batches import build_dataset
    dataset_obj = build_dataset(get_dataset_class(dataset), data_dir, [0], {}, 0)
    return [len(env) for env in dataset_obj]


if __name__ == "__main__":
    main()
