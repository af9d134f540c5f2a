"""OODSelect's optimiser configuration: the penalty forms, losses, the paper's search space
and one configuration of the five searched hyperparameters. A module without torch, so the
`oodselect` command builds its parser (and answers --help) before importing torch."""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

PENALTY_FORMS = ("softplus", "squared")
LOSSES = ("r", "r2")
BASELINES = ("random", "hard", "greedy", "exhaustive")

# The paper's Optuna search space (notes_001 section 2.1).
SEARCH_SPACE = {
    "lr": ("log", 1e-2, 1e2),
    "eta_min": ("log", 1e-3, 1.0),
    "t_max": ("int", 10, 200),
    "penalty": ("float", 0.1, 100.0),
    "anneal_iters": ("int", 10, 1000),
}


@dataclass
class Hparams:
    """One configuration of the optimiser (the five searched hyperparameters)."""
    lr: float = 0.1
    eta_min: float = 0.001
    t_max: int = 200
    penalty: float = 10.0
    anneal_iters: int = 200

    def as_dict(self) -> dict[str, Any]:
        """The hyperparameters by name."""
        return asdict(self)
