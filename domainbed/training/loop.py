"""One training run: the step loop, checkpoints (records + predictions), resume.

A run directory is the only output (see docs/CONTRACTS.md). Everything is written
atomically, and a run killed at any moment resumes from its last checkpoint and ends
with the same records as an uninterrupted run: batch indices are a pure function of
(seed, environment, step), and model, optimizer and RNG states are checkpointed.

`TrainingRun` splits a run into the pieces the CLI, the Python API and the fused
launcher share: set-up (device, data, identity, model), `restore`, `train_step`,
`checkpoint` and `finish`; `run` strings them together.
"""
import itertools
import json
import math
import os
import random
import stat
import sys
import time
from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np
import torch
from tqdm import tqdm

from domainbed.algorithms.base import TrainingContext, require_groups
from domainbed.datasets.base import MultipleDomainDataset
from domainbed.networks import backbones
from domainbed.training import arithmetic, feature_cache, probe_stack, trackers
from domainbed.training.accumulation import check_grad_accumulation, micro_batch
from domainbed.training.batches import (
    MinibatchSource,
    build_dataset,
    make_splits,
    samples_per_step,
    training_view,
)
from domainbed.training.config import RunConfig
from domainbed.training.early_stopping import DEFAULT_PATIENCE, EarlyStopping
from domainbed.training.evaluation import RunContext, evaluate
from domainbed.training.precision import autocast_context, check_precision
from domainbed.training.resume import (
    RESULTS_FILE,
    RESUME_FILE,
    args_identity,
    discard_resume_state,
    load_resume_state,
    read_kept_records,
    save_resume_state,
)
from domainbed.training.schedules import RunSchedule
from domainbed.training.splits import select_splits
from oodutils import fileio
from oodutils.csv_out import csv_text
from oodutils.errors import UserError
from oodutils.log import get_logger
from oodutils.pinned_dir import PinnedDir

LOG = get_logger(__name__)


class TrainingDiverged(UserError):
    """A loss became NaN or infinite: the run stops without writing a garbage record."""


def save_model(run_dir: PinnedDir, name: str, args_dict: Any, dataset: Any, algorithm: Any,
               hparams: dict[str, Any], num_domains: int) -> None:
    run_dir.write_bytes(name, fileio.torch_bytes({
        "args": args_dict, "model_input_shape": dataset.input_shape,
        "model_num_classes": dataset.num_classes, "model_num_domains": num_domains,
        "model_hparams": hparams, "model_dict": algorithm.state_dict()}))


def write_error(output_dir: str, message: str) -> None:
    """err.txt, unless the run directory is refused (a symlink: the error says so) or
    cannot be written (a full disk: the error already names the file)."""
    try:
        with PinnedDir.open(output_dir) as run_dir:
            run_dir.write_text("err.txt", message.rstrip() + "\n")
    except (OSError, UserError):
        pass


def pick_memory_format(choice: Any, device: torch.device | str, precision: Any) -> Any:
    """auto: channels-last on CPU (oneDNN's preferred layout, faster for convolutions
    there) and with bf16; contiguous otherwise."""
    if choice == "auto":
        choice = ("channels_last" if precision == "bf16" or torch.device(device).type == "cpu"
                  else "contiguous")
    return torch.channels_last if choice == "channels_last" else torch.contiguous_format



def already_placed(module: Any, device: torch.device | str, memory_format: Any = None) -> bool:
    """Whether `module.to(device)` (then `.to(memory_format=...)`) would give back every
    parameter and buffer as it is: then skipping them changes nothing, and a process
    building hundreds of runs around one shared frozen backbone (a probe stack) does not
    walk it through Module._apply each time."""
    for tensor in itertools.chain(module.parameters(), module.buffers()):
        moved = tensor.to(device)
        if memory_format is not None and moved.dim() in (4, 5):
            moved = moved.to(memory_format=memory_format)
        if moved is not tensor:
            return False
    return True


