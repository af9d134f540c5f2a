"""python -m ood_bench COMMAND ... (see ood_bench.cli)."""
import sys

from domainbed.errors import run_cli
from ood_bench.cli import main

if __name__ == "__main__":
    sys.exit(run_cli(main))
