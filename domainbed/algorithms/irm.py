"""Invariant Risk Minimization (Arjovsky et al. 2019), as DomainBed implements it."""
from typing import Any

import torch
import torch.nn.functional as F

from domainbed.algorithms.base import FusedForm
from domainbed.algorithms.erm import ERM
from domainbed.hparams import Hparam
from domainbed.registry import register_algorithm


def split_logits(all_logits: Any, minibatches: list[tuple[torch.Tensor, ...]]) -> Any:
    """The per-environment slices of logits computed in one pass over the concatenated batch."""
    out, start = [], 0
    for x, y in minibatches:
        out.append((all_logits[start:start + x.shape[0]], y))
        start += x.shape[0]
    return out


def _scaled_risk(scale: Any, logits: torch.Tensor, y: torch.Tensor) -> Any:
    return F.cross_entropy(logits * scale, y)


def irm_penalty(logits: torch.Tensor, y: torch.Tensor) -> Any:
    """IRMv1 penalty: the squared gradient of the risk w.r.t. a dummy scale on the logits,
    estimated without bias as the product of the gradients on the even and odd halves.
    Through torch.func, so that it also runs inside the fused launcher's vmap."""
    one = torch.ones((), dtype=logits.dtype, device=logits.device)
    grad_1 = torch.func.grad(_scaled_risk)(one, logits[::2], y[::2])
    grad_2 = torch.func.grad(_scaled_risk)(one, logits[1::2], y[1::2])
    return torch.sum(grad_1 * grad_2)


def annealed_weight(prefix: str, hp: dict[str, Any], state: Any) -> Any:
    """The penalty weight of an AnnealedPenalty: 1 before its switch step, then lambda."""
    count = state["update_count"].reshape(())
    return torch.where(count >= hp[f"{prefix}_penalty_anneal_iters"],
                       hp[f"{prefix}_lambda"], torch.ones_like(hp[f"{prefix}_lambda"]))


def annealed_fused_form(objective: Any, prefix: str) -> Any:
    """The FusedForm of an AnnealedPenalty: its penalty weight and anneal step may differ
    between members, and each member's Adam restarts at its own switch step."""
    def reset_optimizer(hp: dict[str, Any], state: Any) -> bool:
        return state["update_count"].reshape(-1) == hp[f"{prefix}_penalty_anneal_iters"]
    return FusedForm(objective, member_hparams=(f"{prefix}_lambda",
                                                f"{prefix}_penalty_anneal_iters"),
                     state=("update_count",), reset_optimizer=reset_optimizer)


def irm_objective(model: Any, minibatches: list[tuple[torch.Tensor, ...]], hp: dict[str, Any],
                  state: Any) -> tuple[Any, ...]:
    """IRM.update as a pure function of one model (the fused launcher's form)."""
    weight = annealed_weight("irm", hp, state)
    all_logits = model.predict(torch.cat([x for x, _ in minibatches]))
    nll: Any
    nll, penalty = 0.0, 0.0
    for logits, y in split_logits(all_logits, minibatches):
        nll = nll + F.cross_entropy(logits, y)
        penalty = penalty + irm_penalty(logits, y)
    nll = nll / len(minibatches)
    penalty = penalty / len(minibatches)
    loss = nll + weight * penalty
    return (loss, {"loss": loss, "nll": nll, "penalty": penalty},
            {"update_count": state["update_count"] + 1})


class AnnealedPenalty(ERM):
    """ERM plus a penalty whose weight is 1 for the first `<prefix>_penalty_anneal_iters` steps
    and `<prefix>_lambda` after; Adam is rebuilt at the switch because the sudden jump in
    gradient scale would otherwise be smoothed by stale moment estimates.

    `update_count` is a buffer (shape [1], as DomainBed) so it is saved in state dicts and a
    resumed run anneals at the same step.
    """
    update_count: torch.Tensor
    PREFIX: Any = None

    def __init__(self, input_shape: tuple[int, ...], num_classes: int, num_domains: int,
                 hparams: dict[str, Any]) -> None:
        super().__init__(input_shape, num_classes, num_domains, hparams)
        self.register_buffer("update_count", torch.tensor([0]))

    @property
    def anneal_iters(self) -> Any:
        return self.hparams[f"{self.PREFIX}_penalty_anneal_iters"]

    def optimizer_step(self, loss: torch.Tensor) -> None:
        if int(self.update_count.item()) == self.anneal_iters:
            self.optimizer = self.new_optimizer()
        super().optimizer_step(loss)
        self.update_count += 1


@register_algorithm("IRM")
class IRM(AnnealedPenalty):
    """Invariant Risk Minimization: average risk plus the IRMv1 penalty per environment."""
    PREFIX = "irm"
    HPARAMS = {
        "irm_lambda": Hparam(1e2, lambda r: 10 ** r.uniform(-1, 5), low=0.0),
        "irm_penalty_anneal_iters": Hparam(500, lambda r: int(10 ** r.uniform(0, 4)), low=0),
    }

    FUSED = annealed_fused_form(irm_objective, "irm")

    _irm_penalty = staticmethod(irm_penalty)  # DomainBed's name, for ported subclasses

    def update(self, minibatches: list[tuple[torch.Tensor, ...]],
               unlabeled: list[torch.Tensor] | None = None) -> dict[str, float]:
        values, _ = self.objective_update(irm_objective, minibatches, self.FUSED.member_hparams,
                                          {"update_count": self.update_count})
        return values
