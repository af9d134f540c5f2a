"""Group distributionally robust optimization over training environments
(Sagawa et al. 2020, Algorithm 1, https://arxiv.org/abs/1911.08731)."""
from typing import Any

import torch
import torch.nn.functional as F

from domainbed.algorithms.base import FusedForm
from domainbed.algorithms.erm import ERM, erm_objective
from domainbed.hparams import Hparam
from domainbed.registry import register_algorithm


def group_dro_objective(model: Any, minibatches: list[tuple[torch.Tensor, ...]], hp: dict[str, Any],
                        state: Any) -> tuple[Any, ...]:
    """GroupDRO.update as a pure function of one model (the fused launcher's form)."""
    losses = torch.stack([F.cross_entropy(model.predict(x), y) for x, y in minibatches])
    q = state["q"] * (hp["groupdro_eta"] * losses.detach()).exp()
    q = q / q.sum()
    loss = torch.dot(losses, q)
    return loss, {"loss": loss}, {"q": q}


@register_algorithm("GroupDRO")
class GroupDRO(ERM):
    """Minimize a q-weighted sum of environment risks, where q rises exponentially (step
    `groupdro_eta`) on the environments with high loss, approximating the worst environment.

    `q` is a buffer so it is checkpointed; it starts as ones over the environments, as in
    DomainBed, whose fresh state dicts hold an empty `q` (accepted when loading, see below).
    The weights range over training domains; SubpopGroupDRO (reweighting.py) is SubpopBench's
    GroupDRO over (label, attribute) groups.
    """
    q: torch.Tensor
    HPARAMS = {
        "groupdro_eta": Hparam(1e-2, lambda r: 10 ** r.uniform(-3, -1), low=0.0),
    }
    FUSED = FusedForm(group_dro_objective, member_hparams=("groupdro_eta",), state=("q",))

    def __init__(self, input_shape: tuple[int, ...], num_classes: int, num_domains: int,
                 hparams: dict[str, Any]) -> None:
        super().__init__(input_shape, num_classes, num_domains, hparams)
        self.register_buffer("q", torch.ones(num_domains))

    def _load_from_state_dict(self, state_dict: Any, prefix: str, *args: Any,
                              **kwargs: Any) -> None:
        # DomainBed saves an empty q before the first step (it makes q on first use): read
        # as the uniform start, so update() and the fused launcher always see one weight
        # per training environment.
        saved = state_dict.get(prefix + "q")
        if saved is not None and saved.numel() == 0:
            state_dict[prefix + "q"] = torch.ones_like(self.q)
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def update(self, minibatches: list[tuple[torch.Tensor, ...]],
               unlabeled: list[torch.Tensor] | None = None) -> dict[str, float]:
        values, state = self.objective_update(group_dro_objective, minibatches,
                                              self.FUSED.member_hparams, {"q": self.q})
        self.q = state["q"].detach()
        return values


@register_algorithm("ReweightedERM")
class ReweightedERM(ERM):
    """ERM on group-balanced minibatches: each example is drawn with probability inversely
    proportional to the size of its (label, attribute) group, i.e. group-reweighted ERM in
    expectation (the reference model of the validity statistic K). The training loop reads
    `group_balanced`; on datasets without groups it falls back to class balancing."""
    HPARAMS = {"group_balanced": Hparam(True, lambda r: True, choices=(False, True))}
    FUSED = FusedForm(erm_objective)  # the batches differ, not the objective
    DATA_PARALLEL = True   # a mean over examples: splits across processes (--distributed)
