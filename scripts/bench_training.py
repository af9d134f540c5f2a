"""Training and evaluation speed against bare PyTorch loops (issue: speed is a feature).

    python scripts/bench_training.py [--repeats 5] [--steps 30] [--threads N]
    python scripts/bench_training.py --end_to_end 5000 --threads 2   # a whole default run

Prints the CPU's flags, then for fp32 (and bf16 where the CPU supports it): our training
step (the Algorithm's update fed by the run's minibatch source), a bare
forward+backward+Adam loop of the same network and batch, our evaluation (the run's
predict path) and a bare no-grad loop at batch 64. Medians of the repeats.
With --end_to_end STEPS it also times whole `domainbed.scripts.train` runs of ERM on
ColoredMNIST (default hyperparameters and checkpoint frequency, every split evaluated at
every checkpoint) per precision, against the reference DomainBed figures of the speed
issue applied to the same steps and images.
"""
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import torch
import torch.nn.functional as F

from domainbed import run_hparams
from domainbed.predictions import load_predictions
from domainbed.registry import get_algorithm_class, get_dataset_class
from domainbed.training import loop as training
from oodutils.cli import ArgumentParser, add_option


def cpu_flags():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    flags = set(line.split(":", 1)[1].split())
                    return sorted(f for f in flags if f.startswith(("avx", "amx", "fma")))
    except OSError:
        pass
    return []


def paired_median_times(fn_a, fn_b, repeats):
    """Medians of the two functions' times, alternating them so drift hits both alike."""
    times = ([], [])
    for i in range(repeats):
        order = (0, 1) if i % 2 == 0 else (1, 0)
        for which in order:
            start = time.perf_counter()
            (fn_a, fn_b)[which]()
            times[which].append(time.perf_counter() - start)
    return statistics.median(times[0]), statistics.median(times[1])


def bench(precision, memory_format, args, splits, dataset):
    device = torch.device("cpu")
    hparams = run_hparams.resolve("ERM", "ColoredMNIST", 0, 0)
    torch.manual_seed(0)
    algorithm = get_algorithm_class("ERM")(dataset.input_shape, 2, 2, hparams)
    algorithm = algorithm.to(memory_format=memory_format)
    source = training.MinibatchSource(splits[:2], [0, 1], hparams, 0, device, memory_format, 0)
    autocast = lambda: training.autocast_context(device, precision)  # noqa: E731
    step = [0]

    def ours_train():
        for _ in range(args.steps):
            with autocast():
                algorithm.update(source.batches(step[0]))
            step[0] += 1

    net = torch.nn.Sequential(algorithm.featurizer, algorithm.classifier)
    bare_opt = torch.optim.Adam(net.parameters(), lr=1e-3)
    x_fixed = torch.cat([b[0] for b in source.batches(0)])
    y_fixed = torch.cat([b[1] for b in source.batches(0)])

    def bare_train():
        for _ in range(args.steps):
            with autocast():
                loss = F.cross_entropy(net(x_fixed), y_fixed)
            bare_opt.zero_grad()
            loss.backward()
            bare_opt.step()

    eval_split = splits[2]
    ctx = training.RunContext(device, precision, memory_format, args.eval_batch_size, 0)
    named = [("env2_in", 2, "in", eval_split)]

    def ours_eval():
        training.evaluate(algorithm, named, ctx, 4, False)

    def bare_eval():
        with torch.inference_mode(), autocast():
            for start in range(0, len(eval_split), 64):
                net(eval_split.x[start:start + 64].contiguous(memory_format=memory_format))

    ours_train(), bare_train(), ours_eval(), bare_eval()  # warm-up
    t_ours, t_bare = (t / args.steps
                      for t in paired_median_times(ours_train, bare_train, args.repeats))
    e_ours, e_bare = (t / len(eval_split) * 1000
                      for t in paired_median_times(ours_eval, bare_eval, args.repeats))
    layout = "channels_last" if memory_format == torch.channels_last else "contiguous"
    name = f"{precision}/{layout}"
    print(f"{name:24s} train: ours {t_ours * 1000:7.1f} ms/step ({1 / t_ours:5.2f} steps/s), "
          f"bare {t_bare * 1000:7.1f} ms/step, ratio {t_ours / t_bare:5.3f} | "
          f"eval: ours {e_ours:5.3f} s/1000 img ({1000 / e_ours:6.0f} img/s), "
          f"bare {e_bare:5.3f} s/1000, ratio {e_ours / e_bare:5.3f}", flush=True)


