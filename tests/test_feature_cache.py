"""Frozen-feature cache of linear probes: written once and hit afterwards (a counter),
records and predictions identical with the cache and from the cache (without it: within
float32 rounding, see _same_up_to_rounding), nothing partial used after a kill during the
write, augmentation refused for cached runs."""
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from domainbed import hparams as hp
from domainbed import run_hparams
from domainbed.algorithms.erm import ERM
from domainbed.datasets.debug import Debug
from domainbed.datasets.image_folders import MultipleEnvironmentImageFolder
from domainbed.registry import get_algorithm_class
from domainbed.scripts.train import parse_args
from domainbed.training import feature_cache
from domainbed.training import loop as training
from oodutils.errors import UserError

REPO = Path(__file__).resolve().parents[1]


class Tiny32(Debug):
    INPUT_SHAPE = (3, 32, 32)
    N_PER_ENV = 24
    GROUP_NAMES = Debug.GROUP_NAMES


def _hparams(dataset_cls=Tiny32, algorithm_cls=ERM, **overrides):
    hparams = hp.draw(run_hparams.hparam_space(algorithm_cls, dataset_cls), 0)
    hparams.update(backbone="resnet18", pretrained=False, transfer="linear_probe",
                   batch_size=8, lr=1e-2)
    hparams.update(overrides)
    return hparams


def _train(tmp_path, name, cache, dataset_cls=Tiny32, algorithm="ERM", log=None, **overrides):
    out = tmp_path / name
    algorithm_cls = get_algorithm_class(algorithm)
    args = parse_args(["--test_envs", "0", "--output_dir", str(out), "--steps", "5",
                       "--checkpoint_freq", "2", "--data_dir", str(tmp_path),
                       "--feature_cache_dir", str(cache), "--algorithm", algorithm])
    training.run(args, _hparams(dataset_cls, algorithm_cls, **overrides), algorithm_cls,
                 dataset_cls, log=log or (lambda m: None))
    return out


def _records(run_dir):
    records = [json.loads(line) for line in (run_dir / "results.jsonl").read_text().splitlines()]
    for r in records:
        r.pop("step_time")
        r["args"].pop("output_dir")
    return records


def _predictions(run_dir):
    files = sorted((run_dir / "predictions").iterdir())
    return [dict(np.load(f)) for f in files]


def _same_run(a, b):
    assert _records(a) == _records(b)
    _same_predictions(a, b)


def _same_predictions(a, b):
    for pa, pb in zip(_predictions(a), _predictions(b), strict=True):
        assert pa.keys() == pb.keys()
        for key in pa:
            np.testing.assert_array_equal(pa[key], pb[key])


def _same_up_to_rounding(cached, uncached):
    """A cached ERM probe trains as a probe stack of one (arithmetic `probe-stack`: batched
    products, its own Adam step), an uncached one through autograd and torch.optim.Adam
    (`single`): the same mathematics, rounded in another order. Every record key and
    prediction is equal, the loss within float32 rounding (the tolerance
    docs/guide/backbones.md states)."""
    for a, b in zip(_records(cached), _records(uncached), strict=True):
        assert a.pop("loss") == pytest.approx(b.pop("loss"), rel=1e-5)
        assert (a["args"].pop("arithmetic"), b["args"].pop("arithmetic")) == \
            ("probe-stack", "single")
        assert a == b
    _same_predictions(cached, uncached)


def _complete_entries(cache):
    return [p for p in cache.iterdir() if ".tmp-" not in p.name] if cache.exists() else []


def test_cache_is_written_once_then_hit_with_identical_records(tmp_path):
    cache = tmp_path / "cache"
    feature_cache.STATS.clear()
    first = _train(tmp_path, "first", cache)
    assert feature_cache.STATS == {"extracted": 1}
    (entry,) = _complete_entries(cache)
    fields = json.loads((entry / "meta.json").read_text())
    assert [a["rows"] for a in fields.pop("arrays")] == [24, 24, 24]
    arrays = feature_cache.read_entry(str(entry), fields)
    assert [a.dtype for a in arrays] == [np.float16] * 3 and arrays[0].shape == (24, 512)
    second = _train(tmp_path, "second", cache)
    assert feature_cache.STATS == {"extracted": 1, "loaded": 1}
    _same_run(first, second)
    _train(tmp_path, "other_head", cache, lr=1e-3)  # another head on the same backbone
    assert feature_cache.STATS == {"extracted": 1, "loaded": 2}
    uncached = _train(tmp_path, "uncached", "none")
    assert feature_cache.STATS == {"extracted": 1, "loaded": 2}
    _same_up_to_rounding(first, uncached)


def test_cache_key_changes_with_data_seed_and_weights(tmp_path):
    """Another data seed, and other (here: randomly initialized) weights, miss the cache."""
    cache = tmp_path / "cache"
    _train(tmp_path, "a", cache)
    for i, flag in enumerate([["--data_seed", "1"], ["--seed", "1"]]):
        args = parse_args(["--test_envs", "0", "--output_dir", str(tmp_path / f"b{i}"),
                           "--steps", "1",
                           "--data_dir", str(tmp_path), "--feature_cache_dir", str(cache),
                           *flag])
        training.run(args, _hparams(), ERM, Tiny32, log=lambda m: None)
        assert len(_complete_entries(cache)) == 2 + i


