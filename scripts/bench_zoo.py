"""Costs of a model zoo on this CPU: per-architecture training step and evaluation, data
set-up, and Python/torch process start, in CPU seconds (robust to a shared machine) and
wall seconds; then the share of each in one zoo run and the runs per hour they imply.

    python scripts/bench_zoo.py [--data_dir data] [--steps 40] [--study_steps 300] \\
        [--study_checkpoint_freq 75] [--workers 2] [--json out.json]

A zoo run (aotl-study defaults) = set-up + study_steps training steps +
(study_steps / checkpoint_freq + 1) evaluations of the out splits and the test env's in
split. Runs per hour at W workers = 3600 * W / (CPU seconds per run), i.e. assuming W
otherwise idle cores; the pooled launcher pays process start once per worker, the local
launcher once per run.
"""
import argparse
import json
import os
import resource
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

ARCHS = (("mlp", {"mlp_width": 64}), ("mlp", {"mlp_width": 128}),
         ("mlp", {"mlp_width": 256}), ("mnist_cnn", {}), ("resnet_small", {}))


class Clock:
    """CPU (this process) and wall seconds of a block."""
    def __enter__(self):
        self.cpu, self.wall = time.process_time(), time.perf_counter()
        return self

    def __exit__(self, *exc):
        self.cpu = time.process_time() - self.cpu
        self.wall = time.perf_counter() - self.wall


def process_start_cost():
    """CPU and wall seconds of starting Python and importing the train CLI's modules."""
    code = ("import domainbed.training.config, domainbed.training.loop, domainbed.registry as r; "
            "r.get_algorithm_class('ERM'); r.get_dataset_class('ColoredMNIST')")
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    wall = time.perf_counter()
    subprocess.run([sys.executable, "-c", code], check=True)
    wall = time.perf_counter() - wall
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return cpu, wall


def bench_arch(arch, extra, data_dir, steps, eval_splits, algorithm="ERM"):
    from domainbed import run_hparams
    from domainbed.registry import get_algorithm_class, get_dataset_class
    from domainbed.training.config import RunConfig
    from domainbed.training.loop import TrainingRun
    out = os.path.join(data_dir, ".bench_zoo_run")
    args = RunConfig.from_argv(["--dataset", "ColoredMNIST", "--algorithm", algorithm,
                             "--data_dir", data_dir, "--output_dir", out, "--test_envs", "2",
                             "--steps", str(steps + 1), "--num_threads", "1",
                             "--skip_model_save", "--eval_splits", *eval_splits])
    hparams = run_hparams.resolve(algorithm, "ColoredMNIST", 0, 0, {"arch": arch, **extra},
                         notify=lambda m: None)
    with Clock() as setup:
        run = TrainingRun(args, hparams, get_algorithm_class(algorithm),
                          get_dataset_class("ColoredMNIST"), log=lambda m: None)
    run.train_step(0)   # warm-up
    with Clock() as train_clock:
        for step in range(1, steps + 1):
            run.train_step(step)
    with Clock() as eval_clock:
        run.checkpoint(steps)
    n_eval = sum(len(s) for *_, s in run.named_splits)
    return {"arch": arch, **extra, "setup_cpu_s": setup.cpu,
            "step_cpu_ms": 1000 * train_clock.cpu / steps,
            "step_wall_ms": 1000 * train_clock.wall / steps,
            "eval_cpu_s": eval_clock.cpu, "eval_wall_s": eval_clock.wall,
            "eval_examples": n_eval}


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data_dir", default="data")
    p.add_argument("--steps", type=int, default=40, help="timed steps per architecture")
    p.add_argument("--study_steps", type=int, default=300)
    p.add_argument("--study_checkpoint_freq", type=int, default=75)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--json")
    args = p.parse_args()
    import torch
    torch.set_num_threads(1)
    os.makedirs(args.data_dir, exist_ok=True)
    print(f"load average at start: {os.getloadavg()}; cores: {os.cpu_count()}")
    start_cpu, start_wall = process_start_cost()
    print(f"process start (python + imports): {start_cpu:.2f} s CPU, {start_wall:.2f} s wall")
    rows = []
    for arch, extra in ARCHS:
        for splits in (["all"], ["out", "test"]):
            row = bench_arch(arch, extra, args.data_dir, args.steps, splits)
            row["eval_splits"] = " ".join(splits)
            rows.append(row)
            print(f"{arch:13s} {json.dumps(extra):18s} eval={row['eval_splits']:9s} "
                  f"step {row['step_cpu_ms']:6.1f} ms CPU ({row['step_wall_ms']:6.1f} wall)"
                  f"  eval {row['eval_cpu_s']:5.2f} s CPU ({row['eval_examples']} examples)"
                  f"  set-up {row['setup_cpu_s']:.2f} s CPU", flush=True)
    n_evals = args.study_steps // args.study_checkpoint_freq + 1
    print(f"\none zoo run = {args.study_steps} steps + {n_evals} evaluations "
          f"(eval_splits out test) + set-up; runs/hour at {args.workers} idle cores:")
    study = []
    for row in rows:
        if row["eval_splits"] != "out test":
            continue
        parts = {"training": row["step_cpu_ms"] * args.study_steps / 1000,
                 "evaluation": row["eval_cpu_s"] * n_evals,
                 "data loading + model set-up": row["setup_cpu_s"]}
        pooled = sum(parts.values())
        local = pooled + start_cpu
        shares = ", ".join(f"{k} {100 * v / local:.0f}%" for k, v in parts.items())
        line = (f"{row['arch']:13s} w={row.get('mlp_width', '-')!s:4s} {local:5.2f} s CPU "
                f"per run ({shares}, process start {100 * start_cpu / local:.0f}%): "
                f"{3600 * args.workers / local:5.0f}/h local, "
                f"{3600 * args.workers / pooled:5.0f}/h pooled")
        print(line)
        study.append({**row, "cpu_per_run_local": local, "cpu_per_run_pooled": pooled})
    print(f"load average at end: {os.getloadavg()}")
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from benchfigures import record
    if study:
        first = study[0]
        record("zoo-run-cost", what="CPU cost of one zoo run, pooled launcher",
               headline=f"{first['arch']}: {first['cpu_per_run_pooled']:.1f} CPU-s a run",
               peer=f"a process per run {first['cpu_per_run_local']:.1f} CPU-s",
               command="python scripts/bench_zoo.py " + " ".join(sys.argv[1:]),
               result="; ".join(f"{r['arch']}: {r['cpu_per_run_pooled']:.1f} s vs "
                                f"{r['cpu_per_run_local']:.1f} s of CPU per run"
                                for r in study),
               method=f"{args.study_steps} steps, eval_splits out test, CPU seconds")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"process_start_cpu_s": start_cpu, "rows": rows, "study": study,
                       "load_avg_end": os.getloadavg()}, f, indent=1)


if __name__ == "__main__":
    main()
