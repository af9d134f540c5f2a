"""One run over several processes (`--distributed N`): each process trains on an equal
slice of every environment's minibatch and the gradients are averaged before each
optimizer step, which for a loss that is a mean over examples is the one-process
gradient of the whole batch. So the run's records equal the one-process run's within
floating-point rounding.

What that needs, and what this module holds to:
- Only algorithms whose loss is a mean of per-example terms may split (they declare
  `DATA_PARALLEL = True` in their own class body; subclasses, which change update(), do
  not inherit it). A penalty over an environment's whole batch (IRM, VREx, CORAL, MMD,
  GroupDRO's weights, Fish's inner loop ...) does not decompose: refused with one line
  (`domainbed.training.config.check_data_parallel`, before anything is created).
- Every process starts from rank 0's parameters; batch-norm layers that normalise with
  batch statistics become SyncBatchNorm on GPUs (the statistics of the whole batch) and
  are refused on CPU, where torch has no SyncBatchNorm.
- Evaluation is sharded: each process predicts a contiguous slice of each split and
  rank 0 gathers the logits, then alone writes records, predictions, checkpoints, the
  resume state, model.pkl and `done`.
- Randomness inside the model (dropout, augmentation) draws from per-process streams:
  rank 0 keeps the one-process stream, rank r > 0 one seeded by (seed, r, first step).
  Runs with such randomness are statistically, not bitwise, the one-process run.
The processes themselves are started by `domainbed.training.distributed`.
"""
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from domainbed.hparams import seed_hash
from domainbed.training import arithmetic
from domainbed.training.config import RunConfig
from domainbed.training.evaluation import predict_split
from domainbed.training.loop import TrainingRun
from domainbed.training.resume import RESUME_FILE, load_resume_state, optimizer_attributes
from oodutils.errors import UserError


# ---------------------------------------------------------------- gradients and state
def average_gradients_before_step(optimizer: Any, world_size: int) -> Any:
    """Each step of `optimizer` first replaces every gradient with its mean over the
    processes (one all-reduce of one flat buffer per device and dtype; a process without
    a gradient for a parameter counts zero). A parameter no process has a gradient for
    keeps none, as in the one-process step (Adam leaves it alone)."""
    def average(opt: Any, args: Any, kwargs: Any) -> None:
        params = [p for group in opt.param_groups for p in group["params"]
                  if p.requires_grad]
        buckets: dict[Any, Any] = {}
        for p in params:
            buckets.setdefault((p.device, p.dtype), []).append(p)
        for (device, dtype), bucket in buckets.items():
            grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in bucket]
            present = torch.tensor([p.grad is not None for p in bucket], dtype=dtype,
                                   device=device)
            flat = torch.cat([g.reshape(-1) for g in grads] + [present])
            dist.all_reduce(flat)
            offset = 0
            for p, count in zip(bucket, flat[-len(bucket):].tolist()):
                size = p.numel()
                if count > 0:
                    p.grad = flat[offset:offset + size].view_as(p).div_(world_size)
                offset += size
    return optimizer.register_step_pre_hook(average)


def broadcast_state(module: Any) -> None:
    """Every parameter and buffer as rank 0 holds it."""
    for tensor in module.state_dict().values():
        if torch.is_tensor(tensor) and tensor.numel():
            dist.broadcast(tensor, 0)


def prepare_batch_norm(module: Any, device: Any) -> Any:
    """Batch norm over the whole batch: SyncBatchNorm on GPUs; on CPU (no SyncBatchNorm
    there) a run whose batch-norm layers use batch statistics is refused. Layers kept in
    eval mode (frozen, as DomainBed's ResNets) use their running statistics and split."""
    module.train()
    live = [name for name, m in module.named_modules()
            if isinstance(m, torch.nn.modules.batchnorm._BatchNorm) and m.training]
    if not live:
        return module
    if device.type != "cuda":
        raise UserError(f"--distributed on CPU: the model normalises with batch statistics "
                        f"({live[0]}{' and others' if len(live) > 1 else ''}), which would "
                        f"differ per process, and torch's SyncBatchNorm needs GPUs; run it "
                        f"on GPUs or with --distributed 1")
    return torch.nn.SyncBatchNorm.convert_sync_batchnorm(module)


# ---------------------------------------------------------------- evaluation
class SplitShard:
    """Examples [start, stop) of a split, as `predict_split` reads a split."""

    def __init__(self, split: Any, start: Any, stop: Any) -> None:
        self.split, self.start, self.stop = split, start, stop
        self.x = split.x[start:stop] if getattr(split, "x", None) is not None else None

    def __len__(self) -> int:
        return self.stop - self.start

    def __getitem__(self, i: int) -> Any:
        return self.split[self.start + i]


