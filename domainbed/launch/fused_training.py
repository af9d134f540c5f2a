"""Training many models of one algorithm in one process, in one of two arithmetics.

`exact` (the default on CPU): each step, every member runs its own single run's step
(`TrainingRun.train_step`, `checkpoint`) with its own state of the global random
generators swapped in: the same kernels in the same order as the member alone, so its
records, predictions and resume state are bit for bit the single run's, whatever else
shares the group. What the group shares is the process and the dataset.

`batched` (the default on CUDA): parameters, Adam moments and per-step algorithm state
live stacked along a leading member dimension between checkpoints. Each step draws every
member's minibatches with its own sampler (the indices a single run would draw),
computes all members' gradients in one `torch.func.vmap` of the algorithm's
`FusedForm.objective`, and applies Adam to the stacked tensors with each member's lr and
weight decay. At a checkpoint the stacked tensors are written back into each member's
algorithm (so its resume state and model.pkl have a single run's form; its records say
`fused-batched`, and only a batched group resumes it: training.arithmetic) and one
vmapped evaluation pass predicts every split for all members.
Batched matrix products round differently from the single run's kernels (on CPU the
single run's `addmm` adds the bias inside the product, the batched one after it): a
member parts from its single run in the last bits at step 0, and the difference grows
with training (scripts/fused_parity_probe.py measures it). Dropout masks are a hash of
(member seed, step, layer, element), so a member's draws do not depend on the others in
its group, their order, or restarts; they are not the single run's masks.

Why Adam by hand (batched): torch.optim.Adam takes one lr per parameter group, not one
per slice of a stacked tensor; the update below is its single-tensor arithmetic with
per-member lr and weight decay.
"""
import copy
import math
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.nn as nn
from torch.func import functional_call, grad, vmap

from domainbed.algorithms.base import fused_form, hparam_tensor
from domainbed.hparams import seed_hash
from domainbed.networks import DROPOUT_HPARAMS
from domainbed.training.evaluation import iterate_split
from domainbed.training.precision import autocast_context
from domainbed.training.random_states import RandomStates

MEMBER_OPTIMIZER_HPARAMS = ("lr", "weight_decay")
ARITHMETICS = ("auto", "exact", "batched")
MASK32 = 0xFFFFFFFF


def resolve_arithmetic(choice: Any, device: torch.device | str) -> Any:
    """auto: exact on CPU (stacking buys no speed there), batched on an accelerator."""
    if choice not in ARITHMETICS:
        raise ValueError(f"unknown fused arithmetic {choice!r}; one of {ARITHMETICS}")
    if choice == "auto":
        return "exact" if torch.device(device).type == "cpu" else "batched"
    return choice


def member_hparams(algorithm_cls: Any) -> Any:
    """Hyperparameters that may differ between the members of one fused group."""
    return MEMBER_OPTIMIZER_HPARAMS + DROPOUT_HPARAMS + fused_form(algorithm_cls).member_hparams


def _mul32(h: Any, constant: Any) -> Any:
    """(h * constant) mod 2**32 for h < 2**32 in int64, without overflowing int64."""
    low, high = constant & 0xFFFF, constant >> 16
    return (h * low + (((h * high) & 0xFFFF) << 16)) & MASK32


def _mix32(h: Any) -> Any:
    """A 32-bit integer hash (Wellons' lowbias32) on int64 tensors holding 32-bit values."""
    h = h ^ (h >> 16)
    h = _mul32(h, 0x7FEB352D)
    h = h ^ (h >> 15)
    h = _mul32(h, 0x846CA68B)
    return h ^ (h >> 16)


def counter_uniform(key: Any, layer: Any, shape: Any, device: torch.device | str) -> Any:
    """Uniform [0, 1) numbers, one per element of `shape`, as a pure function of (key,
    layer, element index): no generator, so under vmap each member's numbers depend on
    its own key alone. `key`: an int64 tensor below 2**31 (a member's, per step)."""
    index = torch.arange(math.prod(shape), device=device, dtype=torch.int64).view(shape)
    base = _mix32((key ^ (layer * 0x9E3779B9)) & MASK32)
    h = _mix32(_mix32(index ^ base) ^ _mix32((base + 0x632BE5AB) & MASK32))
    return (h >> 8).to(torch.float32) * 2.0 ** -24


