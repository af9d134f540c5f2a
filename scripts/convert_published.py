"""Convert DomainBed's published results.tex into the leaderboard's data file.

    python scripts/convert_published.py [--tex tests/data/domainbed_published/results.tex]
        [--out domainbed/leaderboard/data/domainbed_2020.json]
"""
import argparse
from pathlib import Path

from domainbed.leaderboard.published import dumps_source, parse_results_tex
from oodutils.errors import UserError, run_cli
from oodutils.fileio import atomic_write_text

REPO = Path(__file__).resolve().parents[1]
SOURCE = {
    "short": "DomainBed 2020",
    "id": "domainbed_2020",
    "title": "DomainBed published results (commit 7df6f06, 2020-10-06)",
    "citation": "Gulrajani & Lopez-Paz, In Search of Lost Domain Generalization, ICLR 2021",
    "url": "https://github.com/facebookresearch/DomainBed/blob/main/domainbed/results/"
           "2020_10_06_7df6f06/results.tex",
    "licence": "MIT (Copyright (c) Facebook, Inc. and its affiliates); see "
               "LICENSE-DomainBed",
    "metric": "accuracy",
    "note": "Converted from DomainBed's results.tex by scripts/convert_published.py; "
            "mean +/- standard error over 3 trials, percent.",
}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tex", default=str(REPO / "tests" / "data" / "domainbed_published" /
                                        "results.tex"))
    p.add_argument("--out", default=str(REPO / "domainbed" / "leaderboard" / "data" /
                                        "domainbed_2020.json"))
    args = p.parse_args(argv)
    try:
        text = Path(args.tex).read_text(encoding="utf-8")
    except OSError as e:
        raise UserError(f"cannot read {args.tex}: {e.strerror}") from None
    rows = parse_results_tex(text)
    atomic_write_text(args.out, dumps_source(SOURCE, rows))
    print(f"wrote {len(rows)} rows to {args.out}")
    return 0


if __name__ == "__main__":
    run_cli(main)
