"""Two-stage methods from SubpopBench (Yang et al. 2023), both stages inside one run: ERM
for the first `first_stage_step_frac` of the steps, then JTT (retrain, up-weighting the
first model's errors), CRT / ReWeightCRT / VanillaCRT (retrain only the classifier with
group-balanced batches / group weights / ordinary batches) or DFR (retrain only the
classifier on group-balanced held-out data). `stage()` says which stage each record
belongs to. SubpopBench runs the second stage as a separate job from a saved first-stage
model; here the switch happens at step int(first_stage_step_frac * n_steps) of the same
run."""
from typing import Any

import torch
import torch.nn.functional as F

from domainbed.algorithms.base import Algorithm, require_groups
from domainbed.algorithms.common import log_uniform, uniform
from domainbed.algorithms.erm import ERM
from domainbed.algorithms.reweighting import normalized, training_group_sizes
from domainbed.hparams import seed_hash
from domainbed.registry import register_algorithm
from oodutils.errors import UserError


class TwoStage(Algorithm):
    """Stage 1 is ERM (`stage1_model`); subclasses define the second stage. Every optimizer
    is a top-level attribute created at construction, so a resumed run restores them."""
    update_count: torch.Tensor
    optimizer_stage2: torch.optim.Optimizer   # each subclass's own
    HPARAMS = {"first_stage_step_frac": uniform(0.5, 0.2, 0.8, "fraction of steps in stage 1")}

    def __init__(self, input_shape: tuple[int, ...], num_classes: int, num_domains: int,
                 hparams: dict[str, Any]) -> None:
        super().__init__(input_shape, num_classes, num_domains, hparams)
        self.stage1_model = ERM(input_shape, num_classes, num_domains, hparams)
        self.optimizer = self.stage1_model.optimizer
        self.register_buffer("update_count", torch.tensor([0]))
        self.switch_step: Any = None

    def prepare(self, context: Any) -> None:
        self.switch_step = int(self.hparams["first_stage_step_frac"] * context.n_steps)

    def in_stage2(self, count: Any) -> bool:
        if self.switch_step is None:
            raise UserError(f"{self.registry_name} is two-stage: it needs prepare() with the "
                            f"run's number of steps before training")
        return count >= self.switch_step

    def update(self, minibatches: list[tuple[torch.Tensor, ...]],
               unlabeled: list[torch.Tensor] | None = None, groups: Any = None) -> dict[str, float]:
        if self.in_stage2(int(self.update_count)):
            out = self.stage2_update(minibatches, groups)
        else:
            out = self.stage1_model.update(minibatches)
        self.update_count += 1
        return out

    def stage(self) -> Any:
        count = int(self.update_count)
        if self.switch_step is None or count == 0:
            return None
        return "stage2" if self.in_stage2(count - 1) else "stage1"

    def group_balanced_batches(self, step: int) -> bool:
        return False

    def predict(self, x: torch.Tensor) -> torch.Tensor:
        trained_stage2 = self.switch_step is not None and \
            int(self.update_count) > self.switch_step
        return self.stage2_predict(x) if trained_stage2 else self.stage1_model.predict(x)

    def stage2_predict(self, x: torch.Tensor) -> torch.Tensor:
        return self.stage1_model.predict(x)

    def stage2_update(self, minibatches: list[tuple[torch.Tensor, ...]],
                      groups: Any) -> dict[str, float]:
        raise NotImplementedError

    def classifier_step(self, loss: torch.Tensor) -> dict[str, Any]:
        """A step of the second-stage optimizer, which holds the classifier only."""
        self.optimizer_stage2.zero_grad()
        loss.backward()
        self.optimizer_stage2.step()
        return {"loss": loss.item()}

    def frozen_features(self, x: torch.Tensor) -> Any:
        with torch.no_grad():
            return self.stage1_model.featurizer(x)

    def classifier_sgd(self, weight_decay: Any) -> Any:
        """SubpopBench's second-stage optimizer: SGD, momentum 0.9, on the classifier."""
        return torch.optim.SGD(self.stage1_model.classifier.parameters(), lr=self.hparams["lr"],
                               weight_decay=weight_decay, momentum=0.9)


