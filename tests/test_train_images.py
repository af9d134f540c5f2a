"""Training on an image-folder dataset (files, transforms, loader) through the CLI."""
import json
import os
import subprocess
import sys

import numpy as np
from PIL import Image

from tests.builders import read_records

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_train_on_image_folders(tmp_path):
    rng = np.random.RandomState(0)
    for env in ("Caltech101", "LabelMe", "SUN09", "VOC2007"):
        for cls in ("bird", "car"):
            folder = tmp_path / "VLCS" / env / cls
            folder.mkdir(parents=True)
            for i in range(5):
                Image.fromarray(rng.randint(0, 255, (40, 40, 3), dtype=np.uint8)).save(
                    folder / f"{i}.png")
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "domainbed.scripts.train", "--dataset", "VLCS",
           "--algorithm", "ERM", "--data_dir", str(tmp_path), "--output_dir", str(out),
           "--steps", "3", "--checkpoint_freq", "2", "--num_threads", "1", "--test_envs", "0",
           "--hparams", json.dumps({"arch": "mlp", "mlp_width": 16, "pretrained": False,
                                    "batch_size": 4})]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    rec = read_records(out)[-1]
    assert rec["args"]["env_names"] == ["C", "L", "S", "V"]
    assert 0.0 <= rec["env3_out_acc"] <= 1.0
    lines = (out / "examples.csv").read_text().splitlines()
    assert lines[0] == "id,env,path" and len(lines) == 1 + 40 and ".png" in lines[1]
    pred = np.load(out / "predictions" / "step_0000002.npz")
    assert len(np.unique(pred["id"])) == 40


def test_pretrained_weights_missing_is_clear(tmp_path):
    (tmp_path / "VLCS" / "C" / "a").mkdir(parents=True)
    Image.new("RGB", (8, 8)).save(tmp_path / "VLCS" / "C" / "a" / "0.png")
    for env in "LSV":
        (tmp_path / "VLCS" / env / "a").mkdir(parents=True)
        Image.new("RGB", (8, 8)).save(tmp_path / "VLCS" / env / "a" / "0.png")
    cmd = [sys.executable, "-m", "domainbed.scripts.train", "--dataset", "VLCS",
           "--algorithm", "ERM", "--data_dir", str(tmp_path), "--output_dir",
           str(tmp_path / "run"), "--steps", "1"]
    env = {**os.environ, "TORCH_HOME": str(tmp_path / "torch_home")}
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, env=env)
    assert proc.returncode == 2 and "pretrained ImageNet weights" in proc.stderr
    assert "Traceback" not in proc.stderr
