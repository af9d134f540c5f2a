"""Evaluation of a model on named splits: accuracies, per-group and worst-group accuracy,
and the per-example prediction table of one checkpoint (see docs/CONTRACTS.md)."""
import re

import numpy as np
import torch

from domainbed.errors import UserError
from domainbed.precision import autocast_context

# --eval_splits tokens: every split, a kind of split in every environment, every split of
# the test / training environments, or one split by name (env2_in).
EVAL_SPLIT_TOKENS = ("all", "in", "out", "uda", "test", "train")
_SPLIT_NAME = re.compile(r"^env(\d+)_(in|out|uda)$")


class RunContext:
    def __init__(self, device, precision, memory_format, eval_batch_size, n_workers):
        self.device, self.precision, self.memory_format = device, precision, memory_format
        self.eval_batch_size, self.n_workers = eval_batch_size, n_workers



def check_eval_splits(tokens):
    for token in tokens or []:
        if token not in EVAL_SPLIT_TOKENS and not _SPLIT_NAME.match(token):
            raise UserError(f"--eval_splits {token!r}: not one of "
                            f"{', '.join(EVAL_SPLIT_TOKENS)} or a split name like env0_out")


def select_splits(named_splits, tokens, test_envs):
    """The named splits that `--eval_splits` keeps (the union of its tokens), in their
    order. None or ["all"] keeps every split (DomainBed's behaviour)."""
    tokens = list(tokens or ["all"])
    check_eval_splits(tokens)
    names = {name for name, _, _, _ in named_splits}
    for token in tokens:
        if _SPLIT_NAME.match(token) and token not in names:
            raise UserError(f"--eval_splits {token}: this run has no such split "
                            f"(splits: {', '.join(sorted(names))})")

    def kept(name, env_i, kind):
        is_test = env_i in test_envs
        return any(t == "all" or t == kind or t == name or (t == "test" and is_test)
                   or (t == "train" and not is_test) for t in tokens)

    return [s for s in named_splits if kept(*s[:3])]


def iterate_split(split, batch_size, n_workers):
    if split.x is not None:
        for start in range(0, len(split), batch_size):
            yield split.x[start:start + batch_size]
        return
    loader = torch.utils.data.DataLoader(
        split, batch_size=batch_size, shuffle=False, num_workers=n_workers)
    for x, _ in loader:
        yield x


@torch.inference_mode()
def predict_split(algorithm, split, device, precision, memory_format, batch_size, n_workers):
    """Logits of every example of a split, in order."""
    chunks = []
    for x in iterate_split(split, batch_size, n_workers):
        x = x.to(device, non_blocking=True)
        if x.dim() == 4:
            x = x.contiguous(memory_format=memory_format)
        with autocast_context(device, precision):
            chunks.append(algorithm.predict(x).float().cpu())
    return torch.cat(chunks) if chunks else torch.empty(0)


def predicted_class(logits):
    if logits.dim() == 1 or logits.size(1) == 1:  # DomainBed's binary single-logit case
        return (logits.view(-1) > 0).long()
    return logits.argmax(1)


def split_metrics(name, correct, groups, n_groups):
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


def evaluate(algorithm, named_splits, ctx, n_groups, save_logits, logits=None):
    """Metrics of every split and the per-example prediction table of this checkpoint.
    `logits`: {split name: logits} computed elsewhere (a fused evaluation pass over many
    models); missing names are predicted here."""
    metrics, columns = {}, {k: [] for k in ("id", "env", "split", "label", "pred", "correct",
                                            "group", "logits")}
    split_codes = {"in": 0, "out": 1, "uda": 2}
    algorithm.eval()
    given = logits or {}
    for name, env_i, kind, split in named_splits:
        logits = given.get(name)
        if logits is None:
            logits = predict_split(algorithm, split, ctx.device, ctx.precision,
                                   ctx.memory_format, ctx.eval_batch_size, ctx.n_workers)
        pred = predicted_class(logits).numpy()
        label = split.y.numpy()
        correct = (pred == label).astype(np.uint8)
        metrics.update(split_metrics(name, correct, split.groups, n_groups))
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
    return metrics, table


