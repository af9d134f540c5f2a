"""One option dialect in every console command (issue 23, item 3): each long option is
spelled DomainBed's way (``--output_dir``), its hyphen twin and older names are accepted
but hidden from --help, and one idea has one name across commands. And fast commands
(item 7): --help and argument errors answer before torch, torchvision, pandas or scipy."""
import argparse
import importlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

from oodutils import cli as oodcli
from tests.toml_files import pyproject

REPO = Path(__file__).resolve().parents[1]
SCRIPTS = pyproject()["project"]["scripts"]
HEAVY = ("torch", "torchvision", "pandas", "scipy")

# Older or other spellings of one idea -> the canonical names allowed for it. `--out` and
# `--output-dir` named both an output folder and an output file in older releases.
SPELLINGS = {
    "--data-dir": {"--data_dir"}, "--root": {"--data_dir", "--input_dir"},
    "--input-dir": {"--input_dir"}, "--input": {"--input_dir"},
    "--out": {"--output_dir", "--output"}, "--output-dir": {"--output_dir", "--output"},
    "--output": {"--output_dir", "--output"}, "--outdir": {"--output_dir"},
    "--summary": {"--format"}, "--workers": {"--max_workers", "--workers"},
    "--n-trials": {"--n_trials"}, "--id-envs": {"--id_envs"}, "--ood-env": {"--ood_env"},
    "--include-unfinished": {"--include_unfinished"}, "--batch-size": {"--batch_size"},
    "--holdout-fraction": {"--holdout_fraction"}, "--data-seed": {"--data_seed"},
}
NEVER_CANONICAL = {"--out", "--root", "--summary", "--input", "--outdir"}


class _Captured(BaseException):
    """Raised instead of parsing: carries the command's parser out of its entry point."""


def command_parser(name, monkeypatch, argv0=None):
    """The parser the console command `name` builds, caught at its first parse (run as
    `argv0`, by default its own name)."""
    def capture(self, args=None, namespace=None):
        raise _Captured(self)
    monkeypatch.setattr(oodcli.ArgumentParser, "parse_known_args", capture)
    monkeypatch.setattr(sys, "argv", [argv0 or name])
    module_name, attr = SCRIPTS[name].split(":")
    entry = getattr(importlib.import_module(module_name), attr)
    with pytest.raises(_Captured) as caught:
        entry()
    return caught.value.args[0]


def all_parsers(parser, path=()):
    """(command path, parser) for the parser and every subcommand's parser."""
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub_name, sub in action.choices.items():
                yield from all_parsers(sub, path + (sub_name,))


def long_options(parser):
    """(action, canonical spelling, hidden spellings) of each long option but --help."""
    for action in parser._actions:
        shown = [s for s in action.option_strings if s.startswith("--")]
        if shown and shown[0] != "--help":
            yield action, shown, oodcli.hidden_aliases(parser, action)


@pytest.fixture(scope="module")
def parsers():
    found = {}
    with pytest.MonkeyPatch.context() as monkeypatch:
        for name in sorted(SCRIPTS):
            for path, parser in all_parsers(command_parser(name, monkeypatch)):
                found[" ".join((name,) + path)] = parser
    return found


def test_every_command_uses_the_dialect_parser(parsers):
    commands = {key.split()[0] for key in parsers}
    assert commands == set(SCRIPTS)
    assert all(isinstance(p, oodcli.ArgumentParser) for p in parsers.values())


def test_every_long_option_is_underscore_style_with_a_hidden_hyphen_twin(parsers):
    bad, missing, shown = [], [], []
    for command, parser in parsers.items():
        help_text = parser.format_help()
        for action, spellings, hidden in long_options(parser):
            for spelling in spellings:
                if "-" in spelling[2:]:
                    bad.append(f"{command}: {spelling}")
                twin = "--" + spelling[2:].replace("_", "-")
                if twin != spelling and parser._option_string_actions.get(twin) is not action:
                    missing.append(f"{command}: {twin}")
            shown += [f"{command}: {h}" for h in hidden
                      if any(f"{h}{end}" in help_text for end in (" ", "\n", ",", "]", "="))]
    assert bad == [] and missing == [] and shown == []


