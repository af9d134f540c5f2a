"""`domainbed-evaluate`: a checkpoint or an outside classifier scored on every split into an
ordinary run directory. Expected predictions come from running the model directly on the
dataset's tensors (not through the evaluation pipeline); collect_results and aotl read the
output; a full pickle needs --trust_pickle; bad input is one error line before any work."""
import hashlib
import json
import os
import subprocess
import sys
import types

import numpy as np
import pytest
import torch

from domainbed import run_hparams
from domainbed.datasets.debug import Debug28
from domainbed.predictions import load_predictions
from domainbed.registry import get_algorithm_class
from domainbed.results.records import load_records
from domainbed.scripts import evaluate
from domainbed.training.loop import save_model
from oodutils.errors import run_cli
from oodutils.pinned_dir import PinnedDir
from tests.requirements import need_package

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ARGS = {"dataset": "Debug28", "algorithm": "ERM", "test_envs": [0], "trial_seed": 0,
        "data_seed": 0, "holdout_fraction": 0.2, "hparams_seed": 0, "seed": 0, "steps": 5}


def debug_envs():
    """Debug28's environments built directly: (ids, x, y) per environment."""
    dataset = Debug28("", [0], {}, data_seed=0)
    return [(env.ids, env.x, env.y) for env in dataset.datasets]


def expected_predictions(predict):
    """{example id: predicted class} from running `predict` on every environment's x."""
    out = {}
    with torch.no_grad():
        for ids, x, _ in debug_envs():
            for i, p in zip(ids.tolist(), predict(x).argmax(1).tolist()):
                out[i] = p
    return out


def assert_scored(run_dir, expected):
    """The run directory's predictions equal `expected` for every example of every split,
    and each environment's in/out accuracies are those of these predictions."""
    [record] = load_records(str(run_dir)).records
    arrays = load_predictions(str(run_dir), record["step"])
    got = dict(zip(arrays["id"].tolist(), arrays["pred"].tolist()))
    assert got == expected
    labels = {int(i): int(y) for ids, _, ys in debug_envs() for i, y in zip(ids, ys)}
    for env in range(3):
        for code, split in ((0, "in"), (1, "out")):
            ids = arrays["id"][(arrays["env"] == env) & (arrays["split"] == code)].tolist()
            acc = np.mean([expected[i] == labels[i] for i in ids])
            assert record[f"env{env}_{split}_acc"] == pytest.approx(acc)
    assert (run_dir / "done").exists()
    return record


def make_checkpoint(tmp_path, name="model.pkl", numpy_hparams=False):
    """An ERM model on Debug28 saved as a training run saves it (loop.save_model)."""
    torch.manual_seed(0)
    hparams = run_hparams.default_hparams("ERM", "Debug28")
    algorithm = get_algorithm_class("ERM")((3, 28, 28), 2, 2, hparams)
    folder = tmp_path / "trained"
    folder.mkdir(exist_ok=True)
    if numpy_hparams:   # DomainBed's random draws are numpy scalars: a full pickle
        torch.save({"args": ARGS, "model_input_shape": (3, 28, 28), "model_num_classes": 2,
                    "model_num_domains": 2, "model_dict": algorithm.state_dict(),
                    "model_hparams": {**hparams, "lr": np.float64(hparams["lr"])}},
                   folder / name)
    else:
        with PinnedDir.open(str(folder)) as run_dir:
            save_model(run_dir, name, ARGS, types.SimpleNamespace(
                input_shape=(3, 28, 28), num_classes=2), algorithm, hparams, 2)
    return folder / name, algorithm.eval()


def run(*argv):
    """The command in a subprocess: (exit code, stdout, stderr)."""
    proc = subprocess.run([sys.executable, "-m", "domainbed.scripts.evaluate", *map(str, argv)],
                          capture_output=True, text=True, cwd=REPO)
    return proc.returncode, proc.stdout, proc.stderr


def run_here(capsys, *argv):
    """The command in this process, as its console script runs it: (exit code, stderr)."""
    with pytest.raises(SystemExit) as stopped:
        run_cli(evaluate.main, [str(a) for a in argv])
    return stopped.value.code, capsys.readouterr().err


