"""One fused group in its own process: each member's lock, log and run directory as an
ordinary job has them, one shared dataset, and the stacked training of fused_training
(linear probes on cached features: probe_stack, the features held once for the group).

What a member sees is what a single train job would leave: `launcher.log` gets the
launcher's header and exit-code lines around the run's own notices and one line per
checkpoint; a member that fails (bad arguments, a NaN loss, a full disk) gets its
`err.txt` and stops alone. Each member keeps its own state of the global random
generators (as its single run would have it after its build and restore), swapped in
for its own steps and checkpoints. If the group cannot train stacked at all (an architecture
vmap cannot batch), its members are handed back to run as ordinary jobs, resuming from
whatever checkpoints the group wrote.
"""
import os
import traceback
from typing import Any

import torch

from domainbed.launch import jobs, probe_stack
from domainbed.launch.fused_training import resolve_arithmetic, train_group
from domainbed.launch.pooled import train_flags
from domainbed.training import arithmetic, feature_cache
from domainbed.training import loop as training
from domainbed.training.config import RunConfig
from domainbed.training.random_states import RandomStates
from oodutils.errors import UserError


class Member:
    """One job of the group: its command, lock, log, (once built) TrainingRun and its own
    state of the global random generators."""

    def __init__(self, command: Any) -> None:
        self.command, self.out = command, command.output_dir
        self.claim: Any
        self.run: Any
        self.random_states: Any
        self.claim = self.run = self.random_states = None
        self.outcome: Any = None

    def write_log(self, line: str) -> None:
        self.claim.write_log(line)

    def acquire(self) -> bool:
        """Take the job as run_command does (`jobs.JobClaim`); False (with an outcome)
        when it is not ours to run."""
        self.claim = jobs.JobClaim(self.out)
        self.outcome = self.claim.outcome
        return self.outcome is None

    def fail(self, error: Any) -> None:
        """This member stops: err.txt as the train CLI writes it, the exit-code line."""
        if isinstance(error, UserError):
            message, code = f"error: {error}", 2
        else:
            message, code = "".join(traceback.format_exception(error)), 1
        try:
            if self.run is not None:
                self.run.close()   # its trackers: a tracker never raises out of close()
            training.write_error(self.out, message)
            self.write_log(message.rstrip())
            self.write_log(f"{jobs.LOG_PREFIX} exit code {code}")
        finally:
            self.outcome = jobs.Outcome(self.out, "failed", code)

    def release(self) -> None:
        if self.claim is not None:
            self.claim.release()


