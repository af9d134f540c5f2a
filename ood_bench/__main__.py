"""python -m ood_bench COMMAND ... (see ood_bench.cli)."""
from __future__ import annotations

import sys

from ood_bench.cli import main
from oodutils.errors import run_cli

if __name__ == "__main__":
    sys.exit(run_cli(main))
