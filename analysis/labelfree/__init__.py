"""Label-free OOD accuracy: each model's OOD accuracy estimated without OOD labels from a
sweep's saved logits (average confidence, DoC, ATC, ALine-S), where the agreement line says
it can be trusted, and the `labelfree` command.

Modules: `estimators` (the estimators and the verdicts), `report` (the command's files,
plots and tables) and `cli`.

The names below load on first use (PEP 562), so that importing the package, as its
command does before it parses its flags, costs no pandas or scipy."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from analysis.labelfree.estimators import (
        AGREEMENT_R_ON_THE_LINE,
        METHODS,
        AgreementLine,
        Checkpoint,
        agreement_line,
        atc_estimate,
        atc_threshold,
        checkpoints_from_sweep,
        doc_estimate,
        estimate,
        max_confidence,
        negative_entropy,
        single_model_estimates,
        softmax,
        summary,
        verdicts,
    )
    from analysis.labelfree.report import plot_split, run

_REPORT = ("plot_split", "run")

__all__ = ["AGREEMENT_R_ON_THE_LINE", "METHODS", "AgreementLine", "Checkpoint",
           "agreement_line", "atc_estimate", "atc_threshold", "checkpoints_from_sweep",
           "doc_estimate", "estimate", "max_confidence", "negative_entropy", "plot_split",
           "run", "single_model_estimates", "softmax", "summary", "verdicts"]


def __getattr__(name: str) -> Any:
    """The module holding `name`, imported on first use (the report imports the
    estimators, so one import serves both)."""
    if name not in __all__:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from analysis.labelfree import estimators, report
    return getattr(report if name in _REPORT else estimators, name)
