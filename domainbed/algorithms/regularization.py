"""ERM with a regularizer or a training recipe on top: Spectral Decoupling (SD),
Representation Self-Challenging (RSC) and ERM++ (linear probing first, then full training
with a moving-average model), as DomainBed implements them."""
import copy
from typing import Any

import numpy as np
import torch
import torch.autograd as autograd
import torch.nn as nn
import torch.nn.functional as F

from domainbed import networks
from domainbed.algorithms.base import Algorithm
from domainbed.algorithms.common import concat, fixed, log_uniform, uniform
from domainbed.algorithms.erm import ERM
from domainbed.algorithms.optimization import make_optimizer
from domainbed.registry import register_algorithm


@register_algorithm("SD")
class SD(ERM):
    """Spectral Decoupling (Pezeshki et al. 2021, Eq. 25): cross-entropy plus `sd_reg`
    times the mean squared logit, against gradient starvation."""
    HPARAMS = {"sd_reg": log_uniform(0.1, -5, -1, "weight of the squared-logit penalty")}

    def update(self, minibatches: list[tuple[torch.Tensor, ...]],
               unlabeled: list[torch.Tensor] | None = None) -> dict[str, float]:
        all_x, all_y = concat(minibatches)
        all_p = self.predict(all_x)
        loss = F.cross_entropy(all_p, all_y)
        penalty = (all_p ** 2).mean()
        self.optimizer_step(loss + self.hparams["sd_reg"] * penalty)
        return {"loss": loss.item(), "penalty": penalty.item()}


@register_algorithm("RSC")
class RSC(ERM):
    """Representation Self-Challenging (Huang et al. 2020): mute the feature dimensions with
    the largest gradient of the true-class logit (top `1 - rsc_f_drop_factor` percentile per
    example), but only for the examples whose confidence drops most (top
    `1 - rsc_b_drop_factor` percentile of the batch), and train on the muted features."""
    HPARAMS = {
        "rsc_f_drop_factor": uniform(1 / 3, 0, 0.5, "fraction of features muted"),
        "rsc_b_drop_factor": uniform(1 / 3, 0, 0.5, "fraction of examples challenged"),
    }

    def __init__(self, input_shape: tuple[int, ...], num_classes: int, num_domains: int,
                 hparams: dict[str, Any]) -> None:
        super().__init__(input_shape, num_classes, num_domains, hparams)
        self.drop_f = (1 - hparams["rsc_f_drop_factor"]) * 100
        self.drop_b = (1 - hparams["rsc_b_drop_factor"]) * 100
        self.num_classes = num_classes

    def update(self, minibatches: list[tuple[torch.Tensor, ...]],
               unlabeled: list[torch.Tensor] | None = None) -> dict[str, float]:
        all_x, all_y = concat(minibatches)
        all_o = F.one_hot(all_y, self.num_classes)
        all_f = self.featurizer(all_x)
        all_p = self.classifier(all_f)
        all_g = autograd.grad((all_p * all_o).sum(), all_f)[0]
        percentiles = torch.Tensor(np.percentile(all_g.detach().cpu(), self.drop_f, axis=1))
        percentiles = percentiles.unsqueeze(1).repeat(1, all_g.size(1)).to(all_g.device)
        mask_f = all_g.lt(percentiles).float()
        all_p_muted = self.classifier(all_f * mask_f)
        changes = ((F.softmax(all_p, dim=1) * all_o).sum(1) -
                   (F.softmax(all_p_muted, dim=1) * all_o).sum(1))
        percentile = np.percentile(changes.detach().cpu(), self.drop_b)
        mask_b = changes.lt(percentile).float().view(-1, 1)
        mask = torch.logical_or(mask_f, mask_b).float()
        loss = F.cross_entropy(self.classifier(all_f * mask), all_y)
        self.optimizer_step(loss)
        return {"loss": loss.item()}