class MemberDropout(nn.Module):
    """nn.Dropout whose rate and mask key are buffers, so that each stacked member keeps
    its own rate and draws its own masks (see counter_uniform)."""
    p: torch.Tensor
    key: torch.Tensor

    def __init__(self, p: Any, active: Any, layer: Any) -> None:
        super().__init__()
        self.register_buffer("p", torch.tensor(float(p)))
        self.register_buffer("key", torch.tensor(0, dtype=torch.int64))
        self.layer = layer
        self.active = active   # False when every member's rate is 0: draws nothing

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not (self.training and self.active):
            return x
        keep = (counter_uniform(self.key, self.layer, x.shape, x.device) >= self.p)
        return x * keep.to(x.dtype) / (1 - self.p)


class GlobalAveragePool(nn.Module):
    """AdaptiveAvgPool2d((1, 1)) as a mean: vmap has a batching rule for the mean, while
    adaptive pooling falls back to a slow loop over the members."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.mean(dim=(-2, -1), keepdim=True)


def _is_global_pool(module: Any) -> Any:
    size = getattr(module, "output_size", None)
    return isinstance(module, nn.AdaptiveAvgPool2d) and size in (1, (1, 1))


class MemberModel:
    """One member's network inside vmap: the algorithm's `network` (featurizer, then
    classifier) called with that member's parameters and buffers."""

    def __init__(self, template: Any, tensors: Any) -> None:
        self.template, self.tensors = template, tensors

    def _part(self, index: Any) -> dict[Any, Any]:
        prefix = f"{index}."
        return {k[len(prefix):]: v for k, v in self.tensors.items() if k.startswith(prefix)}

    def predict(self, x: torch.Tensor) -> torch.Tensor:
        return functional_call(self.template, self.tensors, (x,))

    def featurize(self, x: torch.Tensor) -> torch.Tensor:
        return functional_call(self.template[0], self._part(0), (x,))

    def classify(self, features: torch.Tensor) -> torch.Tensor:
        return functional_call(self.template[1], self._part(1), (features,))


def _member_template(networks: Any) -> tuple[Any, ...]:
    """A copy of the first member's network whose dropout layers read their rate and mask
    key from buffers (and global pools are means), each member's rate of every dropout
    layer, and the names of the dropout layers."""
    template = copy.deepcopy(networks[0])
    dropouts: list[Any]
    rates, dropouts = {}, []
    for name, module in list(template.named_modules()):
        if _is_global_pool(module):
            _replace(template, name, GlobalAveragePool())
        if isinstance(module, nn.Dropout):
            member_rates = [float(net.get_submodule(name).p) for net in networks]
            rates[f"{name}.p"] = torch.tensor(member_rates)
            _replace(template, name, MemberDropout(
                member_rates[0], any(r > 0 for r in member_rates), len(dropouts)))
            dropouts.append(name)
    return template, rates, dropouts


def _replace(root: Any, name: str, module: Any) -> None:
    parent, _, child = name.rpartition(".")
    setattr(root.get_submodule(parent) if parent else root, child, module)


def _stack(tensors: Any) -> Any:
    """Members' tensors along a new leading dimension, in the standard (contiguous) layout:
    a single run keeps its convolution weights channels-last on CPU, and torch 2.4's vmap
    cannot batch a channels-last tensor through group_norm or query its layout."""
    return torch.stack([t.detach() for t in tensors]).contiguous()


