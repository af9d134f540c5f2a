"""Procedural dogs: the breed sets the silhouette, the pose changes it, the fur colours it.

A dog is a list of parts (ellipses, tapered capsules, convex polygons) in body units
(x forward, y up, ground at y = 0), built from one breed's proportions:
bulldog: squat, deep chest, thick short legs, big head, flat muzzle, small rose ears;
dachshund: very long low body, stubby legs, long muzzle, long floppy ears, thin tail;
labrador: long legs, proportionate body, floppy ears, long tail;
corgi: long body on very short legs, large upright pointed ears, no tail, fluffy rump.
Every image is scaled to a similar width, so the breed shows in proportions and parts,
not in size. The fur colour is drawn independently of the breed (fur: black, brown,
white, or unspecified = a natural tan/golden shade picked by the image's own RNG).
"""
from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from spawrious.raster import blend, draw, shape_coverage, value_noise

# body units; ear kinds: 'floppy' (ellipse cx, cy, ax, ay, angle) or 'pointy' (two triangles)
BREED_SHAPES = {
    "bulldog": dict(body=(0.0, 1.45, 1.2, 0.72), chest=(0.7, 1.35, 0.75, 0.85), leg_r=(0.3, 0.24),
                    front_x=0.85, hind_x=-0.85, neck=(0.9, 1.7, 1.25, 2.0, 0.55),
                    head=(1.55, 2.1, 0.72, 0.62), muzzle=(2.15, 1.9, 0.22, 0.36),
                    jowl=(1.95, 1.68, 0.36, 0.3),
                    ears=("rose", [(1.05, 2.5), (1.4, 2.72), (1.0, 2.95)]),
                    tail=(-1.15, 1.7, -1.38, 1.62, 0.13, 0.1)),
    "dachshund": dict(body=(0.0, 1.0, 2.1, 0.48), chest=(1.2, 0.85, 0.7, 0.45), leg_r=(0.17, 0.14),
                      front_x=1.55, hind_x=-1.6, neck=(1.8, 1.15, 2.3, 1.65, 0.3),
                      head=(2.5, 1.85, 0.42, 0.34), muzzle=(3.15, 1.72, 0.6, 0.19), jowl=None,
                      ears=("floppy", (2.3, 1.55, 0.2, 0.45, 0.1)),
                      tail=(-2.0, 1.15, -2.9, 1.55, 0.1, 0.04)),
    "labrador": dict(body=(0.0, 2.1, 1.6, 0.62), chest=(0.9, 2.0, 0.6, 0.55), leg_r=(0.22, 0.17),
                     front_x=1.05, hind_x=-1.1, neck=(1.2, 2.35, 1.75, 3.05, 0.38),
                     head=(1.95, 3.25, 0.52, 0.44), muzzle=(2.5, 3.05, 0.48, 0.24), jowl=None,
                     ears=("floppy", (1.75, 3.05, 0.18, 0.38, 0.2)),
                     tail=(-1.5, 2.4, -2.6, 1.7, 0.14, 0.08)),
    "corgi": dict(body=(0.0, 1.15, 1.55, 0.58), chest=(1.0, 1.05, 0.55, 0.5), leg_r=(0.22, 0.2),
                  front_x=1.0, hind_x=-1.05, neck=(1.25, 1.35, 1.7, 1.9, 0.36),
                  head=(1.95, 2.05, 0.5, 0.42), muzzle=(2.5, 1.9, 0.38, 0.2), jowl=None,
                  ears=("pointy", [(1.58, 2.3), (1.92, 2.38), (1.68, 3.2)],
                        [(1.95, 2.38), (2.28, 2.28), (2.2, 3.12)]),
                  tail=None, rump=(-1.45, 1.3, 0.38, 0.48)),
}

#: one drawn part of a dog: (tag, shape kind, shape parameters, shade factor)
DogPart = tuple[str, str, Any, float]

FUR_COLOURS = {"black": (0.10, 0.09, 0.09), "brown": (0.42, 0.25, 0.12),
               "white": (0.93, 0.91, 0.87)}
NATURAL_SHADES = ((0.82, 0.62, 0.32), (0.74, 0.56, 0.38), (0.90, 0.80, 0.60))


