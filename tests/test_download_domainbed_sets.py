"""TerraIncognita and DomainNet downloads as DomainBed's download script makes them, end to
end against a server on 127.0.0.1 serving small archives in the sources' real layouts; and
every command a dataset suggests for missing data is one the download command accepts.

The expected layouts are written out by hand from DomainBed's rules (locations 38, 46, 100,
43; ten categories; location_<L>/<category>/<file>; DomainNet minus the files its
domain_net_duplicates.txt lists), not computed with the code under test."""
import io
import json
import os
import re
import shlex
import tarfile
import zipfile

import pytest
from PIL import Image

from domainbed.scripts import download
from oodutils.errors import UserError
from tests.test_download_machinery import Server


@pytest.fixture
def server():
    s = Server({})
    yield s
    s.close()


def _jpeg(shade):
    buf = io.BytesIO()
    Image.new("RGB", (4, 4), (shade, 0, 0)).save(buf, format="JPEG")
    return buf.getvalue()


def _files_under(root):
    return {os.path.relpath(os.path.join(d, f), root).replace(os.sep, "/")
            for d, _, files in os.walk(root) for f in files}


def _tar_gz(members):
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


# ------------------------------------------------------------------- TerraIncognita

# Caltech Camera Traps category ids as in its COCO Camera Traps files (only the names matter)
CATEGORIES = [{"id": 1, "name": "opossum"}, {"id": 3, "name": "car"}, {"id": 6, "name": "bird"},
              {"id": 8, "name": "dog"}, {"id": 9, "name": "coyote"}, {"id": 10, "name": "cat"},
              {"id": 30, "name": "empty"}]
IMAGES = {  # file name -> (location as the file gives it, category ids of its annotations)
    "a.jpg": (38, [6]),            # bird at location 38
    "b.jpg": ("46", [10, 8]),      # two kept categories: in both folders
    "c.jpg": (100, [3]),           # "car" is not one of the ten: left out
    "d.jpg": (100, [30]),
    "e.jpg": (43, [9]),
    "f.jpg": (1, [6]),             # location 1 is not one of the four: left out
    "g.jpg": (38, [6, 6]),         # two annotations of one category: one file
}
EXPECTED_TERRA = {"location_100/empty/d.jpg", "location_38/bird/a.jpg",
                  "location_38/bird/g.jpg", "location_43/coyote/e.jpg", "location_46/cat/b.jpg",
                  "location_46/dog/b.jpg"}
ANNOTATION_FILES = ["cis_test_annotations.json", "cis_val_annotations.json",
                    "train_annotations.json", "trans_test_annotations.json",
                    "trans_val_annotations.json"]


def terra_archives(missing_image=False):
    """(images tar.gz, annotations tar.gz): the ECCV'18 archives' layout, the images spread
    over the five annotation files (e.jpg listed in two of them, as a split overlap)."""
    pixels = {name: _jpeg(40 * i) for i, name in enumerate(IMAGES)}
    images = {f"eccv_18_all_images_sm/{name}": data for name, data in pixels.items()
              if not (missing_image and name == "d.jpg")}
    per_file = {f: {"info": {}, "categories": CATEGORIES, "images": [], "annotations": []}
                for f in ANNOTATION_FILES}
    for i, (name, (location, categories)) in enumerate(IMAGES.items()):
        for file in {ANNOTATION_FILES[i % 5]} | ({ANNOTATION_FILES[0]} if name == "e.jpg"
                                                 else set()):
            per_file[file]["images"].append({"id": f"id-{name}", "file_name": name,
                                             "location": location})
            per_file[file]["annotations"] += [
                {"id": f"ann-{name}-{k}", "image_id": f"id-{name}", "category_id": c}
                for k, c in enumerate(categories)]
    annotations = {f"eccv_18_annotation_files/{f}": json.dumps(d).encode()
                   for f, d in per_file.items()}
    return _tar_gz(images), _tar_gz(annotations), pixels


def _serve_terra(server, monkeypatch, missing_image=False):
    images, annotations, pixels = terra_archives(missing_image)
    server.files.update({"/images.tar.gz": images, "/annotations.tar.gz": annotations})
    step = download.DATASETS["TerraIncognita"][0]
    monkeypatch.setattr(step, "images_url", server.url + "/images.tar.gz")
    monkeypatch.setattr(step, "annotations_url", server.url + "/annotations.tar.gz")
    return pixels


