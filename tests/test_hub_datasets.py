"""``--dataset hf:REPO_OR_DIR``: a local folder in the Hub's layout (parquet files the tests
write with the `datasets` library) becomes a benchmark: environments from the domain
column (or another column), classes from the ClassLabel names, images checked before
training, the source and revision in the records."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from tests.requirements import need_package

need_package("datasets")

from domainbed.hub_options import fold_hf_flags, split_name  # noqa: E402
from domainbed.registry import get_dataset_class  # noqa: E402
from domainbed.training.config import RunConfig  # noqa: E402
from domainbed.training.loop import build_run_data  # noqa: E402
from oodutils.errors import UserError  # noqa: E402
from tests.hub_fixtures import write_hub_folder  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HPARAMS = {"image_size": 16, "data_augmentation": False}
SMALL = {"arch": "resnet_small", "pretrained": False, "image_size": 16, "batch_size": 4}


def build(name, **changes):
    config = RunConfig(dataset=name, test_envs=[0], **changes)
    return build_run_data(get_dataset_class(name), config, dict(HPARAMS)).dataset


def test_environments_classes_and_lazy_images(tmp_path):
    rows = write_hub_folder(tmp_path / "hub")
    name = f"hf:{tmp_path / 'hub'}"
    cls = get_dataset_class(name)
    assert cls.ENVIRONMENTS == ["art_painting", "photo", "sketch"]   # sorted values
    dataset = build(name)
    assert dataset.classes == ["dog", "cat", "bird"] and dataset.num_classes == 3
    assert [len(env) for env in dataset] == [9, 9, 9]
    art = dataset[0]
    expected = [label for domain, label, _ in rows if domain == "art_painting"]
    assert art.y.tolist() == expected
    assert sorted(np.concatenate([e.ids for e in dataset]).tolist()) == list(range(27))
    image, label = art[4]
    assert tuple(image.shape) == (3, 16, 16) and int(label) == expected[4]
    identity = dataset.identity()
    assert identity["data_source"] == f"hf:{tmp_path / 'hub'}"
    assert identity["hf_revision"] == "local" and len(identity["data_fingerprint"]) == 16


def test_another_domain_column_and_chosen_domains(tmp_path):
    rows = write_hub_folder(tmp_path / "hub")
    name = fold_hf_flags(f"hf:{tmp_path / 'hub'}", {"hf_domain_column": "region"})
    assert name == f"hf:{tmp_path / 'hub'}?domain_column=region"
    dataset = build(name)
    assert get_dataset_class(name).ENVIRONMENTS == ["north", "south"]
    assert [len(e) for e in dataset] == [sum(r[2] == "north" for r in rows),
                                         sum(r[2] == "south" for r in rows)]
    chosen = fold_hf_flags(f"hf:{tmp_path / 'hub'}", {"hf_domains": "sketch,photo"})
    assert get_dataset_class(chosen).ENVIRONMENTS == ["sketch", "photo"]
    assert [len(e) for e in build(chosen)] == [9, 9]
    assert split_name(chosen[3:])[1]["domains"] == "sketch,photo"


def test_integer_labels_without_classlabel(tmp_path):
    write_hub_folder(tmp_path / "hub", label_names=False)
    dataset = build(f"hf:{tmp_path / 'hub'}")
    assert dataset.classes == ["0", "1", "2"] and dataset.num_classes == 3


@pytest.mark.parametrize("flags, message", [
    ({"hf_domain_column": "place"}, "no column 'place' (--hf_domain_column); the columns "
                                    "are: image, domain, region, label"),
    ({"hf_label_column": "y"}, "no column 'y' (--hf_label_column)"),
    ({"hf_split": "test"}, "no split 'test' (--hf_split); the splits are: train"),
    ({"hf_domains": "sketch,moon"}, "--hf_domains names 'moon'"),
    ({"hf_domains": "sketch"}, "needs at least two domains"),
    ({"hf_revision": "abc"}, "--hf_revision applies to Hub repositories"),
])
def test_bad_options_are_one_line(tmp_path, flags, message):
    write_hub_folder(tmp_path / "hub")
    with pytest.raises(UserError) as caught:
        get_dataset_class(fold_hf_flags(f"hf:{tmp_path / 'hub'}", flags))
    assert message in str(caught.value) and "\n" not in str(caught.value)


def test_flags_need_an_hf_dataset_and_agree_with_the_name():
    with pytest.raises(UserError, match="only apply to hf: datasets"):
        fold_hf_flags("PACS", {"hf_split": "test"})
    with pytest.raises(UserError, match="contradicts"):
        fold_hf_flags("hf:x?domain_column=a", {"hf_domain_column": "b"})
    assert fold_hf_flags("hf:x?domain_column=a", {"hf_domain_column": "a"}) == \
        "hf:x?domain_column=a"
    with pytest.raises(UserError, match="unknown option 'colour'"):
        split_name("x?colour=red")


def test_bad_image_bytes_are_checked_before_training(tmp_path):
    write_hub_folder(tmp_path / "hub", bad={4: b"not an image"})
    name = f"hf:{tmp_path / 'hub'}"
    with pytest.raises(UserError) as caught:
        build(name)
    assert "row 4 (image column) is not an image" in str(caught.value)
    assert "--skip_bad_images" in str(caught.value)
    dataset = build(name, skip_bad_images=True)
    assert sum(len(e) for e in dataset) == 26


@pytest.mark.slow
def test_train_contract_records_name_source_and_revision(tmp_path):
    """The issue's contract: train --dataset hf:DIR ... --steps 5 (and --hf_domain_column)."""
    write_hub_folder(tmp_path / "hub")
    for extra, out, envs in (([], tmp_path / "out", ["art_painting", "photo", "sketch"]),
                             (["--hf_domain_column", "region"], tmp_path / "out_region",
                              ["north", "south"])):
        subprocess.run([sys.executable, "-m", "domainbed.scripts.train", "--dataset",
                        f"hf:{tmp_path / 'hub'}", "--algorithm", "ERM", "--test_envs", "0",
                        "--steps", "5", "--hparams", json.dumps(SMALL), "--output_dir",
                        str(out), *extra], cwd=REPO, check=True, capture_output=True,
                       timeout=600)
        with open(out / "results.jsonl") as f:
            args = json.loads(f.readlines()[-1])["args"]
        assert args["data_source"] == f"hf:{tmp_path / 'hub'}"
        assert args["hf_revision"] == "local" and args["env_names"] == envs
    assert args["dataset"] == f"hf:{tmp_path / 'hub'}?domain_column=region"


