"""The `labelfree` command (``python -m analysis.labelfree``): estimate each model's OOD
accuracy without OOD labels from a sweep's saved logits, and say where that can be trusted.

    python -m analysis.labelfree --input_dir SWEEP [SWEEP ...] --output_dir DIR
        [--all_steps]

Writes DIR/estimates.csv (run, step, dataset, env, method, estimated_acc, true_acc),
DIR/summary.csv (mean absolute error per dataset, OOD environment and method),
DIR/agreement.csv (the agreement line per split), DIR/verdicts.csv (trust or not, and
why) and DIR/estimates_<dataset>_env<k>.png (the dataset name made file-safe). The sweep
must have saved logits (`--save_logits` on train or sweep).
"""
import argparse
import os
import sys

from oodutils.cli import (
    ArgumentParser,
    add_logging_flags,
    add_option,
    check_directories,
    configure_logging,
)
from oodutils.errors import epilog_example, run_cli
from oodutils.plotting import figure_and_axes, save_figure

EPILOG = epilog_example("labelfree", "analysis.labelfree",
                        "--input_dir sweeps/zoo --output_dir labelfree/")


def build_parser():
    p = ArgumentParser(prog="labelfree", description=__doc__.split("\n\n")[0],
                       epilog=EPILOG,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    add_option(p, "--input_dir", nargs="+", required=True,
               help="sweep directories whose runs saved logits")
    add_option(p, "--output_dir", required=True, help="where the tables and plots go")
    add_option(p, "--all_steps", action="store_true",
               help="every checkpoint with logits, not only each run's last")
    add_logging_flags(p)
    return p


def plot_split(estimates, dataset, env, path):
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


def main(argv=None):
    args = build_parser().parse_args(argv)
    configure_logging(args)
    check_directories(args.input_dir)
    from analysis import labelfree
    from oodutils.csv_out import frame_csv
    from oodutils.fileio import atomic_write_text, check_output_path, file_name_part
    check_output_path(args.output_dir, "--output_dir", directory=True)
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
    from oodutils.tables import render
    print(render(summary, "text", title="Mean absolute error (points)"))
    print(render(verdicts, "text", title="Can label-free estimation be trusted here?"))
    print(f"wrote {args.output_dir}/estimates.csv, summary.csv, agreement.csv, verdicts.csv")
    return 0


def cli():
    """The `labelfree` console command ([project.scripts])."""
    sys.exit(run_cli(main))


if __name__ == "__main__":
    run_cli(main)
