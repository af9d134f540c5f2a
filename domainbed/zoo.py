"""Model zoos on a small CPU: drawing a diverse zoo of small-image runs, and the `pooled`
command launcher that runs many short train jobs in a few long-lived processes.

On a 2-core CPU a short ColoredMNIST run (a few hundred MLP steps) costs a few seconds of
arithmetic, but starting a Python process that imports torch and the registry costs
seconds more; the pooled launcher pays that start once per worker, not once per job.
Each job is still an ordinary train job: the same argv, the same run directory, records,
predictions, `done`, lock and `launcher.log` as with the local launcher, and a rerun
resumes it from its last checkpoint.
"""
import contextlib
import multiprocessing
import os
import sys
import time

from domainbed import launchers
from domainbed.errors import UserError
from domainbed.hparams import seed_hash

TRAIN_MODULE = "domainbed.scripts.train"

# The zoo's architecture mix: (arch, share, hparam overrides). The MLP dominates because
# a step costs 3-9 ms of CPU against ~350 ms for MNIST_CNN on this (loaded) 2-core CPU
# (scripts/bench_zoo.py): one CNN run costs as much as ~50 MLP runs. A few CNNs and
# small ResNets keep the architecture axis of the zoo.
ZOO_ARCHS = (
    ("mlp", 0.96, {"mlp_width": (64, 128, 256), "mlp_depth": (3,)}),
    ("mnist_cnn", 0.02, {}),
    ("resnet_small", 0.02, {}),
)
ZOO_ALGORITHMS = ("ERM", "ERM", "IRM", "VREx", "GroupDRO", "CORAL")


