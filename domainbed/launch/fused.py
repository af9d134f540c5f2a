"""The `fused` command launcher: a sweep's jobs that can share one process train
together (see domainbed.launch.fused_training): on an accelerator with stacked parameters
(`batched`), on CPU each with its single run's arithmetic (`exact`).

Linear probes on cached features (`transfer: linear_probe`, ERM, pretrained weights) train
as one stack of heads instead (domainbed.launch.probe_stack; up to
`probe_stack.MAX_HEADS` per group, on CPU too: a head is one small matrix): jobs on the
same data, backbone, batch size and schedule stack, each with its own learning rate,
weight decay and seed.

Jobs fuse when they train the same algorithm (one with a `FusedForm`: ERM,
ReweightedERM, GroupDRO, IRM, VREx, CORAL, MMD) on the same data (dataset, data seed,
test environments, holdout, trial seed), with the same architecture, batch size,
schedule and evaluation; learning rate, weight decay, dropout, the algorithm's penalty
weights and the training seed may differ. Fused training is constant-rate Adam without
gradient accumulation or early stopping. Every other job runs as an ordinary job (the
local launcher), and the launcher says why. Each fused member keeps everything a job
has: its run directory, lock, `launcher.log` (one line per checkpoint), records,
predictions, resume state and `done`; a relaunch resumes each member from its own last
checkpoint, and a member that diverges stops alone.

Why stacking for accelerators only: a GPU runs one small model far below capacity, and
stacking dozens of them fills it. A CPU is already busy with one model: stacking slows
each model down there (scripts/bench_fused.py measures it), so on a CPU `exact` is the
default: records bit for bit the single runs', one process and one copy of the data.
"""
import json
import multiprocessing
import os
import queue
import time
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from domainbed.algorithms.base import fused_form
from domainbed.algorithms.optimization import OPTIMIZATION_HPARAMS
from domainbed.launch import jobs, local, probe_stack
from domainbed.launch.fused_group import GroupRunner
from domainbed.launch.fused_training import ARITHMETICS, member_hparams
from domainbed.launch.launchers import FUSED_MAX_MODELS
from domainbed.launch.pooled import train_flags
from domainbed.launch.progress import SweepProgress
from domainbed.registry import ALGORITHMS
from domainbed.training.config import RunConfig
from oodutils.errors import UserError

# Arguments that may differ within a group (each member's own) or do not shape training.
MEMBER_ARGS = ("seed", "hparams_seed", "hparams", "output_dir", "restart", "num_threads")


@dataclass
class Job:
    command: jobs.Command
    args: RunConfig | None = None
    hparams: dict | None = None
    algorithm_cls: type | None = None
    dataset_cls: type | None = None


@dataclass
class Plan:
    groups: list = field(default_factory=list)      # lists of Commands that fuse
    ordinary: list = field(default_factory=list)    # Commands run one by one
    notices: list = field(default_factory=list)


def parse_job(command: Any) -> tuple[Any, ...]:
    """The job's parsed train arguments and hyperparameters, or why it cannot fuse."""
    flags = train_flags(command)
    if flags is None:
        return None, "not a train command"
    try:
        args: Any = RunConfig.from_argv(flags)
        algorithm_cls, dataset_cls = args.validate(check_data_dir=False)
        hparams: Any = args.resolve_hparams(notify=lambda message: None)
    except (UserError, SystemExit):
        return None, "its arguments are invalid (the ordinary job reports why)"
    probe = hparams.get("transfer", "full") == "linear_probe"
    if probe:
        reason = probe_stack.why_not_job(args, hparams)
        if reason:
            return None, reason
    elif fused_form(algorithm_cls) is None:
        return None, f"{args.algorithm} has no fused form"
    if args.distributed > 1:
        return None, "it trains data-parallel (--distributed)"
    reason = unfusable_optimization(args, hparams)
    if reason:
        return None, reason
    return Job(command, args, hparams, algorithm_cls, dataset_cls), None


