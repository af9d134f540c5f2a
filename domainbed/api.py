"""The Python API for notebooks, a thin facade: train one run from a `RunConfig`'s fields as
keyword arguments (`domainbed.training.run`) and hand back its records, or train a zoo of
runs through a launcher (`domainbed.launch`).

    import domainbed
    records = domainbed.train(dataset="ColoredMNIST", algorithm="ERM", test_envs=[2],
                              output_dir="runs/erm", data_dir="data", steps=50)
    records.to_frame()

The options and their defaults are `domainbed.RunConfig`'s fields (the train command's
flags without dashes); `hparams` may be a dict.
"""
from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from domainbed.launch import sweep, zoo
from domainbed.launch.jobs import DONE, INCOMPLETE, NOT_LAUNCHED
from domainbed.networks.backbones import backbone_name, get_spec
from domainbed.results.records import Records, load_records
from domainbed.training.config import RunConfig
from domainbed.training.run import check_processes, train_resolved
from domainbed.training.splits import check_eval_splits
from oodutils.log import get_logger

LOG = get_logger(__name__)


def train(dataset: str = "ColoredMNIST", algorithm: str = "ERM",
          test_envs: Sequence[int] | int = (0,), output_dir: str | os.PathLike = "train_output",
          hparams: dict[str, Any] | str | None = None, **options: Any) -> Records:
    """Train (or resume, or find finished) one run into `output_dir`; return its records
    (`domainbed.results.records.Records`, `.to_frame()` for a DataFrame). `options` are
    the other RunConfig fields: data_dir, steps, checkpoint_freq, hparams_seed, seed, ..."""
    config = RunConfig.from_options(dataset=dataset, algorithm=algorithm, test_envs=test_envs,
                                    output_dir=output_dir, hparams=hparams, **options)
    algorithm_cls, dataset_cls = config.validate()
    hparams_dict = config.resolve_hparams()
    check_processes(config, algorithm_cls, hparams_dict)
    train_resolved(config, hparams_dict, algorithm_cls, dataset_cls)
    return load_records(config.output_dir)


@dataclass
class ZooTraining:
    """What `train_zoo` did: the zoo's runs, those this call launched, done and failed."""
    runs: int
    launched: int
    done: int
    failed: int
    seconds: float


def train_zoo(dataset: str, n_runs: int, runs_dir: str | os.PathLike, data_dir: str = "data",
              steps: int = 300, checkpoint_freq: int = 75,
              eval_splits: Sequence[str] = ("out", "test"), launcher: str = "pooled",
              workers: int = 2, seed: int = 0,
              notify: Callable[[str], None] | None = None,
              backbone: str | None = None) -> ZooTraining:
    """Draw a zoo of `n_runs` small-image runs (`domainbed.launch.zoo.draw_zoo`), or with
    `backbone` of linear probes on its pretrained features (`draw_probe_zoo`), and train
    those not yet done into `runs_dir` as ordinary sweep jobs with `launcher` ("pooled",
    "local" or "fused": probes then train as stacks of heads) and `workers` at once.
    Calling again resumes interrupted runs and, with a larger `n_runs`, extends the same
    zoo (a probe zoo reuses its cached features). Failed runs are counted, not raised.
    The pooled and fused launchers spawn their workers: call it under the script's
    ``if __name__ == "__main__":`` guard."""
    notify = notify or LOG.info
    check_eval_splits(list(eval_splits))
    start = time.time()
    os.makedirs(data_dir, exist_ok=True)
    if backbone:
        get_spec(backbone_name({"backbone": backbone}))   # an unknown name: its UserError
        train_args = zoo.draw_probe_zoo(dataset, n_runs, data_dir, steps, checkpoint_freq,
                                        list(eval_splits), backbone, seed=seed)
    else:
        train_args = zoo.draw_zoo(dataset, n_runs, data_dir, steps, checkpoint_freq,
                                  list(eval_splits), seed=seed)
    jobs = [sweep.Job(a, os.fspath(runs_dir)) for a in train_args]
    notify(sweep.summarize(jobs))
    todo = [j for j in jobs if j.state in INCOMPLETE + (NOT_LAUNCHED,)]
    failed = []
    if backbone and len(todo) > 1:   # the first probe extracts the features the rest share
        failed += sweep.launch(todo[:1], launcher, {"max_workers": 1}, seed=seed)
        for j in jobs:
            j.refresh()
    if todo:
        failed += sweep.launch(jobs, launcher, {"max_workers": workers}, seed=seed)
    for j in jobs:
        j.refresh()
    done = sum(j.state == DONE for j in jobs)
    return ZooTraining(len(jobs), len(todo), done, len(failed), time.time() - start)
