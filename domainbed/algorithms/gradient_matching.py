"""Agreement between the domains' gradients: Fish (inter-domain gradient matching by
sequential inner steps), AND-mask and SAND-mask (keep only gradient components whose sign
agrees across domains), IGA (penalize each domain's gradient deviation from the mean) and
Fishr (match the domains' per-example gradient variances), as DomainBed implements them."""
import copy
from collections import OrderedDict
from typing import Any

import torch
import torch.autograd as autograd
import torch.func
import torch.nn as nn
import torch.nn.functional as F

from domainbed import networks
from domainbed.algorithms.base import Algorithm
from domainbed.algorithms.common import choice, concat, log_uniform, uniform
from domainbed.algorithms.erm import ERM
from domainbed.algorithms.optimization import make_optimizer
from domainbed.hparams import Hparam
from domainbed.registry import register_algorithm


class WholeFish(nn.Module):
    """Featurizer and classifier in one `net` (DomainBed's networks.WholeFish names)."""

    def __init__(self, input_shape: tuple[int, ...], num_classes: int,
                 hparams: dict[str, Any]) -> None:
        super().__init__()
        featurizer = networks.Featurizer(input_shape, hparams)
        classifier = networks.Classifier(featurizer.n_outputs, num_classes,
                                         hparams["nonlinear_classifier"])
        self.net = nn.Sequential(featurizer, classifier)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


@register_algorithm("Fish")
class Fish(Algorithm):
    """Fish (Shi et al. 2022): a clone takes one Adam step per domain in sequence, then the
    weights move `meta_lr` of the way towards the clone's, which approximately maximizes the
    inner product of the domains' gradients. The clone's Adam state carries over between
    updates, as in DomainBed."""
    HPARAMS = {"meta_lr": choice(0.5, [0.05, 0.1, 0.5], "step towards the inner weights")}

    def __init__(self, input_shape: tuple[int, ...], num_classes: int, num_domains: int,
                 hparams: dict[str, Any]) -> None:
        super().__init__(input_shape, num_classes, num_domains, hparams)
        self.network = WholeFish(input_shape, num_classes, hparams)
        self.optimizer = make_optimizer(self.network.parameters(), hparams)
        self.optimizer_inner_state: Any = None

    def update(self, minibatches: list[tuple[torch.Tensor, ...]],
               unlabeled: list[torch.Tensor] | None = None) -> dict[str, float]:
        inner = copy.deepcopy(self.network)
        inner_opt = make_optimizer(inner.parameters(), self.hparams)
        if self.optimizer_inner_state is not None:
            inner_opt.load_state_dict(self.optimizer_inner_state)
        for x, y in minibatches:
            loss = F.cross_entropy(inner(x), y)
            inner_opt.zero_grad()
            loss.backward()
            inner_opt.step()
        self.optimizer_inner_state = inner_opt.state_dict()
        meta_lr = self.hparams["meta_lr"]
        inner_state = inner.state_dict()
        new_state = {k: v + meta_lr * (inner_state[k] - v)
                     for k, v in self.network.state_dict().items()}
        self.network.load_state_dict(new_state)
        return {"loss": loss.item()}

    def get_extra_state(self) -> dict[str, Any]:
        """The clone's Adam state (DomainBed keeps it outside state_dict; here it is saved
        with the model, so a resumed run continues exactly)."""
        return {"optimizer_inner_state": self.optimizer_inner_state}

    def set_extra_state(self, state: Any) -> None:
        self.optimizer_inner_state = state["optimizer_inner_state"]

    def predict(self, x: torch.Tensor) -> torch.Tensor:
        return self.network(x)


def per_domain_gradients(network: nn.Module, minibatches: list[tuple[torch.Tensor, ...]],
                         retain_graph: bool = False) -> tuple[Any, ...]:
    """For each parameter, the list of its gradients on each domain's risk; and the mean
    risk (a float)."""
    params = list(network.parameters())
    per_param: Any = [[] for _ in params]
    mean_loss = 0.0
    for x, y in minibatches:
        loss = F.cross_entropy(network(x), y)
        mean_loss += loss.item() / len(minibatches)
        for grads, g in zip(per_param, autograd.grad(loss, params, retain_graph=retain_graph)):
            grads.append(g)
    return per_param, mean_loss


def set_masked_mean_gradient(param: Any, grads: Any, mask: torch.Tensor) -> None:
    """param.grad = mask * mean gradient, rescaled by the fraction of the mask kept."""
    mask_t = mask.sum() / mask.numel()
    param.grad = mask * torch.mean(grads, dim=0)
    param.grad *= 1.0 / (1e-10 + mask_t)