REFERENCE_STEP_S = 0.195          # DomainBed, ERM, 2 envs x 64 images, 2 cores
REFERENCE_EVAL_S_PER_1000 = 0.555  # DomainBed evaluation, batch 64


def end_to_end(precision, args):
    """Wall time of a whole training run through the CLI, and the reference estimate."""
    with tempfile.TemporaryDirectory() as out:
        cmd = [sys.executable, "-m", "domainbed.scripts.train", "--dataset", "ColoredMNIST",
               "--algorithm", "ERM", "--test_envs", "2", "--data_dir", args.data_dir,
               "--steps", str(args.end_to_end), "--output_dir", out, "--skip_model_save",
               "--precision", precision, "--memory_format", args.memory_format]
        if args.threads:
            cmd += ["--num_threads", str(args.threads)]
        start = time.perf_counter()
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
        wall = time.perf_counter() - start
        with open(os.path.join(out, "results.jsonl")) as f:
            steps = [json.loads(line)["step"] for line in f]
        checkpoints = len(steps)
        images = len(load_predictions(out, steps[-1])["id"])   # every example of every split
    reference = (args.end_to_end * REFERENCE_STEP_S
                 + checkpoints * images * REFERENCE_EVAL_S_PER_1000 / 1000)
    print(f"end to end {precision}/{args.memory_format}: {args.end_to_end} steps, "
          f"{checkpoints} checkpoints x {images} images: {wall:7.1f} s; "
          f"reference estimate {reference:7.1f} s; "
          f"speed-up {reference / wall:4.2f}x", flush=True)


def main():
    p = ArgumentParser(description=__doc__.split("\n\n")[0])
    add_option(p, "--repeats", type=int, default=5)
    add_option(p, "--steps", type=int, default=20)
    add_option(p, "--threads", type=int, default=0)
    add_option(p, "--eval_batch_size", type=int, default=64)
    add_option(p, "--data_dir", default="/tmp")
    add_option(p, "--end_to_end", type=int, default=0, metavar="STEPS",
                   help="also time whole training runs of STEPS steps (5000 = default run)")
    add_option(p, "--memory_format", default="auto",
                   choices=["auto", "channels_last", "contiguous"],
                   help="memory format of the --end_to_end runs (train's flag)")
    add_option(p, "--skip_loops", action="store_true",
                   help="only the --end_to_end runs")
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}, "
          f"cpu flags: {' '.join(cpu_flags())}")
    print(f"bf16 supported: {training.cpu_supports_bf16()}")
    configs = [("fp32", torch.contiguous_format), ("fp32", torch.channels_last)]
    if training.cpu_supports_bf16():
        configs += [("bf16", torch.contiguous_format), ("bf16", torch.channels_last)]
    if not args.skip_loops:
        dataset = get_dataset_class("ColoredMNIST")(args.data_dir, [2], {}, data_seed=0)

        class Args:
            holdout_fraction, trial_seed, test_envs, task = 0.2, 0, [2], "domain_generalization"
        splits, _, _ = training.make_splits(dataset, Args, {})
        for precision, memory_format in configs:
            bench(precision, memory_format, args, splits, dataset)
    if args.end_to_end:
        for precision in sorted({c[0] for c in configs}, reverse=True):
            end_to_end(precision, args)


if __name__ == "__main__":
    main()
