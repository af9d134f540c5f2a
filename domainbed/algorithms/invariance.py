"""Invariance beyond IRM and VREx: information-bottleneck variants (IB_ERM, IB_IRM),
quantile risk (EQRM), risk-distribution matching (RDM) and causality-based invariant
representations (CausIRL_CORAL, CausIRL_MMD), as DomainBed implements them."""

from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from domainbed.algorithms.alignment import mean_cov_distance, mmd_gaussian
from domainbed.algorithms.common import choice, log_uniform, split_rows, uniform
from domainbed.algorithms.erm import ERM
from domainbed.algorithms.irm import irm_penalty
from domainbed.algorithms.optimization import make_optimizer
from domainbed.hparams import Hparam, by_dataset
from domainbed.registry import register_algorithm


def anneal_iters(default: int = 500) -> Any:
    return Hparam(default, lambda r: int(10 ** r.uniform(0, 4)),
                  "steps before the penalty weight switches", low=0, high=10 ** 4)


class InformationBottleneck(ERM):
    """ERM (optionally + IRM) plus `ib_lambda` times the mean per-domain feature variance,
    switched on after `ib_penalty_anneal_iters` steps (Ahuja et al. 2021); Adam is reset
    whenever a penalty switches on. `use_irm` adds IRMv1's penalty as IRM anneals it."""
    update_count: torch.Tensor
    use_irm = False

    def __init__(self, input_shape: tuple[int, ...], num_classes: int, num_domains: int,
                 hparams: dict[str, Any]) -> None:
        super().__init__(input_shape, num_classes, num_domains, hparams)
        self.register_buffer("update_count", torch.tensor([0]))

    def new_optimizer(self) -> Any:
        return make_optimizer(
            list(self.featurizer.parameters()) + list(self.classifier.parameters()),
            self.hparams)

    def update(self, minibatches: list[tuple[torch.Tensor, ...]],
               unlabeled: list[torch.Tensor] | None = None) -> dict[str, float]:
        h, count = self.hparams, self.update_count
        ib_weight = h["ib_lambda"] if count >= h["ib_penalty_anneal_iters"] else 0.0
        all_features = self.featurizer(torch.cat([x for x, _ in minibatches]))
        all_logits = self.classifier(all_features)
        nll: Any
        irm: Any
        ib: Any
        nll, irm, ib = 0.0, 0.0, 0.0
        for features, logits, (_, y) in zip(split_rows(all_features, minibatches),
                                            split_rows(all_logits, minibatches), minibatches):
            nll += F.cross_entropy(logits, y)
            if self.use_irm:
                irm += irm_penalty(logits, y)
            ib += features.var(dim=0).mean()
        n = len(minibatches)
        nll, irm, ib = nll / n, irm / n, ib / n
        loss = nll
        resets = count == h["ib_penalty_anneal_iters"]
        if self.use_irm:
            loss = loss + (h["irm_lambda"] if count >= h["irm_penalty_anneal_iters"]
                           else 1.0) * irm
            resets = resets or count == h["irm_penalty_anneal_iters"]
        loss = loss + ib_weight * ib
        if resets:
            self.optimizer = self.new_optimizer()
        self.optimizer_step(loss)
        self.update_count += 1
        # DomainBed adds the penalties to `nll` in place, so the `nll` it reports is the
        # whole loss; kept for comparable logs.
        out = {"loss": loss.item(), "nll": loss.item(), "IB_penalty": ib.item()}
        if self.use_irm:
            out["IRM_penalty"] = irm.item()
        return out


@register_algorithm("IB_ERM")
class IB_ERM(InformationBottleneck):
    """Information-bottleneck ERM (Ahuja et al. 2021)."""
    HPARAMS = {
        "ib_lambda": log_uniform(1e2, -1, 5, "weight of the feature-variance penalty"),
        "ib_penalty_anneal_iters": anneal_iters(),
    }


@register_algorithm("IB_IRM")
class IB_IRM(InformationBottleneck):
    """Information-bottleneck IRM (Ahuja et al. 2021)."""
    use_irm = True
    HPARAMS = {
        "irm_lambda": log_uniform(1e2, -1, 5, "weight of the IRMv1 penalty"),
        "irm_penalty_anneal_iters": anneal_iters(),
        "ib_lambda": log_uniform(1e2, -1, 5, "weight of the feature-variance penalty"),
        "ib_penalty_anneal_iters": anneal_iters(),
    }


# --- EQRM: the alpha-quantile of the domains' risks, from a Gaussian KDE ---------------

def kde_bandwidth(x: torch.Tensor) -> Any:
    """'Gauss-optimal' bandwidth 1.06 * std * n^(-1/5) of the sorted sample."""
    return 1.06 * torch.std(x, unbiased=True) * (len(x) ** -0.2)


