"""Checks of a split: the background-class correlations of the paper's Eq. 1 (O2O) and
Eq. 2 (M2M), class balance, and counts.

corr(1(S=s), 1(Y=c)) is the Pearson correlation of the two indicators over the
examples of an environment (the phi coefficient of their 2 x 2 table); NaN where one
indicator is constant there (e.g. a background absent from the environment).
"""
from __future__ import annotations

import math
from collections.abc import Collection, Mapping
from typing import Any

from spawrious.constants import CLASS_LIST, LOCATIONS
from spawrious.splits import ENVIRONMENTS, M2M_CLASS_GROUPS, Split

TRAIN_ENVS = ENVIRONMENTS[1:]


def indicator_corr(n11: float, n1_: float, n_1: float, n: float) -> float:
    """Pearson correlation of two 0/1 variables from n11 = #(both), n1_ = #(A), n_1 = #(B)."""
    denom = n1_ * (n - n1_) * n_1 * (n - n_1)
    if n == 0 or denom == 0:
        return float("nan")
    return (n * n11 - n1_ * n_1) / math.sqrt(denom)


def _env_counts(counts: Mapping[tuple[str, str, str], int],
                envs: Collection[str]) -> dict[tuple[str, str], int]:
    table: dict[tuple[str, str], int] = {}
    for (env, breed, loc), k in counts.items():
        if env in envs:
            table[(breed, loc)] = table.get((breed, loc), 0) + k
    return table


def correlations(counts: Mapping[tuple[str, str, str], int],
                 envs: Collection[str]) -> dict[tuple[str, str], float]:
    """{(location, breed): corr} over the union of `envs` (a tuple of env names)."""
    table = _env_counts(counts, envs)
    n = sum(table.values())
    by_loc = {loc: sum(k for (b, l), k in table.items() if l == loc) for loc in LOCATIONS}
    by_cls = {c: sum(k for (b, l), k in table.items() if b == c) for c in CLASS_LIST}
    return {(loc, c): indicator_corr(table.get((c, loc), 0), by_loc[loc], by_cls[c], n)
            for loc in LOCATIONS for c in CLASS_LIST}


def group_corr(counts: Mapping[tuple[str, str, str], int], envs: Collection[str],
               locations: Collection[str], classes: Collection[str]) -> float:
    """corr(1(S in locations), 1(Y in classes)) over the union of `envs`."""
    table = _env_counts(counts, envs)
    n = sum(table.values())
    a = sum(k for (b, l), k in table.items() if l in locations)
    c = sum(k for (b, l), k in table.items() if b in classes)
    both = sum(k for (b, l), k in table.items() if l in locations and b in classes)
    return indicator_corr(both, a, c, n)


def validate_counts(split: Split,
                    counts: Mapping[tuple[str, str, str], int]) -> tuple[dict[str, Any], list[str]]:
    """(report dict, list of failure messages) for one split's {(env, breed, loc): count}."""
    failures = []
    n = split.per_cell
    report: dict[str, Any] = {"benchmark": split.benchmark, "variant": split.variant, "per_cell": n,
              "env_sizes": {}, "class_counts": {}, "corr": {}}
    for env in ENVIRONMENTS:
        per_class = {c: sum(k for (e, b, _), k in counts.items() if e == env and b == c)
                     for c in CLASS_LIST}
        report["class_counts"][env] = per_class
        report["env_sizes"][env] = sum(per_class.values())
        if len(set(per_class.values())) != 1:
            failures.append(f"{env}: classes are not balanced: {per_class}")
        expected = (2 if env == "Test" else 1) * n
        wrong = {c: k for c, k in per_class.items() if k != expected}
        if wrong:
            failures.append(f"{env}: expected {expected} images per class, got {wrong}")
        report["corr"][env] = correlations(counts, (env,))
    expected_counts = split.counts()
    if counts != expected_counts:
        diff = sorted(set(counts.items()) ^ set(expected_counts.items()))[:4]
        failures.append(f"counts differ from the definition of {split.benchmark}: {diff}")
    report["corr"]["train"] = correlations(counts, TRAIN_ENVS)
    if split.kind == "o2o":
        failures += _check_eq1(split, counts, report)
    else:
        failures += _check_eq2(split, counts, report)
    return report, failures


