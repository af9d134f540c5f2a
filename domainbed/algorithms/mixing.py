"""Mixing and randomization of inputs, features or styles: Mixup across domains, SelfReg's
in-class feature mixing and SagNet's style randomization (as DomainBed implements them).
Random draws happen in DomainBed's order (torch, then numpy) so its outputs reproduce."""
from typing import Any

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from domainbed import networks
from domainbed.algorithms.base import Algorithm
from domainbed.algorithms.common import choice, concat, log_uniform, uniform
from domainbed.algorithms.erm import ERM
from domainbed.algorithms.optimization import make_optimizer
from domainbed.algorithms.reweighting import training_group_sizes
from domainbed.registry import register_algorithm
from oodutils.errors import UserError


def random_pairs_of_minibatches(minibatches: list[tuple[torch.Tensor, ...]]) -> Any:
    """Each minibatch paired with the next one in a random (torch.randperm) cyclic order,
    both cut to the shorter length (DomainBed's misc.random_pairs_of_minibatches)."""
    perm = torch.randperm(len(minibatches)).tolist()
    pairs = []
    for i in range(len(minibatches)):
        j = i + 1 if i < len(minibatches) - 1 else 0
        (xi, yi), (xj, yj) = minibatches[perm[i]], minibatches[perm[j]]
        n = min(len(xi), len(xj))
        pairs.append(((xi[:n], yi[:n]), (xj[:n], yj[:n])))
    return pairs


@register_algorithm("Mixup")
class Mixup(ERM):
    """Inter-domain Mixup (Xu et al. 2020, Yan et al. 2020): train on convex combinations
    of two domains' minibatches, with the loss mixed by the same Beta(alpha, alpha) weight."""
    HPARAMS = {"mixup_alpha": log_uniform(0.2, -1, 1, "Beta(alpha, alpha) mixing weight")}
    TRANSFORMS_INPUTS = True  # mixes images: a linear probe cannot use cached features

    def update(self, minibatches: list[tuple[torch.Tensor, ...]],
               unlabeled: list[torch.Tensor] | None = None) -> dict[str, float]:
        objective: Any = 0
        for (xi, yi), (xj, yj) in random_pairs_of_minibatches(minibatches):
            lam = np.random.beta(self.hparams["mixup_alpha"], self.hparams["mixup_alpha"])
            predictions = self.predict(lam * xi + (1 - lam) * xj)
            objective += lam * F.cross_entropy(predictions, yi)
            objective += (1 - lam) * F.cross_entropy(predictions, yj)
        objective /= len(minibatches)
        self.optimizer_step(objective)
        return {"loss": objective.item()}


@register_algorithm("SelfReg")
class SelfReg(ERM):
    """SelfReg (Kim et al. 2021): besides the cross-entropy, pull each example's logits and
    projected features towards those of random same-class examples and towards a mixup of
    two of them (Beta(0.5, 0.5) weight), scaled by min(cross-entropy, 1)."""
    HPARAMS = {}

    def __init__(self, input_shape: tuple[int, ...], num_classes: int, num_domains: int,
                 hparams: dict[str, Any]) -> None:
        super().__init__(input_shape, num_classes, num_domains, hparams)
        n = self.featurizer.n_outputs
        hidden = n if n == 2048 else n * 2
        self.cdpl = nn.Sequential(
            nn.Linear(n, hidden), nn.BatchNorm1d(hidden), nn.ReLU(inplace=True),
            nn.Linear(hidden, hidden), nn.BatchNorm1d(hidden), nn.ReLU(inplace=True),
            nn.Linear(hidden, n), nn.BatchNorm1d(n))

    @staticmethod
    def class_intervals(sorted_y: Any) -> Any:
        """End index of each run of equal labels in a sorted label vector."""
        ends, current = [], 0
        for i, value in enumerate(sorted_y.tolist()):
            if value != current:
                ends.append(i)
                current = value
        ends.append(len(sorted_y))
        return ends

    def update(self, minibatches: list[tuple[torch.Tensor, ...]],
               unlabeled: list[torch.Tensor] | None = None) -> dict[str, float]:
        all_x, all_y = concat(minibatches)
        lam = np.random.beta(0.5, 0.5)
        with torch.no_grad():
            all_y, order = torch.sort(all_y)
            all_x = all_x[order]
            ends = self.class_intervals(all_y)
        feat = self.featurizer(all_x)
        proj = self.cdpl(feat)
        output = self.classifier(feat)
        index_2 = torch.empty(len(all_y), dtype=torch.long)
        index_3 = torch.empty(len(all_y), dtype=torch.long)
        start = 0
        for end in ends:  # two random permutations within each class
            index_2[start:end] = torch.randperm(end - start) + start
            index_3[start:end] = torch.randperm(end - start) + start
            start = end
        output_2, feat_2 = output[index_2], proj[index_2]
        output_3 = lam * output_2 + (1 - lam) * output[index_3]
        feat_3 = lam * feat_2 + (1 - lam) * proj[index_3]
        ind_logit, hdl_logit = F.mse_loss(output, output_2), F.mse_loss(output, output_3)
        ind_feat, hdl_feat = 0.3 * F.mse_loss(feat, feat_2), 0.3 * F.mse_loss(feat, feat_3)
        cl_loss = F.cross_entropy(output, all_y)
        scale = min(cl_loss.item(), 1.0)
        loss = cl_loss + scale * (lam * (ind_logit + ind_feat) +
                                  (1 - lam) * (hdl_logit + hdl_feat))
        self.optimizer_step(loss)
        return {"loss": loss.item()}


