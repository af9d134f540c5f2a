"""Procedural backgrounds, one per location: each has its own palette, texture and
structures (pier and ocean, dunes and cactuses, park puddles and bushes, jungle leaves
and trunks, rocky ridges and boulders, snow with a cabin and a snowball).

Every function takes (rng, h, w) and returns (float32 image h x w x 3 in [0, 1],
horizon as a fraction of the height). All sizes scale with the image, so any
resolution draws the same scene.
"""
from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike

from spawrious.raster import draw, value_noise, vgradient


def _jit(rng: np.random.Generator, value: float, spread: float) -> float:
    return value + rng.uniform(-spread, spread)


def _mix(a: ArrayLike, b: ArrayLike, t: float | np.ndarray) -> np.ndarray:
    t = np.asarray(t, np.float32)[..., None]
    return np.asarray(a, np.float32) * (1 - t) + np.asarray(b, np.float32) * t


def _ground_rows(h: int, horizon: float) -> int:
    return int(round(horizon * h))


def beach(rng: np.random.Generator, h: int, w: int) -> tuple[np.ndarray, float]:
    s = min(h, w)
    horizon = _jit(rng, 0.34, 0.05)
    shore = horizon + _jit(rng, 0.2, 0.04)
    img = vgradient(h, w, (0.30, 0.58, 0.92), (0.70, 0.86, 0.98), 0.0, horizon)
    Y, X = np.mgrid[0:h, 0:w].astype(np.float32)
    yf, xf = Y / h, X / w
    ocean = (yf >= horizon)
    shore_line = shore + 0.015 * np.sin(2 * np.pi * (xf * rng.uniform(2, 4) + rng.random()))
    waves = 0.5 + 0.5 * np.sin(2 * np.pi * (yf * rng.uniform(55, 75)
                                            + 0.4 * value_noise(rng, (h, w), 6)))
    sea = _mix((0.04, 0.30, 0.55), (0.10, 0.48, 0.70), waves * ((yf - horizon) / 0.25).clip(0, 1))
    img[ocean] = sea[ocean]
    foam = np.abs(yf - shore_line) < 0.012
    img[foam & ocean] = (0.92, 0.95, 0.97)
    sand = yf > shore_line + 0.012
    grain = value_noise(rng, (h, w), s / 6)
    sand_col = _mix((0.86, 0.76, 0.55), (0.97, 0.89, 0.70), grain)
    img[sand] = sand_col[sand]
    # the pier: a deck on posts running out to sea from one side
    side = rng.integers(2)
    x_end = rng.uniform(0.35, 0.6) * w
    x0, x1 = (0.0, x_end) if side == 0 else (w - x_end, float(w))
    deck_y = (horizon + rng.uniform(0.03, 0.07)) * h
    deck_th = 0.025 * h
    draw(img, "poly", [(x0, deck_y), (x1, deck_y), (x1, deck_y + deck_th), (x0, deck_y + deck_th)],
         (0.36, 0.24, 0.14))
    post_len = 0.07 * h
    for px in np.arange(x0 + 0.02 * w, x1, 0.05 * w):
        draw(img, "capsule", [px, deck_y, px, deck_y + post_len, 0.006 * s], (0.25, 0.16, 0.09))
    # a ball in the sand (playing fetch)
    bx, by = rng.uniform(0.1, 0.9) * w, rng.uniform(0.85, 0.95) * h
    draw(img, "ellipse", [bx, by, 0.02 * s, 0.02 * s], (0.95, 0.35, 0.15))
    return img, horizon