def test_missing_column_from_the_command_line_is_one_line(tmp_path):
    write_hub_folder(tmp_path / "hub")
    proc = subprocess.run([sys.executable, "-m", "domainbed.scripts.train", "--dataset",
                           f"hf:{tmp_path / 'hub'}", "--hf_domain_column", "place",
                           "--output_dir", str(tmp_path / "out")], cwd=REPO,
                          capture_output=True, text=True, timeout=300)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode != 0 and len(lines) == 1, lines
    assert "no column 'place'" in lines[0] and "image, domain, region, label" in lines[0]


@pytest.mark.slow
def test_sweep_and_collect_results_show_the_domain_names(tmp_path):
    write_hub_folder(tmp_path / "hub")
    sweep = tmp_path / "sweep"
    subprocess.run([sys.executable, "-m", "domainbed.scripts.sweep", "launch", "--datasets",
                    f"hf:{tmp_path / 'hub'}", "--hf_domain_column", "region", "--algorithms",
                    "ERM", "--n_hparams", "1", "--n_trials", "1", "--steps", "2", "--hparams",
                    json.dumps(SMALL), "--data_dir", str(tmp_path), "--output_dir", str(sweep),
                    "--command_launcher", "local", "--skip_confirmation"], cwd=REPO, check=True,
                   capture_output=True, timeout=600)
    proc = subprocess.run([sys.executable, "-m", "domainbed.scripts.collect_results",
                           "--input_dir", str(sweep)], cwd=REPO, check=True,
                          capture_output=True, text=True)
    assert f"hf:{tmp_path / 'hub'}?domain_column=region" in proc.stdout
    assert "north" in proc.stdout and "south" in proc.stdout
    subprocess.run([sys.executable, "-m", "domainbed.scripts.leaderboard", "--input_dir",
                    str(sweep), "--output_dir", str(tmp_path / "site")], cwd=REPO, check=True,
                   capture_output=True, timeout=600)
    with open(tmp_path / "site" / "leaderboard.csv") as f:
        columns = {line.split(",")[3] for line in f.readlines()[1:]}
    assert {"north", "south"} <= columns


def test_every_command_folds_the_flags_into_the_name():
    from domainbed.scripts import evaluate, list_top_hparams, sweep
    args = list_top_hparams.parse_args(["--input_dir", "x", "--dataset", "hf:d",
                                        "--hf_split", "test", "--test_env", "0"])
    assert args.dataset == "hf:d?split=test"
    assert sweep.hf_names(["PACS", "hf:d"], {"hf_domains": "a,b"}) == ["PACS",
                                                                      "hf:d?domains=a,b"]
    with pytest.raises(UserError, match="only apply to hf: datasets"):
        sweep.hf_names(["PACS"], {"hf_domains": "a,b"})
    parsed = evaluate.build_parser().parse_args(["--model", "m", "--dataset", "hf:d",
                                                 "--hf_label_column", "y",
                                                 "--output_dir", "o"])
    assert fold_hf_flags(parsed.dataset, vars(parsed)) == "hf:d?label_column=y"
    config = RunConfig.from_argv(["--dataset", "hf:d", "--hf_revision", "v1.0"])
    assert config.dataset == "hf:d?revision=v1.0"


def test_a_text_dataset_from_its_text_column(tmp_path):
    import datasets
    texts = {"books": ["a fine novel", "dull pages", "great plot twist", "boring ending"],
             "films": ["superb acting", "awful script", "loved it", "hated it"]}
    rows = [(t, g, i % 2) for g, items in texts.items() for i, t in enumerate(items)]
    (tmp_path / "text" / "data").mkdir(parents=True)
    features = datasets.Features({"sentence": datasets.Value("string"),
                                  "genre": datasets.Value("string"),
                                  "label": datasets.ClassLabel(names=["good", "bad"])})
    datasets.Dataset.from_dict({"sentence": [r[0] for r in rows], "genre": [r[1] for r in rows],
                                "label": [r[2] for r in rows]}, features=features).to_parquet(
        tmp_path / "text" / "data" / "train-00000-of-00001.parquet")
    name = fold_hf_flags(f"hf:{tmp_path / 'text'}", {"hf_text_column": "sentence",
                                                     "hf_domain_column": "genre"})
    cls = get_dataset_class(name)
    assert cls.ENVIRONMENTS == ["books", "films"] and cls.CLASSES == ["good", "bad"]
    dataset = cls(str(tmp_path), [0], {"text_featurizer": "bow"})
    assert [len(e) for e in dataset] == [4, 4] and dataset.num_classes == 2
    assert dataset[1].y.tolist() == [0, 1, 0, 1]
    assert dataset.identity()["data_source"] == f"hf:{tmp_path / 'text'}"
    x, y = dataset[0][2]
    assert x.shape == tuple(dataset.input_shape) and int(y) == 0