def fur_colour(fur: str, rng: np.random.Generator) -> np.ndarray:
    """The fur's base RGB: a function of the fur attribute and the image's RNG only."""
    if fur in FUR_COLOURS:
        base = np.array(FUR_COLOURS[fur], np.float32)
    else:  # unspecified: a natural shade, as a text-to-image model would pick
        a, b = rng.choice(len(NATURAL_SHADES), 2, replace=False)
        t = rng.random()
        shades = np.array(NATURAL_SHADES, np.float32)
        base = (1 - t) * shades[a] + t * shades[b]
    return np.clip(base * rng.uniform(0.9, 1.1, 3).astype(np.float32), 0, 1)


def _rot(pt: Sequence[float], pivot: Sequence[float], theta: float) -> tuple[float, float]:
    c, s = np.cos(theta), np.sin(theta)
    x, y = pt[0] - pivot[0], pt[1] - pivot[1]
    return (pivot[0] + c * x - s * y, pivot[1] + s * x + c * y)


def _transform(part: DogPart, fn: Callable[[Sequence[float]], tuple[float, float]],
               dtheta: float = 0.0) -> DogPart:
    """Apply a point map to a part; ellipses also turn by dtheta."""
    tag, kind, p, shade = part
    if kind == "ellipse":
        cx, cy = fn((p[0], p[1]))
        p = (cx, cy, p[2], p[3], p[4] + dtheta)
    elif kind == "capsule":
        (x0, y0), (x1, y1) = fn((p[0], p[1])), fn((p[2], p[3]))
        p = (x0, y0, x1, y1, p[4], p[5])
    else:
        p = [fn(q) for q in p]
    return (tag, kind, p, shade)


def _jitter(spec: Mapping[str, Any], rng: np.random.Generator,
            amount: float = 0.06) -> dict[str, Any]:
    """Intra-breed variation: every length scaled by its own factor near 1."""
    out = {}
    for key, value in spec.items():
        if value is None or key in ("ears",):
            out[key] = value
        elif isinstance(value, tuple):
            out[key] = tuple(v * rng.uniform(1 - amount, 1 + amount) for v in value)
        else:
            out[key] = value * rng.uniform(1 - amount, 1 + amount)
    return out


def build_dog(breed: str, pose: str, rng: np.random.Generator) -> list[DogPart]:
    """The parts of one dog in body units: [(tag, kind, params, shade), ...]."""
    spec = _jitter(BREED_SHAPES[breed], rng)
    bx, by, bax, bay = spec["body"]
    upper = []
    if spec["tail"] is not None:
        upper.append(("tail", "capsule", spec["tail"], 0.92))
    if spec.get("rump"):
        rx, ry, rax, ray = spec["rump"]
        upper.append(("body", "ellipse", (rx, ry, rax, ray, 0.0), 0.97))
    upper.append(("body", "ellipse", (bx, by, bax, bay, 0.0), 1.0))
    cx, cy, cax, cay = spec["chest"]
    upper.append(("body", "ellipse", (cx, cy, cax, cay, 0.0), 1.02))
    upper.append(("neck", "capsule", spec["neck"] + (spec["neck"][4] * 0.9,), 1.0))
    hx, hy, hax, hay = spec["head"]
    upper.append(("head", "ellipse", (hx, hy, hax, hay, 0.0), 1.05))
    mx, my, max_, may = spec["muzzle"]
    upper.append(("muzzle", "ellipse", (mx, my, max_, may, -0.1), 1.1))
    if spec["jowl"] is not None:
        jx, jy, jax, jay = spec["jowl"]
        upper.append(("muzzle", "ellipse", (jx, jy, jax, jay, 0.0), 0.95))
    kind = spec["ears"][0]
    if kind == "floppy":
        ex, ey, eax, eay, ea = spec["ears"][1]
        ear_angle = ea + (0.9 if pose == "running" else 0.0)
        upper.append(("ear", "ellipse", (ex, ey, eax, eay, ear_angle), 0.72))
    else:
        for tri in spec["ears"][1:]:
            upper.append(("ear", "poly", list(tri), 0.8))
    # eye and nose (drawn dark on every coat)
    upper.append(("eye", "ellipse", (hx + 0.35 * hax, hy + 0.2 * hay, 0.075, 0.075, 0.0), 0.0))
    upper.append(("nose", "ellipse", (mx + 0.9 * max_, my + 0.25 * may, 0.09, 0.075, 0.0), 0.0))

    r0, r1 = spec["leg_r"]
    fx, hxl = spec["front_x"], spec["hind_x"]
    leg_top = by
    legs_far, legs_near = [], []
    if pose == "running":
        phi = rng.uniform(0.45, 0.7)
        drop = leg_top * (1 - np.cos(phi))
        upper = [_transform(p, lambda q: (q[0], q[1] - drop)) for p in upper]
        top = leg_top - drop
        reach = leg_top * np.sin(phi)
        legs_near += [(fx, top, fx + reach, 0.0), (hxl, top, hxl - reach, 0.0)]
        legs_far += [(fx - 0.15, top, fx - 0.15 + 0.35 * reach, 0.0),
                     (hxl + 0.15, top, hxl + 0.15 + 0.35 * reach, 0.0)]
    elif pose == "sitting":
        theta = rng.uniform(0.45, 0.65)
        pivot = (-0.75 * bax, by - 0.6 * bay)
        hip = 0.9 * bay
        drop = pivot[1] - hip

        def sit(q: Sequence[float]) -> tuple[float, float]:
            x, y = _rot(q, pivot, theta)
            return (x, y - drop)
        upper = [_transform(p, sit, theta) for p in upper]
        shoulder = sit((fx, leg_top))
        legs_near.append((shoulder[0], shoulder[1], shoulder[0] + 0.1, 0.0))
        legs_far.append((shoulder[0] - 0.18, shoulder[1], shoulder[0] - 0.1, 0.0))
        px = pivot[0] + 0.25
        upper.insert(0, ("leg", "ellipse", (px, 1.05 * hip, 1.05 * bay, 0.95 * bay, 0.3), 0.95))
        legs_near.append((px + 0.1, r1, px + 0.1 + 0.9 * bay, r1))
    else:  # standing ([empty] pose)
        legs_near += [(fx + 0.1, leg_top, fx + 0.12, 0.0), (hxl + 0.1, leg_top, hxl + 0.05, 0.0)]
        legs_far += [(fx - 0.12, leg_top, fx - 0.1, 0.0), (hxl - 0.12, leg_top, hxl - 0.18, 0.0)]
    far = [("leg", "capsule", (a, b, c, d, r0, r1), 0.78) for a, b, c, d in legs_far]
    near = [("leg", "capsule", (a, b, c, d, r0, r1), 1.0) for a, b, c, d in legs_near]
    body_idx = next(i for i, p in enumerate(upper) if p[0] == "body")
    return far + upper[:body_idx + 2] + near + upper[body_idx + 2:]


