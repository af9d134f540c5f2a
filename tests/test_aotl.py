"""Accuracy on the line: transforms, fits, verdicts, bootstraps, inputs, tables, CLI."""
import gzip
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from scipy import special, stats

from analysis import aotl
from analysis.aotl import cli as aotl_cli
from analysis.aotl.inputs import (
    accuracies_from_records,
    export_csv,
    load_accuracies,
    read_accuracy_csvs,
)
from oodutils import tables as report
from oodutils.errors import UserError

REPO = Path(__file__).resolve().parents[1]


# ---------------------------------------------------------------------------- helpers

def synthetic_models(n=400, slope=0.8, intercept=-0.2, noise=0.15, n_envs=3, ood=2, seed=0):
    """Per model a latent probit ID accuracy; ID envs scatter tightly around it, the OOD
    env follows slope * latent + intercept + noise (all on the probit scale)."""
    rng = np.random.default_rng(seed)
    latent = rng.uniform(-1.2, 1.6, n)
    accs = {}
    for e in range(n_envs):
        if e == ood:
            accs[e] = special.ndtr(slope * latent + intercept + noise * rng.standard_normal(n))
        else:
            accs[e] = special.ndtr(latent + 0.02 * rng.standard_normal(n))
    return accs


def write_csv(path, accs, ood, dataset="Toy", gz=False, extra=None):
    """The shared schema: one block of rows per ID env, same classifier order."""
    parts = []
    for e, x in accs.items():
        if e == ood:
            continue
        parts.append(pd.DataFrame({
            "x": x, "y": accs[ood], "train_env": e, "algorithm": "ERM",
            "model_hparams": "{'model_arch': 'toy', 'transfer': False}",
            "dataset": dataset, "test_env": ood}))
    df = pd.concat(parts, ignore_index=True)
    if extra:
        extra(df)
    text = df.to_csv(index=False)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if gz:
        path.write_bytes(gzip.compress(text.encode()))
    else:
        path.write_text(text)
    return path


def probit(a):
    return special.ndtri(np.clip(a, 0.01, 0.99))


def write_sweep(root, n_hparams=6, steps=(100, 200, 300), groups=True, seed=0):
    """A small leave-one-domain-out sweep: 3 envs, one run per (test env, hparams seed),
    3 checkpoints each, plus one run with two test envs (to be left out)."""
    rng = np.random.default_rng(seed)
    root = Path(root)
    k = 0
    for ood in range(3):
        for h in range(n_hparams):
            run = root / f"run_{k:03d}"
            k += 1
            run.mkdir(parents=True)
            lines = []
            skill = rng.uniform(-1, 1.5)
            for j, step in enumerate(steps):
                latent = skill + 0.3 * j + 0.05 * rng.standard_normal()
                rec = {"args": {"dataset": "ToyGroups", "algorithm": "ERM", "test_envs": [ood],
                                "hparams_seed": h, "trial_seed": 0, "seed": h,
                                "env_names": ["a", "b", "c"],
                                "group_names": ["y=0,a=0", "y=1,a=1"] if groups else None},
                       "hparams": {"lr": 1e-3}, "step": step}
                for e in range(3):
                    t = latent if e != ood else 0.5 * latent - 0.1
                    t = t + 0.05 * rng.standard_normal()
                    rec[f"env{e}_in_acc"] = float(special.ndtr(t + 0.1))
                    rec[f"env{e}_out_acc"] = float(special.ndtr(t))
                    if groups:
                        rec[f"env{e}_out_acc_g0"] = float(special.ndtr(t + 0.3))
                        rec[f"env{e}_out_acc_g1"] = float(special.ndtr(-0.8 * t))
                lines.append(json.dumps(rec))
            (run / "results.jsonl").write_text("\n".join(lines) + "\n")
            (run / "done").write_text("done\n")
    bad = root / "run_multi"
    bad.mkdir()
    rec = {"args": {"dataset": "ToyGroups", "algorithm": "ERM", "test_envs": [0, 1]},
           "hparams": {}, "step": 100, "env0_out_acc": 0.5, "env1_out_acc": 0.5,
           "env2_out_acc": 0.5}
    (bad / "results.jsonl").write_text(json.dumps(rec) + "\n")
    (bad / "done").write_text("done\n")
    return root


