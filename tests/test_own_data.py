"""`--dataset folder:PATH` and `--dataset csv:PATH`: your own images without a class.

Small real image trees are written with PIL (images of different sizes); expected values
(domains, classes, counts, groups) are the ones the test wrote, not recomputed."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest
from PIL import Image

from domainbed.registry import DATASETS, get_dataset_class
from oodutils.errors import UserError

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SMALL = {"pretrained": False, "arch": "resnet_small", "image_size": 16, "batch_size": 4}


def image_tree(root, domains=("art", "photo", "sketch"), classes=("cat", "dog"), per_class=4):
    """root/<domain>/<class>/<k>.png|jpg, each image a different size and colour."""
    for d, domain in enumerate(domains):
        for c, cls in enumerate(classes):
            os.makedirs(root / domain / cls)
            for k in range(per_class):
                ext = "png" if k % 2 else "jpg"
                Image.new("RGB", (10 + 7 * k + d, 12 + 5 * k + c),
                          (40 * k, 100 * c, 60 * d)).save(root / domain / cls / f"{k}.{ext}")
    return root


def write_csv(path, rows, header="path,label,domain,group"):
    path.write_text(header + "\n" + "".join(",".join(map(str, r)) + "\n" for r in rows))
    return path


def csv_rows(domains=("art", "photo", "sketch"), classes=("cat", "dog"), per_class=4):
    """Rows for image_tree's files: group = 2 * label + (k odd)."""
    return [(f"{domain}/{cls}/{k}.{'png' if k % 2 else 'jpg'}", c, domain, 2 * c + k % 2)
            for domain in domains for c, cls in enumerate(classes) for k in range(per_class)]


def build(name, test_envs=(0,), **hparams):
    return get_dataset_class(name)("unused_data_dir", list(test_envs),
                                   {"image_size": 16, "data_augmentation": True, **hparams})


def test_folder_dataset_layout_and_images(tmp_path):
    root = image_tree(tmp_path / "mine")
    name = f"folder:{root}"
    cls = get_dataset_class(name)
    assert cls.ENVIRONMENTS == ["art", "photo", "sketch"]
    assert cls.registry_name == name
    assert name not in DATASETS.names()  # built on demand, not listed as registered
    dataset = build(name)
    assert len(dataset) == 3 and dataset.num_classes == 2
    assert [len(env) for env in dataset] == [8, 8, 8]
    assert dataset[1].y.tolist() == [0, 0, 0, 0, 1, 1, 1, 1]
    assert os.path.basename(dataset[1].paths[4]) == "0.jpg"
    ids = np.concatenate([env.ids for env in dataset])
    assert sorted(ids.tolist()) == list(range(24))
    image, label = dataset[2][7]
    assert tuple(image.shape) == (3, 16, 16) and int(label) == 1  # any size resized


def test_csv_dataset_groups_and_ids(tmp_path):
    root = image_tree(tmp_path / "mine")
    rows = csv_rows()
    name = f"csv:{write_csv(root / 'meta.csv', rows)}"
    cls = get_dataset_class(name)
    assert cls.ENVIRONMENTS == ["art", "photo", "sketch"]
    assert cls.GROUP_NAMES == ["group0", "group1", "group2", "group3"]
    dataset = build(name)
    assert dataset.num_classes == 2
    photo = dataset[1]
    assert photo.ids.tolist() == list(range(8, 16))  # data-row indices
    assert photo.groups.tolist() == [0, 1, 0, 1, 2, 3, 2, 3]
    assert photo.y.tolist() == [0, 0, 0, 0, 1, 1, 1, 1]
    assert tuple(photo[3][0].shape) == (3, 16, 16)


def test_csv_without_group_column(tmp_path):
    root = image_tree(tmp_path / "mine", domains=("a", "b"))
    rows = [r[:3] for r in csv_rows(domains=("b", "a"))]  # domains sorted, not file order
    cls = get_dataset_class(f"csv:{write_csv(root / 'm.csv', rows, 'path,label,domain')}")
    assert cls.ENVIRONMENTS == ["a", "b"] and cls.GROUP_NAMES is None
    dataset = build(cls.registry_name)
    assert dataset[0].groups is None and dataset[0].ids.tolist() == list(range(8, 16))


def test_identity_stable_for_same_files_and_changes_with_them(tmp_path):
    first = image_tree(tmp_path / "one")
    second = image_tree(tmp_path / "two")
    a, b = build(f"folder:{first}"), build(f"folder:{second}")
    assert a.identity()["data_fingerprint"] == b.identity()["data_fingerprint"]
    assert a.identity()["data_source"] != b.identity()["data_source"]
    again = build(f"folder:{first}/")  # another spelling: another name, same files
    assert again.identity() == a.identity()
    os.rename(second / "art" / "dog" / "3.png", second / "art" / "dog" / "9.png")
    assert build(f"folder:{second}/.").identity()["data_fingerprint"] != \
        a.identity()["data_fingerprint"]
    rows = csv_rows()
    one = build(f"csv:{write_csv(first / 'x.csv', rows)}").identity()
    same = build(f"csv:{write_csv(first / 'y.csv', rows)}").identity()
    rows[0] = (rows[0][0], 1, rows[0][2], rows[0][3])
    other = build(f"csv:{write_csv(first / 'z.csv', rows)}").identity()
    assert one["data_fingerprint"] == same["data_fingerprint"] != other["data_fingerprint"]


