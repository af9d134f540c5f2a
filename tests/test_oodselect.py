"""OODSelect: planted-subset recovery, exact optimum on tiny problems, Fisher intervals
(including Table A.3's bracketed values), splits, run-directory input, CLI contract."""
import itertools
import json
import math
import os
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest

from analysis import oodselect as core
from analysis.oodselect import baselines as bl
from analysis.oodselect import cli, data, protocol
from analysis.oodselect import report as rep
from oodutils.errors import UserError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FAST = dict(steps=700, patience=250)


@pytest.fixture(scope="module")
def planted():
    cm, mask = data.planted_problem(seed=0)
    parts = data.split_models(cm.models["run"].to_numpy(), seed=0)
    sel = core.OODSelect(seed=0, **FAST)
    tr, va, _ = parts
    sel.fit(cm.A[tr], cm.y[tr], [int(mask.sum())], cm.A[va], cm.y[va])
    return cm, mask, parts, sel


def test_planted_subset_recovered_and_anticorrelated_on_test_models(planted):
    cm, mask, (tr, va, te), sel = planted
    n = int(mask.sum())
    A, y = cm.A, cm.y
    full = core.subset_correlation(A[te], y[te], np.arange(cm.n_examples))
    assert full > 0.6                                    # accuracy on the line overall
    sub = sel.subsets_[0]
    assert len(sub) == n and len(set(sub)) == n
    assert mask[sub].mean() >= 0.8                       # most of the planted subset
    r_ours = core.subset_correlation(A[te], y[te], sub)
    assert r_ours < -0.5                                 # held-out models, inverse line
    rand = bl.random_baseline(A[te], y[te], n, draws=200, seed=1)
    assert rand["mean"] > 0.4 and rand["q025"] > 0.0     # random subsets stay positive
    assert r_ours < rand["q025"] - 0.8
    # scores are sigmoid(theta), the subset is their top n in rank order
    scores = sel.scores_[0]
    assert np.all(np.diff(scores[sub]) <= 0)
    assert scores[sub].min() >= np.delete(scores, sub).max()


def test_squared_penalty_and_last_theta_options_also_find_the_subset(planted):
    cm, mask, (tr, va, te), _ = planted
    n = int(mask.sum())
    sel = core.OODSelect(seed=1, penalty_form="squared", restore_best=False,
                         hparams=core.Hparams(penalty=0.01), **FAST)
    sel.fit(cm.A[tr], cm.y[tr], n, cm.A[va], cm.y[va])
    assert mask[sel.subsets_[0]].mean() >= 0.7
    assert core.subset_correlation(cm.A[te], cm.y[te], sel.subsets_[0]) < -0.4


def test_tiny_problem_against_exhaustive_optimum():
    cm, _ = data.planted_problem(n_runs=30, checkpoints=2, n_aligned=12, n_conflict=4,
                                 seed=3)
    A, y = cm.A, cm.y
    N = cm.n_examples
    for n in (3, 6):
        best, r_opt = bl.exhaustive(A, y, n)
        # the enumeration really is the minimum: brute force with the scalar function
        brute = np.nanmin([core.subset_correlation(A, y, list(c))
                           for c in itertools.combinations(range(N), n)])
        assert r_opt == pytest.approx(brute, abs=1e-4)
        assert core.subset_correlation(A, y, best) == pytest.approx(r_opt, abs=1e-4)
        sel = core.OODSelect(seed=0, steps=600, patience=200, restarts=8).fit(A, y, n)
        r_sel = core.subset_correlation(A, y, sel.subsets_[0])
        order, trace = bl.greedy(A, y, n)
        r_greedy = core.subset_correlation(A, y, order)
        assert r_greedy == pytest.approx(trace[-1], abs=1e-4)
        assert r_sel >= r_opt - 1e-6 and r_greedy >= r_opt - 1e-6
        assert r_sel <= r_opt + 0.03                     # at (or next to) the optimum
    with pytest.raises(UserError, match="exhaustive"):
        bl.exhaustive(np.zeros((10, 40)), np.linspace(.1, .9, 10), 20)


