"""The validity analysis of Bell et al. 2024: the array core on inputs with known answers,
then the records adapter and the command line on a tiny fake sweep laid out as
docs/CONTRACTS.md says."""
import json
import math
import os
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest

from analysis import validity as V
from analysis.validity import cli as VC
from analysis.validity import records as VR
from oodutils.errors import UserError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def log_sigmoid(x):
    return -math.log1p(math.exp(-x))


# ----- accuracies, ERM Failure, Discriminative Power ------------------------------------------

def test_group_accuracies():
    y = np.array([0, 0, 1, 1, 1, 0])
    p = np.array([0, 1, 1, 1, 0, 0])
    g = np.array([0, 0, 1, 1, 1, 2])
    acc = V.per_group_accuracy(y, p, g)
    assert acc.to_dict() == pytest.approx({0: 0.5, 1: 2 / 3, 2: 1.0})
    assert V.worst_group_accuracy(y, p, g) == 0.5
    with pytest.raises(UserError, match="empty"):
        V.per_group_accuracy([], [], [])


def test_erm_failure_known_values():
    assert V.erm_failure([0.9, 0.9, 0.9]) == 0.0
    assert V.erm_failure([0.5, 0.7]) == pytest.approx(100 * math.sqrt(0.02))
    assert V.erm_failure([0.5, 0.7], ddof=0) == pytest.approx(10.0)
    assert V.erm_failure([0.5, 0.7], scale=1) == pytest.approx(math.sqrt(0.02))
    # seeds x groups: averaged over seeds first (NaN = group absent in that seed)
    seeds = [[0.4, 0.8, np.nan], [0.6, 0.8, 0.9]]
    assert V.erm_failure(seeds) == pytest.approx(100 * np.std([0.5, 0.8, 0.9], ddof=1))
    with pytest.raises(UserError, match="at least 2 groups"):
        V.erm_failure([0.7])
    with pytest.raises(UserError, match=r"\[0, 1\].*percentages"):
        V.erm_failure([70.0, 90.0])
    with pytest.raises(UserError, match="empty"):
        V.erm_failure([])


def test_discriminative_power_known_values():
    assert V.discriminative_power([0.6, 0.8]) == pytest.approx(100 * math.sqrt(0.02))
    assert V.discriminative_power({"ERM": 0.7, "GroupDRO": 0.7, "JTT": 0.7}) == 0.0
    with pytest.raises(UserError, match="at least 2 methods"):
        V.discriminative_power([0.8])
    with pytest.raises(UserError, match=r"\[0, 1\]"):
        V.discriminative_power([0.5, -0.1])


# ----- K ----------------------------------------------------------------------------------------

def test_k_of_identical_logits_is_zero():
    rng = np.random.default_rng(0)
    logits = rng.standard_normal((50, 3)).astype(np.float16)
    y = rng.integers(0, 3, 50)
    g = rng.integers(0, 4, 50)
    res = V.bayes_factor_k(logits, logits, y, g)
    assert res.k == 0.0
    assert res.n == int(np.sum(g == res.worst_group))


def test_k_known_value_and_worst_group():
    # group 1 is where ERM is wrong; the reference puts logit 2 on the true class there
    y = np.array([0, 0, 1, 1, 0, 0])
    g = np.array([0, 0, 1, 1, 2, 2])
    erm = np.array([[2, 0], [2, 0], [1, 0], [1, 0], [2, 0], [2, 0]], dtype=float)
    ref = erm.copy()
    ref[2:4] = [[0, 2], [0, 2]]
    res = V.bayes_factor_k(ref, erm, y, g)
    expected = log_sigmoid(2) - log_sigmoid(-1)
    assert res.worst_group == 1 and res.n == 2
    assert res.k == pytest.approx(expected)
    assert res.erm_group_accuracy == {0: 1.0, 1: 0.0, 2: 1.0}
    assert V.bayes_factor_k(ref, erm, y, g, reduction="sum").k == pytest.approx(2 * expected)
    assert V.bayes_factor_k(ref, erm, y, g, worst_group=0).k == 0.0
    # ERM explaining the worst group better than the reference gives a negative K
    assert V.bayes_factor_k(erm, ref, y, g, worst_group=1).k == pytest.approx(-expected)
    with pytest.raises(UserError, match="group 7"):
        V.bayes_factor_k(ref, erm, y, g, worst_group=7)
    with pytest.raises(UserError, match="reduction"):
        V.bayes_factor_k(ref, erm, y, g, reduction="max")


