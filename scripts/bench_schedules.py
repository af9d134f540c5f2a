"""What a learning-rate schedule costs per training step: ERM (MLP on Debug28, one thread)
with the default constant rate (nothing installed) against a cosine schedule with
warm-up and clipping (the loop's optimizer pre-step hook on every step), same batches.

    python scripts/bench_schedules.py [--steps 300] [--repeats 5]
"""
import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from domainbed import run_hparams
from domainbed.training import loop
from domainbed.training.config import RunConfig


def seconds_per_step(hparams_overrides, steps, folder):
    config = RunConfig.from_options(
        dataset="Debug28", algorithm="ERM", test_envs=[0], steps=steps, num_threads=1,
        output_dir=str(folder), data_dir=str(folder.parent),
        hparams={"arch": "mlp", **hparams_overrides})
    algorithm_cls, dataset_cls = config.validate()
    hparams = run_hparams.resolve("ERM", "Debug28", 0, 0, json.loads(config.hparams),
                                  notify=lambda m: None)
    run = loop.TrainingRun(config, hparams, algorithm_cls, dataset_cls, log=lambda m: None)
    run.train_step(0)   # warm-up
    start = time.perf_counter()
    for step in range(1, steps):
        run.train_step(step)
    return (time.perf_counter() - start) / (steps - 1)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(1)
    cosine = {"lr_schedule": "cosine", "warmup_steps": 20, "max_grad_norm": 1.0}
    timings = {"constant": [], "cosine": []}
    with tempfile.TemporaryDirectory() as tmp:
        for repeat in range(args.repeats):
            for name, overrides in (("constant", {}), ("cosine", cosine)):
                folder = Path(tmp) / f"{name}{repeat}"
                timings[name].append(seconds_per_step(overrides, args.steps, folder))
    constant, scheduled = (statistics.median(timings[k]) * 1e3 for k in timings)
    result = (f"{constant:.2f} ms/step constant, {scheduled:.2f} ms/step cosine + warm-up "
              f"+ clipping ({scheduled / constant:.2f}x)")
    print(result)
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from benchfigures import record
    record("lr_schedule_overhead", what="A learning-rate schedule and clipping, per step",
           headline=f"{scheduled:.2f} ms/step ({scheduled / constant:.2f}x)",
           peer=f"constant rate {constant:.2f} ms/step",
           command=f"python scripts/bench_schedules.py --steps {args.steps} "
                   f"--repeats {args.repeats}",
           result=result, method=f"ERM, MLP on Debug28, 1 thread; cosine with warm-up and "
           f"clipping; median over {args.repeats} alternating repeats of the "
           f"mean time of {args.steps - 1} train_step calls after one warm-up step")


if __name__ == "__main__":
    main()
