"""OoD-Bench: the parameterised Colored MNIST, the environment classifier (Algorithm 1)
and the command lines (`python -m ood_bench ...`, `python -m ood_bench.quantify`)."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENV = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1",
           PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))


def run(*args, cwd=None):
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, env=ENV,
                          cwd=cwd or ROOT, timeout=600)


@pytest.fixture(autouse=True)
def _one_thread():
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)


def write_features(path, seed=0, n=300, agree_q=0.2):
    rng = np.random.RandomState(seed)
    w = rng.randn(2, 8)
    def side(agree):  # noqa: E306
        y = rng.randint(0, 2, n)
        c = np.where(rng.rand(n) < agree, y, 1 - y)
        u = np.stack([2.0 * c - 1 + 0.3 * rng.randn(n), rng.randn(n)], 1)
        return np.tanh(u @ w * 1.5) + 0.01 * rng.randn(n, 8), y
    z_p, y_p = side(0.9)
    z_q, y_q = side(agree_q)
    np.savez(path, z_p=z_p, y_p=y_p, z_q=z_q, y_q=y_q)


# --- dataset -------------------------------------------------------------------------

def test_oodbench_colored_mnist(tmp_path):
    from domainbed.datasets.oodbench_mnist import OoDBenchColoredMNIST
    from domainbed.registry import get_dataset_class
    assert get_dataset_class("OoDBenchColoredMNIST") is OoDBenchColoredMNIST
    ds = OoDBenchColoredMNIST(str(tmp_path), [], {"cmnist_rho_tr": 0.1, "cmnist_rho_te": 0.7})
    assert len(ds) == 2 and ds.input_shape == (2, 14, 14) and ds.num_classes == 2
    agree = [(env.groups % 2 == env.y.numpy()).mean() for env in ds]
    assert agree[0] == pytest.approx(0.9, abs=0.03) and agree[1] == pytest.approx(0.3, abs=0.03)
    assert len(set(ds[0].ids) & set(ds[1].ids)) == 0
    again = OoDBenchColoredMNIST(str(tmp_path), [], {"cmnist_rho_te": 0.7})
    assert torch.equal(again[1].x, ds[1].x)  # same data seed, same data
    blue = OoDBenchColoredMNIST(str(tmp_path), [], {"cmnist_blue": True})
    assert blue.input_shape == (3, 14, 14)
    share = [float(env.x[:, 2].sum() / env.x.sum()) for env in blue]
    assert share[0] < 0.15 and share[1] > 0.85  # mu_tr = 0, mu_te = 1, sigma = 0.1
    from oodutils.errors import UserError
    with pytest.raises(UserError):
        OoDBenchColoredMNIST(str(tmp_path), [], {"cmnist_rho_te": 1.5})


# --- Algorithm 1 ---------------------------------------------------------------------

def test_sides_are_label_shift_free_and_split(tmp_path):
    from ood_bench.data import load_dataset, make_sides
    ds, _ = load_dataset("OoDBenchColoredMNIST", str(tmp_path))
    sides = make_sides(ds, [0], [1], holdout_fraction=0.2, seed=3)
    for c in (0, 1):
        assert (sides.train_p.y == c).sum() == (sides.train_q.y == c).sum()
        assert (sides.out_p.y == c).sum() == (sides.out_q.y == c).sum()
    n = len(sides.train_p) + len(sides.out_p)
    assert len(sides.out_p) == pytest.approx(0.2 * n, abs=2)
    iid = make_sides(ds, [0], [1], 0.2, seed=3, force_iid=True)
    assert set(np.unique(iid.out_p.env)) == {0, 1}
    from oodutils.errors import UserError
    with pytest.raises(UserError):
        make_sides(ds, [0], [0])
    with pytest.raises(UserError):
        make_sides(ds, [0], [5])


def test_env_classifier_is_label_conditioned():
    from ood_bench.classifier import EnvClassifier, MLPBackbone
    model = EnvClassifier(MLPBackbone((2, 14, 14), 32), num_classes=3, dim_z=8)
    x = torch.randn(5, 2, 14, 14)
    z, logits = model(x, torch.tensor([0, 1, 2, 0, 1]))
    assert z.shape == (5, 8) and logits.shape == (5, 2)
    _, other = model(x, torch.tensor([1, 2, 0, 1, 2]))
    assert not torch.allclose(logits, other)  # h depends on y


@pytest.mark.parametrize("backbone", ["featurizer", "resnet18"])
def test_train_and_extract_on_debug_data(tmp_path, backbone):
    from ood_bench.classifier import extract_features, train_env_classifier
    from ood_bench.data import load_dataset, make_sides
    ds, _ = load_dataset("Debug28", str(tmp_path))
    sides = make_sides(ds, [0, 1], [2], holdout_fraction=0.25, seed=0)
    model, log = train_env_classifier(sides, backbone=backbone, steps=4, batch_size=4,
                                      eval_every=2, pretrained=False)
    feats = extract_features(model, sides)
    assert feats["z_p"].shape == (len(sides.out_p), 8)
    assert feats["z_q"].shape == (len(sides.out_q), 8)
    assert set(np.unique(feats["env_p"])) <= {0, 1}
    assert log["selected_step"] in (0, 2, 4) and 0 <= log["val_acc"] <= 1


# --- command lines -------------------------------------------------------------------

def test_quantify_contract(tmp_path):
    f = tmp_path / "FILE.npz"
    write_features(f)
    out = tmp_path / "result.json"
    r = run("-m", "ood_bench.quantify", "--features", str(f), "--seed", "3", "--out", str(out))
    assert r.returncode == 0, r.stderr
    result = json.loads(out.read_text())
    assert {"diversity", "correlation"} <= set(result)
    assert np.isfinite(result["diversity"]) and np.isfinite(result["correlation"])
    assert result["seed"] == 3 and result["eps_div"] == 1e-12 and result["eps_cor"] == 5e-4
    # the same through the subcommand, same seed -> same numbers
    out2 = tmp_path / "r2.json"
    r = run("-m", "ood_bench", "quantify", "--features", str(f), "--seed", "3",
            "--out", str(out2), "--num-threads", "1")
    assert r.returncode == 0, r.stderr
    assert json.loads(out2.read_text())["correlation"] == result["correlation"]


@pytest.mark.slow
def test_bad_inputs_are_one_clear_line(tmp_path):
    r = run("-m", "ood_bench.quantify", "--features", str(tmp_path / "none.npz"),
            "--seed", "0", "--out", str(tmp_path / "r.json"))
    assert r.returncode == 2 and r.stderr.strip().startswith("error:")
    assert len(r.stderr.strip().splitlines()) == 1
    np.savez(tmp_path / "bad.npz", z_p=np.zeros((5, 2)))
    r = run("-m", "ood_bench.quantify", "--features", str(tmp_path / "bad.npz"))
    assert r.returncode == 2 and "missing arrays" in r.stderr
    write_features(tmp_path / "f.npz")
    r = run("-m", "ood_bench.quantify", "--features", str(tmp_path / "f.npz"),
            "--bandwidth", "wide")
    assert r.returncode == 2 and "bandwidth" in r.stderr
    r = run("-m", "ood_bench", "extract", "--dataset", "NoSuchSet", "--data-dir",
            str(tmp_path), "--envs-p", "0", "--envs-q", "1", "--out", str(tmp_path / "x.npz"))
    assert r.returncode == 2 and "NoSuchSet" in r.stderr


def test_calibrate_summarize_plot(tmp_path, capsys):
    from ood_bench.cli import main  # in-process: the subprocess path is tested above
    for k in range(2):
        write_features(tmp_path / f"f{k}.npz", seed=k)
    main(["calibrate", "--features", str(tmp_path / "f*.npz"), "--out",
          str(tmp_path / "cal.json"), "--sample-size", "1000", "--max-iters", "6",
          "--num-threads", "1"])
    cal = json.loads((tmp_path / "cal.json").read_text())
    assert len(cal["history"]) <= 6 and "eps_cor" in cal
    res = []
    for k in range(2):
        out = tmp_path / f"t{k}" / "result.json"
        main(["quantify", "--features", str(tmp_path / f"f{k}.npz"), "--seed", str(k),
              "--out", str(out), "--calibration", str(tmp_path / "cal.json"),
              "--sample-size", "1000", "--num-threads", "1"])
        res.append(json.loads(out.read_text()))
    assert res[0]["eps_cor"] == cal["eps_cor"]
    main(["summarize", "--root", str(tmp_path), "--out", str(tmp_path / "summary.json")])
    s = json.loads((tmp_path / "summary.json").read_text())
    assert s["n_trials"] == 2
    assert s["correlation"]["mean"] == pytest.approx(np.mean([x["correlation"] for x in res]))
    png = tmp_path / "plane.png"
    r = run("-m", "ood_bench", "plot", "plane", "--summaries",
            f"toy={tmp_path / 'summary.json'}", "--paper", "--out", str(png))
    assert r.returncode == 0, r.stderr
    assert png.read_bytes()[:4] == b"\x89PNG"
    grid = {"kind": "rho", "metric": "correlation", "values": [0.1, 0.9],
            "grid": [[0.0, 0.6], [0.6, 0.0]]}
    (tmp_path / "grid.json").write_text(json.dumps(grid))
    main(["plot", "heatmap", "--grid", str(tmp_path / "grid.json"), "--out",
          str(tmp_path / "heat.png")])
    assert (tmp_path / "heat.png").read_bytes()[:4] == b"\x89PNG"


def test_run_trials_end_to_end(tmp_path):
    out = tmp_path / "trials"
    r = run("-m", "ood_bench", "run", "--dataset", "OoDBenchColoredMNIST", "--data-dir",
            str(tmp_path), "--envs-p", "0", "--envs-q", "1", "--steps", "30",
            "--mlp-width", "32", "--eval-every", "10", "--holdout-fraction", "0.2",
            "--n-trials", "2", "--sample-size", "1000", "--output-dir", str(out),
            "--calibrate", "--calibration-level", "features", "--num-threads", "1",
            "--dataset-settings", json.dumps({"cmnist_rho_te": 0.9}))
    assert r.returncode == 0, r.stderr
    s = json.loads((out / "summary.json").read_text())
    assert s["n_trials"] == 2 and s["seeds"] == [0, 1]
    assert "calibration" in s and "iid" in s and (out / "calibration.json").exists()
    for seed in (0, 1):
        res = json.loads((out / f"trial_{seed}" / "result.json").read_text())
        assert res["eps_cor"] == s["eps_cor"]
        with np.load(out / f"trial_{seed}" / "features.npz") as f:
            assert f["z_p"].shape[1] == 8 and len(f["y_p"]) == len(f["z_p"])


def test_heatmap_grid_and_png(tmp_path):
    from ood_bench import figures
    grid = figures.run_heatmap("mu-div", [0.0, 1.0], str(tmp_path), steps=10, mlp_width=16,
                               eval_every=5, holdout_fraction=0.2, sample_size=500)
    g = np.array(grid["grid"])
    assert g.shape == (2, 2) and np.isfinite(g).all()
    assert grid["axes"] == ["cmnist_mu_tr", "cmnist_mu_te"] and grid["metric"] == "diversity"
    png = str(tmp_path / "h.png")
    fig = figures.plot_heatmap(grid, png)
    assert open(png, "rb").read(4) == b"\x89PNG" and fig.axes


def test_image_folder_dataset_features(tmp_path):
    from PIL import Image
    rng = np.random.RandomState(0)
    for env in ("art_painting", "cartoon", "photo", "sketch"):
        for cls in ("dog", "horse"):
            d = tmp_path / "PACS" / env / cls
            d.mkdir(parents=True)
            for i in range(6):
                Image.fromarray((rng.rand(36, 36, 3) * 255).astype(np.uint8)).save(d / f"{i}.png")
    from ood_bench.cli import main
    from oodutils.errors import UserError
    out = tmp_path / "f.npz"
    common = ["extract", "--dataset", "PACS", "--data-dir", str(tmp_path), "--envs-q", "3",
              "--dataset-settings", '{"image_size": 32}', "--backbone", "resnet18",
              "--out", str(out), "--num-threads", "1"]
    main(common + ["--envs-p", "0", "1", "2", "--no-pretrained", "--steps", "2",
                   "--eval-every", "1", "--batch-size", "4", "--holdout-fraction", "0.5"])
    with np.load(out) as f:
        assert f["z_p"].shape == (6, 8) and f["z_q"].shape == (6, 8)
        assert set(np.unique(f["env_p"])) <= {0, 1, 2} and set(np.unique(f["env_q"])) == {3}
    with pytest.raises(UserError, match="--no_pretrained"):
        main(common + ["--envs-p", "0", "--pretrained-path", str(tmp_path / "no.pth")])


def test_figures_draw_on_given_axes_without_forcing_a_backend(tmp_path):
    import matplotlib
    from matplotlib.figure import Figure

    from ood_bench import figures
    backend = matplotlib.get_backend()
    fig = Figure()
    ax = fig.add_subplot()
    points = {"PACS": ((0.8, 0.05), (0.0, 0.0))}
    assert figures.plot_plane(points, ax=ax, paper=True) is fig
    grid = {"kind": "rho", "metric": "correlation", "values": [0.1, 0.9],
            "grid": [[0.0, 0.5], [0.4, 0.1]]}
    assert figures.plot_heatmap(grid, str(tmp_path / "h.png")).axes
    assert open(tmp_path / "h.png", "rb").read(4) == b"\x89PNG"
    assert matplotlib.get_backend() == backend


def test_module_entry_point_answers_help_and_a_bad_command():
    """`python -m ood_bench` (its __main__) lists the subcommands and refuses an unknown one
    with argparse's usage and error lines, no traceback (the quick loop's run of the entry
    point; the end-to-end runs are slow)."""
    r = run("-m", "ood_bench", "--help")
    assert r.returncode == 0 and "quantify" in r.stdout, r.stderr
    r = run("-m", "ood_bench", "no-such-command")
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert "error: argument COMMAND: invalid choice: 'no-such-command'" in r.stderr


def test_quantify_refuses_bad_input_before_importing_torch(tmp_path):
    """The features file is read and checked, and the options parsed, without torch: a bad
    input is one error line at once, not after the estimator's imports."""
    np.savez(tmp_path / "bad.npz", z_p=np.zeros((5, 2)))
    write_features(tmp_path / "f.npz")
    code = ("import sys\n"
            "from ood_bench.quantify import main\n"
            "from oodutils.errors import UserError\n"
            "for argv in (['--features', 'bad.npz'], ['--features', 'none.npz'],\n"
            "             ['--features', 'f.npz', '--bandwidth', 'wide']):\n"
            "    try:\n"
            "        main(argv)\n"
            "    except UserError as e:\n"
            "        print('refused:', e)\n"
            "print('torch loaded:', 'torch' in sys.modules)\n")
    r = run("-c", code, cwd=str(tmp_path))
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert [line.split(":")[0] for line in lines] == ["refused"] * 3 + ["torch loaded"]
    assert "missing arrays" in lines[0] and "does not exist" in lines[1]
    assert "bandwidth" in lines[2] and lines[3] == "torch loaded: False"

