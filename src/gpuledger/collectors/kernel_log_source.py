"""Which reader follows the kernel log, as ``--kernel-log`` and ``--kernel-log-format`` name it:
``/dev/kmsg`` and files of its records (``kmsg``), the systemd journal through ``journalctl``
(``journal``), or a text log in a form syslog, ``kern.log`` or ``dmesg -T`` writes (``text``).

``auto`` goes by what the path is: the word ``journal`` is the journal, a regular file is read
in the form its lines are in (``/dev/kmsg`` records or text), and anything else (``/dev/kmsg``,
a FIFO, a socket) as ``/dev/kmsg``.
"""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import Literal, Protocol

from gpuledger.collectors.kernel_log_journal import JOURNAL, KernelJournal
from gpuledger.collectors.kernel_log_reader import KernelLog
from gpuledger.model.health import XidEvent

__all__ = ["FORMATS", "KernelLogFormat", "KernelLogReader", "open_kernel_log"]

KernelLogFormat = Literal["auto", "kmsg", "journal", "text"]
FORMATS: tuple[KernelLogFormat, ...] = ("auto", "kmsg", "journal", "text")
"""``--kernel-log-format``'s choices."""


class KernelLogReader(Protocol):
    """What the tick asks of a kernel-log reader."""

    def read(self, now: datetime) -> tuple[XidEvent, ...]:
        """The Xids kept, after reading what is new; ``SourceError`` when it cannot."""
        ...

    def close(self) -> None:
        """Let go of what is held between reads."""
        ...


def open_kernel_log(
    path: Path, form: KernelLogFormat, proc_root: Path, timeout: float
) -> KernelLogReader:
    """The reader of ``path`` in ``form`` (nothing is opened until its first ``read``)."""
    if form == "journal" or (form == "auto" and str(path) == JOURNAL):
        return KernelJournal(None if str(path) == JOURNAL else path, timeout=timeout)
    return KernelLog(path, proc_root, form="auto" if form == "auto" else form)