class TrainingRun:
    """One run's state between set-up and `done`. Build it, `restore()`, then call
    `train_step(step)` for each step and `checkpoint(step)` where `is_checkpoint(step)`;
    `finish()` writes model.pkl and `done`. `saves_resume_state` false: checkpoints
    write no resume state (a stack of probes, whose killed runs restart from step 0).
    A linear probe on cached features that `probe_stack.why_not` accepts trains as a
    probe stack of one: the arithmetic of its heads in a stack of any size."""
    is_main = True   # writes the run directory (a data-parallel run's rank 0 only)
    saves_resume_state = True
    stacks_as_probe = True   # one process: its steps may run as a probe stack

    def __init__(self, config: RunConfig, hparams: dict, algorithm_cls: type,
                 dataset_cls: type[MultipleDomainDataset],
                 log: Callable[[str], Any] | None = None, data: Any = None) -> None:
        """`data`: a RunData to share (the fused launcher builds it once per group of
        runs with the same dataset and splits); built here when None."""
        self.config, self.hparams, self.log = config, hparams, log or LOG.info
        self.algorithm_cls, self.dataset_cls = algorithm_cls, dataset_cls
        self.accum_steps = check_grad_accumulation(config.algorithm, algorithm_cls, hparams)
        self.out = config.output_dir
        # Every file of the run is written through this descriptor: a run directory (or a
        # folder in it) swapped for a symlink is refused, never followed.
        self.run_dir = PinnedDir.open(self.out, create=True)
        self.device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        check_precision(self.device, config.precision)
        if config.num_threads:
            torch.set_num_threads(config.num_threads)
        torch.manual_seed(config.seed)
        np.random.seed(config.seed)
        random.seed(config.seed)  # algorithms draw from python's `random` too (Mixup, RSC)
        self._build_data(data)
        self._build_identity()
        self._build_model()
        self.n_steps = config.steps or dataset_cls.N_STEPS
        self.checkpoint_freq = config.checkpoint_freq or dataset_cls.CHECKPOINT_FREQ
        self.steps_per_epoch = min(len(s) / samples_per_step(hparams)
                                   for s in self.in_splits)
        self.accumulators: dict[Any, Any]
        self.records: list[Any]
        self.last_results: dict[str, Any] | None
        self.records, self.accumulators, self.last_results = [], {}, None
        self.schedule = RunSchedule(hparams, self.n_steps)
        self.early_stopping = EarlyStopping(
            config.early_stopping, config.patience or DEFAULT_PATIENCE,
            self.train_envs) if config.early_stopping else None
        self.stopped = False   # early stopping ended the run at its last checkpoint
        self.trackers: Any = None   # opened by restore(), closed by finish() / close()
        self.probe: Any = None      # its probe stack of one once training starts, False if none
        self.set_arithmetic(self._own_arithmetic())

    def _own_arithmetic(self) -> Any:
        """How this run computes when it trains by itself: `probe-stack` for a linear probe
        on cached features that `probe_stack.why_not` accepts (a stack of one), else
        `single`."""
        if self.uses_feature_cache and probe_stack.why_not(self) is None:
            return arithmetic.PROBE_STACK
        return arithmetic.SINGLE

    def set_arithmetic(self, name: str) -> None:
        """The arithmetic its records name (training.arithmetic; a launcher that computes
        the run another way says so before restore(), which refuses a resume in another)."""
        self.arithmetic = name
        self.args_dict.update(arithmetic.args_entries(name, self.device))

    def _build_data(self, data: Any = None) -> None:
        config, hparams = self.config, self.hparams
        data = data or build_run_data(self.dataset_cls, config, hparams)
        self.dataset = data.dataset
        n_envs = len(self.dataset)
        self.in_splits, self.out_splits, self.uda_splits = (data.in_splits, data.out_splits,
                                                            data.uda_splits)
        self.train_envs = [i for i in range(n_envs) if i not in config.test_envs]  # type: ignore[operator]
        self.n_workers = min(getattr(self.dataset, "N_WORKERS", 0), os.cpu_count() or 1)
        self.memory_format = pick_memory_format(config.memory_format, self.device,
                                                config.precision)
        self.ctx = RunContext(self.device, config.precision, self.memory_format,
                              config.eval_batch_size, self.n_workers)
        self.minibatches = MinibatchSource(
            [training_view(self.in_splits[i]) for i in self.train_envs], self.train_envs,
            hparams, config.seed, self.device, self.memory_format, self.n_workers)
        self.uda_source = MinibatchSource(
            [s for _, s in self.uda_splits], [i for i, _ in self.uda_splits], hparams,
            config.seed + 1, self.device, self.memory_format,
            self.n_workers) if self.uda_splits else None
        self.named_splits = evaluated_splits(data, config)
        self.group_names = getattr(self.dataset, "group_names", None)

    def _build_identity(self) -> None:
        args_dict = data_args(self.config, self.dataset, self.dataset_cls)
        backbones.set_weights_dir(self.config.weights_dir)
        args_dict.update(backbones.weights_identity(self.dataset.input_shape, self.hparams))
        self.args_dict = args_dict
        self.identity = args_identity(args_dict)

    def _build_model(self) -> None:
        dataset = self.dataset
        self.algorithm = self.algorithm_cls(
            dataset.input_shape, dataset.num_classes, len(self.train_envs),
            self.hparams)
        memory_format = self.memory_format if len(dataset.input_shape) == 3 else None
        if not already_placed(self.algorithm, self.device, memory_format):
            self.algorithm = self.algorithm.to(self.device)
            if memory_format is not None:
                self.algorithm = self.algorithm.to(memory_format=memory_format)
        self.uses_feature_cache = feature_cache.attach(self)  # linear probes: cached features
        self._prepare_algorithm()

    def _prepare_algorithm(self) -> None:
        """Optional algorithm hooks: the training data once (two-stage and group methods)."""
        if getattr(self.algorithm, "NEEDS_GROUPS", False):
            require_groups(self.config.algorithm, [self.in_splits[i] for i in self.train_envs])
        if hasattr(self.algorithm, "prepare"):
            self.algorithm.prepare(TrainingContext(
                train_splits=[self.in_splits[i] for i in self.train_envs],
                holdout_splits=[self.out_splits[i] for i in self.train_envs],
                num_groups=len(self.group_names) if self.group_names else None,
                n_steps=self.config.steps or self.dataset_cls.N_STEPS, seed=self.config.seed,
                device=self.device))

    def restore(self) -> Any:
        """The first step to train: after the last checkpoint of an unfinished run, else 0.
        Starts the run's experiment trackers (--tracker)."""
        self._open_trackers()
        out, run_dir = self.out, self.run_dir
        self._remove_temporaries()
        if any(s.paths is not None for _, _, _, s in self.named_splits) and \
                not run_dir.exists("examples.csv"):
            run_dir.write_text("examples.csv", example_paths_csv(self.dataset))
        if self.config.restart:   # a best model of the discarded attempt is not this run's
            for name in ("model_best.json", "model_best.pkl"):
                run_dir.unlink(name)
        if self.config.restart and run_dir.exists(RESUME_FILE):
            discard_resume_state(run_dir, self.log)
        if run_dir.exists(RESUME_FILE):
            state = load_resume_state(run_dir, RESUME_FILE, self.algorithm, self.identity,
                                      self.schedule, (self.n_steps, self.checkpoint_freq),
                                      self.arithmetic)
            self.accumulators = state["accumulators"]
            self.records = read_kept_records(run_dir, RESULTS_FILE, state["records"],
                                             self.log)
            if self.early_stopping is not None:
                self.stopped = self.early_stopping.replay(map(json.loads, self.records))
            self.log(f"notice: resuming {out} at step {state['next_step']}")
            return state["next_step"]
        # Records no resume state vouches for (a run killed before its first checkpoint,
        # or a rerun of a finished run whose `done` is gone): kept aside, never deleted.
        aside = run_dir.move_aside(RESULTS_FILE)
        if aside:
            self.log(f"notice: starting {out} from step 0; its earlier records are kept "
                     f"in {aside}")
        return 0

    def _remove_temporaries(self) -> None:
        """The `.tmp-*` files an attempt killed mid-write left (a partial resume state,
        predictions) go before this one writes anything."""
        removed = self.run_dir.remove_temporaries()
        for name in ("predictions", "confusion"):
            if self.run_dir.exists(name):
                with self.run_dir.subdir(name, create=False) as folder:
                    removed += folder.remove_temporaries()
        if removed:
            self.log(f"notice: removed {removed} temporary file{'s' * (removed != 1)} "
                     f"an interrupted attempt left in {self.out}")

    def _open_trackers(self) -> None:
        if self.trackers is None and self.config.trackers and self.is_main:
            self.trackers = trackers.open_trackers(self.config.trackers, trackers.TrackedRun(
                self.out, trackers.run_name(self.args_dict), self.hparams, self.args_dict,
                self.identity, self.config.tracker_uri,
                timeout=self.config.tracker_timeout),
                warn=LOG.warning if self.log == LOG.info else self.log)

    def close(self) -> None:
        """Close the trackers (finish() does; a run stopped by an error calls it too)."""
        if self.trackers is not None:
            self.trackers.close()

    def train_step(self, step: int) -> Any:
        """One optimizer step of the algorithm at the scheduled learning rate (under
        gradient accumulation, `grad_accum_steps` updates on slices of the step's
        batches); its values are averaged into the next record."""
        step_start = time.time()
        if self._probe_stack():
            step_vals = {"loss": self.probe.train_step(step)[0]}
            self.accumulate(step, step_vals, time.time() - step_start)
            return step_vals
        balanced_hook = getattr(self.algorithm, "group_balanced_batches", None)
        balanced = bool(balanced_hook(step)) if balanced_hook else False
        batches = self.minibatches.batches(step, group_balanced=balanced)
        uda = None
        if self.uda_source is not None:
            uda = [x for x, _ in self.uda_source.batches(step)]
        groups = None
        if getattr(self.algorithm, "NEEDS_GROUPS", False):
            groups = self.minibatches.groups(step, group_balanced=balanced)
        micro_values = []
        with self.schedule.applied(), autocast_context(self.device, self.config.precision):
            for index in range(self.accum_steps):
                micro = micro_batch(index, self.accum_steps)
                extra = {} if groups is None else {"groups": micro(groups)}
                if self.accum_steps > 1:
                    self.algorithm.micro_step = (index, self.accum_steps)
                micro_values.append(self.algorithm.update(
                    micro(batches), None if uda is None else micro(uda), **extra))
        self.schedule.step()
        step_vals = micro_values[0] if self.accum_steps == 1 else {
            key: float(np.mean([float(v[key]) for v in micro_values]))
            for key in micro_values[0]}
        self.accumulate(step, step_vals, time.time() - step_start)
        return step_vals

    def _probe_stack(self) -> Any:
        """The probe stack of one this run trains as (built at its first step, after
        restore(): it starts from the restored head and Adam state), or None."""
        if self.probe is None:
            self.probe = self.arithmetic == arithmetic.PROBE_STACK and \
                probe_stack.ProbeStack([self])
        return self.probe or None

    def _sync_probe(self) -> None:
        """The probe stack's head and Adam state into the algorithm (what a checkpoint
        evaluates and saves); nothing to do without a probe stack."""
        if self.probe:
            self.probe.write_back()

    def accumulate(self, step: int, step_vals: Any, seconds: float) -> None:
        """Add one step's update() values to the next record's averages; a NaN or infinite
        value stops the run (TrainingDiverged) before any record holds it."""
        for key, value in step_vals.items():
            value = float(value)
            if not math.isfinite(value):
                raise TrainingDiverged(
                    f"{key} became {value} at step {step} "
                    f"({self.config.algorithm} on {self.config.dataset}); run stopped")
            self.accumulators.setdefault(key, []).append(value)
        self.accumulators.setdefault("step_time", []).append(seconds)

    def is_checkpoint(self, step: int) -> Any:
        return step % self.checkpoint_freq == 0 or step == self.n_steps - 1

    def checkpoint(self, step: int, logits: dict[str, torch.Tensor] | None = None) -> Any:
        """Evaluate, append the record, save predictions and the resume state.
        `logits`: {split name: logits} already computed (the fused launcher's evaluation
        pass), else the algorithm predicts each split here."""
        if logits is None and self.probe:   # the stack's evaluation, as in a larger stack
            self._sync_probe()
            logits = {name: split[0] for name, split in self.probe.predict().items()}
        results = {"step": step, "epoch": step / self.steps_per_epoch}
        for key, values in self.accumulators.items():
            results[key] = float(np.mean(values))
        metrics, table, confusion = evaluate(
            self.algorithm, self.named_splits, self.ctx, len(self.group_names or []),
            self.config.save_logits, logits=logits, extra_metrics=self.config.metrics,
            num_classes=self.dataset.num_classes)
        results.update(metrics)
        if self.early_stopping is not None and self.early_stopping.observe(results):
            self.early_stopping.mark(results)
            self.stopped = True
            self.log(f"notice: early stopping at step {step}: {self.config.early_stopping} "
                     f"has not improved for {self.early_stopping.patience} checkpoints "
                     f"(best at step {self.early_stopping.best_step})")
        stage = self.algorithm.stage() if hasattr(self.algorithm, "stage") else None
        if stage is not None:
            results["stage"] = stage  # two-stage algorithms: which stage this checkpoint is
        results["mem_gb"] = (torch.cuda.max_memory_allocated() / 1024 ** 3
                             if self.device.type == "cuda" else 0.0)
        results["hparams"] = self.hparams
        results["args"] = self.args_dict
        self.records.append(json.dumps(results, sort_keys=True))
        write_checkpoint(self.run_dir, step, table, confusion, self.records)
        self.accumulators = {}
        if self.config.save_model_every_checkpoint:
            self.save_model(f"model_step{step}.pkl")
        if self.config.save_best_model:
            self.keep_if_best(step, results)
        if self.saves_resume_state:
            save_resume_state(self.run_dir, RESUME_FILE, self.algorithm, step + 1,
                              self.records, self.accumulators, self.identity, self.schedule)
        self.last_results = results
        if self.trackers is not None:
            self.trackers.log_checkpoint(step, results)
        return results

    def keep_if_best(self, step: int, results: Any) -> None:
        """model_best.pkl + model_best.json (its step and validation accuracy) when this
        checkpoint's training-domain validation accuracy (the mean of the training
        environments' `out` accuracies) beats the kept one; read back on resume."""
        vals = [results.get(f"env{i}_out_acc") for i in self.train_envs]
        vals = [v for v in vals if isinstance(v, float) and math.isfinite(v)]
        if not vals:
            return
        val = sum(vals) / len(vals)
        try:   # through the run's folder: a planted symlink or FIFO counts as no model
            kept = float(json.loads(self.run_dir.read_bytes("model_best.json"))["val_acc"])
        except (OSError, UserError, ValueError, KeyError, TypeError):
            kept = -math.inf
        if val > kept:
            self.save_model("model_best.pkl")
            self.run_dir.write_text("model_best.json", json.dumps(
                {"step": step, "val_acc": val}, indent=2, sort_keys=True) + "\n")

    def save_model(self, name: str) -> None:
        save_model(self.run_dir, name, self.args_dict, self.dataset, self.algorithm,
                   self.hparams, len(self.train_envs))

    def finish(self) -> None:
        """model.pkl, then `done` last; the resume state is no longer needed."""
        self._sync_probe()
        if not self.config.skip_model_save:
            self.save_model("model.pkl")
        self.run_dir.write_text("done", "done\n", durable=True)
        self.run_dir.unlink(RESUME_FILE)
        self.close()


