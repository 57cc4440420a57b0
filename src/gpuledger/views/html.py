"""What every HTML page of gpuledger shares: one Jinja2 environment (autoescaped, strict), the
files the pages link (the style sheet under a name that carries its content's hash, the
favicon), and how times, spans and amounts read.

Every value a template prints goes through ``printable`` first (``finalize``): a control
character or a bidi override in a name from a source shows as ``\\x1b`` or ``\\u202e``, as in
the terminal tables, and is then escaped for its context by autoescaping.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from datetime import datetime, timedelta
from functools import cache
from importlib.resources import files
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from gpuledger.model.contract import iso_time
from gpuledger.views.table import printable

if TYPE_CHECKING:
    import jinja2

HTML = "text/html; charset=utf-8"
FAVICON_PATHS = ("/favicon.svg", "/favicon.ico")
"""The favicon the pages link, and where browsers look for one unasked."""


@cache
def environment() -> jinja2.Environment:
    """The one Jinja2 environment of the packaged templates (``views/templates``)."""
    # Imported here: a node controller whose page nobody opens never loads the templating
    # library (1.5 MiB of its memory; bench/README.md).
    import jinja2  # noqa: PLC0415
    from markupsafe import Markup  # noqa: PLC0415

    def _finalize(value: object) -> object:
        if isinstance(value, str) and not isinstance(value, Markup):
            return printable(value)
        return value

    return jinja2.Environment(
        loader=jinja2.PackageLoader("gpuledger.views", "templates"),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        finalize=_finalize,
    )


@dataclass(frozen=True)
class Asset:
    """A packaged file served as it is."""

    path: str
    body: bytes
    content_type: str


@cache
def stylesheet() -> Asset:
    """The pages' style sheet, at ``/static/gpuledger-<hash>.css``: a changed sheet has a new
    URL, so the old one may be cached for good."""
    body = files("gpuledger.views").joinpath("templates/page.css").read_bytes()
    digest = hashlib.sha256(body).hexdigest()[:16]
    return Asset(f"/static/gpuledger-{digest}.css", body, "text/css; charset=utf-8")


@cache
def favicon() -> Asset:
    """The favicon (SVG)."""
    body = files("gpuledger.views").joinpath("templates/favicon.svg").read_bytes()
    return Asset(FAVICON_PATHS[0], body, "image/svg+xml")


def frame(refresh: int | None) -> dict[str, object]:
    """What every page's frame (``base.html.j2``) needs: the style sheet and the favicon,
    linked relative to the page (a controller behind a path prefix still finds them), and the
    page's own refresh in seconds (``None``: the reader turned it off)."""
    return {
        "stylesheet": stylesheet().path.lstrip("/"),
        "favicon": favicon().path.lstrip("/"),
        "refresh": refresh,
    }


def clock(at: datetime) -> str:
    """An instant as a person reads it: ``2026-11-30 12:00:05 UTC``."""
    return at.strftime("%Y-%m-%d %H:%M:%S UTC")


def span(length: timedelta) -> str:
    """A length of time in its two largest units: ``45 s``, ``12 min``, ``2 h 5 min``,
    ``3 d 4 h``."""
    seconds = max(0, int(length.total_seconds()))
    days, rest = divmod(seconds, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days} d {hours} h" if hours else f"{days} d"
    if hours:
        return f"{hours} h {minutes} min" if minutes else f"{hours} h"
    return f"{minutes} min" if minutes else f"{secs} s"


@dataclass(frozen=True)
class When:
    """An instant as a page shows it: how long ago (as of the page's own instant), when, and
    the machine-readable form for ``<time datetime>``."""

    ago: str
    text: str
    iso: str


def when(at: datetime, now: datetime) -> When:
    """``at`` as seen from ``now``."""
    return When(span(now - at), clock(at), iso_time(at))


def mib(used: int | None, total: int | None = None) -> str:
    """Memory in MiB with thousands separated: ``118,342 / 143,771 MiB``; ``-`` unknown."""
    if used is None:
        return "-"
    if total is None:
        return f"{used:,} MiB"
    return f"{used:,} / {total:,} MiB"


def link_to(url: str | None) -> str | None:
    """The URL of another controller's page, only for an ``http``/``https`` URL with a host
    and nothing invisible in it; ``None`` otherwise (never a ``javascript:`` link)."""
    if not url or any(c.isspace() or not c.isprintable() for c in url):
        return None
    try:
        parts = urlsplit(url)
    except ValueError:
        return None
    if parts.scheme.lower() not in ("http", "https") or not parts.hostname:
        return None
    return url.rstrip("/") + "/"
