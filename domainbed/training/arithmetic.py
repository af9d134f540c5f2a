"""Which arithmetic computed a run: the name every record's `args` carries, and the
resume rule built on it.

One run can be computed several ways (alone, in a fused group exactly or batched, as a
head of a probe stack, data-parallel over N processes); they agree to the last bit only
where the kernels are the same by construction. A record says which way it was computed
(`args.arithmetic`, with `args.torch_version` and `args.device_kind` beside it), and a
resume never continues a run in another arithmetic than the one that started it. A
record without the key (DomainBed's own, or this project's before it) counts as
`single`. See docs/CONTRACTS.md ("Arithmetic").
"""
import json
import re
from typing import Any

import torch

SINGLE, FUSED_EXACT, FUSED_BATCHED, PROBE_STACK = ("single", "fused-exact", "fused-batched",
                                                   "probe-stack")
NAMES = (SINGLE, FUSED_EXACT, FUSED_BATCHED, PROBE_STACK, "data-parallel-N")
# names whose numbers are the same bit for bit (fused exact runs each member's own
# single-run step): one may resume the other
SAME_NUMBERS = ({SINGLE, FUSED_EXACT},)
ARGS_KEYS = ("arithmetic", "torch_version", "device_kind")


def data_parallel(world_size: int) -> str:
    return f"data-parallel-{int(world_size)}"


def is_name(name: str) -> Any:
    return name in NAMES[:4] or bool(re.fullmatch(r"data-parallel-[1-9][0-9]*", str(name)))


def of_record(record: Any) -> Any:
    """The arithmetic that computed a record (a dict): `single` when its args do not say."""
    args = record.get("args") if isinstance(record, dict) else None
    name = args.get("arithmetic") if isinstance(args, dict) else None
    return name if isinstance(name, str) else SINGLE


def same_numbers(a: Any, b: Any) -> Any:
    return a == b or any({a, b} <= group for group in SAME_NUMBERS)


def device_kind(device: torch.device | str) -> Any:
    """`cpu`, or an accelerator's type and name (`cuda (NVIDIA H200)`)."""
    device = torch.device(device)
    if device.type == "cuda":
        return f"cuda ({torch.cuda.get_device_name(device)})"
    return device.type


def args_entries(name: str, device: torch.device | str) -> dict[str, Any]:
    """The record `args` entries of a run computed in `name` on `device`."""
    if not is_name(name):
        raise ValueError(f"unknown arithmetic {name!r}; one of {', '.join(NAMES)}")
    return {"arithmetic": name, "torch_version": str(torch.__version__),
            "device_kind": device_kind(device)}


def resume_problem(vouched_records: Any, name: str) -> str | None:
    """Why a run computed in `name` may not continue the run whose resume state vouches
    for `vouched_records` (JSON lines), or None."""
    previous = None
    for line in reversed(list(vouched_records)):
        try:
            previous = of_record(json.loads(line))
            break
        except ValueError:
            continue
    if previous is None or same_numbers(previous, name):
        return None
    return (f"its records were computed in arithmetic {previous!r} and this run would "
            f"continue it in {name!r}")