def evaluated_splits(data: Any, config: RunConfig) -> Any:
    """[(name, env, kind, split)] of the splits a checkpoint evaluates: every environment's
    in/out (and uda) split, with its deterministic transform, narrowed by --eval_splits (a
    split left out is never evaluated and its keys never written)."""
    named = [(f"env{i}_in", i, "in", s) for i, s in enumerate(data.in_splits)]
    named += [(f"env{i}_out", i, "out", s) for i, s in enumerate(data.out_splits)]
    named += [(f"env{i}_uda", i, "uda", s) for i, s in data.uda_splits]
    for _, _, _, split in named:
        if hasattr(split, "set_transform"):
            split.set_transform(False)
    return select_splits(named, config.eval_splits, config.test_envs)


def data_args(config: RunConfig, dataset: Any, dataset_cls: Any) -> Any:
    """A record's `args` before the model's entries: the config's fields (less where things
    are kept and how the run started), the data's identity, env, group and class names."""
    args_dict = config.to_dict()
    for key in ("restart", "weights_dir", "feature_cache_dir", "tracker_uri",
                "tracker_timeout"):
        args_dict.pop(key, None)   # how it started or where things are, not what it is
    args_dict.update(dataset.identity() if hasattr(dataset, "identity") else {})
    args_dict.update({
        "env_names": list(getattr(dataset_cls, "ENVIRONMENTS", []) or []),
        "group_names": getattr(dataset, "group_names", None),
        "num_classes": dataset.num_classes})
    return args_dict