class LARS(torch.optim.Optimizer):
    """LARS (You et al. 2017) as in MoCo v3 / DomainBed: momentum SGD whose step for each
    weight matrix is scaled by trust * |w| / |update|; no scaling for vectors."""

    def __init__(self, params: Any, lr: float = 0, weight_decay: float = 0, momentum: float = 0.9,
                 trust_coefficient: float = 0.001) -> None:
        super().__init__(params, dict(lr=lr, weight_decay=weight_decay, momentum=momentum,
                                      trust_coefficient=trust_coefficient))

    @torch.no_grad()
    def step(self, closure: Any = None) -> None:  # type: ignore[override]
        for g in self.param_groups:
            for p in g["params"]:
                dp = p.grad
                if dp is None:
                    continue
                if p.ndim > 1:
                    dp = dp.add(p, alpha=g["weight_decay"])
                    param_norm, update_norm = torch.norm(p), torch.norm(dp)
                    one = torch.ones_like(param_norm)
                    q = torch.where(param_norm > 0.0, torch.where(
                        update_norm > 0, g["trust_coefficient"] * param_norm / update_norm, one),
                        one)
                    dp = dp.mul(q)
                mu = self.state[p].setdefault("mu", torch.zeros_like(p))
                mu.mul_(g["momentum"]).add_(dp)
                p.add_(mu, alpha=-g["lr"])


SMA_START_ITER = 600  # hard-coded in DomainBed


@register_algorithm("ERMPlusPlus")
class ERMPlusPlus(Algorithm):
    """ERM++ (Teterwak et al. 2023) as DomainBed runs it: for the first `linear_steps`
    updates only the classifier trains (at `linear_lr`), then the whole network; predictions
    come from `network_sma`, a copy of the network that becomes a simple moving average
    from step 600. DomainBed's validation-loss learning-rate schedule (`set_lr`, called by
    its own training script) is not part of `update` and is not ported."""
    global_iter: torch.Tensor
    sma_count: torch.Tensor
    HPARAMS = {
        "linear_lr": log_uniform(5e-5, -5, -3.5, "learning rate of the linear-probe phase"),
        "linear_steps": fixed(500, "classifier-only steps first"),
        "lars": fixed(False, "use the LARS optimizer instead of Adam"),
        "freeze_bn": fixed(False, "keep batch-norm statistics of the averaged model"),
    }

    def __init__(self, input_shape: tuple[int, ...], num_classes: int, num_domains: int,
                 hparams: dict[str, Any]) -> None:
        super().__init__(input_shape, num_classes, num_domains, hparams)
        self.featurizer = networks.Featurizer(input_shape, hparams)
        self.classifier = networks.Classifier(self.featurizer.n_outputs, num_classes,
                                              hparams["nonlinear_classifier"])
        self.network = nn.Sequential(self.featurizer, self.classifier)
        self.optimizer = self.make_optimizer(self.network.parameters(), hparams["lr"])
        self.linear_optimizer = self.make_optimizer(self.network[1].parameters(),
                                                    hparams["linear_lr"])
        self.network_sma = copy.deepcopy(self.network)
        self.network_sma.eval()
        self.register_buffer("global_iter", torch.tensor([0]))
        self.register_buffer("sma_count", torch.tensor([0]))

    def make_optimizer(self, params: Any, lr: Any) -> Any:
        if self.hparams["lars"]:
            return LARS(params, lr=lr, weight_decay=self.hparams["weight_decay"])
        return make_optimizer(params, self.hparams, lr=lr, foreach=False)

    def update_sma(self) -> None:
        self.global_iter += 1
        sma_state = self.network_sma.state_dict()
        new_state = {}
        averaging = int(self.global_iter) >= SMA_START_ITER
        if averaging:
            self.sma_count += 1
        count = int(self.sma_count)
        for name, param in self.network.state_dict().items():
            if "num_batches_tracked" in name:
                continue
            param = param.detach().clone()
            new_state[name] = ((sma_state[name].detach().clone() * count + param) / (1.0 + count)
                               if averaging else param)
        self.network_sma.load_state_dict(new_state, strict=False)

    def update(self, minibatches: list[tuple[torch.Tensor, ...]],
               unlabeled: list[torch.Tensor] | None = None) -> dict[str, float]:
        full = int(self.global_iter) > self.hparams["linear_steps"]
        optimizer = self.optimizer if full else self.linear_optimizer
        all_x, all_y = concat(minibatches)
        loss = F.cross_entropy(self.network(all_x), all_y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        self.update_sma()
        if not self.hparams["freeze_bn"]:
            self.network_sma.train()
            self.network_sma(all_x)
        return {"loss": loss.item()}

    def predict(self, x: torch.Tensor) -> torch.Tensor:
        self.network_sma.eval()
        return self.network_sma(x)
