"""python -m ood_bench COMMAND ...

  extract    train the environment classifier (Algorithm 1), write features.npz
  quantify   estimate diversity / correlation shift from features (Algorithm 2)
  run        several trials (extract + quantify), summary.json; --calibrate optional
  calibrate  i.i.d. threshold calibration from features files, calibration.json
  summarize  mean +/- standard error of result.json files
  table3     Table 3 of the paper on Colored MNIST, ours beside the paper's
  heatmap    a Fig. 4 grid on Colored MNIST (grid.json + PNG)
  plot       plane (Fig. 3) from summaries, or heatmap from a grid.json
"""
from __future__ import annotations

import argparse
import sys

from ood_bench import quantify as q
from oodutils.cli import (
    DATA_DIR_HELP,
    DEFAULT_DATA_DIR,
    ArgumentParser,
    add_logging_flags,
    add_option,
    configure_logging,
)
from oodutils.errors import epilog_example, run_cli
from oodutils.fileio import check_output_path

EPILOG = epilog_example("ood-bench", "ood_bench",
                        "quantify --features features.npz --seed 0 --output result.json")


def add_training_arguments(p: argparse.ArgumentParser, dataset_required: bool = True) -> None:
    g = p.add_argument_group("data")
    add_option(g, "--dataset", required=dataset_required, help="a registered dataset name")
    add_option(g, "--data_dir", default=DEFAULT_DATA_DIR, help=DATA_DIR_HELP)
    add_option(g, "--envs_p", type=int, nargs="+", required=dataset_required,
                  help="environment indices of side P")
    add_option(g, "--envs_q", type=int, nargs="+", required=dataset_required,
                  help="environment indices of side Q")
    add_option(g, "--dataset_settings", default="", help="JSON: dataset hparams")
    add_option(g, "--data_seed", type=int, default=0)
    add_option(g, "--holdout_fraction", type=float, default=0.1)
    g = p.add_argument_group("environment classifier (Algorithm 1)")
    add_option(g, "--backbone", default="auto",
                  help="auto (mlp for small images, else resnet18), mlp, resnet18, resnet34, "
                        "resnet50, featurizer (domainbed.networks.Featurizer)")
    add_option(g, "--dim_z", type=int, default=8)
    add_option(g, "--steps", type=int, default=2000)
    add_option(g, "--batch_size", type=int, default=32, help="per side")
    add_option(g, "--lr", type=float, default=3e-4)
    add_option(g, "--weight_decay", type=float, default=0.0)
    add_option(g, "--eval_every", type=int, default=100)
    add_option(g, "--mlp_width", type=int, default=390)
    add_option(g, "--pretrained", action="store_true", default=None,
               help="ImageNet weights for ResNets (default: yes for resnet*)")
    add_option(g, "--no_pretrained", dest="pretrained", action="store_false", default=None,
               help="random initialisation")
    add_option(g, "--pretrained_path", default="")
    add_option(g, "--featurizer_hparams", default="", help="JSON for --backbone featurizer")
    add_option(g, "--select", default="acc", choices=("acc", "loss", "last"),
                  help="checkpoint selection on the held-out part (default: accuracy)")
    add_option(g, "--extract_split", default="out", choices=("out", "train", "all"),
                  help="which examples' features are written (default: held-out)")
    add_option(g, "--n_workers", type=int, default=0)


def _reduced_training_args(p: argparse.ArgumentParser) -> None:
    for flag, typ in (("--steps", int), ("--mlp_width", int), ("--holdout_fraction", float),
                      ("--sample_size", int), ("--eval_every", int)):
        add_option(p, flag, type=typ, default=None)
    add_option(p, "--num_threads", type=int, default=0)
    add_option(p, "--seed", type=int, default=0)


