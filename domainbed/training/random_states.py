"""One run's own position in the global random generators (torch CPU and CUDA, numpy,
python's `random`).

A single run draws its dropout masks (and whatever an algorithm draws) from the global
generators, seeded by its training seed and saved in its resume state. Runs sharing one
process (a fused group) each keep a `RandomStates` and swap it in around their own work,
so every run draws exactly what it would draw alone, whatever else shares the process.
"""
import random
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import torch


class RandomStates:
    """A snapshot of the global generators; `active()` makes it current for a while."""

    def __init__(self, torch_state: Any, cuda_states: Any, numpy_state: Any,
                 python_state: Any) -> None:
        self.torch_state, self.cuda_states = torch_state, cuda_states
        self.numpy_state, self.python_state = numpy_state, python_state

    @classmethod
    def capture(cls) -> Any:
        """The global generators' states now."""
        cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None
        return cls(torch.get_rng_state(), cuda, np.random.get_state(), random.getstate())

    def restore(self) -> None:
        """Make this snapshot the global generators' state."""
        torch.set_rng_state(self.torch_state)
        if self.cuda_states is not None:
            torch.cuda.set_rng_state_all(self.cuda_states)
        np.random.set_state(self.numpy_state)
        random.setstate(self.python_state)

    @contextmanager
    def active(self) -> Iterator[Any]:
        """Inside: the global generators are this run's; after: this snapshot holds what
        the run drew, and the generators are back where they were."""
        outside = RandomStates.capture()
        self.restore()
        try:
            yield self
        finally:
            now = RandomStates.capture()
            self.torch_state, self.cuda_states = now.torch_state, now.cuda_states
            self.numpy_state, self.python_state = now.numpy_state, now.python_state
            outside.restore()

    def __eq__(self, other: Any) -> Any:
        if not isinstance(other, RandomStates):
            return NotImplemented
        cuda_equal = (self.cuda_states is None) == (other.cuda_states is None) and (
            self.cuda_states is None or all(
                torch.equal(a, b) for a, b in zip(self.cuda_states, other.cuda_states)))
        return (torch.equal(self.torch_state, other.torch_state) and cuda_equal and
                _numpy_equal(self.numpy_state, other.numpy_state) and
                self.python_state == other.python_state)


def _numpy_equal(a: Any, b: Any) -> Any:
    return a[0] == b[0] and np.array_equal(a[1], b[1]) and tuple(a[2:]) == tuple(b[2:])