@register_algorithm("ANDMask")
class ANDMask(ERM):
    """AND-mask (Parascandolo et al. 2021): average the domains' gradients, keeping only
    components whose sign agrees in at least a `tau` fraction (|mean sign| >= tau)."""
    HPARAMS = {"tau": uniform(1, 0.5, 1.0, "sign-agreement threshold")}

    def update(self, minibatches: list[tuple[torch.Tensor, ...]],
               unlabeled: list[torch.Tensor] | None = None) -> dict[str, float]:
        per_param, mean_loss = per_domain_gradients(self.network, minibatches)
        self.optimizer.zero_grad()
        for param, grads in zip(self.network.parameters(), per_param):
            grads = torch.stack(grads, dim=0)
            mask = (torch.mean(torch.sign(grads), dim=0).abs() >= self.hparams["tau"])
            set_masked_mean_gradient(param, grads, mask.to(torch.float32))
        self.optimizer.step()
        return {"loss": mean_loss}


@register_algorithm("SANDMask")
class SANDMask(ERM):
    """SAND-mask (Shahtalebi et al. 2021): a smooth mask in [0, 1],
    max(0, tanh(k * (|mean sign| - tau) / variance)), instead of AND-mask's hard one."""
    update_count: torch.Tensor
    HPARAMS = {
        "tau": uniform(1.0, 0.0, 1.0, "sign-agreement threshold"),
        "k": log_uniform(1e1, -3, 5, "steepness of the tanh mask"),
    }

    def __init__(self, input_shape: tuple[int, ...], num_classes: int, num_domains: int,
                 hparams: dict[str, Any]) -> None:
        super().__init__(input_shape, num_classes, num_domains, hparams)
        self.register_buffer("update_count", torch.tensor([0]))

    def update(self, minibatches: list[tuple[torch.Tensor, ...]],
               unlabeled: list[torch.Tensor] | None = None) -> dict[str, float]:
        per_param, mean_loss = per_domain_gradients(self.network, minibatches,
                                                    retain_graph=True)
        self.optimizer.zero_grad()
        for param, grads in zip(self.network.parameters(), per_param):
            grads = torch.stack(grads, dim=0)
            grads_var = grads.var(dim=0)
            grads_var[torch.isnan(grads_var)] = 1e-17
            lam = grads_var.pow(-1)
            mask = torch.tanh(self.hparams["k"] * lam *
                              (torch.abs(torch.sign(grads).mean(dim=0)) - self.hparams["tau"]))
            mask = torch.max(mask, torch.zeros_like(mask))
            mask[torch.isnan(mask)] = 1e-17
            set_masked_mean_gradient(param, grads, mask)
        self.optimizer.step()
        self.update_count += 1
        return {"loss": mean_loss}


@register_algorithm("IGA")
class IGA(ERM):
    """Inter-environmental Gradient Alignment (Koyama & Yamaguchi 2020): mean risk plus
    `penalty` times the summed squared deviation of each domain's gradient from the mean."""
    HPARAMS = {"penalty": log_uniform(1000, 1, 5, "weight of the gradient-variance penalty")}

    def update(self, minibatches: list[tuple[torch.Tensor, ...]],
               unlabeled: list[torch.Tensor] | None = None) -> dict[str, float]:
        params = list(self.network.parameters())
        total_loss: Any
        total_loss, grads = 0, []
        for x, y in minibatches:
            env_loss = F.cross_entropy(self.network(x), y)
            total_loss += env_loss
            grads.append(autograd.grad(env_loss, params, create_graph=True))
        mean_loss = total_loss / len(minibatches)
        mean_grad = autograd.grad(mean_loss, params, retain_graph=True)
        penalty: Any = 0
        for grad in grads:
            for g, mean_g in zip(grad, mean_grad):
                penalty += (g - mean_g).pow(2).sum()
        self.optimizer_step(mean_loss + self.hparams["penalty"] * penalty)
        return {"loss": mean_loss.item(), "penalty": penalty.item()}


class MovingAverage:
    """Exponential moving average of a dict of tensors, divided by (1 - ema) so gradients
    through it do not shrink with ema (DomainBed's misc.MovingAverage)."""

    def __init__(self, ema: Any) -> None:
        self.data: dict[Any, Any]
        self.ema, self.data, self.updates = ema, {}, 0

    def update(self, values: Any) -> dict[str, float]:
        out = {}
        for name, value in values.items():
            value = value.view(1, -1)
            previous = torch.zeros_like(value) if self.updates == 0 else self.data[name]
            averaged = self.ema * previous + (1 - self.ema) * value
            out[name] = averaged / (1 - self.ema)
            self.data[name] = averaged.clone().detach()
        self.updates += 1
        return out


def l2_between_dicts(dict_1: Any, dict_2: Any) -> Any:
    """Mean squared difference of two dicts of tensors, keys in sorted order."""
    keys = sorted(dict_1)
    return (torch.cat([dict_1[k].view(-1) for k in keys]) -
            torch.cat([dict_2[k].view(-1) for k in keys])).pow(2).mean()


