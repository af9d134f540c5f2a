"""Vectorised anti-aliased drawing on float RGB canvases (numpy only).

Shapes are signed-distance functions evaluated on the pixel grid of their bounding box
only, so drawing many small shapes on a large canvas stays cheap. Coordinates are in
pixels, origin top-left, pixel centres at (i + 0.5).
"""
from __future__ import annotations

from typing import Any

import numpy as np
from numpy.typing import ArrayLike
from PIL import Image


def window(size: tuple[int, int], x0: float, x1: float, y0: float, y1: float,
           pad: float = 1.5) -> tuple[slice, slice, np.ndarray, np.ndarray] | None:
    """(row slice, col slice, X, Y) of the clipped bounding box, or None if off-canvas."""
    h, w = size
    c0, c1 = max(int(np.floor(x0 - pad)), 0), min(int(np.ceil(x1 + pad)), w)
    r0, r1 = max(int(np.floor(y0 - pad)), 0), min(int(np.ceil(y1 + pad)), h)
    if c0 >= c1 or r0 >= r1:
        return None
    ys = np.arange(r0, r1, dtype=np.float32) + 0.5
    xs = np.arange(c0, c1, dtype=np.float32) + 0.5
    return slice(r0, r1), slice(c0, c1), xs[None, :], ys[:, None]


def coverage(sdf: np.ndarray) -> np.ndarray:
    """Anti-aliased coverage in [0, 1] from a signed distance in pixels."""
    return np.clip(0.5 - sdf, 0.0, 1.0)


def sdf_ellipse(X: np.ndarray, Y: np.ndarray, cx: float, cy: float, ax: float, ay: float,
                angle: float = 0.0) -> np.ndarray:
    c, s = np.cos(angle), np.sin(angle)
    u = (X - cx) * c + (Y - cy) * s
    v = -(X - cx) * s + (Y - cy) * c
    return (np.sqrt((u / ax) ** 2 + (v / ay) ** 2) - 1.0) * min(ax, ay)


def sdf_capsule(X: np.ndarray, Y: np.ndarray, x0: float, y0: float, x1: float, y1: float, r0: float,
                r1: float | None = None) -> np.ndarray:
    """A segment with (linearly varying) radius."""
    r1 = r0 if r1 is None else r1
    dx, dy = x1 - x0, y1 - y0
    denom = dx * dx + dy * dy + 1e-9
    t = np.clip(((X - x0) * dx + (Y - y0) * dy) / denom, 0.0, 1.0)
    px, py = X - (x0 + t * dx), Y - (y0 + t * dy)
    return np.sqrt(px * px + py * py) - (r0 + (r1 - r0) * t)


def sdf_convex(X: np.ndarray, Y: np.ndarray, pts: ArrayLike) -> np.ndarray:
    """A convex polygon (any vertex order): max of the signed distances to its edges."""
    pts = np.asarray(pts, dtype=np.float64)
    area = 0.5 * np.sum(pts[:, 0] * np.roll(pts[:, 1], -1) - np.roll(pts[:, 0], -1) * pts[:, 1])
    sign = 1.0 if area > 0 else -1.0
    d: Any = None
    for (xa, ya), (xb, yb) in zip(pts, np.roll(pts, -1, axis=0)):
        ex, ey = xb - xa, yb - ya
        n = np.hypot(ex, ey) + 1e-9
        # outward normal for counter-clockwise (in y-down pixel space: clockwise) order
        dist = sign * ((X - xa) * ey - (Y - ya) * ex) / n
        d = dist if d is None else np.maximum(d, dist)
    return d


def bbox_ellipse(cx: float, cy: float, ax: float, ay: float) -> tuple[float, float, float, float]:
    r = max(ax, ay)
    return cx - r, cx + r, cy - r, cy + r


def bbox_points(pts: ArrayLike, pad: float = 0.0) -> tuple[float, float, float, float]:
    pts = np.asarray(pts, dtype=np.float64)
    lo, hi = pts.min(axis=0) - pad, pts.max(axis=0) + pad
    return lo[0], hi[0], lo[1], hi[1]


