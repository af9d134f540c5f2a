"""Meta-learning and context adaptation across domains: MLDG (first-order meta-learning
over domain splits), ARM (a context network adapts predictions to each batch) and MTL
(marginal transfer learning: features are paired with a domain embedding), as DomainBed
implements them."""
import copy
from itertools import cycle
from typing import Any

import torch
import torch.autograd as autograd
import torch.nn as nn
import torch.nn.functional as F

from domainbed import networks
from domainbed.algorithms.base import SMALL_IMAGES_BATCH_SIZE, Algorithm
from domainbed.algorithms.common import choice, log_uniform
from domainbed.algorithms.erm import ERM
from domainbed.algorithms.optimization import make_optimizer
from domainbed.hparams import Hparam, small_or_large
from domainbed.registry import register_algorithm
from oodutils.errors import UserError


def split_meta_train_test(minibatches: list[tuple[torch.Tensor, ...]],
                          num_meta_test: int = 1) -> Any:
    """Pairs (meta-train domain, meta-test domain) from a torch.randperm of the domains:
    the last `num_meta_test` are meta-test, cycled against the others."""
    n = len(minibatches)
    perm = torch.randperm(n).tolist()
    pairs = []
    for i, j in zip(perm[:(n - num_meta_test)], cycle(perm[-num_meta_test:])):
        (xi, yi), (xj, yj) = minibatches[i], minibatches[j]
        m = min(len(xi), len(xj))
        pairs.append(((xi[:m], yi[:m]), (xj[:m], yj[:m])))
    return pairs


@register_algorithm("MLDG")
class MLDG(ERM):
    """Meta-Learning for Domain Generalization (Li et al. 2018, Eq. 3), first-order as in
    DomainBed: the step uses G_i + beta * G_j, where G_j is the meta-test gradient taken at
    the parameters after one inner Adam step on the meta-train domain (no second
    derivatives). With n_meta_test equal to the number of domains nothing is meta-train and
    the update does nothing, as in DomainBed."""
    HPARAMS = {
        "mldg_beta": log_uniform(1.0, -1, 1, "weight of the meta-test loss"),
        "n_meta_test": choice(2, [1, 2], "number of meta-test domains per step"),
    }

    def update(self, minibatches: list[tuple[torch.Tensor, ...]],
               unlabeled: list[torch.Tensor] | None = None) -> dict[str, float]:
        num_mb = len(minibatches)
        beta = self.hparams["mldg_beta"]
        objective: Any = 0
        self.optimizer.zero_grad()
        for p in self.network.parameters():
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        for (xi, yi), (xj, yj) in split_meta_train_test(minibatches,
                                                        self.hparams["n_meta_test"]):
            inner_net = copy.deepcopy(self.network)
            inner_opt = make_optimizer(inner_net.parameters(), self.hparams)
            inner_obj = F.cross_entropy(inner_net(xi), yi)
            inner_opt.zero_grad()
            inner_obj.backward()
            inner_opt.step()
            for p_tgt, p_src in zip(self.network.parameters(), inner_net.parameters()):
                if p_src.grad is not None:
                    p_tgt.grad.data.add_(p_src.grad.data / num_mb)  # type: ignore[union-attr]
            objective += inner_obj.item()
            loss_inner_j = F.cross_entropy(inner_net(xj), yj)
            grad_inner_j = autograd.grad(loss_inner_j, inner_net.parameters(),  # type: ignore[call-overload]
                                         allow_unused=True)
            objective += (beta * loss_inner_j).item()
            for p, g_j in zip(self.network.parameters(), grad_inner_j):
                if g_j is not None:
                    p.grad.data.add_(beta * g_j.data / num_mb)  # type: ignore[union-attr]
        objective /= len(minibatches)
        self.optimizer.step()
        return {"loss": objective}


class ContextNet(nn.Module):
    """ARM's context network: three 5x5 convolutions keeping the spatial size, one output
    channel (DomainBed's networks.ContextNet, same parameter names)."""

    def __init__(self, input_shape: tuple[int, ...]) -> None:
        super().__init__()
        padding = (5 - 1) // 2
        self.context_net = nn.Sequential(
            nn.Conv2d(input_shape[0], 64, 5, padding=padding), nn.BatchNorm2d(64), nn.ReLU(),
            nn.Conv2d(64, 64, 5, padding=padding), nn.BatchNorm2d(64), nn.ReLU(),
            nn.Conv2d(64, 1, 5, padding=padding))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.context_net(x)


