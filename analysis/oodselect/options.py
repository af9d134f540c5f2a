"""``python -m analysis.oodselect``: select anti-correlated OOD subsets and report them.

    python -m analysis.oodselect --matrix A.npz --sizes 10 100 1000 --seed 0 --output_dir out/
    python -m analysis.oodselect --input_dir sweep/ --dataset PACS --id_envs 0 1 2 \\
        --ood_env 3 --sizes 10 100 --output_dir out/

Writes to --output_dir: ``summary.csv`` (one row per size and method: method, n, r_test with
its Fisher 95% interval, r_val, r_train, Spearman, ...), ``subset_<n>.csv`` (OODSelect's
subset in rank order: rank, index, id, path, label, env, selection_score),
``subsets.json`` (every method's subsets and the chosen hyperparameters), ``split.json``,
``jaccard.csv`` (normalised Jaccard between sizes), ``composition_<n>.csv`` (class and
attribute enrichment, bootstrap intervals) where the examples carry attributes, and the
plots ``correlation_vs_size.png`` and ``scatter_<n>.png``.
"""
from __future__ import annotations

import argparse

from analysis.oodselect import config as oodselect_config
from oodutils.cli import ArgumentParser, add_logging_flags, add_option
from oodutils.errors import epilog_example

EPILOG = epilog_example("oodselect", "analysis.oodselect",
                        "--matrix A_y.npz --sizes 100 500 --seed 0 --output_dir oodselect/")


def build_parser() -> ArgumentParser:
    """The oodselect command's options."""
    p = ArgumentParser(prog="oodselect", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=EPILOG)
    src = p.add_argument_group("input (one of)")
    add_option(src, "--matrix", help=".npz with A (models x examples, 0/1) and y")
    add_option(src, "--input_dir", nargs="+", help="run directories (a sweep)")
    add_option(src, "--dataset")
    add_option(src, "--id_envs", type=int, nargs="+")
    add_option(src, "--ood_env", type=int)
    add_option(src, "--checkpoints", choices=("all", "last"), default="all",
                    help="models: every checkpoint (default) or each run's last")
    add_option(src, "--save_matrix", help="also write the built A and y to this .npz")
    add_option(p, "--sizes", type=int, nargs="+", help="subset sizes (default: a log grid)")
    add_option(p, "--seed", type=int, default=0)
    add_option(p, "--output_dir", "--out", "--output", dest="out",
                  required=True, help="output directory")
    add_option(p, "--model_split", "--split", dest="split", choices=("run", "model", "arch"),
               default="run", help="how models split into train/val/test (default: by run)")
    add_option(p, "--fractions", type=float, nargs=3, default=(0.6, 0.2, 0.2))
    add_option(p, "--test_archs", nargs="+")
    o = p.add_argument_group("optimiser")
    add_option(o, "--steps", type=int, default=3000)
    add_option(o, "--patience", type=int, default=500)
    add_option(o, "--trials", type=int, default=0,
                  help="Optuna trials per size (0: fixed hyperparameters)")
    add_option(o, "--trial_batch", type=int, default=8)
    add_option(o, "--restarts", type=int, default=1,
                  help="with fixed hyperparameters: random restarts per size, best on val")
    add_option(o, "--paper_budget", action="store_true",
                  help="the paper's configs: 50,000 steps and 100 Optuna trials")
    add_option(o, "--penalty_form", choices=oodselect_config.PENALTY_FORMS, default="softplus")
    add_option(o, "--loss", choices=oodselect_config.LOSSES, default="r")
    defaults = oodselect_config.Hparams()
    for name in ("lr", "eta_min", "t_max", "penalty", "anneal_iters"):
        add_option(o, "--" + name, type=type(getattr(defaults, name)),
                      default=getattr(defaults, name))
    add_option(o, "--last_theta", action="store_true",
                  help="keep the final theta, not the best-validation one (as the code)")
    add_option(o, "--device", default="auto")
    b = p.add_argument_group("baselines and report")
    add_option(b, "--baselines", nargs="*", default=list(oodselect_config.BASELINES),
               choices=oodselect_config.BASELINES)
    add_option(b, "--random_draws", type=int, default=100)
    add_option(b, "--hard_reference", choices=("train", "test", "all"), default="train",
                  help="models whose errors define 'hard' (the authors' code: test)")
    add_option(b, "--greedy_max_cost", type=float, default=2e10)
    add_option(b, "--exhaustive_max", type=int, default=1_000_000)
    add_option(b, "--paper_fisher", action="store_true",
                  help="Fisher intervals with m = 100 as Table A.3 (default: test models)")
    add_option(b, "--bootstrap", type=int, default=1000)
    add_option(b, "--no_plots", action="store_true")
    add_logging_flags(p)   # -q / --quiet: no progress lines and no summary table
    return p
