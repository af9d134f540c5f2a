"""OODSelect (Salaudeen et al. 2025): OOD subsets on which ID and OOD accuracy are
anti-correlated, its baselines and report, and the `oodselect` command.

Modules: `selector` (the optimiser: `OODSelect`, `subset_correlation`), `config` (its
hyperparameters, without torch), `data` (correctness matrices from runs or files, model
splits), `baselines`, `report` (intervals, overlaps, composition, files, plots),
`protocol` (the whole protocol on one matrix, as the command runs it) and `cli`.

The names below load on first use (PEP 562), so that importing the package, as its
command does before it parses its flags, costs no torch."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from analysis.oodselect.config import LOSSES, PENALTY_FORMS, SEARCH_SPACE, Hparams
    from analysis.oodselect.protocol import make_split, run, run_selection, write_outputs
    from analysis.oodselect.selector import (
        PROBIT_EPS,
        BatchResult,
        OODSelect,
        optimize_batch,
        pearson,
        probit,
        subset_accuracy,
        subset_correlation,
        top_subset,
        topn_masks,
    )

_PROTOCOL = ("make_split", "run", "run_selection", "write_outputs")

__all__ = ["LOSSES", "PENALTY_FORMS", "PROBIT_EPS", "SEARCH_SPACE", "BatchResult", "Hparams",
           "OODSelect", "make_split", "optimize_batch", "pearson", "probit", "run",
           "run_selection", "subset_accuracy", "subset_correlation", "top_subset",
           "topn_masks", "write_outputs"]


def __getattr__(name: str) -> Any:
    """The module holding `name`, imported on first use (the protocol imports the
    selector, so one import serves both)."""
    if name not in __all__:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from analysis.oodselect import protocol, selector
    return getattr(protocol if name in _PROTOCOL else selector, name)