@pytest.mark.parametrize("mutate, message", [
    (lambda root: os.rename(root / "photo", root / ".hidden") or
     os.rename(root / "sketch", root / ".hidden2"), "at least two domains"),
    (lambda root: [os.remove(p) for p in (root / "photo" / "dog").iterdir()],
     "class 'dog' has no images in domain 'photo'"),
    (lambda root: os.rename(root / "sketch" / "cat", root / "sketch" / ".cat"),
     "class 'cat' has no images in domain 'sketch'"),
    (lambda root: [os.remove(p) for c in ("cat", "dog") for p in (root / "art" / c).iterdir()],
     "has no images"),
])
def test_folder_bad_layouts(tmp_path, mutate, message):
    root = image_tree(tmp_path / "mine")
    mutate(root)
    with pytest.raises(UserError, match=message):
        build(f"folder:{root}")


def test_folder_missing_and_empty_domain_folder(tmp_path):
    with pytest.raises(UserError, match="is not a directory"):
        get_dataset_class(f"folder:{tmp_path / 'nowhere'}")
    root = image_tree(tmp_path / "mine")
    os.makedirs(root / "empty")
    with pytest.raises(UserError, match="has no class folders"):
        get_dataset_class(f"folder:{root}")


def _csv_error(tmp_path, rows, header="path,label,domain,group"):
    root = tmp_path / "mine"
    if not root.exists():
        image_tree(root)
    with pytest.raises(UserError) as caught:
        get_dataset_class(f"csv:{write_csv(root / 'bad.csv', rows, header)}")
    return str(caught.value)


def test_csv_refuses_paths_leaving_its_folder(tmp_path):
    outside = tmp_path / "outside.png"
    Image.new("RGB", (5, 5)).save(outside)
    rows = csv_rows()
    for bad in (str(outside), "../outside.png", "art/../../outside.png"):
        message = _csv_error(tmp_path, rows + [(bad, 0, "art", 0)])
        assert "leads outside the CSV's folder" in message and "row 26" in message
    os.symlink(outside, tmp_path / "mine" / "art" / "cat" / "link.png")
    message = _csv_error(tmp_path, rows + [("art/cat/link.png", 0, "art", 0)])
    assert "leads outside" in message and "'art/cat/link.png'" in message


@pytest.mark.parametrize("change, message", [
    (lambda rows: [(p, "cat" if i == 3 else y, d, g) for i, (p, y, d, g) in enumerate(rows)],
     "row 5: label 'cat' is a class name but other rows give class indices"),
    (lambda rows: [(p, "1.0" if i == 0 else y, d, g) for i, (p, y, d, g) in enumerate(rows)],
     "row 2: label '1.0' is a class name but other rows give class indices"),
    (lambda rows: [(p, y, d, "x" if i == 1 else g) for i, (p, y, d, g) in enumerate(rows)],
     "row 3: group 'x'"),
    (lambda rows: [(p, y, "art", g) for p, y, d, g in rows], "at least two domains"),
    (lambda rows: [(p, y, "" if i == 2 else d, g) for i, (p, y, d, g) in enumerate(rows)],
     "row 4 has an empty domain"),
    (lambda rows: [r for r in rows if not (r[2] == "photo" and r[1] == 1)],
     "class 1 has no images in domain 'photo'"),
    (lambda rows: rows + [("art/cat/missing.png", 0, "art", 0)], "sampled files are missing"),
    (lambda rows: [], "has no rows"),
])
def test_csv_bad_tables(tmp_path, change, message):
    assert message in _csv_error(tmp_path, change(csv_rows()))


def test_csv_missing_columns_and_file(tmp_path):
    assert "lacks the column(s) domain" in _csv_error(
        tmp_path, [r[:2] for r in csv_rows()], "path,label")
    with pytest.raises(UserError, match="no such file"):
        get_dataset_class(f"csv:{tmp_path / 'none.csv'}")


def test_train_cli_bad_csv_is_one_line(tmp_path):
    root = image_tree(tmp_path / "mine", domains=("a", "b"), per_class=1)
    csv = write_csv(root / "m.csv", [("a/cat/0.jpg", 0, "a", 0), ("../x.png", 0, "b", 0)])
    proc = subprocess.run(
        [sys.executable, "-m", "domainbed.scripts.train", "--dataset", f"csv:{csv}",
         "--output_dir", str(tmp_path / "out")], cwd=REPO, capture_output=True, text=True)
    assert proc.returncode != 0
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: csv:") and "leads outside" in lines[0]