# ---------------------------------------------------------------------------- statistics

def test_transforms():
    assert aotl.probit([0.5])[0] == 0.0
    assert aotl.probit([0.0])[0] == pytest.approx(stats.norm.ppf(0.01))
    assert aotl.probit([1.0])[0] == pytest.approx(stats.norm.ppf(0.99))
    assert aotl.probit([0.975])[0] == pytest.approx(1.959964, abs=1e-6)
    assert aotl.transform([0.001], "probit", clip=0.0001)[0] == pytest.approx(-3.090232, 1e-6)
    assert aotl.logit([0.75])[0] == pytest.approx(np.log(3))
    assert aotl.logit([1.0])[0] == pytest.approx(np.log(99))
    assert aotl.transform([0.0, 1.0], "identity").tolist() == [0.0, 1.0]
    with pytest.raises(UserError):
        aotl.transform([0.5], "probit", clip=0.5)
    with pytest.raises(UserError):
        aotl.transform([0.5], "cube")


def test_fit_line_matches_linregress_and_known_line():
    # An exact line on the probit scale: slope, intercept and R come back exactly.
    t = np.linspace(-1.5, 1.5, 50)
    fit = aotl.fit_line(special.ndtr(t), special.ndtr(0.7 * t - 0.25))
    assert fit["slope"] == pytest.approx(0.7)
    assert fit["intercept"] == pytest.approx(-0.25)
    assert fit["r"] == pytest.approx(1.0) and fit["r2"] == pytest.approx(1.0)
    assert fit["n"] == 50 and fit["spearman"] == pytest.approx(1.0)
    # Noisy line with a known population R = a sx / sqrt(a^2 sx^2 + s^2).
    rng = np.random.default_rng(1)
    tx = rng.normal(0, 0.6, 4000)
    ty = -0.9 * tx + 0.3 + rng.normal(0, 0.45, 4000)
    fit = aotl.fit_line(special.ndtr(tx), special.ndtr(ty))
    true_r = -0.9 * 0.6 / np.sqrt(0.81 * 0.36 + 0.45 ** 2)
    assert fit["r"] == pytest.approx(true_r, abs=0.02)
    assert fit["slope"] == pytest.approx(-0.9, abs=0.05)
    ref = stats.linregress(probit(special.ndtr(tx)), probit(special.ndtr(ty)))
    for key, val in (("slope", ref.slope), ("intercept", ref.intercept), ("r", ref.rvalue),
                     ("p", ref.pvalue), ("stderr", ref.stderr),
                     ("intercept_stderr", ref.intercept_stderr)):
        assert fit[key] == pytest.approx(val, rel=1e-12, abs=1e-300)
    # Logit and identity scales are plain linregress on those scales.
    x, y = special.ndtr(tx[:100]), special.ndtr(ty[:100])
    lg = aotl.fit_line(x, y, "logit")
    ref = stats.linregress(special.logit(np.clip(x, .01, .99)),
                           special.logit(np.clip(y, .01, .99)))
    assert lg["slope"] == pytest.approx(ref.slope)
    assert aotl.fit_line(x, y, "identity")["r"] == pytest.approx(np.corrcoef(x, y)[0, 1])


def test_fit_line_rejects_degenerate_input():
    with pytest.raises(UserError, match="at least 3"):
        aotl.fit_line([0.5], [0.6])
    with pytest.raises(UserError, match="ID accuracies are equal"):
        aotl.fit_line([0.5, 0.5, 0.5], [0.1, 0.2, 0.3])
    with pytest.raises(UserError, match="after clipping"):  # all OOD clipped to 0.01
        aotl.fit_line([0.5, 0.6, 0.7], [0.0, 0.001, 0.005])
    with pytest.raises(UserError, match="clip"):
        aotl.fit_line([0.5, 0.6, 1.0], [0.2, 0.3, 0.4], clip=0)


