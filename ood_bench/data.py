"""The two sides P and Q of an OoD-Bench measurement, built from any registered dataset.

`make_sides` groups environments into P (`envs_p`) and Q (`envs_q`), removes label shift by
subsampling every class to the smaller of its two counts (the official code's
label-shift-free datasets: p(y) = q(y)), optionally replaces the two sides by a random
50/50 split of their union (`force_iid`, the i.i.d. reference), and splits every side per
class into a training part and a held-out part (`holdout_fraction`, 0.1 as the paper).
"""
from __future__ import annotations

import inspect
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from numpy.typing import ArrayLike

import domainbed.datasets.oodbench_mnist  # noqa: F401  (registers OoDBenchColoredMNIST)
from domainbed.hparams import declared_space
from domainbed.registry import get_dataset_class
from oodutils.errors import UserError
from oodutils.log import ProjectWarning, get_logger

logger = get_logger(__name__)


def load_dataset(name: str, data_dir: str, hparams: dict[str, Any] | None = None,
                 data_seed: int = 0) -> tuple[Any, dict[str, Any]]:
    """Instantiate a registered dataset with its declared defaults, no augmentation."""
    cls = get_dataset_class(name)
    space = declared_space(cls, cls)
    merged = {k: h.default for k, h in space.items()}
    unknown = sorted(set(hparams or {}) - set(space))
    if unknown:
        logger.info(f"notice: dataset settings {unknown} are not declared by {name}; passed "
                    f"on anyway")
    merged.update(hparams or {})
    merged["data_augmentation"] = False
    kwargs = {}
    if "data_seed" in inspect.signature(cls.__init__).parameters:
        kwargs["data_seed"] = data_seed
    dataset = cls(data_dir, [], merged, **kwargs)
    for env in getattr(dataset, "datasets", []):
        if hasattr(env, "set_transform"):  # image environments: evaluation transform only
            env.set_transform(False)
    return dataset, merged


def check_env_groups(envs_p: Sequence[int], envs_q: Sequence[int],
                     n_envs: int) -> tuple[list[int], list[int]]:
    envs_p, envs_q = [int(e) for e in envs_p], [int(e) for e in envs_q]
    if not envs_p or not envs_q:
        raise UserError("--envs_p and --envs_q must each name at least one environment")
    bad = [e for e in envs_p + envs_q if not 0 <= e < n_envs]
    if bad:
        raise UserError(f"environment indices {bad} out of range: the dataset has "
                        f"{n_envs} environments (0..{n_envs - 1})")
    both = sorted(set(envs_p) & set(envs_q))
    if both:
        raise UserError(f"environments {both} are in both --envs_p and --envs_q")
    return envs_p, envs_q


@dataclass
class Part:
    """Examples of one side: environment index and index within it, label."""
    env: np.ndarray
    index: np.ndarray
    y: np.ndarray

    def __len__(self) -> int:
        return len(self.y)

    def take(self, keys: ArrayLike) -> Part:
        keys = np.asarray(keys, dtype=np.int64)
        return Part(self.env[keys], self.index[keys], self.y[keys])

    @staticmethod
    def concat(parts: Sequence[Part]) -> Part:
        return Part(*(np.concatenate([getattr(p, f) for p in parts])
                      for f in ("env", "index", "y")))


def _side(dataset: Any, envs: Sequence[int]) -> Part:
    parts = []
    for e in envs:
        y = np.asarray(dataset[e].y.numpy() if torch.is_tensor(dataset[e].y) else dataset[e].y,
                       dtype=np.int64)
        parts.append(Part(np.full(len(y), e, dtype=np.int64), np.arange(len(y)), y))
    return Part.concat(parts)


def _per_class(y: np.ndarray) -> dict[int, np.ndarray]:
    return {int(c): np.flatnonzero(y == c) for c in np.unique(y)}


def balance(p: Part, q: Part, rng: np.random.RandomState) -> tuple[Part, Part]:
    """Subsample each class to min(count in P, count in Q); classes missing from a side go."""
    cp, cq = _per_class(p.y), _per_class(q.y)
    dropped = sorted(set(cp) ^ set(cq))
    if dropped:
        warnings.warn(f"classes {dropped} appear on one side only and are left out (the "
                      f"estimator assumes p(y) = q(y))", ProjectWarning, stacklevel=2)
    keys_p, keys_q = [], []
    for c in sorted(set(cp) & set(cq)):
        n = min(len(cp[c]), len(cq[c]))
        keys_p.append(rng.permutation(cp[c])[:n])
        keys_q.append(rng.permutation(cq[c])[:n])
    if not keys_p:
        raise UserError("P and Q share no class")
    return p.take(np.concatenate(keys_p)), q.take(np.concatenate(keys_q))