def test_pearson_and_probit_follow_the_authors_formula():
    rng = np.random.default_rng(0)
    u, v = rng.normal(size=50), rng.normal(size=50)
    r = core.pearson(u, v)
    assert r == pytest.approx(np.corrcoef(u, v)[0, 1], abs=1e-4)
    assert core.pearson(np.ones(10), v[:10]) == 0.0      # constant accuracy -> r = 0
    assert core.probit(0.0) == pytest.approx(-4.753424, abs=1e-5)   # clamp at 1e-6
    import torch
    t = core.probit(torch.tensor([0.2, 0.5, 0.975], dtype=torch.float64))
    assert np.allclose(t.numpy(), [-0.841621, 0.0, 1.959964], atol=1e-5)
    # hard baseline at small n: every model misses every example. Table A.3 prints 0.00
    # there; the correlation is undefined, and reported as such (NaN), never as 0.0
    A = np.zeros((20, 5), np.uint8)
    assert math.isnan(core.subset_correlation(A, np.linspace(.5, .9, 20), [0, 1]))


# Table A.3 (notes_001 appendix): value (bracketed Fisher half-width), paper mode m = 100.
TABLE_A3 = [(-0.56, 0.12), (0.19, 0.20), (0.00, 0.20), (-0.23, 0.18), (-0.59, 0.12),
            (0.43, 0.18), (-0.69, 0.09), (0.59, 0.14), (-0.83, 0.05), (0.70, 0.11),
            (-0.93, 0.02), (0.66, 0.13), (-0.95, 0.02), (0.78, 0.09), (-0.30, 0.17),
            (-0.86, 0.04), (0.92, 0.04), (-0.90, 0.03), (0.40, 0.18), (0.96, 0.02),
            (-0.48, 0.14), (0.37, 0.18), (0.81, 0.08), (-0.62, 0.11), (0.13, 0.20)]


def test_fisher_intervals_test_models_and_paper_mode():
    lo, hi = rep.fisher_interval(0.5, 40)
    half = 1.959964 / math.sqrt(37)
    assert lo == pytest.approx(math.tanh(math.atanh(0.5) - half), abs=1e-6)
    assert hi == pytest.approx(math.tanh(math.atanh(0.5) + half), abs=1e-6)
    assert rep.fisher_interval(0.5, 400)[0] > lo         # more test models, tighter
    for r, err in TABLE_A3:
        # r is printed to 2 decimals: some r within +-0.005 of it must give the
        # printed half-width after rounding
        ends = [rep.paper_fisher_halfwidth(r + d) for d in (-0.005, 0.005)]
        assert min(ends) - 0.005 <= err <= max(ends) + 0.005, r
    # ... and the test-model count matters: 60 test models give a wider interval
    assert rep.fisher_halfwidth(0.5, 60) > rep.paper_fisher_halfwidth(0.5)
    assert rep.fisher_halfwidth(0.0, 100) == pytest.approx(math.tanh(1.959964 / math.sqrt(97)),
                                                           abs=1e-6)   # 0.196 -> "0.20"


def test_model_splits_keep_runs_whole_and_archs_disjoint():
    runs = np.repeat(np.arange(40), 5)
    tr, va, te = data.split_models(runs, seed=3)
    assert len(tr) + len(va) + len(te) == 200
    assert not (set(runs[tr]) & set(runs[te]) or set(runs[tr]) & set(runs[va])
                or set(runs[va]) & set(runs[te]))
    assert abs(len(tr) - 120) <= 5 and abs(len(te) - 40) <= 5
    again = data.split_models(runs, seed=3)
    assert all(np.array_equal(a, b) for a, b in zip((tr, va, te), again))
    assert not np.array_equal(data.split_models(runs, seed=4)[2], te)
    archs = np.array(["resnet", "vit", "densenet", "convnext", "mlp"])[np.arange(40) % 5][runs]
    tr, va, te = data.split_by_arch(archs, runs, seed=0)
    assert not set(archs[te]) & set(archs[np.r_[tr, va]])
    tr, va, te = data.split_by_arch(archs, runs, test_archs=["vit"], seed=0)
    assert set(archs[te]) == {"vit"} and not set(runs[tr]) & set(runs[va])
    with pytest.raises(UserError, match="3 runs"):
        data.split_models(np.zeros(10), seed=0)