def test_log_likelihood_single_logit_binary():
    z = np.array([[0.0], [3.0], [-1.0]])
    y = np.array([1, 1, 0])
    assert V.log_likelihood(z, y) == pytest.approx([math.log(0.5), log_sigmoid(3),
                                                    log_sigmoid(1)])
    assert V.log_likelihood(np.array([[0.0, 3.0]]), [1]) == pytest.approx([log_sigmoid(3)])
    with pytest.raises(UserError, match="non-finite"):
        V.log_likelihood(np.array([[np.inf, 0]]), [0])


def test_group_inverse_weights():
    w = V.group_inverse_weights([0, 0, 0, 1])
    assert w == pytest.approx([4 / 3, 4 / 3, 4 / 3, 4.0])
    assert np.sum(w[:3]) == pytest.approx(np.sum(w[3:]))  # every group weighs the same


# ----- mutual information -----------------------------------------------------------------------

def test_mutual_information():
    y = np.array([0, 0, 1, 1] * 25)
    assert V.mutual_information(y, np.array([0, 1, 0, 1] * 25)) == pytest.approx(0.0)
    assert V.mutual_information(y, y) == pytest.approx(math.log(2))
    assert V.mutual_information(y, y, base=2) == pytest.approx(1.0)
    groups = np.array([0, 1, 2, 3])
    assert list(V.attributes_from_groups(groups, [0, 0, 1, 1], 4, 2)) == [0, 1, 0, 1]
    with pytest.raises(UserError, match="y \\* \\|A\\| \\+ a"):
        V.attributes_from_groups(groups, [1, 0, 1, 1], 4, 2)


# ----- agreement, convergent validity, robustness --------------------------------------------

U = np.array([1.0, -1.0, 1.0, -1.0])
W = np.array([1.0, 1.0, -1.0, -1.0])


def rotated(thetas):
    """Benchmarks whose WG accuracies over 4 methods correlate as cos(theta_i - theta_j)."""
    return pd.DataFrame({f"b{i}": 0.5 + 0.1 * (np.cos(t) * U + np.sin(t) * W)
                         for i, t in enumerate(thetas)}, index=["m0", "m1", "m2", "m3"])


def test_agreement_matrix():
    wga = rotated([0.0, np.pi / 2, np.pi])
    agree = V.agreement_matrix(wga)
    assert agree.loc["b0", "b1"] == pytest.approx(0.0, abs=1e-12)
    assert agree.loc["b0", "b2"] == pytest.approx(-1.0)
    assert agree.loc["b1", "b1"] == 1.0
    # too few shared methods -> no correlation
    assert np.isnan(V.agreement_matrix(wga.iloc[:2]).loc["b0", "b2"])


def test_convergent_validity_exact_line():
    # r(b0, .) = 1, 0, -1 at |Delta K| = 0.5, 1, 1.5: slope -2, so Convergent Validity 2
    wga = rotated([0.0, 0.0, np.pi / 2, np.pi])
    K = {"b0": 0.0, "b1": 0.5, "b2": 1.0, "b3": 1.5}
    cv = V.convergent_validity(wga, K)
    assert cv.loc["b0", "conv_validity"] == pytest.approx(2.0)
    assert cv.loc["b0", "intercept"] == pytest.approx(2.0)
    assert cv.loc["b0", "r2"] == pytest.approx(1.0)
    assert cv.loc["b0", "n_pairs"] == 3
    # agreement that does not fall with K distance: r = 1 everywhere -> slope 0
    flat = rotated([0.0, 0.0, 0.0, 0.0])
    assert V.convergent_validity(flat, K).loc["b0", "conv_validity"] == pytest.approx(0.0,
                                                                                      abs=1e-9)
    # a pool of 2 comparison benchmarks is too few: NaN with n_pairs reported
    small = V.convergent_validity(wga, K, pool=["b0", "b1", "b2"])
    assert small.loc["b0", "n_pairs"] == 2 and np.isnan(small.loc["b0", "conv_validity"])
    # pairs stay within one architecture when asked
    arch = {"b0": "r", "b1": "r", "b2": "r", "b3": "bert"}
    assert V.convergent_validity(wga, K, arch=arch).loc["b0", "n_pairs"] == 2
    with pytest.raises(UserError, match="K"):
        V.convergent_validity(wga, {})