class FusedGroup:
    """Members (TrainingRuns of one algorithm, same data, architecture, batch size and
    schedule, all at the same next step) trained together."""

    def __init__(self, members: Any) -> None:
        self.members = list(members)
        first = self.members[0]
        self.form = fused_form(first.algorithm_cls)
        self.device, self.precision = first.device, first.config.precision
        networks = [m.algorithm.network for m in self.members]
        self.template, dropout_rates, self.dropouts = _member_template(networks)
        self.param_names = [n for n, _ in networks[0].named_parameters()]
        self.params = {n: _stack([dict(net.named_parameters())[n] for net in networks])
                       for n in self.param_names}
        self.buffers = {n: _stack([dict(net.named_buffers())[n] for net in networks])
                        for n, _ in networks[0].named_buffers()}
        self.buffers.update({n: r.to(self.device) for n, r in dropout_rates.items()})
        self.hp = self._member_hp()
        self.state = {name: _stack([getattr(m.algorithm, name) for m in self.members])
                      for name in self.form.state}
        self._load_adam()
        self._step = vmap(self._member_step, randomness="different")
        self._logits = vmap(self._member_logits, in_dims=(0, 0, None), randomness="different")

    # ------------------------------------------------------------ set-up
    def _member_hp(self) -> Any:
        """Each member's hyperparameters as stacked tensors (see hparam_tensor)."""
        hp = {}
        for name in member_hparams(self.members[0].algorithm_cls):
            values = [m.hparams[name] for m in self.members if name in m.hparams]
            if len(values) != len(self.members):
                continue
            hp[name] = hparam_tensor(values, self.device)
        return hp

    def _load_adam(self) -> None:
        """Adam's moments and step counts from each member's torch optimizer (fresh, or
        restored from a resume state)."""
        self.exp_avg, self.exp_avg_sq = {}, {}
        self.adam_steps = [0] * len(self.members)
        self.betas: Any
        self.eps: Any
        self.betas, self.eps = None, None
        for n in self.param_names:
            self.exp_avg[n] = torch.zeros_like(self.params[n])
            self.exp_avg_sq[n] = torch.zeros_like(self.params[n])
        for i, member in enumerate(self.members):
            optimizer = member.algorithm.optimizer
            group = optimizer.param_groups[0]
            if type(optimizer) is not torch.optim.Adam or len(optimizer.param_groups) != 1 \
                    or group["amsgrad"] or group["maximize"]:
                raise ValueError(f"{type(member.algorithm).__name__}'s optimizer is not one "
                                 f"plain Adam over its network")
            self.betas, self.eps = group["betas"], group["eps"]
            for n, p in member.algorithm.network.named_parameters():
                state = optimizer.state.get(p)
                if state:
                    self.exp_avg[n][i] = state["exp_avg"]
                    self.exp_avg_sq[n][i] = state["exp_avg_sq"]
                    self.adam_steps[i] = int(float(state["step"]))

    # ------------------------------------------------------------ one step
    def _member_step(self, params: Any, buffers: Any, hp: dict[str, Any], state: Any, xs: Any,
                     ys: Any) -> tuple[Any, ...]:
        def loss_of(member_params: Any) -> tuple[Any, ...]:
            model = MemberModel(self.template, {**member_params, **buffers})
            loss, values, new_state = self.form.objective(model, list(zip(xs, ys)), hp,
                                                          state)
            return loss, ({k: torch.as_tensor(v).detach() for k, v in values.items()},
                          new_state)
        grads, (values, new_state) = grad(loss_of, has_aux=True)(params)
        return grads, values, new_state

    def _member_logits(self, params: Any, buffers: Any, x: torch.Tensor) -> Any:
        return functional_call(self.template, {**params, **buffers}, (x,))

    def minibatches(self, step: int) -> tuple[Any, ...]:
        """Every member's minibatches, stacked: ([x_env], [y_env]), each [members, ...]."""
        sources = [m.minibatches for m in self.members]
        n_envs = len(sources[0].splits)
        xs, ys = [], []
        for e in range(n_envs):
            splits = [s.splits[e] for s in sources]
            indices = [s.samplers[e].indices(step) for s in sources]
            if splits[0].x is not None and all(sp.x is splits[0].x for sp in splits):
                index = torch.stack(indices)            # one gather for every member
                x, y = splits[0].x[index], splits[0].y[index]
            else:
                pairs = [s._load(sp, i) for s, sp, i in zip(sources, splits, indices)]
                x, y = _stack([p[0] for p in pairs]), _stack([p[1] for p in pairs])
            xs.append(x.to(self.device, non_blocking=True))
            ys.append(y.to(self.device, non_blocking=True))
        return xs, ys

    def _set_dropout_keys(self, step: int) -> None:
        """Each member's mask key of this step: a function of its own seed and the step."""
        if not self.dropouts:
            return
        keys = torch.tensor([seed_hash(m.config.seed, "dropout", step) for m in self.members],
                            dtype=torch.int64, device=self.device)
        for name in self.dropouts:
            self.buffers[f"{name}.key"] = keys

    def train_step(self, step: int) -> list[Any]:
        """One step of every member; returns each member's update() values (floats)."""
        xs, ys = self.minibatches(step)
        self._set_dropout_keys(step)
        if self.form.reset_optimizer is not None:
            self._reset_adam(self.form.reset_optimizer(self.hp, self.state))
        self.template.train()
        with autocast_context(self.device, self.precision):
            grads, values, new_state = self._step(self.params, self.buffers, self.hp,
                                                  self.state, xs, ys)
        self._adam(grads)
        self.state = {k: v.detach() for k, v in new_state.items()}
        columns = {k: v.float().reshape(len(self.members), -1)[:, 0].tolist()
                   for k, v in values.items()}
        return [{k: columns[k][i] for k in columns} for i in range(len(self.members))]

    def _reset_adam(self, mask: torch.Tensor) -> None:
        """Members whose Adam restarts now (penalty annealing): zero moments and count."""
        if not bool(mask.any()):
            return
        for i in torch.nonzero(mask).flatten().tolist():
            self.adam_steps[i] = 0
            for n in self.param_names:
                self.exp_avg[n][i].zero_()
                self.exp_avg_sq[n][i].zero_()

    @torch.no_grad()
    def _adam(self, grads: Any) -> None:
        """torch.optim.Adam's single-tensor update, with per-member lr and weight decay."""
        beta1, beta2 = self.betas
        self.adam_steps = [s + 1 for s in self.adam_steps]
        lr = [m.hparams["lr"] for m in self.members]
        step_size = torch.tensor([lr_i / (1 - beta1 ** s) for lr_i, s in
                                  zip(lr, self.adam_steps)], device=self.device)
        bias2_sqrt = torch.tensor([math.sqrt(1 - beta2 ** s) for s in self.adam_steps],
                                  device=self.device)
        decay = self.hp["weight_decay"]
        for n in self.param_names:
            param, g = self.params[n], grads[n]
            shape = (-1,) + (1,) * (param.dim() - 1)
            if bool((decay != 0).any()):
                g = g + param * decay.view(shape)
            self.exp_avg[n].lerp_(g, 1 - beta1)
            self.exp_avg_sq[n].mul_(beta2).addcmul_(g, g, value=1 - beta2)
            denom = (self.exp_avg_sq[n].sqrt() / bias2_sqrt.view(shape)).add_(self.eps)
            param.add_((-step_size).view(shape) * self.exp_avg[n] / denom)

    # ------------------------------------------------------------ evaluation, write-back
    @torch.no_grad()
    def predict(self) -> dict[str, torch.Tensor]:
        """{split name: logits [members, n, classes]} of every evaluated split."""
        first = self.members[0]
        ctx = first.ctx
        self.template.eval()
        out = {}
        for name, _, _, split in first.named_splits:
            chunks = []
            for x in iterate_split(split, ctx.eval_batch_size, ctx.n_workers):
                x = x.to(self.device, non_blocking=True)
                with autocast_context(self.device, self.precision):
                    chunks.append(self._logits(self.params, self.buffers, x).float().cpu())
            out[name] = torch.cat(chunks, dim=1) if chunks else torch.empty(
                len(self.members), 0)
        self.template.train()
        return out

    @torch.no_grad()
    def write_back(self) -> None:
        """Each member's parameters, Adam state and algorithm state into its own objects,
        exactly as a single run would hold them (for its resume state and model.pkl)."""
        for i, member in enumerate(self.members):
            algorithm = member.algorithm
            optimizer = algorithm.optimizer
            for n, p in algorithm.network.named_parameters():
                p.copy_(self.params[n][i])
                if self.adam_steps[i]:
                    optimizer.state[p] = {
                        "step": torch.tensor(float(self.adam_steps[i])),
                        "exp_avg": self.exp_avg[n][i].clone(),
                        "exp_avg_sq": self.exp_avg_sq[n][i].clone()}
                else:
                    optimizer.state.pop(p, None)
            for name, value in self.state.items():
                setattr(algorithm, name, value[i].clone())

    def drop(self, positions: Any) -> None:
        """Remove members (e.g. one that diverged); the others go on unchanged."""
        keep = [i for i in range(len(self.members)) if i not in set(positions)]
        index = torch.tensor(keep, device=self.device)
        self.members = [self.members[i] for i in keep]
        self.adam_steps = [self.adam_steps[i] for i in keep]
        for table in (self.params, self.buffers, self.hp, self.state, self.exp_avg,
                      self.exp_avg_sq):
            for k in list(table):
                table[k] = table[k].index_select(0, index.to(table[k].device))


