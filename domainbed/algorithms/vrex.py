"""Variance Risk Extrapolation (Krueger et al. 2021, http://arxiv.org/abs/2003.00688)."""
from typing import Any

import torch
import torch.nn.functional as F

from domainbed.algorithms.irm import (
    AnnealedPenalty,
    annealed_fused_form,
    annealed_weight,
    split_logits,
)
from domainbed.hparams import Hparam
from domainbed.registry import register_algorithm


def vrex_objective(model: Any, minibatches: list[tuple[torch.Tensor, ...]], hp: dict[str, Any],
                   state: Any) -> tuple[Any, ...]:
    """VREx.update as a pure function of one model (the fused launcher's form)."""
    weight = annealed_weight("vrex", hp, state)
    all_logits = model.predict(torch.cat([x for x, _ in minibatches]))
    losses = torch.stack([F.cross_entropy(logits, y)
                          for logits, y in split_logits(all_logits, minibatches)])
    mean = losses.mean()
    penalty = ((losses - mean) ** 2).mean()
    loss = mean + weight * penalty
    return (loss, {"loss": loss, "nll": losses[-1], "penalty": penalty},
            {"update_count": state["update_count"] + 1})


@register_algorithm("VREx")
class VREx(AnnealedPenalty):
    """Mean risk plus the variance of the per-environment risks, annealed like IRM."""
    PREFIX = "vrex"
    HPARAMS = {
        "vrex_lambda": Hparam(1e1, lambda r: 10 ** r.uniform(-1, 5), low=0.0),
        "vrex_penalty_anneal_iters": Hparam(500, lambda r: int(10 ** r.uniform(0, 4)),
                                            low=0),
    }
    FUSED = annealed_fused_form(vrex_objective, "vrex")

    def update(self, minibatches: list[tuple[torch.Tensor, ...]],
               unlabeled: list[torch.Tensor] | None = None) -> dict[str, float]:
        values, _ = self.objective_update(vrex_objective, minibatches,
                                          self.FUSED.member_hparams,
                                          {"update_count": self.update_count})
        return values