def desert(rng: np.random.Generator, h: int, w: int) -> tuple[np.ndarray, float]:
    s = min(h, w)
    horizon = _jit(rng, 0.36, 0.05)
    img = vgradient(h, w, (0.96, 0.86, 0.62), (0.99, 0.95, 0.82), 0.0, horizon)
    Y, X = np.mgrid[0:h, 0:w].astype(np.float32)
    yf, xf = Y / h, X / w
    dune = horizon + 0.035 * np.sin(2 * np.pi * (xf * rng.uniform(0.8, 1.6) + rng.random()))
    ground = yf >= dune
    ripples = 0.5 + 0.5 * np.sin(2 * np.pi * ((yf + 0.35 * xf) * rng.uniform(28, 40)
                                              + 0.6 * value_noise(rng, (h, w), 5)))
    shade = value_noise(rng, (h, w), 3)
    sand = _mix((0.80, 0.52, 0.26), (0.95, 0.70, 0.40), 0.55 * ripples + 0.45 * shade)
    img[ground] = sand[ground]
    # a second, nearer dune ridge
    dune2 = horizon + 0.15 + 0.05 * np.sin(2 * np.pi * (xf * rng.uniform(0.5, 1.0) + rng.random()))
    ridge = np.abs(yf - dune2) < 0.006
    img[ridge] = img[ridge] * 0.8
    n_cactus = rng.integers(2, 5)
    for _ in range(n_cactus):
        cx = rng.uniform(0.05, 0.95) * w
        base = rng.uniform(horizon + 0.02, 0.75) * h
        height = (0.12 + 0.25 * (base / h - horizon)) * h * rng.uniform(0.8, 1.3)
        r = max(0.018 * s * height / (0.2 * h), 1.0)
        col = (0.16 + 0.08 * rng.random(), 0.42 + 0.1 * rng.random(), 0.18)
        draw(img, "capsule", [cx, base, cx, base - height, r], col)
        for sgn in (-1, 1):
            if rng.random() < 0.8:
                ay = base - height * rng.uniform(0.35, 0.6)
                ax = cx + sgn * r * 2.6
                draw(img, "capsule", [cx, ay, ax, ay, 0.7 * r], col)
                top = ay - height * rng.uniform(0.2, 0.35)
                draw(img, "capsule", [ax, ay, ax, top, 0.7 * r], col)
    return img, horizon


def dirt(rng: np.random.Generator, h: int, w: int) -> tuple[np.ndarray, float]:
    s = min(h, w)
    horizon = _jit(rng, 0.33, 0.05)
    img = vgradient(h, w, (0.62, 0.74, 0.86), (0.82, 0.87, 0.90), 0.0, horizon)
    Y, X = np.mgrid[0:h, 0:w].astype(np.float32)
    yf = Y / h
    ground = yf >= horizon
    blotch = value_noise(rng, (h, w), 5, octaves=2)
    grain = value_noise(rng, (h, w), s / 5)
    grass = _mix((0.26, 0.45, 0.17), (0.40, 0.58, 0.24), grain)
    soil = _mix((0.42, 0.30, 0.18), (0.58, 0.44, 0.28), grain)
    mud = np.clip((blotch - 0.45) * 8, 0, 1)
    ground_col = _mix(grass, soil, mud)
    img[ground] = ground_col[ground]
    # bushes along the horizon
    for _ in range(rng.integers(6, 11)):
        bx = rng.uniform(0, 1) * w
        r = rng.uniform(0.04, 0.09) * s
        col = (0.10 + 0.08 * rng.random(), 0.28 + 0.12 * rng.random(), 0.10)
        draw(img, "ellipse", [bx, horizon * h - 0.2 * r, r * 1.3, r], col)
        draw(img, "ellipse", [bx + 0.5 * r, horizon * h - 0.6 * r, r * 0.8, r * 0.7],
             tuple(c * 1.15 for c in col))
    # puddles: flat grey-blue ellipses with a highlight
    for _ in range(rng.integers(2, 5)):
        px, py = rng.uniform(0.05, 0.95) * w, rng.uniform(horizon + 0.1, 0.97) * h
        ax = rng.uniform(0.06, 0.13) * s
        draw(img, "ellipse", [px, py, ax, ax * rng.uniform(0.25, 0.35)], (0.55, 0.62, 0.72))
        draw(img, "ellipse", [px - 0.3 * ax, py - 0.05 * ax, 0.35 * ax, 0.06 * ax],
             (0.80, 0.86, 0.92))
    return img, horizon


