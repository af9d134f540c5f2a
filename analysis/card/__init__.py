"""Benchmark cards: one page per dataset of what a set of sweeps says about the benchmark
itself (accuracy on the line, effective robustness, validity, OoD-Bench's shifts,
OODSelect's worst subsets, label-free estimation, rank stability), and the
`benchmark-card` command.

Modules: `build` (a card from records and the analyses' outputs, its markdown) and `cli`.

The names below load on first use (PEP 562), so that importing the package, as its
command does before it parses its flags, costs no pandas or scipy."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from analysis.card.build import (
        LABELFREE_NEEDS,
        OOD_BENCH_NEEDS,
        OODSELECT_NEEDS,
        RANK_METHOD,
        WORST_SUBSETS,
        CardInputs,
        Section,
        aotl_section,
        build_card,
        effective_robustness_section,
        labelfree_by_dataset,
        labelfree_section,
        ood_bench_section,
        oodselect_section,
        rank_section,
        read_ood_bench_summaries,
        render_markdown,
        validity_section,
    )

__all__ = ["LABELFREE_NEEDS", "OOD_BENCH_NEEDS", "OODSELECT_NEEDS", "RANK_METHOD",
           "WORST_SUBSETS", "CardInputs", "Section", "aotl_section", "build_card",
           "effective_robustness_section", "labelfree_by_dataset", "labelfree_section",
           "ood_bench_section", "oodselect_section", "rank_section",
           "read_ood_bench_summaries", "render_markdown", "validity_section"]


def __getattr__(name: str) -> Any:
    """`name` from `analysis.card.build`, imported on first use."""
    if name not in __all__:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from analysis.card import build
    return getattr(build, name)
