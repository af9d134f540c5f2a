"""Download datasets and pretrained weights: `python -m domainbed.scripts.download
--data_dir DIR --datasets Waterbirds CivilComments ...` or `--weights resnet50`.

Nothing else in the project downloads: training reads what is on disk and says clearly
what is missing. The sources and the machinery live in ``domainbed.downloads`` (one module
per dataset family); this command parses, calls and prints one line per dataset, with a
non-zero exit when any failed (e.g. offline). Datasets that cannot be fetched automatically
print where to get them and the layout expected.
"""
import argparse
import os
import sys
from collections.abc import Callable

from domainbed.downloads import DATASETS, download_original, verify_dataset
from domainbed.downloads.fetching import LOCK_FILE
from domainbed.downloads.hub_mirrors import MIRRORS, download_from_hub
from domainbed.downloads.weights import download_weights, verify_weights, weight_sources
from oodutils.cli import (
    DATA_DIR_HELP,
    DEFAULT_DATA_DIR,
    ArgumentParser,
    add_logging_flags,
    add_option,
    check_outputs,
    configure_logging,
)
from oodutils.errors import UserError, epilog_example, run_cli
from oodutils.log import get_logger

logger = get_logger(__name__)

Action = Callable[..., "str | None"]   # a download or check: the line it printed, or None

EPILOG = epilog_example("domainbed-download", "domainbed.scripts.download",
                        "--data_dir ./data --datasets MNIST PACS VLCS")


def build_parser() -> ArgumentParser:
    p = ArgumentParser(prog="domainbed-download",
                       description="Download datasets and pretrained weights",
                                epilog=EPILOG,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add_option(p, "--data_dir", type=str, default=DEFAULT_DATA_DIR, help=DATA_DIR_HELP)
    add_option(p, "--datasets", nargs="*", default=[],
                  help=f"any of: {', '.join(DATASETS)}")
    add_option(p, "--weights", nargs="*", default=[],
                  help="backbone names whose published weights to fetch (an unknown name "
                       "lists the valid ones)")
    add_option(p, "--weights_dir", type=str, default="",
                  help="where --weights go (default: torch hub's checkpoints folder); pass "
                        "the same folder to train --weights_dir")
    add_option(p, "--verify", action="store_true",
               help="download nothing: re-check the named --datasets / --weights on disk "
                    "against their published checksums, or the sha256 recorded at their "
                    f"first download ({LOCK_FILE} beside the data)")
    add_option(p, "--source", choices=("original", "hub"), default="original",
               help="original: the datasets' own links (DomainBed's); hub: the Hugging Face "
                    "Hub mirrors pinned to a revision (PACS, OfficeHome), each parquet "
                    "file's sha256 recorded on first use, written in DomainBed's layout")
    add_option(p, "--convert_blond_split_pickles", action="store_true",
               help="UNSAFE: unpickle OoD-Bench's DATA_DIR/celeba/blond_split/*_df.pickle "
                    "once and write the CSV lists CelebA_Blond reads. Unpickling runs any "
                    "code a file holds: use it only on files you fetched yourself from "
                    "the OoD-Bench repository, never on files someone else put there")
    add_logging_flags(p)
    return p


def check_request(args: argparse.Namespace) -> None:
    """A UserError unless every named dataset and weights file is known and something is
    named (the datasets' missing-data messages suggest commands that must pass this)."""
    unknown = [d for d in args.datasets if d not in DATASETS]
    if unknown:
        raise UserError(f"unknown dataset {unknown[0]!r}; downloadable: {', '.join(DATASETS)}")
    bad_weights = [w for w in args.weights if w not in weight_sources()]
    if bad_weights:
        raise UserError(f"unknown weights {bad_weights[0]!r}; valid: "
                        f"{', '.join(weight_sources())}")
    if not args.datasets and not args.weights:
        raise UserError("nothing to download: name --datasets and/or --weights")
    no_mirror = [d for d in args.datasets if d not in MIRRORS]
    if args.source == "hub" and no_mirror:
        raise UserError(f"--source hub: {no_mirror[0]} has no Hub mirror; mirrored: "
                        f"{', '.join(MIRRORS)}")
    if args.source == "hub" and args.verify:
        raise UserError("--verify checks the original downloads; a --source hub download "
                        "checks each parquet file against its recorded sha256 every time")


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    configure_logging(args)
    if not args.verify:     # --verify only reads
        check_outputs((args.data_dir, "--data_dir", True))
    if args.convert_blond_split_pickles:
        from domainbed.datasets.oodbench_images import convert_blond_split_pickles
        for path in convert_blond_split_pickles(os.path.join(args.data_dir, "celeba")):
            print(f"wrote {path}")
        if not args.datasets and not args.weights:
            return
    check_request(args)
    os.makedirs(args.data_dir, exist_ok=True)
    if args.verify:
        return verify_all(args)
    fetched: dict[int, str] = {}
    checks: list[tuple[str, Action]]
    if args.source == "hub":
        checks = [(n, lambda n=n: download_from_hub(n, args.data_dir))
                  for n in args.datasets]
    else:
        checks = [(n, lambda n=n: download_original(n, args.data_dir, fetched))
                  for n in args.datasets]
    checks += [(n, lambda n=n: download_weights(n, args.weights_dir)) for n in args.weights]
    failed = run_each(checks)
    if failed:
        raise UserError(f"{len(failed)} of {len(checks)} downloads failed: {', '.join(failed)}")


def run_each(checks: list[tuple[str, Action]]) -> list[str]:
    """Run each (name, action): print "name: <what it returns>", or log its UserError and
    go on with the rest; the names that failed."""
    failed = []
    for name, action in checks:
        try:
            line = action()
            if line:
                print(f"{name}: {line}")
        except UserError as e:
            logger.error(f"{name}: error: {e}")
            failed.append(name)
    return failed


def verify_all(args: argparse.Namespace) -> None:
    """--verify: one line per dataset or weights file; a non-zero exit on any mismatch."""
    checks: list[tuple[str, Action]] = [
        (n, lambda n=n: f"verified ({verify_dataset(n, args.data_dir)})")
        for n in args.datasets]
    checks += [(n, lambda n=n: f"verified ({verify_weights(n, args.weights_dir)})")
               for n in args.weights]
    failed = run_each(checks)
    if failed:
        raise UserError(f"{len(failed)} of {len(checks)} verifications failed: "
                        f"{', '.join(failed)}")


def cli() -> None:
    """The `domainbed-download` console command ([project.scripts])."""
    sys.exit(run_cli(main))


if __name__ == "__main__":
    run_cli(main)
