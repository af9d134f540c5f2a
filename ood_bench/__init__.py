"""OoD-Bench (Ye et al., CVPR 2022): diversity and correlation shift of a dataset.

    features -> estimate_shifts(z_p, y_p, z_q, y_q)  (Algorithm 2)   ood_bench.estimator
    data -> environment classifier -> features       (Algorithm 1)   ood_bench.classifier
    trials, summaries, i.i.d. calibration                            ood_bench.trials
    CLI: python -m ood_bench {extract,quantify,run,calibrate,summarize,table3,heatmap,plot}
         python -m ood_bench.quantify --features FILE.npz --seed S --output result.json
"""
from __future__ import annotations

import importlib
from typing import Any

_HOMES = {"ShiftDensities": "estimator", "ShiftEstimationError": "estimator",
          "ShiftEstimator": "estimator", "estimate_shifts": "estimator",
          "iid_split": "estimator", "GaussianKDE": "kde"}


def __getattr__(name: str) -> Any:
    """The public names, imported when first used: `ood-bench --help` answers before torch."""
    if name in _HOMES:
        return getattr(importlib.import_module(f"ood_bench.{_HOMES[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["GaussianKDE", "ShiftDensities", "ShiftEstimationError", "ShiftEstimator",
           "estimate_shifts", "iid_split"]
