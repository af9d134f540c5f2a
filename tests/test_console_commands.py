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


def test_output_flags_have_one_name():
    """A folder is --output_dir, a file --output (or their hyphen spellings); an older
    name (--output-dir for a file, --root, --summary) is refused."""
    from analysis import oodselect_cli
    from ood_bench import cli as ood_cli
    oodselect = oodselect_cli.build_parser()
    quantify = ["quantify", "--features", "f.npz"]
    for flag in ("--output_dir", "--output-dir"):
        assert oodselect.parse_args(["--matrix", "a.npz", "--sizes", "5", flag, "d"]).out == "d"
    assert ood_cli.build_parser().parse_args(quantify + ["--output", "r"]).out == "r"
    from spawrious import splits_cli
    for parser, argv in ((ood_cli.build_parser(), quantify + ["--output-dir", "r"]),
                         (ood_cli.build_parser(), ["summarize", "--root", "r"]),
                         (splits_cli.build_parser(), ["--summary", "csv"])):
        with pytest.raises(SystemExit):
            parser.parse_args(argv)
