"""The `spawrious-splits` command (``python -m spawrious.splits``): build one of the six
benchmarks' splits, check the counts against the paper's tables, print a summary."""
from __future__ import annotations

import argparse
import json
import sys

from oodutils.cli import ArgumentParser, add_logging_flags, add_option, configure_logging, echo
from oodutils.errors import UserError, epilog_example, run_cli
from spawrious.constants import CLASS_LIST, DEFAULT_PER_CELL, LOCATIONS
from spawrious.layout import read_info, resolve_dataset_dir
from spawrious.splits import (
    BENCHMARKS,
    ENVIRONMENTS,
    VARIANTS,
    build_split,
    check_benchmark,
    check_variant,
    select_files,
    selected_counts,
)
from spawrious.validate import format_report, validate_counts

EPILOG = epilog_example("spawrious-splits", "spawrious.splits",
                        "--data_dir data --benchmark o2o_easy --per_cell 50 --format csv")


def build_parser() -> argparse.ArgumentParser:
    p = ArgumentParser(
        prog="spawrious-splits",
        description="Show, check and list the images of one Spawrious benchmark.",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_option(p, "--data_dir", "--root", dest="root", default=None,
                  help="ROOT holding spawrious224/ (without it: counts from the definitions)")
    add_option(p, "--benchmark", required=True, help=" | ".join(BENCHMARKS))
    add_option(p, "--per_cell", type=int, default=None,
                  help=f"images per (pool, location, breed) cell (default: ROOT's info.json, "
                        f"else {DEFAULT_PER_CELL})")
    add_option(p, "--variant", default="canonical", help=" | ".join(VARIANTS))
    add_option(p, "--format", "--summary", dest="summary", default="table",
               choices=("table", "csv", "json", "files"),
                  help="csv: env,breed,location,count rows; files: env,label,breed,location,path")
    add_option(p, "--validate", action="store_true",
                  help="also print the correlation report (stderr with csv/json/files)")
    add_logging_flags(p)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from oodutils.csv_out import csv_text  # numpy: after the flags are parsed
    configure_logging(args)
    benchmark, variant = check_benchmark(args.benchmark), check_variant(args.variant)
    dataset_dir = resolve_dataset_dir(args.root) if args.root is not None else None
    per_cell = args.per_cell
    if per_cell is None:
        info = read_info(dataset_dir) if dataset_dir else None
        per_cell = int((info or {}).get("per_cell", DEFAULT_PER_CELL))
    split = build_split(benchmark, per_cell, variant)
    examples = select_files(dataset_dir, split) if dataset_dir else None
    counts = selected_counts(examples) if examples is not None else split.counts()
    report, failures = validate_counts(split, counts)
    out = sys.stdout
    if args.summary == "csv":
        echo(csv_text(["env", "breed", "location", "count"],
                      [[e, b, loc, counts[(e, b, loc)]] for e in ENVIRONMENTS
                       for b in CLASS_LIST for loc in LOCATIONS if counts.get((e, b, loc))]),
             end="")
    elif args.summary == "json":
        json.dump({"benchmark": benchmark, "variant": variant, "per_cell": per_cell,
                   "rows": [{"env": e, "breed": b, "location": loc, "count": k}
                            for (e, b, loc, k) in split.summary_rows()],
                   "env_sizes": report["env_sizes"], "failures": failures}, out, indent=2)
        out.write("\n")
    elif args.summary == "files":
        if examples is None:
            raise UserError("--format files needs --data_dir")
        echo(csv_text(["env", "label", "breed", "location", "path"],
                      [[e, CLASS_LIST.index(ex.breed), ex.breed, ex.location, ex.path]
                       for e in ENVIRONMENTS for ex in examples[e]]), end="")
    else:
        print(f"{benchmark} ({variant}), {per_cell} per cell"
              + (f", images in {dataset_dir}" if dataset_dir else ", from the definitions"))
        print(f"{'env':<12}{'breed':<11}{'location':<10}{'count':>7}")
        for e, b, loc, _count in split.summary_rows():
            print(f"{e:<12}{b:<11}{loc:<10}{counts.get((e, b, loc), 0):>7}")
    if args.validate:
        stream = sys.stdout if args.summary == "table" else sys.stderr
        print(format_report(report), file=stream)
    if failures:
        raise UserError(f"{benchmark} fails validation: " + "; ".join(failures))
    return 0

def cli() -> None:
    """The `spawrious-splits` console command ([project.scripts])."""
    sys.exit(run_cli(main))


if __name__ == "__main__":
    from oodutils.errors import run_cli
    run_cli(main)
