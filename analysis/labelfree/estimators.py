"""OOD accuracy without OOD labels, from a model zoo's saved logits.

Four estimators, each fitted on the in-distribution validation split (the training
environments' `out` splits) and applied to a test environment's examples:

- **Average confidence** (AC): the mean max-softmax probability on the OOD examples.
- **DoC** (Guillory et al. 2021, "Predicting with Confidence on Unseen Distributions"):
  the ID validation accuracy minus the drop in average confidence from ID to OOD.
- **ATC** (Garg et al. 2022, "Leveraging Unlabeled Data to Predict Out-of-Distribution
  Performance"): a threshold t on a confidence score such that the fraction of ID
  validation examples scoring below t equals the ID validation error; the estimate is
  the fraction of OOD examples scoring at or above t. Two scores: max-softmax (`atc_mc`)
  and negative entropy (`atc_ne`).
- **Agreement on the line** (Baek et al. 2022, "Agreement-on-the-Line: Predicting the
  Performance of Neural Networks under Distribution Shift"): for every pair of models of
  a split, the fraction of examples on which they agree, ID and OOD; a line fitted to
  probit(OOD agreement) against probit(ID agreement) is applied to each model's ID
  accuracy (ALine-S). Agreement needs no labels, so whether agreement is on the line
  (R of that fit) is checkable where accuracy is not: when it is (R >= 0.95), the paper
  finds accuracy on the line with the same slope and bias, and the estimates can be
  trusted; when it is not, they cannot.

`estimate(zoo)` gives one row per (run, step, OOD environment, method) with the estimate
and the true accuracy (for evaluation); `summary` the mean absolute error per method and
environment; `verdicts` whether label-free estimation can be trusted per split.
"""
from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import reduce
from typing import Any

import numpy as np
import pandas as pd
from scipy.stats import linregress, norm

from domainbed.predictions import list_prediction_steps, load_predictions
from domainbed.results.records import TABLE_FIELDS, load_records
from oodutils.accuracy import AOTL_CLIP, probit
from oodutils.errors import UserError

METHODS = ("avg_conf", "doc", "atc_mc", "atc_ne", "aline_s")
AGREEMENT_R_ON_THE_LINE = 0.95
SPLIT_OUT = 1   # the predictions' split code of `out` (0 = in, 1 = out, 2 = uda)


@dataclass
class Checkpoint:
    """One checkpoint's logits, split into the ID validation and one OOD environment."""
    run: str
    step: int
    dataset: str
    env: int
    id_ids: np.ndarray
    id_logits: np.ndarray
    id_labels: np.ndarray
    ood_ids: np.ndarray
    ood_logits: np.ndarray
    ood_labels: np.ndarray


def softmax(logits: np.ndarray) -> np.ndarray:
    z = logits.astype(np.float64)
    z -= z.max(axis=1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=1, keepdims=True)


def max_confidence(logits: np.ndarray) -> np.ndarray:
    return softmax(logits).max(axis=1)


def negative_entropy(logits: np.ndarray) -> np.ndarray:
    p = softmax(logits)
    return (p * np.log(np.clip(p, 1e-300, None))).sum(axis=1)


def atc_threshold(id_scores: np.ndarray, id_correct: np.ndarray) -> float:
    """The threshold t with mean(id_scores < t) = ID error (Garg et al. 2022, eq. 1):
    the (k+1)-th smallest score, k = round(error * n) (above every score when k = n)."""
    scores = np.sort(np.asarray(id_scores, dtype=float))
    k = int(round((1.0 - float(np.mean(id_correct))) * len(scores)))
    return float(scores[k]) if k < len(scores) else float(np.nextafter(scores[-1], np.inf))


def atc_estimate(id_scores: np.ndarray, id_correct: np.ndarray, ood_scores: np.ndarray
                 ) -> float:
    return float(np.mean(ood_scores >= atc_threshold(id_scores, id_correct)))


def doc_estimate(id_logits: np.ndarray, id_correct: np.ndarray, ood_logits: np.ndarray
                 ) -> float:
    id_conf, ood_conf = max_confidence(id_logits).mean(), max_confidence(ood_logits).mean()
    return float(np.mean(id_correct) - (id_conf - ood_conf))