def test_classify_boundaries():
    assert aotl.classify(-0.74) == ("inverse line", True)
    assert aotl.classify(-0.3) == ("inverse line", True)
    assert aotl.classify(-0.29) == ("weak", True)
    assert aotl.classify(0.29) == ("weak", True)
    assert aotl.classify(0.3) == ("on the line", False)
    assert aotl.classify(0.94) == ("on the line", False)
    assert aotl.classify(0.4, threshold=0.5) == ("weak", True)
    with pytest.raises(UserError):
        aotl.classify(0.1, threshold=0)


def test_bootstrap_r_covers_truth_and_resamples_runs():
    rng = np.random.default_rng(2)
    n = 300
    tx = rng.normal(size=n)
    ty = 0.6 * tx + 0.8 * rng.normal(size=n)  # population R = 0.6
    lo, hi = aotl.bootstrap_r(tx, ty, n_boot=1000, seed=0)
    assert lo < 0.6 < hi and hi - lo < 0.25
    assert lo < np.corrcoef(tx, ty)[0, 1] < hi
    # 60 runs of 5 identical checkpoints: resampling checkpoints as if independent
    # understates the uncertainty; resampling runs gives the width of 60 points.
    tx60, ty60 = tx[:60], ty[:60]
    rep_x, rep_y = np.repeat(tx60, 5), np.repeat(ty60, 5)
    runs = np.repeat(np.arange(60), 5)
    w_models = np.subtract(*aotl.bootstrap_r(rep_x, rep_y, None, 1000, seed=0)[::-1])
    w_runs = np.subtract(*aotl.bootstrap_r(rep_x, rep_y, runs, 1000, seed=0)[::-1])
    w_unique = np.subtract(*aotl.bootstrap_r(tx60, ty60, None, 1000, seed=0)[::-1])
    assert w_runs > 1.6 * w_models
    assert w_runs == pytest.approx(w_unique, rel=0.25)


def test_classifier_count_heuristic():
    rng = np.random.default_rng(3)
    tx = rng.normal(size=3000)
    strong = 0.99 * tx + 0.14 * rng.normal(size=3000)
    weak = 0.5 * tx + 0.87 * rng.normal(size=3000)
    k_strong, total = aotl.classifier_count(tx, strong, n_boot=200, seed=0)
    k_weak, _ = aotl.classifier_count(tx, weak, n_boot=200, seed=0)
    assert total == 3000
    assert k_strong is not None and k_weak is not None
    assert k_strong % 100 == 10 and k_weak % 100 == 10  # the paper's ...10 grid
    assert k_strong < 500 < k_weak
    # Too few classifiers to ever stabilise a weak correlation: no minimum.
    k, total = aotl.classifier_count(tx[:150], weak[:150], n_boot=200, seed=0)
    assert k is None and total == 150


# ---------------------------------------------------------------------------- CSV input

@pytest.fixture
def toy_csvs(tmp_path):
    paths, truth = [], {}
    for ood in range(3):
        accs = synthetic_models(n=300, slope=[0.8, -0.6, 0.03][ood], ood=ood, seed=ood)
        truth[ood] = accs
        paths.append(write_csv(tmp_path / "Toy" / f"env{ood}_out_acc.csv.gz", accs, ood,
                               gz=True))
    return paths, truth


def test_csv_tables_match_direct_fits(toy_csvs):
    paths, truth = toy_csvs
    acc = read_accuracy_csvs(paths)
    per = aotl.per_ood_table(acc)
    assert list(per["ood_env"]) == [0, 1, 2]
    assert list(per["id_envs"]) == ["1 2", "0 2", "0 1"]
    for row in per.itertuples():
        accs = truth[row.ood_env]
        x = np.mean([accs[e] for e in accs if e != row.ood_env], axis=0)
        ref = stats.linregress(probit(x), probit(accs[row.ood_env]))
        assert row.slope == pytest.approx(ref.slope)
        assert row.r == pytest.approx(ref.rvalue)
        assert row.n == 300
    assert per.loc[0, "slope"] == pytest.approx(0.8, abs=0.1)
    assert list(per["verdict"]) == ["on the line", "inverse line", "weak"]
    assert list(per["well_specified"]) == [False, True, True]
    pw = aotl.pairwise_table(acc)
    assert len(pw) == 6 and list(pw["id_envs"])[:2] == ["1", "2"]
    row = pw[(pw["ood_env"] == 1) & (pw["id_envs"] == "2")].iloc[0]
    ref = stats.linregress(probit(truth[1][2]), probit(truth[1][1]))
    assert row["intercept"] == pytest.approx(ref.intercept)
    assert row["stderr"] == pytest.approx(ref.stderr)