def test_method_robustness():
    wga = pd.DataFrame({"b0": [0.5, 0.9], "b1": [0.6, 0.9], "b2": [0.7, 0.9],
                        "b3": [0.8, 0.9]}, index=["linear", "flat"])
    K = {"b0": 0.0, "b1": 1.0, "b2": 2.0, "b3": 3.0}
    rob = V.method_robustness(wga, K)
    assert rob.loc["linear", "median"] == pytest.approx(65.0)
    assert rob.loc["linear", "iqr"] == pytest.approx(72.5 - 57.5)
    assert rob.loc["linear", "slope_k"] == pytest.approx(10.0)
    assert rob.loc["linear", "r2_k"] == pytest.approx(1.0)
    assert rob.loc["flat", "iqr"] == pytest.approx(0.0)
    assert rob.loc["flat", "n_benchmarks"] == 4


# ----- the table, recommendation ---------------------------------------------------------------

def test_validity_table_flags():
    m = pd.DataFrame({"erm_failure": [10.0, 1.0, 10.0], "disc_power": [3.0, 3.0, 3.0],
                      "conv_validity": [0.2, np.nan, np.nan]}, index=["ok", "bad", "open"])
    t = V.validity_table(m)
    assert t.loc["ok", "valid"] == True  # noqa: E712
    assert t.loc["bad", "valid"] == False  # noqa: E712 (a failed flag decides)
    assert t.loc["open", "valid"] is pd.NA  # missing Conv. Validity leaves it open
    assert t.loc["open", "pass_conv_validity"] is pd.NA
    strict = V.validity_table(m, {"conv_validity": 0.5})
    assert strict.loc["ok", "valid"] == False  # noqa: E712
    with pytest.raises(UserError, match="unknown threshold"):
        V.validity_table(m, {"nope": 1})
    with pytest.raises(UserError, match="missing column"):
        V.validity_table(m.drop(columns=["disc_power"]))
    with pytest.raises(UserError, match="empty"):
        V.validity_table(m.iloc[:0])


WGA = pd.DataFrame({"A": [0.80, 0.70, 0.60], "B": [0.50, 0.70, 0.55],
                    "C": [0.90, 0.60, 0.95], "D": [0.40, 0.45, 0.50]},
                   index=["ERM", "DRO", "RW"])
KS = {"A": 0.0, "B": 1.0, "C": 2.0, "D": 1.4}


def test_recommend_method_reports_ties():
    # means over A-D: ERM 0.65, DRO 0.6125, RW 0.65 -> a tie, left open
    rec = V.recommend_method(WGA, "all")
    assert rec.method is None and "tie" in rec.note
    assert {m for _, m, _ in rec.candidates} == {"ERM", "RW"}
    assert [s for _, _, s in rec.candidates] == pytest.approx([0.65, 0.65])


def test_recommend_method_known_picks():
    wga = WGA.copy()
    wga.loc["RW", "D"] = 0.52          # RW mean 0.655 > ERM 0.65
    assert V.recommend_method(wga, "all").method == "RW"
    # over A, B: ERM 0.65, DRO 0.70, RW 0.575
    assert V.recommend_method(wga, "valid", valid=["A", "B"]).method == "DRO"
    valid = ["A", "B", "C"]
    rec = V.recommend_method(wga, "closest", valid=valid, K=KS, query_k=1.3)
    assert (rec.benchmarks, rec.method) == (["B"], "DRO")
    rec = V.recommend_method(wga, "closest", valid=valid, K=KS, query_k=1.5)
    assert rec.benchmarks == ["B", "C"] and rec.method is None   # |dK| = 0.5 both: a tie
    assert {m for _, m, _ in rec.candidates} == {"DRO", "RW"}
    with pytest.raises(UserError, match="valid benchmarks"):
        V.recommend_method(wga, "valid")
    with pytest.raises(UserError, match="unknown strategy"):
        V.recommend_method(wga, "best")


