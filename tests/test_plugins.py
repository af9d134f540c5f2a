"""A separate package registers an algorithm through the `domainbed.algorithms` entry point
and trains through the ordinary CLI with no edit to this repo; a NaN loss stops a run
cleanly."""
import os
import subprocess
import sys
import textwrap

import pytest

from tests.builders import read_records

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

PLUGIN_SOURCE = textwrap.dedent('''
    import torch
    from domainbed.algorithms.erm import ERM
    from domainbed.hparams import Hparam


    class ScaledERM(ERM):
        """ERM whose loss is multiplied by a declared hyperparameter."""
        HPARAMS = {"loss_scale": Hparam(1.0, lambda r: 10 ** r.uniform(-1, 1))}

        def update(self, minibatches, unlabeled=None):
            x = torch.cat([x for x, _ in minibatches])
            y = torch.cat([y for _, y in minibatches])
            loss = self.hparams["loss_scale"] * \\
                torch.nn.functional.cross_entropy(self.predict(x), y)
            self.optimizer.zero_grad()
            loss.backward()
            self.optimizer.step()
            return {"loss": loss.item(), "plugin": 1.0}


    class ExplodingERM(ERM):
        """Reports a NaN loss at its third update (the run must stop cleanly)."""
        def update(self, minibatches, unlabeled=None):
            self.calls = getattr(self, "calls", 0) + 1
            out = super().update(minibatches, unlabeled)
            if self.calls == 3:
                out["loss"] = float("nan")
            return out
''')


def make_plugin_package(root):
    """A package with entry-point metadata, importable from `root` (no pip needed)."""
    pkg = root / "oodbed_plugin_demo"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text(PLUGIN_SOURCE)
    dist = root / "oodbed_plugin_demo-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: oodbed-plugin-demo\n"
                                   "Version: 0.1\n")
    (dist / "entry_points.txt").write_text(
        "[domainbed.algorithms]\n"
        "ScaledERM = oodbed_plugin_demo:ScaledERM\n"
        "ExplodingERM = oodbed_plugin_demo:ExplodingERM\n")
    return root


def train(tmp_path, algorithm, plugin_root, *extra):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(plugin_root), REPO])}
    cmd = [sys.executable, "-m", "domainbed.scripts.train", "--dataset", "Debug28",
           "--algorithm", algorithm, "--data_dir", str(tmp_path), "--steps", "5",
           "--checkpoint_freq", "2", "--output_dir", str(tmp_path / algorithm),
           "--num_threads", "1", *extra]
    return subprocess.run(cmd, capture_output=True, text=True, cwd=str(tmp_path), env=env)


@pytest.mark.slow
def test_plugin_algorithm_trains_through_cli(tmp_path):
    root = make_plugin_package(tmp_path / "site")
    proc = train(tmp_path, "ScaledERM", root, "--hparams", '{"loss_scale": 0.5}')
    assert proc.returncode == 0, proc.stderr
    recs = read_records(tmp_path / "ScaledERM")
    assert recs[-1]["plugin"] == 1.0
    assert recs[-1]["hparams"]["loss_scale"] == 0.5
    assert recs[-1]["args"]["algorithm"] == "ScaledERM"
    assert (tmp_path / "ScaledERM" / "done").exists()


def test_nan_loss_stops_run_with_recorded_error(tmp_path):
    root = make_plugin_package(tmp_path / "site")
    proc = train(tmp_path, "ExplodingERM", root)
    assert proc.returncode == 2
    assert "loss became nan at step 2" in proc.stderr and "Traceback" not in proc.stderr
    out = tmp_path / "ExplodingERM"
    assert not (out / "done").exists()
    assert "loss became nan" in (out / "err.txt").read_text()
    steps = [r["step"] for r in read_records(out)]  # the step-0 checkpoint, no garbage
    assert steps == [0]


def test_registry_lists_plugins_and_builtins(tmp_path):
    root = make_plugin_package(tmp_path / "site")
    code = ("from domainbed.registry import ALGORITHMS; n = ALGORITHMS.names(); "
            "print(','.join(n))")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root), REPO])}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=env, check=True).stdout.strip().split(",")
    for name in ("ERM", "IRM", "GroupDRO", "CORAL", "MMD", "VREx", "ScaledERM"):
        assert name in out