def write_checkpoint(run_dir: PinnedDir, step: int, table: Any, confusion: Any,
                     records: Any) -> None:
    """One checkpoint's files: predictions, confusion matrices (rows: true class, one
    array per split) where computed, then results.jsonl holding `records` (JSON lines)."""
    with run_dir.subdir("predictions") as predictions:
        predictions.write_bytes(f"step_{step:07d}.npz", fileio.npz_bytes(level=1, **table))
    if confusion:
        with run_dir.subdir("confusion") as confusion_dir:
            confusion_dir.write_bytes(f"step_{step:07d}.npz", fileio.npz_bytes(**confusion))
    run_dir.write_text(RESULTS_FILE, "\n".join(records) + "\n", durable=True)


class RunData(NamedTuple):
    """A run's dataset and DomainBed's in/out/uda splits of it."""
    dataset: Any
    in_splits: list
    out_splits: list
    uda_splits: list


def build_run_data(dataset_cls: type, config: RunConfig, hparams: dict) -> RunData:
    dataset = build_dataset(dataset_cls, config.data_dir, config.test_envs, hparams,
                            config.data_seed)
    check_images = getattr(dataset, "check_images", None)
    if check_images is not None:   # a user's images: every file checked before any split
        check_images(config.skip_bad_images, LOG.info)
    return RunData(dataset, *make_splits(dataset, config, hparams))


