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
import copy
import hashlib
import json
import os
import random
import shutil
import sys

from domainbed import (  # noqa: F401  (zoo and fused_launcher register their launchers)
    fused_launcher,
    launchers,
    zoo,
)
from domainbed.errors import UserError, epilog_example, run_cli
from domainbed.hparams import seed_hash
from oodutils.cli import add_logging_flags, configure_logging, parse_json_object

EPILOG = epilog_example("domainbed-sweep", "domainbed.scripts.sweep",
                        "launch --datasets ColoredMNIST --algorithms ERM IRM --data_dir ./data "
                        "--output_dir sweeps/s1 --command_launcher local --max_workers 2")

# The command that runs one job; tests swap it for a fake.
TRAIN_COMMAND = [sys.executable, "-m", "domainbed.scripts.train"]

# Our train flags that the sweep can pass through; a flag left unset is not passed, so
# job hashes stay equal to DomainBed's for a DomainBed-style sweep.
PASS_THROUGH = {   # name -> argparse kwargs
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
    "skip_model_save": dict(action="store_true", help="train.py's --skip_model_save"),
    "save_model_every_checkpoint": dict(action="store_true",
                                        help="train.py's --save_model_every_checkpoint"),
    "weights_dir": dict(type=str, default=None,
                        help="folder of backbone weight files (train.py's --weights_dir)"),
    "feature_cache_dir": dict(type=str, default=None,
                              help="linear probes' feature cache (train.py's flag)"),
}


class Job:
    def __init__(self, train_args, sweep_output_dir, train_command=None):
        args_str = json.dumps(train_args, sort_keys=True)
        args_hash = hashlib.md5(args_str.encode("utf-8")).hexdigest()
        self.output_dir = os.path.join(sweep_output_dir, args_hash)
        self.train_args = copy.deepcopy(train_args)
        self.train_args["output_dir"] = self.output_dir
        self.argv = list(train_command or TRAIN_COMMAND) + train_argv(self.train_args)
        self.refresh()

    def refresh(self):
        self.state = launchers.job_state(self.output_dir)
        return self.state

    @property
    def command(self):
        return launchers.Command(self.argv, self.output_dir)

    def describe(self):
        a = self.train_args
        return (f"{a['dataset']} {a['algorithm']} test_envs={a['test_envs']} "
                f"hparams_seed={a['hparams_seed']} trial_seed={a['trial_seed']}")

    def __str__(self):
        line = f"{self.state:<12} {self.output_dir} {self.describe()}"
        if self.state == launchers.FAILED:
            line += f" | {launchers.last_error(self.output_dir) or 'no error output'}"
        return line


def train_argv(train_args):
    """`--flag value` pairs as an argv list: lists become several values, True a bare
    flag, False/None nothing, everything else its str()."""
    argv = []
    for key, value in sorted(train_args.items()):
        if value is None or value is False:
            continue
        if value is True:
            argv.append(f"--{key}")
        elif isinstance(value, (list, tuple)):
            argv += [f"--{key}"] + [str(v) for v in value]
        else:
            argv += [f"--{key}", str(value)]
    return argv


def num_environments(dataset):
    from domainbed.registry import get_dataset_class
    envs = getattr(get_dataset_class(dataset), "ENVIRONMENTS", None)
    if not envs:
        raise UserError(f"dataset {dataset!r} declares no ENVIRONMENTS; "
                        f"cannot build its test environments")
    return len(envs)


def default_test_envs(dataset):
    """A dataset's own test environments (e.g. SubpopBench's [val, test]), or None."""
    from domainbed.registry import get_dataset_class
    envs = getattr(get_dataset_class(dataset), "DEFAULT_TEST_ENVS", None)
    return list(envs) if envs else None


def all_test_env_combinations(n):
    """Every single test env and, with at least 3 envs, every pair (DomainBed's order)."""
    for i in range(n):
        yield [i]
        if n >= 3:
            for j in range(i + 1, n):
                yield [i, j]


def make_args_list(n_trials, dataset_names, algorithms, n_hparams_from, n_hparams, steps,
                   data_dir, task, holdout_fraction, single_test_envs, hparams,
                   extra_args=None):
    """DomainBed's make_args_list; `extra_args` (pass-through train flags) are added to
    every job only where set."""
    args_list = []
    for trial_seed in range(n_trials):
        for dataset in dataset_names:
            for algorithm in algorithms:
                n_envs = num_environments(dataset)
                if default_test_envs(dataset):  # fixed splits: --single_test_envs n/a
                    all_test_envs = [default_test_envs(dataset)]
                elif single_test_envs:
                    all_test_envs = [[i] for i in range(n_envs)]
                else:
                    all_test_envs = all_test_env_combinations(n_envs)
                for test_envs in all_test_envs:
                    for hparams_seed in range(n_hparams_from, n_hparams):
                        train_args = {
                            "dataset": dataset,
                            "algorithm": algorithm,
                            "test_envs": test_envs,
                            "holdout_fraction": holdout_fraction,
                            "hparams_seed": hparams_seed,
                            "data_dir": data_dir,
                            "task": task,
                            "trial_seed": trial_seed,
                            "seed": seed_hash(dataset, algorithm, test_envs, hparams_seed,
                                              trial_seed),
                        }
                        if steps is not None:
                            train_args["steps"] = steps
                        if hparams is not None:
                            train_args["hparams"] = hparams
                        for key, value in (extra_args or {}).items():
                            if value is not None and value is not False:
                                train_args[key] = value
                        args_list.append(train_args)
    return args_list