def test_one_idea_one_name_across_commands(parsers):
    wrong = []
    for command, parser in parsers.items():
        for _, spellings, hidden in long_options(parser):
            canonical = spellings[0]
            if canonical in NEVER_CANONICAL:
                wrong.append(f"{command}: {canonical} is shown")
            for spelling in [canonical, *hidden]:
                allowed = SPELLINGS.get(spelling)
                if allowed is not None and canonical not in allowed:
                    wrong.append(f"{command}: {spelling} means {canonical}")
    assert wrong == []


def test_the_shared_names_are_where_the_issue_says(parsers):
    def options(command):
        return {s for _, spellings, _ in long_options(parsers[command]) for s in spellings}
    for command in ("domainbed-train", "domainbed-sweep", "domainbed-download",
                    "aotl-study", "ood-bench extract"):
        assert "--data_dir" in options(command), command
    for command in ("domainbed-collect-results", "domainbed-list-top-hparams",
                    "domainbed-leaderboard", "oodselect", "benchmark-validity report"):
        assert "--input_dir" in options(command), command
    for command in ("domainbed-train", "domainbed-sweep", "domainbed-leaderboard", "oodselect",
                    "aotl-study", "ood-bench run", "spawrious-generate"):
        assert "--output_dir" in options(command), command
    for command in ("domainbed-collect-results", "aotl", "benchmark-validity report",
                    "spawrious-splits"):
        assert "--format" in options(command), command



def test_every_command_names_itself_in_its_usage(monkeypatch):
    """Each parser's prog is its console command, whatever sys.argv[0] is (under MkDocs,
    `mkdocs`): the generated reference's usage lines name their commands (issue 43, 4)."""
    progs = {name: command_parser(name, monkeypatch, argv0="mkdocs").prog for name in SCRIPTS}
    assert {name: prog for name, prog in progs.items() if prog != name} == {}


def _one_line_error(parser, argv, capsys):
    with pytest.raises(SystemExit) as exit_info:
        parser.parse_args(argv)
    assert exit_info.value.code == 2
    return capsys.readouterr().err.strip().splitlines()


def test_a_mistyped_flag_is_one_line_naming_the_closest_option(parsers, capsys):
    """Every command: one line naming the flag and the nearest valid one, then where
    --help is; never argparse's usage block (issue 43, item 5)."""
    for command, parser in parsers.items():
        flag = next((s for _, spellings, _ in long_options(parser) for s in spellings
                     if len(s) > 6), "--verbose")   # a parser of subcommands only: -v's
        typo = flag[:3] + flag[4] + flag[3] + flag[5:]   # two letters swapped
        err = _one_line_error(parser, [typo], capsys)
        assert len(err) == 1, (command, err)
        assert f"unrecognized option {typo} (did you mean " in err[0], (command, err)
        assert err[0].endswith(f"; see {parser.prog} --help"), (command, err)


def test_the_mistyped_flag_comes_before_a_missing_required_option(parsers, capsys):
    err = _one_line_error(parsers["domainbed-collect-results"], ["--input_dri", "x"], capsys)
    assert err == ["domainbed-collect-results: error: unrecognized option --input_dri (did "
                   "you mean --input_dir?); see domainbed-collect-results --help"]
    err = _one_line_error(parsers["domainbed-collect-results"], ["--format", "md"], capsys)
    assert len(err) == 1 and "invalid choice: 'md'" in err[0] and "usage" not in err[0]
    # a negative number and an abbreviation are not mistakes
    parser = parsers["aotl"]
    assert parser.parse_args(["p", "--id", "-1"]).id_envs == [-1]


def test_one_default_data_folder_for_every_command(parsers):
    """--data_dir defaults to where the README's tour puts data (issue 43, item 8), and
    --help says so."""
    wrong = {}
    for command, parser in parsers.items():
        action = parser._option_string_actions.get("--data_dir")
        if action is None or command == "spawrious-splits":   # optional there: counts only
            continue
        if action.default != oodcli.DEFAULT_DATA_DIR or action.required or \
                "default: data" not in (action.help or ""):
            wrong[command] = (action.default, action.required, action.help)
        if f"--data_dir {action.metavar or 'DATA_DIR'}" not in parser.format_help():
            wrong[command] = "not in --help"
    assert oodcli.DEFAULT_DATA_DIR == "data" and wrong == {}
    from domainbed.training.config import RunConfig
    assert RunConfig().data_dir == "data"


