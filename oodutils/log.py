"""Logging for the whole project: one logger per package, bare messages on stderr.

Library modules log through their package's logger::

    from oodutils.log import get_logger
    log = get_logger(__name__)   # "domainbed.results.records" -> under the "domainbed" logger
    log.info("notice: ...")              # shown by default (the old print to stderr)
    log.warning("warning: ...")          # shown unless -qq
    log.debug("read %d records", n)     # shown with -v

Each package logger (``domainbed``, ``analysis``, ``ood_bench``, ``spawrious``,
``oodutils``) starts at level INFO with one handler that writes the bare message to the
current ``sys.stderr``, so the lines users (and tests) read are the ones the project has
always printed, in a script, a notebook or a CLI. The CLIs set the level from ``-v`` /
``-q`` (:func:`configure`); an application sets it as usual
(``logging.getLogger("domainbed").setLevel(logging.WARNING)``), or hands the records to its
own handlers with :func:`propagate_to_root`.

Warnings a caller may want to filter go through :mod:`warnings` (category
:class:`ProjectWarning` or a subclass); :func:`configure` shows those raised from this
project's packages as one ``warning: ...`` line, like the rest of the output.
"""
from __future__ import annotations

import logging
import os
import sys
import warnings
from collections.abc import Callable, Iterable
from typing import TextIO

from oodutils.text import encodable, printable

PACKAGES = ("oodutils", "domainbed", "analysis", "ood_bench", "spawrious")
LEVELS = {-2: logging.ERROR, -1: logging.WARNING, 0: logging.INFO, 1: logging.DEBUG}


class ProjectWarning(UserWarning):
    """Base category of this project's warnings:
    ``warnings.filterwarnings("ignore", category=ProjectWarning)`` silences them all."""


class StderrHandler(logging.StreamHandler):
    """Writes to whatever ``sys.stderr`` is when a record is emitted (pytest's capture, a
    notebook's stream, a redirect), never to a stream saved at set-up."""

    def __init__(self, level: int = logging.NOTSET) -> None:
        logging.Handler.__init__(self, level)
        self.setFormatter(logging.Formatter("%(message)s"))

    @property
    def stream(self) -> TextIO:
        return sys.stderr

    @stream.setter
    def stream(self, value: object) -> None:
        # StreamHandler.setStream; the stream is always sys.stderr
        pass

    def format(self, record: logging.LogRecord) -> str:
        """The message; lone surrogates as U+FFFD, and on a terminal control characters
        from records' names as ``\\xNN`` (they cannot drive the terminal)."""
        text = encodable(super().format(record))
        isatty = getattr(sys.stderr, "isatty", None)
        if isatty is not None and isatty():
            text = printable(text, keep_layout=True)
        return text


_DEFAULT_HANDLERS: dict[str, logging.Handler] = {}
ShowWarning = Callable[..., None]


def _package_logger(package: str) -> logging.Logger:
    logger = logging.getLogger(package)
    if package not in _DEFAULT_HANDLERS:
        handler = StderrHandler()
        _DEFAULT_HANDLERS[package] = handler
        logger.addHandler(handler)
        if logger.level == logging.NOTSET:
            logger.setLevel(logging.INFO)
        logger.propagate = False   # no second copy through the root logger's handlers
    return logger


def get_logger(name: str) -> logging.Logger:
    """``logging.getLogger(name)``, with its package's logger (the first dotted part) set up
    as the module docstring says."""
    _package_logger(name.split(".")[0])
    return logging.getLogger(name)


def level_for(verbosity: int) -> int:
    """-2 and below: ERROR, -1: WARNING, 0: INFO (the default), 1 and above: DEBUG."""
    return LEVELS[max(-2, min(1, verbosity))]


def configure(verbosity: int = 0, packages: Iterable[str] = PACKAGES,
              warning_lines: bool = True) -> int:
    """Set every package logger's level from ``verbosity`` (``-v`` counts +1, ``-q`` -1)
    and (``warning_lines``) show this project's warnings as ``warning: ...`` lines (at
    WARNING, so ``-qq`` hides them). The CLIs call this after parsing their flags.
    Returns the level."""
    level = level_for(verbosity)
    for package in packages:
        _package_logger(package).setLevel(level)
    if warning_lines and not getattr(warnings.showwarning, "_oodutils", False):
        warnings.showwarning = _showwarning_hook(warnings.showwarning)
    return level


def propagate_to_root(packages: Iterable[str] = PACKAGES) -> None:
    """Hand the packages' records to the root logger's handlers (an application's own
    logging set-up) instead of printing them ourselves."""
    for package in packages:
        logger = _package_logger(package)
        logger.removeHandler(_DEFAULT_HANDLERS[package])
        logger.propagate = True


_ROOTS = tuple(os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep + p + os.sep
               for p in PACKAGES)


def _package_of(category: object, filename: str | None) -> str | None:
    path = os.path.abspath(filename or "")
    for package, root in zip(PACKAGES, _ROOTS):
        if path.startswith(root):
            return package
    if isinstance(category, type) and issubclass(category, ProjectWarning):
        return "oodutils"
    return None


def show_warning(message: Warning | str, category: type[Warning], filename: str,
                 lineno: int, file: TextIO | None = None, line: str | None = None) -> None:
    """A ``warnings.showwarning`` that logs ``warning: <message>`` through the package
    logger of the module that warned."""
    _package_logger(_package_of(category, filename) or "oodutils").warning(f"warning: {message}")


def _showwarning_hook(original: ShowWarning) -> ShowWarning:
    def hook(message: Warning | str, category: type[Warning], filename: str, lineno: int,
             file: TextIO | None = None, line: str | None = None) -> None:
        if file is None and _package_of(category, filename):
            show_warning(message, category, filename, lineno)
        else:
            original(message, category, filename, lineno, file, line)
    hook._oodutils = True  # type: ignore[attr-defined]
    return hook
