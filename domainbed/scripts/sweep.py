"""Run a sweep: every (trial, dataset, algorithm, test envs, hparams seed) as one job.

    python -m domainbed.scripts.sweep launch --datasets Debug28 --algorithms ERM \\
        --data_dir ./data --output_dir ./sweep --command_launcher local --n_hparams 2 \\
        --n_trials 1 --single_test_envs --max_workers 2
    python -m domainbed.scripts.sweep status ...same flags...

Jobs and their directories are built exactly as DomainBed's sweep builds them (same
train arguments, same seed, same md5 directory names), so a sweep started with
DomainBed's flags finds the same job directories. Commands: `launch`, `status`,
`delete_incomplete`, `delete_all`.

One deliberate change from DomainBed: `launch` also runs the incomplete jobs of an
earlier, interrupted sweep (the train script resumes each from its last checkpoint in
the same directory), besides the jobs never launched. Finished jobs are never touched,
and a job that another process is still running is left alone.
"""
import argparse
import math
import os
import sys
from typing import Any

from domainbed.hub_options import add_hf_flags, fold_hf_flags
from domainbed.launch import launchers
from domainbed.launch.jobs import DONE, INCOMPLETE, NOT_LAUNCHED, RUNNING
from domainbed.launch.slurm_status import slurm_view, summarize_view
from domainbed.launch.sweep import (
    Job,
    _default_algorithms,
    _default_datasets,
    check_jobs,
    check_names,
    delete,
    launch,
    make_args_list,
    outside_notice,
    summarize,
)
from domainbed.registry import get_dataset_class
from domainbed.training.config import MAX_SEED, check_limits
from domainbed.training.early_stopping import check_options as check_early_stopping
from domainbed.training.splits import check_eval_splits
from oodutils.cli import (
    DATA_DIR_HELP,
    DEFAULT_DATA_DIR,
    ArgumentParser,
    add_logging_flags,
    add_option,
    check_outputs,
    configure_logging,
    parse_json_object,
)
from oodutils.errors import UserError, epilog_example, run_cli

EPILOG = epilog_example("domainbed-sweep", "domainbed.scripts.sweep",
                        "launch --datasets ColoredMNIST --algorithms ERM IRM --data_dir ./data "
                        "--output_dir sweeps/s1 --command_launcher local --max_workers 2")

MAX_JOBS = 10**6

# Job states `launch` runs: incomplete ones (resumed) and those never launched.
TO_LAUNCH = INCOMPLETE + (NOT_LAUNCHED,)

# Our train flags that the sweep can pass through; a flag left unset is not passed, so
# job hashes stay equal to DomainBed's for a DomainBed-style sweep.
PASS_THROUGH: dict[str, dict[str, Any]] = {   # name -> argparse kwargs
    "data_seed": dict(type=int, default=None,
                      help="seed of the environments' data (train.py's --data_seed)"),
    "precision": dict(type=str, default=None,
                      help="numeric precision passed to train.py (--precision)"),
    "checkpoint_freq": dict(type=int, default=None,
                            help="checkpoint every this many steps (train.py)"),
    "uda_holdout_fraction": dict(type=float, default=None,
                                 help="train.py's --uda_holdout_fraction"),
    "num_threads": dict(type=int, default=None,
                        help="torch threads per job (train.py's --num_threads)"),
    "eval_splits": dict(nargs="+", default=None,
                        help="train.py's --eval_splits (default all; only passed when set)"),
    "save_logits": dict(action="store_true", help="save float16 logits per checkpoint"),
    "metrics": dict(nargs="+", default=None, metavar="METRIC",
                    help="train.py's --metrics (metrics beyond accuracy in the records)"),
    "early_stopping": dict(type=str, default=None, metavar="METRIC",
                           help="train.py's --early_stopping (stop each job when METRIC, "
                                "e.g. val_acc, stops improving)"),
    "patience": dict(type=int, default=None, metavar="N",
                     help="train.py's --patience (checkpoints without improvement)"),
    "tracker": dict(action="extend", nargs="+", default=None, metavar="TRACKER",
                    help="train.py's --tracker (tensorboard, mlflow, wandb; repeatable); "
                         "not part of a job's directory name"),
    "tracker_uri": dict(type=str, default=None, help="train.py's --tracker_uri (MLflow)"),
    "tracker_timeout": dict(type=float, default=None, metavar="SECONDS",
                            help="train.py's --tracker_timeout"),
    "skip_model_save": dict(action="store_true", help="train.py's --skip_model_save"),
    "skip_bad_images": dict(action="store_true",
                            help="train.py's --skip_bad_images (folder:, csv:, hf: data)"),
    "save_model_every_checkpoint": dict(action="store_true",
                                        help="train.py's --save_model_every_checkpoint"),
    "weights_dir": dict(type=str, default=None,
                        help="folder of backbone weight files (train.py's --weights_dir)"),
    "feature_cache_dir": dict(type=str, default=None,
                              help="linear probes' feature cache (train.py's flag)"),
}


