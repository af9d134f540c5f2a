"""Algorithm 2's default settings (Ye et al. 2022, OoD-Bench): importance sample size M,
the thresholds eps_div and eps_cor, and the KDE bandwidth rule with its parser. A module
without torch, so the `ood-bench` command builds its parser and checks its options (and
answers --help) before importing torch."""
from __future__ import annotations

from typing import Any

DEFAULTS: dict[str, Any] = {"sample_size": 10000, "eps_div": 1e-12, "eps_cor": 5e-4,
                            "bw_method": "scott"}


def parse_bandwidth(text: str | float | None) -> str | float | None:
    """'scott' | 'silverman' | a positive number (the factor scipy calls bw_method)."""
    if text is None or str(text).lower() in ("scott", "silverman"):
        return None if text is None else str(text).lower()
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"bandwidth must be scott, silverman or a positive number, "
                         f"not {text!r}") from None
    if not value > 0:
        raise ValueError(f"bandwidth factor must be positive, not {value}")
    return value
