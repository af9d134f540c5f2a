"""Per-step training time of every registered algorithm, relative to ERM.

    python scripts/bench_algorithms.py [--threads 2] [--steps 6] [--warmup 2]
        [--algorithms ERM Mixup ...] [--device cpu] [--json OUT.json]

Each algorithm is built as a ColoredMNIST run builds it (DomainBed's default hyperparameters
for ColoredMNIST, hence MNIST_CNN on 2x28x28 inputs, batch 64 per training environment, two
training environments) and fed the same fixed minibatches of that shape; the time of
`update()` is measured after `--warmup` steps, median over `--steps`, both as wall time and
as the process's CPU time (all threads), which stays meaningful on a shared, loaded machine.
Two-stage methods switch stages halfway through the measured steps, so their figure mixes
both stages.
Inputs are random tensors of ColoredMNIST's shape: update() cost does not depend on the
pixel values, and no dataset download is needed.
"""
import json
import statistics
import sys
import time

import numpy as np
import torch

from domainbed import run_hparams
from domainbed.algorithms.base import TrainingContext
from domainbed.datasets.base import TensorEnvironment
from domainbed.registry import ALGORITHMS, get_algorithm_class
from oodutils.cli import ArgumentParser, add_option

INPUT_SHAPE, NUM_CLASSES, NUM_ENVS = (2, 28, 28), 2, 2


def environments(batch_size, device):
    g = torch.Generator().manual_seed(0)
    envs = []
    for e in range(NUM_ENVS):
        x = torch.rand(batch_size, *INPUT_SHAPE, generator=g)
        y = torch.randint(0, NUM_CLASSES, (batch_size,), generator=g)
        groups = 2 * y + torch.randint(0, 2, (batch_size,), generator=g)
        envs.append(TensorEnvironment(x.to(device), y.to(device),
                                      np.arange(batch_size) + e * batch_size, groups.numpy()))
    return envs


def time_algorithm(name, steps, warmup, device):
    hparams = run_hparams.default_hparams(name, "ColoredMNIST")
    torch.manual_seed(0)
    np.random.seed(0)
    envs = environments(hparams["batch_size"], device)
    algorithm = get_algorithm_class(name)(INPUT_SHAPE, NUM_CLASSES, NUM_ENVS, hparams)
    algorithm.to(device)
    algorithm.prepare(TrainingContext(envs, envs, 4, warmup + steps, 0, device))
    batches = [(e.x, e.y) for e in envs]
    groups = [torch.as_tensor(e.groups).to(device) for e in envs]
    extra = {"groups": groups} if getattr(algorithm, "NEEDS_GROUPS", False) else {}
    wall, cpu = [], []
    for step in range(warmup + steps):
        if device != "cpu":
            torch.cuda.synchronize()
        start, start_cpu = time.perf_counter(), time.process_time()
        algorithm.update(batches, None, **extra)
        if device != "cpu":
            torch.cuda.synchronize()
        if step >= warmup:
            wall.append(time.perf_counter() - start)
            cpu.append(time.process_time() - start_cpu)
    return statistics.median(wall), statistics.median(cpu)


def main(argv=None):
    p = ArgumentParser(description=__doc__.splitlines()[0])
    add_option(p, "--threads", type=int, default=2)
    add_option(p, "--steps", type=int, default=6)
    add_option(p, "--warmup", type=int, default=2)
    add_option(p, "--algorithms", nargs="*", default=None)
    add_option(p, "--device", default="cpu")
    add_option(p, "--json", default=None, help="also write the figures here")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    names = ["ERM"] + [n for n in (args.algorithms or ALGORITHMS.names()) if n != "ERM"]
    results = {}
    for name in names:
        results[name] = time_algorithm(name, args.steps, args.warmup, args.device)
        print(f"{name:16s} wall {1000 * results[name][0]:9.1f} ms/step, "
              f"cpu {1000 * results[name][1]:9.1f} ms/step", file=sys.stderr, flush=True)
    erm_wall, erm_cpu = results["ERM"]
    print(f"| algorithm | wall ms/step | x ERM (wall) | CPU ms/step | x ERM (CPU) |  "
          f"(threads={args.threads}, device={args.device}, median of {args.steps} steps)")
    print("|---|---|---|---|---|")
    for name, (wall, cpu) in sorted(results.items(), key=lambda kv: kv[1][1]):
        print(f"| {name} | {1000 * wall:.1f} | {wall / erm_wall:.2f} | {1000 * cpu:.1f} | "
              f"{cpu / erm_cpu:.2f} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"threads": args.threads, "device": args.device, "steps": args.steps,
                       "wall_seconds_per_step": {k: v[0] for k, v in results.items()},
                       "cpu_seconds_per_step": {k: v[1] for k, v in results.items()}},
                      f, indent=1, sort_keys=True)


if __name__ == "__main__":
    main()