def test_id_envs_selection(toy_csvs):
    acc = read_accuracy_csvs(toy_csvs[0])
    per = aotl.per_ood_table(acc, id_envs=[0, 1])
    # OOD env 0 and 1 keep the other one; OOD env 2 averages both.
    assert list(per["id_envs"]) == ["1", "0", "0 1"]
    pw = aotl.pairwise_table(acc, id_envs=[0])
    assert list(zip(pw["ood_env"], pw["id_envs"])) == [(1, "0"), (2, "0")]
    assert any("no ID environment left" in m for m in acc.notices)
    with pytest.raises(UserError, match="no such environment"):
        aotl.per_ood_table(acc, id_envs=[0, 7])


def test_csv_bad_input(tmp_path, toy_csvs):
    accs = synthetic_models(n=20)
    missing = write_csv(tmp_path / "missing.csv", accs, 2, extra=lambda d: d.pop("y"))
    with pytest.raises(UserError, match="missing column"):
        read_accuracy_csvs([missing])
    pct = write_csv(tmp_path / "pct.csv", {e: 100 * a for e, a in accs.items()}, 2)
    with pytest.raises(UserError, match="percentages"):
        read_accuracy_csvs([pct])
    empty = tmp_path / "empty.csv"
    empty.write_text(",".join(["x", "y", "train_env", "algorithm", "model_hparams", "dataset",
                               "test_env"]) + "\n")
    with pytest.raises(UserError, match="no rows"):
        read_accuracy_csvs([empty])
    one = write_csv(tmp_path / "one.csv", {e: a[:1] for e, a in accs.items()}, 2)
    with pytest.raises(UserError, match="at least 3"):
        aotl.per_ood_table(read_accuracy_csvs([one]))

    def shift(d):
        d.loc[d.index[-1], "y"] = 0.123  # last block's OOD accuracy no longer aligned
    shifted = write_csv(tmp_path / "shifted.csv", accs, 2, extra=shift)
    with pytest.raises(UserError, match="not aligned"):
        read_accuracy_csvs([shifted])
    with pytest.raises(UserError, match="no such file"):
        load_accuracies([tmp_path / "nope.csv"])
    (tmp_path / "nothing").mkdir()
    with pytest.raises(UserError, match="neither a sweep"):
        load_accuracies([tmp_path / "nothing"])


# ---------------------------------------------------------------------------- sweeps

def test_sweep_points_checkpoint_selection_and_export(tmp_path):
    root = write_sweep(tmp_path / "sweep")
    acc = load_accuracies([root])
    assert acc.splits() == [("ToyGroups", 0), ("ToyGroups", 1), ("ToyGroups", 2)]
    assert len(acc.frame) == 3 * 6 * 3
    assert any("more than one test environment" in m for m in acc.notices)
    per = aotl.per_ood_table(acc)
    assert (per["n"] == 18).all()
    assert per["slope"].between(0.35, 0.65).all()   # the sweep's true slope is 0.5
    assert (per["r"] > 0.9).all()

    last = load_accuracies([root], checkpoints="last")
    assert (last.frame["step"] == 300).all() and len(last.frame) == 18
    best = load_accuracies([root], checkpoints="best")
    assert len(best.frame) == 18
    # Accuracy rises with the step in this sweep, so the best checkpoint is the last one.
    assert (best.frame["step"] == 300).all()

    inn = load_accuracies([root], split="in")
    assert (inn.frame["acc1"] > acc.frame["acc1"]).all()

    # Bootstraps resample whole runs: 6 runs per split.
    ci = aotl.per_ood_table(acc, n_boot=300)
    assert (ci["r_ci_low"] <= ci["r"]).all() and (ci["r"] <= ci["r_ci_high"]).all()

    # Exported CSVs read back to the same table.
    written = export_csv(acc, tmp_path / "export")
    assert sorted(p.name for p in written) == [f"env{k}_out_acc.csv.gz" for k in range(3)]
    head = pd.read_csv(written[0])
    assert list(head.columns[:7]) == ["x", "y", "train_env", "algorithm", "model_hparams",
                                      "dataset", "test_env"]
    back = aotl.per_ood_table(load_accuracies([tmp_path / "export"]))
    pd.testing.assert_frame_equal(back[["slope", "intercept", "r", "n"]],
                                  per[["slope", "intercept", "r", "n"]])
    # Run identity survives the round trip, so bootstraps still resample runs.
    assert back is not None and load_accuracies([tmp_path / "export"]).frame["run"].nunique() == 18


