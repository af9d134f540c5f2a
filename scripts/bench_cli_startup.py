"""How fast every console command answers `--help`: the median wall time of N runs per
command (a fresh interpreter each, as the installed command would start), with the
machine's load average before and after.

    python scripts/bench_cli_startup.py [--runs 5] [--commands aotl oodselect ...]
        [--repo OTHER_CHECKOUT]

The commands are pyproject's [project.scripts], each started as its entry point
(`module:function`) from this checkout (or --repo, to compare with another tree), so the
figures are that tree's, not an installed copy's.
"""
import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # Python 3.10: the backport (docs and test extras)
    import tomli as tomllib

REPO = Path(__file__).resolve().parents[1]


def entry_points(repo):
    return tomllib.loads((repo / "pyproject.toml").read_text())["project"]["scripts"]


def time_help(entry, name, runs, repo=REPO):
    """Seconds of each of `runs` `name --help` runs, started as `entry`."""
    module, attr = entry.split(":")
    code = f"import sys; sys.argv = [{name!r}, '--help']; from {module} import {attr}; {attr}()"
    seconds = []
    for _ in range(runs):
        start = time.perf_counter()
        proc = subprocess.run([sys.executable, "-c", code], cwd=repo, capture_output=True)
        seconds.append(time.perf_counter() - start)
        if proc.returncode != 0:
            raise SystemExit(f"error: {name} --help exited {proc.returncode}: "
                             f"{proc.stderr.decode()[-300:]}")
    return seconds


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--commands", nargs="+", default=None)
    parser.add_argument("--repo", type=Path, default=REPO, help="checkout to time")
    args = parser.parse_args(argv)
    scripts = entry_points(args.repo)
    names = args.commands or sorted(scripts)
    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}; "
          f"{os.cpu_count()} CPUs; {args.runs} runs each")
    print(f"{'command':28s} {'median s':>9s} {'min s':>7s} {'max s':>7s}")
    for name in names:
        seconds = time_help(scripts[name], name, args.runs, args.repo)
        print(f"{name:28s} {statistics.median(seconds):9.2f} {min(seconds):7.2f} "
              f"{max(seconds):7.2f}", flush=True)
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
