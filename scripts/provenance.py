"""Write the release's provenance: one in-toto Statement (v1) with a SLSA provenance (v1)
predicate, as one line of JSON, whose subjects are the release's files and their SHA-256.

    python3 scripts/provenance.py --commit C --command "scripts/build-release …" \
        --started T --builder-id ID --tool pex==2.1 … --out gpuledger-<v>.intoto.jsonl FILE…

Standard library only: scripts/build-release runs it with the build's own Python. The format:
https://github.com/in-toto/attestation/blob/main/spec/v1/statement.md and
https://slsa.dev/spec/v1.0/provenance.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import platform
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

STATEMENT = "https://in-toto.io/Statement/v1"
SLSA_PROVENANCE = "https://slsa.dev/provenance/v1"
# What the build's parameters mean: the build script of this repository, as docs/release.md
# describes it. Not a fetchable document of its own: a name that changes with the script's form.
BUILD_TYPE = "https://gpuledger.invalid/build-types/scripts/build-release/v1"


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def source(commit: str) -> dict[str, Any]:
    """The git commit the release was built from; a dirty tree says so, unknown says so."""
    head, dirty = commit.removesuffix("-dirty"), commit.endswith("-dirty")
    if len(head) == 40 and all(c in "0123456789abcdef" for c in head):
        return {
            "uri": f"git+gpuledger@{head}",
            "digest": {"gitCommit": head},
            "annotations": {"uncommittedChanges": dirty},
        }
    return {"uri": "git+gpuledger@unknown", "annotations": {"commit": commit}}


def statement(args: argparse.Namespace) -> dict[str, Any]:
    tools = [
        {"uri": f"pkg:pypi/{name}@{version}"}
        for name, version in (t.split("==", 1) for t in args.tool)
    ]
    interpreter = f"pkg:generic/cpython@{platform.python_version()}"
    return {
        "_type": STATEMENT,
        "subject": [
            {"name": Path(f).name, "digest": {"sha256": sha256(Path(f))}} for f in args.files
        ],
        "predicateType": SLSA_PROVENANCE,
        "predicate": {
            "buildDefinition": {
                "buildType": BUILD_TYPE,
                "externalParameters": {
                    "command": args.command,
                    "platforms": args.platform,
                },
                "internalParameters": {"SOURCE_DATE_EPOCH": args.source_date_epoch},
                "resolvedDependencies": [source(args.commit), *tools, {"uri": interpreter}],
            },
            "runDetails": {
                "builder": {"id": args.builder_id},
                "metadata": {
                    "startedOn": args.started,
                    "finishedOn": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
                },
            },
        },
    }


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--commit", required=True)
    parser.add_argument("--command", required=True)
    parser.add_argument("--started", required=True)
    parser.add_argument("--builder-id", required=True)
    parser.add_argument("--source-date-epoch", default="")
    parser.add_argument("--platform", action="append", default=[])
    parser.add_argument("--tool", action="append", default=[], help="name==version")
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("files", nargs="+")
    args = parser.parse_args(argv)
    args.out.write_text(json.dumps(statement(args), sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