class GroupRunner:
    def __init__(self, commands: Any, arithmetic: str = "auto") -> None:
        self.members = [Member(c) for c in commands]
        self.arithmetic = arithmetic
        self.fallback: list[Any]
        self.fallback, self.fallback_reason = [], ""
        self.shared_data: Any = None

    @property
    def outcomes(self) -> list[Any]:
        return [m.outcome for m in self.members if m.outcome is not None]

    def describe(self) -> str:
        built = [m.run for m in self.members if m.run is not None]
        if not built:
            return "nothing built"
        args = built[0].config
        return f"{args.algorithm} on {args.dataset}, test envs {args.test_envs}"

    def run(self) -> None:
        active = [m for m in self.members if m.acquire()]
        for member in active:
            member.write_log(f"{jobs.LOG_PREFIX} pid {os.getpid()} running fused "
                             f"with {len(active)} models: {member.command}")
        by_start: dict[Any, Any] = {}
        with feature_cache.shared_loads():   # linear probes: the features held once
            for member in active:
                start = self._prepare(member)
                if start is not None:
                    by_start.setdefault(start, []).append(member)
        for start, members in sorted(by_start.items()):
            self._train(members, start)

    def _prepare(self, member: Any) -> Any:
        """Build and restore one member, and keep the global random generators' state as
        its single run would have it now (seeded by its build, or restored from its resume
        state); the first step it trains, or None when it does not train."""
        if not self._build(member):
            return None
        try:
            member.run.set_arithmetic(self._arithmetic(member.run))
            start = member.run.restore()
        except Exception as e:   # a resume state that does not fit: this member only
            member.fail(e)
            return None
        member.random_states = RandomStates.capture()
        return start

    def _build(self, member: Any) -> bool:
        """The member's TrainingRun, as `domainbed.training.run.run_config` builds it."""
        try:
            args = RunConfig.from_argv(train_flags(member.command))
            algorithm_cls, dataset_cls = args.validate()
            hparams = args.resolve_hparams(notify=member.write_log)
            args.make_output_dir()
            if not training.prepare_output_dir(args.output_dir, member.write_log):
                member.outcome = jobs.Outcome(member.out, "skipped_done")
                return False
            if args.num_threads:
                torch.set_num_threads(args.num_threads)
            data = self._data(dataset_cls, args, hparams)
            member.run = training.TrainingRun(args, hparams, algorithm_cls, dataset_cls,
                                              log=member.write_log, data=data)
            return True
        except Exception as e:
            member.fail(e)
            return False

    def _data(self, dataset_cls: Any, args: Any, hparams: dict[str, Any]) -> Any:
        """The group's dataset and splits, built once; None (each member builds its own)
        when building draws from a global RNG, which would change model initialization."""
        if self.shared_data is None:
            before = RandomStates.capture()
            data = training.build_run_data(dataset_cls, args, hparams)
            self.shared_data = data if before == RandomStates.capture() else False
            if self.shared_data is False:
                return data
        return self.shared_data or None

    def _arithmetic(self, run: Any) -> Any:
        """How the group computes `run` (training.arithmetic): a linear probe on cached
        features as a head of the probe stack, any other run as the fused arithmetic
        (exact or batched) says."""
        if run.arithmetic == arithmetic.PROBE_STACK:
            return arithmetic.PROBE_STACK
        if resolve_arithmetic(self.arithmetic, run.device) == "exact":
            return arithmetic.FUSED_EXACT
        return arithmetic.FUSED_BATCHED

    def _train(self, members: Any, start: Any) -> None:
        """The stackable linear probes as one probe stack, the others as one fused group."""
        probes = [m for m in members if m.run.arithmetic == arithmetic.PROBE_STACK]
        others = [m for m in members if m.run.arithmetic != arithmetic.PROBE_STACK]
        for part, probe in ((probes, True), (others, False)):
            if part:
                self._train_part(part, start, probe)

    def _train_part(self, members: Any, start: Any, probes: Any) -> None:
        train = probe_stack.train_probe_group if probes else train_group
        # a probe stack draws from no global generator; each head's arithmetic is its own
        extra = {} if probes else {"arithmetic": self.arithmetic,
                                   "random_states": [m.random_states for m in members]}

        by_run = {id(m.run): m for m in members}
        try:
            finished = train(
                [m.run for m in members], start,
                on_checkpoint=lambda run, results: by_run[id(run)].write_log(
                    training.checkpoint_line(results)),
                on_failure=lambda run, error: by_run[id(run)].fail(error), **extra)
        except Exception as e:  # the group cannot train stacked: its jobs run one by one
            reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            self.fallback_reason = f"stacked training failed: {reason[:200]}"
            for member in members:
                if member.outcome is None:
                    member.write_log(f"notice: {self.fallback_reason}; continuing as an "
                                     f"ordinary job")
                    member.release()
                    self.fallback.append(member.command)
            return
        for run in finished:
            member = by_run[id(run)]
            try:
                run.finish()
                member.write_log(f"{jobs.LOG_PREFIX} exit code 0")
                member.outcome = jobs.Outcome(member.out, "ok", 0)
            except Exception as e:
                member.fail(e)

    def release(self) -> None:
        for member in self.members:
            member.release()
