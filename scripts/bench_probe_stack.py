"""Time a zoo of linear probes trained as one probe stack, after one feature extraction,
and compute this machine's limit for that work.

    python scripts/bench_probe_stack.py --cache ~/.cache/domainbed/features   # 500 x 1,000
    python scripts/bench_probe_stack.py --heads 20 --timed_steps 5 --no_record

The heads are the study's (`domainbed.launch.zoo.draw_probe_zoo`: ERM on efficientnet_lite0
features of ColoredMNIST, each its own learning rate, weight decay, batch size and seed),
all on test environment 0, so they form one stack; runs of `--steps` steps with 5
checkpoints, every split evaluated. Timed in this process, wall seconds and CPU seconds
(every thread's; what a shared, loaded machine inflates least): the first run (it extracts
the features on a cache miss; an earlier run's `--cache` hits), building the heads'
TrainingRuns, `--timed_steps` stacked steps (torch's operations on `--threads` threads),
one checkpoint (every head's evaluation, record and predictions), and `finish`; the
whole run is set-up + steps x step + 5 x checkpoint + finish, extrapolated from the
timed steps where `--timed_steps` is less than `--steps`. The load average (1 minute)
is printed at the start and the end: on a loaded machine the wall time is an upper
bound.

The limit: every head-step reads its minibatch rows once (the cached features' float16,
2 bytes a feature) for its logits and weight gradient; every checkpoint reads each
evaluated row once and every head's weights once. Bytes over the bandwidth of a numpy
copy measured here in CPU time (main memory, and an 8 MB copy that stays in the L3 cache),
flops (logits and weight gradient, 4 per feature, class and row) over the measured
single-thread sgemm rate; `--cores` cores (2). The limit leaves out what each head
writes at a checkpoint (its record and predictions file).
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
    """GB per CPU-second of a numpy copy (read + write) of n_bytes, best of `repeats` (CPU
    time, like the work it bounds: a loaded machine's time slicing left out)."""
    src = np.ones(n_bytes // 4, np.float32)
    dst = np.empty_like(src)
    np.copyto(dst, src)   # pages touched before timing
    best = float("inf")
    for _ in range(repeats):
        start = time.process_time()
        for _ in range(max(1, (64 << 20) // n_bytes)):
            np.copyto(dst, src)
        best = min(best, (time.process_time() - start) / max(1, (64 << 20) // n_bytes))
    return 2 * n_bytes / best / 1e9


def sgemm_rate(n=1024, repeats=3):
    """GFLOP per CPU-second of a float32 n x n matmul on one thread, best of `repeats`."""
    import torch
    torch.set_num_threads(1)
    a, b = torch.randn(n, n), torch.randn(n, n)
    best = float("inf")
    for _ in range(repeats):
        start = time.process_time()
        a @ b
        best = min(best, time.process_time() - start)
    return 2 * n ** 3 / best / 1e9


def workload(runs, n_features, n_classes, env_sizes, n_checkpoints, feature_bytes=2):
    """Bytes that must move and flops of training and evaluating `runs` (their train
    arguments) on features of `feature_bytes` bytes each."""
    n_envs = len(env_sizes)
    step_bytes = step_flops = 0.0
    for run in runs:
        rows = json.loads(run["hparams"])["batch_size"] * (n_envs - 1)
        step_bytes += rows * n_features * feature_bytes   # each row read once
        step_flops += 2 * 2 * rows * n_features * n_classes
    steps = runs[0]["steps"]
    eval_rows = sum(env_sizes)   # every split: each example once
    eval_bytes = n_checkpoints * (eval_rows * n_features * feature_bytes
                                  + len(runs) * n_classes * n_features * 4)
    eval_flops = n_checkpoints * 2 * eval_rows * n_features * n_classes * len(runs)
    return steps * step_bytes + eval_bytes, steps * step_flops + eval_flops


def build_heads(opts, runs):
    """The heads' TrainingRuns on one shared dataset (as the fused launcher builds a group)."""
    from domainbed.launch import sweep
    from domainbed.launch.pooled import train_flags
    from domainbed.training import feature_cache
    from domainbed.training import loop as training
    from domainbed.training.config import RunConfig
    built, data = [], None
    with feature_cache.shared_loads():
        for run in runs:
            args = RunConfig.from_argv(train_flags(sweep.Job(run, opts.work).command))
            algorithm_cls, dataset_cls = args.validate()
            hparams = args.resolve_hparams(notify=lambda m: None)
            os.makedirs(args.output_dir, exist_ok=True)
            data = data or training.build_run_data(dataset_cls, args, hparams)
            built.append(training.TrainingRun(args, hparams, algorithm_cls, dataset_cls,
                                              log=lambda m: None, data=data))
    return built


def cpu_seconds():
    """This process's CPU time and its finished children's."""
    times = os.times()
    return time.process_time() + times.children_user + times.children_system


def timed(fn):
    cpu, wall = cpu_seconds(), time.perf_counter()
    out = fn()
    return out, cpu_seconds() - cpu, time.perf_counter() - wall


def main():
    ap = ArgumentParser(description=__doc__.split("\n\n")[0])
    add_option(ap, "--heads", type=int, default=500)
    add_option(ap, "--steps", type=int, default=1000)
    add_option(ap, "--checkpoints", type=int, default=5)
    add_option(ap, "--timed_steps", type=int, default=1000,
               help="steps timed (the rest extrapolated from them)")
    add_option(ap, "--dataset", default="ColoredMNIST")
    add_option(ap, "--backbone", default="efficientnet_lite0")
    add_option(ap, "--cores", type=int, default=2)
    add_option(ap, "--threads", type=int, default=2, help="torch's threads")
    add_option(ap, "--data_dir", default=os.path.join(REPO, "data"))
    add_option(ap, "--cache", default="", help="feature cache (default: a fresh temporary one)")
    add_option(ap, "--no_record", action="store_true",
               help="print only (no docs/benchmarks entry)")
    opts = ap.parse_args()
    import torch
    load_start = os.getloadavg()[0]
    opts.work = tempfile.mkdtemp(prefix="bench_probe_stack_")
    os.environ["DOMAINBED_FEATURE_CACHE"] = opts.cache or os.path.join(opts.work, "cache")
    from domainbed.launch import probe_stack, zoo
    from domainbed.training import probe_stack as stacking
    freq = max(1, opts.steps // (opts.checkpoints - 1)) if opts.checkpoints > 1 else opts.steps
    runs = zoo.draw_probe_zoo(opts.dataset, opts.heads + 1, opts.data_dir, opts.steps, freq,
                              ["all"], opts.backbone, test_envs=[0])
    from domainbed.training import feature_cache
    try:
        _, extract_cpu, extract_wall = timed(lambda: build_heads(opts, runs[:1]))
        extracted = feature_cache.STATS["extracted"] > 0
        heads, setup_cpu, setup_wall = timed(lambda: build_heads(opts, runs[1:]))
        for head in heads:
            head.restore()
            head.saves_resume_state = False
        torch.set_num_threads(opts.threads)   # after the heads' own --num_threads 1
        stack = stacking.ProbeStack(sorted(heads, key=lambda m: m.hparams["batch_size"]))
        n = min(opts.timed_steps, opts.steps)
        _, step_cpu, step_wall = timed(lambda: [stack.train_step(s) for s in range(n)])
        _, ckpt_cpu, ckpt_wall = timed(lambda: probe_stack._checkpoint(
            stack, n - 1, lambda run, results: None, lambda run, error: None))
        _, finish_cpu, finish_wall = timed(lambda: [h.finish() for h in stack.members])
        example = heads[0]
        n_features, n_classes = example.algorithm.classifier.weight.shape[::-1]
        env_sizes = [len(env) for env in example.dataset]
        feature_bytes = stack.table.element_size()
        ok = sum(os.path.exists(os.path.join(h.out, "done")) for h in heads)
    finally:
        shutil.rmtree(opts.work, ignore_errors=True)
    scale = opts.steps / n
    total_cpu = setup_cpu + scale * step_cpu + opts.checkpoints * ckpt_cpu + \
        finish_cpu
    total_wall = setup_wall + scale * step_wall + opts.checkpoints * ckpt_wall + \
        finish_wall
    n_bytes, n_flops = workload(runs[1:], n_features, n_classes, env_sizes, opts.checkpoints,
                                feature_bytes)
    dram, l3, gflops = copy_bandwidth(512 << 20), copy_bandwidth(8 << 20, 50), sgemm_rate()
    limit_dram = n_bytes / (dram * 1e9 * opts.cores)
    limit_l3 = n_bytes / (l3 * 1e9 * opts.cores)
    limit_flops = n_flops / (gflops * 1e9 * opts.cores)
    limit = max(limit_l3, limit_flops)
    report = {
        "machine": f"{os.cpu_count()} cpus, load average {load_start:.1f} at the start, "
                   f"{os.getloadavg()[0]:.1f} at the end (shared with other engineers)",
        "heads": len(heads), "finished": ok, "steps": opts.steps, "timed_steps": n,
        "checkpoints": opts.checkpoints, "threads": opts.threads,
        "first_run_extracted_features": extracted,
        "first_run_cpu_s": round(extract_cpu, 1), "first_run_wall_s": round(extract_wall, 1),
        "setup_cpu_s": round(setup_cpu, 1), "setup_wall_s": round(setup_wall, 1),
        "arithmetic": "probe-stack (torch " + torch.__version__ + ")",
        "step_cpu_s": round(step_cpu / n, 4), "step_wall_s": round(step_wall / n, 4),
        "checkpoint_cpu_s": round(ckpt_cpu, 1), "checkpoint_wall_s": round(ckpt_wall, 1),
        "finish_cpu_s": round(finish_cpu, 1), "finish_wall_s": round(finish_wall, 1),
        "total_cpu_s": round(total_cpu, 1), "total_wall_s": round(total_wall, 1),
        "bytes_moved_gb": round(n_bytes / 1e9, 1), "gflop": round(n_flops / 1e9, 1),
        "copy_bandwidth_dram_gb_s": round(dram, 1), "copy_bandwidth_l3_gb_s": round(l3, 1),
        "sgemm_gflop_s_per_core": round(gflops, 1),
        "limit_s_memory_dram": round(limit_dram, 1), "limit_s_memory_l3": round(limit_l3, 1),
        "limit_s_flops": round(limit_flops, 1),
        "wall_over_limit": round(total_wall / limit, 1),
        "cpu_over_limit_cpu": round(total_cpu / (limit * opts.cores), 1),
    }
    print(json.dumps(report, indent=2))
    limit_text = (f"{limit:.1f} s on {opts.cores} cores (flops {limit_flops:.1f} s; bytes "
                  f"{limit_l3:.1f} s from L3, {limit_dram:.1f} s from DRAM)")
    print(f"{len(heads)} runs x {opts.steps} steps, {opts.checkpoints} checkpoints: "
          f"{total_wall:.0f} s wall, {total_cpu:.0f} CPU-s ({opts.threads} threads; load "
          f"{load_start:.1f} -> {os.getloadavg()[0]:.1f}); goal 120 s; machine limit "
          f"{limit_text}: {total_wall / limit:.1f}x the "
          f"limit in wall time, {total_cpu / (limit * opts.cores):.1f}x in CPU time")
    if not opts.no_record:
        from benchfigures import record
        record("probe_stack", what=f"{len(heads)} linear probes, one stack, {opts.steps} "
                                   f"steps",
               headline=f"{total_wall:.0f} s wall, {total_cpu:.0f} CPU-s",
               peer=f"goal 120 s; flop limit {report['limit_s_flops']:.1f} s",
               command="python scripts/bench_probe_stack.py " + " ".join(sys.argv[1:]),
               result=f"{total_wall:.0f} s wall, {total_cpu:.0f} CPU-s ({opts.threads} "
                      f"threads, load {load_start:.1f} at the start; goal 120 s on "
                      f"{opts.cores} cores) "
                      + (f"after a {extract_cpu:.0f} CPU-s extraction" if extracted else
                         "on features cached beforehand")
                      + f"; machine limit {limit_text}",
               method=f"{opts.checkpoints} checkpoints, every split, cached "
                      f"{opts.backbone} features of {opts.dataset}: " + json.dumps(report))


if __name__ == "__main__":
    main()