def train_group(members: Any, start_step: int, on_checkpoint: Callable[..., Any],
                on_failure: Callable[..., Any], arithmetic: str = "auto",
                random_states: Any = None) -> Any:
    """Train `members` (all resuming at `start_step`) to the end. `on_checkpoint(member,
    results)` after each member's record; `on_failure(member, error)` when one member
    fails (it leaves the group; the others go on). `arithmetic`: exact | batched | auto
    (see the module docstring). `random_states`: each member's RandomStates (its global
    generators as its single run has them now; captured here when None, which is right
    only for one member). Returns the members that finished."""
    if random_states is None:
        random_states = [RandomStates.capture() for _ in members]
    states = {id(m): r for m, r in zip(members, random_states)}
    if resolve_arithmetic(arithmetic, members[0].device) == "exact":
        return _train_exact(members, start_step, on_checkpoint, on_failure, states)
    return _train_batched(members, start_step, on_checkpoint, on_failure, states)


def _train_exact(members: Any, start_step: int, on_checkpoint: Callable[..., Any],
                 on_failure: Callable[..., Any], states: Any) -> Any:
    """Each member's own single-run step and checkpoint, in turn, with its own random
    generators: bit for bit what it computes alone."""
    members = list(members)
    for step in range(start_step, members[0].n_steps):
        for member in list(members):
            try:
                with states[id(member)].active():
                    member.train_step(step)
                    if member.is_checkpoint(step):
                        on_checkpoint(member, member.checkpoint(step))
            except Exception as e:   # diverged, or its disk is full: this member alone
                on_failure(member, e)
                members.remove(member)
        if not members:
            return []
    return members