def blend(img: np.ndarray, sl: tuple[slice, slice], alpha: np.ndarray, color: ArrayLike) -> None:
    """img[sl] <- img[sl] * (1 - alpha) + color * alpha (color: rgb or per-pixel array)."""
    rs, cs = sl
    a = alpha[..., None]
    img[rs, cs] = img[rs, cs] * (1.0 - a) + np.asarray(color, dtype=np.float32) * a


def shape_coverage(size: tuple[int, int], kind: str,
                   params: Any) -> tuple[tuple[slice, slice], np.ndarray] | None:
    """((row slice, col slice), coverage) of one shape on a canvas of `size`, or None.

    kind: 'ellipse' (cx, cy, ax, ay[, angle]), 'capsule' (x0, y0, x1, y1, r0[, r1]) or
    'poly' [(x, y), ...] (convex)."""
    if kind == "ellipse":
        cx, cy, ax, ay = params[:4]
        angle = params[4] if len(params) > 4 else 0.0
        win = window(size, *bbox_ellipse(cx, cy, ax, ay))
        if win is None:
            return None
        rs, cs, X, Y = win
        return (rs, cs), coverage(sdf_ellipse(X, Y, cx, cy, ax, ay, angle))
    if kind == "capsule":
        x0, y0, x1, y1, r0 = params[:5]
        r1 = params[5] if len(params) > 5 else r0
        r = max(r0, r1)
        win = window(size, min(x0, x1) - r, max(x0, x1) + r, min(y0, y1) - r, max(y0, y1) + r)
        if win is None:
            return None
        rs, cs, X, Y = win
        return (rs, cs), coverage(sdf_capsule(X, Y, x0, y0, x1, y1, r0, r1))
    if kind == "poly":
        win = window(size, *bbox_points(params))
        if win is None:
            return None
        rs, cs, X, Y = win
        return (rs, cs), coverage(sdf_convex(X, Y, params))
    raise ValueError(f"unknown shape {kind!r}")


def draw(img: np.ndarray, kind: str, params: Any, color: ArrayLike, opacity: float = 1.0) -> None:
    """Draw one anti-aliased shape in a flat colour."""
    found = shape_coverage(img.shape[:2], kind, params)
    if found is None:
        return
    sl, a = found
    blend(img, sl, a * opacity if opacity != 1.0 else a, color)


def value_noise(rng: np.random.Generator, size: tuple[int, int], cells: float,
                octaves: int = 1) -> np.ndarray:
    """Smooth noise in [0, 1] of shape `size` (h, w): bicubic-upsampled random grids."""
    h, w = size
    out = np.zeros((h, w), dtype=np.float32)
    total = 0.0
    for o in range(octaves):
        n = max(2, int(cells * (2 ** o)))
        grid = rng.random((n, n)).astype(np.float32)
        layer = np.asarray(Image.fromarray(grid, mode="F").resize((w, h), Image.Resampling.BICUBIC))
        weight = 0.5 ** o
        out += weight * layer
        total += weight
    out /= total
    return np.clip(out, 0.0, 1.0)


def vgradient(h: int, w: int, top: ArrayLike, bottom: ArrayLike, y0: float = 0.0,
              y1: float = 1.0) -> np.ndarray:
    """A vertical colour ramp from `top` at y0*h to `bottom` at y1*h (clamped)."""
    t = np.clip((np.arange(h, dtype=np.float32) / max(h - 1, 1) - y0) / max(y1 - y0, 1e-6), 0, 1)
    top, bottom = np.asarray(top, np.float32), np.asarray(bottom, np.float32)
    ramp = top[None, :] * (1 - t[:, None]) + bottom[None, :] * t[:, None]
    return np.broadcast_to(ramp[:, None, :], (h, w, 3)).copy()


def to_uint8(img: np.ndarray) -> np.ndarray:
    return (np.clip(img, 0.0, 1.0) * 255.0 + 0.5).astype(np.uint8)