def prepare_output_dir(out: Any, log: Callable[[str], Any] | None = None) -> bool:
    """False when `out` already holds a finished run (nothing to do); UnsafePath when
    `out` is a symlink or not a folder."""
    log = log or LOG.info
    with PinnedDir.open(out, create=True) as run_dir:
        st = run_dir.lstat("done")
        if st is not None and stat.S_ISREG(st.st_mode):
            log(f"notice: {out} already holds a finished run; nothing to do")
            return False
        if st is not None:
            remove_foreign_done(run_dir, st, log)
        run_dir.unlink("err.txt")
    return True


def remove_foreign_done(run_dir: PinnedDir, st: Any, log: Callable[[str], Any]) -> None:
    """A `done` that is no regular file (a symlink, dangling or not, a FIFO, a folder)
    marks nothing a run wrote: it goes (a folder is moved aside, a link's target is left
    alone) and the run resumes or starts, instead of every relaunch skipping it."""
    path = run_dir.join("done")
    if stat.S_ISDIR(st.st_mode):
        log(f"notice: {path} is a folder, not the marker a finished run writes; moved it "
            f"aside to {run_dir.move_aside('done')}")
        return
    kind = "a symbolic link" if stat.S_ISLNK(st.st_mode) else "not a regular file"
    run_dir.unlink("done")
    log(f"notice: {path} was {kind}, not the marker a finished run writes; removed it "
        f"(nothing it pointed to was touched)")


