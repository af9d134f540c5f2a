"""The Python API for notebooks: train one run without building an argparse Namespace.

    import domainbed
    records = domainbed.train(dataset="ColoredMNIST", algorithm="ERM", test_envs=[2],
                              output_dir="runs/erm", data_dir="data", steps=50)
    records.to_frame()

The options and their defaults are those of `python -m domainbed.scripts.train` (its
parser is the single source), spelled as keyword arguments; `hparams` may be a dict.
"""
from __future__ import annotations

import json
import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from domainbed.errors import UserError

if TYPE_CHECKING:
    from domainbed.records import Records


def train(dataset: str = "ColoredMNIST", algorithm: str = "ERM",
          test_envs: Sequence[int] | int = (0,), output_dir: str | os.PathLike = "train_output",
          hparams: dict[str, Any] | str | None = None, **options: Any) -> Records:
    """Train (or resume, or find finished) one run into `output_dir`; return its records
    (`domainbed.records.Records`, `.to_frame()` for a DataFrame). `options` are the train
    CLI's flags without dashes: data_dir, steps, checkpoint_freq, hparams_seed, seed, ..."""
    from domainbed import hparams as hp
    from domainbed import training
    from domainbed.records import load_records
    from domainbed.scripts.train import parse_args, parse_overrides, validate

    args = parse_args([])
    unknown = sorted(set(options) - set(vars(args)))
    if unknown:
        raise UserError(f"unknown training option(s) {', '.join(unknown)}; valid: "
                        f"{', '.join(sorted(vars(args)))}")
    if isinstance(hparams, dict):
        hparams = json.dumps(hparams)
    test_envs = [test_envs] if isinstance(test_envs, int) else [int(e) for e in test_envs]
    vars(args).update(options, dataset=dataset, algorithm=algorithm, test_envs=test_envs,
                      output_dir=os.fspath(output_dir), hparams=hparams)
    algorithm_cls, dataset_cls = validate(args)
    overrides = parse_overrides(args)
    run_hparams = hp.resolve(args.algorithm, args.dataset, args.hparams_seed,
                             args.trial_seed, overrides)
    training.run(args, run_hparams, algorithm_cls, dataset_cls)
    return load_records(args.output_dir)
