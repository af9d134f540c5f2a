"""The run's learning-rate schedule, applied to every optimizer an algorithm steps.

Algorithms build several optimizers (DANN's generator and discriminator), rebuild them
(IRM when its penalty annealing ends) or make short-lived ones (MLDG's inner loop), and
the training loop cannot know them all in advance. So the schedule runs once, on a
reference optimizer whose rate is 1 (torch's own lr_scheduler classes, built by
`make_schedule`), and before any optimizer steps during an update each of its parameter
groups gets its initial rate times the reference's current rate (every schedule here
multiplies the initial rate by a factor). Gradient clipping (`max_grad_norm`) happens at
the same moment. A constant schedule without clipping installs nothing: DomainBed's
numerics are untouched.
"""
import contextlib
import warnings
from collections.abc import Iterator
from typing import Any

import torch
from torch.optim.optimizer import register_optimizer_step_pre_hook

from domainbed.algorithms.optimization import is_constant_schedule, make_schedule


class RunSchedule:
    """The learning-rate factor of each step of a run of `n_steps` optimizer steps."""

    def __init__(self, hparams: dict[str, Any], n_steps: int) -> None:
        self.reference = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1.0)
        self.scheduler = make_schedule(self.reference, hparams, n_steps)
        self.max_grad_norm = float(hparams.get("max_grad_norm", 0.0))
        self.active = not is_constant_schedule(hparams) or self.max_grad_norm > 0

    @property
    def factor(self) -> Any:
        """The current rate as a fraction of each optimizer's initial rate."""
        return self.scheduler.get_last_lr()[0]

    @contextlib.contextmanager
    def applied(self) -> Iterator[Any]:
        """While an update runs: every optimizer step uses the scheduled rate."""
        if not self.active:
            yield
            return
        handle = register_optimizer_step_pre_hook(self._before_step)
        try:
            yield
        finally:
            handle.remove()

    def _before_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if optimizer is self.reference:
            return
        factor = self.factor
        for group in optimizer.param_groups:
            group.setdefault("initial_lr", group["lr"])
            group["lr"] = group["initial_lr"] * factor
        if self.max_grad_norm > 0:
            params = [p for group in optimizer.param_groups for p in group["params"]
                      if p.grad is not None]
            torch.nn.utils.clip_grad_norm_(params, self.max_grad_norm)

    def step(self) -> None:
        """After each training step (one optimizer step of the schedule)."""
        if not self.active:
            return
        with warnings.catch_warnings():   # the reference has no gradients to step
            warnings.simplefilter("ignore", UserWarning)
            self.reference.step()
            self.scheduler.step()

    def state_dict(self) -> Any:
        return self.scheduler.state_dict()

    def load_state_dict(self, state: Any) -> None:
        """The scheduler's position, and the reference's current rate, which chainable
        schedulers (cosine) step from."""
        self.scheduler.load_state_dict(state)
        for group in self.reference.param_groups:
            group["lr"] = self.factor