def test_terra_incognita_download_builds_domainbeds_layout(server, tmp_path, monkeypatch,
                                                          capsys):
    from domainbed.datasets.image_folders import TerraIncognita
    pixels = _serve_terra(server, monkeypatch)
    data = tmp_path / "data"
    download.main(["--data_dir", str(data), "--datasets", "TerraIncognita"])
    assert "TerraIncognita: done" in capsys.readouterr().out
    root = data / "terra_incognita"
    assert _files_under(root) == EXPECTED_TERRA
    assert (root / "location_46" / "dog" / "b.jpg").read_bytes() == pixels["b.jpg"]
    assert sorted(p.name for p in data.iterdir()) == [download.LOCK_FILE, "terra_incognita"]
    lock = json.loads((data / download.LOCK_FILE).read_text())  # trust on first use
    assert set(lock) == {"eccv_18_all_images_sm.tar.gz", "eccv_18_annotations.tar.gz"}
    assert lock["eccv_18_all_images_sm.tar.gz"]["tree"] == ["terra_incognita"]
    ds = TerraIncognita(str(data), [0], {"data_augmentation": False, "image_size": 8})
    assert [len(env) for env in ds] == [1, 2, 1, 2]  # L100, L38, L43, L46
    assert ds.num_classes == 5 and tuple(ds[1][0][0].shape) == (3, 8, 8)
    download.main(["--data_dir", str(data), "--datasets", "TerraIncognita", "--verify"])
    assert "TerraIncognita: verified" in capsys.readouterr().out
    (root / "location_38" / "bird" / "a.jpg").write_bytes(b"changed")
    with pytest.raises(UserError, match="1 of 1 verifications failed"):
        download.main(["--data_dir", str(data), "--datasets", "TerraIncognita", "--verify"])


def test_terra_incognita_with_an_image_missing_places_nothing_and_keeps_the_archives(
        server, tmp_path, monkeypatch, capsys):
    _serve_terra(server, monkeypatch, missing_image=True)
    data = tmp_path / "data"
    with pytest.raises(UserError, match="1 of 1 downloads failed: TerraIncognita"):
        download.main(["--data_dir", str(data), "--datasets", "TerraIncognita"])
    assert "d.jpg is not in the images archive" in capsys.readouterr().err
    assert sorted(p.name for p in data.iterdir()) == [  # a rerun downloads nothing again
        download.LOCK_FILE, "eccv_18_all_images_sm.tar.gz", "eccv_18_annotations.tar.gz"]


def test_an_annotation_naming_a_path_outside_is_refused(tmp_path):
    from domainbed.downloads.image_folders import arrange_terra_incognita
    (tmp_path / "images").mkdir()
    (tmp_path / "secret.jpg").write_bytes(b"x")
    annotations = {"categories": [{"id": 1, "name": "bird"}],
                   "images": [{"id": 1, "file_name": "../secret.jpg", "location": 38}],
                   "annotations": [{"id": 1, "image_id": 1, "category_id": 1}]}
    with pytest.raises(UserError, match="not a plain relative path"):
        arrange_terra_incognita(str(tmp_path / "images"), annotations, str(tmp_path / "out"))
    assert (tmp_path / "secret.jpg").exists() and not (tmp_path / "out").exists()


# ------------------------------------------------------------------------- DomainNet

DOMAIN_NET_FILES = {  # zip name -> files in it; the first of each listed in DomainBed's file
    "clipart.zip": ["clipart/animal_migration/clipart_006_000227.jpg",
                    "clipart/animal_migration/clipart_006_000001.jpg",
                    "clipart/axe/clipart_012_000001.jpg"],
    "infograph.zip": ["infograph/axe/infograph_012_000052.jpg",
                      "infograph/animal_migration/infograph_006_000001.jpg",
                      "infograph/axe/infograph_012_000001.jpg"],
    "painting.zip": ["painting/airplane/painting_002_000134.jpg",
                     "painting/animal_migration/painting_006_000001.jpg",
                     "painting/axe/painting_012_000001.jpg"],
    "quickdraw.zip": ["quickdraw/animal_migration/4503599627370496.png",
                      "quickdraw/axe/4503599627370497.png"],
    "real.zip": ["real/zebra/real_344_000095.jpg",
                 "real/animal_migration/real_006_000001.jpg", "real/axe/real_012_000001.jpg"],
    "sketch.zip": ["sketch/animal_migration/sketch_006_000076.jpg",
                   "sketch/animal_migration/sketch_006_000001.jpg",
                   "sketch/axe/sketch_012_000001.jpg"],
}
DOMAIN_NET_DUPLICATES_SERVED = {"clipart/animal_migration/clipart_006_000227.jpg",
                                "infograph/axe/infograph_012_000052.jpg",
                                "painting/airplane/painting_002_000134.jpg",
                                "real/zebra/real_344_000095.jpg",
                                "sketch/animal_migration/sketch_006_000076.jpg"}


