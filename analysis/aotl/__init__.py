"""Accuracy on the line (Salaudeen et al. 2025): probit fits of OOD against ID accuracy per
leave-one-domain-out split, and the `aotl` and `aotl-study` commands.

Modules: `tables` (the fit tables, plots and the command's work), `stats` (one fit, its
bootstrap and verdict), `inputs` (accuracies from records or CSV files), `options` (the
command's light parser), `study` (a zoo trained and analysed in one call), `cli` and
`study_cli` (the commands).

The names below load on first use (PEP 562), so that importing the package, as its
commands do before they parse their flags, costs no numpy, pandas or scipy."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from analysis.aotl.study import analyse, run_study
    from analysis.aotl.tables import (
        SCALES,
        VERDICTS,
        bootstrap_r,
        changepoint_table,
        changepoints,
        classifier_count,
        classifier_count_table,
        classify,
        effective_robustness_table,
        fit_line,
        group_table,
        inverse_transform,
        load_accuracies,
        logit,
        pairwise_table,
        per_ood_table,
        plot_split,
        probit,
        read_accuracy_csvs,
        regime_table,
        run,
        transform,
    )

_STUDY = ("analyse", "run_study")   # these train models: torch loads with them

__all__ = ["SCALES", "VERDICTS", "analyse", "bootstrap_r", "changepoint_table", "changepoints",
           "classifier_count", "classifier_count_table", "classify",
           "effective_robustness_table", "fit_line", "group_table", "inverse_transform",
           "load_accuracies", "logit", "pairwise_table", "per_ood_table", "plot_split",
           "probit", "read_accuracy_csvs", "regime_table", "run", "run_study", "transform"]


def __getattr__(name: str) -> Any:
    """The module holding `name`, imported on first use."""
    if name in _STUDY:
        from analysis.aotl import study
        return getattr(study, name)
    if name in __all__:
        from analysis.aotl import tables
        return getattr(tables, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