def test_overlap_and_composition():
    N = 200
    rng = np.random.default_rng(0)
    mc = np.mean([rep.jaccard(rng.choice(N, 20, replace=False), rng.choice(N, 30, replace=False))
                  for _ in range(3000)])
    assert rep.expected_random_jaccard(N, 20, 30) == pytest.approx(mc, rel=0.05)
    nj = rep.normalized_jaccard({20: np.arange(20), 40: np.arange(40)}, N)
    assert nj.loc[20, 20] == pytest.approx(1 / rep.expected_random_jaccard(N, 20, 20))
    assert nj.loc[20, 40] > 1
    ex = pd.DataFrame({"id": np.arange(N), "label": np.arange(N) % 2,
                       "group": (np.arange(N) < 50).astype(int)})
    comp = rep.composition(ex, np.arange(40), n_boot=1000, seed=0)
    row = comp[(comp.attribute == "group") & (comp.value == 1)].iloc[0]
    assert row.enrichment == pytest.approx(4.0) and row.enrichment_lo > 1
    assert row.bootstrap_p < 0.01
    lab = comp[(comp.attribute == "label") & (comp.value == 1)].iloc[0]
    assert lab.enrichment_lo < 1 < lab.enrichment_hi


# ------------------------------------------------------------------ run directories

def write_fake_sweep(root, cm, checkpoints, dataset="Fake", ood_env=2, shuffle=True):
    """Run dirs with results.jsonl, predictions/step_*.npz, done, from a matrix whose
    rows are (run, checkpoint) models. Envs 0 and 1 are ID, ood_env holds A's columns."""
    rng = np.random.default_rng(0)
    N = cm.n_examples
    runs = cm.models["run"].to_numpy()
    for run in np.unique(runs):
        d = os.path.join(root, f"run_{run:03d}")
        os.makedirs(os.path.join(d, "predictions"))
        rows = np.flatnonzero(runs == run)
        lines = []
        for k, i in enumerate(rows):
            step = (k + 1) * 100
            id_ex = 10
            ids = np.r_[np.arange(id_ex) + 10000, np.arange(id_ex) + 20000, np.arange(N)]
            env = np.r_[np.zeros(id_ex), np.ones(id_ex), np.full(N, ood_env)].astype(np.int16)
            split = np.r_[np.zeros(2 * id_ex), np.arange(N) % 2].astype(np.int8)
            correct = np.r_[np.ones(2 * id_ex), cm.A[i]].astype(np.uint8)
            perm = rng.permutation(len(ids)) if shuffle else np.arange(len(ids))
            np.savez(os.path.join(d, "predictions", f"step_{step:07d}.npz"),
                     id=ids[perm].astype(np.int64), env=env[perm], split=split[perm],
                     label=(ids[perm] % 3).astype(np.int64), pred=np.zeros(len(ids), np.int64),
                     correct=correct[perm], group=(ids[perm] % 2).astype(np.int64))
            lines.append({"args": {"dataset": dataset, "algorithm": "ERM",
                                   "test_envs": [ood_env], "env_names": ["a", "b", "c"],
                                   "trial_seed": int(run), "hparams_seed": 0},
                          "hparams": {"arch": ["cnn", "vit", "mlp"][run % 3]},
                          "step": step, "env0_out_acc": float(cm.y[i]) + 0.01,
                          "env1_out_acc": float(cm.y[i]) - 0.01,
                          f"env{ood_env}_in_acc": 0.5, f"env{ood_env}_out_acc": 0.5})
        with open(os.path.join(d, "results.jsonl"), "w") as f:
            f.write("".join(json.dumps(line) + "\n" for line in lines))
        open(os.path.join(d, "done"), "w").close()
    return root


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    cm, mask = data.planted_problem(n_runs=40, checkpoints=3, n_aligned=120, n_conflict=30,
                                    seed=1)
    root = str(tmp_path_factory.mktemp("sweep"))
    return write_fake_sweep(root, cm, 3), cm, mask


