"""What every command line shares: one option dialect (``add_option``: the canonical
underscore name in --help, every hyphen spelling and older name accepted but hidden), the
``--hparams``-style JSON option parser and the ``-v`` / ``-q`` flags (see
:mod:`oodutils.log`). ``run_cli`` and ``epilog_example`` live in :mod:`oodutils.errors` and
are re-exported here. Light on purpose: every command imports it before parsing."""
from __future__ import annotations

import argparse
import difflib
import json
import os
import sys
from collections.abc import Sequence
from typing import Any, NoReturn, TextIO

from oodutils.errors import UserError, epilog_example, run_cli
from oodutils.fileio import check_output_path
from oodutils.log import configure
from oodutils.text import encodable, printable

# Where every command looks for datasets by default (`--data_dir`): where the README's tour
# and the quickstart put them, relative to the folder the command runs in.
DEFAULT_DATA_DIR = "data"
DATA_DIR_HELP = f"dataset root folder (default: {DEFAULT_DATA_DIR})"

__all__ = ["ArgumentParser", "DEFAULT_DATA_DIR", "DATA_DIR_HELP", "add_option",
           "hidden_aliases", "parse_json_object", "add_logging_flags", "configure_logging",
           "run_cli", "epilog_example", "echo", "check_outputs"]


class ArgumentParser(argparse.ArgumentParser):
    """argparse's parser, except that an abbreviation matching several spellings of one
    option (``--input`` for ``--input_dir`` and its hidden ``--input-dir``) is that option,
    not an ambiguity: abbreviations that worked before the aliases keep working."""

    def _get_option_tuples(self, option_string: str) -> list[tuple[Any, ...]]:
        by_action: dict[int, tuple[Any, ...]] = {}
        for match in super()._get_option_tuples(option_string):
            by_action.setdefault(id(match[0]), match)
        return list(by_action.values())

    def parse_known_args(self, args: Sequence[str] | None = None,  # type: ignore[override]
                         namespace: argparse.Namespace | None = None
                         ) -> tuple[argparse.Namespace, list[str]]:
        self._seen_args = list(sys.argv[1:] if args is None else args)
        return super().parse_known_args(args, namespace)

    def error(self, message: str) -> NoReturn:
        """One line on stderr, never the usage block: a mistyped flag is named with the
        closest valid spelling (that mistake first: argparse would report a missing required
        option instead), any other mistake as argparse says it; then where --help is."""
        unknown = self._unknown_flag(getattr(self, "_seen_args", []))
        if unknown is not None:
            message = f"unrecognized option {unknown}"
            close = difflib.get_close_matches(unknown.split("=", 1)[0],
                                              _shown_options(self), n=1, cutoff=0.6)
            if close:
                message += f" (did you mean {close[0]}?)"
        self.exit(2, f"{self.prog}: error: {message}; see {self.prog} --help\n")

    def _unknown_flag(self, args: list[str]) -> str | None:
        """The first of `args` that looks like an option but is none of this parser's (nor
        of its subcommands'), or None."""
        known = _all_options(self)
        for token in args:
            if token == "--":
                return None
            if not token.startswith("-") or token == "-" or \
                    self._negative_number_matcher.match(token):
                continue
            name = token.split("=", 1)[0] if token.startswith("--") else token[:2]
            if name in known or (name.startswith("--") and
                                 any(k.startswith(name) for k in known)):
                continue
            return token
        return None


