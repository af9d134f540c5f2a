"""Resume state of an unfinished run: identity of its arguments, model/optimizer states,
every RNG a run draws from (torch, CUDA, numpy, python's `random`) and the records it
vouches for. Private to training (a run directory's `resume_state.pt`).

A run directory may come from someone else (a shared scratch space, a tarball), so the
state is read with ``torch.load(weights_only=True)``: it holds only tensors, numbers,
strings, lists, tuples and dicts, and loading it can never run code. A state that cannot
be read is one clear error naming the file and the way out (``--restart``).
"""
import hashlib
import json
import math
import random
import stat
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import torch

from domainbed.training.arithmetic import resume_problem
from oodutils import fileio
from oodutils.errors import UserError, load_error_reason

RESUME_FILE = "resume_state.pt"
RESULTS_FILE = "results.jsonl"
STATE_VERSION = 2
# Arguments that may differ between an interrupted run and its resumption.
# where and how a run is kept, not what it computes
NON_IDENTITY_ARGS = ("output_dir", "progress", "eval_batch_size", "num_threads", "restart",
                     "save_best_model", "metrics", "trackers", "distributed",
                     # how it is computed: checked on its own (training.arithmetic)
                     "arithmetic", "torch_version", "device_kind")
RESTART_HINT = ("rerun with --restart to discard it and start over (the old records are "
                "moved aside to results.jsonl.prev, or .prev.N when that exists)")


class ResumeStateError(UserError):
    """resume_state.pt is unreadable, not ours, or does not fit the run."""


def args_identity(args_dict: Any) -> Any:
    kept = {k: v for k, v in args_dict.items() if k not in NON_IDENTITY_ARGS}
    return hashlib.md5(json.dumps(kept, sort_keys=True).encode()).hexdigest()


def optimizer_attributes(algorithm: Any) -> dict[Any, Any]:
    return {name: value for name, value in vars(algorithm).items()
            if isinstance(value, torch.optim.Optimizer)}


def numpy_rng_state() -> dict[str, Any]:
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    return {"kind": str(kind), "keys": torch.from_numpy(keys.astype(np.int64)),  # type: ignore[attr-defined]
            "pos": int(pos), "has_gauss": int(has_gauss), "cached_gaussian": float(cached)}


def set_numpy_rng_state(state: Any) -> None:
    keys = state["keys"].numpy().astype(np.uint32)
    np.random.set_state((state["kind"], keys, state["pos"], state["has_gauss"],
                         state["cached_gaussian"]))


def python_rng_state() -> list[Any]:
    version, internal, gauss_next = random.getstate()
    return [int(version), list(internal), gauss_next]


def set_python_rng_state(state: Any) -> None:
    version, internal, gauss_next = state
    random.setstate((version, tuple(internal), gauss_next))


def save_resume_state(run_dir: Any, name: str, algorithm: Any, step: int, records: Any,
                      accumulators: Any, identity: Any, schedule: Any = None) -> None:
    """`records`: the results.jsonl lines written so far (the state vouches for them).
    `run_dir`: the run's PinnedDir. `schedule`: the run's learning-rate schedule
    (training.schedules.RunSchedule), whose position is restored exactly."""
    run_dir.write_bytes(name, fileio.torch_bytes({
        "version": STATE_VERSION, "next_step": step, "n_records": len(records),
        "records": list(records), "identity": identity,
        "algorithm": algorithm.state_dict(),
        "optimizers": {k: o.state_dict() for k, o in optimizer_attributes(algorithm).items()},
        "torch_rng": torch.get_rng_state(),
        "cuda_rng": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None,
        "numpy_rng": numpy_rng_state(), "python_rng": python_rng_state(),
        "accumulators": accumulators,
        "schedule": schedule.state_dict() if schedule is not None else None,
    }), durable=True)


def discard_resume_state(run_dir: Any, log: Callable[[str], Any]) -> None:
    """--restart: the resume state goes (a folder or other non-file there is moved aside
    to resume_state.pt.prev[.N], since only a file is ours to delete)."""
    st = run_dir.lstat(RESUME_FILE)
    if st is not None and stat.S_ISDIR(st.st_mode):
        aside = run_dir.move_aside(RESUME_FILE)
        log(f"notice: --restart: {run_dir.join(RESUME_FILE)} is a folder; moved it aside "
            f"to {aside}")
    else:
        run_dir.unlink(RESUME_FILE)
        log(f"notice: --restart: discarded the resume state of {run_dir.path}")


