"""Numerical precision of a run: fp32, or bf16 autocast where the hardware supports it."""
import os
from typing import Any

import torch

from oodutils.errors import UserError
from oodutils.log import get_logger

logger = get_logger(__name__)

# Lets bf16 run where the CPU only emulates it: slow, but its numerics can be studied.
ALLOW_EMULATED_BF16 = "DOMAINBED_ALLOW_EMULATED_BF16"


def cpu_supports_bf16() -> bool:
    checks = [getattr(torch.cpu, "_is_avx512_bf16_supported", None),
              getattr(torch.cpu, "_is_amx_tile_supported", None)]
    if any(check is not None and check() for check in checks):
        return True
    try:
        with open("/proc/cpuinfo") as f:
            flags = f.read()
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


def autocast_context(device: Any, precision: Any) -> Any:
    if precision == "fp32":
        return torch.autocast(device_type=device.type, enabled=False)
    return torch.autocast(device_type=device.type, dtype=torch.bfloat16)


def check_precision(device: Any, precision: Any) -> None:
    if precision == "fp32":
        return
    if precision != "bf16":
        raise UserError(f"unknown precision {precision!r}; valid: fp32, bf16")
    if device.type == "cuda" and not torch.cuda.is_bf16_supported():
        raise UserError("--precision bf16 needs a GPU with bfloat16 support")
    if device.type == "cpu" and not cpu_supports_bf16():
        if os.environ.get(ALLOW_EMULATED_BF16) == "1":
            logger.info(f"notice: {ALLOW_EMULATED_BF16}=1: bfloat16 is emulated on this CPU "
                        "(same rounding, many times slower); use it to study bf16 numerics, "
                        "not speed")
            return
        raise UserError("--precision bf16 needs a CPU with AVX-512 BF16 or AMX; this CPU has "
                        "neither, so bfloat16 would be emulated and slower: use fp32 (or set "
                        f"{ALLOW_EMULATED_BF16}=1 to study bf16 numerics anyway)")


