"""Feature-distribution alignment across training environments: MMD (Li et al. 2018) with a
multi-bandwidth Gaussian kernel, and Deep CORAL (Sun & Saenko 2016) as mean + covariance
matching, both as DomainBed implements them."""
from typing import Any

import torch
import torch.nn.functional as F

from domainbed.algorithms.base import FusedForm
from domainbed.algorithms.erm import ERM
from domainbed.hparams import Hparam
from domainbed.registry import register_algorithm

GAUSSIAN_GAMMAS = (0.001, 0.01, 0.1, 1, 10, 100, 1000)


def squared_distances(x1: torch.Tensor, x2: torch.Tensor) -> Any:
    """Pairwise squared Euclidean distances via the expanded form (cheap on GPU, and the same
    arithmetic as DomainBed), clamped away from 0 so the kernel's gradient stays finite."""
    x1_norm = x1.pow(2).sum(dim=-1, keepdim=True)
    x2_norm = x2.pow(2).sum(dim=-1, keepdim=True)
    d = torch.addmm(x2_norm.transpose(-2, -1), x1, x2.transpose(-2, -1), alpha=-2)
    return d.add_(x1_norm).clamp_min_(1e-30)


def gaussian_kernel(x: torch.Tensor, y: torch.Tensor,
                    gammas: Any = GAUSSIAN_GAMMAS) -> torch.Tensor:
    """Sum of exp(-gamma * |x - y|^2) over several bandwidths, so no single scale must fit."""
    d = squared_distances(x, y)
    k = torch.zeros_like(d)
    for gamma in gammas:
        k.add_(torch.exp(d.mul(-gamma)))
    return k


def mmd_gaussian(x: torch.Tensor, y: torch.Tensor, gammas: Any = GAUSSIAN_GAMMAS) -> Any:
    """Biased estimate of the squared MMD between the samples x and y."""
    kxx = gaussian_kernel(x, x, gammas).mean()
    kyy = gaussian_kernel(y, y, gammas).mean()
    kxy = gaussian_kernel(x, y, gammas).mean()
    return kxx + kyy - 2 * kxy


def mean_cov_distance(x: torch.Tensor, y: torch.Tensor) -> Any:
    """CORAL's discrepancy: mean squared difference of the means plus of the covariances."""
    mean_x, mean_y = x.mean(0, keepdim=True), y.mean(0, keepdim=True)
    cent_x, cent_y = x - mean_x, y - mean_y
    cov_x = (cent_x.t() @ cent_x) / (len(x) - 1)
    cov_y = (cent_y.t() @ cent_y) / (len(y) - 1)
    return (mean_x - mean_y).pow(2).mean() + (cov_x - cov_y).pow(2).mean()


def alignment_objective(discrepancy: Any) -> Any:
    """AbstractMMD.update with `discrepancy` as a pure function of one model (the fused
    launcher's form)."""
    def objective(model: Any, minibatches: list[tuple[torch.Tensor, ...]], hp: dict[str, Any],
                  state: Any) -> tuple[Any, ...]:
        n = len(minibatches)
        features = [model.featurize(x) for x, _ in minibatches]
        loss: Any
        loss, penalty = 0.0, torch.zeros((), device=features[0].device)
        for i in range(n):
            loss = loss + F.cross_entropy(model.classify(features[i]), minibatches[i][1])
            for j in range(i + 1, n):
                penalty = penalty + discrepancy(features[i], features[j])
        loss = loss / n
        if n > 1:
            penalty = penalty / (n * (n - 1) / 2)
        return (loss + hp["mmd_gamma"] * penalty, {"loss": loss, "penalty": penalty},
                state)
    return objective


class AbstractMMD(ERM):
    """ERM plus `mmd_gamma` times the average discrepancy between the features of every pair
    of training environments. Subclasses choose the discrepancy (gaussian or mean_cov)."""
    HPARAMS = {
        "mmd_gamma": Hparam(1.0, lambda r: 10 ** r.uniform(-1, 1), low=0.0),
    }

    def __init__(self, input_shape: tuple[int, ...], num_classes: int, num_domains: int,
                 hparams: dict[str, Any], gaussian: Any) -> None:
        super().__init__(input_shape, num_classes, num_domains, hparams)
        self.kernel_type = "gaussian" if gaussian else "mean_cov"

    def gaussian_kernel(self, x: torch.Tensor, y: torch.Tensor,
                        gamma: Any = GAUSSIAN_GAMMAS) -> torch.Tensor:
        return gaussian_kernel(x, y, gamma)

    def mmd(self, x: torch.Tensor, y: torch.Tensor) -> Any:
        if self.kernel_type == "gaussian":
            return mmd_gaussian(x, y)
        return mean_cov_distance(x, y)

    def update(self, minibatches: list[tuple[torch.Tensor, ...]],
               unlabeled: list[torch.Tensor] | None = None) -> dict[str, float]:
        values, _ = self.objective_update(alignment_objective(self.mmd), minibatches,
                                          ("mmd_gamma",))
        return values


@register_algorithm("MMD")
class MMD(AbstractMMD):
    """Match feature distributions with the multi-bandwidth Gaussian-kernel MMD."""
    FUSED = FusedForm(alignment_objective(mmd_gaussian), member_hparams=("mmd_gamma",))

    def __init__(self, input_shape: tuple[int, ...], num_classes: int, num_domains: int,
                 hparams: dict[str, Any]) -> None:
        super().__init__(input_shape, num_classes, num_domains, hparams, gaussian=True)


@register_algorithm("CORAL")
class CORAL(AbstractMMD):
    """Match feature means and covariances (Deep CORAL)."""
    FUSED = FusedForm(alignment_objective(mean_cov_distance), member_hparams=("mmd_gamma",))

    def __init__(self, input_shape: tuple[int, ...], num_classes: int, num_domains: int,
                 hparams: dict[str, Any]) -> None:
        super().__init__(input_shape, num_classes, num_domains, hparams, gaussian=False)
