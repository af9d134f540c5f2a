"""Training data of a run: building the dataset, DomainBed's in/out/uda splits, and
minibatches whose indices are a pure function of (seed, environment, step), so a resumed
run draws exactly the batches an uninterrupted one would."""
import copy
import inspect
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import torch

from domainbed.datasets.base import split_dataset
from domainbed.hparams import seed_hash
from domainbed.training.config import RunConfig


def build_dataset(dataset_cls: Any, data_dir: str, test_envs: Any, hparams: dict[str, Any],
                  data_seed: Any) -> Any:
    """DomainBed datasets take (root, test_envs, hparams); ours also take data_seed."""
    params = inspect.signature(dataset_cls.__init__).parameters
    if "data_seed" in params:
        return dataset_cls(data_dir, test_envs, hparams, data_seed=data_seed)
    return dataset_cls(data_dir, test_envs, hparams)


def make_splits(dataset: Any, config: RunConfig, hparams: dict) -> tuple[Any, ...]:
    """DomainBed's in/out (and uda) splits, seeded by the trial seed."""
    in_splits, out_splits, uda_splits = [], [], []
    for env_i, env in enumerate(dataset):
        out, in_ = split_dataset(env, int(len(env) * config.holdout_fraction),
                                 seed_hash(config.trial_seed, env_i))
        uda = None
        if env_i in config.test_envs and config.task == "domain_adaptation":  # type: ignore[operator]
            uda, in_ = split_dataset(in_, int(len(in_) * config.uda_holdout_fraction),
                                     seed_hash(config.trial_seed, env_i))
        in_splits.append(in_)
        out_splits.append(out)
        if uda is not None:
            uda_splits.append((env_i, uda))
    return in_splits, out_splits, uda_splits


def training_view(split: Any) -> Any:
    """The split as the training loop sees it: augmented where the dataset augments.
    Evaluation keeps the split's deterministic transform (DomainBed also evaluates training
    environments' out-splits through augmentation; we do not)."""
    if not hasattr(split, "set_transform"):
        return split
    view = copy.copy(split)
    view.set_transform(True)
    split.set_transform(False)
    return view


def class_balanced_weights(split: Any) -> Any:
    counts = torch.bincount(split.y)
    return (1.0 / counts.float())[split.y]


def sampling_weights(split: Any, hparams: dict[str, Any]) -> Any:
    """Per-example draw weights: group- or class-balanced, or None for uniform."""
    if hparams.get("group_balanced") and split.groups is not None:
        groups = torch.as_tensor(split.groups)
        return (1.0 / torch.bincount(groups).float())[groups]
    if hparams.get("class_balanced") or hparams.get("group_balanced"):
        return class_balanced_weights(split)
    return None


def samples_per_step(hparams: dict[str, Any]) -> Any:
    """Examples drawn per environment and step: batch_size, times grad_accum_steps (the
    step's micro-batches are consecutive slices of one draw, so k micro-batches of b give
    the very gradient one batch of k*b gives)."""
    return hparams["batch_size"] * int(hparams.get("grad_accum_steps", 1))


class BatchSampler:
    """Minibatch indices as a pure function of (seed, env, step): resumable for free.
    Sampling is with replacement, as DomainBed's InfiniteDataLoader."""

    def __init__(self, split: Any, batch_size: int, seed: int, env_i: Any,
                 weights: torch.Tensor | None = None) -> None:
        self.n, self.batch_size, self.weights = len(split), batch_size, weights
        self.seed, self.env_i = seed, env_i
        self.generator = torch.Generator()

    def indices(self, step: int) -> Any:
        self.generator.manual_seed(seed_hash(self.seed, self.env_i, step))
        if self.weights is not None:
            return torch.multinomial(self.weights, self.batch_size, replacement=True,
                                     generator=self.generator)
        return torch.randint(self.n, (self.batch_size,), generator=self.generator)


class MinibatchSource:
    """Training minibatches from in-memory tensors (fast path) or a loader pool."""

    def __init__(self, splits: Any, env_indices: Any, hparams: dict[str, Any], seed: int,
                 device: torch.device | str, memory_format: Any, n_workers: Any) -> None:
        self.splits, self.device, self.memory_format = splits, device, memory_format
        self.samplers = [
            BatchSampler(split, samples_per_step(hparams), seed, env_i,
                         sampling_weights(split, hparams))
            for split, env_i in zip(splits, env_indices)]
        self.hparams, self.seed, self.env_indices = hparams, seed, env_indices
        self.balanced_samplers: Any = None
        self.rank, self.world_size = 0, 1
        self.pool: Any = None
        if any(split.x is None for split in splits) and n_workers > 0:
            self.pool = ThreadPoolExecutor(max_workers=n_workers)

    def shard(self, rank: int, world_size: int) -> None:
        """Draw only this process's share of each minibatch (data-parallel runs): the
        rank-th of `world_size` equal contiguous slices of the indices the one-process run
        draws, so the processes together see exactly its batch."""
        self.rank, self.world_size = rank, world_size

    def _indices(self, sampler: Any, step: int) -> Any:
        indices = sampler.indices(step)
        if self.world_size == 1:
            return indices
        share = len(indices) // self.world_size
        return indices[self.rank * share:(self.rank + 1) * share]

    def _load(self, split: Any, idx: Any) -> tuple[Any, ...]:
        if split.x is not None:
            return split.x[idx], split.y[idx]
        items = list(self.pool.map(split.__getitem__, idx.tolist())) if self.pool else \
            [split[i] for i in idx.tolist()]
        return torch.stack([x for x, _ in items]), torch.as_tensor([y for _, y in items])

    def _samplers(self, group_balanced: Any) -> Any:
        """Uniform (or the run's configured) samplers, or group-balanced ones for algorithms
        that ask for them at some steps (e.g. CRT's second stage)."""
        if not group_balanced:
            return self.samplers
        if self.balanced_samplers is None:
            balanced = dict(self.hparams, group_balanced=True)
            self.balanced_samplers = [
                BatchSampler(split, samples_per_step(self.hparams), self.seed, env_i,
                             sampling_weights(split, balanced))
                for split, env_i in zip(self.splits, self.env_indices)]
        return self.balanced_samplers

    def groups(self, step: int, group_balanced: bool = False) -> list[Any]:
        """The group index of each example of `batches(step)`, per environment."""
        return [torch.as_tensor(split.groups)[self._indices(sampler, step)].to(self.device)
                for split, sampler in zip(self.splits, self._samplers(group_balanced))]

    def batches(self, step: int, group_balanced: bool = False) -> Any:
        out = []
        for split, sampler in zip(self.splits, self._samplers(group_balanced)):
            x, y = self._load(split, self._indices(sampler, step))
            x = x.to(self.device, non_blocking=True)
            if x.dim() == 4:
                x = x.contiguous(memory_format=self.memory_format)
            out.append((x, y.to(self.device, non_blocking=True)))
        return out


