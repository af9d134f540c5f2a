"""Gradient accumulation: a step's minibatches cut into `grad_accum_steps` equal parts, each
part's loss backpropagated before one optimizer step (only for algorithms whose update is one
loss through ERM.optimizer_step)."""
from typing import Any

from domainbed.algorithms.base import supports_grad_accumulation
from oodutils.errors import UserError


def check_grad_accumulation(algorithm_name: Any, algorithm_cls: Any,
                            hparams: dict[str, Any]) -> Any:
    """The run's grad_accum_steps; more than 1 only for algorithms whose update is one loss
    through ERM.optimizer_step (a clear error for the others, before any work)."""
    steps = int(hparams.get("grad_accum_steps", 1))
    if steps > 1 and not supports_grad_accumulation(algorithm_cls):
        raise UserError(f"{algorithm_name} does not support grad_accum_steps > 1 (its "
                        f"update steps its optimizers itself); algorithms that do: those "
                        f"with one loss and one optimizer, e.g. ERM, GroupDRO, IRM, VREx, "
                        f"CORAL, MMD")
    return steps


def micro_batch(index: Any, count: Any) -> Any:
    """A function slicing each tensor (or (x, y) pair) of a list into `count` equal parts
    and keeping part `index` (the whole list when count is 1)."""
    def part(tensor: Any) -> Any:
        size = tensor.shape[0] // count
        return tensor[index * size:(index + 1) * size]

    def micro(items: Any) -> Any:
        if count == 1:
            return items
        return [tuple(part(t) for t in item) if isinstance(item, tuple) else part(item)
                for item in items]
    return micro