KILLER = textwrap.dedent("""
    import os, signal, sys
    import numpy as np
    from domainbed import hparams as hp
    from domainbed import run_hparams
    from domainbed.training import loop as training
    from domainbed.algorithms.erm import ERM
    from domainbed.scripts.train import parse_args
    sys.path.insert(0, {tests!r})
    from test_feature_cache import Tiny32, _hparams
    real, calls = np.lib.format.open_memmap, []
    def open_then_die(*a, **k):
        calls.append(1)
        if len(calls) == 2:  # killed while writing the second environment's features
            os.kill(os.getpid(), signal.SIGKILL)
        return real(*a, **k)
    np.lib.format.open_memmap = open_then_die
    args = parse_args(["--test_envs", "0", "--output_dir", {out!r}, "--steps", "5",
                       "--checkpoint_freq", "2",
                       "--data_dir", {data!r}, "--feature_cache_dir", {cache!r}])
    training.run(args, _hparams(), ERM, Tiny32)
""")


def test_a_kill_during_the_write_leaves_no_cache_a_later_run_would_use(tmp_path):
    cache = tmp_path / "cache"
    reference = _train(tmp_path, "reference", tmp_path / "other_cache")
    script = KILLER.format(tests=str(Path(__file__).parent), out=str(tmp_path / "killed"),
                           data=str(tmp_path), cache=str(cache))
    proc = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True,
                          text=True, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.returncode == -9, proc.stderr
    assert _complete_entries(cache) == [] and any(".tmp-" in p.name for p in cache.iterdir())
    feature_cache.STATS.clear()
    after = _train(tmp_path, "after", cache)
    assert feature_cache.STATS == {"extracted": 1}
    assert len(_complete_entries(cache)) == 1
    _same_run(reference, after)


class _Folders(MultipleEnvironmentImageFolder):
    ENVIRONMENTS = ["A", "B", "C"]
    N_WORKERS = 0

    def __init__(self, root, test_envs, hparams):
        super().__init__(os.path.join(root, "folders"), test_envs,
                         hparams["data_augmentation"], hparams)


def _image_folders(root):
    for env in _Folders.ENVIRONMENTS:
        for label in "ab":
            (root / "folders" / env / label).mkdir(parents=True)
            for i in range(4):
                Image.new("RGB", (12, 12), (60 * i, 200 if label == "a" else 0, 30)).save(
                    root / "folders" / env / label / f"{i}.png")


def test_augmentation_is_refused_for_cached_runs_and_plain_images_match(tmp_path):
    _image_folders(tmp_path)
    cache = tmp_path / "cache"
    kw = dict(dataset_cls=_Folders, image_size=32, batch_size=4)
    with pytest.raises(UserError, match="data_augmentation"):
        _train(tmp_path, "augmented", cache, **kw)
    assert _complete_entries(cache) == []
    _train(tmp_path, "augmented_uncached", "none", **kw)  # features computed every step
    cached = _train(tmp_path, "cached", cache, data_augmentation=False, **kw)
    uncached = _train(tmp_path, "plain_uncached", "none", data_augmentation=False, **kw)
    _same_up_to_rounding(cached, uncached)
    assert (cached / "examples.csv").read_text() == (uncached / "examples.csv").read_text()


def test_prepare_hooks_see_features_and_image_mixing_is_not_cached(tmp_path):
    """DFR's prepare() keeps held-out inputs: they are features too, so cached and
    uncached runs agree; Mixup mixes images, so it computes features every step."""
    feature_cache.STATS.clear()
    cached = _train(tmp_path, "dfr_cached", tmp_path / "cache", algorithm="DFR")
    assert feature_cache.STATS == {"extracted": 1}
    uncached = _train(tmp_path, "dfr_uncached", "none", algorithm="DFR")
    _same_run(cached, uncached)
    feature_cache.STATS.clear()
    _train(tmp_path, "mixup", tmp_path / "cache", algorithm="Mixup")
    assert feature_cache.STATS == {}


def _poison(path):
    array = np.load(path)
    array[0, 0] += 1
    np.save(path, array)


def _zero(path):
    path.write_bytes(b"\0" * path.stat().st_size)


def _truncate(path):
    path.write_bytes(path.read_bytes()[:200])


def _fewer_rows(path):
    np.save(path, np.load(path)[:5])


def _replace_meta(path):
    meta = json.loads((path.parent / "meta.json").read_text())
    meta["arrays"] = [{"rows": 1}]
    (path.parent / "meta.json").write_text(json.dumps(meta))


def test_a_bad_cache_entry_is_recomputed_with_a_warning(tmp_path):
    """Poisoned, zeroed, truncated, fewer rows, meta.json altered: each noticed, warned of,
    recomputed into a whole entry (the next damage starts from it), records unchanged."""
    cache = tmp_path / "cache"
    feature_cache.STATS.clear()
    first = _train(tmp_path, "first", cache)
    for number, damage in enumerate([_poison, _zero, _truncate, _fewer_rows, _replace_meta]):
        (entry,) = _complete_entries(cache)
        damage(entry / "env1.npy")
        messages = []
        again = _train(tmp_path, f"again{number}", cache, log=messages.append)
        assert feature_cache.STATS == {"extracted": 2 + number}, damage.__name__
        warned = [m for m in messages if m.startswith("warning: frozen-feature cache entry")]
        assert len(warned) == 1 and "recomputing" in warned[0], damage.__name__
        _same_run(first, again)
