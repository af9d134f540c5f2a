"""Prompt enumeration and seeded sampling.

Every (breed, location) has 72 prompts: fur (4) x pose (3) x time of day (6, one entry
doubled). Attempt k of a cell takes entry k % 72 of the k // 72-th seeded permutation
of the 72, so each block of 72 attempts covers every combination once: fur, pose and
time of day are balanced and independent of the breed by construction.
"""
from __future__ import annotations

import hashlib
import itertools
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from spawrious.constants import (
    ANIMAL_PHRASES,
    FUR,
    LOCATION_PHRASES,
    POSES,
    TEMPLATE,
    TIMES_OF_DAY,
    check_breed,
    check_location,
)


@dataclass(frozen=True)
class PromptSpec:
    breed: str
    location: str
    fur: str
    pose: str
    time_of_day: str
    tod_index: int    # position in TIMES_OF_DAY (tells the two "bright sunny day" apart)

    @property
    def text(self) -> str:
        return format_prompt(self.breed, self.location, self.fur, self.pose, self.time_of_day)

    def attributes(self) -> dict[str, Any]:
        return asdict(self)


def _squash(text: str) -> str:
    return " ".join(text.split())


def format_prompt(breed: str, location: str, fur: str, pose: str, time_of_day: str,
                  template: str = TEMPLATE) -> str:
    """The prompt text; empty slots leave no double spaces (as the authors' prompts)."""
    text = template.format(fur=fur, animal=ANIMAL_PHRASES[breed], pose=pose,
                           location=LOCATION_PHRASES[location], tod=time_of_day)
    return _squash(text).replace("((( ", "(((").replace(" )))", ")))")


def enumerate_prompts(breed: str, location: str) -> list[PromptSpec]:
    """The 72 PromptSpecs of one (breed, location), in fur x pose x time-of-day order."""
    check_breed(breed)
    check_location(location)
    return [PromptSpec(breed, location, fur, pose, tod, t)
            for fur, pose, (t, tod) in itertools.product(FUR, POSES, enumerate(TIMES_OF_DAY))]


def derive_seed(*parts: object) -> int:
    """A stable 31-bit seed from printable parts (seed, pool, location, breed, index...)."""
    digest = hashlib.sha256(repr(tuple(parts)).encode("utf-8")).hexdigest()
    return int(digest[:8], 16) & 0x7FFFFFFF


def prompt_for_attempt(seed: int, pool: int, breed: str, location: str, attempt: int) -> PromptSpec:
    """The PromptSpec of attempt `attempt` (0, 1, ...) of a cell (seeded, balanced)."""
    prompts = enumerate_prompts(breed, location)
    block, pos = divmod(int(attempt), len(prompts))
    order = np.random.RandomState(derive_seed(seed, pool, location, breed, "block", block))\
        .permutation(len(prompts))
    return prompts[int(order[pos])]


def sample_prompts(breed: str, location: str, n: int, seed: int = 0, pool: int = 0,
                   start: int = 0) -> list[PromptSpec]:
    """Attempts start .. start+n-1 of a cell, as PromptSpecs."""
    return [prompt_for_attempt(seed, pool, breed, location, k) for k in range(start, start + n)]


def image_seed(seed: int, pool: int, breed: str, location: str, attempt: int) -> int:
    """The generator seed of one attempt (distinct across pools, cells and attempts)."""
    return derive_seed(seed, pool, location, breed, "image", int(attempt))