def test_leave_one_out_and_win_counts():
    wga = WGA.copy()
    wga.loc["RW", "D"] = 0.52
    loo = V.leave_one_out(wga, KS, valid=["A", "B", "C"])
    # test A: All over B,C,D -> ERM .6, DRO .5833, RW .6733 -> RW; Valid over B,C -> RW .75
    assert loo.loc["A", "all_method"] == "RW" and loo.loc["A", "all_acc"] == pytest.approx(60)
    assert loo.loc["A", "valid_method"] == "RW"
    # closest valid to K_A = 0 among B, C is B (best DRO): DRO on A = 70
    assert loo.loc["A", "closest_benchmark"] == "B"
    assert loo.loc["A", "closest_acc"] == pytest.approx(70.0)
    # D (K 1.4) is closest to B (|dK| .4 < .6): DRO, 45 on D
    assert loo.loc["D", "closest_method"] == "DRO"
    wins = V.strategy_win_counts(loo["all_acc"], loo["valid_acc"], loo["closest_acc"])
    assert wins["n"] == 4 and wins["n_closest"] == 4
    assert wins["closest_best_with_ties"] >= wins["closest_best_strict"]
    counts = V.strategy_win_counts([1, 2, 3], [2, 2, 1], [2, np.nan, 3])
    assert counts == {"n": 3, "valid_beats_all": 1, "valid_ties_all": 1, "n_closest": 2,
                      "closest_best_with_ties": 2, "closest_best_strict": 0}


def test_closest_benchmarks_ties_and_exclusion():
    K = {"x": 1.32, "y": 1.32, "z": 0.18}
    assert V.closest_benchmarks(1.35, K) == ["x", "y"]
    assert V.closest_benchmarks(1.35, K, exclude=["x"]) == ["y"]
    assert V.closest_benchmarks(0.0, K) == ["z"]
    with pytest.raises(UserError, match="no candidate"):
        V.closest_benchmarks(0.0, K, candidates=[])


# ----- records adapter on a fake sweep --------------------------------------------------------

GROUP_NAMES = ["y=0,a=0", "y=0,a=1", "y=1,a=0", "y=1,a=1"]
METHODS = ["ERM", "GroupDRO", "JTT"]
# benchmark -> K reference: the reference model's true-class logit on ERM's worst group
K_LOGIT = {"BenchA": 0.5, "BenchB": 1.0, "BenchC": 2.0, "BenchD": 3.0}
# per benchmark, method: the four test group accuracies of trial seeds 0 and 1
ACC = {
    "BenchA": {"ERM": ([0.9, 0.5, 0.6, 0.95], [0.9, 0.7, 0.6, 0.95]),
               "GroupDRO": ([0.8, 0.7, 0.75, 0.8], [0.8, 0.75, 0.8, 0.8]),
               "JTT": ([0.8, 0.65, 0.7, 0.8], [0.8, 0.65, 0.7, 0.8])},
    "BenchB": {"ERM": ([0.95, 0.3, 0.5, 0.9], [0.95, 0.4, 0.5, 0.9]),
               "GroupDRO": ([0.9, 0.6, 0.6, 0.9], [0.9, 0.6, 0.6, 0.9]),
               "JTT": ([0.9, 0.7, 0.8, 0.9], [0.9, 0.72, 0.8, 0.9])},
    "BenchC": {"ERM": ([0.9, 0.6, 0.8, 0.9], [0.9, 0.6, 0.8, 0.9]),
               "GroupDRO": ([0.9, 0.5, 0.8, 0.9], [0.9, 0.55, 0.8, 0.9]),
               "JTT": ([0.9, 0.8, 0.8, 0.9], [0.9, 0.8, 0.85, 0.9])},
    "BenchD": {"ERM": ([0.7, 0.65, 0.7, 0.7], [0.7, 0.66, 0.7, 0.7]),
               "GroupDRO": ([0.9, 0.9, 0.2, 0.9], [0.9, 0.9, 0.3, 0.9]),
               "JTT": ([0.9, 0.9, 0.9, 0.5], [0.9, 0.9, 0.9, 0.5])},
}