def _default_datasets():
    from domainbed.registry import DATASETS
    return [d for d in DATASETS.names() if "Debug" not in d]


def _default_algorithms():
    from domainbed.registry import ALGORITHMS
    return ALGORITHMS.names()


def check_names(datasets, algorithms):
    """Unknown names fail here, with the valid names, before any job is built."""
    from domainbed.registry import get_algorithm_class, get_dataset_class
    for d in datasets:
        get_dataset_class(d)
    for a in algorithms:
        get_algorithm_class(a)


def ask_for_confirmation(skip, prompt="Are you sure? (y/n) "):
    """True to go on. Without a terminal to ask on, --skip_confirmation is required."""
    if skip:
        return True
    stdin = sys.stdin
    if stdin is None or stdin.closed or not stdin.isatty():
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


def summarize(jobs):
    counts = {s: 0 for s in (launchers.DONE, launchers.RUNNING, launchers.FAILED,
                             launchers.NOT_LAUNCHED)}
    for j in jobs:
        counts[j.state] += 1
    return (f"{len(jobs)} jobs: {counts[launchers.DONE]} done, "
            f"{counts[launchers.RUNNING]} running, {counts[launchers.FAILED]} "
            f"failed/incomplete, {counts[launchers.NOT_LAUNCHED]} not launched.")


def check_jobs(jobs):
    """Every job's train arguments (steps, checkpoint_freq, hparams names/types/ranges,
    output directory) are valid, or one clear error before any job is launched."""
    from domainbed.scripts.train import check_job
    checked = set()
    for job in jobs:
        try:
            check_job(train_argv(job.train_args), checked)
        except UserError as e:
            raise UserError(f"job {job.describe()}: {e}; nothing launched") from None


def launch(jobs, launcher_name, options, seed=0):
    """Run the jobs that are neither done nor running: incomplete ones first (they
    resume), then the ones never launched, each group in a seeded random order."""
    launcher_fn = launchers.get_launcher(launcher_name)
    rng = random.Random(seed)
    incomplete = [j for j in jobs if j.state == launchers.FAILED]
    fresh = [j for j in jobs if j.state == launchers.NOT_LAUNCHED]
    rng.shuffle(incomplete)
    rng.shuffle(fresh)
    to_launch = incomplete + fresh
    print(f"Launching {len(to_launch)} jobs ({len(incomplete)} to resume, "
          f"{len(fresh)} new) with the {launcher_name} launcher.")
    outcomes = launcher_fn([j.command for j in to_launch], **options) or []
    failed = [o for o in outcomes if o.failed]
    if outcomes:
        ran = sum(o.status in ("ok", "failed") for o in outcomes)
        print(f"Ran {ran} jobs: {ran - len(failed)} finished, {len(failed)} failed.")
    else:
        print(f"Launched {len(to_launch)} jobs!")
    return failed


def delete(jobs):
    for job in jobs:
        shutil.rmtree(job.output_dir, ignore_errors=False)
    print(f"Deleted {len(jobs)} jobs!")


