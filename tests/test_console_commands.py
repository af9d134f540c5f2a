"""The console commands of pyproject's [project.scripts]: each resolves to a `cli` that
wraps the module's `main`, and each `--help` ends with an example."""
import importlib
import sys

import pytest

from tests.toml_files import pyproject

SCRIPTS = pyproject()["project"]["scripts"]
REQUIRED = {"domainbed-train", "domainbed-sweep", "domainbed-collect-results",
            "domainbed-download", "aotl", "oodselect", "ood-bench", "spawrious-generate"}


def test_required_commands_are_declared():
    assert REQUIRED <= set(SCRIPTS)


@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_help_has_an_example(name, monkeypatch, capsys):
    module_name, attr = SCRIPTS[name].split(":")
    entry = getattr(importlib.import_module(module_name), attr)
    monkeypatch.setattr(sys, "argv", [name, "--help"])
    with pytest.raises(SystemExit) as exit_info:
        entry()
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    assert "example:" in out and f"  {name} " in out, out[-400:]


def test_command_errors_are_one_line(monkeypatch, capsys):
    module_name, attr = SCRIPTS["domainbed-train"].split(":")
    entry = getattr(importlib.import_module(module_name), attr)
    monkeypatch.setattr(sys, "argv", ["domainbed-train", "--dataset", "NoSuchDataset"])
    with pytest.raises(SystemExit) as exit_info:
        entry()
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: unknown dataset"), err


@pytest.mark.parametrize("flag", ["--out", "--output", "--output-dir"])
def test_output_flag_aliases(flag):
    """One spelling (--output), the older ones kept: the issues' commands still parse."""
    from analysis.oodselect import cli as oodselect_cli
    from ood_bench import cli as ood_cli
    args = oodselect_cli.build_parser().parse_args(["--matrix", "a.npz", "--sizes", "5",
                                                    flag, "d"])
    assert args.out == "d"
    args = ood_cli.build_parser().parse_args(["quantify", "--features", "f.npz", flag, "r"])
    assert args.out == "r"