def test_checkpoint_scores_every_split_into_a_run_directory(tmp_path):
    path, algorithm = make_checkpoint(tmp_path, "model_step3.pkl")
    out = tmp_path / "eval"
    assert evaluate.main(["--checkpoint", str(path), "--output_dir", str(out),
                          "--metrics", "ece", "balanced_acc"]) == 0
    record = assert_scored(out, expected_predictions(algorithm.predict))
    assert record["step"] == 3   # from the file name
    assert record["args"]["algorithm"] == "ERM" and record["args"]["dataset"] == "Debug28"
    assert record["args"]["test_envs"] == [0]   # the checkpoint's
    assert record["args"]["trained_on"] == {"dataset": "Debug28", "test_envs": [0]}
    assert record["args"]["arithmetic"] == "single"   # one forward pass
    assert {"env0_in_ece", "env2_out_balanced_acc", "env1_in_wga"} <= set(record)
    assert (out / "confusion" / "step_0000003.npz").exists()


def test_full_pickle_needs_trust_pickle(tmp_path):
    path, algorithm = make_checkpoint(tmp_path, numpy_hparams=True)
    code, _, err = run("--checkpoint", path, "--output_dir", tmp_path / "refused")
    assert code == 2
    [line] = err.strip().splitlines()
    assert line.startswith(f"error: --checkpoint {path} is a full pickle")
    assert "--trust_pickle" in line and "weights_only=False" not in line
    assert not (tmp_path / "refused").exists()
    out = tmp_path / "trusted"
    assert evaluate.main(["--checkpoint", str(path), "--output_dir", str(out),
                          "--trust_pickle"]) == 0
    assert_scored(out, expected_predictions(algorithm.predict))
    help_text = evaluate.build_parser().format_help()
    assert "--trust_pickle" in help_text and "Unsafe" in help_text


def save_resnet18(path, n_outputs, seed=0):
    import torchvision
    from safetensors.torch import save_file
    torch.manual_seed(seed)
    model = torchvision.models.resnet18(num_classes=n_outputs).eval()
    save_file(model.state_dict(), str(path))
    return model


def test_torchvision_classifier_with_the_datasets_head(tmp_path):
    model = save_resnet18(tmp_path / "resnet18_debug.safetensors", 2)
    out = tmp_path / "eval"
    assert evaluate.main(["--model", "resnet18", "--weights",
                          str(tmp_path / "resnet18_debug.safetensors"), "--dataset", "Debug28",
                          "--test_envs", "1", "--output_dir", str(out)]) == 0
    record = assert_scored(out, expected_predictions(model))
    assert record["args"]["algorithm"] == "resnet18" and record["args"]["test_envs"] == [1]
    assert record["args"]["evaluated_model"]["weights"] == "resnet18_debug.safetensors"
    assert len(record["args"]["evaluated_model"]["weights_sha256"]) == 64


def test_timm_classifier_with_the_datasets_head(tmp_path):
    import timm
    from safetensors.torch import save_file
    torch.manual_seed(0)
    model = timm.create_model("test_resnet", num_classes=2).eval()
    save_file(model.state_dict(), str(tmp_path / "tiny.safetensors"))
    out = tmp_path / "eval"
    assert evaluate.main(["--model", "timm:test_resnet", "--weights",
                          str(tmp_path / "tiny.safetensors"), "--dataset", "Debug28",
                          "--output_dir", str(out)]) == 0
    record = assert_scored(out, expected_predictions(model))
    assert record["args"]["algorithm"] == "timm:test_resnet"


TINY_CLIP = {  # an open_clip architecture small enough to build and run in milliseconds
    "embed_dim": 16, "quick_gelu": True,
    "vision_cfg": {"image_size": 32, "layers": 1, "width": 32, "head_width": 16,
                   "patch_size": 16},
    "text_cfg": {"context_length": 8, "vocab_size": 64, "width": 16, "heads": 2, "layers": 1}}


@pytest.fixture
def tiny_clip(monkeypatch):
    """The zoo's clip_vit_b16 name built as TINY_CLIP (its normalization and weight file
    name kept): (spec, the tiny tower with random weights at Debug28's 28 px)."""
    import dataclasses

    import open_clip
    from open_clip import factory

    from domainbed.networks import backbones
    monkeypatch.setitem(factory._MODEL_CONFIGS, "oodbed-tiny-clip", TINY_CLIP)
    spec = dataclasses.replace(backbones.BACKBONES["clip_vit_b16"], model="oodbed-tiny-clip")
    monkeypatch.setitem(backbones.BACKBONES, "clip_vit_b16", spec)
    monkeypatch.setattr(backbones, "_weights_dir", "")   # evaluate sets it from --weights_dir
    torch.manual_seed(0)
    visual = open_clip.create_model("oodbed-tiny-clip", pretrained=None, load_weights=False,
                                    force_image_size=(28, 28)).visual.eval()
    return spec, visual


