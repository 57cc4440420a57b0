"""The docs site built as ``.ci/run`` builds it (``mkdocs build --strict``, mkdocs.yml), once
in a run, and the page of the built site a URL below its ``site_url`` names."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import yaml

from tests.parallel import built_once
from tests.paths import REPO

MKDOCS_YML = REPO / "mkdocs.yml"
DOCS = REPO / "docs"


def build_site(dest: Path) -> Path:
    """``mkdocs build --strict`` into ``dest``; a warning (a broken link or anchor, a page left
    out of the nav) fails it, with mkdocs's own words."""
    run = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--quiet",
         "--config-file", str(MKDOCS_YML), "--site-dir", str(dest)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )  # fmt: skip
    assert run.returncode == 0, f"mkdocs build --strict failed:\n{run.stdout}{run.stderr}"
    return dest


def site_of_run(factory: pytest.TempPathFactory) -> Path:
    """The site for this run's tests, which only read it: the one ``.ci/run`` built as its
    check (``GPULEDGER_SITE_DIR``), else one built here once for every worker."""
    given = os.environ.get("GPULEDGER_SITE_DIR")
    if given:
        return Path(given)
    return built_once(factory, "site", build_site)


def site_url() -> str:
    """Where mkdocs.yml says the site is published (ends with ``/``)."""
    url = str(yaml.safe_load(MKDOCS_YML.read_text(encoding="utf-8"))["site_url"])
    return url if url.endswith("/") else url + "/"


def page_of(url: str, site: Path) -> Path | None:
    """The built page ``url`` names (a directory URL is its ``index.html``), or None when it
    is not below ``site_url`` or names no file of ``site``."""
    base = site_url()
    if not url.startswith(base) or urlsplit(url).query:
        return None
    rest = urlsplit(url).path.removeprefix(urlsplit(base).path)
    target = (site / rest).resolve()
    if target.is_dir() or url.endswith("/"):
        target = target / "index.html"
    inside = target.is_relative_to(site.resolve())
    return target if inside and target.is_file() else None