def _read_state(run_dir: Any, name: str) -> Any:
    path = run_dir.join(name)
    try:
        with run_dir.open_reader(name) as f:   # a FIFO or folder there: refused, no hang
            state = torch.load(f, map_location="cpu", weights_only=True)
    except Exception as e:  # torn zip, EOF, a pickle asking for globals, not a file ...
        raise ResumeStateError(f"cannot read the resume state {path} "
                               f"({load_error_reason(e)}); {RESTART_HINT}") from None
    needed = ("version", "next_step", "records", "identity", "algorithm", "optimizers",
              "torch_rng", "numpy_rng", "python_rng", "accumulators")
    if not isinstance(state, dict) or any(k not in state for k in needed) or \
            state["version"] != STATE_VERSION:
        raise ResumeStateError(f"the resume state {path} is not one this version wrote; "
                               f"{RESTART_HINT}")
    problem = state_shape_problem(state) or records_problem(state["records"],
                                                            state["next_step"])
    if problem:
        raise ResumeStateError(f"the resume state {path} is malformed ({problem}); "
                               f"{RESTART_HINT}")
    return state


def _is_int(value: Any) -> Any:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> Any:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and \
        math.isfinite(value)


def state_shape_problem(state: Any) -> Any:
    """What in a loadable state has the wrong type or shape (it would give a traceback
    or a wrong step later), or None."""
    if not _is_int(state["next_step"]) or state["next_step"] < 0:
        return "next_step is not a non-negative integer"
    if not isinstance(state["identity"], str):
        return "identity is not a string"
    if not isinstance(state["algorithm"], dict) or not isinstance(state["optimizers"], dict):
        return "algorithm or optimizers is not a dict"
    if not isinstance(state.get("schedule"), (dict, type(None))):
        return "schedule is not a dict"
    if not isinstance(state["torch_rng"], torch.Tensor) or \
            state["torch_rng"].dtype != torch.uint8:
        return "torch_rng is not a byte tensor"
    accumulators = state["accumulators"]
    if not isinstance(accumulators, dict) or not all(
            isinstance(k, str) and isinstance(v, list) and all(map(_is_number, v))
            for k, v in accumulators.items()):
        return "accumulators is not a dict of lists of numbers"
    return numpy_rng_problem(state["numpy_rng"]) or python_rng_problem(state["python_rng"])


def numpy_rng_problem(state: Any) -> str | None:
    expected_keys = np.random.get_state()[1].shape  # type: ignore[index]
    if not isinstance(state, dict) or not isinstance(state.get("keys"), torch.Tensor) or \
            tuple(state["keys"].shape) != expected_keys or \
            not isinstance(state.get("kind"), str) or not _is_int(state.get("pos")) or \
            not 0 <= state["pos"] <= expected_keys[0] or \
            not _is_int(state.get("has_gauss")) or \
            not _is_number(state.get("cached_gaussian")):
        return f"numpy_rng is not a MT19937 state with {expected_keys[0]} keys"
    return None


def python_rng_problem(state: Any) -> str | None:
    if not isinstance(state, (list, tuple)) or len(state) != 3 or \
            not _is_int(state[0]) or not isinstance(state[1], (list, tuple)) or \
            not all(map(_is_int, state[1])) or \
            not (state[2] is None or _is_number(state[2])):
        return "python_rng is not a random.getstate() value"
    return None


def records_problem(records: Any, next_step: Any) -> str | None:
    """The records a state vouches for: JSON objects with increasing integer steps, all
    before `next_step`; what is wrong with them, or None."""
    if not isinstance(records, list):
        return "records is not a list"
    last_step = -1
    for line in records:
        try:
            step = json.loads(line)["step"]
        except (TypeError, ValueError, KeyError):
            return "a vouched record is not a JSON object with a step"
        if not _is_int(step) or step <= last_step:
            return "vouched records out of step order"
        last_step = step
    if next_step <= last_step:
        return f"next_step {next_step} is not after the last record's step {last_step}"
    return None


