"""Early stopping on a record key (`--early_stopping METRIC --patience N`).

A run evaluates every checkpoint_freq steps; each checkpoint either improves the best
value of METRIC seen so far (strictly) or does not, and the run stops after the
checkpoint that makes N checkpoints in a row without improvement. That checkpoint's
record says so (`early_stopping_step`: its step, `early_stopping_best_step`: the step of
the best checkpoint), then the run finishes as usual (model.pkl of the last step,
`done`). The decision is a pure function of the records, so a resumed run replays them
and stops exactly where an uninterrupted one would.

METRIC is a record key (`env0_out_acc`, `env1_out_nll`, `loss`, ...) or `val_<metric>`:
the mean of `env{i}_out_<metric>` over the training environments (`val_acc` is the
training-domain validation accuracy). Losses and calibration errors (nll, ece, brier,
names ending in loss) are minimized, everything else maximized; `min:` or `max:` before
the name says which explicitly.
"""
import math
from typing import Any

from oodutils.errors import UserError

DEFAULT_PATIENCE = 5
MINIMIZED_SUFFIXES = ("loss", "nll", "ece", "brier")
STOP_STEP_KEY = "early_stopping_step"
BEST_STEP_KEY = "early_stopping_best_step"


def parse_metric(spec: Any) -> tuple[Any, ...]:
    """(record key or val_ name, True to maximize) from METRIC, or a UserError."""
    direction, _, name = spec.rpartition(":")
    if direction not in ("", "min", "max") or not name:
        raise UserError(f"--early_stopping {spec!r}: expected a record key such as "
                        f"val_acc or env0_out_acc, optionally prefixed min: or max:")
    if not direction:
        direction = "min" if name.endswith(MINIMIZED_SUFFIXES) else "max"
    return name, direction == "max"


def check_options(metric: Any, patience: Any) -> None:
    """--early_stopping METRIC and --patience N as the train and sweep commands take them."""
    if patience is not None and metric is None:
        raise UserError("--patience needs --early_stopping METRIC")
    if patience is not None and patience < 1:
        raise UserError(f"--patience must be at least 1, got {patience}")
    if metric is not None:
        parse_metric(metric)


class EarlyStopping:
    """Watches one metric over a run's checkpoints; `observe(record)` says when to stop."""

    def __init__(self, spec: Any, patience: Any, train_envs: Any) -> None:
        self.spec = spec
        self.name, self.maximize = parse_metric(spec)
        self.patience, self.train_envs = patience, list(train_envs)
        self.best: float | None
        self.best, self.best_step, self.waited = None, None, 0

    def value(self, record: Any) -> float:
        """The metric in one checkpoint's record, or a UserError naming the keys there."""
        if self.name in record:
            value = record[self.name]
        elif self.name.startswith("val_"):
            keys = [f"env{i}_out_{self.name[4:]}" for i in self.train_envs]
            if not all(k in record for k in keys):
                value = None
            else:
                value = sum(float(record[k]) for k in keys) / len(keys)
        else:
            value = None
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            numeric = sorted(k for k, v in record.items()
                             if isinstance(v, (int, float)) and not isinstance(v, bool))
            raise UserError(f"--early_stopping {self.spec!r}: the records have no numeric "
                            f"key {self.name!r}; they have {', '.join(numeric)} (and "
                            f"val_<metric> for the training environments' out splits)")
        return float(value)

    def observe(self, record: Any) -> bool:
        """True when this checkpoint is the one to stop at."""
        value = self.value(record)
        better = self.best is None or (value > self.best if self.maximize
                                       else value < self.best)
        if better and not math.isnan(value):
            self.best, self.best_step, self.waited = value, record["step"], 0
            return False
        self.waited += 1
        return self.waited >= self.patience

    def mark(self, record: Any) -> None:
        """Write the stopping keys into the record of the checkpoint it stops at."""
        record[STOP_STEP_KEY] = record["step"]
        record[BEST_STEP_KEY] = self.best_step

    def replay(self, records: Any) -> Any:
        """Observe the records of a resumed run; True if it had already stopped."""
        stopped = False
        for record in records:
            stopped = self.observe(record)
        return stopped