def _subparsers(parser: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
    return [sub for action in parser._actions
            if isinstance(action, argparse._SubParsersAction)
            for sub in action.choices.values()]


def _all_options(parser: argparse.ArgumentParser) -> set[str]:
    """Every spelling `parser` and its subcommands accept (hidden ones included)."""
    found = set(parser._option_string_actions)
    for sub in _subparsers(parser):
        found |= _all_options(sub)
    return found


def _shown_options(parser: argparse.ArgumentParser) -> list[str]:
    """The spellings --help shows, of `parser` and its subcommands (what to suggest)."""
    shown = [s for action in parser._actions for s in action.option_strings
             if action.help != argparse.SUPPRESS]
    for sub in _subparsers(parser):
        shown += [s for s in _shown_options(sub) if s not in shown]
    return shown


def hyphen_twin(option: str) -> str:
    """``--data_dir`` -> ``--data-dir`` (the spelling GNU-style tools use)."""
    return "--" + option[2:].replace("_", "-")


def add_option(parser: argparse.ArgumentParser | argparse._ArgumentGroup, canonical: str,
               *aliases: str, **kwargs: Any) -> argparse.Action:
    """Add the option ``canonical`` (``--output_dir``: DomainBed's underscore style, the one
    name --help shows) and accept ``aliases`` (older names such as ``--out``) and the
    hyphen spelling of every name as hidden alternatives, so users' scripts keep working.
    ``parser`` may be a parser or an argument group; ``kwargs`` are ``add_argument``'s.

    The aliases are extra keys of the parser's option table pointing at the one action:
    --help, usage and error messages name only the canonical spelling, and ``required``
    is satisfied by any spelling."""
    if not canonical.startswith("--") or "-" in canonical[2:]:
        raise ValueError(f"canonical option {canonical!r} must be --underscore_style")
    action = parser.add_argument(canonical, **kwargs)
    table = parser._option_string_actions   # shared by a parser and its argument groups
    names = [hyphen_twin(canonical)]
    for alias in aliases:
        names += [alias, hyphen_twin(alias), "--" + alias[2:].replace("-", "_")]
    for name in dict.fromkeys(names):
        if name == canonical or table.get(name) is action:
            continue
        if name in table:
            raise ValueError(f"alias {name} of {canonical} is already an option")
        table[name] = action
    return action


def hidden_aliases(parser: argparse.ArgumentParser, action: argparse.Action) -> list[str]:
    """The spellings ``parser`` accepts for ``action`` beyond those --help shows."""
    return sorted(name for name, a in parser._option_string_actions.items()
                  if a is action and name not in action.option_strings)


def parse_json_object(text: str | None, what: str = "--hparams") -> dict:
    """The JSON object a command-line option holds (``--hparams '{"lr": 1e-4}'``): ``{}``
    when the option is empty or absent, else a dict, or one UserError naming the option
    when the text is not JSON or not an object. ``NaN`` and ``Infinity`` parse (as Python's
    json does); whoever uses the values says whether they are allowed."""
    if text is None or not str(text).strip():
        return {}
    try:
        value = json.loads(text)
    except (ValueError, RecursionError) as e:
        reason = "nested too deeply" if isinstance(e, RecursionError) else str(e)
        raise UserError(f"{what} is not valid JSON ({reason}): {str(text)[:200]!r}"
                        ) from None
    if not isinstance(value, dict):
        raise UserError(f"{what} must be a JSON object like '{{\"lr\": 0.001}}', got "
                        f"{type(value).__name__} {text!r}")
    return value


def add_logging_flags(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """``-v/--verbose`` and ``-q/--quiet`` (each may repeat): messages on stderr. Default:
    notices, warnings and errors; ``-q``: warnings and errors; ``-qq``: errors only;
    ``-v``: also debugging detail. The command's main calls :func:`configure_logging`."""
    group = parser.add_argument_group("messages on stderr")
    group.add_argument("-v", "--verbose", action="count", default=0,
                       help="more detail (debug messages)")
    group.add_argument("-q", "--quiet", action="count", default=0,
                       help="fewer messages: -q warnings and errors only, -qq errors only")
    return parser


def configure_logging(args: argparse.Namespace) -> int:
    """Set the project's loggers from the parsed ``-v`` / ``-q`` counts; returns the level."""
    return configure(getattr(args, "verbose", 0) - getattr(args, "quiet", 0))


def check_directories(paths: list[str], option: str = "--input_dir") -> None:
    """One clear line for the first of `paths` that is not a directory (before any work)."""
    for path in paths:
        if not os.path.isdir(path):
            raise UserError(f"{option} {path!r} is not a directory")


def echo(text: str, end: str = "\n", stream: TextIO | None = None) -> None:
    """Write `text` to stdout (or `stream`) whatever it holds: a lone surrogate from a
    broken record is written as U+FFFD, a character the terminal's encoding lacks as a
    backslash escape; never an encoding error halfway through a table. On a terminal,
    control characters but tab and newline are written as ``\\xNN`` (an escape sequence
    in a record's name cannot drive the terminal); a pipe or file gets the text as is."""
    stream = sys.stdout if stream is None else stream
    text = encodable(text + end)
    isatty = getattr(stream, "isatty", None)
    if isatty is not None and isatty():
        text = printable(text, keep_layout=True)
    try:
        stream.write(text)
    except UnicodeEncodeError:
        encoding = getattr(stream, "encoding", None) or "utf-8"
        stream.write(text.encode(encoding, "backslashreplace").decode(encoding))


def check_outputs(*outputs: tuple[str | os.PathLike[str] | None, str, bool]) -> None:
    """Every output a command was asked for, as ``(path, option, is_directory)``, checked
    to be writable before any work (``oodutils.fileio.check_output_path``); a path of
    None (an output not asked for) is skipped."""
    for path, option, directory in outputs:
        check_output_path(path, option, directory=directory)
