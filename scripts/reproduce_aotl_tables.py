"""Recompute the accuracy-on-the-line tables of Salaudeen et al. 2025 ("Are Domain
Generalization Benchmarks with Accuracy on the Line Misspecified?") from the authors'
per-model accuracy CSVs, and print ours beside the published numbers.

    python scripts/reproduce_aotl_tables.py [DATA_DIR] [--tol 0.01] [--format text|markdown|csv]

DATA_DIR defaults to the repository's tests/data/aotl_reference (the authors' CSVs). Tables:
ColoredMNIST T5 (per OOD env) / T6 (pairwise), Spawrious O2O-easy T7/T8, O2O-hard T9/T10,
M2M-easy T11/T12, M2M-hard T13/T14, PACS T15/T16 (T15 averages ID envs among 0-2 only,
``--id_envs 0 1 2``), plus Table 1's TerraIncognita row. A row reproduces when slope,
intercept, R, p and the slope's standard error all lie within ``tol`` of the printed
values (the paper prints 2 decimals and sometimes truncates). CivilComments T27 is known
not to reproduce from these files and is shown with ``--show_known`` only, not counted.
Exit status 1 when a counted row does not reproduce.
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import pandas as pd  # noqa: E402

from analysis.aotl import pairwise_table, per_ood_table  # noqa: E402
from analysis.aotl.inputs import read_accuracy_csvs  # noqa: E402
from oodutils import tables as report  # noqa: E402
from oodutils.cli import ArgumentParser, add_option  # noqa: E402

DEFAULT_DATA = REPO / "tests" / "data" / "aotl_reference"
STATS = ("slope", "intercept", "r", "p", "stderr")

# Published rows, transcribed from the paper (spec notes_000, section 4): (slope, intercept,
# R, p, stderr). Per-OOD tables are keyed by the OOD env; pairwise tables by (OOD, ID),
# i.e. the paper's "E_ood <- E_id".
# (table, data folder, dataset name in the CSVs, kind, --id_envs, rows)
PUBLISHED = [
    ("T5", "ColoredMNIST", "ColoredMNIST", "per-ood", None, {
        0: (1.90, -.58, .82, .00, .01), 1: (.96, .01, .94, .00, .00),
        2: (-1.56, .47, -.74, .00, .01)}),
    ("T6", "ColoredMNIST", "ColoredMNIST", "pairwise", None, {
        (0, 1): (1.23, -.12, .99, .00, .00), (0, 2): (-.73, .87, -.36, .00, .02),
        (1, 0): (.91, .04, .98, .00, .00), (1, 2): (.67, .16, .72, .00, .01),
        (2, 0): (-1.34, .53, -.82, .00, .01), (2, 1): (-1.65, .29, -.64, .00, .02)}),
    ("T7", "SpawriousO2O_easy", "SpawriousO2O_easy", "per-ood", None, {
        0: (.48, -.29, .74, .00, .04), 1: (1.05, -.13, .98, .00, .02),
        2: (.95, -.11, .97, .00, .02)}),
    ("T8", "SpawriousO2O_easy", "SpawriousO2O_easy", "pairwise", None, {
        (0, 1): (.50, -.33, .75, .00, .04), (0, 2): (.47, -.23, .72, .00, .04),
        (1, 0): (1.09, -.33, .93, .00, .04), (1, 2): (1.01, .11, .98, .00, .02),
        (2, 0): (.93, -.12, .94, .00, .03), (2, 1): (.94, -.02, .98, .00, .01)}),
    ("T9", "SpawriousO2O_hard", "SpawriousO2O_hard", "per-ood", None, {
        0: (.32, -.21, .50, .00, .05), 1: (.98, .06, .96, .00, .02),
        2: (.94, -.07, .96, .00, .02)}),
    ("T10", "SpawriousO2O_hard", "SpawriousO2O_hard", "pairwise", None, {
        (0, 1): (.32, -.23, .49, .00, .05), (0, 2): (.32, -.19, .50, .00, .04),
        (1, 0): (.90, .14, .89, .00, .04), (1, 2): (1.01, .12, .97, .00, .02),
        (2, 0): (.92, -.05, .93, .00, .03), (2, 1): (.92, .01, .97, .00, .02)}),
    ("T11", "SpawriousM2M_easy", "SpawriousM2M_easy", "per-ood", None, {
        0: (.34, .26, .60, .00, .01), 1: (.65, -.08, .95, .00, .00),
        2: (.65, .02, .93, .00, .00)}),
    ("T12", "SpawriousM2M_easy", "SpawriousM2M_easy", "pairwise", None, {
        (0, 1): (.35, .23, .61, .00, .01), (0, 2): (.32, .29, .58, .00, .01),
        (1, 0): (.64, -.09, .95, .00, .00), (1, 2): (.63, -.05, .94, .00, .00),
        (2, 0): (.67, -.02, .94, .00, .00), (2, 1): (.61, .08, .90, .00, .01)}),
    ("T13", "SpawriousM2M_hard", "SpawriousM2M_hard", "per-ood", None, {
        0: (.16, -.04, .29, .00, .01), 1: (.76, -.26, .94, .00, .01),
        2: (.66, -.10, .91, .00, .01)}),
    ("T14", "SpawriousM2M_hard", "SpawriousM2M_hard", "pairwise", None, {
        (0, 1): (.17, -.07, .33, .00, .01), (0, 2): (.14, -.02, .27, .00, .01),
        (1, 0): (.78, -.27, .95, .00, .00), (1, 2): (.73, -.23, .92, .00, .01),
        (2, 0): (.68, -.11, .92, .00, .01), (2, 1): (.62, -.08, .89, .00, .01)}),
    ("T15", "PACS", "PACS", "per-ood", [0, 1, 2], {
        0: (.74, -.31, .98, .00, .00), 1: (.68, -.68, .84, .00, .01),
        2: (1.00, .32, .86, .00, .01), 3: (.76, -.87, .86, .00, .01)}),
    ("T16", "PACS", "PACS", "pairwise", None, {
        (0, 1): (.71, -.10, .96, .00, .01), (0, 2): (.64, -.47, .91, .00, .01),
        (0, 3): (.64, .14, .90, .00, .01), (1, 0): (.75, -.59, .89, .00, .01),
        (1, 2): (.51, -.67, .71, .00, .01), (1, 3): (.71, -.29, .98, .00, .00),
        (2, 0): (1.04, .23, .87, .00, .01), (2, 1): (.90, .45, .82, .00, .02),
        (2, 3): (.78, .76, .75, .00, .02), (3, 0): (.76, -.79, .83, .00, .01),
        (3, 1): (.80, -.75, .92, .00, .01), (3, 2): (.50, -.83, .64, .00, .02)}),
    ("T1", "TerraIncognita", "TerraIncognita", "per-ood", [0, 1, 2], {
        1: (.83, -1.41, .74, .00, .02)}),
]

# CivilComments Table 27 (slope, intercept, R; p .00; se as printed). Known NOT to
# reproduce from the published CSVs, whatever the model pool (the 510 BERT/DistilBERT
# models, the 180 logistic-regression ones, or all 690) and whatever the ID-env average
# (all 15, or env indices 0-2 only). Shown for reference with --show_known.
KNOWN_NOT_REPRODUCIBLE = [
    ("T27", "CivilComments", "CivilComments", "per-ood", [0, 1, 2], {
        e: (s, i, r, .00, se) for e, (s, i, r, se) in enumerate([
            (.36, -.29, .28, .04), (-.49, .16, -.47, .03), (.39, -.17, .28, .04),
            (-.49, .12, -.42, .03), (.58, .20, .43, .04), (-.54, .00, -.43, .04),
            (.46, -.04, .30, .05), (-.50, .16, -.43, .03), (.49, .03, .36, .04),
            (-.49, .06, -.41, .03), (.53, .17, .34, .05), (-.57, -.09, -.46, .03),
            (.46, .05, .30, .05), (-.54, -.04, -.45, .03), (.41, -.10, .29, .04),
            (-.52, .06, -.43, .04)])}),
]


def _split_label(key):
    return f"E{key}" if isinstance(key, int) else f"E{key[0]}<-E{key[1]}"


def compare(data_dir=DEFAULT_DATA, tol=0.01, tables=PUBLISHED) -> pd.DataFrame:
    """One row per published row: ours, the paper's, the largest difference, whether it
    reproduces (every statistic within ``tol``)."""
    data_dir = Path(data_dir)
    cache, rows = {}, []
    for name, folder, dataset, kind, id_envs, published in tables:
        if folder not in cache:
            files = sorted((data_dir / folder).glob("env*_out_acc.csv*"))
            if not files:
                raise FileNotFoundError(f"no accuracy CSVs under {data_dir / folder}")
            cache[folder] = read_accuracy_csvs(files)
        acc = cache[folder]
        make = per_ood_table if kind == "per-ood" else pairwise_table
        ours = make(acc, id_envs=id_envs)
        ours = ours[ours["dataset"] == dataset]
        for key, paper in published.items():
            if kind == "per-ood":
                hit = ours[ours["ood_env"] == key]
            else:
                hit = ours[(ours["ood_env"] == key[0]) & (ours["id_envs"] == str(key[1]))]
            got = hit.iloc[0]
            row = {"table": name, "dataset": dataset, "split": _split_label(key),
                   "id_envs": got["id_envs"], "n": int(got["n"])}
            diffs = []
            for stat, value in zip(STATS, paper):
                row[stat] = float(got[stat])
                row[f"paper_{stat}"] = value
                diffs.append(abs(float(got[stat]) - value))
            row["max_diff"] = max(diffs)
            row["reproduced"] = bool(row["max_diff"] <= tol + 1e-9)
            rows.append(row)
    return pd.DataFrame(rows)


def main(argv=None):
    p = ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("data_dir", nargs="?", type=Path, default=DEFAULT_DATA)
    add_option(p, "--tol", type=float, default=0.01)
    add_option(p, "--format", choices=report.FORMATS, default="text")
    add_option(p, "--show_known", action="store_true",
                   help="also show CivilComments T27 (known not to reproduce)")
    args = p.parse_args(argv)
    if not args.data_dir.is_dir():
        print(f"error: no data directory {args.data_dir}", file=sys.stderr)
        return 2
    t0 = time.perf_counter()
    df = compare(args.data_dir, args.tol)
    elapsed = time.perf_counter() - t0
    cols = ["table", "dataset", "split", "n"]
    for s in STATS:
        cols += [s, f"paper_{s}"]
    cols += ["max_diff", "reproduced"]
    sys.stdout.write(report.render(df[cols], args.format, digits=2))
    bad = df[~df["reproduced"]]
    print(f"\n{len(df) - len(bad)}/{len(df)} published rows reproduced within {args.tol} "
          f"({elapsed:.2f} s to read the CSVs and fit every table)")
    for r in bad.itertuples():
        print(f"NOT reproduced: {r.table} {r.dataset} {r.split} (max diff {r.max_diff:.3f})")
    if args.show_known:
        known = compare(args.data_dir, args.tol, KNOWN_NOT_REPRODUCIBLE)
        print("\nKnown not to reproduce from these CSVs (not counted):")
        sys.stdout.write(report.render(known[cols], args.format, digits=2))
    return 1 if len(bad) else 0


if __name__ == "__main__":
    sys.exit(main())
