"""Where the tests find the repository and what it keeps for them."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
"""The checkout's root (README.md, deploy/, examples/, src/)."""
FIXTURES = REPO / "tests" / "fixtures"
"""Real payloads and captures, each directory naming its public source."""
GOLDEN = REPO / "tests" / "golden"
"""The outputs the commands must keep producing."""