def bisect_left(f: Any, value: Any, lo: Any, hi: Any, n_steps: int = 32) -> Any:
    """Continuous bisection for f(k) = value on [lo, hi] (f increasing); lo and hi may be
    tensors carrying gradients, which flow into the result as in DomainBed."""
    bounds = [lo, hi]
    k = 0.5 * sum(bounds)
    for _ in range(n_steps):
        bounds[int(f(k) > value)] = k
        next_k = 0.5 * sum(bounds)
        if next_k == k:
            break
        k = next_k
    return k


def kde_quantile(risks: Any, q: Any) -> Any:
    """The q-quantile of a Gaussian kernel density estimate over `risks` (EQRM's
    Nonparametric distribution in DomainBed's misc)."""
    data, _ = torch.sort(risks)
    bw = torch.ones(1, device=data.device) * kde_bandwidth(data)
    if not bw.item() > 0:  # identical risks: every quantile is that value (DomainBed fails)
        return data.mean()

    def cdf(x: torch.Tensor) -> Any:
        sigmas = torch.ones(len(data), device=data.device) * bw
        return torch.mean(torch.distributions.Normal(data, sigmas).cdf(x.repeat(len(data), 1).T))

    lo = torch.distributions.Normal(data[0], bw[0]).icdf(q)
    hi = torch.distributions.Normal(data[-1], bw[-1]).icdf(q)
    return bisect_left(cdf, q, lo, hi)


@register_algorithm("EQRM")
class EQRM(ERM):
    """Empirical Quantile Risk Minimization (Eastwood et al. 2022, Algorithm 1): after an
    ERM burn-in, minimize the `eqrm_quantile` quantile of the domain risks' KDE, with a
    fresh Adam at `eqrm_lr`. The quantile is float64 as in DomainBed (its alpha buffer)."""
    update_count: torch.Tensor
    alpha: torch.Tensor
    HPARAMS = {
        "eqrm_quantile": uniform(0.75, 0.5, 0.99, "risk quantile minimized"),
        "eqrm_burnin_iters": Hparam(2500, lambda r: 10 ** r.uniform(2.5, 3.5),
                                    "ERM steps before the quantile objective (a float when "
                                    "drawn, as DomainBed)", low=0, high=10 ** 3.5),
        "eqrm_lr": log_uniform(1e-6, -7, -5, "learning rate after the burn-in"),
    }

    def __init__(self, input_shape: tuple[int, ...], num_classes: int, num_domains: int,
                 hparams: dict[str, Any]) -> None:
        super().__init__(input_shape, num_classes, num_domains, hparams)
        self.register_buffer("update_count", torch.tensor([0]))
        self.register_buffer("alpha", torch.tensor(hparams["eqrm_quantile"],
                                                   dtype=torch.float64))

    def update(self, minibatches: list[tuple[torch.Tensor, ...]],
               unlabeled: list[torch.Tensor] | None = None) -> dict[str, float]:
        env_risks = torch.cat([F.cross_entropy(self.network(x), y).reshape(1)
                               for x, y in minibatches])
        burnin = self.hparams["eqrm_burnin_iters"]
        if self.update_count < burnin:
            loss = torch.mean(env_risks)
        else:
            loss = kde_quantile(env_risks, self.alpha)
        if self.update_count == burnin:
            self.optimizer = make_optimizer(self.network.parameters(), self.hparams,
                                            lr=self.hparams["eqrm_lr"])
        self.optimizer_step(loss)
        self.update_count += 1
        return {"loss": loss.item()}


# --- RDM: match the worst domain's loss distribution to the pooled one -----------------

RDM_GAMMAS = (0.0001, 0.001, 0.01, 0.1, 1, 10, 100, 1000)