def test_older_spellings_parse_to_the_same_option():
    from analysis.aotl import options as aotl_options
    from analysis.oodselect import cli as oodselect_cli
    from domainbed.training import config
    from ood_bench import cli as ood_cli
    parse = oodselect_cli.build_parser().parse_args
    for flag in ("--output_dir", "--output-dir", "--out", "--output"):
        assert parse(["--matrix", "m.npz", flag, "d"]).out == "d"
    assert parse(["--matrix", "m.npz", "--out", "d", "--input-dir", "a", "b",
                  "--id-envs", "0", "1"]).input_dir == ["a", "b"]
    assert parse(["--matrix", "m.npz", "--out=d", "--split", "arch"]).split == "arch"
    args = ood_cli.build_parser().parse_args(
        ["run", "--dataset", "ColoredMNIST", "--data-dir", "x", "--envs-p", "0",
         "--envs_q", "1", "--output-dir", "o", "--n-trials", "2", "--no-pretrained"])
    assert (args.data_dir, args.output_dir, args.n_trials, args.pretrained) == ("x", "o", 2,
                                                                                False)
    train = config.build_parser().parse_args(["--test-envs", "1", "2", "--output-dir", "o"])
    assert train.test_envs == [1, 2] and train.output_dir == "o"
    # an abbreviation that named one option still does, hidden twins notwithstanding
    assert aotl_options.build_parser().parse_args(["p", "--id", "0"]).id_envs == [0]


def test_an_error_names_the_canonical_spelling(capsys):
    from analysis.oodselect import cli as oodselect_cli
    with pytest.raises(SystemExit) as exit_info:
        oodselect_cli.build_parser().parse_args(["--matrix", "m.npz"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "--output_dir" in err and "--out," not in err and "--output-dir" not in err


def test_add_option_refuses_a_hyphen_canonical_and_a_taken_alias():
    parser = oodcli.ArgumentParser()
    with pytest.raises(ValueError, match="underscore"):
        oodcli.add_option(parser, "--output-dir")
    oodcli.add_option(parser, "--out_file")
    with pytest.raises(ValueError, match="already an option"):
        oodcli.add_option(parser, "--output_dir", "--out-file")


# ------------------------------------------------------------------ fast commands
PROBE = """
import atexit, json, sys
atexit.register(lambda: print("LOADED " + json.dumps(
    [m for m in {heavy!r} if m in sys.modules]), file=sys.stderr))
sys.argv = [{name!r}] + {argv!r}
from {module} import {attr} as entry
entry()
"""


def run_command(name, argv):
    module, attr = SCRIPTS[name].split(":")
    code = PROBE.format(heavy=HEAVY, name=name, argv=argv, module=module, attr=attr)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=REPO, timeout=300)
    loaded = [line for line in proc.stderr.splitlines() if line.startswith("LOADED ")]
    assert loaded, proc.stderr[-2000:]
    return proc, json.loads(loaded[-1][len("LOADED "):])


@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_help_and_a_bad_flag_answer_before_heavy_imports(name):
    proc, loaded = run_command(name, ["--help"])
    assert proc.returncode == 0 and "usage:" in proc.stdout, proc.stderr[-2000:]
    assert loaded == [], f"{name} --help imported {loaded}"
    proc, loaded = run_command(name, ["--no_such_flag"])
    assert proc.returncode == 2 and "error:" in proc.stderr, proc.stderr[-2000:]
    assert loaded == [], f"{name} with a bad flag imported {loaded}"


def test_the_probe_sees_a_heavy_import():
    """The check above can fail: a command that imports pandas is caught."""
    SCRIPTS["_probe"] = "tests.test_cli_dialect:_imports_pandas"
    try:
        _, loaded = run_command("_probe", [])
    finally:
        del SCRIPTS["_probe"]
    assert loaded == ["pandas"]


def _imports_pandas():
    import pandas  # noqa: F401