def per_example_gradients(module: nn.Module, inputs: Any, y: torch.Tensor) -> Any:
    """{parameter name: (n, numel) per-example gradients of the cross-entropy}, differentiable
    with respect to the inputs and parameters (what backpack's BatchGrad gives DomainBed)."""
    params = dict(module.named_parameters())

    def loss(p: Any, x: torch.Tensor, t: Any) -> torch.Tensor:
        logits = torch.func.functional_call(module, p, (x.unsqueeze(0),))
        return F.cross_entropy(logits, t.unsqueeze(0))

    grads = torch.func.vmap(torch.func.grad(loss), in_dims=(None, 0, 0))(params, inputs, y)
    return OrderedDict((name, g.reshape(g.shape[0], -1)) for name, g in grads.items())


@register_algorithm("Fishr")
class Fishr(Algorithm):
    """Fishr (Rame et al. 2022): cross-entropy plus `lambda` times the distance between each
    domain's variance of per-example classifier gradients (EMA-smoothed) and their mean
    across domains; Adam is reset when the penalty switches on. Per-example gradients come
    from torch.func instead of backpack (the same numbers)."""
    update_count: torch.Tensor
    HPARAMS = {
        "lambda": log_uniform(1000.0, 1.0, 4.0, "weight of the gradient-variance penalty"),
        "penalty_anneal_iters": Hparam(1500, lambda r: int(r.uniform(0.0, 5000.0)),
                                       "steps before the penalty switches on",
                                       low=0, high=5000),
        "ema": uniform(0.95, 0.90, 0.99, "EMA of the gradient variances"),
    }

    def __init__(self, input_shape: tuple[int, ...], num_classes: int, num_domains: int,
                 hparams: dict[str, Any]) -> None:
        super().__init__(input_shape, num_classes, num_domains, hparams)
        self.num_domains = num_domains
        self.featurizer = networks.Featurizer(input_shape, hparams)
        self.classifier = networks.Classifier(self.featurizer.n_outputs, num_classes,
                                              hparams["nonlinear_classifier"])
        self.network = nn.Sequential(self.featurizer, self.classifier)
        self.register_buffer("update_count", torch.tensor([0]))
        self.ema_per_domain = [MovingAverage(hparams["ema"]) for _ in range(num_domains)]
        self.optimizer = self.new_optimizer()

    def new_optimizer(self) -> Any:
        return make_optimizer(
            list(self.featurizer.parameters()) + list(self.classifier.parameters()),
            self.hparams)

    def update(self, minibatches: list[tuple[torch.Tensor, ...]],
               unlabeled: list[torch.Tensor] | None = None) -> dict[str, float]:
        assert len(minibatches) == self.num_domains
        all_x, all_y = concat(minibatches)
        all_z = self.featurizer(all_x)
        all_logits = self.classifier(all_z)
        penalty = self.fishr_penalty(all_z, all_y, [x.shape[0] for x, _ in minibatches])
        all_nll = F.cross_entropy(all_logits, all_y)
        penalty_weight = 0
        anneal = self.hparams["penalty_anneal_iters"]
        if self.update_count >= anneal:
            penalty_weight = self.hparams["lambda"]
            if self.update_count == anneal != 0:
                self.optimizer = self.new_optimizer()
        self.update_count += 1
        objective = all_nll + penalty_weight * penalty
        self.optimizer.zero_grad()
        objective.backward()
        self.optimizer.step()
        return {"loss": objective.item(), "nll": all_nll.item(), "penalty": penalty.item()}

    def get_extra_state(self) -> dict[str, Any]:
        """The per-domain moving averages (outside state_dict in DomainBed)."""
        return {"ema": [{"data": m.data, "updates": m.updates} for m in self.ema_per_domain]}

    def set_extra_state(self, state: Any) -> None:
        for average, saved in zip(self.ema_per_domain, state["ema"]):
            average.data, average.updates = dict(saved["data"]), saved["updates"]

    def fishr_penalty(self, all_z: Any, all_y: Any, sizes: Any) -> Any:
        grads = per_example_gradients(self.classifier, all_z, all_y)
        variances: Any = [{} for _ in range(self.num_domains)]
        for name, g in grads.items():
            start = 0
            for d, size in enumerate(sizes):
                env = g[start:start + size]
                start += size
                variances[d][name] = (env - env.mean(dim=0, keepdim=True)).pow(2).mean(dim=0)
        variances = [ema.update(v) for ema, v in zip(self.ema_per_domain, variances)]
        mean_var = {name: torch.stack([v[name] for v in variances]).mean(dim=0)
                    for name in variances[0]}
        penalty = 0
        for v in variances:
            penalty += l2_between_dicts(v, mean_var)
        return penalty / self.num_domains

    def predict(self, x: torch.Tensor) -> torch.Tensor:
        return self.network(x)
