"""Transferability of predictors between training domains: TRM (transfer risk of
per-domain classifiers) and Transfer (a classifier near the main one that exposes the gap
between domain risks), as DomainBed implements them."""
import copy
from typing import Any

import torch
import torch.autograd as autograd
import torch.nn as nn
import torch.nn.functional as F

from domainbed import networks
from domainbed.algorithms.base import Algorithm
from domainbed.algorithms.common import choice, concat, fixed, log_uniform, uniform
from domainbed.algorithms.optimization import make_optimizer
from domainbed.hparams import Hparam
from domainbed.registry import register_algorithm


def hessian_vector_product(loss: torch.Tensor, weight: Any, v: Any) -> Any:
    first = nn.utils.parameters_to_vector(
        autograd.grad(loss, weight, retain_graph=True, create_graph=True, allow_unused=True))
    return nn.utils.parameters_to_vector(autograd.grad(first @ v, weight, create_graph=True))


def neumann_inverse_hvp(v: Any, model: Any, batch: Any, iterations: int = 10) -> Any:
    """TRM's Neumann-series estimate of H^-1 v for a linear model's cross-entropy on
    `batch`, stopped early when it diverges (|estimate| > 10). The in-place update of v
    also updates the first term of the estimate (they share storage), as in DomainBed."""
    v = v.detach()
    h_estimate = v
    for _ in range(iterations):
        loss = F.cross_entropy(model(batch[0].detach()), batch[1].detach())
        v -= hessian_vector_product(loss, model.weight, v)
        v = v.detach()
        h_estimate = (v + h_estimate).detach()
        if torch.max(abs(h_estimate)) > 10:
            break
    return h_estimate.detach()


@register_algorithm("TRM")
class TRM(Algorithm):
    """Transfer Risk Minimization (Xu & Jaakkola 2021): after `iters` ERM steps, per-domain
    linear heads (30 SGD steps each update) estimate how well one domain's predictor
    transfers to the others; the featurizer minimizes that transfer risk, with a gradient
    alignment term and GroupDRO-like weights `alpha` over domain pairs. Unlike DomainBed,
    the heads and alpha are in state_dict (so they are checkpointed)."""
    update_count: torch.Tensor
    alpha: torch.Tensor
    HPARAMS = {
        "cos_lambda": log_uniform(1e-4, -5, 0, "weight of the gradient-alignment term"),
        "iters": Hparam(200, lambda r: int(10 ** r.uniform(0, 4)), "ERM steps first",
                        low=0, high=10 ** 4),
        "groupdro_eta": log_uniform(1e-2, -3, -1, "step of the domain-pair weights"),
        "class_balanced": fixed(False, "copy the main head into the domain heads"),
    }

    def __init__(self, input_shape: tuple[int, ...], num_classes: int, num_domains: int,
                 hparams: dict[str, Any]) -> None:
        super().__init__(input_shape, num_classes, num_domains, hparams)
        self.register_buffer("update_count", torch.tensor([0]))
        self.num_domains = num_domains
        self.featurizer = networks.Featurizer(input_shape, hparams)
        n = self.featurizer.n_outputs
        self.classifier = nn.Linear(n, num_classes)
        self.clist = nn.ModuleList([nn.Linear(n, num_classes) for _ in range(num_domains + 1)])
        self.olist = [torch.optim.SGD(c.parameters(), lr=1e-1) for c in self.clist]
        self.optimizer_f = make_optimizer(self.featurizer.parameters(), hparams)
        self.optimizer_c = make_optimizer(self.classifier.parameters(), hparams)
        self.register_buffer("alpha", torch.ones((num_domains, num_domains)) -
                             torch.eye(num_domains))

    def fit_domain_heads(self, features: Any, minibatches: list[tuple[torch.Tensor, ...]]) -> None:
        for _ in range(30):
            loss: Any = 0.0
            for j, (f, (_, y)) in enumerate(zip(features, minibatches)):
                loss += F.cross_entropy(self.clist[j](f.detach()), y)
            for opt in self.olist:
                opt.zero_grad()
            loss.backward()
            for opt in self.olist:
                opt.step()

    def transfer_risk(self, features: Any, minibatches: list[tuple[torch.Tensor, ...]]) -> Any:
        loss_swap = 0.0
        ys = [y for _, y in minibatches]
        for q in range(len(minibatches)):
            head = self.clist[q]
            loss_q = F.cross_entropy(head(features[q]), ys[q])
            vec_grad_q = nn.utils.parameters_to_vector(
                autograd.grad(loss_q, head.weight, create_graph=True))  # type: ignore[arg-type]
            loss_p = [F.cross_entropy(head(features[i]), ys[i]) * self.alpha[q, i].data
                      if i != q else 0.0 for i in range(len(minibatches))]
            loss_p_sum = sum(loss_p)
            vec_grad_p = nn.utils.parameters_to_vector(
                autograd.grad(loss_p_sum, head.weight, create_graph=True)).detach()  # type: ignore[arg-type]
            vec_grad_p = neumann_inverse_hvp(vec_grad_p, head, (features[q], ys[q]))
            loss_swap += loss_p_sum - self.hparams["cos_lambda"] * (vec_grad_p @ vec_grad_q)
            for i in range(len(minibatches)):
                if i != q:
                    self.alpha[q, i] *= (self.hparams["groupdro_eta"] * loss_p[i].data).exp()  # type: ignore[union-attr]
        return loss_swap / len(minibatches)

    def update(self, minibatches: list[tuple[torch.Tensor, ...]],
               unlabeled: list[torch.Tensor] | None = None) -> dict[str, float]:
        transfer_on = self.update_count >= self.hparams["iters"]
        if transfer_on:
            if self.hparams["class_balanced"]:
                for head in self.clist:
                    head.weight.data = copy.deepcopy(self.classifier.weight.data)
            self.alpha /= self.alpha.sum(1, keepdim=True)
        self.featurizer.train()
        all_x, all_y = concat(minibatches)
        all_feature = self.featurizer(all_x)
        loss = F.cross_entropy(self.classifier(all_feature), all_y)
        total = loss
        if transfer_on:
            features = list(torch.split(all_feature, [x.shape[0] for x, _ in minibatches]))
            self.fit_domain_heads(features, minibatches)
            total = loss + self.transfer_risk(features, minibatches)
        nll = loss.item()
        self.optimizer_c.zero_grad()
        self.optimizer_f.zero_grad()
        total.backward()
        self.optimizer_f.step()
        self.optimizer_c.step()
        self.update_count += 1
        return {"nll": nll, "trm_loss": total.item() - nll}

    def predict(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.featurizer(x))


