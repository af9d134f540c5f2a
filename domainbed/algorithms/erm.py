"""Empirical Risk Minimization: the baseline every other algorithm in this package extends."""
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F

from domainbed import networks
from domainbed.algorithms.base import Algorithm, FusedForm, hparam_tensor
from domainbed.algorithms.optimization import make_optimizer
from domainbed.registry import register_algorithm


def erm_objective(model: Any, minibatches: list[tuple[torch.Tensor, ...]], hp: dict[str, Any],
                  state: Any) -> tuple[Any, ...]:
    """ERM.update as a pure function of one model (the fused launcher's form)."""
    all_x = torch.cat([x for x, _ in minibatches])
    all_y = torch.cat([y for _, y in minibatches])
    loss = F.cross_entropy(model.predict(all_x), all_y)
    return loss, {"loss": loss}, state


@register_algorithm("ERM")
class ERM(Algorithm):
    """Pool all training environments and minimize the average cross-entropy.

    Attribute names (`featurizer`, `classifier`, `network`, `optimizer`) are DomainBed's, so
    its state dicts and its subclasses work unchanged.
    """
    HPARAMS = {}  # lr, weight_decay, batch_size come from Algorithm; the rest from networks
    FUSED = FusedForm(erm_objective)
    DATA_PARALLEL = True   # a mean over examples: splits across processes (--distributed)

    def __init__(self, input_shape: tuple[int, ...], num_classes: int, num_domains: int,
                 hparams: dict[str, Any]) -> None:
        super().__init__(input_shape, num_classes, num_domains, hparams)
        self.featurizer = networks.Featurizer(input_shape, self.hparams)
        self.classifier = networks.Classifier(
            self.featurizer.n_outputs, num_classes, self.hparams["nonlinear_classifier"])
        self.network = nn.Sequential(self.featurizer, self.classifier)
        self.optimizer = self.new_optimizer()

    def new_optimizer(self) -> Any:
        """A fresh optimizer over the whole network (penalty methods rebuild it when
        annealing ends): the run's choice, DomainBed's Adam by default."""
        return make_optimizer(self.network.parameters(), self.hparams)

    def optimizer_step(self, loss: torch.Tensor) -> None:
        """One step on `loss`; under gradient accumulation (the loop sets `micro_step`
        to (index, count)), gradients of `count` micro-batches add up, each loss scaled
        by 1/count, and the optimizer steps after the last."""
        index, count = self.micro_step
        if index == 0:
            self.optimizer.zero_grad()
        (loss / count if count > 1 else loss).backward()
        if index == count - 1:
            self.optimizer.step()

    def update(self, minibatches: list[tuple[torch.Tensor, ...]],
               unlabeled: list[torch.Tensor] | None = None) -> dict[str, float]:
        values, _ = self.objective_update(erm_objective, minibatches)
        return values

    def objective_update(self, objective: Any, minibatches: list[tuple[torch.Tensor, ...]],
                         hparam_names: Any = (), state: Any = None) -> tuple[Any, ...]:
        """One optimizer step through a FusedForm objective, the very function the fused
        launcher vmaps over many models: update()'s values as floats, and the new state."""
        device = minibatches[0][0].device
        hp = {k: hparam_tensor([self.hparams[k]], device)[0] for k in hparam_names}
        loss, values, new_state = objective(self, minibatches, hp, state or {})
        self.optimizer_step(loss)
        return {k: v.item() if torch.is_tensor(v) else float(v)
                for k, v in values.items()}, new_state

    def predict(self, x: torch.Tensor) -> torch.Tensor:
        return self.network(x)

    # An objective's view of the model: predict (a subclass's own), featurize, classify.
    def featurize(self, x: torch.Tensor) -> torch.Tensor:
        return self.featurizer(x)

    def classify(self, features: torch.Tensor) -> torch.Tensor:
        return self.classifier(features)
