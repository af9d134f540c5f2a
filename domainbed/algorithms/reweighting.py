"""Reweighting and resampling over (label, attribute) groups, from SubpopBench (Yang et al.
2023): GroupDRO over groups, ReWeight, SqrtReWeight, CBLoss, ReSample, CVaRDRO and LfF.

These take DomainBed's pooled-ERM step (concatenated training environments, the run's Adam
optimizer) and change only what SubpopBench changes: the loss or the sampling. Group index
convention (all datasets here): group = label * num_attributes + attribute.
"""
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F

from domainbed import networks
from domainbed.algorithms.base import Algorithm, require_groups
from domainbed.algorithms.common import concat, log_uniform, uniform
from domainbed.algorithms.erm import ERM
from domainbed.algorithms.optimization import make_optimizer
from domainbed.hparams import Hparam
from domainbed.registry import register_algorithm
from oodutils.errors import UserError


def training_group_sizes(name: str, context: Any) -> Any:
    """Examples per group over the pooled training in-splits (SubpopBench's grp_sizes)."""
    groups = torch.cat(require_groups(name, context.train_splits))
    num_groups = context.num_groups or int(groups.max()) + 1
    return torch.bincount(groups, minlength=num_groups).double()


def normalized(weights: torch.Tensor) -> Any:
    """Weights rescaled to sum to their count (empty groups get weight 0)."""
    weights = torch.where(torch.isfinite(weights), weights, torch.zeros_like(weights))
    return (weights / weights.sum() * len(weights)).float()


class GroupWeightedERM(ERM):
    """ERM whose per-example losses are multiplied by a weight per group, computed from the
    training group sizes in `prepare` (a non-persistent buffer: recomputed on resume)."""
    weights_per_group: torch.Tensor
    NEEDS_GROUPS = True
    HPARAMS = {}

    def __init__(self, input_shape: tuple[int, ...], num_classes: int, num_domains: int,
                 hparams: dict[str, Any]) -> None:
        super().__init__(input_shape, num_classes, num_domains, hparams)
        self.register_buffer("weights_per_group", torch.ones(0), persistent=False)

    def prepare(self, context: Any) -> None:
        sizes = training_group_sizes(self.registry_name, context)
        self.weights_per_group = self.group_weights(sizes).to(context.device)

    def group_weights(self, sizes: Any) -> Any:
        return normalized(1.0 / sizes)

    def update(self, minibatches: list[tuple[torch.Tensor, ...]],
               unlabeled: list[torch.Tensor] | None = None, groups: Any = None) -> dict[str, float]:
        if groups is None or not len(self.weights_per_group):
            raise UserError(f"{self.registry_name} needs prepare() and per-batch groups")
        all_x, all_y = concat(minibatches)
        losses = F.cross_entropy(self.predict(all_x), all_y, reduction="none")
        loss = (self.weights_per_group.type_as(losses)[torch.cat(groups)] * losses).mean()
        self.optimizer_step(loss)
        return {"loss": loss.item()}


@register_algorithm("ReWeight")
class ReWeight(GroupWeightedERM):
    """Inverse group-frequency loss weights (normalized to average 1 over groups)."""
    DATA_PARALLEL = True   # a mean over examples: splits across processes (--distributed)


@register_algorithm("SqrtReWeight")
class SqrtReWeight(GroupWeightedERM):
    """Inverse square-root group-frequency loss weights."""
    DATA_PARALLEL = True   # a mean over examples: splits across processes (--distributed)

    def group_weights(self, sizes: Any) -> Any:
        return normalized(1.0 / sizes.sqrt())