def clip_features(spec, visual):
    """The tower on the dataset's ImageNet-normalized images, re-normalized to CLIP's mean
    and std first (as the tower was trained)."""
    imagenet_mean, imagenet_std = (torch.tensor(v).view(1, 3, 1, 1) for v in
                                   ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225)))
    mean, std = (torch.tensor(v).view(1, 3, 1, 1) for v in (spec.mean, spec.std))

    def features(x):
        return visual(((x * imagenet_std + imagenet_mean) - mean) / std)
    return features


def probe_head(features, sign=1.0):
    """A linear head on the features that tells Debug28's classes apart (the class means'
    difference, centred; sign -1 swaps the classes): random heads on a random tower
    predict one class."""
    with torch.no_grad():
        f = torch.cat([features(x) for _, x, _ in debug_envs()])
        y = torch.cat([y for _, _, y in debug_envs()])
        diff = sign * (f[y == 1].mean(0) - f[y == 0].mean(0))
        centre = (f[y == 1].mean(0) + f[y == 0].mean(0)) / 2
        head = torch.nn.Linear(f.shape[1], 2)
        head.weight.copy_(torch.stack([-diff, diff]) / diff.norm())
        head.bias.copy_(torch.stack([centre @ diff, -(centre @ diff)]) / diff.norm())
    return head.eval()


def assert_logits(run_dir, predict):
    """The run's saved (float16) logits are those of `predict` on every example."""
    [record] = load_records(str(run_dir)).records
    arrays = load_predictions(str(run_dir), record["step"])
    with torch.no_grad():
        direct = {i: row for ids, x, _ in debug_envs()
                  for i, row in zip(ids.tolist(), predict(x).numpy())}
    got = np.stack([direct[i] for i in arrays["id"].tolist()])
    np.testing.assert_allclose(arrays["logits"].astype(np.float32), got, rtol=1e-2, atol=1e-2)


def test_open_clip_tower_and_head_from_the_weights_file(tmp_path, tiny_clip):
    """--weights holding the tower (visual.*) and a linear head for Debug28's two classes."""
    from safetensors.torch import save_file
    spec, visual = tiny_clip
    features = clip_features(spec, visual)
    head = probe_head(features)
    state = {f"visual.{k}": v for k, v in visual.state_dict().items()}
    state.update({f"head.{k}": v for k, v in head.state_dict().items()})
    save_file(state, str(tmp_path / "clip_head.safetensors"))
    out = tmp_path / "eval"
    assert evaluate.main(["--model", "clip_vit_b16", "--weights",
                          str(tmp_path / "clip_head.safetensors"), "--dataset", "Debug28",
                          "--test_envs", "0", "--output_dir", str(out), "--save_logits"]) == 0

    def predict(x):
        return head(features(x))
    expected = expected_predictions(predict)
    assert set(expected.values()) == {0, 1}   # the check tells the classes apart
    record = assert_scored(out, expected)
    assert_logits(out, predict)
    assert record["args"]["algorithm"] == "clip_vit_b16"
    assert record["args"]["evaluated_model"]["weights"] == "clip_head.safetensors"


def test_open_clip_head_only_takes_the_zoos_tower(tmp_path, tiny_clip):
    """--weights holding only head.*: the tower is the zoo's weight file on disk (here in
    --weights_dir, as open_clip saves a whole CLIP model: visual.* and the text tower)."""
    import open_clip
    from safetensors.torch import save_file
    spec, visual = tiny_clip
    weights_dir = tmp_path / "zoo"
    weights_dir.mkdir()
    whole = open_clip.create_model("oodbed-tiny-clip", pretrained=None, load_weights=False,
                                   force_image_size=(28, 28))
    whole.visual.load_state_dict(visual.state_dict())
    save_file({k: v.contiguous() for k, v in whole.state_dict().items()},
              str(weights_dir / spec.file))
    features = clip_features(spec, visual)
    head = probe_head(features, sign=-1.0)
    save_file({f"head.{k}": v for k, v in head.state_dict().items()},
              str(tmp_path / "head.safetensors"))
    out = tmp_path / "eval"
    assert evaluate.main(["--model", "clip_vit_b16", "--weights",
                          str(tmp_path / "head.safetensors"), "--weights_dir", str(weights_dir),
                          "--dataset", "Debug28", "--output_dir", str(out),
                          "--save_logits"]) == 0

    def predict(x):
        return head(features(x))
    record = assert_scored(out, expected_predictions(predict))
    assert record["env0_in_acc"] < 0.5   # the head's classes swapped: the file's head
    assert_logits(out, predict)
    # the record names both files: the same head on another tower is another model
    identity = record["args"]["evaluated_model"]
    assert identity["weights"] == f"head.safetensors,{spec.file}"
    lines = "".join(f"{f.name}:{hashlib.sha256(f.read_bytes()).hexdigest()}\n"
                    for f in (tmp_path / "head.safetensors", weights_dir / spec.file))
    assert identity["weights_sha256"] == hashlib.sha256(lines.encode()).hexdigest()