def single_model_estimates(cp: Checkpoint) -> dict[str, float]:
    """The estimators that need one model only."""
    id_correct = cp.id_logits.argmax(1) == cp.id_labels
    return {
        "avg_conf": float(max_confidence(cp.ood_logits).mean()),
        "doc": doc_estimate(cp.id_logits, id_correct, cp.ood_logits),
        "atc_mc": atc_estimate(max_confidence(cp.id_logits), id_correct,
                               max_confidence(cp.ood_logits)),
        "atc_ne": atc_estimate(negative_entropy(cp.id_logits), id_correct,
                               negative_entropy(cp.ood_logits)),
    }


@dataclass
class AgreementLine:
    slope: float
    intercept: float
    r: float
    n_pairs: int

    @property
    def on_the_line(self) -> bool:
        return self.n_pairs >= 3 and self.r >= AGREEMENT_R_ON_THE_LINE

    def apply(self, id_acc: float) -> float:
        return float(norm.cdf(self.slope * probit(id_acc, AOTL_CLIP) + self.intercept))


def _aligned_predictions(cp: Checkpoint, ids_id: np.ndarray, ids_ood: np.ndarray
                         ) -> tuple[np.ndarray, np.ndarray]:
    """This checkpoint's predicted classes on the given ID and OOD example ids."""
    def on(ids: np.ndarray, own_ids: np.ndarray, logits: np.ndarray) -> np.ndarray:
        index = pd.Index(own_ids).get_indexer(ids)
        if (index < 0).any():
            raise UserError(f"run {cp.run} lacks some examples of the other models "
                            f"(different data or --eval_splits): cannot compare them")
        return logits.argmax(1)[index]
    return on(ids_id, cp.id_ids, cp.id_logits), on(ids_ood, cp.ood_ids, cp.ood_logits)


def agreement_line(checkpoints: list[Checkpoint]) -> AgreementLine:
    """Probit-space line of OOD agreement against ID agreement over every pair of models
    of one (dataset, OOD environment)."""
    ids_id = reduce(np.intersect1d, [cp.id_ids for cp in checkpoints])
    ids_ood = reduce(np.intersect1d, [cp.ood_ids for cp in checkpoints])
    if not len(ids_id) or not len(ids_ood):
        return AgreementLine(float("nan"), float("nan"), float("nan"), 0)
    preds = [_aligned_predictions(cp, ids_id, ids_ood) for cp in checkpoints]
    xs, ys = [], []
    for i in range(len(preds)):
        for j in range(i + 1, len(preds)):
            xs.append(np.mean(preds[i][0] == preds[j][0]))
            ys.append(np.mean(preds[i][1] == preds[j][1]))
    if len(xs) < 2 or np.ptp(xs) == 0:
        return AgreementLine(float("nan"), float("nan"), float("nan"), len(xs))
    fit = linregress(probit(np.array(xs), AOTL_CLIP), probit(np.array(ys), AOTL_CLIP))
    return AgreementLine(float(fit.slope), float(fit.intercept), float(fit.rvalue), len(xs))


