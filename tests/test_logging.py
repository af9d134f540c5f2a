"""Logging and figures across the packages: one logger per package printing bare lines on
stderr by default (the lines the project always printed), -v / -q on the CLIs, project
warnings filterable through `warnings`; no library code picks a matplotlib backend, and
plotting functions draw on a caller's `ax=` and return the Figure."""
import ast
import json
import logging
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

from oodutils import log
from tests.test_records import record, write_run

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("oodutils", "domainbed", "analysis", "ood_bench", "spawrious")


def test_library_messages_are_bare_stderr_lines(capsys):
    logger = log.get_logger("domainbed.some.module")
    logger.info("notice: a notice")
    logger.debug("detail")
    logger.warning("warning: a warning")
    assert capsys.readouterr().err == "notice: a notice\nwarning: a warning\n"
    # one logger per package: every module's records go through its package's logger
    # (pytest >= 9.2 adds capture handlers of its own to every logger: count only ours)
    assert own_handlers("domainbed") == [log._DEFAULT_HANDLERS["domainbed"]]
    assert not own_handlers("domainbed.some.module")


def own_handlers(name):
    return [h for h in logging.getLogger(name).handlers if isinstance(h, log.StderrHandler)]


class Collect(logging.Handler):
    """An application's own handler on the root logger."""

    def __init__(self):
        super().__init__()
        self.messages = []

    def emit(self, record):
        self.messages.append(record.getMessage())


@pytest.mark.parametrize("verbosity, shown", [
    (-2, ["E"]), (-1, ["W", "E"]), (0, ["I", "W", "E"]), (1, ["D", "I", "W", "E"]),
    (5, ["D", "I", "W", "E"]), (-9, ["E"])])
def test_configure_sets_every_package(capsys, verbosity, shown):
    log.configure(verbosity)
    for package in PACKAGES:
        logger = log.get_logger(f"{package}.x")
        logger.debug("D")
        logger.info("I")
        logger.warning("W")
        logger.error("E")
        assert capsys.readouterr().err.split() == shown, package


def test_an_application_can_take_the_records(capsys):
    application = Collect()
    logging.getLogger().addHandler(application)
    log.propagate_to_root(["spawrious"])
    try:
        log.get_logger("spawrious.generate").info("cell done")
        assert capsys.readouterr().err == ""            # no bare copy of our own
        assert application.messages == ["cell done"]
        assert not own_handlers("spawrious")
    finally:
        logging.getLogger().removeHandler(application)
        logging.getLogger("spawrious").addHandler(log._DEFAULT_HANDLERS["spawrious"])
        logging.getLogger("spawrious").propagate = False


def test_cli_flags(tmp_path, capsys):
    from domainbed.scripts import collect_results
    write_run(tmp_path / "a", [record(0), record(100)])
    write_run(tmp_path / "b", [record(0, trial_seed=1)], done=False)   # skipped: warned
    argv = ["--input_dir", str(tmp_path), "--no_save"]

    def err(*flags):
        collect_results.main(argv + list(flags))
        captured = capsys.readouterr()
        assert captured.out.startswith("Total records: 2\n")        # stdout never changes
        return captured.err

    default = err()
    assert default.startswith("warning: skipped 1 run without") and "read 2 records" not in default
    warnings = "".join(line for line in default.splitlines(True)
                       if not line.startswith("notice:"))   # (what an X cell means)
    assert err("-q") == warnings                   # -q: warnings and errors still shown
    assert err("-qq") == ""                        # -qq: errors only
    assert "read 2 records from 1 run(s)" in err("-v")
    assert err("--quiet", "--quiet") == ""


def test_quiet_hides_notices(tmp_path, capsys):
    from analysis.aotl import cli as aotl_cli
    write_run(tmp_path / "runs" / "a", [record(0), record(100)])
    args = [str(tmp_path / "runs"), "--export-csv", str(tmp_path / "out")]
    aotl_cli.main(args)
    assert capsys.readouterr().err.startswith("wrote 1 accuracy CSV file(s)")
    aotl_cli.main(args + ["-q"])
    assert capsys.readouterr().err == ""


@pytest.mark.slow
def test_cli_help_lists_the_flags():
    for module in ("domainbed.scripts.collect_results", "domainbed.scripts.train",
                   "analysis.aotl", "analysis.oodselect", "spawrious.generate",
                   "spawrious.splits", "ood_bench.quantify"):
        proc = subprocess.run([sys.executable, "-m", module, "--help"], cwd=ROOT,
                              capture_output=True, text=True)
        assert proc.returncode == 0 and "-v, --verbose" in proc.stdout, module
        assert "-q, --quiet" in proc.stdout, module
    proc = subprocess.run([sys.executable, "-m", "ood_bench", "run", "--help"], cwd=ROOT,
                          capture_output=True, text=True)
    assert "-v, --verbose" in proc.stdout


