"""A process on a GPU the driver does not list is said, never dropped."""

from __future__ import annotations

from gpuledger.core.node_join import reconcile
from gpuledger.model import Code, Gpu, Level, Since
from gpuledger.policy.evaluate import evaluate
from gpuledger.policy.load import default_policy
from tests.core.test_node_join import AT, G0, HOST, nomad, observed
from tests.core.test_node_join import NODE as LEDGER_NODE


def test_a_process_on_a_gpu_the_driver_does_not_list_is_said() -> None:
    stray = "GPU-99999999-0000-0000-0000-000000000000"
    obs = observed({7: (G0, HOST), 8: (stray, HOST)}, gpu_list=(Gpu(0, G0, "NVIDIA H200"),))
    ledger = reconcile(nomad(), obs, LEDGER_NODE, AT)
    assert [p.pid for p in ledger.unlisted] == [8]
    said = [f for f in evaluate(ledger, default_policy(), Since(), AT) if f.gpu == stray]
    assert [(f.code, f.level) for f in said] == [(Code.SOURCE_UNAVAILABLE, Level.ERROR)]
    assert "python3 (pid 8)" in said[0].message
