"""MkDocs hook (``mkdocs.yml``'s ``hooks``): a name of code in a table cell keeps whole.

A squeezed table breaks a cell's text where it may, and a hyphen is such a place: a state or a
finding code written as code read "reserved-/idle". Inline code with no space in it, in a table
cell (a state, a finding code, a flag, a metric), gets the class ``name``, which
``docs/stylesheets/extra.css`` keeps on one line; code with spaces (a message, a command) still
wraps between its words. ``integration/test_docs_site.py`` checks the built site in Chromium.
"""

from __future__ import annotations

import re
from typing import Any

_CELL = re.compile(r"(<t[dh]\b[^>]*>)(.*?)(</t[dh]>)", re.S)
_NAME = re.compile(r"<code>([^<\s]+)</code>")


def on_page_content(html: str, **_: Any) -> str:
    """The page's HTML with each name of code in a table cell marked ``class="name"``, and each
    table focusable (``tabindex="0"``): a table too wide for its column scrolls, and a keyboard
    must reach what scrolls (axe's ``scrollable-region-focusable``)."""
    html = html.replace("<table>", '<table tabindex="0">')
    return _CELL.sub(lambda m: m[1] + _NAME.sub(r'<code class="name">\1</code>', m[2]) + m[3], html)