def draw_zoo(dataset, n_runs, data_dir, steps, checkpoint_freq, eval_splits, seed=0,
             test_envs=None, archs=ZOO_ARCHS):
    """The train arguments of `n_runs` runs: leave-one-environment-out test envs in turn,
    an algorithm, an architecture and its size, a batch size, a random hyperparameter
    seed (learning rate, weight decay, dropout, penalty weights) and a training seed,
    each a pure function of (dataset, run index, seed), so a bigger zoo extends a smaller
    one. Run i's arguments never depend on n_runs."""
    import numpy as np

    from domainbed.registry import get_dataset_class
    n_envs = len(get_dataset_class(dataset).ENVIRONMENTS)
    test_envs = list(range(n_envs)) if test_envs is None else list(test_envs)
    shares = np.array([a[1] for a in archs], dtype=float)
    runs = []
    for i in range(n_runs):
        rng = np.random.RandomState(seed_hash("zoo", dataset, seed, i))
        arch, _, sizes = archs[rng.choice(len(archs), p=shares / shares.sum())]
        # learning rates that train within a few hundred steps (DomainBed's small-image
        # range reaches 3e-5, which leaves a short run near chance on its training envs)
        fixed = {"arch": arch, "batch_size": int(rng.choice([32, 64, 128])),
                 "lr": float(10 ** rng.uniform(-3.3, -2.5))}
        for name, values in sizes.items():
            fixed[name] = int(rng.choice(values))
        algorithm = str(ZOO_ALGORITHMS[rng.randint(len(ZOO_ALGORITHMS))])
        # penalties switch on within the run, not after DomainBed's 500-step warm-up
        fixed["irm_penalty_anneal_iters"] = fixed["vrex_penalty_anneal_iters"] = \
            int(rng.randint(0, max(1, steps // 2)))
        runs.append({
            "dataset": dataset, "algorithm": algorithm,
            "test_envs": [test_envs[i % len(test_envs)]], "holdout_fraction": 0.2,
            "hparams_seed": i + 1, "trial_seed": 0, "data_dir": data_dir,
            "task": "domain_generalization",
            "seed": seed_hash("zoo-seed", dataset, seed, i),
            "steps": steps, "checkpoint_freq": checkpoint_freq,
            "hparams": _hparams_json(dataset, algorithm, fixed), "eval_splits": list(eval_splits),
            "num_threads": 1, "skip_model_save": True,
        })
    return runs


def _hparams_json(dataset, algorithm, fixed):
    """Only the names the algorithm declares (others would be refused)."""
    import json

    from domainbed.hparams import hparam_space
    from domainbed.registry import get_algorithm_class, get_dataset_class
    space = hparam_space(get_algorithm_class(algorithm), get_dataset_class(dataset))
    return json.dumps({k: v for k, v in sorted(fixed.items()) if k in space}, sort_keys=True)


# ---------------------------------------------------------------- pooled launcher
def train_flags(command):
    """The train flags of a `python -m domainbed.scripts.train ...` command, else None."""
    argv = [str(a) for a in command.argv]
    if len(argv) >= 3 and argv[1] == "-m" and argv[2] == TRAIN_MODULE:
        return argv[3:]
    return None


@contextlib.contextmanager
def _output_to(path):
    """Send this process's stdout and stderr (file descriptors 1 and 2) to `path`."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    with open(path, "ab") as log:
        os.dup2(log.fileno(), 1)
        os.dup2(log.fileno(), 2)
    try:
        yield
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        os.close(saved[0])
        os.close(saved[1])


def run_in_process(command):
    """`launchers.run_command` without a new process: the same skip rules, lock, log
    and outcome; the job runs through the train CLI's own `main`."""
    flags = train_flags(command)
    if flags is None:
        return launchers.run_command(command)
    out = command.output_dir
    done = os.path.join(out, launchers.DONE_FILE)
    if os.path.exists(done):
        return launchers.Outcome(out, "skipped_done")
    os.makedirs(out, exist_ok=True)
    fd = launchers._try_lock(os.path.join(out, launchers.LOCK_FILE))
    if fd is None:
        return launchers.Outcome(out, "skipped_running")
    try:
        if os.path.exists(done):
            return launchers.Outcome(out, "skipped_done")
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        log_path = os.path.join(out, launchers.LOG_FILE)
        with open(log_path, "ab") as log:
            log.write(f"{launchers.LOG_PREFIX} pid {os.getpid()} running in process: "
                      f"{command}\n".encode())
        code = _call_train(flags, log_path)
        with open(log_path, "ab") as log:
            log.write(f"{launchers.LOG_PREFIX} exit code {code}\n".encode())
        ok = code == 0 and os.path.exists(done)
        return launchers.Outcome(out, "ok" if ok else "failed", code)
    finally:
        os.close(fd)


def _call_train(flags, log_path):
    from domainbed.scripts import train
    with _output_to(log_path):
        try:
            train.main(flags)
            return 0
        except UserError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        except SystemExit as e:   # argparse
            return e.code if isinstance(e.code, int) else 1
        except Exception:   # the job failed; train.main wrote err.txt with the traceback
            import traceback
            traceback.print_exc()
            return 1


def _worker_init():
    import torch
    torch.set_num_threads(1)


@launchers.register_launcher("pooled")
def pooled_launcher(commands, max_workers=1, echo=None, **_):
    """Run train jobs in `max_workers` long-lived processes (each job under its lock, as
    the local launcher), paying Python and torch start-up once per worker. Prints one
    progress line per finished job."""
    max_workers = int(max_workers or 1)
    if max_workers < 1:
        raise UserError(f"--max_workers must be at least 1, got {max_workers}")
    if not commands:
        return []
    echo = echo or (lambda line: print(line, flush=True))
    start, outcomes = time.time(), []
    context = multiprocessing.get_context("fork" if sys.platform != "win32" else "spawn")
    with context.Pool(min(max_workers, len(commands)), initializer=_worker_init) as pool:
        for outcome in pool.imap_unordered(run_in_process, commands):
            outcomes.append(outcome)
            if echo and outcome.status in ("ok", "failed"):
                elapsed = time.time() - start
                ran = sum(o.status in ("ok", "failed") for o in outcomes)
                echo(f"[{len(outcomes)}/{len(commands)}] {outcome.status}: "
                     f"{outcome.output_dir} ({elapsed:.0f} s, "
                     f"{3600 * ran / max(elapsed, 1e-9):.0f} runs/hour)")
                if outcome.status == "failed":
                    echo(f"  {launchers.last_error(outcome.output_dir)}")
    return outcomes
