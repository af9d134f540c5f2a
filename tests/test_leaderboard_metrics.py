"""The leaderboard's metric selector: tables of every metric the records carry beyond
accuracy (trained with --metrics, or metrics.jsonl from domainbed-metrics), in
leaderboard.json and leaderboard.csv, lower-is-better metrics ranked that way.

The runs are written by hand with chosen numbers, one run per (algorithm, test env) and
two checkpoints each; DomainBed's oracle selection keeps a run's last checkpoint, so each
expected cell is that checkpoint's number, read here straight from the numbers written."""
import csv
import io
import json
from contextlib import redirect_stdout

import pytest

from domainbed.scripts import leaderboard as cli

# (algorithm, test env) -> per checkpoint: (test env in-split nll, ece, accuracy)
RUNS = {("ERM", 0): [(0.9, 0.20, 0.6), (0.8123, 0.0512, 0.7)],
        ("ERM", 1): [(1.1, 0.30, 0.5), (0.6644, 0.1031, 0.8)],
        ("IRM", 0): [(0.7, 0.10, 0.6), (0.9577, 0.0286, 0.65)],
        ("IRM", 1): [(0.5, 0.05, 0.9), (0.4012, 0.1777, 0.75)]}


def write_runs(sweep, side_file_for=()):
    """Debug28-like runs (three environments, one test env each); the metrics go into the
    records, or for the runs in `side_file_for` into metrics.jsonl beside them."""
    for (algorithm, test_env), checkpoints in RUNS.items():
        run = sweep / f"{algorithm}_{test_env}"
        run.mkdir(parents=True)
        args = {"dataset": "Debug28", "algorithm": algorithm, "test_envs": [test_env],
                "trial_seed": 0, "hparams_seed": 0, "env_names": ["0", "1", "2"],
                "data_source": "random:Debug28", "data_fingerprint": "f", "data_seed": 0,
                "precision": "fp32"}
        records, side = [], []
        for step, (nll, ece, acc) in enumerate(checkpoints):
            record = {"args": args, "hparams": {"lr": 0.001}, "step": step}
            for env in range(3):
                record.update({f"env{env}_in_acc": acc, f"env{env}_out_acc": acc})
            metrics = {f"env{test_env}_in_nll": nll, f"env{test_env}_in_ece": ece}
            if (algorithm, test_env) in side_file_for:
                side.append(json.dumps({"step": step, **metrics}) + "\n")
            else:
                record.update(metrics)
            records.append(json.dumps(record) + "\n")
        (run / "results.jsonl").write_text("".join(records))
        if side:
            (run / "metrics.jsonl").write_text("".join(side))
        (run / "done").write_text("done\n")


def expected_oracle_text(algorithm, test_env, metric):
    """The page's text of an oracle cell: the last checkpoint's number x100, one trial."""
    nll, ece, acc = RUNS[(algorithm, test_env)][-1]
    return f"{100 * {'nll': nll, 'ece': ece, 'accuracy': acc}[metric]:.1f}"


def build(sweep, out):
    with redirect_stdout(io.StringIO()):
        cli.main(["--input_dir", str(sweep), "--out", str(out), "--selection_methods",
                  "training_domain", "oracle"])
    return json.loads((out / "leaderboard.json").read_text())


@pytest.fixture(scope="module")
def metric_site(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("metrics")
    write_runs(tmp / "sweep", side_file_for={("IRM", 1)})
    out = tmp / "site"
    return out, build(tmp / "sweep", out)


def _section(model, metric, key):
    return next(s for s in model["metric_sections"][metric] if s["key"] == key)


def test_leaderboard_json_carries_every_metric_of_the_records(metric_site):
    _, model = metric_site
    assert model["metrics"] == ["accuracy", "nll", "ece"]
    assert [s["key"] for s in model["metric_sections"]["nll"]] == ["training_domain",
                                                                   "oracle"]
    for metric in ("nll", "ece"):
        (table,) = _section(model, metric, "oracle")["tables"]
        for row in table["rows"]:
            shown = [c["text"] for c in row["cells"]]
            assert shown == [expected_oracle_text(row["algorithm"], 0, metric),
                             expected_oracle_text(row["algorithm"], 1, metric), "X"]
            assert "have no " + metric in row["cells"][2]["missing"] or \
                "alone" in row["cells"][2]["missing"]
    (table,) = model["sections"][1]["tables"]          # accuracy, unchanged
    assert [c["text"] for c in table["rows"][0]["cells"][:2]] == ["70.0", "80.0"]


def test_lower_is_better_metrics_rank_the_lowest_first(metric_site):
    _, model = metric_site
    nll = _section(model, "nll", "oracle")
    assert nll["lower_is_better"] and nll["metric"] == "nll (x100)"
    ranks = {r["algorithm"]: r["cells"][0]["rank"] for r in nll["overview"]["rows"]}
    # mean over test envs 0 and 1: ERM (81.23 + 66.44) / 2 = 73.8, IRM (95.77 + 40.12) / 2
    # = 67.9: IRM's is lower, so IRM ranks first and gains 5.9 over ERM
    assert ranks == {"IRM": 1, "ERM": 2}
    irm = next(r for r in nll["overview"]["rows"] if r["algorithm"] == "IRM")
    assert irm["gain_over_erm"] == pytest.approx(73.835 - 67.945)


def test_the_csv_has_a_metric_column(metric_site):
    out, _ = metric_site
    rows = list(csv.DictReader(io.StringIO((out / "leaderboard.csv").read_text())))
    ece = [r for r in rows if r["metric"] == "ece" and r["selection_method"].startswith(
        "test-domain") and r["table"] == "Debug28" and r["algorithm"] == "ERM"]
    assert [r["text"] for r in ece] == ["5.1", "10.3", "X", "X"]   # envs 0, 1, 2, Avg
    assert {r["metric"] for r in rows} == {"accuracy", "nll", "ece"}


def test_records_without_metrics_give_one_metric_and_no_selector(tmp_path):
    sweep = tmp_path / "sweep"
    write_runs(sweep)
    for run in sweep.iterdir():  # strip the metrics: accuracy only, as before
        lines = [json.loads(line) for line in (run / "results.jsonl").read_text().splitlines()]
        (run / "results.jsonl").write_text("".join(
            json.dumps({k: v for k, v in r.items() if not k.endswith(("nll", "ece"))}) + "\n"
            for r in lines))
    model = build(sweep, tmp_path / "site")
    assert model["metrics"] == ["accuracy"] and model["metric_sections"] == {}
    assert 'id="metric-filter"' not in (tmp_path / "site" / "index.html").read_text()
