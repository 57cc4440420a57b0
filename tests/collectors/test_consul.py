"""The fleet's Consul reader against a Consul agent on loopback serving the health API's own
sample (Consul's docs, ``tests/fixtures/consul``): passing instances become targets, an ACL
filter that hides everything is said, and the token is sent and never shown."""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from typing import Any

import pytest

from gpuledger.collectors.consul import ConsulCatalog, ConsulSettings
from gpuledger.errors import SourceError, SourceName
from gpuledger.model.fleet_values import Target
from gpuledger.sim.consul_api import FakeConsul
from tests.paths import FIXTURES

SAMPLE: list[dict[str, Any]] = json.loads(
    (FIXTURES / "consul" / "health-service.json").read_text(encoding="utf-8")
)


@pytest.fixture
def agent() -> Iterator[FakeConsul]:
    with FakeConsul(lambda service: copy.deepcopy(SAMPLE) if service == "redis" else []) as fake:
        yield fake


def test_the_docs_sample_is_one_target_at_the_service_address(agent: FakeConsul) -> None:
    catalog = ConsulCatalog(ConsulSettings(addr=agent.url), "redis")
    assert catalog.instances("http") == (Target("http://10.1.10.12:8000", name="foobar"),)


def test_the_token_is_sent_and_a_wrong_one_is_never_shown(agent: FakeConsul) -> None:
    agent.token = "the-token"  # noqa: S105 - a test token
    good = ConsulCatalog(ConsulSettings(addr=agent.url, token="the-token"), "redis")  # noqa: S106
    assert len(good.instances("http")) == 1
    wrong = ConsulCatalog(ConsulSettings(addr=agent.url, token="s3cr3t"), "redis")  # noqa: S106
    with pytest.raises(SourceError) as caught:
        wrong.instances("http")
    assert caught.value.source is SourceName.CONSUL
    assert "s3cr3t" not in f"{caught.value} {caught.value.hint}"


def test_an_answer_the_acls_emptied_names_the_policy_to_grant(agent: FakeConsul) -> None:
    agent.token = "blind"  # noqa: S105 - a test token
    agent.blind_tokens.add("blind")
    catalog = ConsulCatalog(ConsulSettings(addr=agent.url, token="blind"), "redis")  # noqa: S106
    with pytest.raises(SourceError, match="filtered the answer by ACLs") as caught:
        catalog.instances("http")
    assert 'service "<name>" { policy = "read" }' in str(caught.value.hint)