def build_parser() -> argparse.ArgumentParser:
    parser = ArgumentParser(prog="ood-bench", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog=EPILOG)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("extract", help="train the environment classifier, write features")
    add_training_arguments(p)
    add_option(p, "--seed", type=int, default=0)
    add_option(p, "--force_iid", action="store_true",
                  help="pool P and Q and split 50/50 at random (i.i.d. reference)")
    add_option(p, "--output", "--out", "--output-dir", dest="out",
                  required=True, help="features .npz (a .json log goes beside)")
    add_option(p, "--device", default="cpu")
    add_option(p, "--num_threads", type=int, default=0)

    p = sub.add_parser("quantify", help="Algorithm 2 on a features file")
    q.build_parser(p)

    p = sub.add_parser("run", help="trials: extract + quantify, summary.json")
    add_training_arguments(p)
    q.add_estimator_arguments(p)
    add_option(p, "--n_trials", type=int, default=5)
    add_option(p, "--seed", type=int, default=0, help="trial seeds are seed, seed+1, ...")
    add_option(p, "--output_dir", "--output", "--out", required=True)
    add_option(p, "--calibrate", action="store_true", help="i.i.d. threshold calibration")
    add_option(p, "--calibration_level", default="data", choices=("data", "features"))
    add_option(p, "--iid_reference", action="store_true",
                  help="also report i.i.d. estimates at the thresholds used")

    p = sub.add_parser("calibrate", help="calibrate eps_div / eps_cor on i.i.d. splits")
    add_option(p, "--features", nargs="+", required=True, help="features files (globs ok)")
    add_option(p, "--already_iid", action="store_true",
                  help="the files are i.i.d. already (extract --force_iid); no re-split")
    add_option(p, "--output", "--out", "--output-dir", dest="out", required=True)
    add_option(p, "--seed", type=int, default=0)
    q.add_estimator_arguments(p)
    for flag, default in (("--lower_bound", 5e-3), ("--upper_bound", 1e-2),
                          ("--min_eps_div", 0.0), ("--max_eps_div", 1e-6),
                          ("--min_eps_cor", 0.0), ("--max_eps_cor", 1.0)):
        add_option(p, flag, type=float, default=default)
    add_option(p, "--max_iters", type=int, default=20)

    p = sub.add_parser("summarize", help="mean +/- SE over result.json files")
    add_option(p, "--results", nargs="+", help="result.json files (globs ok)")
    add_option(p, "--input_dir", "--root", dest="root", default=".",
               help="else every result.json under this folder")
    add_option(p, "--output", "--out", "--output-dir", dest="out", default=None)

    p = sub.add_parser("table3", help="Table 3 on Colored MNIST, ours beside the paper's")
    add_option(p, "--data_dir", default=DEFAULT_DATA_DIR, help=DATA_DIR_HELP)
    add_option(p, "--n_trials", type=int, default=5)
    add_option(p, "--output_dir", "--output", "--out", default=None)
    add_option(p, "--rows", nargs="+", default=None,
                  help="subset of 0.9 0.7 0.5 0.3 0.1 0.1+blue")
    add_option(p, "--quick", action="store_true", help="reduced CPU setting (table3.QUICK)")
    _reduced_training_args(p)

    p = sub.add_parser("heatmap", help="a Fig. 4 grid on Colored MNIST")
    add_option(p, "--kind", default="rho", choices=("rho", "mu-div", "mu-cor"))
    add_option(p, "--values", type=float, nargs="+", default=[0.1, 0.3, 0.5, 0.7, 0.9])
    add_option(p, "--data_dir", default=DEFAULT_DATA_DIR, help=DATA_DIR_HELP)
    add_option(p, "--output_dir", "--output", "--out", required=True)
    _reduced_training_args(p)

    p = sub.add_parser("plot", help="plane (Fig. 3) or heatmap (Fig. 4) PNG")
    p.add_argument("what", choices=("plane", "heatmap"))
    add_option(p, "--summaries", nargs="+", help="NAME=summary.json (plane)")
    add_option(p, "--paper", action="store_true", help="overlay Table 8's points (plane)")
    add_option(p, "--grid", help="heatmap_*.json (heatmap)")
    add_option(p, "--output", "--out", "--output-dir", dest="out", required=True, help="PNG path")
    for p in sub.choices.values():   # -v / --verbose: training progress; -q: warnings only
        add_logging_flags(p)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    configure_logging(args)
    if getattr(args, "out", None):
        check_output_path(args.out, "--output")
    if getattr(args, "output_dir", None):
        check_output_path(args.output_dir, "--output_dir", directory=True)
    from ood_bench import commands  # torch and the trainer: after the flags are checked
    commands.run(args)
    return 0

def cli() -> None:
    """The `ood-bench` console command ([project.scripts])."""
    sys.exit(run_cli(main))


if __name__ == "__main__":
    from oodutils.errors import run_cli
    sys.exit(run_cli(main))
