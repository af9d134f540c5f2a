"""Image-folder datasets never follow a symlink out of the dataset root, and a symlink
loop or two links to one folder do not multiply images."""
import os

from domainbed.registry import get_dataset_class
from domainbed.run_hparams import default_hparams
from tests.test_image_folders import _tree

ENVS = ["art_painting", "cartoon", "photo", "sketch"]


def _pacs(root):
    _tree(root, "PACS", ENVS)
    hp = default_hparams("ERM", "PACS")
    hp["image_size"] = 16
    return lambda: get_dataset_class("PACS")(str(root), [0], hp)


def test_symlink_loop_and_double_links_count_each_image_once(tmp_path):
    build = _pacs(tmp_path)
    before = [len(e) for e in build()]
    dog = tmp_path / "PACS" / "cartoon" / "dog"
    os.symlink(".", dog / "loop")                      # dog/loop -> dog
    os.symlink("..", dog / "up")                       # dog/up -> cartoon (inside root)
    (dog / "extra").mkdir()
    os.symlink(dog / "extra", dog / "extra_again")     # a second link to one folder
    assert [len(e) for e in build()] == before


def test_symlinks_out_of_the_root_are_not_followed(tmp_path):
    build = _pacs(tmp_path / "data")
    before = [len(e) for e in build()]
    outside = tmp_path / "elsewhere"
    _tree(outside, "", ["x"], classes=("dog",), per_class=3)
    env = tmp_path / "data" / "PACS" / "photo"
    os.symlink(outside / "x" / "dog", env / "dog" / "linked_dir")      # folder outside
    os.symlink(outside / "x" / "dog" / "img0.jpg", env / "dog" / "z.jpg")  # file outside
    os.symlink(outside / "x", env / "horse")            # a class folder outside the root
    d = build()
    assert [len(e) for e in d] == before and "horse" not in d.classes
    for e in d:
        assert all(os.path.realpath(p).startswith(str(tmp_path / "data")) for p in e.paths)


def test_symlinked_dataset_root_still_works(tmp_path):
    _pacs(tmp_path / "real")
    os.symlink(tmp_path / "real", tmp_path / "link")
    hp = default_hparams("ERM", "PACS")
    hp["image_size"] = 16
    d = get_dataset_class("PACS")(str(tmp_path / "link"), [0], hp)
    assert [len(e) for e in d] == [6] * 4
