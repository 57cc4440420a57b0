"""The Nomad collector against the fake Nomad API, through the real python-nomad client."""

# ruff: noqa: S105, S106 (test tokens)

from __future__ import annotations

import json
import shutil
import ssl
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest
import requests

from gpuledger.collectors.nomad import (
    NomadReader,
    NomadSettings,
    parse_allocation,
    settings_from_env,
)
from gpuledger.errors import ConfigError, SourceError
from gpuledger.model import AllocLookup
from gpuledger.sim.nomad_api import FakeNomad

FIXTURES = Path(__file__).resolve().parents[2] / "shared" / "fixtures" / "nomad"

NODE = "5d5f8b1e-3c55-4f4a-9a43-0c1b6f0b2a10"
GPU0 = "GPU-0b2c7e3a-9f1d-4a57-b0c4-7e1f0b6d2a11"
GPU1 = "GPU-1c3d8f4b-0a2e-4b68-c1d5-8f2a1c7e3b22"
MIG = "MIG-2d4e9a5c-1b3f-4c79-d2e6-9a3b2d8f4c33"
ALLOC = "8f2c4a1e-5b7d-4e39-a0c6-d1e2f3a4b5c6"
OTHER = "9a3d5b2f-6c8e-4f4a-b1d7-e2f3a4b5c6d7"
TOKEN = "0c7e9b3a-ffff-4a2b-9c1d-123456789abc"


def spec(alloc_id: str = ALLOC, **overrides: Any) -> dict[str, Any]:
    """A simple allocation spec for the fake: one task on GPU0."""
    base: dict[str, Any] = {
        "id": alloc_id,
        "namespace": "default",
        "job": "train",
        "group": "g",
        "client_status": "running",
        "tasks": {"trainer": [GPU0]},
    }
    base.update(overrides)
    return base


@pytest.fixture
def fake() -> Iterator[FakeNomad]:
    server = FakeNomad(NODE, gpus=[GPU0, GPU1])
    server.start()
    yield server
    server.stop()


def reader_for(fake: FakeNomad, **settings: Any) -> NomadReader:
    return NomadReader(NomadSettings(addr=fake.url, **settings))


def paths(fake: FakeNomad) -> list[str]:
    return [r.path for r in fake.requests]


def source_error(reader: NomadReader, *ids: str) -> SourceError:
    with pytest.raises(SourceError) as caught:
        reader.read(ids)
    assert caught.value.source == "nomad"
    assert caught.value.hint
    return caught.value


# --------------------------------------------------------------------------- parsing


def test_docs_samples_reserve_no_gpu() -> None:
    listed = json.loads((FIXTURES / "node-allocations.json").read_text())
    alloc = parse_allocation(listed[0])
    assert alloc.id == "fefe81d0-08b2-4eca-fae6-6560cde46d31"
    assert (alloc.namespace, alloc.job, alloc.group) == ("default", "webapp", "webapp")
    assert alloc.client_status == "running"
    assert dict(alloc.gpus_by_task) == {}

    # The Read Allocation sample has no Namespace at all.
    read = parse_allocation(json.loads((FIXTURES / "allocation.json").read_text()))
    assert (read.id, read.namespace) == ("a8198d79-cfdb-6593-a999-1e9adabcba2e", "default")
    assert (read.job, read.group) == ("example", "cache")
    assert dict(read.gpus_by_task) == {}


def test_only_nvidia_gpu_devices_are_reservations() -> None:
    doc = {
        "ID": ALLOC,
        "Namespace": "ml",
        "JobID": "train",
        "TaskGroup": "g",
        "ClientStatus": "running",
        "AllocatedResources": {
            "Tasks": {
                "trainer": {
                    "Devices": [
                        {
                            "Vendor": "nvidia",
                            "Type": "gpu",
                            "Name": "NVIDIA H200",
                            "DeviceIDs": [GPU0, GPU1],
                        },
                        {
                            "Vendor": "nvidia",
                            "Type": "gpu",
                            "Name": "NVIDIA H200 MIG 1g.18gb",
                            "DeviceIDs": [MIG],
                        },
                        {
                            "Vendor": "xilinx",
                            "Type": "fpga",
                            "Name": "u250",
                            "DeviceIDs": ["fpga-0"],
                        },
                    ]
                },
                "sidecar": {"Devices": None},
                "empty": {"Devices": [{"Vendor": "nvidia", "Type": "gpu", "DeviceIDs": None}]},
                "nic": {"Devices": [{"Vendor": "nvidia", "Type": "nic", "DeviceIDs": ["mlx-0"]}]},
            }
        },
    }
    alloc = parse_allocation(doc)
    assert alloc.namespace == "ml"
    assert dict(alloc.gpus_by_task) == {"trainer": (GPU0, GPU1, MIG)}


