"""Starting a data-parallel run (`--distributed N`): N processes on this machine, or the
processes `torchrun` started (on one machine or several), joined in one process group
(gloo on CPU, NCCL on GPUs, one GPU per process). What each process does is
`domainbed.training.data_parallel`.

Started here, the processes meet through a file store in a private temporary folder (no
port to pick or collide on); a process that stops on a UserError leaves its one line
there, and the first failure ends the others (torch.multiprocessing's spawn), so the
command fails with that line. Under torchrun (its RANK, WORLD_SIZE, MASTER_ADDR ...
variables), the processes meet where torchrun says and torchrun handles failures.
"""
import datetime
import json
import logging
import os
import sys
import tempfile
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.multiprocessing.spawn import ProcessException

from domainbed.training import loop
from domainbed.training.config import RunConfig
from domainbed.training.data_parallel import DataParallelRun
from oodutils.errors import UserError
from oodutils.log import get_logger

LOG = get_logger(__name__)
TORCHRUN_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
TIMEOUT = datetime.timedelta(minutes=60)   # longest wait in a collective (rank 0's writes)
ERROR_FILE = "error-rank{rank}.txt"
RESULT_FILE = "result.json"


def started_by_torchrun() -> bool:
    return all(v in os.environ for v in TORCHRUN_VARIABLES)


def is_secondary_process() -> bool:
    """A torchrun process other than rank 0 (it leaves err.txt to rank 0)."""
    return started_by_torchrun() and os.environ["RANK"] != "0"


def wants_data_parallel(config: RunConfig) -> bool:
    return config.distributed > 1 or started_by_torchrun()


def world_size(config: RunConfig) -> int:
    """The number of processes of the run: torchrun's, else --distributed."""
    return int(os.environ["WORLD_SIZE"]) if started_by_torchrun() else config.distributed


def run(config: RunConfig, hparams: dict) -> dict | None:
    """Train `config`'s run data-parallel; the last checkpoint's record (None when the
    run was already finished)."""
    if started_by_torchrun():
        n, rank = int(os.environ["WORLD_SIZE"]), int(os.environ["RANK"])
        if config.distributed not in (1, n):
            raise UserError(f"--distributed {config.distributed} under torchrun with "
                            f"{n} processes; leave --distributed out there")
        quiet_unless_first(rank, logging.getLogger("domainbed").getEffectiveLevel())
        return run_process(rank, n, int(os.environ["LOCAL_RANK"]), "env://",
                           config.replace(distributed=n), hparams,
                           threads=config.num_threads)
    n = config.distributed
    if torch.cuda.is_available() and torch.cuda.device_count() < n:
        raise UserError(f"--distributed {n} needs {n} GPUs (one per process); this "
                        f"machine shows {torch.cuda.device_count()}")
    threads = config.num_threads or max(1, torch.get_num_threads() // n)
    with tempfile.TemporaryDirectory(prefix="domainbed-distributed-") as meeting:
        spawn(n, meeting, config, hparams, threads)
        try:
            with open(os.path.join(meeting, RESULT_FILE)) as f:
                return json.load(f)
        except FileNotFoundError:
            return None


def spawn(world_size: int, meeting: Any, config: RunConfig, hparams: dict[str, Any],
          threads: Any) -> None:
    """Run the processes to their end; the first failure as one UserError line where a
    process stopped on one, else as the process's traceback."""
    context = mp.start_processes(_process_main, nprocs=world_size, join=False,
                                 start_method="spawn",
                                 args=(world_size, meeting, config, hparams, threads,
                                       logging.getLogger("domainbed").getEffectiveLevel()))
    # torch logs a warning for each process it ends after the first failure: that
    # failure's own line says what happened
    quiet = logging.getLogger("torch.multiprocessing.spawn")
    level = quiet.level
    quiet.setLevel(logging.ERROR)
    try:
        while not context.join():
            pass
    except ProcessException as e:
        message = first_error(meeting, world_size)
        if message:
            raise UserError(message) from None
        raise RuntimeError(f"data-parallel process {e.error_index} failed:\n{e}") from None
    finally:
        quiet.setLevel(level)
        for process in context.processes:
            if process.is_alive():
                process.terminate()


def first_error(meeting: Any, world_size: int) -> Any:
    for rank in range(world_size):
        try:
            with open(os.path.join(meeting, ERROR_FILE.format(rank=rank))) as f:
                return f.read().strip()
        except FileNotFoundError:
            continue
    return None


def _process_main(rank: int, world_size: int, meeting: Any, config: RunConfig,
                  hparams: dict[str, Any], threads: Any, log_level: Any) -> None:
    """One spawned process: its UserError is left in the meeting folder as one line."""
    quiet_unless_first(rank, log_level)   # spawned: the parent's -v / -q
    try:
        results = run_process(rank, world_size, rank, f"file://{meeting}/store", config,
                              hparams, threads)
    except UserError as e:
        with open(os.path.join(meeting, ERROR_FILE.format(rank=rank)), "w") as f:
            f.write(str(e))
        sys.exit(1)
    if rank == 0 and results is not None:
        with open(os.path.join(meeting, RESULT_FILE), "w") as f:
            json.dump(results, f)


def quiet_unless_first(rank: int, log_level: Any) -> None:
    """Notices (the dataset's, say) once, from rank 0; warnings from every process."""
    logging.getLogger("domainbed").setLevel(log_level if rank == 0 else
                                            max(log_level, logging.WARNING))


def run_process(rank: int, world_size: int, local_rank: Any, init_method: Any, config: RunConfig,
                hparams: dict[str, Any], threads: int = 0) -> Any:
    """Join the process group, train this process's part of the run, leave the group."""
    if threads:
        torch.set_num_threads(threads)
    use_cuda = torch.cuda.is_available()
    if use_cuda:
        torch.cuda.set_device(local_rank)
    dist.init_process_group("nccl" if use_cuda else "gloo", init_method=init_method,
                            rank=rank, world_size=world_size, timeout=TIMEOUT)
    algorithm_cls, dataset_cls = config.validate()
    proceed = torch.tensor([1 if rank else int(loop.prepare_output_dir(
        config.output_dir, LOG.info))], device="cuda" if use_cuda else "cpu")
    dist.broadcast(proceed, 0)
    results = None
    if proceed.item():
        results = loop.train_loop(DataParallelRun(config, hparams, algorithm_cls,
                                                  dataset_cls, LOG.info))
    # Only a process that succeeded leaves the group: on torch 2.4 a failing process's
    # destroy_process_group deadlocks (gloo's destructor joins a thread that waits for the
    # GIL); the failing process exits instead, and spawn or torchrun ends the others.
    dist.destroy_process_group()
    return results
