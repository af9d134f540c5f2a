"""Trials (train -> extract -> estimate, several seeds), summaries and i.i.d. calibration.

A trial is one run of Algorithm 1 (its seed sets the label-balancing subsample, the
train/held-out split, the initialisation and the minibatches) followed by Algorithm 2 (the
same seed draws the importance sample). Trials are summarised as mean +/- standard error
(sample std / sqrt(n)), as the paper's Tables 3 and 8.

Calibration (the official code's later `--calibrate`; the paper itself fixes
eps_div = 1e-12, eps_cor = 5e-4): an i.i.d. reference is measured, by default by retraining
on a random 50/50 split of the pooled data (`level='data'`, the official `force_iid`), or
cheaply by splitting each trial's pooled features (`level='features'`, which keeps the
features learned for the real shift and so is an upper bound on the i.i.d. noise). Then
eps_div in [0, 1e-6] and eps_cor in [0, 1] are bisected (at most 20 steps) until the mean
i.i.d. estimates both lie in [5e-3, 1e-2]: a too-small i.i.d. diversity raises eps_div, a
too-small i.i.d. correlation lowers eps_cor.
"""
from __future__ import annotations

import json
import os
import sys
import time
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
from tqdm import tqdm

from ood_bench.classifier import extract_features, train_env_classifier
from ood_bench.data import load_dataset, make_sides
from ood_bench.estimator import ShiftDensities, iid_split
from ood_bench.estimator_defaults import DEFAULTS
from ood_bench.features import save_features
from oodutils.errors import UserError
from oodutils.fileio import atomic_write_json
from oodutils.log import ProjectWarning, get_logger

logger = get_logger(__name__)


@dataclass
class TrialConfig:
    dataset: str
    data_dir: str
    envs_p: list
    envs_q: list
    dataset_settings: dict = field(default_factory=dict)
    data_seed: int = 0
    holdout_fraction: float = 0.1
    backbone: str = "auto"
    dim_z: int = 8
    steps: int = 2000
    batch_size: int = 32
    lr: float = 3e-4
    weight_decay: float = 0.0
    eval_every: int = 100
    mlp_width: int = 390
    pretrained: bool | None = None
    pretrained_path: str = ""
    featurizer_hparams: dict = field(default_factory=dict)
    select: str = "acc"
    extract_split: str = "out"
    device: str = "cpu"
    n_workers: int = 0
    # estimator
    sample_size: int = DEFAULTS["sample_size"]
    eps_div: float = DEFAULTS["eps_div"]
    eps_cor: float = DEFAULTS["eps_cor"]
    bw_method: str | float | None = DEFAULTS["bw_method"]
    strict: bool = False


def _log(verbose: bool) -> Callable[[str], object] | None:
    return logger.info if verbose else None


def extract_trial(cfg: TrialConfig, seed: int, force_iid: bool = False, verbose: bool = False,
                  dataset: Any = None) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """Algorithm 1 for one seed: (features dict, training log)."""
    if dataset is None:
        dataset, _ = load_dataset(cfg.dataset, cfg.data_dir, cfg.dataset_settings, cfg.data_seed)
    sides = make_sides(dataset, cfg.envs_p, cfg.envs_q, cfg.holdout_fraction, seed, force_iid)
    model, log = train_env_classifier(
        sides, cfg.backbone, cfg.dim_z, cfg.steps, cfg.batch_size, cfg.lr, cfg.weight_decay,
        cfg.eval_every, seed, cfg.device, cfg.mlp_width, cfg.pretrained, cfg.pretrained_path,
        cfg.featurizer_hparams, cfg.n_workers, cfg.select, log=_log(verbose))
    feats = extract_features(model, sides, cfg.extract_split, cfg.device,
                             n_workers=cfg.n_workers)
    log.update(sizes=sides.summary(), force_iid=bool(force_iid), seed=int(seed))
    return feats, log


def densities(feats: Mapping[str, np.ndarray], cfg: TrialConfig, seed: int,
              need_classes: bool = True) -> ShiftDensities:
    return ShiftDensities(feats["z_p"], feats["y_p"], feats["z_q"], feats["y_q"],
                          sample_size=cfg.sample_size, seed=seed, bw_method=cfg.bw_method,
                          strict=cfg.strict, device=cfg.device, need_classes=need_classes)


