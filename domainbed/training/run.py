"""One run, end to end: check its `RunConfig`, resolve its hyperparameters, train it in
this process or data-parallel in several (`distributed`), and leave a failure in the
run's err.txt. The train command, the pooled launcher's workers and `domainbed.api` all
go through here."""
from __future__ import annotations

import traceback
from collections.abc import Callable
from typing import Any

from domainbed.training import distributed, loop
from domainbed.training.config import RunConfig, check_data_parallel
from oodutils.errors import UserError
from oodutils.log import get_logger

LOG = get_logger(__name__)


def run_config(config: RunConfig,
               notify: Callable[[str], None] | None = None) -> dict[str, Any] | None:
    """Check `config`, then train (or resume, or find finished) its run; return the last
    checkpoint's record (None when the run was already finished). A failure is written to
    the run's err.txt (a UserError as its one line, anything else as the traceback) and
    raised."""
    notify = notify or LOG.info
    algorithm_cls, dataset_cls = config.validate()
    hparams = config.resolve_hparams(notify=notify)
    check_processes(config, algorithm_cls, hparams)
    config.make_output_dir()
    try:
        return train_resolved(config, hparams, algorithm_cls, dataset_cls)
    except UserError as e:
        if not distributed.is_secondary_process():
            loop.write_error(config.output_dir, f"error: {e}")
        raise
    except Exception:
        if not distributed.is_secondary_process():
            loop.write_error(config.output_dir, traceback.format_exc())
        raise


def check_processes(config: RunConfig, algorithm_cls: type, hparams: dict[str, Any]) -> None:
    """A data-parallel run of an algorithm or batch that does not split: refused before
    anything is created."""
    if distributed.wants_data_parallel(config):
        check_data_parallel(config, algorithm_cls, hparams, distributed.world_size(config))


def train_resolved(config: RunConfig, hparams: dict[str, Any], algorithm_cls: type,
                   dataset_cls: type) -> dict[str, Any] | None:
    """Train a checked run with its resolved `hparams`: in one process, or in several
    (`--distributed N`, or started by torchrun)."""
    if distributed.wants_data_parallel(config):
        return distributed.run(config, hparams)
    return loop.run(config, hparams, algorithm_cls, dataset_cls)