def test_allocation_without_id_is_refused() -> None:
    with pytest.raises(ValueError, match="ID"):
        parse_allocation({"JobID": "x"})


def test_fake_allocations_carry_the_fields_of_real_ones(fake: FakeNomad) -> None:
    fake.set_allocations([spec(tasks={"trainer": [GPU0, MIG], "log-shipper": []})])
    view = reader_for(fake).read()
    assert view.node_id == NODE
    (alloc,) = view.allocations
    assert (alloc.id, alloc.namespace, alloc.job, alloc.group) == (ALLOC, "default", "train", "g")
    assert dict(alloc.gpus_by_task) == {"trainer": (GPU0, MIG)}

    # The fake's JSON has every top-level field of the docs sample (and AllocatedResources).
    served = requests.get(f"{fake.url}/v1/node/{NODE}/allocations", timeout=5).json()
    sample = json.loads((FIXTURES / "node-allocations.json").read_text())[0]
    assert set(sample) <= set(served[0])
    tasks = served[0]["AllocatedResources"]["Tasks"]
    assert tasks["log-shipper"]["Devices"] is None
    assert set(tasks["trainer"]) == {"Cpu", "Memory", "Networks", "Devices"}


def test_terminal_allocations_are_returned_and_marked(fake: FakeNomad) -> None:
    fake.set_allocations(
        [
            spec("a-complete", client_status="complete"),
            spec("a-failed", client_status="failed"),
            spec("a-lost", client_status="lost"),
            spec("a-running", client_status="running"),
            spec("a-pending", client_status="pending"),
        ]
    )
    view = reader_for(fake).read()
    terminal = {a.id: a.terminal for a in view.allocations}
    assert terminal == {
        "a-complete": True,
        "a-failed": True,
        "a-lost": True,
        "a-running": False,
        "a-pending": False,
    }
    assert view.lookups == {}


# --------------------------------------------------------------------------- node id


def test_node_id_comes_from_agent_self_once(fake: FakeNomad) -> None:
    fake.set_allocations([spec()])
    reader = reader_for(fake)
    assert reader.read().node_id == NODE
    assert reader.read().node_id == NODE
    assert paths(fake) == [
        "/v1/agent/self",
        f"/v1/node/{NODE}",
        f"/v1/node/{NODE}/allocations",
        f"/v1/node/{NODE}/allocations",
    ]
    # One session: the second read reused the first connection.
    assert fake.accepted == 1


def test_fake_agent_self_has_the_stats_of_the_docs_sample(fake: FakeNomad) -> None:
    served = requests.get(f"{fake.url}/v1/agent/self", timeout=5).json()
    sample = json.loads((FIXTURES / "agent-self.json").read_text())
    assert set(served) == set(sample)
    assert set(served["stats"]["client"]) == set(sample["stats"]["client"])


def test_given_node_id_skips_agent_self(fake: FakeNomad) -> None:
    reader_for(fake, node_id=NODE).read()
    assert "/v1/agent/self" not in paths(fake)


def test_unknown_node_id_is_an_error_not_a_free_node(fake: FakeNomad) -> None:
    err = source_error(reader_for(fake, node_id="no-such-node"))
    assert "no-such-node" in err.message
    assert "404" in err.message
    assert "--nomad-node-id" in (err.hint or "")
    assert "/v1/node/no-such-node/allocations" not in paths(fake)


def test_server_only_agent_has_no_node(fake: FakeNomad) -> None:
    fake.client_agent = False
    err = source_error(reader_for(fake))
    assert "stats.client.node_id" in err.message
    assert "--nomad-node-id" in (err.hint or "")


# --------------------------------------------------------------------------- failures


def test_403_on_agent_self_names_agent_read(fake: FakeNomad) -> None:
    fake.fault("403")
    err = source_error(reader_for(fake))
    assert "/v1/agent/self answered 403 Permission denied" in err.message
    assert "agent:read" in err.message
    assert "--nomad-node-id" in (err.hint or "")


def test_403_on_node_names_node_read(fake: FakeNomad) -> None:
    fake.fault("403")
    err = source_error(reader_for(fake, node_id=NODE))
    assert f"/v1/node/{NODE} answered 403" in err.message
    assert "node:read" in err.message


