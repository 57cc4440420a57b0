"""Time, passed in: wall time for the ledger, monotonic time for the rate, a sleep to wake.

The loops take a ``Clock`` so that tests of idle time and of the rate run on fake time; every
``now()`` in gpuledger is a clock's.
"""

from __future__ import annotations

import threading
import time
from datetime import datetime, timezone
from typing import Protocol


class Clock(Protocol):
    """Wall time for the ledger, monotonic time for the rate, and a sleep that can be woken."""

    def now(self) -> datetime:
        """The wall-clock time, aware, in UTC."""
        ...

    def monotonic(self) -> float:
        """Seconds on a clock that never goes back."""
        ...

    def sleep(self, seconds: float, wake: threading.Event | None = None) -> None:
        """Wait ``seconds``, or less when ``wake`` is set."""
        ...


class SystemClock:
    """The real clock."""

    def now(self) -> datetime:
        """The wall-clock time, aware, in UTC."""
        return datetime.now(timezone.utc)

    def monotonic(self) -> float:
        """``time.monotonic``."""
        return time.monotonic()

    def sleep(self, seconds: float, wake: threading.Event | None = None) -> None:
        """Wait on ``wake`` so that a signal handler can cut the sleep short."""
        if wake is None:
            time.sleep(max(0.0, seconds))
        else:
            wake.wait(max(0.0, seconds))
