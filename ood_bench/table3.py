"""Table 3 of OoD-Bench: Colored MNIST with one training environment (rho_tr = 0.1) and a
test environment with colour-flip probability rho_te; the last row adds blue
(mu_tr = 0, mu_te = 1, sigma = 0.1), which turns the shift into diversity shift.

`run_table3` measures every row with `ood_bench.trials.run_trials` on the
`OoDBenchColoredMNIST` dataset and `format_table3` prints ours beside the paper's values.
"""
from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

from scipy.stats import spearmanr

from ood_bench.trials import TrialConfig, run_trials
from oodutils.tables import markdown_lines

#: Table 3 as printed (mean, standard error over 5 runs); EMD / MMD / NI are the paper's
#: baseline metrics, shown for reference only.
PAPER_TABLE3: list[dict[str, Any]] = [
    {"row": "0.9", "rho_te": 0.9, "blue": False, "dominant": "Cor",
     "EMD": (0.08, 0.01), "MMD": (0.01, 0.00), "NI": (1.40, 0.06),
     "diversity": (0.00, 0.00), "correlation": (0.67, 0.04)},
    {"row": "0.7", "rho_te": 0.7, "blue": False, "dominant": "Cor",
     "EMD": (0.07, 0.00), "MMD": (0.01, 0.00), "NI": (1.05, 0.03),
     "diversity": (0.00, 0.00), "correlation": (0.48, 0.06)},
    {"row": "0.5", "rho_te": 0.5, "blue": False, "dominant": "Cor",
     "EMD": (0.07, 0.00), "MMD": (0.00, 0.00), "NI": (0.72, 0.04),
     "diversity": (0.00, 0.00), "correlation": (0.34, 0.06)},
    {"row": "0.3", "rho_te": 0.3, "blue": False, "dominant": "Cor",
     "EMD": (0.06, 0.00), "MMD": (0.00, 0.00), "NI": (0.57, 0.04),
     "diversity": (0.00, 0.00), "correlation": (0.18, 0.05)},
    {"row": "0.1", "rho_te": 0.1, "blue": False, "dominant": "None",
     "EMD": (0.06, 0.00), "MMD": (0.00, 0.00), "NI": (0.39, 0.02),
     "diversity": (0.00, 0.00), "correlation": (0.00, 0.00)},
    {"row": "0.1+blue", "rho_te": 0.1, "blue": True, "dominant": "Div",
     "EMD": (0.29, 0.01), "MMD": (1.00, 0.00), "NI": (10.76, 0.43),
     "diversity": (0.93, 0.01), "correlation": (0.00, 0.00)},
]
RHO_TR = 0.1
BLUE = {"cmnist_mu_tr": 0.0, "cmnist_mu_te": 1.0, "cmnist_sigma_tr": 0.1,
        "cmnist_sigma_te": 0.1}

#: a reduced setting for CPU checks: a narrower MLP, fewer steps, a larger held-out part
#: (the held-out features are what the KDEs see; 5,000 offline digits leave few)
QUICK = {"steps": 300, "mlp_width": 128, "eval_every": 25, "holdout_fraction": 0.2,
         "sample_size": 5000}


def row_settings(row: Mapping[str, Any]) -> dict[str, Any]:
    settings = {"cmnist_rho_tr": RHO_TR, "cmnist_rho_te": row["rho_te"],
                "cmnist_blue": bool(row["blue"])}
    if row["blue"]:
        settings.update(BLUE)
    return settings


def run_table3(data_dir: str, n_trials: int = 5, seed: int = 0, output_dir: str | None = None,
               rows: Sequence[str] | None = None, iid_reference: bool = True, iid_row: str = "0.9",
               verbose: bool = False, **overrides: Any) -> dict[str, Any]:
    """{row name: summary} for the rows named in `rows` (all by default).

    With iid_reference, the i.i.d. calibration reference of row `iid_row` (its two
    environments pooled and split 50/50 at random, the environment classifier retrained,
    the official `force_iid`) is measured with the same seeds and returned under 'iid'."""
    selected = [r for r in PAPER_TABLE3 if rows is None or r["row"] in rows]
    out = {}
    for row in selected:
        cfg = TrialConfig(dataset="OoDBenchColoredMNIST", data_dir=data_dir, envs_p=[0],
                          envs_q=[1], dataset_settings=row_settings(row), **overrides)
        sub = os.path.join(output_dir, f"rho_te_{row['row']}") if output_dir else None
        want_iid = iid_reference and row["row"] == iid_row
        out[row["row"]] = run_trials(cfg, n_trials, seed, sub, iid_reference=want_iid,
                                     calibration_level="data", verbose=verbose)
        if want_iid:
            out["iid"] = dict(out[row["row"]]["iid"], row=row["row"])
    return out


def _pm(mean: float | None, se: float | None, digits: int = 2) -> str:
    if mean is None:
        return "n/a"
    return f"{mean:.{digits}f} ± {se:.{digits}f}"


def table3_rows(results: Mapping[str, Any], digits: int = 2) -> list[dict[str, Any]]:
    rows = []
    for paper in PAPER_TABLE3:
        ours = results.get(paper["row"])
        if ours is None:
            continue
        d, c = ours["diversity"], ours["correlation"]
        rows.append({
            "rho_te": paper["row"], "dominant (paper)": paper["dominant"],
            "div (ours)": _pm(d["mean"], d["se"], digits),
            "div (paper)": _pm(*paper["diversity"]),
            "cor (ours)": _pm(c["mean"], c["se"], digits),
            "cor (paper)": _pm(*paper["correlation"]),
            "n": d["n"]})
    return rows


def format_table3(results: Mapping[str, Any], digits: int = 2) -> str:
    """A markdown table: ours beside the paper's, one line per row of Table 3."""
    rows = table3_rows(results, digits)
    if not rows:
        return "(no rows)"
    cols = list(rows[0])
    lines = markdown_lines(cols, [[str(r[c]) for c in cols] for r in rows])
    if "iid" in results:
        iid = results["iid"]
        lines.append("")
        lines.append(f"i.i.d. reference ({iid['level']} level, row {iid.get('row', '?')}): div "
                     f"{_pm(iid['diversity']['mean'], iid['diversity']['se'], digits + 2)}, "
                     f"cor {_pm(iid['correlation']['mean'], iid['correlation']['se'], digits + 2)}")
    return "\n".join(lines)


def spearman_cor_vs_rho(results: Mapping[str, Any]) -> float | None:
    """Spearman correlation between rho_te and the mean correlation-shift estimate over the
    five red/green rows."""
    pairs = [(r["rho_te"], results[r["row"]]["correlation"]["mean"])
             for r in PAPER_TABLE3 if not r["blue"] and r["row"] in results]
    if len(pairs) < 3:
        return None
    rho, cor = zip(*pairs)
    return float(spearmanr(rho, cor).statistic)
