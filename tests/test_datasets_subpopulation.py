"""SubpopBench-framed image benchmarks (Waterbirds, CelebA, MetaShift) and the
WILDSWaterbirds of Salaudeen et al. 2025 (accuracy on the line), loaded from tiny fixtures
in the real layouts."""
import os

import numpy as np
import pytest

from domainbed.datasets import subpopulation as sp
from oodutils.errors import UserError
from tests.builders import read_records
from tests.dataset_fixtures import (
    train_cli,
    write_celeba,
    write_metashift,
    write_waterbirds,
)

SMALL = {"image_size": 8}


def test_waterbirds_splits_and_groups(tmp_path):
    rows = write_waterbirds(tmp_path, per_cell=2)
    ds = sp.Waterbirds(str(tmp_path), [1, 2], SMALL)
    assert [len(e) for e in ds] == [8, 8, 8]
    assert ds.group_names == ["landbird_land", "landbird_water", "waterbird_land",
                              "waterbird_water"]
    for split, env in enumerate(ds):
        expect = [r for r in rows if r["split"] == split]
        assert sorted(env.ids.tolist()) == sorted(r["img_id"] for r in expect)
        by_id = {r["img_id"]: r for r in expect}
        for i, g, y in zip(env.ids, env.groups, env.y.tolist()):
            assert g == by_id[i]["y"] * 2 + by_id[i]["place"] and y == by_id[i]["y"]
        assert np.bincount(env.groups, minlength=4).tolist() == [2, 2, 2, 2]
    x, y = ds[0][0]
    assert tuple(x.shape) == (3, 8, 8)
    assert ds.identity()["data_fingerprint"] == sp.Waterbirds(str(tmp_path), [1, 2],
                                                              SMALL).data_fingerprint


def test_wilds_waterbirds_is_train_vs_val_test(tmp_path):
    write_waterbirds(tmp_path, per_cell=1)
    ds = sp.WILDSWaterbirds(str(tmp_path), [1], SMALL)
    assert ds.ENVIRONMENTS == ["train", "val_test"] and [len(e) for e in ds] == [4, 8]
    assert np.bincount(ds[1].groups).tolist() == [2, 2, 2, 2]


def test_waterbirds_layout_errors(tmp_path):
    with pytest.raises(UserError, match=r"waterbird_complete95_forest2water2/metadata.csv "
                                        r"not found.*download --datasets Waterbirds"):
        sp.Waterbirds(str(tmp_path), [1, 2], SMALL)
    write_waterbirds(tmp_path, per_cell=1)
    root = tmp_path / "waterbirds" / "waterbird_complete95_forest2water2"
    os.unlink(root / "000.Species_0" / "Species_0_0001.jpg")
    with pytest.raises(UserError, match="partial layout.*1 of 12 sampled files are missing"):
        sp.Waterbirds(str(tmp_path), [1, 2], SMALL)
    (root / "metadata.csv").write_text("img_id,y\n1,0\n")
    with pytest.raises(UserError, match="lacks the column.*img_filename"):
        sp.Waterbirds(str(tmp_path), [1, 2], SMALL)


def test_celeba_blond_male_groups(tmp_path):
    cells = {(s, b, m): 1 + s + b for s in (0, 1, 2) for b in (0, 1) for m in (0, 1)}
    write_celeba(tmp_path, cells)
    ds = sp.CelebA(str(tmp_path), [1, 2], SMALL)
    for split, env in enumerate(ds):
        expect = [cells[(split, b, m)] for b in (0, 1) for m in (0, 1)]
        assert np.bincount(env.groups, minlength=4).tolist() == expect
        assert env.y.tolist() == (env.groups // 2).tolist()
    assert ds.group_names[3] == "blond_male"


def test_celeba_missing_partition_file_is_named(tmp_path):
    write_celeba(tmp_path, {(0, 0, 0): 1})
    os.unlink(tmp_path / "celeba" / "list_eval_partition.txt")
    with pytest.raises(UserError, match="list_eval_partition.txt not found"):
        sp.CelebA(str(tmp_path), [1, 2], SMALL)


def test_metashift_split_rule(tmp_path):
    n = write_metashift(tmp_path, per_folder=10)
    ds = sp.MetaShift(str(tmp_path), [1, 2], SMALL)
    assert [len(e) for e in ds] == [n - 10 - 4, 4, 10]  # 25% test, 10% val
    assert sorted(np.concatenate([e.ids for e in ds]).tolist()) == list(range(n))
    cat_indoor = ds.GROUP_NAMES.index("cat_indoor")
    assert (np.concatenate([e.groups for e in ds]) == cat_indoor).sum() == 10


@pytest.mark.parametrize("dataset", ["Waterbirds", "CelebA"])
def test_train_cli_smoke(tmp_path, dataset):
    if dataset == "Waterbirds":
        write_waterbirds(tmp_path, per_cell=2)
    else:
        write_celeba(tmp_path, {(s, b, m): 2 for s in (0, 1, 2) for b in (0, 1) for m in (0, 1)})
    out = tmp_path / "run"
    proc = train_cli(tmp_path, out, dataset, {"arch": "mlp", "mlp_width": 8, "image_size": 8,
                                              "pretrained": False, "batch_size": 4})
    assert proc.returncode == 0, proc.stderr
    rec = read_records(out)[-1]
    assert rec["args"]["test_envs"] == [1, 2]  # the dataset's default
    assert rec["args"]["env_names"] == ["train", "val", "test"]
    assert "env1_in_wga" in rec and "env2_in_acc_g3" in rec


# Published Waterbirds group sizes (Sagawa et al. 2020; SubpopBench): per split, groups
# (landbird, land), (landbird, water), (waterbird, land), (waterbird, water).
WATERBIRDS_PUBLISHED = {0: [3498, 184, 56, 1057], 1: [467, 466, 133, 133],
                        2: [2255, 2255, 642, 642]}


def test_waterbirds_published_group_counts(tmp_path, monkeypatch):
    root = tmp_path / "waterbirds" / "waterbird_complete95_forest2water2"
    root.mkdir(parents=True)
    lines, k = ["img_id,img_filename,y,split,place,place_filename"], 0
    for split, counts in WATERBIRDS_PUBLISHED.items():
        for group, n in enumerate(counts):
            for _ in range(n):
                k += 1
                lines.append(f"{k},{group // 2:03d}.S/{k}.jpg,{group // 2},{split},"
                             f"{group % 2},/p.jpg")
    (root / "metadata.csv").write_text("\n".join(lines) + "\n")
    monkeypatch.setattr(sp, "check_sampled_files", lambda *a, **kw: None)  # no image files
    ds = sp.Waterbirds(str(tmp_path), [1, 2], SMALL)
    assert sum(len(e) for e in ds) == 11788
    for split, env in enumerate(ds):
        assert np.bincount(env.groups, minlength=4).tolist() == WATERBIRDS_PUBLISHED[split]
    wilds_ds = sp.WILDSWaterbirds(str(tmp_path), [1], SMALL)
    assert [len(e) for e in wilds_ds] == [4795, 6993]
