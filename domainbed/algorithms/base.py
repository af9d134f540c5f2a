"""The Algorithm contract (same as DomainBed, so DomainBed algorithms port as-is), plus the
optional hooks that subpopulation-shift methods need from the training loop."""
from dataclasses import dataclass, field
from typing import Any, Callable, List, Optional, Tuple

import torch

from domainbed.algorithms.optimization import OPTIMIZATION_HPARAMS, dataset_default
from domainbed.hparams import Hparam, by_dataset, small_or_large
from oodutils.errors import UserError


@dataclass
class TrainingContext:
    """What the training loop tells an algorithm once, after building it (`prepare`).

    train_splits / holdout_splits: the training environments' in- and out-splits (each has
    `.x` (or per-item loading), `.y`, `.groups`, `.ids`, `len()` and `[i] -> (x, y)`).
    num_groups: the dataset's number of (label, attribute) groups, group = label *
    num_attributes + attribute (None without group annotations). n_steps: the run's length.
    """
    train_splits: List[Any] = field(default_factory=list)
    holdout_splits: List[Any] = field(default_factory=list)
    num_groups: Optional[int] = None
    n_steps: int = 0
    seed: int = 0
    device: Any = "cpu"


@dataclass(frozen=True)
class FusedForm:
    """How the fused launcher trains many models of one algorithm at once (declared as
    `FUSED = FusedForm(...)` in the algorithm's own class body; subclasses do not inherit
    it, since they change what update() does).

    objective(model, minibatches, hp, state) -> (loss, values, new_state): one member's
    step as a pure function, vmapped over the members. `model` has predict(x),
    featurize(x) and classify(features) with the member's parameters; `hp` maps every
    hyperparameter of `member_hparams` to a 0-d tensor; `state` maps the algorithm
    buffers named in `state` to tensors; `values` are update()'s values, as tensors.
    member_hparams: the hyperparameters (beside lr, weight decay and dropout) that may
    differ within a group. reset_optimizer(hp, state) -> bool tensor [members]: members
    whose Adam restarts before this step (penalty annealing).
    """
    objective: Callable
    member_hparams: Tuple[str, ...] = ()
    state: Tuple[str, ...] = ()
    reset_optimizer: Optional[Callable] = None


def hparam_tensor(values: Any, device: torch.device | str = "cpu") -> Any:
    """Members' values of one hyperparameter as a tensor: bool, int64, or float32 (the
    dtype a python float takes when it meets a float32 tensor in update())."""
    dtype = (torch.bool if all(isinstance(v, bool) for v in values) else
             torch.int64 if all(isinstance(v, int) for v in values) else torch.float32)
    return torch.tensor(values, dtype=dtype, device=device)


def fused_form(algorithm_cls: Any) -> Any:
    """The FusedForm the class itself declares, or None (never an inherited one)."""
    return vars(algorithm_cls).get("FUSED")


def supports_grad_accumulation(algorithm_cls: Any) -> Any:
    """Algorithms whose update is one loss through ERM.optimizer_step: those with a fused
    form, or that declare GRAD_ACCUMULATION = True in their own class body."""
    return fused_form(algorithm_cls) is not None or \
        bool(vars(algorithm_cls).get("GRAD_ACCUMULATION", False))


def require_groups(algorithm_name: Any, splits: Any) -> list[Any]:
    """The group annotations of `splits`, or a clear error for datasets without them."""
    if not splits or any(getattr(s, "groups", None) is None for s in splits):
        raise UserError(f"{algorithm_name} needs group (label, attribute) annotations, and "
                        f"this dataset has none; choose a dataset with groups "
                        f"(e.g. ColoredMNIST, Spawrious*) or another algorithm")
    return [torch.as_tensor(s.groups, dtype=torch.long) for s in splits]


# DomainBed's batch size on MNIST-sized images (every algorithm; ARM keeps it there too)
SMALL_IMAGES_BATCH_SIZE = Hparam(64, lambda r: int(2 ** r.uniform(3, 9)), low=1)


class Algorithm(torch.nn.Module):
    """A method for domain generalization.

    update(minibatches, unlabeled=None) takes one step on [(x, y), ...] (one pair per
    training environment) and returns a dict of floats; predict(x) returns logits.

    Optional hooks (defaults do nothing, so DomainBed algorithms need none of them):
    - NEEDS_GROUPS: update() also gets `groups=[g, ...]`, each example's group index per
      minibatch; the run fails with a clear error on datasets without groups.
    - prepare(context): called once with a TrainingContext after construction (and again
      when a run resumes, before its state is restored).
    - group_balanced_batches(step): True to draw that step's minibatches group-balanced.
    - stage(): the training stage the last update belonged to (written into each record).
    """
    registry_name: str   # set by registry.register_algorithm
    NEEDS_GROUPS = False
    # (index, count) of the current micro-batch under gradient accumulation (set by the
    # training loop; ERM.optimizer_step reads it)
    micro_step = (0, 1)
    # lr, weight decay and the optimization choices: DomainBed's, unless the dataset
    # declares its benchmark's own (OPTIMIZER_HPARAMS, e.g. SubpopBench's datasets)
    HPARAMS = {
        "lr": dataset_default("lr", small_or_large(
            Hparam(1e-3, lambda r: 10 ** r.uniform(-4.5, -2.5), low=0.0),
            Hparam(5e-5, lambda r: 10 ** r.uniform(-5, -3.5), low=0.0))),
        "weight_decay": dataset_default("weight_decay", small_or_large(
            Hparam(0.0, lambda r: 0.0, low=0.0),
            Hparam(0.0, lambda r: 10 ** r.uniform(-6, -2), low=0.0))),
        **{name: dataset_default(name, decl) for name, decl in OPTIMIZATION_HPARAMS.items()},
        "batch_size": small_or_large(SMALL_IMAGES_BATCH_SIZE, by_dataset({
            ("DomainNet",): Hparam(32, lambda r: int(2 ** r.uniform(3, 5)), low=1),
            None: Hparam(32, lambda r: int(2 ** r.uniform(3, 5.5)), low=1)})),
    }

    def __init__(self, input_shape: tuple[int, ...], num_classes: int, num_domains: int,
                 hparams: dict[str, Any]) -> None:
        super().__init__()
        self.hparams = hparams

    def update(self, minibatches: list[tuple[torch.Tensor, ...]],
               unlabeled: list[torch.Tensor] | None = None) -> dict[str, float]:
        raise NotImplementedError

    def predict(self, x: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def prepare(self, context: Any) -> None:
        """Receive the run's TrainingContext (training data, length, seed)."""

    def group_balanced_batches(self, step: int) -> bool:
        return False

    def stage(self) -> None:
        return None