def unfusable_optimization(args: Any, hparams: dict[str, Any]) -> str | None:
    """Why fused training (constant-rate Adam, one step per batch, every step) cannot
    train this job, or None: other optimizers, schedules, gradient accumulation or
    clipping and early stopping run as ordinary jobs."""
    fusable = {"optimizer": "adam", "lr_schedule": "constant", "warmup_steps": 0,
               "grad_accum_steps": 1, "max_grad_norm": 0.0}
    for name, value in fusable.items():
        if hparams.get(name, OPTIMIZATION_HPARAMS[name].default) != value:
            return f"fused training is constant-rate Adam; this job has {name}=" \
                   f"{hparams[name]!r}"
    if args.early_stopping:
        return "fused members train every step; this job stops early"
    return None


def is_probe(job: Any) -> bool:
    return job.hparams.get("transfer", "full") == "linear_probe"


def group_key(job: Any) -> Any:
    """Jobs with equal keys train together: everything but each member's own values."""
    free = set(probe_stack.HEAD_HPARAMS if is_probe(job) else
               member_hparams(job.algorithm_cls))
    args = {k: v for k, v in vars(job.args).items() if k not in MEMBER_ARGS}
    hparams = {k: v for k, v in job.hparams.items() if k not in free}
    return json.dumps([is_probe(job), args, hparams], sort_keys=True, default=str)


def plan(commands: Any, max_models: Any = FUSED_MAX_MODELS) -> Any:
    """Split a sweep's commands into fused groups (of at most `max_models`) and ordinary
    jobs, with one notice line per reason a job does not fuse."""
    reasons: defaultdict[Any, int]
    result, by_key, reasons = Plan(), defaultdict(list), defaultdict(int)
    limits = {}
    for command in commands:
        job, reason = parse_job(command)
        if job is None:
            result.ordinary.append(command)
            reasons[reason] += 1
        else:
            key = group_key(job)
            by_key[key].append(command)
            limits[key] = probe_stack.MAX_HEADS if is_probe(job) else max_models
    for key, members in by_key.items():
        max_models = limits[key]
        if len(members) == 1:
            result.ordinary.extend(members)
            reasons["no other job shares its data, architecture, batch size and schedule "
                    "(fix them with --hparams to fuse)"] += 1
            continue
        for start in range(0, len(members), max_models):
            chunk = members[start:start + max_models]
            (result.groups if len(chunk) > 1 else result.ordinary).append(
                chunk if len(chunk) > 1 else chunk[0])
    for reason, count in sorted(reasons.items()):
        result.notices.append(f"fused: {count} job{'s' * (count != 1)} run as ordinary "
                              f"jobs: {reason}")
    if any("has no fused form" in r for r in reasons):
        result.notices.append(f"fused: algorithms that fuse: {', '.join(fusable_algorithms())}")
    return result


def fusable_algorithms() -> list[Any]:
    return sorted(name for name in ALGORITHMS.names() if fused_form(ALGORITHMS.get(name)))