def run(config: RunConfig, hparams: dict, algorithm_cls: type, dataset_cls: type,
        log: Callable[[str], Any] | None = None) -> dict | None:
    """Train one run into config.output_dir (resuming if it holds an unfinished one).
    `log`: where notices and checkpoint lines go (default: the domainbed logger)."""
    log = log or LOG.info
    if not prepare_output_dir(config.output_dir, log):
        return None
    training_run = TrainingRun(config, hparams, algorithm_cls, dataset_cls, log)
    try:
        return train_loop(training_run)
    finally:
        training_run.close()


def train_loop(training_run: TrainingRun) -> dict | None:
    """Restore, train the remaining steps with their checkpoints, finish; the last
    checkpoint's record (None in a data-parallel run's secondary processes, which write
    nothing and show no progress)."""
    config, log = training_run.config, training_run.log
    start_step = training_run.restore()
    progress = tqdm(total=training_run.n_steps, initial=start_step,
                    disable=not (training_run.is_main and sys.stderr.isatty()),
                    desc=f"{config.algorithm}/{config.dataset}", dynamic_ncols=True)
    for step in range(start_step, training_run.n_steps):
        if training_run.stopped:
            break
        training_run.train_step(step)
        progress.update(1)
        if training_run.is_checkpoint(step):
            results = training_run.checkpoint(step)
            if results is None:
                continue
            progress.set_postfix({k: f"{v:.3f}" for k, v in results.items()
                                  if k.endswith("_out_acc")})
            if progress.disable:  # a log file (`tail -f launcher.log`): one line each
                log(checkpoint_line(results))
    progress.close()
    training_run.finish()
    return training_run.last_results


def checkpoint_line(results: Any) -> Any:
    """One log line per checkpoint, like DomainBed's printed table: step, epoch, the
    update() values, then every environment's accuracies."""
    head = [f"step {results['step']}", f"epoch {results['epoch']:.2f}"]
    skip = {"step", "epoch", "args", "hparams", "mem_gb"}
    values = [f"{k} {v:.4f}" for k, v in sorted(results.items())
              if k not in skip and not k.startswith("env") and isinstance(v, float)]
    accs = [f"{k} {v:.4f}" for k, v in sorted(results.items())
            if k.startswith("env") and k.endswith("_acc")]
    return "  ".join(head + values + accs)


def example_paths_csv(dataset: Any) -> Any:
    """examples.csv: each example's id, environment and file path (``oodutils.csv_out``:
    a file name that starts like a formula is inert in a spreadsheet)."""
    return csv_text(["id", "env", "path"],
                    ([int(example_id), env_i, str(file_path)]
                     for env_i, env in enumerate(dataset)
                     for example_id, file_path in zip(env.ids, env.paths or [])))