def ask_for_confirmation(skip: Any, prompt: str = "Are you sure? (y/n) ") -> bool:
    """True to go on. Without a terminal to ask on, --skip_confirmation is required."""
    if skip:
        return True
    stdin = sys.stdin
    # a replaced stdin (a test runner's, a notebook's) need not have `closed`
    if stdin is None or getattr(stdin, "closed", False) or not stdin.isatty():
        raise UserError("no terminal to ask for confirmation on (stdin is not a TTY); "
                        "pass --skip_confirmation to go on without asking")
    try:
        response = input(prompt)
    except EOFError:
        response = ""
    if response.lower().strip()[:1] != "y":
        print("Nevermind!")
        return False
    return True


def build_parser() -> argparse.ArgumentParser:
    parser = ArgumentParser(
        prog="domainbed-sweep",
        description="Run a sweep of train jobs (DomainBed's sweep flags).",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("command",
                        choices=["launch", "delete_incomplete", "delete_all", "status"])
    add_option(parser, "--datasets", nargs="+", type=str, default=None,
                       help="registered names, folder:PATH, csv:PATH or hf:REPO_OR_DIR "
                            "(default: every registered dataset except the Debug ones)")
    add_option(parser, "--algorithms", nargs="+", type=str, default=None,
                       help="default: every registered algorithm")
    add_option(parser, "--task", type=str, default="domain_generalization",
                       choices=["domain_generalization", "domain_adaptation"])
    add_option(parser, "--n_hparams_from", type=int, default=0)
    add_option(parser, "--n_hparams", type=int, default=20)
    add_option(parser, "--output_dir", type=str, required=True)
    add_option(parser, "--data_dir", type=str, default=DEFAULT_DATA_DIR, help=DATA_DIR_HELP)
    add_option(parser, "--seed", type=int, default=0,
                       help="seeds the launch order only; as in DomainBed, job seeds come "
                             "from each job's arguments")
    add_option(parser, "--n_trials", type=int, default=3)
    add_option(parser, "--command_launcher", type=str, required=True,
                       help="one of: " + ", ".join(sorted(launchers.LAUNCHERS)))
    add_option(parser, "--steps", type=int, default=None)
    add_option(parser, "--hparams", type=str, default=None,
                       help="JSON dict of hyperparameters to fix in every job")
    add_option(parser, "--holdout_fraction", type=float, default=0.2)
    add_option(parser, "--single_test_envs", action="store_true")
    add_option(parser, "--skip_confirmation", action="store_true")
    add_option(parser, "--max_workers", type=int, default=1,
                       help="jobs the local launcher runs at once (1: one after another)")
    for name, kwargs in PASS_THROUGH.items():
        add_option(parser, f"--{name}", **kwargs)
    add_option(parser, "--gpus_per_job", type=int, default=1,
                       help="multi_gpu launcher: GPUs each job trains on, data-parallel "
                            "(train.py's --distributed K)")
    add_option(parser, "--fused_max_models", type=int, default=launchers.FUSED_MAX_MODELS,
                       help="fused launcher: most models trained together in one group")
    add_option(parser, "--fused_arithmetic", default="auto",
                       choices=("auto", "exact", "batched"),
                       help="fused launcher: exact (each member runs its single run's "
                            "kernels: records bit for bit a single run's), batched (one "
                            "vmapped step for all members: fast on a GPU, records part from "
                            "a single run's by rounding) or auto (exact on CPU, batched on "
                            "GPU)")
    slurm = parser.add_argument_group("slurm launcher (submitit)")
    add_option(slurm, "--slurm_partition", type=str, default=None)
    add_option(slurm, "--slurm_timeout_min", type=int, default=24 * 60)
    add_option(slurm, "--slurm_gpus", type=int, default=1)
    add_option(slurm, "--slurm_cpus", type=int, default=8)
    add_option(slurm, "--slurm_mem_gb", type=float, default=32)
    add_option(slurm, "--slurm_array_parallelism", type=int, default=256)
    add_option(slurm, "--slurm_requeue", action="store_true",
                       help="requeue a job Slurm warns of its time limit (or preempts); "
                            "it resumes from its last checkpoint without a relaunch")
    ray = parser.add_argument_group("ray launcher")
    add_option(ray, "--ray_address", type=str, default=None)
    add_option(ray, "--ray_gpus_per_job", type=float, default=None)
    add_hf_flags(parser.add_argument_group("hf: datasets (folded into each hf: name)"),
                 add_option)
    add_logging_flags(parser)
    return parser


# the sweep's own integer options: (lowest, highest); train's go through RunConfig
SWEEP_LIMITS = {"n_trials": (1, MAX_JOBS), "n_hparams_from": (0, MAX_JOBS),
                "n_hparams": (1, MAX_JOBS), "seed": (0, MAX_SEED), "max_workers": (1, 4096),
                "gpus_per_job": (1, 4096), "fused_max_models": (1, MAX_JOBS),
                "slurm_timeout_min": (1, 10**7), "slurm_gpus": (0, 4096),
                "slurm_cpus": (1, 4096), "slurm_array_parallelism": (1, MAX_JOBS)}


def check_numbers(args: Any) -> None:
    """Every numeric option of the sweep within bounds (one error line); the train
    options it passes on are checked per job by RunConfig."""
    for name, (low, high) in SWEEP_LIMITS.items():
        check_limits(f"--{name}", getattr(args, name), low, high)
    for name in ("slurm_mem_gb", "ray_gpus_per_job"):
        value = getattr(args, name)
        if value is not None and not (math.isfinite(value) and 0 <= value <= 1e6):
            raise UserError(f"--{name} must be a number in [0, 1000000], got {value}")
    n_jobs_per_cell = args.n_trials * max(args.n_hparams - args.n_hparams_from, 0)
    if n_jobs_per_cell > MAX_JOBS:
        raise UserError(f"--n_trials x (--n_hparams - --n_hparams_from) is "
                        f"{n_jobs_per_cell} jobs per dataset, algorithm and test "
                        f"environments; at most {MAX_JOBS}")


def check_args(args: Any) -> None:
    check_numbers(args)
    if args.n_hparams <= args.n_hparams_from:
        raise UserError(f"--n_hparams ({args.n_hparams}) must be greater than "
                        f"--n_hparams_from ({args.n_hparams_from})")
    if not 0 < args.holdout_fraction < 1:
        raise UserError(f"--holdout_fraction must be in (0, 1), got {args.holdout_fraction}")
    if args.max_workers < 1:
        raise UserError(f"--max_workers must be at least 1, got {args.max_workers}")
    if args.gpus_per_job < 1:
        raise UserError(f"--gpus_per_job must be at least 1, got {args.gpus_per_job}")
    if args.fused_max_models < 1:
        raise UserError(f"--fused_max_models must be at least 1, got {args.fused_max_models}")
    if args.hparams is not None:
        parse_json_object(args.hparams, "--hparams")
    launchers.get_launcher(args.command_launcher)
    check_early_stopping(args.early_stopping, args.patience)
    if args.eval_splits:
        check_eval_splits(args.eval_splits)


def hf_names(datasets: Any, values: Any) -> list[Any]:
    """The datasets with the --hf_* flags folded into every hf: name (the flags with no
    hf: dataset are an error, as train's)."""
    if not any(str(d).startswith("hf:") for d in datasets):
        fold_hf_flags(datasets[0] if datasets else "", values)
        return list(datasets)
    return [fold_hf_flags(d, values) if str(d).startswith("hf:") else d for d in datasets]


def _needs_data_dir(datasets: Any) -> bool:
    """Whether any dataset needs files (the MNIST family and Debug build themselves)."""
    return any(getattr(get_dataset_class(d), "NEEDS_DATA_DIR", True) for d in datasets)


def print_status(jobs: Any, sweep_dir: str) -> None:
    """One line per job (its run directory's state, and Slurm's where the slurm launcher
    submitted it and it has not finished), then the counts."""
    view = slurm_view(jobs, sweep_dir)
    for job in jobs:
        slurm_state = view.get(job.output_dir)
        print(f"{job} | Slurm: {slurm_state}" if slurm_state else job)
    print(summarize(jobs))
    if view:
        print(summarize_view(view))


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    configure_logging(args)
    if args.command == "launch":
        check_outputs((args.output_dir, "--output_dir", True))
    check_args(args)
    datasets = hf_names(args.datasets or _default_datasets(), vars(args))
    algorithms = args.algorithms or _default_algorithms()
    check_names(datasets, algorithms)

    args_list = make_args_list(
        n_trials=args.n_trials, dataset_names=datasets, algorithms=algorithms,
        n_hparams_from=args.n_hparams_from, n_hparams=args.n_hparams, steps=args.steps,
        data_dir=args.data_dir, task=args.task, holdout_fraction=args.holdout_fraction,
        single_test_envs=args.single_test_envs, hparams=args.hparams,
        extra_args={name: getattr(args, name) for name in PASS_THROUGH
                    if not (name == "eval_splits" and args.eval_splits == ["all"])})
    jobs = [Job(train_args, args.output_dir) for train_args in args_list]
    running = [j for j in jobs if j.state == RUNNING]

    if args.command == "status":
        print_status(jobs, args.output_dir)
        notice = outside_notice(jobs, args.output_dir)
        if notice:
            print(notice)
        return 0

    print(summarize(jobs))
    if args.command == "launch":
        n = sum(j.state in TO_LAUNCH for j in jobs)
        print(f"About to launch {n} jobs.")
        if running:
            print(f"Leaving alone {len(running)} jobs that are running now.")
        if n and args.command_launcher in ("local", "multi_gpu", "pooled", "fused") and \
                not os.path.isdir(args.data_dir) and _needs_data_dir(datasets):
            raise UserError(f"data directory {args.data_dir!r} does not exist")
        launch_argv = ["--distributed", str(args.gpus_per_job)] if \
            args.command_launcher == "multi_gpu" and args.gpus_per_job > 1 else []
        check_jobs([j for j in jobs if j.state in TO_LAUNCH], launch_argv)
        if n == 0 or not ask_for_confirmation(args.skip_confirmation):
            return 0
        options = {k: v for k, v in vars(args).items()
                   if k in ("max_workers", "gpus_per_job")
                   or k.startswith(("slurm_", "ray_", "fused_"))}
        failed = launch(jobs, args.command_launcher, options, seed=args.seed)
        if failed:
            print(f"{len(failed)} jobs failed; see `status` and each job's launcher.log.",
                  file=sys.stderr)
            return 1
        return 0

    if args.command == "delete_incomplete":
        to_delete = [j for j in jobs if j.state in INCOMPLETE]
    else:  # delete_all
        to_delete = [j for j in jobs if j.state in INCOMPLETE + (DONE,)]
    if running:
        print(f"Not deleting {len(running)} jobs that are running now.")
    print(f"About to delete {len(to_delete)} jobs.")
    if to_delete and ask_for_confirmation(args.skip_confirmation):
        delete(to_delete)
    return 0

def cli() -> None:
    """The `domainbed-sweep` console command ([project.scripts])."""
    sys.exit(run_cli(main))


if __name__ == "__main__":
    sys.exit(run_cli(main))