def _records(run_dir):
    with open(run_dir / "results.jsonl") as f:
        return [json.loads(line) for line in f]


@pytest.mark.slow
def test_train_two_steps_on_folder_and_csv(tmp_path):
    root = image_tree(tmp_path / "mine")
    csv = write_csv(root / "meta.csv", csv_rows())
    for name, out in ((f"folder:{root}", tmp_path / "folder_run"),
                      (f"csv:{csv}", tmp_path / "csv_run")):
        subprocess.run([sys.executable, "-m", "domainbed.scripts.train", "--dataset", name,
                        "--test_envs", "2", "--steps", "2", "--hparams", json.dumps(SMALL),
                        "--output_dir", str(out)], cwd=REPO, check=True, capture_output=True)
        last = _records(out)[-1]
        assert last["args"]["dataset"] == name and last["step"] == 1
        assert {f"env{i}_{s}_acc" for i in range(3) for s in ("in", "out")} <= set(last)
    assert last["args"]["data_source"] == f"csv:{csv}"
    assert "env0_in_wga" in last  # the CSV's groups: each one scored in env 2's in or out
    assert all(f"env2_in_acc_g{g}" in last or f"env2_out_acc_g{g}" in last for g in range(4))


@pytest.mark.slow
def test_sweep_and_collect_results(tmp_path):
    root = image_tree(tmp_path / "mine", domains=("day", "night"), per_class=3)
    name = f"folder:{root}"
    sweep = tmp_path / "sweep"
    subprocess.run([sys.executable, "-m", "domainbed.scripts.sweep", "launch", "--datasets",
                    name, "--algorithms", "ERM", "--n_hparams", "1", "--n_trials", "1",
                    "--steps", "2", "--hparams", json.dumps(SMALL), "--data_dir",
                    str(tmp_path), "--output_dir", str(sweep), "--command_launcher", "local",
                    "--skip_confirmation"], cwd=REPO, check=True, capture_output=True)
    runs = sorted(p for p in sweep.iterdir() if (p / "done").exists())
    assert len(runs) == 2  # one job per test domain
    assert sorted(_records(r)[-1]["args"]["test_envs"][0] for r in runs) == [0, 1]
    proc = subprocess.run([sys.executable, "-m", "domainbed.scripts.collect_results",
                           "--input_dir", str(sweep)], cwd=REPO, check=True,
                          capture_output=True, text=True)
    assert name in proc.stdout and "day" in proc.stdout and "night" in proc.stdout


def test_dataset_named_by_a_path_stays_one_file_name_part():
    from oodutils.fileio import file_name_part
    assert file_name_part("folder:/data/my pics/v1") == "folder__data_my_pics_v1"
    assert file_name_part("csv:../x.csv") == "csv_.._x.csv"  # no separator: stays in the folder


def test_tables_fall_back_to_indices_when_the_folder_is_gone(tmp_path):
    from domainbed.results.report import registered_environments
    root = image_tree(tmp_path / "kept", domains=("a", "b"), per_class=1)
    assert registered_environments(f"folder:{root}") == ["a", "b"]
    assert registered_environments(f"folder:{tmp_path / 'gone'}") is None


def test_csv_labels_as_class_names(tmp_path):
    """`path,label,domain` with label = dog: classes are the sorted names."""
    root = image_tree(tmp_path / "mine", classes=("dog", "cat"))
    names = ("dog", "cat")   # image_tree's class c is names[c]
    rows = [(p, names[y], d) for p, y, d, _ in csv_rows(classes=names)]
    name = f"csv:{write_csv(root / 'named.csv', rows, header='path,label,domain')}"
    dataset = build(name)
    assert dataset.num_classes == 2 and dataset.classes == ["cat", "dog"]
    photo = dataset[1]
    assert photo.y.tolist() == [1, 1, 1, 1, 0, 0, 0, 0]   # dog rows first, dog is class 1
    assert [os.path.basename(os.path.dirname(p)) for p in photo.paths[:4]] == ["dog"] * 4
    indexed_rows = [(p, 1 - y, d) for p, y, d, _ in csv_rows(classes=names)]
    indexed = build(f"csv:{write_csv(root / 'idx.csv', indexed_rows, 'path,label,domain')}")
    assert indexed[1].y.tolist() == photo.y.tolist()
    assert indexed.data_fingerprint != dataset.data_fingerprint   # the names are data too
    rows = [r for r in rows if not (r[2] == "photo" and r[1] == "cat")]
    message = _csv_error(tmp_path, rows, header="path,label,domain")
    assert "class 'cat' has no images in domain 'photo'" in message


def test_train_help_says_what_dataset_accepts():
    from domainbed.training.config import build_parser
    text = " ".join(build_parser().format_help().split())
    for form in ("folder:PATH", "csv:PATH", "hf:REPO_OR_DIR", "--hf_domain_column",
                 "--skip_bad_images"):
        assert form in text, form
