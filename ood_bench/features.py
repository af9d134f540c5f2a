"""The features file of one OoD-Bench trial: z_p (n_p, d), y_p (n_p,), z_q (n_q, d), y_q
(n_q,) and an optional JSON `meta`, as an npz (what `python -m ood_bench extract` writes,
or the official code's data.npz). Without torch, so `quantify` reads and checks a file
before importing the estimator."""
from __future__ import annotations

import json
import os
import zipfile
import zlib
from collections.abc import Mapping
from typing import Any

import numpy as np

from oodutils.errors import UserError, load_error_reason
from oodutils.fileio import atomic_savez


def save_features(path: str, feats: Mapping[str, np.ndarray],
                  meta: dict[str, Any] | None = None) -> None:
    arrays = dict(feats)
    if meta is not None:
        arrays["meta"] = np.array(json.dumps(meta, sort_keys=True, default=str))
    atomic_savez(path, True, **arrays)


def load_features(path: str) -> dict[str, np.ndarray]:
    if not os.path.isfile(path):
        raise UserError(f"features file {path!r} does not exist")
    try:
        with np.load(path, allow_pickle=False) as data:
            if not hasattr(data, "files"):
                raise ValueError("a single array, not an npz archive")
            missing = [k for k in ("z_p", "y_p", "z_q", "y_q") if k not in data.files]
            if missing:
                raise UserError(f"{path}: missing arrays {missing} (need z_p, y_p, z_q, y_q)")
            feats = {k: data[k] for k in data.files}
    except (ValueError, OSError, EOFError, zipfile.BadZipFile, zlib.error) as e:
        reason = load_error_reason(e)
        raise UserError(f"cannot read features file {path!r} (empty, truncated or not an "
                        f"npz: {reason})") from None
    check_feature_shapes(path, feats)
    return feats


def check_feature_shapes(path: str, feats: Mapping[str, np.ndarray]) -> None:
    for side in ("p", "q"):
        z, y = feats[f"z_{side}"], feats[f"y_{side}"]
        if z.ndim != 2 or y.ndim != 1 or len(z) != len(y) or len(z) == 0:
            raise UserError(f"{path}: z_{side} must be (n, d) and y_{side} (n,) with n > 0; "
                            f"got {z.shape} and {y.shape}")
    if feats["z_p"].shape[1] != feats["z_q"].shape[1]:
        raise UserError(f"{path}: z_p and z_q differ in dimension "
                        f"({feats['z_p'].shape[1]} vs {feats['z_q'].shape[1]})")
