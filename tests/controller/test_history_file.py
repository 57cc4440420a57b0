"""Hostile history files: each is corrupt (set aside, or a usage error for ls/check), never a
crash at start-up; the temporary file of a save follows no planted link."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from gpuledger.cli import main
from gpuledger.controller import history_file
from gpuledger.errors import HistoryCorruptError
from gpuledger.model.history_record import History
from tests.controller.test_loop import controller

GOOD = {"schema": 1, "at": None, "intervalSeconds": 15, "gpus": [], "findings": []}


def doc(**changes: object) -> str:
    return json.dumps({**GOOD, "gpuStateSeconds": [], "jobGpuSeconds": [], **changes})


SECONDS = {"uuid": "GPU-a", "state": "free", "seconds": 1.0}
HOSTILE = {
    "interval 1e300": doc(intervalSeconds=1e300),
    "interval NaN": doc().replace('"intervalSeconds": 15', '"intervalSeconds": NaN'),
    "interval Infinity": doc().replace('"intervalSeconds": 15', '"intervalSeconds": Infinity'),
    "interval 10**400": doc().replace('"intervalSeconds": 15', '"intervalSeconds": 1' + "0" * 400),
    "NaN seconds": doc(gpuStateSeconds=[SECONDS]).replace("1.0", "NaN"),
    "-Infinity seconds": doc(gpuStateSeconds=[SECONDS]).replace("1.0", "-Infinity"),
    "nested 100000 deep": "[" * 100_000 + "]" * 100_000,
    "schema as a huge string": doc(schema="x" * 1_000_000),
}


@pytest.mark.parametrize("text", HOSTILE.values(), ids=HOSTILE.keys())
def test_a_hostile_history_is_corrupt(tmp_path: Path, text: str) -> None:
    path = tmp_path / "history.json"
    path.write_text(text)
    with pytest.raises(HistoryCorruptError) as caught:
        history_file.load(path)
    assert len(str(caught.value)) < 300


@pytest.mark.parametrize("text", HOSTILE.values(), ids=HOSTILE.keys())
def test_serve_sets_a_hostile_history_aside_and_starts_fresh(tmp_path: Path, text: str) -> None:
    path = tmp_path / "history.json"
    path.write_text(text)
    c, _node, _clock = controller(history=path)
    assert c.history == History(interval=c.interval)
    assert (tmp_path / "history.json.corrupt").read_text() == text
    c.tick()
    assert history_file.load(path).at is not None


@pytest.mark.parametrize("text", HOSTILE.values(), ids=HOSTILE.keys())
def test_ls_with_a_hostile_history_is_a_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str
) -> None:
    path = tmp_path / "history.json"
    path.write_text(text)
    args = ["ls", "--history", str(path), "--no-nomad", "--gpu-backend", "nvidia-smi"]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"gpuledger ls: --history {path}: not a gpuledger history")
    assert len(err) < 500


def test_a_planted_link_at_the_old_temporary_name_is_not_followed(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_text("precious")
    path = tmp_path / "history.json"
    (tmp_path / ".history.json.tmp").symlink_to(victim)
    history_file.save(path, History())
    assert victim.read_text() == "precious"
    assert history_file.load(path) == History()


def test_the_temporary_file_is_unique_and_gone_after_a_save(tmp_path: Path) -> None:
    path = tmp_path / "history.json"
    history_file.save(path, History())
    history_file.save(path, History())
    assert sorted(os.listdir(tmp_path)) == ["history.json"]
    assert path.stat().st_mode & 0o777 == 0o644


def test_serve_removes_what_a_kill_mid_save_left_and_nothing_else(tmp_path: Path) -> None:
    path = tmp_path / "history.json"
    history_file.save(path, History(interval=controller(history=None)[0].interval))
    before = path.read_bytes()
    # What mkstemp names a save's temporary file (".history.json.<random>.tmp"), left by kills,
    # beside files that only look alike and must stay.
    (tmp_path / ".history.json.k3x_9q2a.tmp").write_text('{"half": ')
    (tmp_path / ".history.json.zz81abcd.tmp").write_text("")
    outside = tmp_path / "outside"
    outside.write_text("not ours")
    os.symlink(outside, tmp_path / ".history.json.link0001.tmp")
    keep = [".history.json..tmp", "history.json.corrupt", ".other.json.abcdefgh.tmp", "x.tmp"]
    for name in keep:
        (tmp_path / name).write_text("keep")
    c, _node, _clock = controller(history=path)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["history.json", "outside", *keep])
    assert outside.read_text() == "not ours"  # the link went, not what it pointed to
    assert path.read_bytes() == before
    assert c.history == history_file.load(path)
