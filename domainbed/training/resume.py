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
import os
import random

import numpy as np
import torch

from oodutils import fileio
from oodutils.errors import UserError

RESUME_FILE = "resume_state.pt"
STATE_VERSION = 2
# Arguments that may differ between an interrupted run and its resumption.
# where and how a run is kept, not what it computes
NON_IDENTITY_ARGS = ("output_dir", "progress", "eval_batch_size", "num_threads", "restart",
                     "save_best_model", "metrics")
RESTART_HINT = ("rerun with --restart to discard it and start over (the old records are "
                "moved aside to results.jsonl.prev)")


class ResumeStateError(UserError):
    """resume_state.pt is unreadable, not ours, or does not fit the run."""


def args_identity(args_dict):
    kept = {k: v for k, v in args_dict.items() if k not in NON_IDENTITY_ARGS}
    return hashlib.md5(json.dumps(kept, sort_keys=True).encode()).hexdigest()


def optimizer_attributes(algorithm):
    return {name: value for name, value in vars(algorithm).items()
            if isinstance(value, torch.optim.Optimizer)}


def numpy_rng_state():
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    return {"kind": str(kind), "keys": torch.from_numpy(keys.astype(np.int64)),
            "pos": int(pos), "has_gauss": int(has_gauss), "cached_gaussian": float(cached)}


def set_numpy_rng_state(state):
    keys = state["keys"].numpy().astype(np.uint32)
    np.random.set_state((state["kind"], keys, state["pos"], state["has_gauss"],
                         state["cached_gaussian"]))


def python_rng_state():
    version, internal, gauss_next = random.getstate()
    return [int(version), list(internal), gauss_next]


def set_python_rng_state(state):
    version, internal, gauss_next = state
    random.setstate((version, tuple(internal), gauss_next))


def save_resume_state(path, algorithm, step, records, accumulators, identity):
    """`records`: the results.jsonl lines written so far (the state vouches for them)."""
    fileio.atomic_torch_save(path, {
        "version": STATE_VERSION, "next_step": step, "n_records": len(records),
        "records": list(records), "identity": identity,
        "algorithm": algorithm.state_dict(),
        "optimizers": {k: o.state_dict() for k, o in optimizer_attributes(algorithm).items()},
        "torch_rng": torch.get_rng_state(),
        "cuda_rng": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None,
        "numpy_rng": numpy_rng_state(), "python_rng": python_rng_state(),
        "accumulators": accumulators,
    }, durable=True)


def _read_state(path):
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # torn zip, EOF, a pickle asking for globals, ...
        reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ResumeStateError(f"cannot read the resume state {path} ({reason[:200]}); "
                               f"{RESTART_HINT}") from None
    needed = ("version", "next_step", "records", "identity", "algorithm", "optimizers",
              "torch_rng", "numpy_rng", "python_rng", "accumulators")
    if not isinstance(state, dict) or any(k not in state for k in needed) or \
            state["version"] != STATE_VERSION:
        raise ResumeStateError(f"the resume state {path} is not one this version wrote; "
                               f"{RESTART_HINT}")
    check_vouched_records(path, state["records"])
    return state


def check_vouched_records(path, records):
    """The records a state vouches for: JSON objects with increasing steps."""
    last_step = -1
    for line in records:
        try:
            record = json.loads(line)
            step = record["step"]
        except (TypeError, ValueError, KeyError):
            raise ResumeStateError(f"the resume state {path} holds a malformed record; "
                                   f"{RESTART_HINT}") from None
        if not isinstance(step, int) or step <= last_step:
            raise ResumeStateError(f"the resume state {path} holds records out of step "
                                   f"order; {RESTART_HINT}")
        last_step = step


def load_resume_state(path, algorithm, identity):
    state = _read_state(path)
    if state["identity"] != identity:
        raise UserError(f"{os.path.dirname(path)} holds an unfinished run with other "
                        f"arguments; use another --output_dir, or {RESTART_HINT}")
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
    except (RuntimeError, ValueError, TypeError, KeyError) as e:
        reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ResumeStateError(f"the resume state {path} does not fit this run "
                               f"({reason[:200]}); {RESTART_HINT}") from None
    return state


def read_kept_records(path, vouched, log):
    """The records a resumed run keeps: exactly those its state vouches for. When
    results.jsonl does not start with them (a foreign or torn line, an edit), it is moved
    aside to results.jsonl.prev and rewritten from the state, and the log says so.
    Lines after the vouched ones were written after the last state and are redone."""
    vouched = list(vouched)
    lines = []
    if os.path.exists(path):
        with open(path, encoding="utf-8", errors="replace") as f:
            lines = [line for line in f.read().splitlines() if line.strip()]
    if lines[:len(vouched)] != vouched:
        aside = fileio.atomic_move_aside(path)
        fileio.atomic_write_text(path, "".join(line + "\n" for line in vouched),
                                 durable=True)
        where = f"; its old content is in {aside}" if aside else ""
        log(f"notice: {path} did not hold the {len(vouched)} records its resume state "
            f"vouches for; restored them from the state{where}")
    return vouched
