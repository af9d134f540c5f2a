"""Draw the simulation figures of Salaudeen et al. 2025 ("Are Domain Generalization
Benchmarks with Accuracy on the Line Misspecified?") (PNG) from analysis.theory.

    python scripts/theory_figures.py --output_dir figures/theory

Figure 2 (a: train at M = I, b: extrapolation, c: interpolation): OOD accuracy of the
domain-specific classifier f_X and the domain-general f_dg against the shift
w_spu^T M mu_spu, with Theorem 1's region shaded. Figure 3: ID vs OOD accuracy on probit
axes for random M_OOD, M_OOD = a I with a > 0 (accuracy on the line) and a < 0 (the inverse
line). Also writes the simulated numbers as CSV beside the images.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import matplotlib  # noqa: E402

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from analysis import plots, theory  # noqa: E402
from analysis.aotl.stats import transform  # noqa: E402
from oodutils.accuracy import THEORY_CLIP  # noqa: E402
from oodutils.cli import ArgumentParser, add_option  # noqa: E402
from oodutils.csv_out import frame_csv  # noqa: E402
from oodutils.errors import UserError, run_cli  # noqa: E402
from oodutils.fileio import atomic_write_text  # noqa: E402

PANELS = {"identity": "(a) train at M = I",
          "extrapolation": "(b) extrapolation (PD training mixture)",
          "interpolation": "(c) interpolation (PD + ND training mixture)"}


def draw_figure2(frames, path):
    fig, axes = plt.subplots(1, len(frames), figsize=(5 * len(frames), 4), squeeze=False)
    for ax, (setting, df) in zip(axes[0], frames.items()):
        d = df.sort_values("shift")
        ax.scatter(d["shift"], d["acc_x"], s=14, label="f_X (all features)", color="tab:red")
        ax.scatter(d["shift"], d["acc_dg"], s=14, label="f_dg (domain-general)",
                   color="tab:blue")
        if d["thm1"].any():
            lo, hi = d.loc[d["thm1"], "shift"].min(), d.loc[d["thm1"], "shift"].max()
            ax.axvspan(lo, hi, color="tab:green", alpha=0.08, label="Theorem 1 holds")
        ax.axvline(0.0, color="grey", lw=0.8, ls="--")
        ax.set_xlabel(r"$w_{spu}^\top M \mu_{spu}$")
        ax.set_ylabel("OOD accuracy")
        ax.set_title(PANELS[setting])
        ax.set_ylim(-0.02, 1.02)
        ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    plots.save(fig, path)


def draw_figure3(results, path):
    fig, axes = plt.subplots(1, len(results), figsize=(4.5 * len(results), 4), squeeze=False)
    for ax, (title, (df, fit)) in zip(axes[0], results.items()):
        ax.scatter(df["probit_id"], df["probit_ood"], s=14)
        lo, hi = df["probit_id"].min(), df["probit_id"].max()
        plots.fit_line(ax, fit["slope"], fit["intercept"], lo, hi, color="k",
                       label=f"slope {fit['slope']:.2f}, R {fit['R']:.2f}")
        both = np.r_[df["probit_id"], df["probit_ood"]]
        plots.identity_line(ax, both.min(), both.max())
        plots.accuracy_axes(ax, transform, "probit", clip=THEORY_CLIP)
        ax.set_xlabel("ID accuracy (probit scale)")
        ax.set_ylabel("OOD accuracy (probit scale)")
        ax.set_title(title)
        ax.legend(fontsize=8)
    fig.tight_layout()
    plots.save(fig, path)


def main(argv=None):
    parser = ArgumentParser(description=__doc__.split("\n\n")[0])
    add_option(parser, "--output", "--output_dir", "--out", dest="output_dir",
                        default="theory_figures")
    add_option(parser, "--seed", type=int, default=1234)
    add_option(parser, "--n_test", type=int, default=50, help="test shifts per Fig. 2 panel")
    add_option(parser, "--n_samples", type=int, default=1000, help="samples per domain")
    add_option(parser, "--n_classifiers", type=int, default=50, help="classifiers in Fig. 3")
    add_option(parser, "--a_positive", type=float, default=2.0)
    add_option(parser, "--a_negative", type=float, default=-1.0)
    add_option(parser, "--delta", type=float, default=0.5, help="Theorem 1's delta")
    add_option(parser, "--label_noise", type=float, default=0.0,
                        help="0.25 mimics the authors' code")
    args = parser.parse_args(argv)
    if args.a_positive <= 0 or args.a_negative >= 0:
        raise UserError("--a_positive must be > 0 and --a_negative < 0")
    if not 0 < args.delta < 1:
        raise UserError("--delta must lie in (0, 1)")
    os.makedirs(args.output_dir, exist_ok=True)

    frames = {s: theory.simulate_figure2(s, n_test=args.n_test, n=args.n_samples,
                                         seed=args.seed, delta=args.delta,
                                         label_noise=args.label_noise)
              for s in theory.FIGURE2_SETTINGS}
    for setting, df in frames.items():
        atomic_write_text(os.path.join(args.output_dir, f"figure2_{setting}.csv"),
                          frame_csv(df.drop(columns=["M"])))
    path2 = os.path.join(args.output_dir, "figure2.png")
    draw_figure2(frames, path2)

    runs = {"random M_OOD": None, f"M_OOD = {args.a_positive:g} I": args.a_positive,
            f"M_OOD = {args.a_negative:g} I": args.a_negative}
    results = {title: theory.simulate_figure3(a, n_classifiers=args.n_classifiers,
                                              n=args.n_samples, seed=args.seed,
                                              label_noise=args.label_noise)
               for title, a in runs.items()}
    for i, (df, _) in enumerate(results.values()):
        atomic_write_text(os.path.join(args.output_dir, f"figure3_panel{i}.csv"), frame_csv(df))
    path3 = os.path.join(args.output_dir, "figure3.png")
    draw_figure3(results, path3)

    for setting, df in frames.items():
        held = df[df["thm1"]]
        print(f"figure 2 {setting}: {len(df)} shifts, f_dg wins on {int(df['dg_wins'].sum())}; "
              f"Theorem 1 holds on {len(held)}, f_dg wins on "
              f"{int(held['dg_wins'].sum())} of them; Theorem 2 agrees on "
              f"{int((df['thm2'] == df['dg_wins']).sum())}")
    for title, (_, fit) in results.items():
        print(f"figure 3 {title}: slope {fit['slope']:.2f}, R {fit['R']:.2f}")
    print(f"wrote {path2} and {path3}")
    return 0


if __name__ == "__main__":
    run_cli(main)