def test_sweep_bad_input(tmp_path):
    (tmp_path / "empty" / "run").mkdir(parents=True)
    (tmp_path / "empty" / "run" / "results.jsonl").write_text("")
    with pytest.raises(UserError, match="no records"):
        load_accuracies([tmp_path / "empty"])
    with pytest.raises(UserError, match="exactly one test environment"):
        accuracies_from_records([{"args": {"dataset": "D", "test_envs": [0, 1]},
                                  "env0_out_acc": 0.5, "run_dir": "r"}])
    with pytest.raises(UserError, match=r"\[0, 1\]"):
        accuracies_from_records([{"args": {"dataset": "D", "test_envs": [0]}, "step": 1,
                                  "env0_out_acc": 1.5, "env1_out_acc": 0.5, "run_dir": "r"}])


def test_group_tables(tmp_path):
    acc = load_accuracies([write_sweep(tmp_path / "sweep")])
    avg = aotl.group_table(acc, "average")
    assert len(avg) == 3 * 2
    assert list(avg["ood_group"][:2]) == ["y=0,a=0", "y=1,a=1"]
    assert (avg["id_group"] == "avg").all()
    # Group 0 follows the OOD line (positive), group 1 is its mirror image (negative).
    assert (avg[avg["ood_group"] == "y=0,a=0"]["r"] > 0.8).all()
    assert (avg[avg["ood_group"] == "y=1,a=1"]["r"] < -0.8).all()
    assert set(avg[avg["ood_group"] == "y=1,a=1"]["verdict"]) == {"inverse line"}
    pw = aotl.group_table(acc, "pairwise")
    assert len(pw) == 3 * 2 * 2 * 2  # OOD envs x OOD groups x ID envs x ID groups
    row = pw[(pw["ood_env"] == 0) & (pw["ood_group"] == "y=1,a=1") & (pw["id_envs"] == "1")
             & (pw["id_group"] == "y=1,a=1")].iloc[0]
    assert row["r"] > 0.8  # both mirrored: a positive line again
    with pytest.raises(UserError, match="per-group"):
        aotl.group_table(load_accuracies([write_sweep(tmp_path / "plain", groups=False)]))


# ---------------------------------------------------------------------------- regimes

def _regime_csv(tmp_path):
    """OOD rises with ID below 90% ID accuracy and falls above it (Camelyon-like)."""
    rng = np.random.default_rng(4)
    tx = np.sort(rng.uniform(special.ndtri(0.6), special.ndtri(0.98), 600))
    t90 = special.ndtri(0.9)
    ty = np.where(tx < t90, 0.9 * (tx - t90), -0.8 * (tx - t90)) + 0.5
    ty = ty + 0.03 * rng.standard_normal(len(tx))
    accs = {0: special.ndtr(tx), 1: special.ndtr(tx + 0.01 * rng.standard_normal(len(tx))),
            2: special.ndtr(ty)}
    return write_csv(tmp_path / "regime.csv", accs, 2, dataset="Bent")


