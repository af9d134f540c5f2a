"""The leaderboard's analyses beyond the tables (issue 28): effective robustness per
selected cell, how sure the ranking is (analysis.selection_stats), and the benchmark
cards (analysis.card), on a synthetic sweep with a known answer, on DomainBed's test
sweep and on a tiny sweep trained here with logits."""
import io
import json
import re
import subprocess
import sys
from contextlib import redirect_stdout
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from scipy import special
from scipy import stats as sstats

from domainbed.leaderboard import pages
from domainbed.scripts import leaderboard as cli
from oodutils.errors import UserError
from tests.builders import record, run_args, write_run
from tests.requirements import data_dir, need_data

REPO = Path(__file__).resolve().parents[1]
SWEEP = data_dir("domainbed_test_sweep") / "test_sweep_data"
HOSTILE = 'Toy <b>"x"</b> & a very long name ' + "y" * 80
ROBUST_GAIN = 0.2    # Robust: OOD accuracy 20 points above ERM's at the same ID accuracy


def _id_acc(trial, hparams):
    return 0.55 + 0.1 * hparams + 0.01 * trial


def _ood_acc(algorithm, trial, test_env, hparams):
    """ERM on a probit line with a small deterministic wobble; Robust 20 points above."""
    x = special.ndtri(_id_acc(trial, hparams))
    wobble = 0.05 * np.sin(7 * hparams + 3 * trial + test_env)
    base = float(special.ndtr(0.8 * x - 0.3 + wobble))
    return base + (ROBUST_GAIN if algorithm == "Robust" else 0.0)


def write_sweep(root, dataset="Toy"):
    """One run per (algorithm, trial, test env, hparams draw), one record each."""
    for algorithm in ("ERM", "Robust"):
        for trial in range(3):
            for test_env in range(3):
                for h in range(4):
                    ood = _ood_acc(algorithm, trial, test_env, h)
                    iid = _id_acc(trial, h)
                    accs = {env: (ood, ood) if env == test_env else (iid, iid)
                            for env in range(3)}
                    args = run_args(dataset, algorithm, [test_env], trial, h)
                    write_run(root / f"{algorithm}_{trial}_{test_env}_{h}",
                              [record(10, args, {"lr": 0.001 * (h + 1)}, accs)])
    return root


def build(inputs, out, *extra):
    with redirect_stdout(io.StringIO()):
        assert cli.main(["--input_dir", *map(str, inputs), "--output_dir", str(out),
                         "--bootstrap", "50", *extra]) == 0
    return json.loads((out / "leaderboard.json").read_text())