@register_algorithm("RDM")
class RDM(ERM):
    """Risk Distribution Matching (Nguyen et al. 2024): mean risk plus, after an anneal
    period (with a fresh Adam at `rdm_lr`), the Gaussian-kernel MMD between the worst
    domain's per-example losses and all of them, and the variance of both."""
    update_count: torch.Tensor
    HPARAMS = {
        "rdm_lambda": by_dataset({
            ("DomainNet",): uniform(0.5, 0.1, 1.0),
            ("PACS", "TerraIncognita"): uniform(5.0, 1.0, 10.0),
            None: uniform(5.0, 0.1, 10.0)}),
        "rdm_penalty_anneal_iters": by_dataset({
            ("DomainNet",): Hparam(2400, lambda r: int(r.uniform(1500, 3000)),
                                   low=1500, high=3000),
            None: Hparam(1500, lambda r: int(r.uniform(800, 2700)), low=800, high=2700)}),
        "variance_weight": by_dataset({
            ("TerraIncognita", "OfficeHome", "DomainNet"): choice(0.0, [0.0]),
            None: uniform(0.004, 0.001, 0.007)}),
        "rdm_lr": uniform(1.5e-5, 8e-6, 2e-5, "learning rate after the anneal period"),
        "batch_size": lambda dataset_cls: (
            Hparam(64, lambda r: int(2 ** r.uniform(3, 9)), low=8, high=512)
            if getattr(dataset_cls, "SMALL_IMAGES", False) else by_dataset({
                ("DomainNet", "TerraIncognita"): Hparam(
                    40, lambda r: int(r.uniform(30, 60)), low=30, high=60),
                None: Hparam(88, lambda r: int(r.uniform(70, 100)), low=70, high=100),
            })(dataset_cls)),
    }

    def __init__(self, input_shape: tuple[int, ...], num_classes: int, num_domains: int,
                 hparams: dict[str, Any]) -> None:
        super().__init__(input_shape, num_classes, num_domains, hparams)
        self.register_buffer("update_count", torch.tensor([0]))

    def update(self, minibatches: list[tuple[torch.Tensor, ...]],
               unlabeled: list[torch.Tensor] | None = None) -> dict[str, float]:
        h = self.hparams
        on = self.update_count >= h["rdm_penalty_anneal_iters"]
        matching_weight = h["rdm_lambda"] if on else 0.0
        variance_weight = h["variance_weight"] if on else 0.0
        all_logits = self.predict(torch.cat([x for x, _ in minibatches]))
        losses = torch.zeros(len(minibatches), device=all_logits.device)
        per_example = []
        for i, (logits, (_, y)) in enumerate(zip(split_rows(all_logits, minibatches),
                                                 minibatches)):
            losses[i] = F.cross_entropy(logits, y)
            per_example.append(F.cross_entropy(logits, y, reduction="none").unsqueeze(0))
        erm_loss = losses.mean()
        all_confs = torch.squeeze(torch.cat(per_example, dim=0))
        worst = torch.flatten(all_confs[torch.argmax(torch.clone(losses))])
        pooled = torch.flatten(all_confs)
        matching = mmd_gaussian(worst.unsqueeze(1), pooled.unsqueeze(1), RDM_GAMMAS)
        variance = torch.var(pooled) + torch.var(worst)
        total = erm_loss + matching_weight * matching + variance_weight * variance
        if self.update_count == h["rdm_penalty_anneal_iters"]:
            self.optimizer = make_optimizer(self.network.parameters(), h, lr=h["rdm_lr"])
        self.optimizer_step(total)
        self.update_count += 1
        return {"update_count": float(self.update_count.item()), "total_loss": total.item(),
                "erm_loss": erm_loss.item(), "matching_penalty": matching.item(),
                "variance_penalty": variance.item(), "rdm_lambda": float(h["rdm_lambda"])}


class AbstractCausIRL(ERM):
    """Causality-inspired invariant representations (Chevalley et al. 2022): each domain's
    features are cut at a random point (numpy.random.randint); the pooled first and second
    parts are matched with MMD or CORAL's distance."""
    HPARAMS = {"mmd_gamma": log_uniform(1.0, -1, 1, "weight of the feature-matching penalty")}
    distance: Any = None

    def update(self, minibatches: list[tuple[torch.Tensor, ...]],
               unlabeled: list[torch.Tensor] | None = None) -> dict[str, float]:
        n = len(minibatches)
        features = [self.featurizer(x) for x, _ in minibatches]
        objective: Any
        first: Any
        second: Any
        objective, first, second = 0, [], []
        for f, (_, y) in zip(features, minibatches):
            objective += F.cross_entropy(self.classifier(f) + 1e-16, y)
            cut = np.random.randint(0, len(f))
            first.append(f[:cut])
            second.append(f[cut:])
        first, second = torch.cat(first), torch.cat(second)
        if len(first) > 1 and len(second) > 1:
            penalty = torch.nan_to_num(type(self).distance(first, second))
        else:
            penalty = torch.tensor(0)
        objective /= n
        self.optimizer_step(objective + self.hparams["mmd_gamma"] * penalty)
        return {"loss": objective.item(), "penalty": float(penalty.item())}


@register_algorithm("CausIRL_MMD")
class CausIRL_MMD(AbstractCausIRL):
    """CausIRL with the multi-bandwidth Gaussian MMD."""
    distance = staticmethod(mmd_gaussian)


@register_algorithm("CausIRL_CORAL")
class CausIRL_CORAL(AbstractCausIRL):
    """CausIRL with CORAL's mean and covariance distance."""
    distance = staticmethod(mean_cov_distance)