def classifier_distance(h1: Any, h2: Any) -> Any:
    """Euclidean (Frobenius) distance between two classifiers' parameters."""
    s1, s2 = h1.state_dict(), h2.state_dict()
    return torch.sqrt(sum(torch.norm(s1[k] - s2[k]) ** 2 for k in s1))


def project_into_ball(delta: Any, adv_h: Any, h: Any) -> Any:
    """Move adv_h's parameters onto the ball of radius delta around h's, if outside."""
    dist = classifier_distance(adv_h, h)
    if dist > delta:
        ratio = delta / dist
        for p_h, p_adv in zip(h.parameters(), adv_h.parameters()):
            p_adv.data = p_h + ratio * (p_adv - p_h)
    return adv_h


@register_algorithm("Transfer")
class Transfer(Algorithm):
    """Transfer (Zhang et al. 2021, Algorithm 1): ERM step, then a step reducing `t_lambda`
    times the gap between the largest and smallest domain risk of an adversarial classifier,
    which itself takes `d_steps_per_g` SGD steps to increase that gap while staying within
    `delta` of the main classifier. DomainBed's `update` is used (not `update_second`).
    With gda the main optimizer updates the adversarial classifier only (as DomainBed)."""
    update_count: torch.Tensor
    HPARAMS = {
        "t_lambda": log_uniform(1.0, -2, 1, "weight of the risk gap"),
        "delta": uniform(2.0, 0.1, 3.0, "radius of the adversary's ball"),
        "d_steps_per_g": choice(10, [1, 2, 5], "adversary steps per update"),
        "weight_decay_d": log_uniform(0.0, -6, -2, "unused (declared by DomainBed)"),
        "gda": choice(False, [True], "gradient descent-ascent variant"),
        "beta1": choice(0.5, [0.0, 0.5], "unused (declared by DomainBed)"),
        "lr_d": log_uniform(1e-3, -4.5, -2.5, "adversary's SGD learning rate"),
    }

    def __init__(self, input_shape: tuple[int, ...], num_classes: int, num_domains: int,
                 hparams: dict[str, Any]) -> None:
        super().__init__(input_shape, num_classes, num_domains, hparams)
        self.register_buffer("update_count", torch.tensor([0]))
        self.d_steps_per_g = hparams["d_steps_per_g"]
        self.featurizer = networks.Featurizer(input_shape, hparams)
        nonlinear = hparams["nonlinear_classifier"]
        self.classifier = networks.Classifier(self.featurizer.n_outputs, num_classes, nonlinear)
        self.adv_classifier = networks.Classifier(self.featurizer.n_outputs, num_classes,
                                                  nonlinear)
        self.adv_classifier.load_state_dict(self.classifier.state_dict())
        if hparams["gda"]:
            self.optimizer = torch.optim.SGD(self.adv_classifier.parameters(), lr=hparams["lr"])
        else:
            self.optimizer = make_optimizer(list(self.featurizer.parameters()) +
                                            list(self.classifier.parameters()), hparams)
        self.adv_opt = torch.optim.SGD(self.adv_classifier.parameters(), lr=hparams["lr_d"])

    def loss_gap(self, minibatches: list[tuple[torch.Tensor, ...]]) -> Any:
        """Largest minus smallest domain risk of the adversarial classifier."""
        losses = [F.cross_entropy(self.adv_classifier(self.featurizer(x)), y)
                  for x, y in minibatches]
        return max(losses, key=lambda t: t.item()) - min(losses, key=lambda t: t.item())

    def update(self, minibatches: list[tuple[torch.Tensor, ...]],
               unlabeled: list[torch.Tensor] | None = None) -> dict[str, float]:
        all_x, all_y = concat(minibatches)
        loss = F.cross_entropy(self.predict(all_x), all_y)
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()
        gap = self.hparams["t_lambda"] * self.loss_gap(minibatches)
        self.optimizer.zero_grad()
        gap.backward()
        self.optimizer.step()
        self.adv_classifier.load_state_dict(self.classifier.state_dict())
        for _ in range(self.d_steps_per_g):
            self.adv_opt.zero_grad()
            gap = -self.hparams["t_lambda"] * self.loss_gap(minibatches)
            gap.backward()
            self.adv_opt.step()
            self.adv_classifier = project_into_ball(self.hparams["delta"],
                                                    self.adv_classifier, self.classifier)
        return {"loss": loss.item(), "gap": -gap.item()}

    def predict(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.featurizer(x))