@pytest.fixture(scope="module")
def synthetic_site(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("analyses")
    out = tmp / "site"
    return out, build([write_sweep(tmp / "sweep", HOSTILE)], out)


def _expected_er(algorithm, test_env):
    """By hand: the split's OLS line through every run (probit of mean ID accuracy vs
    probit of OOD accuracy), applied to the run training-domain validation selects in
    each trial (the highest ID accuracy: hparams 3)."""
    xs, ys = [], []
    for a in ("ERM", "Robust"):
        for t in range(3):
            for h in range(4):
                xs.append(special.ndtri(np.clip(_id_acc(t, h), 0.01, 0.99)))
                ys.append(special.ndtri(np.clip(_ood_acc(a, t, test_env, h), 0.01, 0.99)))
    fit = sstats.linregress(xs, ys)
    ers = [100 * (_ood_acc(algorithm, t, test_env, 3) - special.ndtr(
        fit.slope * special.ndtri(_id_acc(t, 3)) + fit.intercept)) for t in range(3)]
    return float(np.mean(ers))


def test_effective_robustness_of_selected_models_matches_a_fit_done_here(synthetic_site):
    _, model = synthetic_site
    er = model["effective_robustness"]
    cells = {(c["algorithm"], c["test_env"]): c for c in er["cells"]
             if c["method"] == "training_domain"}
    assert len(cells) == 6 and er["missing"] == {}
    for (algorithm, env), c in cells.items():
        assert c["n_models"] == 3
        assert c["effective_robustness"] == pytest.approx(_expected_er(algorithm, env),
                                                          abs=1e-6)
        assert c["er_stderr"] > 0
        # the same ID accuracy: Robust stands exactly 20 points further above the line
        if algorithm == "Robust":
            gap = c["effective_robustness"] - cells[("ERM", env)]["effective_robustness"]
            assert gap == pytest.approx(100 * ROBUST_GAIN, abs=1e-6)
            assert c["effective_robustness"] > 0 > cells[("ERM", env)]["effective_robustness"]


def test_stats_panels_have_the_known_answer(synthetic_site):
    out, model = synthetic_site
    st = model["stats"]["training_domain"]
    ranks = {r["algorithm"]: r for r in st["rank_stability"]}
    assert ranks["Robust"]["rank"] == 1 and ranks["Robust"]["P(rank 1)"] == 1.0
    assert st["kendall_tau"]["mean"] == 1.0
    (paired,) = st["paired_vs_erm"]
    assert paired["algorithm"] == "Robust" and paired["n_pairs"] == 9
    assert paired["mean_diff"] == pytest.approx(100 * ROBUST_GAIN)
    # validation picks the best OOD draw only by luck: regret is the oracle's pick minus it
    regret = {r["algorithm"]: r["Avg"] for r in st["selection_regret"]}
    best_by_oracle = np.mean([max(_ood_acc("ERM", t, e, h) for h in range(4)) -
                              _ood_acc("ERM", t, e, 3) for t in range(3) for e in range(3)])
    assert regret["ERM"] == pytest.approx(100 * best_by_oracle)
    # one draw: the mean over draws; four draws: almost surely the validation-best (h=3)
    erm = next(r for r in st["expected_best"] if r["algorithm"] == "ERM")
    assert erm["k=1"] == pytest.approx(100 * np.mean(
        [_ood_acc("ERM", t, e, h) for t in range(3) for e in range(3) for h in range(4)]))
    index = (out / "index.html").read_text()
    assert "How sure is this leaderboard?" in index and "Paired comparison with ERM" in index
    assert 'src="img/expected_best_training_domain.png"' in index
    assert (out / "img" / "expected_best_training_domain.png").stat().st_size > 1000


def test_hostile_dataset_name_gets_escaped_collision_free_card_pages(synthetic_site):
    out, model = synthetic_site
    label = model["datasets"][0]["label"]
    html = (out / pages.card_page(label)).read_text()
    md = (out / pages.card_page(label, "md")).read_text()
    assert "/" not in pages.card_page(label) and len(pages.card_page(label)) < 90
    assert '<b>"x"</b>' not in html and "&lt;b&gt;&#34;x&#34;&lt;/b&gt;" in html
    assert "<b>" not in md and "&lt;b&gt;" in md.splitlines()[0]
    dataset_page = (out / pages.dataset_page(label)).read_text()
    assert f'href="{pages.card_page(label)}"' in dataset_page
    assert "Effective robustness (Taori et al. 2020)" in dataset_page
    assert set(model["cards"]) == {label}


def _csv(*argv):
    proc = subprocess.run([sys.executable, "-m", *argv], capture_output=True, text=True,
                          cwd=REPO, timeout=600)
    assert proc.returncode == 0, proc.stderr
    return pd.read_csv(io.StringIO(proc.stdout))


def _section(card, key):
    return next(s for s in card["sections"] if s["key"] == key)


def test_card_of_domainbeds_test_sweep_matches_the_analyses(tmp_path):
    sweep = need_data(SWEEP, "DomainBed's test sweep")
    out = tmp_path / "cards"
    proc = subprocess.run([sys.executable, "-m", "analysis.card", "--input_dir", str(sweep),
                           "--output_dir", str(out), "--bootstrap", "20"],
                          capture_output=True, text=True, cwd=REPO, timeout=600)
    assert proc.returncode == 0, proc.stderr
    md = (out / "card_VLCS.md").read_text()
    assert (out / "card_VLCS.html").is_file()
    per_ood = _csv("analysis.aotl", str(sweep), "--table", "per-ood", "--format", "csv",
                   "-qq")
    for row in per_ood.itertuples():
        assert f"| {row.ood_env} | {row.n} | {round(row.slope, 3)} | {round(row.r, 3)} | " \
               f"{row.verdict} |" in md
    er = _csv("analysis.aotl", str(sweep), "--table", "effective-robustness", "--format",
              "csv", "-qq")
    for env, values in er.groupby("ood_env")["effective_robustness"]:
        assert f"| {env} | {len(values)} | {round(values.std(), 2)} | " \
               f"{round(values.min(), 2)} | {round(values.max(), 2)} |" in md
    # what a missing analysis needs is said
    assert "--save_logits" in md and "--ood_bench DIR" in md and "--oodselect DIR" in md
    assert "needs a dataset with groups" in md


def test_card_of_a_sweep_trained_here_reports_labelfree_error(tmp_path):
    from tests.test_leaderboard import train
    sweep = tmp_path / "sweep"
    for seed in range(3):
        train(sweep / f"run{seed}", tmp_path / "data", "--save_logits", "--seed", str(seed),
              "--hparams_seed", str(seed))
    proc = subprocess.run([sys.executable, "-m", "analysis.labelfree", "--input_dir",
                           str(sweep), "--output_dir", str(tmp_path / "lf")],
                          capture_output=True, text=True, cwd=REPO, timeout=600)
    assert proc.returncode == 0, proc.stderr
    summary = pd.read_csv(tmp_path / "lf" / "summary.csv")
    model = build([sweep], tmp_path / "site")
    card = model["cards"]["Debug28"]
    section = _section(card, "labelfree")
    assert section["needs"] is None
    row = dict(zip(section["columns"], section["rows"][0]))
    for r in summary.itertuples():
        assert row[r.method] == pytest.approx(round(r.mae, 2))
    assert _section(card, "aotl")["needs"] is None


def test_card_shows_ood_bench_and_oodselect_outputs_of_its_dataset(tmp_path):
    from analysis import card
    from domainbed.leaderboard import panels
    from domainbed.results.records import load_records
    records = load_records([write_sweep(tmp_path / "sweep")], quiet=True).records
    bench = tmp_path / "oodbench"
    bench.mkdir()
    (bench / "summary.json").write_text(json.dumps({
        "n_trials": 3, "diversity": {"mean": 0.0123, "se": 0.001},
        "correlation": {"mean": 0.456, "se": 0.02},
        "config": {"dataset": "Toy", "envs_p": [0, 1], "envs_q": [2]}}))
    other = tmp_path / "other"
    other.mkdir()
    (other / "summary.json").write_text(json.dumps({"config": {"dataset": "PACS"}}))
    select = tmp_path / "oodselect"
    select.mkdir()
    (select / "summary.csv").write_text("method,n,r_test\noodselect,50,-0.8\nrandom,50,0.9\n"
                                        "oodselect,100,-0.5\n")
    (select / "subsets.json").write_text(json.dumps({"info": {"dataset": "Toy"}}))
    inputs = card.CardInputs(oodselect=[panels.read_oodselect(str(select))],
                             ood_bench=card.read_ood_bench_summaries([str(bench), str(other)]),
                             n_boot=10)
    built = card.build_card(records, "Toy", "Toy", inputs)
    bench_section = _section(built, "ood_bench")
    assert bench_section["needs"] is None and len(bench_section["rows"]) == 1
    assert bench_section["rows"][0][3:] == ["0.0123 ± 0.0010", "0.4560 ± 0.0200", 3]
    worst = _section(built, "oodselect")["rows"]
    assert [row[3] for row in worst] == [-0.8, -0.5, 0.9]     # lowest correlation first
    assert _section(built, "labelfree")["needs"] == card.LABELFREE_NEEDS
    with pytest.raises(UserError, match="summary.json"):
        card.read_ood_bench_summaries([str(tmp_path)])


def test_each_board_heads_its_first_column_with_what_it_holds(synthetic_site):
    """The expected-best boards list datasets first: their first column is headed
    "Dataset", not "Algorithm" (issue 43, item 6)."""
    out, _ = synthetic_site
    index = (out / "index.html").read_text()
    boards = index.split("<h3>")[1:]
    expected = [b for b in boards if b.startswith("Expected best accuracy")]
    ranks = [b for b in boards if b.startswith("Rank stability")]
    assert expected and ranks
    first = re.compile(r'<th class="sortable" data-col="0">([^<]*)</th>')
    assert {first.search(b).group(1) for b in expected} == {"Dataset"}
    assert {first.search(b).group(1) for b in ranks} == {"Algorithm"}