def build_parser():
    parser = argparse.ArgumentParser(
        description="Run a sweep of train jobs (DomainBed's sweep flags).",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("command",
                        choices=["launch", "delete_incomplete", "delete_all", "status"])
    parser.add_argument("--datasets", nargs="+", type=str, default=None,
                        help="default: every registered dataset except the Debug ones")
    parser.add_argument("--algorithms", nargs="+", type=str, default=None,
                        help="default: every registered algorithm")
    parser.add_argument("--task", type=str, default="domain_generalization",
                        choices=["domain_generalization", "domain_adaptation"])
    parser.add_argument("--n_hparams_from", type=int, default=0)
    parser.add_argument("--n_hparams", type=int, default=20)
    parser.add_argument("--output_dir", type=str, required=True)
    parser.add_argument("--data_dir", type=str, required=True)
    parser.add_argument("--seed", type=int, default=0,
                        help="seeds the launch order only; as in DomainBed, job seeds come "
                             "from each job's arguments")
    parser.add_argument("--n_trials", type=int, default=3)
    parser.add_argument("--command_launcher", type=str, required=True,
                        help="one of: " + ", ".join(sorted(launchers.LAUNCHERS)))
    parser.add_argument("--steps", type=int, default=None)
    parser.add_argument("--hparams", type=str, default=None,
                        help="JSON dict of hyperparameters to fix in every job")
    parser.add_argument("--holdout_fraction", type=float, default=0.2)
    parser.add_argument("--single_test_envs", action="store_true")
    parser.add_argument("--skip_confirmation", action="store_true")
    parser.add_argument("--max_workers", type=int, default=1,
                        help="jobs the local launcher runs at once (1: one after another)")
    for name, kwargs in PASS_THROUGH.items():
        parser.add_argument(f"--{name}", **kwargs)
    parser.add_argument("--fused_max_models", type=int, default=fused_launcher.FUSED_MAX_MODELS,
                        help="fused launcher: most models trained together in one group")
    slurm = parser.add_argument_group("slurm launcher (submitit)")
    slurm.add_argument("--slurm_partition", type=str, default=None)
    slurm.add_argument("--slurm_timeout_min", type=int, default=24 * 60)
    slurm.add_argument("--slurm_gpus", type=int, default=1)
    slurm.add_argument("--slurm_cpus", type=int, default=8)
    slurm.add_argument("--slurm_mem_gb", type=float, default=32)
    slurm.add_argument("--slurm_array_parallelism", type=int, default=256)
    ray = parser.add_argument_group("ray launcher")
    ray.add_argument("--ray_address", type=str, default=None)
    ray.add_argument("--ray_gpus_per_job", type=float, default=None)
    add_logging_flags(parser)
    return parser


def check_args(args):
    if args.n_trials < 1:
        raise UserError(f"--n_trials must be at least 1, got {args.n_trials}")
    if args.n_hparams <= args.n_hparams_from:
        raise UserError(f"--n_hparams ({args.n_hparams}) must be greater than "
                        f"--n_hparams_from ({args.n_hparams_from})")
    if not 0 < args.holdout_fraction < 1:
        raise UserError(f"--holdout_fraction must be in (0, 1), got {args.holdout_fraction}")
    if args.max_workers < 1:
        raise UserError(f"--max_workers must be at least 1, got {args.max_workers}")
    if args.fused_max_models < 1:
        raise UserError(f"--fused_max_models must be at least 1, got {args.fused_max_models}")
    if args.hparams is not None:
        parse_json_object(args.hparams, "--hparams")
    launchers.get_launcher(args.command_launcher)
    if args.eval_splits:
        from domainbed.evaluation import check_eval_splits
        check_eval_splits(args.eval_splits)


def main(argv=None):
    args = build_parser().parse_args(argv)
    configure_logging(args)
    check_args(args)
    datasets = args.datasets or _default_datasets()
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
    running = [j for j in jobs if j.state == launchers.RUNNING]

    if args.command == "status":
        for job in jobs:
            print(job)
        print(summarize(jobs))
        return 0

    print(summarize(jobs))
    if args.command == "launch":
        n = sum(j.state in (launchers.FAILED, launchers.NOT_LAUNCHED) for j in jobs)
        print(f"About to launch {n} jobs.")
        if running:
            print(f"Leaving alone {len(running)} jobs that are running now.")
        if n and args.command_launcher in ("local", "multi_gpu", "pooled", "fused") and \
                not os.path.isdir(args.data_dir):
            raise UserError(f"data directory {args.data_dir!r} does not exist")
        check_jobs([j for j in jobs if j.state in (launchers.FAILED,
                                                   launchers.NOT_LAUNCHED)])
        if n == 0 or not ask_for_confirmation(args.skip_confirmation):
            return 0
        options = {k: v for k, v in vars(args).items()
                   if k == "max_workers" or k.startswith(("slurm_", "ray_", "fused_"))}
        failed = launch(jobs, args.command_launcher, options, seed=args.seed)
        if failed:
            print(f"{len(failed)} jobs failed; see `status` and each job's launcher.log.",
                  file=sys.stderr)
            return 1
        return 0

    if args.command == "delete_incomplete":
        to_delete = [j for j in jobs if j.state == launchers.FAILED]
    else:  # delete_all
        to_delete = [j for j in jobs if j.state in (launchers.FAILED, launchers.DONE)]
    if running:
        print(f"Not deleting {len(running)} jobs that are running now.")
    print(f"About to delete {len(to_delete)} jobs.")
    if to_delete and ask_for_confirmation(args.skip_confirmation):
        delete(to_delete)
    return 0

def cli():
    """The `domainbed-sweep` console command ([project.scripts])."""
    from domainbed.errors import run_cli
    sys.exit(run_cli(main))


if __name__ == "__main__":
    sys.exit(run_cli(main))
