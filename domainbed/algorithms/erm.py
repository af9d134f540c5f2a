"""Empirical Risk Minimization: the baseline every other algorithm in this package extends."""
import torch
import torch.nn as nn
import torch.nn.functional as F

from domainbed import networks
from domainbed.algorithms.base import Algorithm, FusedForm
from domainbed.registry import register_algorithm


def erm_objective(model, minibatches, hp, state):
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

    def __init__(self, input_shape, num_classes, num_domains, hparams):
        super().__init__(input_shape, num_classes, num_domains, hparams)
        self.featurizer = networks.Featurizer(input_shape, self.hparams)
        self.classifier = networks.Classifier(
            self.featurizer.n_outputs, num_classes, self.hparams["nonlinear_classifier"])
        self.network = nn.Sequential(self.featurizer, self.classifier)
        self.optimizer = self.new_optimizer()

    def new_optimizer(self):
        """A fresh Adam over the whole network (penalty methods rebuild it when annealing ends)."""
        return torch.optim.Adam(self.network.parameters(), lr=self.hparams["lr"],
                                weight_decay=self.hparams["weight_decay"])

    def optimizer_step(self, loss):
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()

    def update(self, minibatches, unlabeled=None):
        all_x = torch.cat([x for x, _ in minibatches])
        all_y = torch.cat([y for _, y in minibatches])
        loss = F.cross_entropy(self.predict(all_x), all_y)
        self.optimizer_step(loss)
        return {"loss": loss.item()}

    def predict(self, x):
        return self.network(x)