def test_from_runs_builds_aligned_matrix(sweep, tmp_path):
    root, cm, _ = sweep
    built = data.from_runs(root, quiet=True)
    assert built.info["id_envs"] == [0, 1] and built.info["ood_env"] == 2
    assert built.A.shape == cm.A.shape                  # every checkpoint is a model
    assert np.array_equal(built.examples["id"], np.arange(cm.n_examples))
    assert np.array_equal(built.A, cm.A) and np.allclose(built.y, cm.y)
    assert built.models["run"].nunique() == 40
    assert set(built.models["arch"]) == {"cnn", "vit", "mlp"}
    assert set(built.examples["split"]) == {0, 1}       # in and out splits both
    last = data.from_runs(root, steps="last", quiet=True)
    assert last.n_models == 40
    with pytest.raises(UserError, match="no runs with dataset"):
        data.from_runs(root, dataset="PACS", quiet=True)
    # a run scored on other examples is named in the error
    bad = tmp_path / "bad"
    small, _ = data.planted_problem(n_runs=6, checkpoints=1, n_aligned=20, n_conflict=5)
    write_fake_sweep(str(bad), small, 1)
    odd = bad / "run_002" / "predictions" / "step_0000100.npz"
    arrays = dict(np.load(odd))
    keep = arrays["id"] != 3
    np.savez(odd, **{k: v[keep] for k, v in arrays.items()})
    with pytest.raises(UserError, match="run_002"):
        data.from_runs(str(bad), quiet=True)
    # architecture-disjoint protocol on the built matrix
    summary, res = protocol.run_selection(
        built, [30], split="arch", test_archs=["vit"], baselines=("random",), plots=False,
        selector=core.OODSelect(steps=100, patience=50), random_draws=5, log=lambda *a: 0)
    tr, va, te = res["split"]
    assert set(built.models["arch"].iloc[te]) == {"vit"}
    assert "vit" not in set(built.models["arch"].iloc[np.r_[tr, va]])
    assert set(summary.method) == {"all", "oodselect", "random"}
    # round trip through the npz form
    data.save_matrix(tmp_path / "m.npz", built)
    back = data.load_matrix(tmp_path / "m.npz")
    assert np.array_equal(back.A, built.A) and list(back.models["arch"]) == list(
        built.models["arch"])


def test_sweep_demo_end_to_end(sweep, tmp_path, capsys):
    root, _, _ = sweep
    sys.path.insert(0, os.path.join(ROOT, "scripts"))
    try:
        import oodselect_sweep_demo as demo
    finally:
        sys.path.pop(0)
    summary = demo.main([root, "--sizes", "30", "--out", str(tmp_path / "o"),
                         "--steps", "500", "--patience", "200", "--random-draws", "30"])
    out = capsys.readouterr().out
    assert "120 models (checkpoints) from 40 runs x 150 OOD examples" in out
    assert "largest subset with accuracy on the inverse line" in out
    ours = summary[summary.method == "oodselect"].r_test.iloc[0]
    rand = summary[summary.method == "random"].r_test.iloc[0]
    assert ours < -0.3 < 0.3 < rand


