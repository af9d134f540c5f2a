"""Losses for imbalanced classes, from SubpopBench (Yang et al. 2023): Focal, LDAM and
Balanced Softmax. Class sizes come from the training in-splits (`prepare`), so they need
labels only, no group annotations."""
from typing import Any

import torch
import torch.nn.functional as F

from domainbed.algorithms.common import choice, concat, log_uniform
from domainbed.algorithms.erm import ERM
from domainbed.hparams import Hparam
from domainbed.registry import register_algorithm
from oodutils.errors import UserError


@register_algorithm("Focal")
class Focal(ERM):
    """Focal loss (Lin et al. 2017): (1 - p_y)^gamma times the cross-entropy."""
    DATA_PARALLEL = True   # a mean over examples: splits across processes (--distributed)
    HPARAMS = {"gamma": Hparam(1.0, lambda r: 0.5 * 10 ** r.uniform(0, 1), "focusing power",
                               low=0.5, high=5.0)}

    def update(self, minibatches: list[tuple[torch.Tensor, ...]],
               unlabeled: list[torch.Tensor] | None = None) -> dict[str, float]:
        all_x, all_y = concat(minibatches)
        ce = F.cross_entropy(self.predict(all_x), all_y, reduction="none")
        loss = ((1 - torch.exp(-ce)) ** self.hparams["gamma"] * ce).mean()
        self.optimizer_step(loss)
        return {"loss": loss.item()}


class ClassSizeLoss(ERM):
    """ERM with a loss that depends on the training class sizes (set by `prepare`)."""
    class_sizes: torch.Tensor
    HPARAMS = {}

    def __init__(self, input_shape: tuple[int, ...], num_classes: int, num_domains: int,
                 hparams: dict[str, Any]) -> None:
        super().__init__(input_shape, num_classes, num_domains, hparams)
        self.num_classes = num_classes
        self.register_buffer("class_sizes", torch.zeros(0), persistent=False)

    def prepare(self, context: Any) -> None:
        y = torch.cat([torch.as_tensor(s.y) for s in context.train_splits])
        self.class_sizes = torch.bincount(y, minlength=self.num_classes).float().to(
            context.device)

    def loss(self, logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def update(self, minibatches: list[tuple[torch.Tensor, ...]],
               unlabeled: list[torch.Tensor] | None = None) -> dict[str, float]:
        if not len(self.class_sizes):
            raise UserError(f"{self.registry_name} needs prepare() (training class sizes)")
        all_x, all_y = concat(minibatches)
        loss = self.loss(self.predict(all_x), all_y)
        self.optimizer_step(loss)
        return {"loss": loss.item()}


@register_algorithm("LDAM")
class LDAM(ClassSizeLoss):
    """Label-distribution-aware margin loss (Cao et al. 2019): subtract a margin proportional
    to n_c^(-1/4) (largest = `max_m`) from the true-class logit, then scale by `scale`."""
    DATA_PARALLEL = True   # a mean over examples: splits across processes (--distributed)
    HPARAMS = {
        "max_m": log_uniform(0.5, -1, -0.1, "largest class margin"),
        "scale": choice(30.0, [10.0, 30.0], "logit scale"),
    }

    def loss(self, logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        sizes = torch.where(self.class_sizes > 0, self.class_sizes,
                            torch.full_like(self.class_sizes, float("inf")))
        margins = 1.0 / torch.sqrt(torch.sqrt(sizes))
        margins = margins * (self.hparams["max_m"] / margins.max())
        true_class = F.one_hot(y, logits.shape[1]).bool()
        output = torch.where(true_class, logits - margins[y].unsqueeze(1), logits)
        return F.cross_entropy(self.hparams["scale"] * output, y)


@register_algorithm("BSoftmax")
class BSoftmax(ClassSizeLoss):
    """Balanced Softmax (Ren et al. 2020): add log n_c to each class's logit in training."""
    DATA_PARALLEL = True   # a mean over examples: splits across processes (--distributed)

    def loss(self, logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(logits + self.class_sizes.log().unsqueeze(0), y)
