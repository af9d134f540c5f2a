"""HTML from Jinja2 templates, the one way this project writes HTML.

Every package that writes pages keeps its templates in its own ``templates/`` folder
(shipped as package data) and renders them through :func:`environment`: autoescape on,
so no value from the data can become markup; ``StrictUndefined``, so a misspelt name
is an error instead of an empty cell. The generic templates here (``table.html.j2``,
``macros.html.j2``) are reachable from every package's templates as ``oodutils/<name>``.

Links: templates pass every ``href``/``src`` through the ``site_href`` filter (a
relative path inside the site, optionally with an ``#anchor``) or ``source_href``
(that, or an ``http``/``https`` address of a published source); anything else comes
back as None and the ``link`` macro then writes the text alone.

    >>> render("domainbed.leaderboard", "index.html.j2", page=...)
"""
from __future__ import annotations

import functools
import re
from typing import TYPE_CHECKING, Any, Optional
from urllib.parse import urlsplit

if TYPE_CHECKING:
    import jinja2

TEMPLATE_FOLDER = "templates"
EXTERNAL_SCHEMES = ("http", "https")

# path segments of letters, digits, "_", "-" and "." (never leading: no "..", no hidden
# files), "/" between them, an optional "#anchor"; or an anchor alone. No ":" (no scheme),
# no "//" (no other host), no "?", no spaces.
_SITE_PATH = re.compile(r"(?:[A-Za-z0-9_-][A-Za-z0-9_.-]*/)*[A-Za-z0-9_-][A-Za-z0-9_.-]*"
                        r"(?:#[A-Za-z0-9_-][A-Za-z0-9_.-]*)?|#[A-Za-z0-9_-][A-Za-z0-9_.-]*")
_URL_UNSAFE = re.compile(r"[\x00-\x20\x7f\"'<>`\\]")


def site_href(url: Any) -> Optional[str]:
    """``url`` when it is a relative path inside the site (``dataset_VLCS.html#x``,
    ``img/a.png``), else None."""
    if isinstance(url, str) and _SITE_PATH.fullmatch(url):
        return url
    return None


def source_href(url: Any) -> Optional[str]:
    """``url`` when it is a site path or an ``http``/``https`` address with a host and no
    spaces, quotes or angle brackets, else None."""
    if site_href(url) is not None:
        return url
    if not isinstance(url, str) or _URL_UNSAFE.search(url):
        return None
    try:
        parts = urlsplit(url)
    except ValueError:
        return None
    if parts.scheme.lower() in EXTERNAL_SCHEMES and parts.netloc:
        return url
    return None


@functools.lru_cache(maxsize=None)
def environment(package: str) -> jinja2.Environment:
    """The Jinja2 environment of ``package`` (its ``templates/`` folder first, then this
    package's as ``oodutils/...``); one per package, made once (jinja2 imported then:
    the text and LaTeX tables never need it)."""
    import jinja2
    shared = jinja2.PrefixLoader({__package__: jinja2.PackageLoader(__package__,
                                                                     TEMPLATE_FOLDER)})
    loader = jinja2.ChoiceLoader([jinja2.PackageLoader(package, TEMPLATE_FOLDER), shared])
    env = jinja2.Environment(loader=loader, autoescape=True,
                             undefined=jinja2.StrictUndefined, trim_blocks=True,
                             lstrip_blocks=True, keep_trailing_newline=True)
    env.filters["site_href"] = site_href
    env.filters["source_href"] = source_href
    return env


def render(package: str, template: str, **context: Any) -> str:
    """``template`` of ``package`` rendered with ``context``."""
    return environment(package).get_template(template).render(**context)