def iid_sides(p: Part, q: Part, rng: np.random.RandomState) -> tuple[Part, Part]:
    """Pool P and Q and split every class 50/50 at random (no shift by construction)."""
    pool = Part.concat([p, q])
    a, b = [], []
    for idx in _per_class(pool.y).values():
        idx = rng.permutation(idx)
        a.append(idx[: len(idx) // 2])
        b.append(idx[len(idx) // 2:])
    return pool.take(np.concatenate(a)), pool.take(np.concatenate(b))


def holdout_split(part: Part, fraction: float, rng: np.random.RandomState) -> tuple[Part, Part]:
    """(train, held-out) with `fraction` of every class held out."""
    tr, out = [], []
    for idx in _per_class(part.y).values():
        idx = rng.permutation(idx)
        n = int(round(len(idx) * fraction))
        out.append(idx[:n])
        tr.append(idx[n:])
    return part.take(np.concatenate(tr)), part.take(np.concatenate(out))


@dataclass
class Sides:
    dataset: Any
    train_p: Part
    train_q: Part
    out_p: Part
    out_q: Part
    num_classes: int
    input_shape: tuple

    def summary(self) -> dict[str, Any]:
        return {"train_p": len(self.train_p), "train_q": len(self.train_q),
                "out_p": len(self.out_p), "out_q": len(self.out_q),
                "classes": sorted(int(c) for c in np.unique(self.out_p.y))}


def make_sides(dataset: Any, envs_p: Sequence[int], envs_q: Sequence[int],
               holdout_fraction: float = 0.1, seed: int = 0, force_iid: bool = False,
               balance_classes: bool = True) -> Sides:
    envs_p, envs_q = check_env_groups(envs_p, envs_q, len(dataset))
    if not 0.0 < holdout_fraction < 1.0:
        raise UserError(f"--holdout_fraction must lie in (0, 1), not {holdout_fraction}")
    rng = np.random.RandomState(seed)
    p, q = _side(dataset, envs_p), _side(dataset, envs_q)
    if balance_classes:
        p, q = balance(p, q, rng)
    if force_iid:
        p, q = iid_sides(p, q, rng)
    train_p, out_p = holdout_split(p, holdout_fraction, rng)
    train_q, out_q = holdout_split(q, holdout_fraction, rng)
    for name, part in (("P", train_p), ("Q", train_q), ("held-out P", out_p),
                       ("held-out Q", out_q)):
        if len(part) == 0:
            raise UserError(f"{name} is empty (environments too small for the split)")
    return Sides(dataset, train_p, train_q, out_p, out_q, int(dataset.num_classes),
                 tuple(dataset.input_shape))


class _Examples(torch.utils.data.Dataset):
    def __init__(self, dataset: Any, part: Part) -> None:
        self.dataset, self.part = dataset, part

    def __len__(self) -> int:
        return len(self.part)

    def __getitem__(self, k: int) -> torch.Tensor:
        x, _ = self.dataset[int(self.part.env[k])][int(self.part.index[k])]
        return x


def fetch(dataset: Any, part: Part, keys: ArrayLike | None = None,
          n_workers: int = 0) -> Any:
    """Inputs of `part` (or of its rows `keys`) as one tensor, fast for in-memory data."""
    if keys is not None:
        part = part.take(keys)
    if all(getattr(dataset[int(e)], "x", None) is not None for e in np.unique(part.env)):
        out: torch.Tensor | None = None
        for e in np.unique(part.env):
            rows = np.flatnonzero(part.env == e)
            xe = dataset[int(e)].x[torch.from_numpy(part.index[rows])]
            if out is None:
                out = xe.new_empty((len(part),) + tuple(xe.shape[1:]))
            out[torch.from_numpy(rows)] = xe
        return out
    loader = torch.utils.data.DataLoader(_Examples(dataset, part), batch_size=64,
                                         num_workers=n_workers)
    return torch.cat(list(loader))


def iterate(dataset: Any, part: Part, batch_size: int = 256,
            n_workers: int = 0) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """(x, y) batches of `part` in order."""
    for start in range(0, len(part), batch_size):
        keys = np.arange(start, min(start + batch_size, len(part)))
        yield fetch(dataset, part, keys, n_workers), torch.from_numpy(part.y[keys])