def jungle(rng: np.random.Generator, h: int, w: int) -> tuple[np.ndarray, float]:
    s = min(h, w)
    horizon = _jit(rng, 0.55, 0.05)
    base = value_noise(rng, (h, w), 4, octaves=2)
    img = _mix((0.03, 0.16, 0.05), (0.10, 0.32, 0.10), base)
    # light through gaps in the canopy
    for _ in range(rng.integers(3, 7)):
        draw(img, "ellipse", [rng.uniform(0, w), rng.uniform(0, 0.35 * h),
                              rng.uniform(0.02, 0.05) * s,
                              rng.uniform(0.02, 0.05) * s], (0.75, 0.85, 0.45), 0.7)
    # trunks and vines
    for _ in range(rng.integers(2, 5)):
        tx = rng.uniform(0, w)
        draw(img, "capsule", [tx, -5, tx + rng.uniform(-0.05, 0.05) * w, h + 5,
                              rng.uniform(0.015, 0.035) * s], (0.25, 0.17, 0.09))
    for _ in range(rng.integers(3, 7)):
        vx = rng.uniform(0, w)
        draw(img, "capsule", [vx, -5, vx + rng.uniform(-0.1, 0.1) * w, rng.uniform(0.3, 0.8) * h,
                              0.004 * s], (0.15, 0.35, 0.08))
    # layers of leaves
    n_leaves = int(rng.integers(70, 110))
    for _ in range(n_leaves):
        lx, ly = rng.uniform(0, w), rng.uniform(0, h)
        size = rng.uniform(0.03, 0.07) * s
        g = rng.uniform(0.25, 0.6)
        col = (0.05 + 0.15 * rng.random() * g, g, 0.05 + 0.1 * rng.random())
        draw(img, "ellipse",
             [lx, ly, size, size * rng.uniform(0.3, 0.45), rng.uniform(0, np.pi)], col)
    # forest floor
    Y = np.arange(h, dtype=np.float32)[:, None] / h
    floor = np.broadcast_to(Y >= horizon + 0.25, (h, w))
    leaf_litter = _mix((0.16, 0.22, 0.07), (0.30, 0.30, 0.10), value_noise(rng, (h, w), s / 6))
    img[floor] = 0.5 * img[floor] + 0.5 * leaf_litter[floor]
    return img, horizon


def mountain(rng: np.random.Generator, h: int, w: int) -> tuple[np.ndarray, float]:
    s = min(h, w)
    horizon = _jit(rng, 0.42, 0.05)
    img = vgradient(h, w, (0.35, 0.55, 0.85), (0.72, 0.82, 0.93), 0.0, horizon)
    for _ in range(rng.integers(1, 4)):   # clouds
        cx, cy = rng.uniform(0, w), rng.uniform(0.03, 0.18) * h
        draw(img, "ellipse", [cx, cy, rng.uniform(0.08, 0.16) * s, rng.uniform(0.02, 0.04) * s],
             (0.96, 0.97, 0.99), 0.85)
    xf = np.arange(w, dtype=np.float32) / w
    # jagged ridge: a sum of triangle waves
    ridge = np.zeros(w, dtype=np.float32)
    for amp, freq in ((0.16, rng.uniform(1.0, 1.8)), (0.06, rng.uniform(3, 5)),
                      (0.02, rng.uniform(9, 14))):
        phase = rng.random()
        ridge += amp * (2 * np.abs(((xf * freq + phase) % 1.0) - 0.5))
    ridge = horizon - 0.22 + ridge
    Y = np.arange(h, dtype=np.float32)[:, None] / h
    rock = Y >= ridge[None, :]
    tex = value_noise(rng, (h, w), s / 8, octaves=2)
    strata = 0.5 + 0.5 * np.sin(2 * np.pi * (Y * rng.uniform(18, 26)
                                             + 0.5 * value_noise(rng, (h, w), 4)))
    rock_col = _mix((0.33, 0.31, 0.30), (0.62, 0.60, 0.57), 0.6 * tex + 0.4 * strata)
    depth = np.clip((Y - ridge[None, :]) / 0.5, 0, 1)
    rock_col = rock_col * (0.85 + 0.15 * depth[..., None])
    img[rock] = rock_col[rock]
    # cracks
    for _ in range(rng.integers(4, 9)):
        x0, y0 = rng.uniform(0, w), rng.uniform(horizon, 1.0) * h
        draw(img, "capsule", [x0, y0, x0 + rng.uniform(-0.1, 0.1) * w,
                              y0 + rng.uniform(0.03, 0.1) * h,
                              0.004 * s], (0.18, 0.17, 0.17))
    # boulders with a lit top
    for _ in range(rng.integers(2, 5)):
        bx, by = rng.uniform(0, w), rng.uniform(horizon + 0.15, 1.0) * h
        r = rng.uniform(0.04, 0.09) * s
        draw(img, "ellipse", [bx, by, r * 1.3, r], (0.40, 0.38, 0.36))
        draw(img, "ellipse", [bx - 0.2 * r, by - 0.35 * r, r * 0.8, r * 0.45], (0.58, 0.56, 0.53))
    return img, horizon