@register_algorithm("CBLoss")
class CBLoss(GroupWeightedERM):
    """Class-balanced loss (Cui et al. 2019) over groups: weights (1 - beta) / (1 - beta^n)
    for a group of n examples."""
    DATA_PARALLEL = True   # a mean over examples: splits across processes (--distributed)
    HPARAMS = {"beta": Hparam(0.9999, lambda r: 1 - 10 ** r.uniform(-5, -2),
                              "effective-number decay", low=0.99, high=0.99999)}

    def group_weights(self, sizes: Any) -> Any:
        beta = self.hparams["beta"]
        effective = 1.0 - torch.pow(torch.tensor(beta, dtype=torch.float64), sizes)
        effective[effective == 1] = float("inf")
        return normalized((1.0 - beta) / effective)


@register_algorithm("ReSample")
class ReSample(ERM):
    """ERM on group-balanced minibatches (each example drawn with probability inversely
    proportional to its group's size). Same training as ReweightedERM, but it needs group
    annotations (ReweightedERM falls back to class balancing)."""
    DATA_PARALLEL = True   # a mean over examples: splits across processes (--distributed)
    NEEDS_GROUPS = True
    HPARAMS = {"group_balanced": Hparam(True, lambda r: True, choices=(True,))}

    def prepare(self, context: Any) -> None:
        require_groups(self.registry_name, context.train_splits)

    def update(self, minibatches: list[tuple[torch.Tensor, ...]],
               unlabeled: list[torch.Tensor] | None = None, groups: Any = None) -> dict[str, float]:
        return super().update(minibatches, unlabeled)


@register_algorithm("SubpopGroupDRO")
class SubpopGroupDRO(ERM):
    """GroupDRO as SubpopBench runs it: the worst-case weights q range over (label,
    attribute) groups of the pooled batch, not over training domains (that is DomainBed's
    `GroupDRO`). q_g *= exp(eta * mean loss of g) for groups present in the batch."""
    q: torch.Tensor
    NEEDS_GROUPS = True
    HPARAMS = {"groupdro_eta": log_uniform(1e-2, -3, -1, "step of the group weights")}

    def __init__(self, input_shape: tuple[int, ...], num_classes: int, num_domains: int,
                 hparams: dict[str, Any]) -> None:
        super().__init__(input_shape, num_classes, num_domains, hparams)
        self.register_buffer("q", torch.ones(0))

    def prepare(self, context: Any) -> None:
        num_groups = len(training_group_sizes(self.registry_name, context))
        if len(self.q) != num_groups:
            self.q = torch.ones(num_groups, device=context.device)

    def _load_from_state_dict(self, state_dict: Any, prefix: str, *args: Any,
                              **kwargs: Any) -> None:
        saved = state_dict.get(prefix + "q")
        if saved is not None and saved.shape != self.q.shape:
            self.q = torch.empty_like(saved, device=self.q.device)
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def update(self, minibatches: list[tuple[torch.Tensor, ...]],
               unlabeled: list[torch.Tensor] | None = None, groups: Any = None) -> dict[str, float]:
        if groups is None or not len(self.q):
            raise UserError("SubpopGroupDRO needs prepare() and per-batch groups")
        all_x, all_y = concat(minibatches)
        all_g = torch.cat(groups)
        losses = F.cross_entropy(self.predict(all_x), all_y, reduction="none")
        present = all_g.unique()
        group_losses = [losses[all_g == g].mean() for g in present]
        for g, group_loss in zip(present, group_losses):
            self.q[g] *= (self.hparams["groupdro_eta"] * group_loss.detach()).exp()
        self.q /= self.q.sum()
        loss: Any = sum(self.q[g] * group_loss for g, group_loss in zip(present, group_losses))
        self.optimizer_step(loss)
        return {"loss": loss.item()}


def cvar_weights(losses: Any, alpha: Any) -> Any:
    """The CVaR_alpha best response (no regularization): weight 1/(alpha n) on the
    floor(alpha n) largest losses, the leftover mass on the next one, 0 elsewhere."""
    n = losses.shape[0]
    cutoff = int(alpha * n)
    surplus = 1.0 - cutoff / (alpha * n)
    weights = torch.zeros_like(losses)
    order = torch.argsort(losses, descending=True)
    weights[order[:cutoff]] = 1.0 / (alpha * n)
    if cutoff < n:
        weights[order[cutoff]] = surplus
    return weights