def checkpoint_steps_problem(records: Any, next_step: Any, n_steps: int,
                             checkpoint_freq: int) -> str | None:
    """Whether a state's place fits the run's schedule: `next_step` within the run's
    `n_steps`, right after a checkpoint, and its records exactly at the run's checkpoint
    steps before it (a state claiming step 10**15 would mark the run done with a few of
    its checkpoints). What is wrong, or None."""
    if next_step > n_steps:
        return f"next_step {next_step} is beyond the run's {n_steps} steps"
    last = n_steps - 1

    def is_checkpoint(step: int) -> Any:
        return step % checkpoint_freq == 0 or step == last
    expected_count = -(-next_step // checkpoint_freq) + \
        (next_step == n_steps and last % checkpoint_freq != 0)
    steps = [json.loads(line)["step"] for line in records]
    if next_step < 1 or not is_checkpoint(next_step - 1) or len(steps) != expected_count \
            or any(not is_checkpoint(step) for step in steps):
        return (f"its {len(steps)} records (steps {_steps_text(steps)}) are not the "
                f"{expected_count} checkpoints of this run's schedule before step "
                f"{next_step} (every {checkpoint_freq} steps of {n_steps})")
    return None


def _steps_text(steps: Any) -> Any:
    """"0, 2, 4" or, for many, "0, 2, 4, 6, ..., 98"."""
    if not steps:
        return "none"
    if len(steps) > 5:
        return ", ".join(map(str, steps[:4])) + f", ..., {steps[-1]}"
    return ", ".join(map(str, steps))


def non_finite_problem(state: Any) -> str | None:
    """The first weight (model or optimizer tensor) of a state that is NaN or infinite,
    or None: resuming from it would train garbage or stop at once."""
    tensors = [("algorithm", k, v) for k, v in state["algorithm"].items()]
    for name, optimizer in state["optimizers"].items():
        tensors += [(f"optimizer {name}", "state", v) for v in _tensors(optimizer)]
    for where, key, value in tensors:
        if isinstance(value, torch.Tensor) and (value.is_floating_point() or
                                                value.is_complex()) and \
                not bool(torch.isfinite(value).all()):
            return f"{where} tensor {key!r} holds NaN or infinite values"
    return None


def _tensors(value: Any) -> Iterator[Any]:
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from _tensors(item)
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from _tensors(item)


def load_resume_state(run_dir: Any, name: str, algorithm: Any, identity: Any, schedule: Any = None,
                      run_steps: Any = None, arithmetic: Any = None) -> Any:
    """The resume state `name` of `run_dir`, checked and loaded into `algorithm` (and
    the RNGs and `schedule`). `run_steps`: (n_steps, checkpoint_freq) of the run, which
    the state's place and records must fit; `arithmetic`: this run's (see
    training.arithmetic), which its records must have been computed in."""
    path = run_dir.join(name)
    state = _read_state(run_dir, name)
    if state["identity"] != identity:
        raise UserError(f"{run_dir.path} holds an unfinished run with other "
                        f"arguments; use another --output_dir, or {RESTART_HINT}")
    problem = non_finite_problem(state) or (
        checkpoint_steps_problem(state["records"], state["next_step"], *run_steps)
        if run_steps is not None else None)
    if problem:
        raise ResumeStateError(f"the resume state {path} does not fit this run "
                               f"({problem}); {RESTART_HINT}")
    problem = arithmetic and resume_problem(state["records"], arithmetic)
    if problem:
        raise UserError(f"{run_dir.path} holds an unfinished run that cannot be resumed "
                        f"here: {problem}; resume it as it started, or {RESTART_HINT}")
    try:
        algorithm.load_state_dict(state["algorithm"])
        for name, optimizer in optimizer_attributes(algorithm).items():
            if name in state["optimizers"]:
                optimizer.load_state_dict(state["optimizers"][name])
        torch.set_rng_state(state["torch_rng"])
        if state.get("cuda_rng") is not None and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(state["cuda_rng"])
        set_numpy_rng_state(state["numpy_rng"])
        set_python_rng_state(state["python_rng"])
        if schedule is not None and state.get("schedule") is not None:
            schedule.load_state_dict(state["schedule"])
    except (RuntimeError, ValueError, TypeError, KeyError, IndexError,
            OverflowError) as e:
        raise ResumeStateError(f"the resume state {path} does not fit this run "
                               f"({load_error_reason(e)}); {RESTART_HINT}") from None
    return state


def read_kept_records(run_dir: Any, name: str, vouched: Any, log: Callable[[str], Any]) -> Any:
    """The records a resumed run keeps: exactly those its state vouches for. When
    results.jsonl does not start with them (a foreign or torn line, an edit, not a
    regular file), it is moved aside to results.jsonl.prev[.N] and rewritten from the
    state, and the log says so. Lines after the vouched ones were written after the last
    state and are redone."""
    vouched = list(vouched)
    try:
        lines = [line for line in run_dir.read_bytes(name).decode("utf-8", "replace")
                 .splitlines() if line.strip()]
    except (FileNotFoundError, UserError):   # missing, or a symlink, FIFO, folder ...
        lines = []
    if lines[:len(vouched)] != vouched:
        aside = run_dir.move_aside(name)
        run_dir.write_text(name, "".join(line + "\n" for line in vouched), durable=True)
        where = f"; its old content is in {aside}" if aside else ""
        log(f"notice: {run_dir.join(name)} did not hold the {len(vouched)} records its "
            f"resume state vouches for; restored them from the state{where}")
    return vouched
