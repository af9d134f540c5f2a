"""OoD-Bench's CelebA_Blond and NICO_Mixed: the cell counts of Tables 10 and 9."""
import numpy as np
import pytest

from domainbed.datasets import oodbench_images as ob
from domainbed.datasets import subpopulation
from oodutils.errors import UserError
from tests.dataset_fixtures import write_celeba, write_nico


def cell_counts(env, n_attributes):
    return {(int(g) // n_attributes, int(g) % n_attributes): int(c)
            for g, c in zip(*np.unique(env.groups, return_counts=True))}


def test_celeba_blond_table10_counts(tmp_path, monkeypatch):
    # every CelebA partition contributes; the cells need 1,748 blond men (CelebA has 1,749)
    need = {(1, 1): 1748, (1, 0): 23242, (0, 1): 23242, (0, 0): 1748}
    cells = {(split, b, m): n // 3 + (split < n % 3) for (b, m), n in need.items()
             for split in (0, 1, 2)}
    cells[(0, 1, 0)] += 5  # a few spare blond women
    write_celeba(tmp_path, cells, images=False)
    monkeypatch.setattr(subpopulation, "check_sampled_files", lambda *a, **k: None)
    ds = ob.CelebA_Blond(str(tmp_path), [2], {"image_size": 8})
    assert ds.ENVIRONMENTS == ["unbalanced_1", "unbalanced_2", "balanced"]
    for env, name in zip(ds, ds.ENVIRONMENTS):
        assert cell_counts(env, 2) == ob.CELEBA_BLOND_CELLS[name]
    assert sum(len(e) for e in ds) == 49980
    ids = np.concatenate([e.ids for e in ds])
    assert len(np.unique(ids)) == len(ids)
    other = ob.CelebA_Blond(str(tmp_path), [2], {"image_size": 8}, data_seed=1)
    assert other.data_fingerprint != ds.data_fingerprint


def test_celeba_blond_too_few_images_is_clear(tmp_path, monkeypatch):
    write_celeba(tmp_path, {(0, 1, 1): 3, (0, 0, 0): 3}, images=False)
    monkeypatch.setattr(subpopulation, "check_sampled_files", lambda *a, **k: None)
    with pytest.raises(UserError, match=r"cell \(.*\) needs .* images, the data has"):
        ob.CelebA_Blond(str(tmp_path), [2], {})


def test_nico_mixed_table9_counts(tmp_path):
    write_nico(tmp_path)
    ds = ob.NICO_Mixed(str(tmp_path), [2, 3], {"image_size": 8})
    assert [len(e) for e in ds] == [1640, 1640, 400, 400] and sum(len(e) for e in ds) == 4080
    for env, name in zip(ds, ds.ENVIRONMENTS):
        expect = {(ob.NICO_SUPERCLASSES.index(s), ob.NICO_CONTEXTS.index(c)): n
                  for (s, c), n in ob.NICO_CELLS[name].items()}
        assert cell_counts(env, 4) == expect
    paths = [p for e in ds for p in e.paths]
    assert len(set(paths)) == 4080


def test_nico_mixed_uses_the_authors_lists(tmp_path):
    write_nico(tmp_path, per_cell_extra=0)
    lists = tmp_path / "NICO" / "mixed_split_corrected"
    lists.mkdir()
    rows = {"train1": ["animal_cat0\\on_snow\\0.jpg,animal_cat0,on_snow,animal"],
            "train2": ["vehicle_cat1\\in_forest\\1.jpg,vehicle_cat1,in_forest,vehicle"],
            "val": ["animal_cat0\\on_grass\\2.jpg,animal_cat0,on_grass,animal"],
            "test": ["vehicle_cat0\\on_beach\\4.jpg,vehicle_cat0,on_beach,vehicle"]}
    for env, lines in rows.items():
        (lists / f"env_{env}.csv").write_text("\n".join(lines) + "\n")
    ds = ob.NICO_Mixed(str(tmp_path), [2, 3], {"image_size": 8})
    assert [len(e) for e in ds] == [1, 1, 1, 1]
    assert ds[1].y.tolist() == [1] and ds[1].groups.tolist() == [1 * 4 + 1]
    assert ds[3].paths[0].endswith("vehicle/images/vehicle_cat0/on_beach/4.jpg")


def test_nico_missing_is_clear(tmp_path):
    with pytest.raises(UserError, match="NICO/animal not found"):
        ob.NICO_Mixed(str(tmp_path), [2, 3], {})


def _blond_frame():
    import pandas as pd
    return pd.DataFrame({"filename": [f"{i:06d}.jpg" for i in range(1, 7)]})


def _pickled_split(path, names):
    import pandas as pd
    path.parent.mkdir(parents=True, exist_ok=True)
    pd.DataFrame({"y": range(len(names))}, index=names).to_pickle(path)


def test_celeba_blond_reads_the_authors_split_from_csv_and_never_a_pickle(tmp_path):
    import pandas as pd
    dataset = object.__new__(ob.CelebA_Blond)
    df = _blond_frame()
    split = {"tr_env1": ["000002.jpg", "000001.jpg"], "tr_env2": ["000004.jpg"],
             "te_env": ["000006.jpg", "000003.jpg"]}
    for env in split:  # a pickle that would run code if unpickled
        (tmp_path / "blond_split").mkdir(exist_ok=True)
        (tmp_path / "blond_split" / f"{env}_df.pickle").write_bytes(b"cos\nsystem\n(S'x'\ntR.")
    with pytest.raises(UserError, match="never read.*convert_blond_split_pickles"):
        dataset.authors_split(str(tmp_path), df)
    for env, names in split.items():
        pd.DataFrame({"filename": names}).to_csv(tmp_path / "blond_split" / f"{env}_df.csv",
                                                 index=False)
    assert dataset.authors_split(str(tmp_path), df) == {
        "unbalanced_1": [1, 0], "unbalanced_2": [3], "balanced": [5, 2]}
    (tmp_path / "blond_split" / "te_env_df.csv").write_text("name\nx\n")
    with pytest.raises(UserError, match="filename"):
        dataset.authors_split(str(tmp_path), df)


def test_the_unsafe_conversion_is_explicit_and_writes_the_csv_lists(tmp_path, capsys):
    from domainbed.scripts import download
    split = {"tr_env1": ["000002.jpg"], "tr_env2": ["000004.jpg", "000005.jpg"],
             "te_env": ["000001.jpg"]}
    for env, names in split.items():
        _pickled_split(tmp_path / "celeba" / "blond_split" / f"{env}_df.pickle", names)
    download.main(["--data_dir", str(tmp_path), "--convert_blond_split_pickles"])
    assert capsys.readouterr().out.count("wrote ") == 3
    dataset = object.__new__(ob.CelebA_Blond)
    assert dataset.authors_split(str(tmp_path / "celeba"), _blond_frame()) == {
        "unbalanced_1": [1], "unbalanced_2": [3, 4], "balanced": [0]}
