"""A job whose owner meta cannot be used is said once, as a named warning, never a traceback;
and the loop's counters and snapshot carry the owner labels the keys name."""

from __future__ import annotations

from dataclasses import replace

from structlog.testing import capture_logs

from gpuledger.controller.loop import NodeController
from gpuledger.controller.sources import Guard
from gpuledger.core.node_join import Desired, Observed
from gpuledger.model import Allocation, NomadView
from gpuledger.model.owners import resolve_owner
from gpuledger.policy.load import default_policy
from tests.controller.test_loop import EVERY, NODE, FakeClock, FakeNode, run_ticks

KEYS = ("owner", "team")
META = {"owner": "alice\x1b[2J", "team": "ml"}


class OwnedNode(FakeNode):
    """The fake node, its allocation a1 (job train) with meta whose owner is unusable."""

    def read(self, guard: Guard | None = None) -> tuple[Desired, Observed]:
        desired, observed = super().read(guard)
        assert desired.view is not None
        (alloc,) = desired.view.allocations
        owner = resolve_owner(META, alloc.namespace, KEYS)
        owned = replace(alloc, owners={"t": owner}, owner=owner)
        other = Allocation("a2", "research", "eval", "g", "running", {}, {}, owner)
        view = NomadView(node_id="node-1", allocations=(owned, other))
        return replace(desired, view=view), observed


def test_an_unusable_owner_is_warned_once_per_job_and_the_next_key_owns_it() -> None:
    clock = FakeClock()
    node = OwnedNode(clock)
    c = NodeController(node, default_policy(), NODE, EVERY, clock=clock, owner_keys=KEYS)
    with capture_logs() as logs:
        run_ticks(c, node, 3)
    warned = [e for e in logs if e["event"] == "nomad.owner_meta_unusable"]
    # Two jobs (train, eval) over three ticks: each said once.
    assert sorted(e["job"] for e in warned) == ["eval", "train"]
    for e in warned:
        assert e["log_level"] == "warning"
        assert e["namespace"] == "research"
        assert len(e["problems"]) == 1 and e["problems"][0].startswith("meta owner:")
        assert "exc_info" not in e
    snap = c.snapshot
    assert snap is not None and snap.owner_keys == KEYS
    reservation = snap.ledger.gpus[0].reservation
    assert reservation is not None
    # The owner key's value is unusable: the team owns the job.
    assert reservation.owner == "ml"
    keys = {key[:3]: key.owner for key in snap.history.job_seconds}
    assert keys == {("research", "train", "held"): reservation.owner_labels}