def randomize(x: torch.Tensor, what: str = "style", eps: float = 1e-5) -> Any:
    """SagNet's randomization over the last dimension (channels x positions for 4-D input):
    'style' interpolates each example's mean/variance with another's (torch.rand weights),
    'content' keeps the statistics and swaps the normalized content (detached)."""
    sizes = x.size()
    alpha = torch.rand(sizes[0], 1).to(x.device)
    if len(sizes) == 4:
        x = x.view(sizes[0], sizes[1], -1)
        alpha = alpha.unsqueeze(-1)
    mean = x.mean(-1, keepdim=True)
    var = x.var(-1, keepdim=True)
    x = (x - mean) / (var + eps).sqrt()
    idx_swap = torch.randperm(sizes[0])
    if what == "style":
        mean = alpha * mean + (1 - alpha) * mean[idx_swap]
        var = alpha * var + (1 - alpha) * var[idx_swap]
    else:
        x = x[idx_swap].detach()
    x = x * (var + eps).sqrt() + mean
    return x.view(*sizes)


@register_algorithm("SagNet")
class SagNet(Algorithm):
    """Style-Agnostic Networks (Nam et al. 2021, Algorithm 1): a content head trained on
    style-randomized features, a style head on content-randomized ones, and an adversarial
    step making the featurizer confuse the style head.

    As DomainBed: randomization acts on the featurizer's output (pooled features), not on
    an intermediate ResNet block as in the paper."""
    HPARAMS = {"sag_w_adv": log_uniform(0.1, -2, 1, "weight of the adversarial style loss")}

    def __init__(self, input_shape: tuple[int, ...], num_classes: int, num_domains: int,
                 hparams: dict[str, Any]) -> None:
        super().__init__(input_shape, num_classes, num_domains, hparams)
        self.network_f = networks.Featurizer(input_shape, hparams)
        nonlinear = hparams["nonlinear_classifier"]
        self.network_c = networks.Classifier(self.network_f.n_outputs, num_classes, nonlinear)
        self.network_s = networks.Classifier(self.network_f.n_outputs, num_classes, nonlinear)
        self.optimizer_f = make_optimizer(self.network_f.parameters(), hparams)
        self.optimizer_c = make_optimizer(self.network_c.parameters(), hparams)
        self.optimizer_s = make_optimizer(self.network_s.parameters(), hparams)
        self.weight_adv = hparams["sag_w_adv"]

    def forward_c(self, x: torch.Tensor) -> Any:
        return self.network_c(randomize(self.network_f(x), "style"))

    def forward_s(self, x: torch.Tensor) -> Any:
        return self.network_s(randomize(self.network_f(x), "content"))

    def update(self, minibatches: list[tuple[torch.Tensor, ...]],
               unlabeled: list[torch.Tensor] | None = None) -> dict[str, float]:
        all_x, all_y = concat(minibatches)
        self.optimizer_f.zero_grad()
        self.optimizer_c.zero_grad()
        loss_c = F.cross_entropy(self.forward_c(all_x), all_y)
        loss_c.backward()
        self.optimizer_f.step()
        self.optimizer_c.step()

        self.optimizer_s.zero_grad()
        loss_s = F.cross_entropy(self.forward_s(all_x), all_y)
        loss_s.backward()
        self.optimizer_s.step()

        self.optimizer_f.zero_grad()
        loss_adv = -F.log_softmax(self.forward_s(all_x), dim=1).mean(1).mean()
        loss_adv = loss_adv * self.weight_adv
        loss_adv.backward()
        self.optimizer_f.step()
        return {"loss_c": loss_c.item(), "loss_s": loss_s.item(), "loss_adv": loss_adv.item()}

    def predict(self, x: torch.Tensor) -> torch.Tensor:
        return self.network_c(self.network_f(x))


def mix_up(alpha: Any, x1: torch.Tensor, x2: torch.Tensor, y1: Any, y2: Any) -> tuple[Any, ...]:
    """Per-example Beta(alpha, alpha) mixup of two equal-length cuts (numpy draws)."""
    n = min(len(x1), len(x2))
    x1, x2, y1, y2 = x1[:n], x2[:n], y1[:n], y2[:n]
    lam = torch.tensor(np.random.beta(alpha, alpha, [n, 1]), dtype=torch.float32,
                       device=x1.device)
    lam_x = lam.view(n, *[1] * (x1.dim() - 1))
    return lam_x * x1 + (1 - lam_x) * x2, lam * y1 + (1 - lam) * y2