def _zip(names):
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        for i, name in enumerate(names):
            zf.writestr(name, _jpeg(30 * i))
    return buf.getvalue()


def test_domain_net_download_removes_domainbeds_duplicates(server, tmp_path, monkeypatch,
                                                           capsys):
    from domainbed.datasets.image_folders import DomainNet
    steps = download.DATASETS["DomainNet"]
    assert [s.name for s in steps] == list(DOMAIN_NET_FILES)
    assert [s.url for s in steps][:2] == [  # DomainBed's sources
        "http://csr.bu.edu/ftp/visda/2019/multi-source/groundtruth/clipart.zip",
        "http://csr.bu.edu/ftp/visda/2019/multi-source/infograph.zip"]
    for step in steps:
        server.files["/" + step.name] = _zip(DOMAIN_NET_FILES[step.name])
        monkeypatch.setattr(step, "url", server.url + "/" + step.name)
    data = tmp_path / "data"
    download.main(["--data_dir", str(data), "--datasets", "DomainNet"])
    assert "DomainNet: done" in capsys.readouterr().out
    kept = {n for names in DOMAIN_NET_FILES.values() for n in names} - \
        DOMAIN_NET_DUPLICATES_SERVED
    root = data / "domain_net"
    assert _files_under(root) - {download.LOCK_FILE} == kept
    ds = DomainNet(str(data), [0], {"data_augmentation": False, "image_size": 8})
    assert [len(env) for env in ds] == [2] * 6 and ds.num_classes == 4  # emptied folders stay
    download.main(["--data_dir", str(data), "--datasets", "DomainNet", "--verify"])
    assert "DomainNet: verified" in capsys.readouterr().out  # recorded after the removal


def test_the_duplicate_list_is_domainbeds_file():
    """sha256 of DomainBed's domain_net_duplicates.txt (commit b93c22a), as shipped."""
    import hashlib

    from domainbed.downloads.image_folders import DOMAIN_NET_DUPLICATES
    with open(DOMAIN_NET_DUPLICATES, "rb") as f:
        body = f.read()
    assert hashlib.sha256(body).hexdigest() == \
        "a52b4ab70203f4f3df381077694dba3e33ff44c26407e1c5faca76919c702770"
    assert body.count(b"\n") == 9431


# ------------------------------------------------ every suggested command is accepted

COMMAND = re.compile(r"`([^`]*(?:domainbed\.scripts\.download|domainbed-download)[^`]*)`")


def suggested_download_args(text):
    """The arguments of every download command a message suggests in backticks."""
    found = []
    for command in COMMAND.findall(text):
        words = shlex.split(command)
        start = next(i for i, w in enumerate(words)
                     if w in ("domainbed.scripts.download", "domainbed-download"))
        found.append(words[start + 1:])
    return found


def test_every_missing_dataset_message_suggests_a_command_the_download_accepts(
        tmp_path, capsys, caplog):
    from domainbed.registry import DATASETS, get_dataset_class
    from domainbed.run_hparams import default_hparams
    from domainbed.training.batches import build_dataset
    needing_files = {}
    for name in DATASETS.builtin_names():
        try:
            build_dataset(get_dataset_class(name), str(tmp_path), [0],
                          default_hparams("ERM", name), 0)
            message = ""
        except UserError as e:
            message = str(e)
            needing_files[name] = suggested_download_args(message)
        notices = capsys.readouterr().err + caplog.text
        caplog.clear()
        for argv in suggested_download_args(message + notices):
            args = download.build_parser().parse_args(argv)
            download.check_request(args)  # a UserError names an unknown dataset
            assert args.datasets, (name, argv)
    assert {"TerraIncognita", "DomainNet", "PACS", "Waterbirds"} <= set(needing_files)
    without = [name for name, commands in needing_files.items() if not commands]
    assert not without, f"missing data with no download suggested: {without}"
    assert download.DATASETS["TerraIncognita"] and download.DATASETS["DomainNet"]


def test_a_suggestion_naming_an_unknown_dataset_would_be_caught():
    (argv,) = suggested_download_args("run `python -m domainbed.scripts.download --datasets "
                                      "TerraIncognita Nope --data_dir DATA_DIR` first")
    with pytest.raises(UserError, match="unknown dataset 'Nope'"):
        download.check_request(download.build_parser().parse_args(argv))