def estimate(checkpoints: Iterable[Checkpoint]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(estimates: one row per run, step, env and method with estimated_acc and true_acc;
    agreement: one row per (dataset, env) with the agreement line and its verdict)."""
    by_split: dict[tuple, list[Checkpoint]] = {}
    rows = []
    for cp in checkpoints:
        by_split.setdefault((cp.dataset, cp.env), []).append(cp)
        true = float(np.mean(cp.ood_logits.argmax(1) == cp.ood_labels))
        for method, value in single_model_estimates(cp).items():
            rows.append({"run": cp.run, "step": cp.step, "dataset": cp.dataset,
                         "env": cp.env, "method": method, "estimated_acc": value,
                         "true_acc": true})
    lines = []
    for (dataset, env), cps in sorted(by_split.items()):
        line = agreement_line(cps)
        lines.append({"dataset": dataset, "env": env, "slope": line.slope,
                      "intercept": line.intercept, "r": line.r, "n_pairs": line.n_pairs,
                      "agreement_on_the_line": line.on_the_line})
        if np.isnan(line.slope):
            continue
        for cp in cps:
            id_acc = float(np.mean(cp.id_logits.argmax(1) == cp.id_labels))
            rows.append({"run": cp.run, "step": cp.step, "dataset": dataset, "env": env,
                         "method": "aline_s", "estimated_acc": line.apply(id_acc),
                         "true_acc": float(np.mean(cp.ood_logits.argmax(1) ==
                                                   cp.ood_labels))})
    return pd.DataFrame(rows), pd.DataFrame(lines)


def summary(estimates: pd.DataFrame) -> pd.DataFrame:
    """Mean absolute error (points) per dataset, OOD environment and method."""
    err = (estimates["estimated_acc"] - estimates["true_acc"]).abs() * 100
    frame = estimates.assign(abs_error=err).groupby(["dataset", "env", "method"],
                                                   sort=True)
    return frame.agg(mae=("abs_error", "mean"), n=("abs_error", "size")).reset_index()


def verdicts(agreement: pd.DataFrame, n_models: dict[tuple, int]) -> pd.DataFrame:
    """Per split: can label-free estimation be trusted there, and why."""
    rows = []
    for row in agreement.itertuples(index=False):
        n = n_models.get((row.dataset, row.env), 0)
        if n < 3:
            verdict, why = "unknown", f"only {n} model(s): agreement needs 3 or more"
        elif row.agreement_on_the_line:
            verdict, why = "trust", (f"agreement is on the line (R = {row.r:.2f} >= "
                                     f"{AGREEMENT_R_ON_THE_LINE})")
        else:
            verdict, why = "do not trust", (f"agreement is off the line (R = {row.r:.2f} < "
                                            f"{AGREEMENT_R_ON_THE_LINE}): accuracy need "
                                            f"not follow the ID-OOD line either")
        rows.append({"dataset": row.dataset, "env": row.env, "n_models": n,
                     "verdict": verdict, "reason": why})
    return pd.DataFrame(rows, columns=["dataset", "env", "n_models", "verdict", "reason"])


# ---------------------------------------------------------------- reading a sweep
def checkpoints_from_sweep(input_dirs: Sequence[str | os.PathLike[str]],
                           all_steps: bool = False) -> list[Checkpoint]:
    """Every finished run's last checkpoint (or every checkpoint) with saved logits, one
    Checkpoint per test environment. A sweep without logits is a UserError saying how
    to get them."""
    loaded = load_records(input_dirs, fields=TABLE_FIELDS)
    runs: dict[str, dict] = {}
    for record in loaded.records:
        runs.setdefault(record["run_dir"], record)
    out, without_logits = [], 0
    for run_dir, record in sorted(runs.items()):
        steps = list_prediction_steps(run_dir)
        for step in (steps if all_steps else steps[-1:]):
            arrays = load_predictions(run_dir, step)
            if "logits" not in arrays:
                without_logits += 1
                continue
            out += _split_checkpoint(run_dir, step, record["args"], arrays)
    if not out:
        raise UserError(f"no saved logits under {', '.join(map(str, input_dirs))} "
                        f"({without_logits} checkpoint(s) without): label-free estimation "
                        f"needs them; rerun the sweep with --save_logits")
    return out


def _split_checkpoint(run_dir: str, step: int, args: dict[str, Any], arrays: Any
                      ) -> list[Checkpoint]:
    test_envs = [int(e) for e in args.get("test_envs") or []]
    env, split = arrays["env"].astype(int), arrays["split"].astype(int)
    id_mask = (split == SPLIT_OUT) & ~np.isin(env, test_envs)
    if not id_mask.any():
        raise UserError(f"run {run_dir} evaluated no training-environment `out` split "
                        f"(the ID validation set label-free estimation is fitted on)")
    logits = arrays["logits"].astype(np.float32)
    cps = []
    for test_env in test_envs:
        ood = env == test_env
        if not ood.any():
            continue
        cps.append(Checkpoint(
            run=str(run_dir), step=int(step), dataset=str(args.get("dataset")),
            env=test_env, id_ids=arrays["id"][id_mask], id_logits=logits[id_mask],
            id_labels=arrays["label"][id_mask], ood_ids=arrays["id"][ood],
            ood_logits=logits[ood], ood_labels=arrays["label"][ood]))
    return cps