def mean_se(values: Iterable[float | None]) -> dict[str, Any]:
    v = np.asarray([x for x in values if x is not None], dtype=np.float64)
    if len(v) == 0:
        return {"mean": None, "se": None, "std": None, "n": 0, "values": []}
    std = float(v.std(ddof=1)) if len(v) > 1 else 0.0
    return {"mean": float(v.mean()), "se": std / np.sqrt(len(v)), "std": std, "n": len(v),
            "values": v.tolist()}


def summarize(results: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Mean +/- standard error of every trial's diversity and correlation."""
    out: dict[str, Any] = {"n_trials": len(results)}
    for key in ("diversity", "correlation"):
        out[key] = mean_se([r.get(key) for r in results])
    accs = [r.get("train", {}).get("val_acc") for r in results]
    if any(a is not None for a in accs):
        out["env_classifier_val_acc"] = mean_se(accs)
    return out


def bisect_thresholds(iid: Sequence[ShiftDensities], lower: float = 5e-3, upper: float = 1e-2,
                      max_iters: int = 20, eps_div_range: tuple[float, float] = (0.0, 1e-6),
                      eps_cor_range: tuple[float, float] = (0.0, 1.0)) -> dict[str, Any]:
    """The official calibration search over i.i.d. `ShiftDensities` (list)."""
    lo_d, hi_d = eps_div_range
    lo_c, hi_c = eps_cor_range
    history, converged = [], False
    for it in range(1, max_iters + 1):
        eps_div, eps_cor = 0.5 * (lo_d + hi_d), 0.5 * (lo_c + hi_c)
        avg_div = float(np.mean([d.diversity(eps_div) for d in iid]))
        avg_cor = float(np.mean([d.correlation(eps_cor) for d in iid]))
        history.append({"iteration": it, "eps_div": eps_div, "eps_cor": eps_cor,
                        "iid_div": avg_div, "iid_cor": avg_cor})
        if min(avg_div, avg_cor) >= lower and max(avg_div, avg_cor) <= upper:
            converged = True
            break
        if avg_div < lower:
            lo_d = eps_div
        elif avg_div > upper:
            hi_d = eps_div
        if avg_cor < lower:
            hi_c = eps_cor
        elif avg_cor > upper:
            lo_c = eps_cor
    if not converged:
        warnings.warn(f"calibration did not bring the i.i.d. estimates into [{lower}, "
                      f"{upper}] in {max_iters} iterations (last: div {avg_div:.3g}, cor "
                      f"{avg_cor:.3g}); using the last thresholds", ProjectWarning,
                      stacklevel=2)
    return {"eps_div": eps_div, "eps_cor": eps_cor, "iid_div": avg_div, "iid_cor": avg_cor,
            "converged": converged, "iterations": len(history), "history": history,
            "lower_bound": lower, "upper_bound": upper}


def iid_feature_densities(feats_list: Sequence[Mapping[str, np.ndarray]], cfg: TrialConfig,
                          seed: int = 0) -> list[ShiftDensities]:
    out = []
    for k, f in enumerate(feats_list):
        a, b, c, d = iid_split(f["z_p"], f["y_p"], f["z_q"], f["y_q"], seed=seed + k)
        out.append(densities({"z_p": a, "y_p": b, "z_q": c, "y_q": d}, cfg, seed + k))
    return out


def run_trials(cfg: TrialConfig, n_trials: int = 5, seed: int = 0, output_dir: str | None = None,
               calibrate: bool = False, calibration_level: str = "data",
               iid_reference: bool = False, verbose: bool = False,
               **bisect_kw: Any) -> dict[str, Any]:
    """Run `n_trials` trials (seeds seed, seed+1, ...). Writes under output_dir:
    trial_{k}/features.npz, trial_{k}/result.json, summary.json (and iid_{k}/ when the
    i.i.d. reference is measured at the data level). Returns the summary dict."""
    t0 = time.time()
    dataset, settings = load_dataset(cfg.dataset, cfg.data_dir, cfg.dataset_settings,
                                     cfg.data_seed)
    identity = dataset.identity() if hasattr(dataset, "identity") else {}
    seeds = [seed + t for t in range(n_trials)]
    feats, logs, dens = [], [], []
    for s in tqdm(seeds, desc="OoD-Bench trials", unit="trial",
                  disable=not sys.stderr.isatty()):
        f, log = extract_trial(cfg, s, verbose=verbose, dataset=dataset)
        feats.append(f)
        logs.append(log)
        dens.append(densities(f, cfg, s))
        if output_dir:
            save_features(os.path.join(output_dir, f"trial_{s}", "features.npz"), f,
                          {"config": asdict(cfg), "seed": s})
        if verbose:
            logger.info(f"trial seed {s}: div {dens[-1].diversity(cfg.eps_div):.4f}, cor "
                        f"{dens[-1].correlation(cfg.eps_cor):.4f}")
    iid, calibration = None, None
    if calibrate or iid_reference:
        if calibration_level == "data":
            iid = []
            for s in seeds:
                f, _ = extract_trial(cfg, s, force_iid=True, verbose=verbose, dataset=dataset)
                iid.append(densities(f, cfg, s))
                if output_dir:
                    save_features(os.path.join(output_dir, f"iid_{s}", "features.npz"), f,
                                  {"config": asdict(cfg), "seed": s, "force_iid": True})
        elif calibration_level == "features":
            iid = iid_feature_densities(feats, cfg, seed)
        else:
            raise UserError(f"--calibration_level must be data or features, not "
                            f"{calibration_level!r}")
    eps_div, eps_cor = cfg.eps_div, cfg.eps_cor
    if calibrate:
        calibration = bisect_thresholds(iid, **bisect_kw)
        eps_div, eps_cor = calibration["eps_div"], calibration["eps_cor"]
        calibration["level"] = calibration_level
    results = []
    for s, d, log in zip(seeds, dens, logs):
        r = d.result(eps_div, eps_cor)
        r.update(train=log, trial_seed=s)
        results.append(r)
        if output_dir:
            atomic_write_json(os.path.join(output_dir, f"trial_{s}", "result.json"), r)
    summary = summarize(results)
    summary.update(config=asdict(cfg), dataset_settings=settings, data=identity,
                   seeds=seeds, eps_div=eps_div, eps_cor=eps_cor,
                   seconds=round(time.time() - t0, 1))
    if iid is not None:
        summary["iid"] = {"level": calibration_level,
                          "diversity": mean_se([d.diversity(eps_div) for d in iid]),
                          "correlation": mean_se([d.correlation(eps_cor) for d in iid])}
    if calibration is not None:
        summary["calibration"] = calibration
    if output_dir:
        atomic_write_json(os.path.join(output_dir, "summary.json"), summary)
        if calibration is not None:
            atomic_write_json(os.path.join(output_dir, "calibration.json"), calibration)
    return summary


def load_results(paths: Sequence[str]) -> list[dict[str, Any]]:
    """result.json files as dicts; a missing or malformed one is one clear UserError."""
    out = []
    for p in paths:
        try:
            with open(p) as f:
                result = json.load(f)
        except OSError as e:
            raise UserError(f"cannot read result file {p!r}: {e.strerror}") from None
        except ValueError as e:
            raise UserError(f"result file {p!r} is not valid JSON: {e}") from None
        if not isinstance(result, dict):
            raise UserError(f"result file {p!r} must hold a JSON object, got "
                            f"{type(result).__name__}")
        for key in ("diversity", "correlation"):
            value = result.get(key)
            if value is not None and (isinstance(value, bool) or
                                      not isinstance(value, (int, float))):
                raise UserError(f"result file {p!r}: {key} must be a number, got {value!r}")
        train = result.get("train", {})
        if not isinstance(train, dict) or (train.get("val_acc") is not None and (
                isinstance(train["val_acc"], bool) or
                not isinstance(train["val_acc"], (int, float)))):
            raise UserError(f"result file {p!r}: train.val_acc must be a number")
        out.append(result)
    return out
