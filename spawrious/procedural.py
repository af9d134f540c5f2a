"""The procedural backend: deterministic offline images with the same factors as the
prompts. Location -> background scene, breed -> silhouette, fur -> coat colour (not a
function of the breed), pose -> shape, time of day -> global lighting, fog or rain.

An image is a pure function of (PromptSpec, seed, size): `render(spec, seed, size)`.
"""
from __future__ import annotations

from typing import Any, cast

import numpy as np

from spawrious.backgrounds import render_background
from spawrious.dogs import build_dog, paint_dog, place_dog
from spawrious.prompts import PromptSpec
from spawrious.raster import to_uint8

FOG = np.array((0.82, 0.83, 0.85), np.float32)


def _desaturate(img: np.ndarray, amount: float) -> np.ndarray:
    grey = img.mean(axis=2, keepdims=True)
    return img * (1 - amount) + grey * amount


def _rain(img: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    h, w = img.shape[:2]
    drops = (rng.random((h, w)) < 0.004).astype(np.float32)
    length = max(3, int(round(min(h, w) / 18)))
    streaks = np.zeros_like(drops)
    for k in range(length):
        streaks += np.roll(drops, (k, int(round(0.3 * k))), axis=(0, 1))
    a = 0.45 * np.clip(streaks, 0, 1)[..., None]
    return img * (1 - a) + np.array((0.85, 0.87, 0.92), np.float32) * a


def grade(img: np.ndarray, time_of_day: str, rng: np.random.Generator) -> np.ndarray:
    """Time-of-day grading of the whole frame (independent of location and breed)."""
    h = img.shape[0]
    top = (1.0 - np.arange(h, dtype=np.float32) / np.float32(max(h - 1, 1)))[:, None, None]
    if time_of_day == "pale sunrise":
        img = _desaturate(img, 0.2) * np.array((1.0, 0.93, 0.95), np.float32)
        img = img + top * np.array((0.16, 0.07, 0.10), np.float32) * rng.uniform(0.7, 1.0)
    elif time_of_day == "sunset":
        img = img * np.array((1.0, 0.76, 0.56), np.float32) * rng.uniform(0.82, 0.92)
        img = img + top * np.array((0.18, 0.06, 0.0), np.float32)
    elif time_of_day == "rainy day":
        img = _desaturate(img, 0.45) * rng.uniform(0.65, 0.75)
        img = img + np.array((0.02, 0.03, 0.06), np.float32)
        img = _rain(img, rng)
    elif time_of_day == "foggy day":
        a = (rng.uniform(0.25, 0.4) + 0.2 * top)
        img = img * (1 - a) + FOG * a
    else:  # bright sunny day
        img = (img - 0.5) * 1.12 + 0.54
        img = img * np.array((1.03, 1.0, 0.95), np.float32)
    img = img + rng.standard_normal(img.shape, dtype=np.float32) * np.float32(0.012)
    return np.clip(img, 0.0, 1.0)


def render(spec: PromptSpec, seed: int, size: int | tuple[int, int] = 224,
           return_mask: bool = False) -> Any:
    """One image (uint8 H x W x 3) for a PromptSpec; `size` an int or (height, width)."""
    h, w = cast("tuple[int, int]", (size, size) if np.isscalar(size) else size)
    rng = np.random.default_rng(int(seed))
    bg_rng, dog_rng, fur_rng, tod_rng = (np.random.default_rng(s)
                                         for s in rng.integers(0, 2 ** 31, 4))
    img, horizon = render_background(spec.location, bg_rng, h, w)
    parts, bbox = place_dog(build_dog(spec.breed, spec.pose, dog_rng), dog_rng, h, w, horizon)
    mask = paint_dog(img, parts, spec.fur, fur_rng, bbox)
    out = to_uint8(grade(img, spec.time_of_day, tod_rng))
    return (out, mask) if return_mask else out


def render_background_only(location: str, seed: int, size: int | tuple[int, int] = 224,
                           time_of_day: str = "bright sunny day") -> np.ndarray:
    """The scene with no dog (for the location gate and for inspection)."""
    h, w = cast("tuple[int, int]", (size, size) if np.isscalar(size) else size)
    rng = np.random.default_rng(int(seed))
    bg_rng, tod_rng = (np.random.default_rng(s) for s in rng.integers(0, 2 ** 31, 2))
    img, _ = render_background(location, bg_rng, h, w)
    return to_uint8(grade(img, time_of_day, tod_rng))