def test_regime_and_changepoints(tmp_path):
    acc = read_accuracy_csvs([_regime_csv(tmp_path)])
    reg = aotl.regime_table(acc, acc_threshold=0.9)
    assert list(reg["regime"]) == ["id < 0.9", "id >= 0.9"]
    assert reg.loc[0, "slope"] == pytest.approx(0.9, abs=0.1)
    assert reg.loc[1, "slope"] == pytest.approx(-0.8, abs=0.15)
    assert list(reg["verdict"]) == ["on the line", "inverse line"]
    cp = aotl.changepoint_table(acc)
    assert len(cp) == 2
    assert cp.loc[0, "id_acc_to"] == pytest.approx(0.9, abs=0.01)
    assert cp.loc[0, "slope"] > 0 > cp.loc[1, "slope"]


# ---------------------------------------------------------------------------- CLI, report, plots

def test_cli_main_formats_and_plot(toy_csvs, tmp_path, capsys):
    paths = [str(p) for p in toy_csvs[0]]
    assert aotl_cli.main(paths + ["--table", "pairwise", "--format", "csv"]) == 0
    df = pd.read_csv(pd.io.common.StringIO(capsys.readouterr().out))
    for col in ["dataset", "ood_env", "id_envs", "n", "slope", "intercept", "r", "p", "stderr"]:
        assert col in df.columns
    assert len(df) == 6
    aotl_cli.main(paths + ["--format", "markdown"])
    out = capsys.readouterr().out
    assert out.startswith("| dataset | ood_env |") and "| inverse line |" in out
    aotl_cli.main(paths + ["--format", "latex", "--id-envs", "0", "1"])
    assert "\\toprule" in capsys.readouterr().out
    aotl_cli.main(paths + ["--table", "n-classifiers", "--bootstrap", "50"])
    assert "min_samples" in capsys.readouterr().out
    aotl_cli.main(paths + ["--plot", str(tmp_path / "png"), "--output", str(tmp_path / "t.md")])
    assert (tmp_path / "t.md").read_text().startswith("| dataset")
    pngs = sorted((tmp_path / "png").glob("*.png"))
    assert [p.name for p in pngs] == ["Toy_env0.png", "Toy_env1.png", "Toy_env2.png"]
    assert pngs[0].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_cli_contract_subprocess(toy_csvs, tmp_path):
    """The exact acceptance invocation, and a bad input: one `error:` line, exit 2."""
    env = dict(os.environ, PYTHONPATH=str(REPO))
    cmd = [sys.executable, "-m", "analysis.aotl", *map(str, toy_csvs[0]), "--table",
           "per-ood", "--id-envs", "0", "1", "2", "--clip", "0.01", "--format", "csv"]
    res = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, env=env)
    assert res.returncode == 0, res.stderr
    df = pd.read_csv(pd.io.common.StringIO(res.stdout))
    assert list(df.columns[:3]) == ["dataset", "ood_env", "id_envs"]
    assert len(df) == 3 and not df[["slope", "r", "p", "stderr"]].isna().any().any()
    bad = tmp_path / "bad.csv"
    bad.write_text("x,y\n0.5,0.5\n")
    res = subprocess.run([sys.executable, "-m", "analysis.aotl", str(bad)], capture_output=True,
                         text=True, cwd=REPO, env=env)
    assert res.returncode == 2
    assert res.stderr.startswith("error: ") and "missing column" in res.stderr
    assert res.stdout == ""


def test_report_formats():
    df = pd.DataFrame({"dataset": ["a_b", "c|d"], "r": [0.123456, -0.0001],
                       "ok": [True, False], "k": pd.array([10, None], dtype="Int64")})
    text = report.render(df, "text", digits=3)
    assert "0.123" in text and " 0.000" in text and "-0.000" not in text and "yes" in text
    md = report.render(df, "markdown")
    assert "c\\|d" in md and "|---:|" in md.replace(":---|---:", "|---:")
    tex = report.render(df, "latex")
    assert "a\\_b" in tex and "\\bottomrule" in tex
    csv = report.render(df, "csv")
    assert "0.123456" in csv and csv.splitlines()[0] == "dataset,r,ok,k"
    assert "<td" in report.render(df, "html")
    with pytest.raises(UserError):
        report.render(df, "docx")