def test_class_map_takes_log_sum_exp_of_each_class_outputs(tmp_path):
    model = save_resnet18(tmp_path / "four.safetensors", 4)
    (tmp_path / "map.json").write_text(json.dumps([[0, 3], 2]))
    out = tmp_path / "eval"
    assert evaluate.main(["--model", "resnet18", "--weights", str(tmp_path / "four.safetensors"),
                          "--class_map", str(tmp_path / "map.json"), "--dataset", "Debug28",
                          "--output_dir", str(out)]) == 0

    def mapped(x):
        logits = model(x)
        return torch.stack([torch.logsumexp(logits[:, [0, 3]], 1), logits[:, 2]], 1)
    assert_scored(out, expected_predictions(mapped))


def test_hugging_face_classifier_from_a_local_folder(tmp_path):
    transformers = need_package("transformers")
    torch.manual_seed(0)
    config = transformers.ResNetConfig(num_labels=2, embedding_size=8, hidden_sizes=[8, 16],
                                       depths=[1, 1], num_channels=3)
    model = transformers.ResNetForImageClassification(config).eval()
    model.save_pretrained(str(tmp_path / "hf_model"))
    out = tmp_path / "eval"
    assert evaluate.main(["--model", f"hf:{tmp_path / 'hf_model'}", "--dataset", "Debug28",
                          "--output_dir", str(out)]) == 0
    assert_scored(out, expected_predictions(lambda x: model(pixel_values=x).logits))


@pytest.mark.parametrize("argv, message", [
    (["--model", "resnet18", "--output_dir", "o"], "error: --model needs --dataset"),
    (["--checkpoint", "c.pkl", "--weights", "w", "--output_dir", "o"],
     "error: --weights and --class_map go with --model"),
    (["--model", "resnet18", "--dataset", "Debug28", "--trust_pickle", "--output_dir", "o"],
     "error: --trust_pickle goes with --checkpoint"),
    (["--checkpoint", "missing.pkl", "--output_dir", "o"],
     "error: --checkpoint 'missing.pkl' is not a file"),   # relative to the repo
    (["--model", "resnet18", "--dataset", "Nope", "--output_dir", "o"],
     "error: unknown dataset 'Nope'"),
    (["--model", "resnet18", "--dataset", "Debug28", "--test_envs", "5", "--output_dir", "o"],
     "error: test env 5 is out of range"),
    (["--model", "resnet18", "--dataset", "Debug28", "--metrics", "f2", "--output_dir", "o"],
     "error: --metrics 'f2'"),
    (["--model", "nosuchnet", "--dataset", "Debug28", "--output_dir", "o"],
     "error: unknown backbone 'nosuchnet'"),
    (["--model", "clip_vit_b16", "--dataset", "Debug28", "--output_dir", "o"],
     "error: clip_vit_b16 is an image tower without a classifier: pass --weights"),
])
def test_bad_input_is_one_line_before_any_work(tmp_path, capsys, argv, message):
    code, err = run_here(capsys, *[str(tmp_path / a) if a in ("o", "c.pkl", "w") else a
                                   for a in argv])
    assert code == 2
    [line] = err.strip().splitlines()
    assert line.startswith(message), line
    assert not (tmp_path / "o").exists()