def test_500_names_the_endpoint_and_body(fake: FakeNomad) -> None:
    reader = reader_for(fake)
    reader.read()
    fake.fault("500")
    err = source_error(reader)
    assert err.message == (
        f"GET /v1/node/{NODE}/allocations answered 500: rpc error: No cluster leader"
    )


def test_expired_token_says_it_expired(fake: FakeNomad) -> None:
    fake.fault("expired")
    err = source_error(reader_for(fake, token=TOKEN))
    assert "expired" in err.message
    assert "token" in (err.hint or "")
    assert TOKEN not in f"{err} {err.hint}"


def test_unreachable_names_the_address_and_recovers(fake: FakeNomad) -> None:
    reader = reader_for(fake)
    reader.read()
    fake.fault("down")
    err = source_error(reader)
    assert err.message.startswith(f"Nomad at {fake.url} is unreachable")
    fake.fault(None)
    assert reader.read().node_id == NODE


# --------------------------------------------------------------------------- tokens


def test_token_is_sent_and_never_shown(fake: FakeNomad) -> None:
    fake.required_token = TOKEN
    err = source_error(reader_for(fake))
    assert "ACL token not found" in err.message
    assert [r.token_sent for r in fake.requests] == [False]

    settings = NomadSettings(addr=fake.url, token=TOKEN)
    reader = NomadReader(settings)
    assert reader.read().node_id == NODE
    assert all(r.token_sent for r in fake.requests[1:])
    assert TOKEN not in repr(settings)
    assert TOKEN not in repr(reader)

    fake.fault("403")
    err = source_error(NomadReader(settings))
    assert TOKEN not in f"{err} {err.hint} {err!r}"


def test_process_environment_does_not_leak_into_requests(
    fake: FakeNomad, monkeypatch: pytest.MonkeyPatch
) -> None:
    # python-nomad reads these from os.environ on its own; the settings must win.
    monkeypatch.setenv("NOMAD_TOKEN", "leaked-token")
    monkeypatch.setenv("NOMAD_NAMESPACE", "leaked")
    monkeypatch.setenv("NOMAD_REGION", "leaked")
    reader_for(fake).read()
    assert [(r.token_sent, r.query) for r in fake.requests] == [(False, "")] * 3


def test_token_file_is_read_again_at_every_read(fake: FakeNomad, tmp_path: Path) -> None:
    token_file = tmp_path / "nomad_token"
    token_file.write_text("first-token\n")
    fake.required_token = "first-token"
    reader = reader_for(fake, token="ignored-env-token", token_file=token_file)
    assert reader.read().node_id == NODE
    # Nomad rotates a workload identity's token: the next read must use the new one.
    token_file.write_text("second-token\n")
    fake.required_token = "second-token"
    assert reader.read().node_id == NODE


def test_unreadable_files_are_usage_errors(tmp_path: Path) -> None:
    missing = tmp_path / "missing.pem"
    with pytest.raises(ConfigError, match=r"missing\.pem"):
        NomadReader(NomadSettings(token_file=missing))
    with pytest.raises(ConfigError, match=r"missing\.pem"):
        NomadReader(NomadSettings(addr="https://127.0.0.1:4646", ca_cert=missing))
    with pytest.raises(ConfigError, match="NOMAD_CLIENT_CERT"):
        NomadReader(NomadSettings(addr="https://127.0.0.1:4646", client_cert=missing))
    with pytest.raises(ConfigError, match="ftp://x"):
        NomadReader(NomadSettings(addr="ftp://x"))


# --------------------------------------------------------------------------- lookups


def test_lookups_tell_hidden_gone_and_moved(fake: FakeNomad) -> None:
    hidden, gone, moved = "a-hidden", "a-gone", "a-moved"
    fake.set_allocations(
        [
            spec(),
            spec(hidden, namespace="secret", job="private"),
            spec(gone),
            spec(moved, node_id="another-node", client_status="complete"),
        ]
    )
    fake.set_gone([gone])
    fake.set_hidden_namespaces({"secret"})
    view = reader_for(fake).read([ALLOC, hidden, gone, moved])

    assert [a.id for a in view.allocations] == [ALLOC]
    assert set(view.lookups) == {hidden, gone, moved}
    assert view.lookups[hidden].status is AllocLookup.FORBIDDEN
    assert "read-job" in (view.lookups[hidden].error or "")
    assert view.lookups[gone].status is AllocLookup.GONE
    visible = view.lookups[moved]
    assert visible.status is AllocLookup.VISIBLE
    assert visible.allocation is not None
    assert (visible.allocation.id, visible.allocation.terminal) == (moved, True)
    assert f"/v1/allocation/{ALLOC}" not in paths(fake)