@register_algorithm("ARM")
class ARM(ERM):
    """Adaptive Risk Minimization (Zhang et al. 2021, ARM-CML): a context network summarizes
    each batch of `batch_size` examples (the support set) into one extra input channel.
    Needs image inputs (batch, channels, height, width), as in DomainBed."""
    NEEDS_IMAGES = True
    # DomainBed fixes ARM's support set at 8 images on every dataset but the MNIST-sized ones
    HPARAMS = {"batch_size": small_or_large(SMALL_IMAGES_BATCH_SIZE, Hparam(8, lambda r: 8, low=1))}

    def __init__(self, input_shape: tuple[int, ...], num_classes: int, num_domains: int,
                 hparams: dict[str, Any]) -> None:
        if len(input_shape) != 3:
            raise UserError("ARM needs image inputs (channels, height, width); "
                            f"got input shape {tuple(input_shape)}")
        original = tuple(input_shape)
        super().__init__((1 + original[0],) + original[1:], num_classes, num_domains, hparams)
        self.context_net = ContextNet(original)
        self.support_size = hparams["batch_size"]

    def predict(self, x: torch.Tensor) -> torch.Tensor:
        batch_size, _, h, w = x.shape
        if batch_size % self.support_size == 0:
            meta_batch_size, support_size = batch_size // self.support_size, self.support_size
        else:
            meta_batch_size, support_size = 1, batch_size
        context = self.context_net(x).reshape((meta_batch_size, support_size, 1, h, w))
        context = torch.repeat_interleave(context.mean(dim=1), repeats=support_size, dim=0)
        return self.network(torch.cat([x, context], dim=1))


@register_algorithm("MTL")
class MTL(Algorithm):
    """Marginal Transfer Learning (Blanchard et al. 2021), neural version: the classifier
    sees the features and a per-domain embedding (an EMA of the domain's mean feature).

    As DomainBed: `predict` overwrites that embedding with standard normal noise
    (`.normal_()`), so it draws from torch's global generator at every call."""
    embeddings: torch.Tensor
    HPARAMS = {"mtl_ema": choice(0.99, [0.5, 0.9, 0.99, 1.0], "EMA of domain embeddings")}

    def __init__(self, input_shape: tuple[int, ...], num_classes: int, num_domains: int,
                 hparams: dict[str, Any]) -> None:
        super().__init__(input_shape, num_classes, num_domains, hparams)
        self.featurizer = networks.Featurizer(input_shape, hparams)
        self.classifier = networks.Classifier(self.featurizer.n_outputs * 2, num_classes,
                                              hparams["nonlinear_classifier"])
        self.optimizer = make_optimizer(list(self.featurizer.parameters()) +
                                        list(self.classifier.parameters()), hparams)
        self.register_buffer("embeddings", torch.zeros(num_domains, self.featurizer.n_outputs))
        self.ema = hparams["mtl_ema"]

    def update(self, minibatches: list[tuple[torch.Tensor, ...]],
               unlabeled: list[torch.Tensor] | None = None) -> dict[str, float]:
        loss: Any = 0
        for env, (x, y) in enumerate(minibatches):
            loss += F.cross_entropy(self.predict(x, env), y)
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()
        return {"loss": loss.item()}

    def update_embeddings_(self, features: torch.Tensor, env: Any = None) -> Any:
        embedding = features.mean(0)
        if env is not None:
            embedding = self.ema * embedding + (1 - self.ema) * self.embeddings[env]
            self.embeddings[env] = embedding.clone().detach()
        return embedding.view(1, -1).repeat(len(features), 1)

    def predict(self, x: torch.Tensor, env: Any = None) -> torch.Tensor:
        features = self.featurizer(x)
        embedding = self.update_embeddings_(features, env).normal_()
        return self.classifier(torch.cat((features, embedding), 1))
