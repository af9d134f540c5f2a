"""Figures without a backend: library code draws on the caller's axes or on a new
``matplotlib.figure.Figure`` that no backend owns, and never imports pyplot or calls
``matplotlib.use`` (that is the application's choice: a notebook's inline backend, a
script's Agg). Plotting functions across the project take ``ax=`` and return the Figure;
PNGs are written atomically."""
from __future__ import annotations

import io
import os
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, cast

from oodutils.fileio import atomic_write_bytes
from oodutils.text import encodable

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure


def _matplotlib() -> ModuleType:
    """matplotlib with the submodules drawn with here, imported when a figure is first made
    or saved: commands that plot answer --help before it."""
    import matplotlib.figure
    import matplotlib.mathtext
    import matplotlib.text
    return matplotlib


def figure_and_axes(ax: Axes | None = None,
                    figsize: tuple[float, float] = (6.0, 5.0)) -> tuple[Figure, Axes]:
    """``(ax.figure, ax)`` when the caller gave axes, else a new Figure and its one Axes."""
    if ax is not None:
        return cast("Figure", ax.figure), ax
    fig = _matplotlib().figure.Figure(figsize=figsize)
    return fig, fig.add_subplot()


def drawable_texts(fig: Figure, math: bool = True) -> None:
    """Every text of ``fig`` (titles, labels, legends, ticks) made drawable: a lone
    surrogate from a broken record (which the font renderer refuses) as U+FFFD, a CR or
    tab (no glyph) as a space, and a text that is not valid mathtext (a name such as
    ``a$\\frac{$b``) drawn as plain text (``math`` False: every text)."""
    matplotlib = _matplotlib()
    parser = matplotlib.mathtext.MathTextParser("path")
    for artist in fig.findobj(matplotlib.text.Text):
        text = artist.get_text()
        clean = encodable(text).replace("\r", " ").replace("\t", " ")
        if clean != text:
            artist.set_text(clean)
        if not math:
            artist.set_parse_math(False)
        elif "$" in clean and artist.get_parse_math():
            try:
                parser.parse(clean)
            except ValueError:
                artist.set_parse_math(False)


def _png(fig: Figure, dpi: int, bbox_inches: str | None) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi, bbox_inches=bbox_inches)
    return buf.getvalue()


def save_figure(fig: Figure, path: str | os.PathLike[str], dpi: int = 120,
                bbox_inches: str | None = None) -> Path:
    """Write ``fig`` as a PNG to ``path`` atomically (temp file + rename); returns the
    path. The figure stays open: it is the caller's (or nobody's, for a backend-less
    Figure). Texts from records are made drawable first (``drawable_texts``); one that
    only exists once drawn (a tick label from a name) gets a second try as plain text."""
    drawable_texts(fig)
    try:
        png = _png(fig, dpi, bbox_inches)
    except (ValueError, TypeError):     # mathtext or the font renderer refused a text
        drawable_texts(fig, math=False)
        with _matplotlib().rc_context({"text.parse_math": False}):
            png = _png(fig, dpi, bbox_inches)
    path = Path(path)
    atomic_write_bytes(path, png)
    return path
