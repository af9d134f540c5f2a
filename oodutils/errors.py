"""User-facing errors: the CLIs print these as one line on stderr and exit non-zero."""
from __future__ import annotations

import importlib
import os
import re
import sys
from collections.abc import Callable, Iterable
from types import ModuleType
from typing import Any

from oodutils.text import printable


class UserError(Exception):
    """A problem with the user's input (names, paths, indices, records), not a bug."""


class UnknownNameError(UserError, KeyError):
    def __init__(self, kind: str, name: object, valid: Iterable[str]) -> None:
        self.kind, self.name, self.valid = kind, name, sorted(valid)
        super().__init__(f"unknown {kind} {name!r}; valid {kind}s: {', '.join(self.valid)}")

    def __str__(self) -> str:
        return self.args[0]


def run_cli(main: Callable[[list[str] | None], Any], argv: list[str] | None = None) -> Any:
    """Run `main(argv)`, turning UserError into one clear stderr line and exit code 2.
    A character stdout cannot encode (a lone surrogate from a broken record, a symbol a
    non-UTF-8 terminal lacks) is written as a backslash escape, as Python does on stderr,
    never a traceback halfway through a table. A reader that closes stdout early
    (``| head``) ends the command quietly with exit code 141, as a shell's own tools do."""
    if getattr(sys.stdout, "errors", None) in ("strict", "surrogateescape") and \
            hasattr(sys.stdout, "reconfigure"):
        sys.stdout.reconfigure(errors="backslashreplace")
    try:
        return main(argv)
    except UserError as e:
        message = f"error: {e}"
        if getattr(sys.stderr, "isatty", lambda: False)():
            message = printable(message, keep_layout=True)
        print(message, file=sys.stderr)
        sys.exit(2)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        sys.exit(130)
    except BrokenPipeError:
        _silence_stdout()
        sys.exit(141)


def _silence_stdout() -> None:
    """Point stdout at /dev/null, so the interpreter's last flush of a pipe whose reader
    has gone cannot print a second error (Python's documented way for SIGPIPE)."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError, AttributeError):
        pass    # not a real file (a test's capture): nothing will be flushed to a pipe


def epilog_example(command: str, module: str, example: str) -> str:
    """The `--help` epilog every CLI ends with: one example, as command and as module."""
    return f"example:\n  {command} {example}\n(the same as: python -m {module} {example})"


def require(module: str, extra: str) -> ModuleType:
    """Import an optional package, or stop with one line naming the extra that installs it:
    `require("ruptures", extra="analysis")`."""
    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise UserError(f"{module} is not installed ({e}); install it with: "
                        f"pip install 'oodbed[{extra}]'") from None


def load_error_reason(error: BaseException) -> str:
    """One short line saying why a file could not be loaded (torch.load with
    weights_only=True, np.load with allow_pickle=False), for an error message. The
    libraries' own texts advise loading again without those guards, which would run
    whatever code the file carries; that advice never reaches the user."""
    text = re.sub(r"\x1b\[[0-9;]*m", "", str(error))
    if "Weights only load failed" in text or "allow_pickle" in text:
        found = re.search(r"Unsupported global: GLOBAL (\S+)", text)
        what = f" ({found.group(1)})" if found else ""
        return (f"it holds Python objects{what}, not only tensors, arrays and plain "
                f"data; refused, since loading them could run code")
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return (lines[0] if lines else type(error).__name__)[:200]