def test_cli_contract(tmp_path):
    cm, mask = data.planted_problem(n_runs=40, checkpoints=3, n_aligned=150, n_conflict=30,
                                    seed=2)
    path = tmp_path / "m.npz"
    np.savez(path, A=cm.A, y=cm.y)
    out = tmp_path / "out"
    proc = subprocess.run(
        [sys.executable, "-m", "analysis.oodselect", "--matrix", str(path), "--sizes", "10",
         "30", "--seed", "0", "--out", str(out), "--steps", "500", "--patience", "200",
         "--random-draws", "20", "--greedy-max-cost", "0", "--bootstrap", "50"],
        cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    summary = pd.read_csv(out / "summary.csv")
    assert {"method", "n", "r_test", "r_val"} <= set(summary.columns)
    got = set(zip(summary.method, summary.n))
    assert {("oodselect", 10), ("oodselect", 30), ("random", 10), ("random", 30),
            ("hard", 30)} <= got
    for n in (10, 30):
        sub = pd.read_csv(out / f"subset_{n}.csv")
        assert list(sub["rank"]) == list(range(1, n + 1)) and sub["index"].nunique() == n
        assert np.all(np.diff(sub["selection_score"]) <= 0)
    ours = summary[(summary.method == "oodselect") & (summary.n == 30)].iloc[0]
    rand = summary[(summary.method == "random") & (summary.n == 30)].iloc[0]
    assert ours.r_test < rand.r_test - 0.5
    assert ours.m_test + ours.m_val + ours.m_train == cm.n_models
    assert (out / "correlation_vs_size.png").stat().st_size > 1000
    assert (out / "scatter_30.png").exists() and (out / "jaccard.csv").exists()
    js = json.loads((out / "subsets.json").read_text())
    assert js["oodselect"][1]["index"] == list(pd.read_csv(out / "subset_30.csv")["index"])


def test_cli_errors_are_one_line(tmp_path, capsys):
    from oodutils.errors import run_cli
    np.savez(tmp_path / "bad.npz", A=np.zeros((10, 5)))
    with pytest.raises(SystemExit) as e:
        run_cli(cli.main, ["--matrix", str(tmp_path / "bad.npz"), "--sizes", "2",
                           "--out", str(tmp_path / "o")])
    assert e.value.code == 2
    assert "lacks y" in capsys.readouterr().err
    np.savez(tmp_path / "m.npz", A=np.ones((10, 5)), y=np.linspace(.2, .9, 10))
    with pytest.raises(UserError, match="outside 1..5"):
        cli.main(["--matrix", str(tmp_path / "m.npz"), "--sizes", "9", "--out",
                  str(tmp_path / "o"), "--split", "model"])


def test_optuna_search_batches_trials(planted):
    cm, mask, (tr, va, te), _ = planted
    sel = core.OODSelect(seed=0, trials=4, trial_batch=2, steps=200, patience=100)
    sel.fit(cm.A[tr], cm.y[tr], [30, 60], cm.A[va], cm.y[va])
    assert len(sel.trials_) == 8                        # 4 trials for each of 2 sizes
    first = [t for t in sel.trials_ if t["trial"] == 0]
    assert all(t["lr"] == core.Hparams().lr for t in first)   # defaults enqueued first
    for t in sel.trials_:
        lo, hi = core.SEARCH_SPACE["lr"][1:]
        assert lo <= t["lr"] <= hi
    for k, n in enumerate(sel.sizes_):
        best = min(t["val_r"] for t in sel.trials_ if t["n"] == n)
        assert sel.val_r_[k] == pytest.approx(best)


def test_results_and_trials_as_dataframes(planted):
    cm, mask, (tr, va, te), sel = planted
    frame = sel.results_frame()
    assert list(frame["n"]) == sel.sizes_ and len(frame) == 1
    assert frame["val_r"].iloc[0] == pytest.approx(sel.val_r_[0])
    assert frame["subset"].iloc[0] == list(sel.subsets_[0])
    assert {"lr", "eta_min", "best_step", "n_steps"} <= set(frame.columns)
    assert sel.trials_frame().empty                     # fixed hyperparameters: no trials
    tuned = core.OODSelect(seed=0, trials=2, trial_batch=2, steps=50, patience=20)
    tuned.fit(cm.A[tr], cm.y[tr], [30], cm.A[va], cm.y[va])
    trials = tuned.trials_frame()
    assert len(trials) == 2 and {"n", "trial", "val_r", "lr"} <= set(trials.columns)