def test_mismatched_outputs_and_maps_are_refused(tmp_path, capsys):
    save_resnet18(tmp_path / "ten.safetensors", 10)
    (tmp_path / "map.json").write_text(json.dumps([0, 12]))
    (tmp_path / "short.json").write_text(json.dumps([0]))
    base = ["--model", "resnet18", "--weights", tmp_path / "ten.safetensors", "--dataset",
            "Debug28", "--output_dir", tmp_path / "o"]
    cases = [([], "error: model resnet18 has 10 outputs but the dataset has 2 classes"),
             (["--class_map", tmp_path / "map.json"],
              "error: --class_map names output 12, but model resnet18 has 10 outputs"),
             (["--class_map", tmp_path / "short.json"],
              f"error: --class_map {str(tmp_path / 'short.json')!r} must be a JSON list of 2")]
    for extra, message in cases:
        code, err = run_here(capsys, *base, *extra)
        assert code == 2 and err.strip().splitlines()[-1].startswith(message), err
        assert len(err.strip().splitlines()) == 1
    assert not (tmp_path / "o" / "results.jsonl").exists()


def test_damaged_checkpoint_is_one_line_without_pickle_advice(tmp_path, capsys):
    (tmp_path / "model.pkl").write_bytes(b"not a checkpoint at all")
    code, err = run_here(capsys, "--checkpoint", tmp_path / "model.pkl", "--output_dir",
                         tmp_path / "o")
    [line] = err.strip().splitlines()
    assert code == 2 and line.startswith(f"error: --checkpoint {tmp_path / 'model.pkl'} "
                                         f"cannot be read")
    assert "trust_pickle" not in line and not (tmp_path / "o").exists()


def test_output_dir_holding_a_run_is_refused(tmp_path, capsys):
    path, _ = make_checkpoint(tmp_path)
    out = tmp_path / "eval"
    out.mkdir()
    (out / "results.jsonl").write_text("")
    code, err = run_here(capsys, "--checkpoint", path, "--output_dir", out)
    assert code == 2 and "already holds a run" in err and len(err.strip().splitlines()) == 1


def test_collect_results_and_aotl_read_evaluations(tmp_path, capsys):
    from analysis.aotl import cli as aotl_cli
    from domainbed.scripts import collect_results
    root = tmp_path / "evals"
    path, _ = make_checkpoint(tmp_path)
    for seed in range(3):   # a checkpoint scored on three trials' splits, as a sweep's runs
        evaluate.main(["--checkpoint", str(path), "--output_dir", str(root / f"erm_t{seed}"),
                       "--trial_seed", str(seed)])
    save_resnet18(tmp_path / "r18.safetensors", 2)
    evaluate.main(["--model", "resnet18", "--weights", str(tmp_path / "r18.safetensors"),
                   "--dataset", "Debug28", "--output_dir", str(root / "resnet18")])
    capsys.readouterr()
    collect_results.main(["--input_dir", str(root)])
    tables = capsys.readouterr().out
    assert "Debug28" in tables and "ERM" in tables and "resnet18" in tables
    aotl_cli.main([str(root), "--format", "csv"])
    fits = capsys.readouterr().out
    assert "Debug28" in fits and fits.count("\n") >= 2


@pytest.mark.slow
def test_a_trained_runs_checkpoint_scores_as_its_last_record(tmp_path):
    """The training run's own last evaluation is the independent reference."""
    run_dir = tmp_path / "run"
    subprocess.run([sys.executable, "-m", "domainbed.scripts.train", "--dataset", "Debug28",
                    "--algorithm", "ERM", "--test_envs", "1", "--steps", "3",
                    "--checkpoint_freq", "2", "--trial_seed", "1", "--num_threads", "1",
                    "--output_dir", str(run_dir)], check=True, capture_output=True, cwd=REPO)
    out = tmp_path / "eval"
    code, _, err = run("--checkpoint", run_dir / "model.pkl", "--output_dir", out)
    assert code == 0, err
    [trained] = [r for r in load_records(str(run_dir)).records if r["step"] == 2]
    [scored] = load_records(str(out)).records
    assert scored["step"] == 2
    assert scored["args"]["trial_seed"] == 1 and scored["args"]["test_envs"] == [1]
    for key in trained:
        if key.startswith("env") and key.endswith(("_acc", "_wga")):
            assert scored[key] == trained[key], key
    ours, theirs = load_predictions(str(out), 2), load_predictions(str(run_dir), 2)
    for name in ("id", "env", "split", "label", "pred"):
        assert np.array_equal(ours[name], theirs[name]), name
