"""The `labelfree` command's outputs: the estimates, their error, the agreement lines and
the verdicts as CSV files, one plot per split, and the two tables printed."""
from __future__ import annotations

import argparse
import os

import pandas as pd

from analysis.labelfree import estimators as labelfree
from oodutils.csv_out import frame_csv
from oodutils.fileio import atomic_write_text, file_name_part
from oodutils.plotting import figure_and_axes, save_figure
from oodutils.tables import render


def plot_split(estimates: pd.DataFrame, dataset: str, env: int, path: str) -> None:
    """Estimated against true OOD accuracy of one split, one colour per method."""
    fig, ax = figure_and_axes(None, (5, 5))
    part = estimates[(estimates["dataset"] == dataset) & (estimates["env"] == env)]
    for method, rows in part.groupby("method"):
        ax.scatter(100 * rows["true_acc"], 100 * rows["estimated_acc"], s=12, label=method)
    ax.plot([0, 100], [0, 100], color="grey", linewidth=0.8)
    ax.set_xlabel("true OOD accuracy (%)")
    ax.set_ylabel("estimated OOD accuracy (%)")
    ax.set_title(f"{dataset}, env {env}")
    ax.legend(fontsize=7)
    save_figure(fig, path)


def run(args: argparse.Namespace) -> int:
    """The labelfree command on parsed (and checked) arguments."""
    checkpoints = labelfree.checkpoints_from_sweep(args.input_dir, args.all_steps)
    estimates, agreement = labelfree.estimate(checkpoints)
    n_models = estimates[estimates["method"] == "avg_conf"].groupby(
        ["dataset", "env"]).size().to_dict()
    summary = labelfree.summary(estimates)
    verdicts = labelfree.verdicts(agreement, n_models)
    os.makedirs(args.output_dir, exist_ok=True)
    for name, frame in (("estimates", estimates), ("summary", summary),
                        ("agreement", agreement), ("verdicts", verdicts)):
        atomic_write_text(os.path.join(args.output_dir, f"{name}.csv"), frame_csv(frame))
    for dataset, env in sorted(n_models):
        plot_name = f"estimates_{file_name_part(dataset)}_env{env}.png"
        plot_split(estimates, dataset, env, os.path.join(args.output_dir, plot_name))
    print(render(summary, "text", title="Mean absolute error (points)"))
    print(render(verdicts, "text", title="Can label-free estimation be trusted here?"))
    print(f"wrote {args.output_dir}/estimates.csv, summary.csv, agreement.csv, verdicts.csv")
    return 0
