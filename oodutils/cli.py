"""What every command line shares: the ``--hparams``-style JSON option parser and the
``-v`` / ``-q`` flags (see :mod:`oodutils.log`). ``run_cli`` and ``epilog_example`` live in
:mod:`oodutils.errors` and are re-exported here."""
from __future__ import annotations

import argparse
import json

from oodutils.errors import UserError, epilog_example, run_cli
from oodutils.log import configure

__all__ = ["parse_json_object", "add_logging_flags", "configure_logging", "run_cli",
           "epilog_example"]


def parse_json_object(text: str | None, what: str = "--hparams") -> dict:
    """The JSON object a command-line option holds (``--hparams '{"lr": 1e-4}'``): ``{}``
    when the option is empty or absent, else a dict, or one UserError naming the option
    when the text is not JSON or not an object. ``NaN`` and ``Infinity`` parse (as Python's
    json does); whoever uses the values says whether they are allowed."""
    if text is None or not str(text).strip():
        return {}
    try:
        value = json.loads(text)
    except ValueError as e:
        raise UserError(f"{what} is not valid JSON ({e}): {text!r}") from None
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