def test_train_logging_flags_are_not_run_identity():
    from domainbed.scripts.train import parse_args
    args = parse_args(["-v", "--dataset", "ColoredMNIST"])
    assert not {"verbose", "quiet"} & set(vars(args))


def test_project_warnings_are_filterable_and_shown_as_lines(capsys):
    from ood_bench.data import balance

    class Side:
        def __init__(self, y):
            self.y = np.array(y)

        def take(self, keys):
            return Side(self.y[keys])

    p, q = Side([0, 0, 1, 1]), Side([0, 0, 2, 2])
    with pytest.warns(log.ProjectWarning, match=r"classes \[1, 2\] appear on one side only"):
        balance(p, q, np.random.default_rng(0))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", log.ProjectWarning)    # a caller filters them
        balance(p, q, np.random.default_rng(0))
        assert capsys.readouterr().err == ""
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        log.configure(0)                                       # what a CLI does
        balance(p, q, np.random.default_rng(0))
        assert capsys.readouterr().err.startswith(
            "warning: classes [1, 2] appear on one side only")
        log.configure(-2)
        balance(p, q, np.random.default_rng(0))
        assert capsys.readouterr().err == ""


# --- figures --------------------------------------------------------------------------

def test_no_library_code_picks_a_backend():
    offenders = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and \
                        node.func.attr in ("use", "switch_backend"):
                    owner = node.func.value
                    if isinstance(owner, ast.Name) and owner.id in ("matplotlib", "plt"):
                        offenders.append(f"{path.relative_to(ROOT)}:{node.lineno}")
                if isinstance(node, (ast.Import, ast.ImportFrom)):
                    names = [a.name for a in node.names]
                    module = getattr(node, "module", None) or ""
                    if "matplotlib.pyplot" in names or module == "matplotlib.pyplot" or (
                            module == "matplotlib" and "pyplot" in names):
                        offenders.append(f"{path.relative_to(ROOT)}:{node.lineno} pyplot")
    assert offenders == []


def test_plots_leave_the_backend_alone(tmp_path):
    code = f"""
import json, sys, matplotlib
before = dict.__getitem__(matplotlib.rcParams, "backend")
import numpy as np, pandas as pd
from analysis.oodselect import report as rep
from ood_bench import figures
rep.plot_probit_scatter(np.linspace(.5, .9, 8), np.linspace(.4, .8, 8), np.linspace(.3, .9, 8),
                        {str(tmp_path / 'a.png')!r}, n=3)
figures.plot_heatmap({{"kind": "rho", "values": [0.1, 0.9], "grid": [[0, 1], [1, 0]]}},
                     {str(tmp_path / 'b.png')!r})
after = dict.__getitem__(matplotlib.rcParams, "backend")
print(json.dumps([str(before) == str(after), "matplotlib.pyplot" in sys.modules]))
"""
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                          text=True, check=True)
    assert json.loads(proc.stdout) == [True, False]
    assert (tmp_path / "a.png").read_bytes()[:4] == b"\x89PNG"


def test_plotting_functions_draw_on_ax_and_return_the_figure(tmp_path):
    from matplotlib.figure import Figure

    from analysis import aotl
    from analysis.aotl.inputs import read_accuracy_csvs
    from analysis.oodselect import report as rep
    from tests.test_aotl import synthetic_models, write_csv
    acc = read_accuracy_csvs([write_csv(tmp_path / "toy.csv", synthetic_models(n=40), 2)])
    import pandas as pd
    summary = pd.DataFrame({"method": ["ours", "ours", "random", "random"],
                            "n": [5, 10, 5, 10], "r_test": [-0.5, -0.3, 0.4, 0.5]})
    y = np.linspace(0.5, 0.9, 10)
    calls = [lambda ax: aotl.plot_split(acc, "Toy", 2, ax=ax),
             lambda ax: rep.plot_correlation_vs_size(summary, ax=ax),
             lambda ax: rep.plot_probit_scatter(y, y - 0.1, y - 0.2, n=3, ax=ax)]
    for draw in calls:
        fig = Figure()
        ax = fig.add_subplot()
        assert draw(ax) is fig and (ax.lines or ax.collections)
        own = draw(None)                        # no ax: a new Figure, not saved anywhere
        assert isinstance(own, Figure) and own is not fig and own.axes
    path = tmp_path / "s.png"
    assert isinstance(aotl.plot_split(acc, "Toy", 2, path), Figure) and path.stat().st_size