def local_bounds(parts: Sequence[DogPart]) -> tuple[float, float, float, float]:
    xs, ys = [], []
    for _, kind, p, _ in parts:
        if kind == "ellipse":
            c, s = abs(np.cos(p[4])), abs(np.sin(p[4]))
            hw, hh = np.hypot(p[2] * c, p[3] * s), np.hypot(p[2] * s, p[3] * c)
            xs += [p[0] - hw, p[0] + hw]
            ys += [p[1] - hh, p[1] + hh]
        elif kind == "capsule":
            r = max(p[4], p[5])
            xs += [p[0] - r, p[0] + r, p[2] - r, p[2] + r]
            ys += [p[1] - r, p[1] + r, p[3] - r, p[3] + r]
        else:
            xs += [q[0] for q in p]
            ys += [q[1] for q in p]
    return min(xs), max(xs), min(0.0, min(ys)), max(ys)


def to_pixels(parts: Sequence[DogPart], unit: float, x_origin: float, ground: float,
              facing: int) -> list[DogPart]:
    """Body units -> pixel coordinates (y down; facing -1 mirrors the dog)."""
    def fn(q: Sequence[float]) -> tuple[float, float]:
        return (x_origin + facing * q[0] * unit, ground - q[1] * unit)
    out: list[DogPart] = []
    for tag, kind, p, shade in parts:
        if kind == "ellipse":
            cx, cy = fn((p[0], p[1]))
            angle = np.arctan2(-np.sin(p[4]), facing * np.cos(p[4]))
            out.append((tag, kind, (cx, cy, p[2] * unit, p[3] * unit, angle), shade))
        elif kind == "capsule":
            (x0, y0), (x1, y1) = fn((p[0], p[1])), fn((p[2], p[3]))
            out.append((tag, kind, (x0, y0, x1, y1, p[4] * unit, p[5] * unit), shade))
        else:
            out.append((tag, kind, [fn(q) for q in p], shade))
    return out


