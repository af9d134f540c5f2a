"""Contrastive domain bottlenecks: CAD and CondCAD (Ruan et al. 2022) remove domain
information from the representation, unconditionally or given the label, with a
supervised-contrastive loss, as DomainBed implements them."""
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F

from domainbed import networks
from domainbed.algorithms.base import Algorithm
from domainbed.algorithms.common import choice, concat, domain_labels, fixed
from domainbed.algorithms.optimization import make_optimizer
from domainbed.registry import register_algorithm

BASE_TEMPERATURE = 0.07


def finite_mean(x: torch.Tensor) -> Any:
    """Mean over the finite entries of a 1-D tensor (0 when there are none)."""
    finite = torch.isfinite(x)
    num_finite = finite.float().sum()
    total = torch.where(finite, x, torch.tensor(0.0).to(x)).sum()
    if num_finite == 0:
        return torch.tensor(0.0).to(x)
    return total / num_finite


def contrastive_domain_loss(z: torch.Tensor, y: torch.Tensor, domains: torch.Tensor,
                            temperature: Any, conditional: Any, flipped: Any) -> Any:
    """CAD's bottleneck loss. Flipped (default): maximize the log-probability that an
    example's contrastive neighbours come from other domains (given the same label when
    conditional); otherwise minimize that they come from its own domain."""
    n = z.shape[0]
    y, domains = y.contiguous().view(-1, 1), domains.contiguous().view(-1, 1)
    mask_drop = ~torch.eye(n, dtype=torch.bool, device=z.device)
    mask_y = torch.eq(y, y.T) & mask_drop
    mask_d = torch.eq(domains, domains.T)
    mask_y_n_d, mask_y_d = mask_y & ~mask_d, mask_y & mask_d
    mask_y, mask_drop = mask_y.float(), mask_drop.float()
    mask_y_n_d, mask_y_d = mask_y_n_d.float(), mask_y_d.float()
    logits = (z @ z.T) / temperature * mask_drop
    logits = logits - torch.max(logits, dim=1, keepdim=True)[0].detach()
    scale = temperature / BASE_TEMPERATURE
    if not conditional:
        log_prob = logits - torch.logsumexp(logits + mask_drop.log(), dim=1, keepdim=True)
        valid = mask_y.sum(1) > 0
        log_prob, mask_d = log_prob[valid], mask_d[valid]
        if flipped:
            loss = -scale * torch.logsumexp(log_prob + (~mask_d).float().log(), dim=1)
        else:
            loss = scale * torch.logsumexp(log_prob + mask_d.float().log(), dim=1)
    else:
        valid = (mask_y_n_d if flipped else mask_y_d).sum(1) > 0
        mask_y, mask_y_d, mask_y_n_d = mask_y[valid], mask_y_d[valid], mask_y_n_d[valid]
        logits = logits[valid]
        log_prob_y = logits - torch.logsumexp(logits + mask_y.log(), dim=1, keepdim=True)
        if flipped:
            loss = -scale * torch.logsumexp(log_prob_y + mask_y_n_d.log(), dim=1)
        else:
            loss = scale * torch.logsumexp(log_prob_y + mask_y_d.log(), dim=1)
    return finite_mean(loss)


class AbstractCAD(Algorithm):
    """Cross-entropy plus `lmbda` times the contrastive domain-bottleneck loss on the
    (optionally projected and normalized) features. DomainBed's projection head refers to an
    undefined size; here it is sized by the featurizer (it is off by default anyway)."""
    HPARAMS = {
        "lmbda": choice(1e-1, [1e-4, 1e-3, 1e-2, 1e-1, 1, 1e1, 1e2], "bottleneck weight"),
        "temperature": choice(0.1, [0.05, 0.1], "contrastive temperature"),
        "is_normalized": fixed(False, "L2-normalize features in the loss"),
        "is_project": fixed(False, "apply a projection head in the loss"),
        "is_flipped": fixed(True, "maximize -log(1-p) instead of minimizing log p"),
    }
    conditional = False

    def __init__(self, input_shape: tuple[int, ...], num_classes: int, num_domains: int,
                 hparams: dict[str, Any]) -> None:
        super().__init__(input_shape, num_classes, num_domains, hparams)
        self.featurizer = networks.Featurizer(input_shape, hparams)
        self.classifier = networks.Classifier(self.featurizer.n_outputs, num_classes,
                                              hparams["nonlinear_classifier"])
        params = list(self.featurizer.parameters()) + list(self.classifier.parameters())
        if hparams["is_project"]:
            n = self.featurizer.n_outputs
            self.project = nn.Sequential(nn.Linear(n, n), nn.ReLU(inplace=True),
                                         nn.Linear(n, 128))
            params += list(self.project.parameters())
        self.optimizer = make_optimizer(params, hparams)

    def bn_loss(self, z: torch.Tensor, y: torch.Tensor, dom_labels: Any) -> Any:
        if self.hparams["is_project"]:
            z = self.project(z)
        if self.hparams["is_normalized"]:
            z = F.normalize(z, dim=1)
        return contrastive_domain_loss(z, y, dom_labels, self.hparams["temperature"],
                                       self.conditional, self.hparams["is_flipped"])

    def update(self, minibatches: list[tuple[torch.Tensor, ...]],
               unlabeled: list[torch.Tensor] | None = None) -> dict[str, float]:
        all_x, all_y = concat(minibatches)
        all_z = self.featurizer(all_x)
        bn_loss = self.bn_loss(all_z, all_y, domain_labels(minibatches))
        clf_loss = F.cross_entropy(self.classifier(all_z), all_y)
        total_loss = clf_loss + self.hparams["lmbda"] * bn_loss
        self.optimizer.zero_grad()
        total_loss.backward()
        self.optimizer.step()
        return {"clf_loss": clf_loss.item(), "bn_loss": bn_loss.item(),
                "total_loss": total_loss.item()}

    def predict(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.featurizer(x))


@register_algorithm("CAD")
class CAD(AbstractCAD):
    """Contrastive Adversarial Domain bottleneck: minimizes I(D; Z)."""


@register_algorithm("CondCAD")
class CondCAD(AbstractCAD):
    """Conditional CAD: minimizes I(D; Z | Y)."""
    conditional = True
