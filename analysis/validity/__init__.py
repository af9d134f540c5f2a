"""Benchmark validity (Bell et al. 2024): ERM failure, discriminative power, convergent
validity and the Bayes factor K of spurious-correlation benchmarks, method recommendation,
and the `benchmark-validity` command.

Modules: `stats` (the desiderata on arrays and tables), `records` (run directories into
those inputs), `config` (thresholds, strategies, split codes; without pandas or scipy),
`commands` (the subcommands' work) and `cli`.

The names below load on first use (PEP 562), so that importing the package, as its
command does before it parses its flags, costs no pandas or scipy."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from analysis.validity.commands import run
    from analysis.validity.stats import (
        DEFAULT_THRESHOLDS,
        STRATEGIES,
        KResult,
        Recommendation,
        agreement_matrix,
        attributes_from_groups,
        bayes_factor_k,
        best_methods,
        check_accuracies,
        closest_benchmarks,
        convergent_validity,
        discriminative_power,
        erm_failure,
        group_inverse_weights,
        leave_one_out,
        log_likelihood,
        method_robustness,
        mutual_information,
        per_group_accuracy,
        recommend_method,
        strategy_win_counts,
        validity_table,
        worst_group_accuracy,
    )

__all__ = [
    "DEFAULT_THRESHOLDS", "STRATEGIES", "check_accuracies", "per_group_accuracy",
    "worst_group_accuracy", "erm_failure", "discriminative_power", "log_likelihood",
    "group_inverse_weights", "KResult", "bayes_factor_k", "mutual_information",
    "attributes_from_groups", "agreement_matrix", "convergent_validity", "method_robustness",
    "best_methods", "validity_table", "closest_benchmarks", "Recommendation",
    "recommend_method", "leave_one_out", "strategy_win_counts", "run",
]


def __getattr__(name: str) -> Any:
    """The module holding `name`, imported on first use (the subcommands import the
    statistics, so one import serves both)."""
    if name not in __all__:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from analysis.validity import commands, stats
    return getattr(commands if name == "run" else stats, name)