class FailingLookups(FakeNomad):
    """A Nomad whose allocation reads fail with a 500."""

    def answer(self, method: str, target: str, token: str | None) -> tuple[int, Any]:
        if target.startswith("/v1/allocation/"):
            return 500, "rpc error: stream closed"
        return super().answer(method, target, token)


def test_lookup_that_fails_otherwise_is_failed() -> None:
    with FailingLookups(NODE) as fake:
        view = reader_for(fake).read([OTHER])
    assert view.lookups[OTHER].status is AllocLookup.FAILED
    assert "500" in (view.lookups[OTHER].error or "")


# --------------------------------------------------------------------------- settings


def test_settings_from_env() -> None:
    env = {
        "NOMAD_ADDR": "https://nomad.example:4646",
        "NOMAD_TOKEN": TOKEN,
        "NOMAD_CACERT": "/etc/nomad/ca.pem",
        "NOMAD_CAPATH": "/etc/nomad/cas",
        "NOMAD_CLIENT_CERT": "/etc/nomad/cli.pem",
        "NOMAD_CLIENT_KEY": "/etc/nomad/cli-key.pem",
        "NOMAD_TLS_SERVER_NAME": "client.global.nomad",
        "NOMAD_SKIP_VERIFY": "true",
    }
    assert settings_from_env(env) == NomadSettings(
        addr="https://nomad.example:4646",
        token=TOKEN,
        ca_cert=Path("/etc/nomad/ca.pem"),
        ca_path=Path("/etc/nomad/cas"),
        client_cert=Path("/etc/nomad/cli.pem"),
        client_key=Path("/etc/nomad/cli-key.pem"),
        tls_server_name="client.global.nomad",
        skip_verify=True,
    )
    assert settings_from_env({}) == NomadSettings(addr="http://127.0.0.1:4646")
    assert settings_from_env({"NOMAD_TOKEN": "", "NOMAD_SKIP_VERIFY": "0"}).token is None
    with pytest.raises(ConfigError, match="NOMAD_SKIP_VERIFY"):
        settings_from_env({"NOMAD_SKIP_VERIFY": "yes please"})


# --------------------------------------------------------------------------- TLS


@dataclass(frozen=True)
class Pki:
    ca: Path
    ca_dir: Path
    other_ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def _make_ca(name: str, cwd: Path) -> None:
    _openssl(
        "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
        "-keyout", f"{name}.key", "-out", f"{name}.pem", "-days", "2", "-subj", f"/CN={name}",
        "-addext", "basicConstraints=critical,CA:TRUE",
        "-addext", "keyUsage=critical,keyCertSign,cRLSign",
        cwd=cwd,
    )  # fmt: skip


def _make_leaf(name: str, ca: str, extensions: str, cwd: Path) -> None:
    (cwd / f"{name}.ext").write_text(extensions)
    _openssl(
        "req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
        "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", f"/CN={name}",
        cwd=cwd,
    )  # fmt: skip
    _openssl(
        "x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.pem", "-CAkey", f"{ca}.key",
        "-CAcreateserial", "-out", f"{name}.pem", "-days", "2", "-extfile", f"{name}.ext",
        cwd=cwd,
    )  # fmt: skip


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    if shutil.which("openssl") is None:
        pytest.skip("the openssl command is needed to make test certificates")
    d = tmp_path_factory.mktemp("pki")
    _make_ca("ca", d)
    _make_ca("other-ca", d)
    common = "basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature\n"
    # As `nomad tls cert create -server` makes them, but without 127.0.0.1: so that the
    # address 127.0.0.1 is a name mismatch and tls_server_name has something to fix.
    _make_leaf(
        "server",
        "ca",
        common + "extendedKeyUsage=serverAuth\n"
        "subjectAltName=DNS:server.global.nomad,DNS:localhost\n",
        d,
    )
    _make_leaf("client", "ca", common + "extendedKeyUsage=clientAuth\n", d)
    ca_dir = d / "cas"
    ca_dir.mkdir()
    shutil.copy(d / "ca.pem", ca_dir / "ca.pem")
    _openssl("rehash", str(ca_dir), cwd=d)
    return Pki(
        ca=d / "ca.pem",
        ca_dir=ca_dir,
        other_ca=d / "other-ca.pem",
        server_cert=d / "server.pem",
        server_key=d / "server.key",
        client_cert=d / "client.pem",
        client_key=d / "client.key",
    )


