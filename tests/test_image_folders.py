"""DomainBed's image-folder datasets on a tiny synthetic folder tree."""
import os

import numpy as np
import pytest
import torch
from PIL import Image

from domainbed.datasets.image_folders import MultipleEnvironmentImageFolder
from domainbed.registry import get_dataset_class
from domainbed.run_hparams import default_hparams
from oodutils.errors import UserError

SVIRO_VEHICLES = ["aclass", "escape", "hilux", "i3", "lexus", "tesla", "tiguan", "tucson", "x5",
                  "zoe"]
SPECS = {
    "VLCS": ("VLCS", ["Caltech101", "LabelMe", "SUN09", "VOC2007"], ["C", "L", "S", "V"], 300),
    "PACS": ("PACS", ["art_painting", "cartoon", "photo", "sketch"], ["A", "C", "P", "S"], 300),
    "OfficeHome": ("office_home", ["Art", "Clipart", "Product", "Real World"],
                   ["A", "C", "P", "R"], 300),
    "TerraIncognita": ("terra_incognita", ["location_100", "location_38", "location_43",
                                           "location_46"], ["L100", "L38", "L43", "L46"], 300),
    "DomainNet": ("domain_net", ["clipart", "infograph", "painting", "quickdraw", "real",
                                 "sketch"],
                  ["clip", "info", "paint", "quick", "real", "sketch"], 1000),
    "SVIRO": ("sviro", SVIRO_VEHICLES, SVIRO_VEHICLES, 300),
}


def _tree(root, folder, envs, classes=("dog", "cat", "bird"), per_class=2, skip=None):
    for e, env in enumerate(envs):
        for c, cls in enumerate(classes):
            if skip == (env, cls):
                continue
            d = os.path.join(root, folder, env, cls)
            os.makedirs(d, exist_ok=True)
            for i in range(per_class):
                colour = (40 * e, 80 * c, 20 * i)
                Image.new("RGB", (20 + i, 16), colour).save(os.path.join(d, f"img{i}.jpg"))
            open(os.path.join(d, "notes.txt"), "w").close()      # not an image


@pytest.mark.parametrize("name", sorted(SPECS))
def test_registered_folder_datasets(tmp_path, name):
    folder, env_dirs, env_names, freq = SPECS[name]
    _tree(tmp_path, folder, env_dirs)
    cls = get_dataset_class(name)
    assert cls.ENVIRONMENTS == env_names and cls.CHECKPOINT_FREQ == freq and cls.N_STEPS == 5001
    hp = default_hparams("ERM", name)
    hp["image_size"] = 24
    d = cls(str(tmp_path), [0], hp)
    assert len(d) == len(env_names) and d.num_classes == 3 and d.input_shape == (3, 24, 24)
    assert d.classes == ["bird", "cat", "dog"]
    assert [len(e) for e in d] == [6] * len(env_names)
    ids = np.concatenate([e.ids for e in d])
    assert ids.tolist() == list(range(6 * len(env_names)))
    env = d[1]
    assert env.y.tolist() == [0, 0, 1, 1, 2, 2]
    assert [os.path.basename(p) for p in env.paths] == ["img0.jpg", "img1.jpg"] * 3
    assert env.paths[0].endswith(os.path.join(env_dirs[1], "bird", "img0.jpg"))
    x, y = env[2]
    assert x.shape == (3, 24, 24) and int(y) == 1
    assert d[0].transform is d[0].eval_transform and d[1].transform is d[1].train_transform
    assert d.data_source.endswith(folder) and len(d.data_fingerprint) == 16


def test_transforms_and_splits(tmp_path):
    _tree(tmp_path, "PACS", SPECS["PACS"][1])
    hp = default_hparams("ERM", "PACS")
    hp["image_size"] = 16
    d = get_dataset_class("PACS")(str(tmp_path), [3], hp)
    env = d[0]
    inner, outer = env.subset([0, 2, 4]), env.subset([1, 3, 5])
    outer.set_transform(False)
    assert inner.transform is env.train_transform and outer.transform is env.eval_transform
    assert env.transform is env.train_transform
    x_eval, y = outer[1]
    torch.testing.assert_close(x_eval, env.subset([3]).set_transform(False)[0][0])
    assert int(y) == env.y[3] and outer.ids.tolist() == [1, 3, 5]
    nested = outer.subset([2])
    assert nested.paths == [env.paths[5]] and nested.transform is env.eval_transform
    hp["data_augmentation"] = False
    plain = get_dataset_class("PACS")(str(tmp_path), [3], hp)
    assert all(e.train_transform is e.eval_transform for e in plain)


def test_missing_classes_and_bad_trees(tmp_path):
    _tree(tmp_path, "VLCS", SPECS["VLCS"][1], skip=("LabelMe", "cat"))
    hp = default_hparams("ERM", "VLCS")
    d = get_dataset_class("VLCS")(str(tmp_path), [0], hp)
    assert d.num_classes == 3 and d[1].y.tolist() == [0, 0, 2, 2]   # labels stay aligned
    with pytest.raises(UserError, match="domainbed.scripts.download"):
        get_dataset_class("PACS")(str(tmp_path), [0], hp)
    os.makedirs(tmp_path / "other" / "PACS" / "art_painting" / "dog")
    with pytest.raises(UserError, match="expected 4 environment folders"):
        get_dataset_class("PACS")(str(tmp_path / "other"), [0], hp)


def test_generic_image_folder(tmp_path):
    _tree(tmp_path, "mine", ["e1", "e0"], classes=("b", "a"), per_class=1)
    d = MultipleEnvironmentImageFolder(str(tmp_path / "mine"), [1], True, {"image_size": 8})
    assert d.environment_dirs == ["e0", "e1"] and d.classes == ["a", "b"]
    assert [e.ids.tolist() for e in d] == [[0, 1], [2, 3]]