def accumulate_step(group: Any, step: int, values: Any, seconds: float,
                    on_failure: Callable[..., Any]) -> bool:
    """Each member of a stacked group (FusedGroup, ProbeStack) records its values of `step`;
    one that fails (TrainingDiverged) stops alone and leaves the group. Returns whether any
    member is left."""
    failed = []
    for i, (member, member_values) in enumerate(zip(group.members, values)):
        try:
            member.accumulate(step, member_values, seconds)
        except Exception as e:   # this member alone
            on_failure(member, e)
            failed.append(i)
    if failed:
        group.drop(failed)
    return bool(group.members)


def _train_batched(members: Any, start_step: int, on_checkpoint: Callable[..., Any],
                   on_failure: Callable[..., Any], states: Any) -> Any:
    group = FusedGroup(members)
    first = members[0]
    for step in range(start_step, first.n_steps):
        started = time.time()
        values = group.train_step(step)
        if not accumulate_step(group, step, values, time.time() - started, on_failure):
            return []
        if first.is_checkpoint(step):
            failed = _checkpoint(group, step, on_checkpoint, on_failure, states)
            if failed:
                group.drop(failed)
    group.write_back()
    return group.members


def _checkpoint(group: Any, step: int, on_checkpoint: Callable[..., Any],
                on_failure: Callable[..., Any], states: Any) -> Any:
    group.write_back()
    logits = group.predict()
    failed = []
    for i, member in enumerate(group.members):
        try:
            with states[id(member)].active():   # its resume state keeps its own generators
                results = member.checkpoint(step, {k: v[i] for k, v in logits.items()})
            on_checkpoint(member, results)
        except Exception as e:   # e.g. its disk is full: this member stops alone
            on_failure(member, e)
            failed.append(i)
    return failed