def snow(rng: np.random.Generator, h: int, w: int) -> tuple[np.ndarray, float]:
    s = min(h, w)
    horizon = _jit(rng, 0.38, 0.05)
    img = vgradient(h, w, (0.70, 0.75, 0.84), (0.86, 0.89, 0.94), 0.0, horizon)
    Y, X = np.mgrid[0:h, 0:w].astype(np.float32)
    yf, xf = Y / h, X / w
    hill = horizon + 0.03 * np.sin(2 * np.pi * (xf * rng.uniform(0.7, 1.5) + rng.random()))
    ground = yf >= hill
    drift = value_noise(rng, (h, w), 4, octaves=2)
    snow_col = _mix((0.80, 0.85, 0.95), (0.99, 0.99, 1.0), drift)
    img[ground] = snow_col[ground]
    # distant pines
    for _ in range(rng.integers(3, 8)):
        px = rng.uniform(0, w)
        ph = rng.uniform(0.08, 0.14) * h
        by = horizon * h + 2
        draw(img, "poly", [(px, by - ph), (px - 0.35 * ph, by), (px + 0.35 * ph, by)],
             (0.12, 0.25, 0.18))
    # the cabin: log walls, dark roof with a snow cap, a lit window
    cw = rng.uniform(0.2, 0.3) * w
    cx = rng.uniform(0.05, 0.95) * w - cw / 2
    cbase = (horizon + rng.uniform(0.04, 0.09)) * h
    ch = 0.55 * cw
    draw(img, "poly", [(cx, cbase - ch), (cx + cw, cbase - ch), (cx + cw, cbase), (cx, cbase)],
         (0.45, 0.28, 0.15))
    for ly in np.arange(cbase - ch, cbase, max(ch / 5, 1.0)):
        draw(img, "capsule", [cx, ly, cx + cw, ly, max(0.004 * s, 0.4)], (0.30, 0.18, 0.09))
    draw(img, "poly", [(cx - 0.1 * cw, cbase - ch), (cx + 1.1 * cw, cbase - ch),
                       (cx + 0.5 * cw, cbase - ch - 0.5 * cw)],
         (0.22, 0.12, 0.08))
    draw(img, "poly", [(cx - 0.02 * cw, cbase - ch - 0.06 * cw),
                       (cx + 1.02 * cw, cbase - ch - 0.06 * cw),
                       (cx + 0.5 * cw, cbase - ch - 0.5 * cw)], (0.97, 0.98, 1.0))
    draw(img, "poly", [(cx + 0.6 * cw, cbase - 0.7 * ch), (cx + 0.8 * cw, cbase - 0.7 * ch),
                       (cx + 0.8 * cw, cbase - 0.35 * ch), (cx + 0.6 * cw, cbase - 0.35 * ch)],
         (0.98, 0.80, 0.35))
    # the snowball, shaded
    bx, by = rng.uniform(0.08, 0.92) * w, rng.uniform(0.78, 0.92) * h
    r = rng.uniform(0.05, 0.08) * s
    draw(img, "ellipse", [bx + 0.15 * r, by + 0.9 * r, 1.1 * r, 0.25 * r], (0.70, 0.74, 0.84))
    draw(img, "ellipse", [bx, by, r, r], (0.82, 0.85, 0.92))
    draw(img, "ellipse", [bx - 0.2 * r, by - 0.2 * r, 0.7 * r, 0.7 * r], (0.99, 0.99, 1.0))
    return img, horizon


BACKGROUNDS = {"beach": beach, "desert": desert, "dirt": dirt, "jungle": jungle,
               "mountain": mountain, "snow": snow}


def render_background(location: str, rng: np.random.Generator, h: int,
                      w: int) -> tuple[np.ndarray, float]:
    img, horizon = BACKGROUNDS[location](rng, h, w)
    return np.ascontiguousarray(img, dtype=np.float32), float(horizon)