def fused_launcher(commands: Any, max_workers: int = 1, echo: Any = None,
                   fused_max_models: Any = FUSED_MAX_MODELS, fused_arithmetic: str = "auto",
                   **_: Any) -> Any:
    """Train fusable jobs in groups (one process per group, `max_workers` groups at a
    time), then every other job with the local launcher. `fused_arithmetic`: exact,
    batched or auto (see domainbed.launch.fused_training)."""
    max_workers, max_models = int(max_workers or 1), int(fused_max_models or 1)
    if fused_arithmetic not in ARITHMETICS:
        raise UserError(f"--fused_arithmetic must be one of {', '.join(ARITHMETICS)}, got "
                        f"{fused_arithmetic!r}")
    if max_workers < 1:
        raise UserError(f"--max_workers must be at least 1, got {max_workers}")
    if max_models < 1:
        raise UserError(f"--fused_max_models must be at least 1, got {max_models}")
    echo = echo or (lambda line: print(line, flush=True))
    work = plan(commands, max_models)
    for line in work.notices:
        echo(line)
    outcomes, ordinary = [], list(work.ordinary)
    if work.groups:
        echo(f"fused: {sum(map(len, work.groups))} jobs in {len(work.groups)} groups "
             f"({', '.join(str(len(g)) for g in work.groups)} models)")
        progress = SweepProgress(sum(map(len, work.groups)), max_workers, echo)
        echo = progress.echo
        started, names = {}, {c.output_dir: c.describe() for c in commands}

        def on_start(index: Any, commands: Any) -> None:
            started[index] = time.monotonic()
            for _ in commands:
                progress.job_started()
        for index, result in run_groups(work.groups, max_workers, on_start, progress.tick,
                                        fused_arithmetic):
            seconds = (time.monotonic() - started[index]) / max(1, len(work.groups[index]))
            outcomes.extend(result.outcomes)
            for outcome in result.outcomes:
                local._report(outcome, echo, names.get(outcome.output_dir))
                progress.job_finished(outcome, seconds)
            echo(result.summary)
            if result.fallback:
                echo(f"fused: {len(result.fallback)} jobs continue as ordinary jobs "
                     f"({result.fallback_reason})")
                ordinary.extend(result.fallback)
        progress.close()
    if ordinary:
        outcomes.extend(local.local_launcher(ordinary, max_workers=max_workers))
    return outcomes


def run_groups(groups: Any, max_workers: Any, on_start: Any = None, on_idle: Any = None,
               arithmetic: str = "auto") -> Iterator[Any]:
    """Yield (index, GroupResult) of each group, training `max_workers` groups at a time, each in a
    fresh spawned process (safe with CUDA; its memory is freed when it ends). A process
    that dies without a result (killed, out of memory) fails its members, not the
    sweep. `on_start(index, commands)` when a group's process starts; `on_idle()` every
    second of waiting."""
    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    running: dict[Any, Any]
    pending, running = list(enumerate(groups)), {}
    try:
        while pending or running:
            while pending and len(running) < max_workers:
                index, commands = pending.pop(0)
                process = context.Process(target=_group_process,
                                          args=(index, commands, results, arithmetic))
                process.start()
                running[index] = process
                if on_start:
                    on_start(index, commands)
            try:
                index, result = results.get(timeout=1.0)
            except queue.Empty:
                if on_idle:
                    on_idle()
                for index, process in list(running.items()):
                    # exit code 0 comes only after the result is queued (read next time)
                    if process.exitcode not in (None, 0):
                        running.pop(index)
                        yield index, _died(groups[index], process.exitcode)
                continue
            process = running.pop(index, None)
            if process is not None:
                process.join()
            yield index, result
    finally:
        for process in running.values():
            process.terminate()


def _group_process(index: Any, commands: Any, results: Any, arithmetic: Any) -> None:
    results.put((index, run_group(commands, arithmetic)))


def _died(commands: Any, exitcode: Any) -> Any:
    outcomes = [jobs.Outcome(c.output_dir, "failed", exitcode) for c in commands
                if not jobs.is_done(c.output_dir)]
    return GroupResult(outcomes, [], summary=f"fused: the process of a group of "
                                             f"{len(commands)} died (exit code {exitcode}); "
                                             f"relaunch to resume its members")


@dataclass
class GroupResult:
    outcomes: list
    fallback: list
    fallback_reason: str = ""
    summary: str = ""


def run_group(commands: Any, arithmetic: str = "auto") -> Any:
    """Train one group in this process (the pool's worker); see fused_group.py."""
    started = time.time()
    runner = GroupRunner(commands, arithmetic)
    try:
        runner.run()
    finally:
        runner.release()
    ok = sum(o.status == "ok" for o in runner.outcomes)
    elapsed = time.time() - started
    summary = (f"fused: group of {len(commands)} ({runner.describe()}): {ok} finished in "
               f"{elapsed:.0f} s ({3600 * ok / max(elapsed, 1e-9):.0f} models/hour)")
    return GroupResult(runner.outcomes, runner.fallback, runner.fallback_reason, summary)


def pid_line() -> str:
    return f"{jobs.LOG_PREFIX} pid {os.getpid()}"
