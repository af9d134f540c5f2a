"""Estimate diversity and correlation shift from a features file (Algorithm 2).

    python -m ood_bench.quantify --features FILE.npz --seed S --output result.json

FILE.npz holds z_p (n_p, d), y_p (n_p,), z_q (n_q, d), y_q (n_q,) (what `python -m
ood_bench extract` writes, or the official code's data.npz). result.json gets `diversity`
and `correlation` (also as the official `div` / `cor`), the thresholds, and diagnostics:
the fraction of importance samples in each region, per-class values, skipped classes.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import sys
import warnings
from collections.abc import Iterator
from typing import Any

from ood_bench.estimator_defaults import DEFAULTS, parse_bandwidth
from ood_bench.features import load_features
from oodutils.cli import ArgumentParser, add_logging_flags, add_option, configure_logging
from oodutils.errors import UserError, run_cli
from oodutils.fileio import atomic_write_json, check_output_path
from oodutils.log import show_warning
from oodutils.untrusted import read_input


def add_estimator_arguments(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("estimator (Algorithm 2)")
    add_option(g, "--sample_size", type=int, default=DEFAULTS["sample_size"],
                  help="importance samples M (default 10000)")
    add_option(g, "--eps_div", type=float, default=DEFAULTS["eps_div"],
                  help="diversity threshold: a point counts where p or q < eps (1e-12)")
    add_option(g, "--eps_cor", type=float, default=DEFAULTS["eps_cor"],
                  help="correlation threshold: a point counts where p and q > eps (5e-4)")
    add_option(g, "--bandwidth", default="scott",
                  help="KDE bandwidth rule: scott (default), silverman, or a factor")
    add_option(g, "--strict", action="store_true",
                  help="fail when a class is too small for a KDE instead of skipping it")
    add_option(g, "--calibration", default=None,
                  help="calibration.json whose eps_div / eps_cor replace the thresholds")
    add_option(g, "--device", default="cpu", help="torch device for the KDE sums")
    add_option(g, "--num_threads", type=int, default=0,
                  help="torch CPU threads (0: torch's default)")


def estimator_options(args: argparse.Namespace) -> dict[str, Any]:
    try:
        bw = parse_bandwidth(args.bandwidth)
    except ValueError as e:
        raise UserError(str(e)) from None
    if args.sample_size < 1:
        raise UserError("--sample_size must be positive")
    if args.eps_div < 0 or args.eps_cor < 0:
        raise UserError("--eps_div and --eps_cor must be >= 0")
    eps_div, eps_cor = args.eps_div, args.eps_cor
    if args.calibration:
        try:
            cal = json.loads(read_input(args.calibration, "--calibration", 64 << 20))
        except (ValueError, RecursionError) as e:
            raise UserError(f"cannot read calibration file {args.calibration!r}: {e}") from None
        if not isinstance(cal, dict):
            raise UserError(f"calibration file {args.calibration!r} is not a JSON object")
        cal = cal.get("result", cal)  # the official calibration.json nests it
        try:
            eps_div, eps_cor = float(cal["eps_div"]), float(cal["eps_cor"])
        except (KeyError, TypeError, ValueError):
            raise UserError(f"{args.calibration}: no eps_div / eps_cor") from None
    return {"sample_size": args.sample_size, "eps_div": eps_div, "eps_cor": eps_cor,
            "bw_method": bw or "scott", "strict": args.strict, "device": args.device}


@contextlib.contextmanager
def torch_threads(n: int | None) -> Iterator[None]:
    import torch
    if not n:
        yield
        return
    old = torch.get_num_threads()
    torch.set_num_threads(int(n))
    try:
        yield
    finally:
        torch.set_num_threads(old)


def build_parser(parser: argparse.ArgumentParser | None = None) -> argparse.ArgumentParser:
    """The quantify options, on `parser` (the ood_bench subcommand, which adds -v / -q
    itself) or on a parser of their own."""
    standalone = parser is None
    parser = parser or ArgumentParser(
        prog="python -m ood_bench.quantify", description=__doc__.split("\n\n")[0])
    add_option(parser, "--features", required=True, help="npz with z_p, y_p, z_q, y_q")
    add_option(parser, "--seed", type=int, default=0, help="seed of the importance sample")
    add_option(parser, "--output", "--out", "--output-dir", dest="out",
                       default=None, help="result JSON (default: stdout only)")
    add_option(parser, "--mode", choices=("both", "div", "cor"), default="both")
    add_estimator_arguments(parser)
    if standalone:
        add_logging_flags(parser)
    return parser


def quantify_file(path: str, seed: int = 0, mode: str = "both", num_threads: int = 0,
                  **options: Any) -> dict[str, Any]:
    feats = load_features(path)   # a bad file is refused before torch is imported
    from ood_bench.estimator import ShiftEstimationError, estimate_shifts
    with torch_threads(num_threads), warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.showwarning = show_warning
        try:
            result = estimate_shifts(feats["z_p"], feats["y_p"], feats["z_q"], feats["y_q"],
                                     seed=seed, mode=mode, **options)
        except ShiftEstimationError as e:
            raise UserError(f"{path}: {e}") from None
    result["features"] = str(path)
    if "diversity" in result:
        result["div"] = result["diversity"]
    if "correlation" in result:
        result["cor"] = result["correlation"]
    return result


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    configure_logging(args)
    if args.out:
        check_output_path(args.out, "--output")
    result = quantify_file(args.features, args.seed, args.mode, args.num_threads,
                           **estimator_options(args))
    if args.out:
        atomic_write_json(args.out, result)
    shown = {k: result[k] for k in ("diversity", "correlation") if k in result}
    print(json.dumps(shown))
    return 0


if __name__ == "__main__":
    sys.exit(run_cli(main))