@register_algorithm("JTT")
class JTT(TwoStage):
    """Just Train Twice (Liu et al. 2021), as SubpopBench: a second, freshly initialized
    model is trained with the loss of each example the (frozen) first-stage model
    misclassifies multiplied by `jtt_lambda`. SubpopBench marks errors on each minibatch
    with the first model (equivalent to the paper's error set, which upsamples them)."""
    HPARAMS = {
        "first_stage_step_frac": uniform(0.5, 0.2, 0.8, "fraction of steps in stage 1"),
        "jtt_lambda": log_uniform(10, 0, 2.5, "up-weighting of first-stage errors"),
    }

    def __init__(self, input_shape: tuple[int, ...], num_classes: int, num_domains: int,
                 hparams: dict[str, Any]) -> None:
        super().__init__(input_shape, num_classes, num_domains, hparams)
        self.stage2_model = ERM(input_shape, num_classes, num_domains, hparams)
        self.optimizer_stage2 = self.stage2_model.optimizer

    def error_weights(self, x: torch.Tensor, y: torch.Tensor) -> Any:
        """jtt_lambda where the first-stage model is wrong, 1 elsewhere."""
        self.stage1_model.eval()
        with torch.no_grad():
            wrong = self.stage1_model.predict(x).argmax(1).ne(y)
        self.stage1_model.train()
        weights = torch.ones(len(y), device=y.device)
        weights[wrong] = float(self.hparams["jtt_lambda"])
        return weights

    def stage2_update(self, minibatches: list[tuple[torch.Tensor, ...]],
                      groups: Any) -> dict[str, float]:
        all_x = torch.cat([x for x, _ in minibatches])
        all_y = torch.cat([y for _, y in minibatches])
        losses = F.cross_entropy(self.stage2_model.predict(all_x), all_y, reduction="none")
        loss = (losses * self.error_weights(all_x, all_y)).mean()
        self.stage2_model.optimizer_step(loss)
        return {"loss": loss.item()}

    def stage2_predict(self, x: torch.Tensor) -> torch.Tensor:
        return self.stage2_model.predict(x)


@register_algorithm("CRT")
class CRT(TwoStage):
    """Classifier re-training (Kang et al. 2020): the featurizer is frozen after stage 1 and
    the classifier alone trains on group-balanced minibatches (SGD, as SubpopBench)."""
    NEEDS_GROUPS = True

    def __init__(self, input_shape: tuple[int, ...], num_classes: int, num_domains: int,
                 hparams: dict[str, Any]) -> None:
        super().__init__(input_shape, num_classes, num_domains, hparams)
        self.optimizer_stage2 = self.classifier_sgd(hparams["weight_decay"])

    def prepare(self, context: Any) -> None:
        require_groups(self.registry_name, context.train_splits)
        super().prepare(context)

    def group_balanced_batches(self, step: int) -> Any:
        return self.in_stage2(step)

    def stage2_loss(self, logits: torch.Tensor, y: torch.Tensor, groups: Any) -> torch.Tensor:
        return F.cross_entropy(logits, y)

    def stage2_update(self, minibatches: list[tuple[torch.Tensor, ...]],
                      groups: Any) -> dict[str, float]:
        all_x = torch.cat([x for x, _ in minibatches])
        all_y = torch.cat([y for _, y in minibatches])
        logits = self.stage1_model.classifier(self.frozen_features(all_x))
        return self.classifier_step(self.stage2_loss(logits, all_y, groups))


@register_algorithm("VanillaCRT")
class VanillaCRT(TwoStage):
    """Classifier re-training with ordinary (instance-balanced) minibatches, as SubpopBench's
    VanillaCRT: the featurizer is frozen after stage 1 and the classifier alone retrains
    with plain cross-entropy (SGD, momentum 0.9). Needs no group labels: SubpopBench's
    attribute-unknown setting."""

    def __init__(self, input_shape: tuple[int, ...], num_classes: int, num_domains: int,
                 hparams: dict[str, Any]) -> None:
        super().__init__(input_shape, num_classes, num_domains, hparams)
        self.optimizer_stage2 = self.classifier_sgd(hparams["weight_decay"])

    def stage2_update(self, minibatches: list[tuple[torch.Tensor, ...]],
                      groups: Any) -> dict[str, float]:
        all_x = torch.cat([x for x, _ in minibatches])
        all_y = torch.cat([y for _, y in minibatches])
        logits = self.stage1_model.classifier(self.frozen_features(all_x))
        return self.classifier_step(F.cross_entropy(logits, all_y))