def cut_mix(alpha: Any, x1: torch.Tensor, x2: torch.Tensor, y1: Any, y2: Any) -> tuple[Any, ...]:
    """CutMix between the two cuts: a random box of each image comes from its partner;
    labels mix by the pasted area."""
    n = min(len(x1), len(x2))
    inputs = torch.cat([x1[:n], x2[:n]])
    targets = torch.cat([y1[:n], y2[:n]]).float()
    partner = torch.cat([torch.arange(n) + n, torch.arange(n)])
    lam = np.random.beta(alpha, alpha)
    w, h = inputs.size(2), inputs.size(3)
    cut = np.sqrt(1.0 - lam)
    cut_w, cut_h = int(w * cut), int(h * cut)
    cx, cy = np.random.randint(w), np.random.randint(h)
    x1b, x2b = np.clip(cx - cut_w // 2, 0, w), np.clip(cx + cut_w // 2, 0, w)
    y1b, y2b = np.clip(cy - cut_h // 2, 0, h), np.clip(cy + cut_h // 2, 0, h)
    inputs[:, :, x1b:x2b, y1b:y2b] = inputs[partner, :, x1b:x2b, y1b:y2b]
    lam = 1 - ((x2b - x1b) * (y2b - y1b) / (w * h))
    return inputs, lam * targets + (1 - lam) * targets[partner]


def lisa_pairs(within_label: Any, labels: torch.Tensor, attributes: Any) -> Any:
    """The (mask_1, mask_2) pairs LISA mixes: within each label, two random attributes
    (intra-label); or within each attribute, two random labels (intra-attribute)."""
    outer, inner = (labels, attributes) if within_label else (attributes, labels)
    pairs = []
    for value in torch.unique(outer):
        mask = outer == value
        choices = torch.unique(inner[mask])
        if len(choices) < 2:
            continue
        first, second = choices[torch.randperm(len(choices))][:2]
        pairs.append((mask & (inner == first), mask & (inner == second)))
    return pairs


@register_algorithm("LISA")
class LISA(ERM):
    """LISA (Yao et al. 2022), as SubpopBench: with probability `LISA_p_sel` mix examples of
    the same label and different attributes (intra-label), otherwise of the same attribute
    and different labels (intra-attribute), by mixup or CutMix, until a batch is filled;
    the loss is the cross-entropy against the mixed soft labels. Needs group annotations
    (attribute = group % num_attributes)."""
    NEEDS_GROUPS = True
    TRANSFORMS_INPUTS = True  # mixes images: a linear probe cannot use cached features
    HPARAMS = {
        "LISA_alpha": log_uniform(2.0, -1, 1, "Beta(alpha, alpha) mixing weight"),
        "LISA_p_sel": uniform(0.5, 0, 1, "probability of intra-label mixing"),
        "LISA_mixup_method": choice("mixup", ["mixup", "cutmix"], "mixup | cutmix"),
    }

    def __init__(self, input_shape: tuple[int, ...], num_classes: int, num_domains: int,
                 hparams: dict[str, Any]) -> None:
        super().__init__(input_shape, num_classes, num_domains, hparams)
        self.num_attributes: int | None
        self.num_classes, self.num_attributes = num_classes, None

    def prepare(self, context: Any) -> None:
        num_groups = len(training_group_sizes(self.registry_name, context))
        self.num_attributes = max(1, num_groups // self.num_classes)

    def selective_mix(self, within_label: Any, x: torch.Tensor, y: torch.Tensor,
                      attributes: Any) -> tuple[Any, ...]:
        labels = y.argmax(1)
        mix = cut_mix if (self.hparams["LISA_mixup_method"] == "cutmix" and x.dim() == 4) \
            else mix_up
        if len(torch.unique(attributes if within_label else labels)) < 2:
            return x, y
        mixed_x: Any
        mixed_y: Any
        mixed_x, mixed_y = [], []
        while sum(len(m) for m in mixed_x) < len(x):
            before = sum(len(m) for m in mixed_x)
            for mask_1, mask_2 in lisa_pairs(within_label, labels, attributes):
                mx, my = mix(self.hparams["LISA_alpha"], x[mask_1], x[mask_2], y[mask_1],
                             y[mask_2])
                mixed_x.append(mx)
                mixed_y.append(my)
            if sum(len(m) for m in mixed_x) == before:
                return x, y
        mixed_x, mixed_y = torch.cat(mixed_x), torch.cat(mixed_y)
        shuffle = torch.randperm(len(mixed_x))
        return mixed_x[shuffle][:len(x)], mixed_y[shuffle][:len(x)]

    def update(self, minibatches: list[tuple[torch.Tensor, ...]],
               unlabeled: list[torch.Tensor] | None = None, groups: Any = None) -> dict[str, float]:
        if groups is None or self.num_attributes is None:
            raise UserError("LISA needs prepare() and per-batch groups")
        all_x, all_y = concat(minibatches)
        attributes = torch.cat(groups) % self.num_attributes
        within_label = np.random.random() <= self.hparams["LISA_p_sel"]
        mixed_x, mixed_y = self.selective_mix(
            within_label, all_x, F.one_hot(all_y, self.num_classes).float(), attributes)
        loss = F.cross_entropy(self.predict(mixed_x), mixed_y)
        self.optimizer_step(loss)
        return {"loss": loss.item()}
