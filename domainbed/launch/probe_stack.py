"""Linear probes of a fused group trained as one probe stack
(domainbed.training.probe_stack.ProbeStack): which jobs can join one, and the group's
step loop with its checkpoints (every head's evaluation in one pass, then each member's
record and predictions)."""
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from domainbed.launch.fused_training import accumulate_step
from domainbed.training.probe_stack import STACKABLE_ALGORITHMS, ProbeStack

HEAD_HPARAMS = ("lr", "weight_decay", "batch_size")   # beside the seed: each head's own
MAX_HEADS = 1024
CHECKPOINT_THREADS = 4  # members writing their checkpoint files at once


def why_not_job(config: Any, hparams: dict[str, Any]) -> str | None:
    """Why a linear-probe job (its RunConfig and hyperparameters) cannot join a probe
    stack, or None (what the fused launcher knows before building anything)."""
    if config.algorithm not in STACKABLE_ALGORITHMS:
        return (f"linear probes stack for {', '.join(STACKABLE_ALGORITHMS)} only, not "
                f"{config.algorithm}")
    if not hparams.get("pretrained"):
        return "a linear probe on a randomly initialized backbone has features of its own seed"
    if config.feature_cache_dir == "none":
        return "a linear probe without the feature cache computes features every step"
    if hparams.get("nonlinear_classifier") or hparams.get("resnet_dropout"):
        return "a linear probe with a nonlinear head or dropout does not stack"
    if config.precision != "fp32":
        return "stacked linear probes train in float32"
    return None


def train_probe_group(members: Any, start_step: int, on_checkpoint: Callable[..., Any],
                      on_failure: Callable[..., Any]) -> Any:
    """Train `members` (all at `start_step`) to the end as one stack; the same callbacks
    as fused_training.train_group. Returns the members that finished."""
    for member in members:
        member.saves_resume_state = False
    stack = ProbeStack(sorted(members, key=lambda m: m.hparams["batch_size"]))
    first = members[0]
    for step in range(start_step, first.n_steps):
        started = time.time()
        losses = stack.train_step(step)
        seconds = (time.time() - started) / len(stack.members)
        if not accumulate_step(stack, step, [{"loss": loss} for loss in losses], seconds,
                               on_failure):
            return []
        if first.is_checkpoint(step):
            failed = _checkpoint(stack, step, on_checkpoint, on_failure)
            if failed:
                stack.drop(failed)
    stack.write_back()
    return stack.members


def _checkpoint(stack: Any, step: int, on_checkpoint: Callable[..., Any],
                on_failure: Callable[..., Any]) -> Any:
    """Every head's evaluation in one pass, then each member's record and predictions,
    CHECKPOINT_THREADS members at a time (compressing predictions and waiting for fsync
    leave the interpreter free); the callbacks run here, in order. Returns the positions
    of the members that failed."""
    stack.write_back()   # what a kept model (save_best_model ...) would hold
    logits = stack.predict()

    def write(position: Any) -> tuple[Any, ...]:
        try:
            return stack.members[position].checkpoint(
                step, {k: v[position] for k, v in logits.items()}), None
        except Exception as e:   # this member alone
            return None, e

    with ThreadPoolExecutor(CHECKPOINT_THREADS) as pool:
        outcomes = list(pool.map(write, range(len(stack.members))))
    failed = []
    for i, (member, (results, error)) in enumerate(zip(stack.members, outcomes)):
        try:
            if error is not None:
                raise error
            on_checkpoint(member, results)
        except Exception as e:
            on_failure(member, e)
            failed.append(i)
    return failed
