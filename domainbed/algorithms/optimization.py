"""The optimizer and learning-rate schedule every algorithm uses, chosen by hyperparameters.

`make_optimizer` is the one place an algorithm's optimizers are built (DANN's generator and
discriminator, MLDG's inner loop, ...: each gets the run's `optimizer` choice); `make_schedule`
builds the run's schedule from torch's own lr_scheduler classes. DomainBed's datasets keep
DomainBed's constant-rate Adam; a dataset may declare its benchmark's own defaults in
``OPTIMIZER_HPARAMS`` (SubpopBench's datasets do), which override the ones here.
"""
from typing import Any

import torch

from domainbed.hparams import Hparam

OPTIMIZERS = ("adam", "sgd", "adamw")
SCHEDULES = ("constant", "linear", "cosine", "step")
# Keyword arguments only Adam-style optimizers take (DANN passes betas): SGD drops them.
ADAM_ONLY_KWARGS = ("betas", "eps", "amsgrad")


def _fixed(default: Any, doc: Any, **valid: Any) -> Any:
    """Never searched (a random draw keeps the default, as DomainBed's sweeps expect)."""
    return Hparam(default, lambda r: default, doc, **valid)


OPTIMIZATION_HPARAMS = {
    "optimizer": _fixed("adam", "adam (DomainBed) | sgd (with `momentum`) | adamw",
                        choices=OPTIMIZERS),
    "momentum": _fixed(0.9, "SGD's momentum (unused by adam and adamw)", low=0.0, high=0.999),
    "lr_schedule": _fixed("constant", "constant | linear (decay to 0) | cosine (to 0) | step "
                          "(times `lr_gamma` every `lr_step_size` steps), after warm-up",
                          choices=SCHEDULES),
    "warmup_steps": _fixed(0, "steps the learning rate ramps up linearly over first", low=0),
    "lr_step_size": _fixed(0, "step schedule: steps between decays (0: a third of the run)",
                           low=0),
    "lr_gamma": _fixed(0.1, "step schedule: decay factor", low=0.0, high=1.0),
    "grad_accum_steps": _fixed(1, "micro-batches of `batch_size` per optimizer step (an "
                               "effective batch of grad_accum_steps x batch_size)", low=1),
    "max_grad_norm": _fixed(0.0, "clip each optimizer's gradient norm to this before its "
                            "step (0: no clipping)", low=0.0),
}


def dataset_default(name: str, fallback: Any) -> Any:
    """A declaration a dataset may replace through its OPTIMIZER_HPARAMS (a benchmark's
    own protocol, e.g. SubpopBench's SGD for images); `fallback` otherwise."""
    def pick(dataset_cls: Any) -> Any:
        own = getattr(dataset_cls, "OPTIMIZER_HPARAMS", None) or {}
        return own.get(name, fallback)
    return pick


def make_optimizer(params: Any, hparams: dict[str, Any], lr: Any = None, weight_decay: Any = None,
                   **kwargs: Any) -> Any:
    """The run's optimizer (`hparams["optimizer"]`, Adam when absent, as DomainBed) over
    `params`, with the run's lr and weight decay unless given. `kwargs` go to the
    optimizer; Adam-only ones (betas, eps, amsgrad) are dropped for SGD."""
    kind = hparams.get("optimizer", "adam")
    lr = hparams["lr"] if lr is None else lr
    weight_decay = hparams["weight_decay"] if weight_decay is None else weight_decay
    if kind == "sgd":
        kwargs = {k: v for k, v in kwargs.items() if k not in ADAM_ONLY_KWARGS}
        return torch.optim.SGD(params, lr=lr, weight_decay=weight_decay,
                               momentum=hparams.get("momentum", 0.9), **kwargs)
    if kind == "adamw":
        return torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay, **kwargs)
    if kind != "adam":
        raise ValueError(f"unknown optimizer {kind!r}; choose one of {', '.join(OPTIMIZERS)}")
    return torch.optim.Adam(params, lr=lr, weight_decay=weight_decay, **kwargs)


def is_constant_schedule(hparams: dict[str, Any]) -> Any:
    return hparams.get("lr_schedule", "constant") == "constant" and \
        not hparams.get("warmup_steps", 0)


def make_schedule(optimizer: Any, hparams: dict[str, Any], n_steps: int) -> Any:
    """torch's lr scheduler for a run of `n_steps` optimizer steps (stepped once after
    each): `warmup_steps` of LinearLR from 1/(warmup+1) of the rate up to it (no step at
    rate 0), then constant, linear or cosine decay to 0 at the end, or StepLR."""
    sched = torch.optim.lr_scheduler
    warmup = hparams.get("warmup_steps", 0)
    rest = max(1, n_steps - warmup)
    kind = hparams.get("lr_schedule", "constant")
    if kind == "cosine":
        main: Any = sched.CosineAnnealingLR(optimizer, T_max=rest, eta_min=0.0)
    elif kind == "linear":
        main = sched.LinearLR(optimizer, start_factor=1.0, end_factor=0.0, total_iters=rest)
    elif kind == "step":
        step_size = hparams.get("lr_step_size", 0) or max(1, n_steps // 3)
        main = sched.StepLR(optimizer, step_size=step_size, gamma=hparams.get("lr_gamma", 0.1))
    elif kind == "constant":
        main = sched.ConstantLR(optimizer, factor=1.0, total_iters=0)
    else:
        raise ValueError(f"unknown lr_schedule {kind!r}; choose one of {', '.join(SCHEDULES)}")
    if not warmup:
        return main
    ramp = sched.LinearLR(optimizer, start_factor=1.0 / (warmup + 1), end_factor=1.0,
                          total_iters=warmup)
    return sched.SequentialLR(optimizer, [ramp, main], milestones=[warmup])