def place_dog(parts: Sequence[DogPart], rng: np.random.Generator, h: int, w: int,
              horizon: float) -> tuple[list[DogPart], tuple[float, float, float, float]]:
    """Scale and position: similar width for every breed, feet on the ground below the
    horizon, fully inside the frame. Returns pixel-space parts and the pixel bbox."""
    x0, x1, y0, y1 = local_bounds(parts)
    width, height = x1 - x0, y1 - y0
    unit = rng.uniform(0.6, 0.8) * w / width
    unit = min(unit, 0.72 * h / height)
    facing = 1 if rng.random() < 0.5 else -1
    span_px = width * unit
    left = rng.uniform(0.03 * w, max(0.03 * w, 0.97 * w - span_px))
    x_origin = left - x0 * unit if facing == 1 else left + x1 * unit
    lo = max(horizon * h + 0.12 * h, y1 * unit + 0.03 * h)
    ground = rng.uniform(min(lo, 0.95 * h), 0.95 * h)
    pix = to_pixels(parts, unit, x_origin, ground, facing)
    return pix, (left, left + span_px, ground - y1 * unit, ground - y0 * unit)


def _grown(kind: str, p: Any, d: float) -> Any:
    """The same shape, `d` pixels bigger all round (ellipse axes, capsule radii, polygon
    vertices pushed out from the centroid)."""
    if kind == "ellipse":
        return (p[0], p[1], p[2] + d, p[3] + d) + tuple(p[4:])
    if kind == "capsule":
        return tuple(p[:4]) + (p[4] + d, (p[5] if len(p) > 5 else p[4]) + d)
    pts = np.asarray(p, np.float64)
    c = pts.mean(axis=0)
    v = pts - c
    n = np.linalg.norm(v, axis=1, keepdims=True) + 1e-9
    return [tuple(q) for q in c + v * (1 + 1.6 * d / n)]


def paint_dog(img: np.ndarray, parts: Sequence[DogPart], fur: str, rng: np.random.Generator,
              bbox: tuple[float, float, float, float]) -> np.ndarray:
    """Composite the dog: coverage and per-part shade, then fur colour with a top-lit
    gradient and a soft coat texture; a ground shadow first; eye and nose last.
    Returns the dog's coverage mask (h x w, float)."""
    h, w = img.shape[:2]
    left, right, top, bottom = bbox
    draw(img, "ellipse", [(left + right) / 2, bottom, 0.5 * (right - left), 0.04 * h],
         (0.0, 0.0, 0.0), 0.3)
    alpha = np.zeros((h, w), np.float32)
    rim = np.zeros((h, w), np.float32)
    shade = np.ones((h, w), np.float32)
    details = []
    grow = max(0.8, min(h, w) / 90)      # rim width in pixels
    for tag, kind, p, part_shade in parts:
        if tag in ("eye", "nose"):
            details.append((kind, p))
            continue
        found = shape_coverage((h, w), kind, _grown(kind, p, grow))
        if found is None:
            continue
        (rs, cs), a = found
        rim[rs, cs] = np.maximum(rim[rs, cs], a)
        found = shape_coverage((h, w), kind, p)
        if found is None:
            continue
        (rs, cs), a = found
        shade[rs, cs] = shade[rs, cs] * (1 - a) + part_shade * a
        alpha[rs, cs] = np.maximum(alpha[rs, cs], a)
    base = fur_colour(fur, rng)
    # work on the dog's window only
    r0, r1 = max(int(top - grow - 2), 0), min(int(np.ceil(bottom + grow + 2)), h)
    c0, c1 = max(int(left - grow - 2), 0), min(int(np.ceil(right + grow + 2)), w)
    win = (slice(r0, r1), slice(c0, c1))
    # a rim that contrasts with the coat (dark around light coats, light around dark ones)
    rim_level = 0.12 if float(base.mean()) > 0.35 else 0.6
    blend(img, win, 0.8 * rim[win], (rim_level,) * 3)
    rows = np.arange(r0, r1, dtype=np.float32)[:, None]
    light = 1.12 - 0.3 * np.clip((rows - top) / max(bottom - top, 1.0), 0, 1)
    coat = 0.9 + 0.2 * value_noise(rng, (r1 - r0, c1 - c0), max(4, (c1 - c0) / 6))
    factor = (shade[win] * light * coat)[..., None]
    colour = np.clip(base[None, None, :] * factor + 0.04 * (factor - 1), 0, 1)
    blend(img, win, alpha[win], colour)
    for kind, p in details:
        draw(img, kind, p, (0.03, 0.03, 0.03))
    return alpha
