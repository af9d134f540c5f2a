"""Hyperparameter settings of one (dataset, test env), best first, per selection method
and trial seed, as DomainBed's list_top_hparams prints them.

    python -m domainbed.scripts.list_top_hparams --input_dir SWEEP_DIR \\
        --dataset VLCS --test_env 0 [--algorithm ERM]

Without --algorithm every algorithm run on the dataset is listed, one after another.
"""
import argparse
import sys
from typing import Any

from domainbed.hub_options import add_hf_flags, fold_hf_flags
from domainbed.results import grouping, model_selection
from domainbed.results.records import TABLE_FIELDS, load_records
from domainbed.results.report import DOMAINBED_ALGORITHMS, order_names
from oodutils.cli import ArgumentParser, add_logging_flags, add_option, configure_logging
from oodutils.errors import UserError, epilog_example, run_cli
from oodutils.log import get_logger

logger = get_logger(__name__)

EPILOG = epilog_example("domainbed-list-top-hparams", "domainbed.scripts.list_top_hparams",
                        "--input_dir sweeps/s1 --dataset ColoredMNIST --test_env 2")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = ArgumentParser(
        prog="domainbed-list-top-hparams",
        description="List hyperparameter settings by validation accuracy "
                    "(DomainBed's list_top_hparams)",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_option(parser, "--input_dir", required=True, nargs="+")
    add_option(parser, "--dataset", required=True,
               help="the dataset name as in the records (hf: names with the --hf_* flags "
                    "train was given)")
    add_option(parser, "--test_env", type=int, required=True)
    add_option(parser, "--algorithm", default=None,
                       help="default: every algorithm run on the dataset")
    add_option(parser, "--include_unfinished", action="store_true",
                       help="also read runs without a 'done' marker")
    add_hf_flags(parser, add_option)
    add_logging_flags(parser)
    args = parser.parse_args(argv)
    configure_logging(args)
    args.dataset = fold_hf_flags(args.dataset, vars(args))
    return args


def _groups_for(records: Any, dataset: Any, algorithm: Any, test_env: Any) -> Any:
    """{(algorithm, dataset label): [(trial_seed, records)]} for the requested cell."""
    labels = grouping.dataset_labels(records)
    wanted = {label for (name, _), label in labels.items() if name == dataset}
    out: dict[Any, Any] = {}
    for key, group in grouping.group_records(records, labels).items():
        if key.dataset in wanted and key.test_env == test_env and \
                (algorithm is None or key.algorithm == algorithm):
            out.setdefault((key.algorithm, key.dataset), []).append((key.trial_seed, group))
    for groups in out.values():
        groups.sort(key=lambda g: (str(type(g[0])), g[0]))
    return out


def _check_request(records: Any, args: Any) -> None:
    datasets = sorted({str(r["args"].get("dataset")) for r in records})
    if args.dataset not in datasets:
        raise UserError(f"no records for dataset {args.dataset!r}; datasets in the "
                        f"records: {', '.join(datasets)}")
    of_dataset = [r for r in records if r["args"].get("dataset") == args.dataset]
    algorithms = sorted({str(r["args"].get("algorithm")) for r in of_dataset})
    if args.algorithm is not None and args.algorithm not in algorithms:
        raise UserError(f"no records for algorithm {args.algorithm!r} on {args.dataset}; "
                        f"algorithms: {', '.join(algorithms)}")
    envs = sorted({e for r in of_dataset for e in r["args"].get("test_envs") or []})
    if args.test_env not in envs:
        raise UserError(f"no runs of {args.dataset} with test env {args.test_env}; "
                        f"test envs in the records: {', '.join(map(str, envs))}")


def _run_acc_text(run_acc: Any) -> str:
    shown = {k: run_acc[k] for k in ("val_acc", "test_acc", "step") if k in run_acc}
    return str(shown)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    loaded = load_records(args.input_dir, require_done=not args.include_unfinished,
                          quiet=True, fields=TABLE_FIELDS)
    if not loaded.records:
        skipped = loaded.skip_summary()
        raise UserError(f"no records found under {', '.join(args.input_dir)}"
                        + (f" (skipped {skipped})" if skipped else ""))
    if loaded.warning():
        logger.warning(loaded.warning())
    records = loaded.records
    _check_request(records, args)
    print("Total records:", len(records))

    cells = _groups_for(records, args.dataset, args.algorithm, args.test_env)
    methods = list(model_selection.DOMAINBED_METHODS)
    if model_selection.has_worst_group([r for r in records
                                        if r["args"].get("dataset") == args.dataset]):
        methods.append(model_selection.WorstGroupSelectionMethod)
    algorithms = order_names({a for a, _ in cells}, DOMAINBED_ALGORITHMS)
    several_variants = len({label for _, label in cells}) > 1

    for method in methods:
        print(f"Model selection: {method.name}")
        for algorithm in algorithms:
            for (alg, label), groups in cells.items():
                if alg != algorithm:
                    continue
                if args.algorithm is None:
                    print(f"algorithm: {algorithm}")
                if several_variants:
                    print(f"dataset: {label}")
                for trial_seed, group in groups:
                    print(f"trial_seed: {trial_seed}")
                    for run_acc in model_selection.candidates(group, method).to_dicts():
                        setting = (run_acc["hparams_seed_text"], run_acc["hparams_key"])
                        hparam_records = [r for r in group
                                          if grouping.hparams_key(r) == setting]
                        print(f"\t{_run_acc_text(run_acc)}")
                        print("\t\thparams:")
                        for k, v in sorted((hparam_records[0].get("hparams") or {}).items()):
                            print(f"\t\t\t{k}: {v}")
                        print("\t\toutput_dirs:")
                        seen = []
                        for r in hparam_records:
                            if r.get("run_dir") not in seen:
                                seen.append(r.get("run_dir"))
                        for run_dir in seen:
                            print(f"\t\t\t{run_dir}")
    return 0

def cli() -> None:
    """The `domainbed-list-top-hparams` console command ([project.scripts])."""
    sys.exit(run_cli(main))


if __name__ == "__main__":
    run_cli(main)