def shard_bounds(n: Any, rank: int, world_size: int) -> tuple[Any, ...]:
    return n * rank // world_size, n * (rank + 1) // world_size


def gather_rows(local: Any, n: Any, world_size: int, device: Any) -> Any:
    """The rows every process computed, in rank order (uneven slices padded to send)."""
    longest = -(-n // world_size)
    padded = torch.zeros((longest,) + tuple(local.shape[1:]), dtype=local.dtype,
                         device=device)
    padded[:len(local)] = local.to(device)
    parts = [torch.empty_like(padded) for _ in range(world_size)]
    dist.all_gather(parts, padded)
    rows = [part[:stop - start].cpu() for part, (start, stop) in
            zip(parts, (shard_bounds(n, r, world_size) for r in range(world_size)))]
    return torch.cat(rows)


def sharded_logits(algorithm: Any, named_splits: Any, ctx: Any, rank: int, world_size: int) -> Any:
    """{split name: logits of every example}, each process predicting its slice; splits
    with fewer examples than processes are left to rank 0's own evaluation."""
    logits = {}
    algorithm.eval()
    try:
        for name, _, _, split in named_splits:
            n = len(split)
            if n < world_size:
                continue
            start, stop = shard_bounds(n, rank, world_size)
            local = predict_split(algorithm, SplitShard(split, start, stop), ctx.device,
                                  ctx.precision, ctx.memory_format, ctx.eval_batch_size,
                                  ctx.n_workers)
            logits[name] = gather_rows(local, n, world_size, ctx.device)
    finally:
        algorithm.train()
    return logits


def mean_over_processes(accumulators: Any, device: Any) -> dict[Any, Any]:
    """The update() values of the steps since the last checkpoint, each averaged over the
    processes (equal slices: the mean of their means is the mean over the whole batch)."""
    keys = sorted(accumulators)
    local = torch.tensor([sum(accumulators[k]) / len(accumulators[k]) for k in keys],
                         dtype=torch.float64, device=device)
    dist.all_reduce(local)
    local /= dist.get_world_size()
    return {k: [v] for k, v in zip(keys, local.tolist())}


# ---------------------------------------------------------------- the run
class DataParallelRun(TrainingRun):
    """A TrainingRun in one process of a data-parallel group (the process group is
    initialised): its slice of every batch, averaged gradients, sharded evaluation; rank 0
    alone writes the run directory."""
    stacks_as_probe = False

    def __init__(self, config: RunConfig, hparams: dict, algorithm_cls: type,
                 dataset_cls: type, log: Callable[[str], Any] | None = None) -> None:
        self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
        self.is_main = self.rank == 0
        super().__init__(config, hparams, algorithm_cls, dataset_cls,
                         log if self.is_main else (lambda message: None))
        self.set_arithmetic(arithmetic.data_parallel(self.world_size))
        for source in (self.minibatches, self.uda_source):
            if source is not None:
                source.shard(self.rank, self.world_size)
        self.algorithm = prepare_batch_norm(self.algorithm, self.device)
        broadcast_state(self.algorithm)
        for optimizer in optimizer_attributes(self.algorithm).values():
            average_gradients_before_step(optimizer, self.world_size)

    def restore(self) -> Any:
        """Rank 0 restores (or starts) the run; the others then read its resume state
        and start at its step, whatever the number of processes that wrote it."""
        next_step = super().restore() if self.is_main else 0
        dist.barrier()
        if not self.is_main and self.run_dir.exists(RESUME_FILE):
            load_resume_state(self.run_dir, RESUME_FILE, self.algorithm, self.identity)
        agreed = torch.tensor([next_step], device=self.device)
        dist.broadcast(agreed, 0)
        next_step = int(agreed.item())
        if not self.is_main:
            torch.manual_seed(seed_hash(self.config.seed, self.rank, next_step))
        return next_step

    def checkpoint(self, step: int, logits: dict[str, torch.Tensor] | None = None) -> Any:
        logits = sharded_logits(self.algorithm, self.named_splits, self.ctx, self.rank,
                                self.world_size)
        self.accumulators = mean_over_processes(self.accumulators, self.device)
        if not self.is_main:
            self.accumulators = {}
            return None
        return super().checkpoint(step, logits)

    def finish(self) -> None:
        if self.is_main:
            super().finish()
        dist.barrier()
