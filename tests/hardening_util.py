"""Shared helpers of the tests that train: in-process train runs on Debug28, the CLI's step
loop (the one hand-written loop of the tests), and a partial run that stops (as a kill
would) after a given step."""
import json

import pytest

VOLATILE = ("step_time", "mem_gb")


def train_argv(out, *extra, algorithm="ERM", steps=6, freq=2, hparams='{"arch": "mlp"}'):
    """A tiny Debug28 run (an MLP: 20x faster than the default CNN on a CPU)."""
    return ["--dataset", "Debug28", "--algorithm", algorithm, "--data_dir", str(out.parent),
            "--output_dir", str(out), "--steps", str(steps), "--checkpoint_freq", str(freq),
            "--test_envs", "0", "--num_threads", "1", "--hparams", hparams, *extra]


def train(argv, capsys=None):
    """Run the train CLI in-process; returns (exit code, stderr)."""
    from domainbed.scripts.train import main
    from oodutils.errors import run_cli
    code = 0
    try:
        run_cli(main, argv)
    except SystemExit as e:
        code = e.code
    err = capsys.readouterr().err if capsys is not None else ""
    return code, err


def training_run(argv, dataset_cls=None):
    """A TrainingRun set up from train CLI arguments as the CLI sets it up (output folder
    prepared, hyperparameters resolved); `dataset_cls` replaces the named dataset's class."""
    from domainbed import run_hparams
    from domainbed.training import loop as training
    from domainbed.training.config import RunConfig
    args = RunConfig.from_argv(argv)
    algorithm_cls, named_dataset_cls = args.validate()
    overrides = json.loads(args.hparams) if args.hparams else {}
    hparams = run_hparams.resolve(args.algorithm, args.dataset, args.hparams_seed, args.trial_seed,
                                  overrides, notify=lambda m: None)
    assert training.prepare_output_dir(args.output_dir, log=lambda m: None)
    return training.TrainingRun(args, hparams, algorithm_cls, dataset_cls or named_dataset_cls,
                                log=lambda m: None)


def train_steps(run, stop_after=None, lose_next_step=False):
    """The CLI's step loop on `run`: from the restored step, train and checkpoint, then finish.
    With `stop_after`, stop after that step as a SIGKILL would (no finish); `lose_next_step`
    also takes the next step, which no checkpoint keeps."""
    last = run.n_steps - 1 if stop_after is None else stop_after
    for step in range(run.restore(), last + 1):
        run.train_step(step)
        if run.is_checkpoint(step):
            run.checkpoint(step)
    if stop_after is None:
        run.finish()
    elif lose_next_step:
        run.train_step(stop_after + 1)
    return run


def train_partially(argv, stop_after):
    """Train like the CLI but stop after step `stop_after` (state as a SIGKILL leaves it)."""
    return train_steps(training_run(argv), stop_after)


def records(out):
    with open(out / "results.jsonl") as f:
        return [json.loads(line) for line in f if line.strip()]


def comparable(recs):
    out = []
    for r in recs:
        r = {k: v for k, v in r.items() if k not in VOLATILE}
        r["args"] = {k: v for k, v in r["args"].items() if k != "output_dir"}
        out.append(r)
    return out


class PlantedPickle:
    """An object whose unpickling would write "pwned" into `target`: what a hostile weights
    or cache file holds; a reader that never runs code refuses to build it."""
    def __init__(self, target):
        self.target = target

    def __reduce__(self):
        from pathlib import Path
        return (Path.write_text, (Path(self.target), "pwned"))


@pytest.fixture
def quiet_threads():
    import torch
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


def wait_for(predicate, what, timeout=300):
    """predicate()'s first true value, polled every 0.5 s; fails the test after `timeout`."""
    import time
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.5)
    raise AssertionError(f"timed out waiting for {what}")
