"""Classification metrics beyond accuracy, from labels, predicted classes and (where a
metric needs probabilities) logits: the everyday set of the field's toolkits.

scikit-learn computes what it has (balanced accuracy, macro F1, per-class recall, AUROC,
log loss, confusion matrix); two are written here because scikit-learn has no multiclass
form of them: the expected calibration error over 15 equal-width confidence bins (Guo et
al. 2017) and the multiclass Brier score (mean squared distance between the probability
vector and the one-hot label).
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from oodutils.errors import UserError, require

# name -> needs logits
METRICS = {"nll": True, "ece": True, "brier": True, "balanced_acc": False,
           "macro_f1": False, "worst_class_acc": False, "class_acc": False, "auroc": True}
ECE_BINS = 15


def check_metrics(names: Sequence[str]) -> list[str]:
    """The requested metric names, each known, in order, without repeats."""
    unknown = [n for n in names if n not in METRICS]
    if unknown:
        raise UserError(f"--metrics {unknown[0]!r}: not one of {', '.join(METRICS)}")
    return list(dict.fromkeys(names))


def softmax(logits: np.ndarray) -> np.ndarray:
    z = np.asarray(logits, dtype=np.float64)
    if z.ndim == 1 or z.shape[1] == 1:      # DomainBed's binary single-logit models
        z = np.stack([np.zeros(len(z)), z.reshape(-1)], axis=1)
    z = z - z.max(axis=1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=1, keepdims=True)


def expected_calibration_error(probs: np.ndarray, labels: np.ndarray,
                               bins: int = ECE_BINS) -> float:
    """Sum over equal-width bins of max-probability of |accuracy - confidence| weighted by
    the bin's share of examples."""
    confidence, predicted = probs.max(axis=1), probs.argmax(axis=1)
    correct = predicted == labels
    edges = np.linspace(0.0, 1.0, bins + 1)
    which = np.clip(np.digitize(confidence, edges[1:-1], right=True), 0, bins - 1)
    ece = 0.0
    for b in range(bins):
        mask = which == b
        if mask.any():
            ece += mask.mean() * abs(correct[mask].mean() - confidence[mask].mean())
    return float(ece)


def brier_score(probs: np.ndarray, labels: np.ndarray) -> float:
    onehot = np.zeros_like(probs)
    onehot[np.arange(len(labels)), labels] = 1.0
    return float(np.mean(np.sum((probs - onehot) ** 2, axis=1)))


def classification_metrics(labels: np.ndarray, pred: np.ndarray,
                           logits: np.ndarray | None, num_classes: int,
                           names: Sequence[str]) -> dict[str, float]:
    """{metric name: value} for one split (`class_acc` gives `acc_class{k}` per class
    present). Metrics that need logits are left out when `logits` is None; an empty split
    gives nothing."""
    if not len(labels) or not names:
        return {}
    skm = require("sklearn.metrics", extra="analysis")
    labels, pred = np.asarray(labels, dtype=np.int64), np.asarray(pred, dtype=np.int64)
    classes = list(range(num_classes))
    present = sorted(set(labels.tolist()))
    out: dict[str, float] = {}
    probs = softmax(logits) if logits is not None else None
    recall = skm.recall_score(labels, pred, labels=present, average=None, zero_division=0)
    for name in names:
        if METRICS[name] and probs is None:
            continue
        if name == "nll":
            out["nll"] = float(skm.log_loss(labels, probs, labels=classes))
        elif name == "ece":
            out["ece"] = expected_calibration_error(probs, labels)  # type: ignore[arg-type]
        elif name == "brier":
            out["brier"] = brier_score(probs, labels)  # type: ignore[arg-type]
        elif name == "balanced_acc":
            out["balanced_acc"] = float(np.mean(recall))
        elif name == "macro_f1":
            out["macro_f1"] = float(skm.f1_score(labels, pred, labels=present,
                                                 average="macro", zero_division=0))
        elif name == "worst_class_acc":
            out["worst_class_acc"] = float(np.min(recall))
        elif name == "class_acc":
            out.update({f"acc_class{c}": float(r) for c, r in zip(present, recall)})
        elif name == "auroc" and num_classes == 2 and len(present) == 2:
            out["auroc"] = float(skm.roc_auc_score(labels, probs[:, 1]))  # type: ignore[index]
    return out


def confusion_matrix(labels: np.ndarray, pred: np.ndarray, num_classes: int) -> np.ndarray:
    """Counts, rows = true class, columns = predicted class (int64, num_classes square)."""
    skm = require("sklearn.metrics", extra="analysis")
    return skm.confusion_matrix(labels, pred, labels=list(range(num_classes))).astype(np.int64)
