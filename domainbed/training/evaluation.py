"""Evaluation of a model on named splits: accuracies, per-group and worst-group accuracy,
and the per-example prediction table of one checkpoint (see docs/CONTRACTS.md)."""
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch

from domainbed.training.precision import autocast_context
from oodutils.metrics import classification_metrics, confusion_matrix


class RunContext:
    def __init__(self, device: torch.device | str, precision: Any, memory_format: Any,
                 eval_batch_size: Any, n_workers: Any) -> None:
        self.device, self.precision, self.memory_format = device, precision, memory_format
        self.eval_batch_size, self.n_workers = eval_batch_size, n_workers


def iterate_split(split: Any, batch_size: int, n_workers: Any) -> Iterator[Any]:
    if split.x is not None:
        for start in range(0, len(split), batch_size):
            yield split.x[start:start + batch_size]
        return
    loader = torch.utils.data.DataLoader(
        split, batch_size=batch_size, shuffle=False, num_workers=n_workers)
    for x, _ in loader:
        yield x


@torch.inference_mode()
def predict_split(algorithm: Any, split: Any, device: torch.device | str, precision: Any,
                  memory_format: Any, batch_size: int, n_workers: Any) -> Any:
    """Logits of every example of a split, in order."""
    chunks = []
    for x in iterate_split(split, batch_size, n_workers):
        x = x.to(device, non_blocking=True)
        if x.dim() == 4:
            x = x.contiguous(memory_format=memory_format)
        with autocast_context(device, precision):
            chunks.append(algorithm.predict(x).float().cpu())
    return torch.cat(chunks) if chunks else torch.empty(0)


def predicted_class(logits: torch.Tensor) -> Any:
    if logits.dim() == 1 or logits.size(1) == 1:  # DomainBed's binary single-logit case
        return (logits.view(-1) > 0).long()
    return logits.argmax(1)


def split_metrics(name: str, correct: Any, groups: Any, n_groups: Any) -> Any:
    """Accuracy, and per-group and worst-group accuracy where groups exist. An empty
    split's accuracy is NaN (undefined, read as missing by model selection), never 0.0."""
    metrics = {f"{name}_acc": float(correct.mean()) if len(correct) else float("nan")}
    if groups is not None and n_groups:
        group_accs = []
        for g in range(n_groups):
            mask = groups == g
            if mask.any():
                acc = float(correct[mask].mean())
                metrics[f"{name}_acc_g{g}"] = acc
                group_accs.append(acc)
        if group_accs:
            metrics[f"{name}_wga"] = min(group_accs)
    return metrics


def evaluate(algorithm: Any, named_splits: Any, ctx: Any, n_groups: Any, save_logits: Any,
             logits: Any = None, extra_metrics: Any = (),
             num_classes: int | None = None) -> tuple[Any, ...]:
    """Metrics of every split and the per-example prediction table of this checkpoint.
    `logits`: {split name: logits} computed elsewhere (a fused evaluation pass over many
    models); missing names are predicted here. `extra_metrics` (names of
    `oodutils.metrics.METRICS`) add `{split}_{metric}` keys and a confusion matrix per
    split (`table["confusion"]`: {split name: matrix})."""
    columns: dict[str, list[Any]]
    metrics, columns = {}, {k: [] for k in ("id", "env", "split", "label", "pred", "correct",
                                            "group", "logits")}
    split_codes = {"in": 0, "out": 1, "uda": 2}
    confusion = {}
    algorithm.eval()
    given: Any = logits or {}
    for name, env_i, kind, split in named_splits:
        logits = given.get(name)
        if logits is None:
            logits = predict_split(algorithm, split, ctx.device, ctx.precision,
                                   ctx.memory_format, ctx.eval_batch_size, ctx.n_workers)
        pred = predicted_class(logits).numpy()
        label = split.y.numpy()
        correct = (pred == label).astype(np.uint8)
        metrics.update(split_metrics(name, correct, split.groups, n_groups))
        if extra_metrics:
            metrics.update({f"{name}_{k}": v for k, v in classification_metrics(
                label, pred, logits.float().numpy(), num_classes, extra_metrics).items()})  # type: ignore[arg-type]
            confusion[name] = confusion_matrix(label, pred, num_classes)  # type: ignore[arg-type]
        n = len(label)
        columns["id"].append(split.ids)
        columns["env"].append(np.full(n, env_i, np.int16))
        columns["split"].append(np.full(n, split_codes[kind], np.int8))
        columns["label"].append(label.astype(np.int64))
        columns["pred"].append(pred.astype(np.int64))
        columns["correct"].append(correct)
        columns["group"].append(split.groups if split.groups is not None
                                else np.full(n, -1, np.int64))
        columns["logits"].append(logits.to(torch.float16).numpy())
    algorithm.train()
    table = {k: np.concatenate(v) for k, v in columns.items() if k != "logits"}
    if save_logits:
        table["logits"] = np.concatenate(columns["logits"])
    return metrics, table, confusion