@register_algorithm("CVaRDRO")
class CVaRDRO(ERM):
    """DRO over a CVaR uncertainty set (Levy et al. 2020): the average of the worst
    `joint_dro_alpha` fraction of per-example losses (weights computed without gradient)."""
    HPARAMS = {"joint_dro_alpha": log_uniform(0.1, -2, 0, "fraction of worst examples")}

    def update(self, minibatches: list[tuple[torch.Tensor, ...]],
               unlabeled: list[torch.Tensor] | None = None) -> dict[str, float]:
        all_x, all_y = concat(minibatches)
        losses = F.cross_entropy(self.predict(all_x), all_y, reduction="none")
        with torch.no_grad():
            weights = cvar_weights(losses, self.hparams["joint_dro_alpha"])
        loss = torch.dot(weights, losses)
        self.optimizer_step(loss)
        return {"loss": loss.item()}


def generalized_cross_entropy(logits: torch.Tensor, targets: torch.Tensor, q: Any) -> Any:
    """GCE as in LfF's code: cross-entropy scaled by q * p_y^q (p_y detached); its gradient
    is q times that of the GCE (1 - p_y^q) / q, so it emphasizes examples the model finds
    easy."""
    p_y = torch.gather(F.softmax(logits, dim=1), 1, targets.unsqueeze(1)).squeeze(1)
    return F.cross_entropy(logits, targets, reduction="none") * p_y.detach() ** q * q


@register_algorithm("LfF")
class LfF(Algorithm):
    """Learning from Failure (Nam et al. 2020), as SubpopBench: a biased network trained
    with the generalized cross-entropy (amplifying the easy, spurious cue) and a debiased
    predictor trained with per-example weights ce_b / (ce_b + ce_d). Both use the run's Adam
    (SubpopBench uses SGD); SubpopBench's default batch size for LfF is halved."""
    HPARAMS = {"LfF_q": uniform(0.7, 0.05, 0.95, "GCE exponent q")}

    def __init__(self, input_shape: tuple[int, ...], num_classes: int, num_domains: int,
                 hparams: dict[str, Any]) -> None:
        super().__init__(input_shape, num_classes, num_domains, hparams)
        self.pred_model = ERM(input_shape, num_classes, num_domains, hparams)
        self.optimizer = self.pred_model.optimizer  # top level, so resume states include it
        featurizer = networks.Featurizer(input_shape, hparams)
        self.biased_network = nn.Sequential(featurizer, networks.Classifier(
            featurizer.n_outputs, num_classes, hparams["nonlinear_classifier"]))
        self.optimizer_b = make_optimizer(self.biased_network.parameters(), hparams)

    def update(self, minibatches: list[tuple[torch.Tensor, ...]],
               unlabeled: list[torch.Tensor] | None = None) -> dict[str, float]:
        all_x, all_y = concat(minibatches)
        pred_logits = self.pred_model.predict(all_x)
        biased_logits = self.biased_network(all_x)
        loss_gce = generalized_cross_entropy(biased_logits, all_y, self.hparams["LfF_q"])
        ce_b = F.cross_entropy(biased_logits, all_y, reduction="none")
        ce_d = F.cross_entropy(pred_logits, all_y, reduction="none")
        weights = (ce_b / (ce_b + ce_d + 1e-8)).detach()
        self.optimizer_b.zero_grad()
        self.optimizer.zero_grad()
        loss_pred = (ce_d * weights).mean()
        loss = loss_pred + loss_gce.mean()
        loss.backward()
        self.optimizer_b.step()
        self.optimizer.step()
        return {"loss": loss.item(), "loss_pred": loss_pred.item(),
                "loss_gce": loss_gce.mean().item()}

    def predict(self, x: torch.Tensor) -> torch.Tensor:
        return self.pred_model.predict(x)