@register_algorithm("ReWeightCRT")
class ReWeightCRT(CRT):
    """CRT with uniformly drawn minibatches and inverse group-frequency loss weights in
    the second stage instead of group-balanced sampling."""

    def prepare(self, context: Any) -> None:
        super().prepare(context)
        self.weights_per_group = normalized(
            1.0 / training_group_sizes(self.registry_name, context)).to(context.device)

    def group_balanced_batches(self, step: int) -> bool:
        return False

    def stage2_loss(self, logits: torch.Tensor, y: torch.Tensor, groups: Any) -> torch.Tensor:
        losses = F.cross_entropy(logits, y, reduction="none")
        return (self.weights_per_group[torch.cat(groups)] * losses).mean()


def group_balanced_subset(splits: Any, seed: int) -> tuple[Any, ...]:
    """(x, y) of a group-balanced random subsample of the pooled splits: every group cut to
    the smallest group's size (class-balanced when the splits have no groups), as DFR's
    held-out set."""
    ys = torch.cat([torch.as_tensor(s.y) for s in splits])
    if all(getattr(s, "groups", None) is not None for s in splits):
        keys = torch.cat([torch.as_tensor(s.groups) for s in splits])
    else:
        keys = ys
    generator = torch.Generator().manual_seed(seed_hash("DFR", seed))
    present = keys.unique()
    smallest = min(int((keys == k).sum()) for k in present)
    chosen: Any = []
    for k in present:
        members = torch.nonzero(keys == k).flatten()
        chosen.append(members[torch.randperm(len(members), generator=generator)[:smallest]])
    chosen = torch.sort(torch.cat(chosen))[0]
    xs = []
    offsets = torch.cumsum(torch.tensor([0] + [len(s) for s in splits]), 0)
    for i in chosen.tolist():
        env = int(torch.searchsorted(offsets, torch.tensor(i), right=True)) - 1
        xs.append(torch.as_tensor(splits[env][i - int(offsets[env])][0]))
    return torch.stack(xs), ys[chosen], keys[chosen]


@register_algorithm("DFR")
class DFR(TwoStage):
    """Deep Feature Reweighting (Kirichenko et al. 2023), as SubpopBench: after stage 1 the
    featurizer is frozen and the classifier retrains on a group-balanced subsample of the
    training domains' held-out (out) splits, with SGD (no weight decay) and an L1 penalty
    `dfr_reg` * |W|_1; class-balanced when the data has no group annotations."""
    HPARAMS = {
        "first_stage_step_frac": uniform(0.5, 0.2, 0.8, "fraction of steps in stage 1"),
        "dfr_reg": log_uniform(0.1, -2, 0.5, "L1 penalty on the classifier weights"),
    }

    def __init__(self, input_shape: tuple[int, ...], num_classes: int, num_domains: int,
                 hparams: dict[str, Any]) -> None:
        super().__init__(input_shape, num_classes, num_domains, hparams)
        self.optimizer_stage2 = self.classifier_sgd(0.0)
        self.heldout: Any = None

    def prepare(self, context: Any) -> None:
        super().prepare(context)
        if not context.holdout_splits or not sum(len(s) for s in context.holdout_splits):
            raise UserError("DFR needs held-out data from the training environments "
                            "(set --holdout_fraction above 0)")
        x, y, _ = group_balanced_subset(context.holdout_splits, context.seed)
        self.heldout = (x.to(context.device), y.to(context.device))
        self.seed = context.seed

    def stage2_batch(self, step: int) -> tuple[Any, ...]:
        """A minibatch of the balanced held-out set, a pure function of (seed, step)."""
        x, y = self.heldout
        generator = torch.Generator().manual_seed(seed_hash("DFR", self.seed, step))
        size = min(len(y), self.hparams["batch_size"])
        idx = torch.randperm(len(y), generator=generator)[:size].to(y.device)
        return x[idx], y[idx]

    def stage2_update(self, minibatches: list[tuple[torch.Tensor, ...]],
                      groups: Any) -> dict[str, float]:
        x, y = self.stage2_batch(int(self.update_count))
        classifier = self.stage1_model.classifier
        logits = classifier(self.frozen_features(x))
        weight = classifier.weight if hasattr(classifier, "weight") else classifier[-1].weight
        loss = F.cross_entropy(logits, y) + self.hparams["dfr_reg"] * torch.norm(weight, 1)
        return self.classifier_step(loss)