def examples(n_per_group=5):
    """Two environments (0 train, 1 test), in/out splits, 4 groups g = 2y + a."""
    rows = []
    i = 0
    for env in (0, 1):
        for split in (0, 1):
            for g in range(4):
                for _ in range(n_per_group if g in (0, 3) else 2):
                    rows.append((i, env, split, g // 2, g))
                    i += 1
    arr = np.array(rows)
    return {"id": arr[:, 0].astype(np.int64), "env": arr[:, 1].astype(np.int16),
            "split": arr[:, 2].astype(np.int8), "label": arr[:, 3].astype(np.int64),
            "group": arr[:, 4].astype(np.int64)}


def write_run(run_dir, dataset, algorithm, trial_seed, steps, logits_fn=None,
              test_accs=None, hparams_seed=0):
    os.makedirs(os.path.join(run_dir, "predictions"), exist_ok=True)
    args = {"dataset": dataset, "algorithm": algorithm, "test_envs": [1],
            "hparams_seed": hparams_seed, "trial_seed": trial_seed, "seed": 0,
            "data_seed": 0, "data_source": "fake", "data_fingerprint": "f" * 16,
            "precision": "fp32", "holdout_fraction": 0.2, "uda_holdout_fraction": 0,
            "task": "domain_generalization", "steps": max(steps), "checkpoint_freq": 100,
            "output_dir": str(run_dir), "data_dir": "", "env_names": ["train", "test"],
            "group_names": GROUP_NAMES, "num_classes": 2}
    lines = []
    ex = examples()
    for k, step in enumerate(steps):
        # training envs: validation worst-group accuracy grows with the step
        rec = {"args": args, "hparams": {"lr": 1e-3}, "step": step, "epoch": step / 10,
               "step_time": 0.1, "mem_gb": 0.0, "loss": 0.5}
        for env in (0, 1):
            for split in ("in", "out"):
                if env == 1:
                    accs = test_accs if test_accs is not None else [0.5] * 4
                    accs = [a if k == len(steps) - 1 else 0.3 for a in accs]
                else:
                    accs = [0.6 + 0.1 * k] * 4
                for g, a in enumerate(accs):
                    rec[f"env{env}_{split}_acc_g{g}"] = a
                rec[f"env{env}_{split}_wga"] = min(accs)
                rec[f"env{env}_{split}_acc"] = float(np.mean(accs))
        lines.append(json.dumps(rec))
        pred = dict(ex)
        logits = (logits_fn(ex, step) if logits_fn is not None
                  else np.zeros((len(ex["id"]), 2)))
        pred["pred"] = logits.argmax(1).astype(np.int64)
        pred["correct"] = (pred["pred"] == ex["label"]).astype(np.uint8)
        pred["logits"] = logits.astype(np.float16)
        np.savez_compressed(os.path.join(run_dir, "predictions", f"step_{step:07d}.npz"),
                            **pred)
    with open(os.path.join(run_dir, "results.jsonl"), "w") as f:
        f.write("\n".join(lines) + "\n")
    open(os.path.join(run_dir, "done"), "w").close()
    return run_dir


def k_logits(reference_logit):
    """Step 0: uninformative. Step 100: correct with margin 2 everywhere, except group 1
    (y=0, a=1) where ERM puts logit 1 on the wrong class and the reference puts
    ``reference_logit`` on the true class (None: the ERM model)."""
    def fn(ex, step):
        n = len(ex["id"])
        if step == 0:
            return np.zeros((n, 2))
        z = np.zeros((n, 2))
        z[np.arange(n), ex["label"]] = 2.0
        wg = ex["group"] == 1
        if reference_logit is None:
            z[wg] = [0.0, 1.0]
        else:
            z[wg] = [reference_logit, 0.0]
        return z
    return fn


@pytest.fixture(scope="module")
def fake(tmp_path_factory):
    root = tmp_path_factory.mktemp("validity")
    sweep, kdir = root / "sweep", root / "kref"
    for bench, per_method in ACC.items():
        for method, seeds in per_method.items():
            for seed, accs in enumerate(seeds):
                write_run(sweep / f"{bench}_{method}_{seed}", bench, method, seed, [0, 100],
                          test_accs=accs)
                # a worse hyperparameter setting: lower validation accuracy, never selected
                write_run(sweep / f"{bench}_{method}_{seed}_h1", bench, method, seed, [0],
                          test_accs=[0.99] * 4, hparams_seed=1)
        write_run(kdir / bench / "ERM", bench, "ERM", 0, [0, 100], k_logits(None))
        write_run(kdir / bench / "ReweightedERM", bench, "ReweightedERM", 0, [0, 100],
                  k_logits(K_LOGIT[bench]))
    return root


def expected_k(bench):
    return log_sigmoid(K_LOGIT[bench]) - log_sigmoid(-1.0)


def test_group_results_select_by_worst_group_validation(fake):
    res = VR.group_results(VR.load_records(fake / "sweep"))
    assert set(res["benchmark"]) == set(ACC)
    assert set(res["step"]) == {100}               # best validation worst-group checkpoint
    wga = VR.wga_matrix(res)
    for bench, per_method in ACC.items():
        for method, seeds in per_method.items():
            assert wga.loc[method, bench] == pytest.approx(np.mean([min(s) for s in seeds]))
    erm = VR.erm_group_accuracies(res, "BenchA")
    assert erm.to_numpy() == pytest.approx(np.array(ACC["BenchA"]["ERM"]))
    assert set(res["group_name"]) == set(GROUP_NAMES)


def test_compute_k_from_runs(fake):
    for bench in ACC:
        out = VR.compute_k(str(fake / "kref" / bench / "ERM"),
                           str(fake / "kref" / bench / "ReweightedERM"))
        assert out["erm_step"] == out["reference_step"] == 100   # lowest validation NLL
        assert out["worst_group"] == 1 and out["worst_group_name"] == "y=0,a=1"
        assert out["erm_group_acc"] == 0.0
        assert out["n"] == 4                          # 2 in + 2 out test examples of group 1
        assert out["k"] == pytest.approx(expected_k(bench), abs=1e-6)
    last = VR.compute_k(str(fake / "kref/BenchA/ERM"), str(fake / "kref/BenchA/ERM"),
                        step="last")
    assert last["k"] == 0.0
    first = VR.compute_k(str(fake / "kref/BenchA/ERM"),
                         str(fake / "kref/BenchA/ReweightedERM"), step=0)
    assert first["k"] == 0.0                          # both uninformative at step 0
    with pytest.raises(UserError, match="the two K runs differ in dataset"):
        VR.compute_k(str(fake / "kref/BenchA/ERM"), str(fake / "kref/BenchB/ERM"))


def test_validity_report_end_to_end(fake):
    recs = VR.load_records(fake / "sweep")
    krecs = VR.load_records(fake / "kref")
    names, labels = VR.benchmark_names(recs.records + krecs.records)
    res = VR.group_results(recs, names, labels)
    ktab = VR.k_from_records(krecs, names, labels)
    assert set(ktab["reference"]) == {"ReweightedERM"}
    K = ktab.set_index("benchmark")["k"]
    table = VR.validity_report(res, K)
    for bench, per_method in ACC.items():
        row = table.loc[bench]
        assert row["K"] == pytest.approx(expected_k(bench), abs=1e-6)
        erm = np.mean(per_method["ERM"], axis=0)
        assert row["erm_failure"] == pytest.approx(100 * np.std(erm, ddof=1))
        wgas = [np.mean([min(s) for s in seeds]) for seeds in per_method.values()]
        assert row["disc_power"] == pytest.approx(100 * np.std(wgas, ddof=1))
        assert row["best_wga"] == pytest.approx(100 * max(wgas))
        # train envs: 5 + 2 + 2 + 5 examples per split -> P(y, a) known
        p = np.array([[5, 2], [2, 5]]) / 14
        mi = np.sum(p * np.log(p / np.outer(p.sum(1), p.sum(0))))
        assert row["mi"] == pytest.approx(mi)
    # Convergent Validity: the core function on the same matrix and pool
    wga = VR.wga_matrix(res)
    pool = [b for b in table.index if table.loc[b, "pass_erm_failure"]
            and table.loc[b, "pass_disc_power"]]
    cv = V.convergent_validity(wga, K, pool=pool)
    for bench in table.index:
        if np.isnan(cv.loc[bench, "conv_validity"]):
            assert np.isnan(table.loc[bench, "conv_validity"])
        else:
            assert table.loc[bench, "conv_validity"] == pytest.approx(
                cv.loc[bench, "conv_validity"])
    assert table["valid"].dtype == "boolean"


def test_no_groups_empty_and_single_method_are_user_errors(tmp_path, fake):
    # DomainBed's own records have no groups
    run = tmp_path / "plain"
    run.mkdir()
    (run / "results.jsonl").write_text(json.dumps(
        {"args": {"dataset": "PACS", "algorithm": "ERM", "test_envs": [0],
                  "hparams_seed": 0, "trial_seed": 0}, "step": 0, "env0_in_acc": 0.5,
         "env0_out_acc": 0.5, "env1_in_acc": 0.5, "env1_out_acc": 0.5}) + "\n")
    (run / "done").write_text("")
    with pytest.raises(UserError, match="group-annotated"):
        VR.group_results(VR.load_records(tmp_path / "plain"))
    with pytest.raises(UserError, match="group-annotated"):
        VR.group_results([])
    # a single method cannot have Discriminative Power
    one = tmp_path / "one"
    write_run(one / "r0", "BenchA", "ERM", 0, [0, 100], test_accs=[0.9, 0.5, 0.6, 0.9])
    res = VR.group_results(VR.load_records(one))
    with pytest.raises(UserError, match="at least 2 methods"):
        VR.validity_report(res)
    # accuracies outside [0, 1] (percentages) in the records
    pct = tmp_path / "pct"
    write_run(pct / "r0", "BenchA", "ERM", 0, [0, 100], test_accs=[90, 50, 60, 90])
    with pytest.raises(UserError, match=r"\[0, 1\]"):
        VR.group_results(VR.load_records(pct))
    # no ERM among the methods
    res = VR.group_results(VR.load_records(fake / "sweep"))
    with pytest.raises(UserError, match="needs Oracle runs"):
        VR.validity_report(res, erm="Oracle")
    with pytest.raises(UserError, match="missing column"):
        VR.wga_matrix(res.drop(columns=["test_wga"]))


# ----- the command line ---------------------------------------------------------------------

def test_cli_report_markdown(fake, capsys):
    rc = VC.main(["report", "--input-dir", str(fake / "sweep"), "--k-dir", str(fake / "kref"),
                  "--format", "markdown"])
    assert rc == 0
    out = capsys.readouterr().out
    assert "| Benchmark |" in out and "Conv. Validity" in out and "nan" not in out.lower()
    for bench in ACC:
        assert f"| {bench} |" in out
    assert f"{expected_k('BenchD'):.2f}" in out


def test_cli_report_csv_with_k_csv_and_thresholds(fake, tmp_path, capsys):
    kcsv = tmp_path / "k.csv"
    pd.DataFrame({"benchmark": list(K_LOGIT), "K": [0.1, 0.5, 0.9, 1.3]}).to_csv(kcsv,
                                                                               index=False)
    out_path = tmp_path / "table.csv"
    VC.main(["report", "--input-dir", str(fake / "sweep"), "--k-csv", str(kcsv),
             "--erm-failure-min", "1000", "--output", str(out_path)])
    table = pd.read_csv(out_path)
    assert list(table["K"]) == [0.1, 0.5, 0.9, 1.3]
    assert not table["ERM Fail. ok"].any() and not table["valid"].any()


def test_cli_compute_k_robustness_agreement_recommend(fake, capsys):
    VC.main(["compute-k", "--erm-run", str(fake / "kref/BenchC/ERM"),
             "--reference-run", str(fake / "kref/BenchC/ReweightedERM"), "--format", "csv"])
    k = pd.read_csv(pd.io.common.StringIO(capsys.readouterr().out))
    assert k.loc[0, "K"] == pytest.approx(expected_k("BenchC"), abs=1e-6)
    VC.main(["robustness", "--input-dir", str(fake / "sweep"), "--k-dir", str(fake / "kref"),
             "--format", "csv"])
    rob = pd.read_csv(pd.io.common.StringIO(capsys.readouterr().out))
    assert set(rob["Method"]) == set(METHODS)
    VC.main(["agreement", "--input-dir", str(fake / "sweep"), "--format", "csv"])
    agree = pd.read_csv(pd.io.common.StringIO(capsys.readouterr().out))
    assert list(agree["benchmark"]) == list(ACC)
    VC.main(["recommend", "--input-dir", str(fake / "sweep"), "--strategy", "all",
             "--format", "csv"])
    rec = pd.read_csv(pd.io.common.StringIO(capsys.readouterr().out))
    wga = VR.wga_matrix(VR.group_results(VR.load_records(fake / "sweep")))
    assert rec.loc[0, "method"] == wga.mean(axis=1).idxmax()


def test_cli_errors_are_one_line(fake, tmp_path):
    proc = subprocess.run([sys.executable, "-m", "analysis.validity", "report",
                           "--input-dir", str(tmp_path / "missing")],
                          capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 2
    assert proc.stderr.startswith("error:") and proc.stderr.count("\n") == 1
    with pytest.raises(UserError, match="either --k_dir or --k_csv"):
        VC.main(["report", "--input-dir", str(fake / "sweep"), "--k-dir", str(fake / "kref"),
                 "--k-csv", "k.csv"])
    with pytest.raises(UserError, match="--query_k"):
        VC.main(["recommend", "--input-dir", str(fake / "sweep"), "--k-dir",
                 str(fake / "kref"), "--strategy", "closest", "--erm-failure-min", "0",
                 "--disc-power-min", "0", "--conv-validity-min", "-10"])


# ----- scripts/train_k_reference.py -----------------------------------------------------------

def _train_k_reference_module():
    import importlib.util
    spec = importlib.util.spec_from_file_location(
        "train_k_reference", os.path.join(ROOT, "scripts", "train_k_reference.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_train_k_reference_dry_run(tmp_path, capsys):
    mod = _train_k_reference_module()
    rc = mod.main(["--dataset", "Debug28", "--data-dir", str(tmp_path), "--output-dir",
                   str(tmp_path / "kref"), "--test-envs", "2", "--trial-seeds", "0", "1",
                   "--steps", "6", "--dry-run", "--", "--precision", "fp32"])
    assert rc == 0
    lines = [ln for ln in capsys.readouterr().out.splitlines() if "domainbed.scripts.train" in ln]
    assert len(lines) == 4                                  # ERM + reference, two seeds
    erm, ref = lines[0], lines[1]
    assert "--algorithm ERM" in erm
    assert any(f"--algorithm {r}" in ref for r in mod.REFERENCES)
    for line in lines:
        assert "--save_logits" in line and '"lr": 0.001' in line
        assert "--test_envs 2" in line and line.endswith("--precision fp32")
    assert "Debug28_env2/ERM_seed1" in lines[2]
    capsys.readouterr()
    mod.main(["--dataset", "Debug28", "--output-dir", str(tmp_path), "--test-envs", "2",
              "--reference", "GroupDRO", "--lr", "0.01", "--dry-run"])
    out = capsys.readouterr().out
    assert "--algorithm GroupDRO" in out and '"lr": 0.01' in out
    with pytest.raises(UserError, match="--hparams"):
        mod.main(["--dataset", "Debug28", "--output-dir", str(tmp_path), "--test-envs", "2",
                  "--hparams", "{bad", "--dry-run"])


def test_best_methods_as_a_frame():
    tied = WGA.copy()
    tied.loc["RW", "B"] = 0.70                          # DRO and RW tie on B
    assert V.best_methods(tied) == {"A": ["ERM"], "B": ["DRO", "RW"], "C": ["RW"],
                                    "D": ["RW"]}
    frame = V.best_methods(tied, as_frame=True)
    assert list(frame.columns) == ["benchmark", "method", "wga"]
    assert frame.values.tolist() == [["A", "ERM", 0.80], ["B", "DRO", 0.70],
                                     ["B", "RW", 0.70], ["C", "RW", 0.95], ["D", "RW", 0.50]]
