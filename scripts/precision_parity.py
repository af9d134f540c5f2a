"""Do bf16 autocast and channels-last keep fp32's accuracy? (speed issue, goal b)

    python scripts/precision_parity.py --seeds 0 1 2 --workers 2
    python scripts/precision_parity.py --arch mlp --configs fp32/contiguous bf16/contiguous

Trains ERM on ColoredMNIST (test env 2, default hyperparameters) once per seed and per
precision/memory-format configuration through the train CLI, then prints per configuration
the test-env accuracy of the last checkpoint and of the training-domain-validation pick,
and the mean training-env out accuracy, each as mean +/- std over seeds, with the
per-seed values. On a CPU without native bfloat16, bf16 runs only with
DOMAINBED_ALLOW_EMULATED_BF16=1 (same rounding, far slower, convolutions above all).
"""
import concurrent.futures
import os
import subprocess
import sys
import tempfile

import numpy as np

from domainbed.results.model_selection import IIDAccuracySelectionMethod
from domainbed.results.records import read_run
from oodutils.cli import ArgumentParser, add_option

TEST_ENV = 2


def train(config, seed, args, out_dir):
    precision, memory_format = config.split("/")
    run_dir = os.path.join(out_dir, f"{precision}_{memory_format}_seed{seed}")
    cmd = [sys.executable, "-m", "domainbed.scripts.train", "--dataset", "ColoredMNIST",
           "--algorithm", "ERM", "--test_envs", str(TEST_ENV), "--data_dir", args.data_dir,
           "--output_dir", run_dir, "--skip_model_save", "--seed", str(seed),
           "--trial_seed", str(seed), "--precision", precision,
           "--memory_format", memory_format, "--num_threads", str(args.threads),
           "--hparams", f'{{"arch": "{args.arch}"}}']
    if args.steps:
        cmd += ["--steps", str(args.steps)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"{config} seed {seed} failed: {proc.stderr.strip().splitlines()[-1]}")
    return config, seed, read_run(run_dir)[0]


def summarize(records):
    last = records[-1]
    picked = IIDAccuracySelectionMethod.run_acc(records)
    train_out = np.mean([last[f"env{i}_out_acc"] for i in range(3) if i != TEST_ENV])
    return last[f"env{TEST_ENV}_in_acc"], picked["test_acc"], train_out


def main():
    p = ArgumentParser(description=__doc__.split("\n\n")[0])
    add_option(p, "--configs", nargs="+",
                   default=["fp32/contiguous", "fp32/channels_last", "bf16/channels_last"],
                   help="precision/memory_format pairs")
    add_option(p, "--seeds", nargs="+", type=int, default=[0, 1, 2])
    add_option(p, "--arch", default="mnist_cnn", choices=["mnist_cnn", "mlp", "resnet_small"])
    add_option(p, "--steps", type=int, default=0, help="0 = the dataset's default (5000)")
    add_option(p, "--workers", type=int, default=1, help="runs at once")
    add_option(p, "--threads", type=int, default=1, help="torch threads per run")
    add_option(p, "--data_dir", default=tempfile.gettempdir())
    add_option(p, "--output_dir", default=None, help="keep the runs here (default: temp)")
    args = p.parse_args()
    for config in args.configs:
        if config.count("/") != 1:
            p.error(f"bad config {config!r}: expected precision/memory_format")
    with tempfile.TemporaryDirectory() as tmp:
        out_dir = args.output_dir or tmp
        jobs = [(c, s) for c in args.configs for s in args.seeds]
        with concurrent.futures.ThreadPoolExecutor(args.workers) as pool:
            results = list(pool.map(lambda job: train(*job, args, out_dir), jobs))
    print(f"ColoredMNIST ERM, arch {args.arch}, test env {TEST_ENV}, seeds {args.seeds}")
    print(f"{'config':22s} {'test acc (last)':>22s} {'test acc (tdv pick)':>22s} "
          f"{'train-env out acc':>22s}")
    for config in args.configs:
        rows = np.array([summarize(recs) for c, _, recs in results if c == config])
        cells = [f"{rows[:, j].mean():.3f} +/- {rows[:, j].std():.3f}" for j in range(3)]
        print(f"{config:22s} " + " ".join(f"{c:>22s}" for c in cells))
        for j, name in enumerate(("last", "pick", "train_out")):
            print(f"    {name:9s} per seed: " + " ".join(f"{v:.4f}" for v in rows[:, j]))


if __name__ == "__main__":
    main()