def server_context(pki: Pki, require_client_cert: bool = False) -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(pki.server_cert, pki.server_key)
    if require_client_cert:
        context.verify_mode = ssl.CERT_REQUIRED
        context.load_verify_locations(pki.ca)
    return context


@pytest.fixture
def tls_fake(pki: Pki) -> Iterator[FakeNomad]:
    with FakeNomad(NODE, tls=server_context(pki)) as server:
        yield server


def test_tls_verified_with_the_ca_file(tls_fake: FakeNomad, pki: Pki) -> None:
    addr = f"https://localhost:{tls_fake.port}"
    assert NomadReader(NomadSettings(addr=addr, ca_cert=pki.ca)).read().node_id == NODE


def test_tls_verified_with_the_ca_directory(tls_fake: FakeNomad, pki: Pki) -> None:
    addr = f"https://localhost:{tls_fake.port}"
    assert NomadReader(NomadSettings(addr=addr, ca_path=pki.ca_dir)).read().node_id == NODE


def test_tls_untrusted_ca_names_the_ca_file(tls_fake: FakeNomad, pki: Pki) -> None:
    addr = f"https://localhost:{tls_fake.port}"
    err = source_error(NomadReader(NomadSettings(addr=addr, ca_cert=pki.other_ca)))
    assert str(pki.other_ca) in err.message
    assert "not trusted" in err.message
    # python-nomad alone would not have verified anything: no request reached the fake.
    assert tls_fake.requests == []


def test_tls_is_verified_without_any_ca_setting(tls_fake: FakeNomad) -> None:
    err = source_error(NomadReader(NomadSettings(addr=f"https://localhost:{tls_fake.port}")))
    assert "system's CA store" in err.message
    assert "NOMAD_CACERT" in (err.hint or "")


def test_tls_wrong_server_name_is_named(tls_fake: FakeNomad, pki: Pki) -> None:
    err = source_error(NomadReader(NomadSettings(addr=tls_fake.url, ca_cert=pki.ca)))
    assert "'127.0.0.1'" in err.message
    assert "NOMAD_TLS_SERVER_NAME" in (err.hint or "")

    wrong = NomadSettings(addr=tls_fake.url, ca_cert=pki.ca, tls_server_name="client.global.nomad")
    err = source_error(NomadReader(wrong))
    assert "'client.global.nomad'" in err.message


def test_tls_server_name_override(tls_fake: FakeNomad, pki: Pki) -> None:
    settings = NomadSettings(
        addr=tls_fake.url, ca_cert=pki.ca, tls_server_name="server.global.nomad"
    )
    assert NomadReader(settings).read().node_id == NODE


def test_tls_skip_verify(tls_fake: FakeNomad) -> None:
    settings = NomadSettings(addr=tls_fake.url, skip_verify=True)
    assert NomadReader(settings).read().node_id == NODE


def test_tls_client_certificate(pki: Pki) -> None:
    with FakeNomad(NODE, tls=server_context(pki, require_client_cert=True)) as fake:
        base = NomadSettings(addr=f"https://localhost:{fake.port}", ca_cert=pki.ca)
        err = source_error(NomadReader(base))
        assert "requires a client certificate and none was given" in err.message
        assert "NOMAD_CLIENT_CERT" in (err.hint or "")
        with_cert = replace(base, client_cert=pki.client_cert, client_key=pki.client_key)
        assert NomadReader(with_cert).read().node_id == NODE


# --------------------------------------------------------------------------- unix socket


def test_unix_socket_address(tmp_path: Path) -> None:
    sock = tmp_path / "api.sock"
    with FakeNomad(NODE, unix_socket=sock) as fake:
        fake.required_token = TOKEN
        fake.set_allocations([spec()])
        assert fake.url == f"unix://{sock}"
        reader = NomadReader(NomadSettings(addr=fake.url, token=TOKEN))
        view = reader.read()
        assert [a.id for a in view.allocations] == [ALLOC]
        reader.read()
        assert fake.accepted == 1
        fake.fault("down")
        err = source_error(reader)
        assert err.message.startswith(f"Nomad at unix://{sock} is unreachable")
