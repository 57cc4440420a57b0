"""The real agent's answers, written as fixtures CI holds the simulator to (issue 38 item 4).

One JSON file per request gpuledger makes, in ``tests/fixtures/nomad/v1.6.5/`` (or
``GPULEDGER_NOMAD_RECORD_DIR``): the request (method, path with its ids named as roles, which
token's policies it carried), the status, the headers gpuledger reads, the body, the Nomad
version and the day it was recorded. Secrets are scrubbed: every token secret the suite made is
replaced by ``<secret>`` wherever it appears, and ``SecretID`` keys are blanked, before anything
is written.
"""

from __future__ import annotations

import datetime
import json
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import requests

REPO = Path(__file__).resolve().parents[2]
HEADERS = ("X-Nomad-Index", "X-Nomad-KnownLeader", "X-Nomad-LastContact", "Content-Type")


def record_dir(version: str) -> Path:
    """Where the fixtures go."""
    given = os.environ.get("GPULEDGER_NOMAD_RECORD_DIR")
    return Path(given) if given else REPO / "tests" / "fixtures" / "nomad" / f"v{version}"


@dataclass
class Recorder:
    """Writes one fixture per answer, with the ids of the scene replaced by their roles."""

    version: str
    secrets: Iterable[str]
    roles: dict[str, str] = field(default_factory=dict)
    """Real id → its role (``<node>``, ``<alloc:train>``…), in paths and bodies alike."""
    written: list[Path] = field(default_factory=list)

    def scrub(self, text: str) -> str:
        for secret in self.secrets:
            if secret:
                text = text.replace(secret, "<secret>")
        for real, role in self.roles.items():
            text = text.replace(real, role)
        return text

    def body(self, answer: requests.Response) -> Any:
        text = self.scrub(answer.text)
        try:
            doc = json.loads(text)
        except ValueError:
            return text
        return _blank_secret_ids(doc)

    def answer(self, answer: requests.Response, token: str | None) -> dict[str, Any]:
        """The recorded form of one answer."""
        sent = answer.request
        body = sent.body.decode() if isinstance(sent.body, bytes) else sent.body
        return {
            "request": {
                "method": sent.method,
                "path": self.scrub(sent.path_url),
                "token": token,
                "body": json.loads(self.scrub(body)) if body else None,
            },
            "status": answer.status_code,
            "headers": {h: answer.headers[h] for h in HEADERS if h in answer.headers},
            "body": self.body(answer),
        }

    def write(self, name: str, doc: Mapping[str, Any], folder: Path | None = None) -> Path:
        """``<name>.json`` with the version and the day."""
        target = folder or record_dir(self.version)
        target.mkdir(parents=True, exist_ok=True)
        path = target / f"{name}.json"
        stamped = {
            "nomad_version": self.version,
            "recorded": datetime.datetime.now(datetime.timezone.utc).date().isoformat(),
            **doc,
        }
        text = json.dumps(stamped, indent=2, sort_keys=True) + "\n"
        assert not any(s and s in text for s in self.secrets), f"{name}: a secret left"
        path.write_text(text)
        self.written.append(path)
        return path


def _blank_secret_ids(doc: Any) -> Any:
    if isinstance(doc, dict):
        return {
            k: ("<secret>" if k == "SecretID" and v else _blank_secret_ids(v))
            for k, v in doc.items()
        }
    if isinstance(doc, list):
        return [_blank_secret_ids(v) for v in doc]
    return doc


UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