def _check_eq1(split: Split, counts: Mapping[tuple[str, str, str], int],
               report: dict[str, Any]) -> list[str]:
    """Eq. 1: corr_train(1(S=K_i), 1(Y=C_j)) > 0 and corr_test(...) < 0 for some (i, j);
    each class positively tied to its own background in both training environments and,
    at test time, on a background it was not paired with."""
    failures, pairs = [], []
    own = {s.breed: s.location for s in split.selections if s.role == "spurious"}
    for c in CLASS_LIST:
        for env in TRAIN_ENVS:
            r = report["corr"][env][(own[c], c)]
            if not r > 0:
                failures.append(f"Eq. 1: corr_{env}({own[c]}, {c}) = {r:.3f}, expected > 0")
        tested_on = sorted(loc for (e, b, loc), k in counts.items() if e == "Test" and b == c and k)
        for loc in tested_on:
            r_train = report["corr"]["train"][(loc, c)]
            if r_train > 0:
                failures.append(f"{c} is tested on {loc}, a background it was paired with in "
                                f"training (corr {r_train:.3f})")
    for (loc, c), r in report["corr"]["train"].items():
        r_test = report["corr"]["Test"][(loc, c)]
        if r > 0 and r_test < 0:
            pairs.append((loc, c))
    report["eq1_pairs"] = pairs
    if not pairs:
        failures.append("Eq. 1: no (background, class) pair with corr_train > 0 and corr_test < 0")
    return failures


def _check_eq2(split: Split, counts: Mapping[tuple[str, str, str], int],
               report: dict[str, Any]) -> list[str]:
    """Eq. 2: with background groups B_k = training backgrounds of class group C_k,
    corr(1(S in B_k), 1(Y in C_k)) = 1 in every training environment and -1 at test."""
    failures = []
    groups = []
    for classes in M2M_CLASS_GROUPS:
        found = {loc for (e, b, loc), k in counts.items() if e in TRAIN_ENVS and b in classes and k}
        groups.append((tuple(sorted(found)), classes))
    if set(groups[0][0]) & set(groups[1][0]):
        failures.append(f"M2M background groups overlap: {groups[0][0]} vs {groups[1][0]}")
    for env in TRAIN_ENVS:
        for c in CLASS_LIST:
            env_locs = [loc for (e, b, loc), k in counts.items() if e == env and b == c and k]
            if len(env_locs) != 1:
                failures.append(f"M2M: {c} should have exactly one background in {env}, has "
                                f"{env_locs}")
    report["eq2"] = {}
    for locs, classes in groups:
        key = f"{'+'.join(locs)} ~ {'+'.join(classes)}"
        values = {env: group_corr(counts, (env,), locs, classes) for env in ENVIRONMENTS}
        values["train"] = group_corr(counts, TRAIN_ENVS, locs, classes)
        report["eq2"][key] = values
        for env in TRAIN_ENVS + ("train",):
            if not math.isclose(values[env], 1.0, abs_tol=1e-9):
                failures.append(f"Eq. 2: corr_{env}({key}) = {values[env]:.3f}, expected 1")
        if not math.isclose(values["Test"], -1.0, abs_tol=1e-9):
            failures.append(f"Eq. 2: corr_test({key}) = {values['Test']:.3f}, expected -1")
    return failures


def format_report(report: Mapping[str, Any]) -> str:
    lines = [f"{report['benchmark']} ({report['variant']}), per cell {report['per_cell']}: "
             + ", ".join(f"{e} {n}" for e, n in report["env_sizes"].items())]
    for env in ENVIRONMENTS + ("train",):
        corr = report["corr"][env]
        lines.append(f"corr(1(S=location), 1(Y=class)) in {env}:")
        lines.append("  " + "location".ljust(10) + "".join(c.rjust(11) for c in CLASS_LIST))
        for loc in LOCATIONS:
            vals = [corr[(loc, c)] for c in CLASS_LIST]
            lines.append("  " + loc.ljust(10) + "".join(
                ("nan" if math.isnan(v) else f"{v:+.3f}").rjust(11) for v in vals))
    if "eq1_pairs" in report:
        lines.append("Eq. 1 pairs (corr_train > 0, corr_test < 0): "
                     + ", ".join(f"{loc}/{c}" for loc, c in report["eq1_pairs"]))
    for key, values in report.get("eq2", {}).items():
        lines.append(f"Eq. 2 {key}: " + ", ".join(f"{e} {v:+.3f}" for e, v in values.items()))
    return "\n".join(lines)
