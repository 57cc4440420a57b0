"""Where a tick's Xid errors come from (issue 25): NVML's event API when it loads and a card
supports it (serve), the kernel log otherwise; a kernel log that fails blinds only itself."""

from __future__ import annotations

import sys
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from gpuledger.controller.sources import SourceConfig, Sources
from gpuledger.model import SourceName, SourceStatus, XidEvent
from tests.fakes.fake_nvml_events import FakeNvmlEvents
from tests.fakes.nvidia_states import UUID_A, UUID_B, gpu, world

T0 = datetime(2026, 12, 2, 18, 0, tzinfo=timezone.utc)
BOOT = 1_796_000_000  # btime; the log's record below is 1,000 s after it


class Clock:
    """Wall time for the ledger: T0, always (nothing here waits on it)."""

    def now(self) -> datetime:
        return T0

    def monotonic(self) -> float:
        return 0.0

    def sleep(self, seconds: float, wake: object = None) -> None:
        raise AssertionError("nothing sleeps here")


@pytest.fixture
def proc(tmp_path: Path) -> Path:
    root = tmp_path / "proc"
    root.mkdir()
    (root / "stat").write_text(f"cpu 1 0 0 0\nbtime {BOOT}\n")
    return root


def kmsg(tmp_path: Path) -> Path:
    path = tmp_path / "kmsg"
    path.write_text("3,7,1000000000,-;NVRM: Xid (PCI:0000:83:00): 79, GPU has fallen off the bus\n")
    return path


def sources(
    monkeypatch: pytest.MonkeyPatch, fake: FakeNvmlEvents, proc: Path, log: Path
) -> Sources:
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    config = SourceConfig(gpu_backend="nvml", proc_root=proc, kernel_log=log)
    return Sources(config, clock=Clock(), watch_xids=True)


def test_nvml_events_are_the_xids_and_the_kernel_log_is_off(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, proc: Path
) -> None:
    fake = FakeNvmlEvents(world(gpu(0, UUID_A), gpu(1, UUID_B)))
    node = sources(monkeypatch, fake, proc, kmsg(tmp_path))
    try:
        assert node.xid_watch is not None and node.kernel_log is None
        fake.deliver(1, 48)
        assert fake.settle(1)
        _, observed = node.read()
        assert observed.sources[SourceName.KERNEL_LOG] == SourceStatus.off()
        assert observed.xids == ()
        assert observed.reading is not None
        assert observed.reading.xids == (XidEvent("0000:84:00", 48, T0, "", source="nvml"),)
        # Kept from tick to tick, within the week: the policy picks its own window.
        _, again = node.read()
        assert again.reading is not None and again.reading.xids == observed.reading.xids
    finally:
        node.xid_watch.stop()  # type: ignore[attr-defined, union-attr]


def test_without_the_event_api_the_kernel_log_is_read(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, proc: Path
) -> None:
    fake = FakeNvmlEvents(world(gpu(0, UUID_A, xid_events=False)))
    node = sources(monkeypatch, fake, proc, kmsg(tmp_path))
    assert node.xid_watch is None and node.kernel_log is not None
    _, observed = node.read()
    assert observed.sources[SourceName.KERNEL_LOG] == SourceStatus.up()
    at = datetime.fromtimestamp(BOOT, timezone.utc) + timedelta(seconds=1000)
    assert [(e.pci, e.xid, e.at) for e in observed.xids] == [("0000:83:00", 79, at)]


def test_a_kernel_log_that_fails_blinds_only_itself(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, proc: Path
) -> None:
    fake = FakeNvmlEvents(world(gpu(0, UUID_A, xid_events=False)))
    node = sources(monkeypatch, fake, proc, tmp_path / "missing")
    _, observed = node.read()
    status = observed.sources[SourceName.KERNEL_LOG]
    assert status.failing and str(tmp_path / "missing") in (status.error or "")
    assert observed.sources[SourceName.GPU].readable
    assert observed.reading is not None and len(observed.reading.gpus) == 1
