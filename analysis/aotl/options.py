"""The aotl command's options: the vocabularies of its choices (tables, scales, splits,
checkpoints, bootstrap units) and its parser. A module without pandas or scipy, so the
`aotl` command answers --help and argument errors before importing them; the library
modules take their vocabularies from here."""
from __future__ import annotations

import argparse
from pathlib import Path

from oodutils.accuracy import AOTL_CLIP
from oodutils.cli import ArgumentParser, add_logging_flags, add_option
from oodutils.errors import epilog_example
from oodutils.tables import FORMATS

EPILOG = epilog_example("aotl", "analysis.aotl",
                        "sweeps/s1 --table per-ood --format csv --output aotl.csv")
RESAMPLE = ("runs", "models")
TABLES = ("per-ood", "effective-robustness", "pairwise", "group-average", "group-pairwise",
          "regime", "changepoints", "n-classifiers")
SCALES = ("probit", "logit", "identity")
SPLITS = ("out", "in")
CHECKPOINTS = ("all", "last", "best")


def build_parser() -> ArgumentParser:
    """The aotl command's options (a light module: no numpy, pandas or scipy)."""
    p = ArgumentParser(
        prog="aotl",
        description="Accuracy-on-the-line fits per leave-one-domain-out split.",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("paths", nargs="+", metavar="PATH",
                   help="sweep directory, or accuracy CSV files (.csv/.csv.gz) or folders of them")
    add_option(p, "--table", choices=TABLES, default=None,
                  help="which table (default per-ood)")
    add_option(p, "--id_envs", type=int, nargs="+", default=None, metavar="ENV",
                  help="ID environments to use (the OOD env is always removed); default all")
    add_option(p, "--scale", choices=SCALES, default="probit")
    add_option(p, "--clip", type=float, default=AOTL_CLIP,
                  help="clip accuracies to [clip, 1-clip] before probit/logit (default 0.01)")
    add_option(p, "--threshold", type=float, default=0.3,
                  help="well-specified iff R < threshold (default 0.3)")
    add_option(p, "--split", choices=SPLITS, default="out",
                  help="sweeps: which split's accuracies (default out)")
    add_option(p, "--checkpoints", choices=CHECKPOINTS, default="all",
                  help="sweeps: every checkpoint, each run's last, or its best by "
                        "training-domain validation (default all)")
    add_option(p, "--algorithms", nargs="+", default=None, help="keep only these algorithms")
    add_option(p, "--bootstrap", type=int, default=0, metavar="N",
                  help="bootstrap resamples for a CI of R (default 0: none; "
                        "n-classifiers uses 1000 when 0)")
    add_option(p, "--resample", choices=RESAMPLE, default=None,
                  help="bootstrap unit: whole runs or single classifiers (default runs; "
                        "n-classifiers: models, as the paper)")
    add_option(p, "--ci", type=float, default=0.95)
    add_option(p, "--seed", type=int, default=0)
    add_option(p, "--acc_threshold", type=float, default=0.9,
                  help="regime table: ID accuracy separating the regimes (default 0.9)")
    add_option(p, "--pen", type=float, default=None, help="changepoints: PELT penalty")
    add_option(p, "--min_size", type=int, default=None,
                  help="changepoints: minimum segment length")
    add_option(p, "--tol", type=float, default=0.01,
                  help="n-classifiers: relative change in R counted as stable (default 0.01)")
    add_option(p, "--step", type=int, default=100, help="n-classifiers: step (default 100)")
    add_option(p, "--mean_id", action="store_true",
                  help="n-classifiers: x = mean ID accuracy instead of pooled ID rows")
    add_option(p, "--format", choices=FORMATS,
                  default=None, help="default text, or what the --output extension names")
    add_option(p, "--digits", type=int, default=2)
    add_option(p, "--output", "--out", "--output-dir", dest="output",
                  default=None, help="write the table here")
    add_option(p, "--plot", type=Path, default=None, metavar="DIR",
                  help="write a probit-axis scatter PNG per split into DIR")
    add_option(p, "--export_csv", type=Path, default=None, metavar="DIR",
                  help="write the accuracies in the shared CSV schema into DIR "
                        "(then print the table only if --table is given)")
    add_logging_flags(p)
    return p
