"""Malformed answers of Docker, Podman and Nomad, served by a canned HTTP server to the real
clients (docker SDK, python-nomad): each is that source's ``SourceError``, never an exception
that escapes the collector."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from gpuledger.collectors.nomad import NomadReader, parse_allocation
from gpuledger.collectors.nomad_transport import NomadSettings
from gpuledger.collectors.runtimes import RuntimeClient, container_of
from gpuledger.errors import SourceError

CID = "a" * 64
NODE = "5f0d8a2e-9c41-4b7e-a3d6-2e8c1b9f7a04"
ALLOC = "8d3f1a6c-2b4e-4c1d-9f0a-7e5b3c2d1a90"


class Canned(ThreadingHTTPServer):
    """Answers each path with the JSON text set for it (404 for others)."""

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.bodies: dict[str, str] = {}

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class _Handler(BaseHTTPRequestHandler):
    server: Canned

    def do_GET(self) -> None:
        path = self.path.split("?")[0]
        body = self.server.bodies.get(path)
        raw = (body if body is not None else '{"message": "no"}').encode("utf-8", "surrogatepass")
        self.send_response(200 if body is not None else 404)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def canned() -> Iterator[Canned]:
    server = Canned()
    threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
    yield server
    server.shutdown()
    server.server_close()


SURROGATE = '"\\ud800"'
INSPECTS = {
    "not an object": "[1, 2]",
    "Config a list": json.dumps({"Id": CID, "Name": "/x", "Config": [1]}),
    "Labels a string": json.dumps({"Id": CID, "Name": "/x", "Config": {"Labels": "a=b"}}),
    "label value an object": json.dumps({"Id": CID, "Config": {"Labels": {"a": {"b": 1}}}}),
    "Name a number": json.dumps({"Id": CID, "Name": 5, "Config": {}}),
    "lone surrogate in a label": f'{{"Id": "{CID}", "Config": {{"Labels": {{"a": {SURROGATE}}}}}}}',
    "lone surrogate in the name": f'{{"Id": "{CID}", "Name": {SURROGATE}}}',
}


@pytest.mark.parametrize("body", INSPECTS.values(), ids=INSPECTS.keys())
@pytest.mark.parametrize("runtime", ["docker", "podman"])
def test_a_malformed_inspect_is_the_runtimes_source_error(
    canned: Canned, runtime: str, body: str
) -> None:
    canned.bodies["/version"] = json.dumps({"ApiVersion": "1.41", "MinAPIVersion": "1.12"})
    canned.bodies[f"/v1.41/containers/{CID}/json"] = body
    client = RuntimeClient(runtime, canned.url.replace("http", "tcp"))  # type: ignore[arg-type]
    with pytest.raises(SourceError) as caught:
        client.inspect([CID])
    assert caught.value.source == runtime
    assert "cannot read" in caught.value.message


def test_a_well_formed_inspect_still_reads(canned: Canned) -> None:
    canned.bodies["/version"] = json.dumps({"ApiVersion": "1.41", "MinAPIVersion": "1.12"})
    doc = {"Id": CID, "Name": "/x", "Config": {"Labels": None}}
    canned.bodies[f"/v1.41/containers/{CID}/json"] = json.dumps(doc)
    found = RuntimeClient("docker", canned.url.replace("http", "tcp")).inspect([CID])
    assert found[CID].name == "x"
    assert container_of({"Id": CID, "Config": None}, "podman").labels == {}


GPU_DEVICE = {"Vendor": "nvidia", "Type": "gpu", "DeviceIDs": [1]}
GOOD_ALLOC = {"ID": ALLOC, "Namespace": "default", "JobID": "j", "ClientStatus": "running"}
ALLOCS = {
    "a list of numbers": "[1]",
    "an object, not a list": "{}",
    "Namespace a number": json.dumps([{**GOOD_ALLOC, "Namespace": 5}]),
    "JobID an object": json.dumps([{**GOOD_ALLOC, "JobID": {"a": 1}}]),
    "Tasks a list": json.dumps([{**GOOD_ALLOC, "AllocatedResources": {"Tasks": [1]}}]),
    "Devices an object": json.dumps(
        [{**GOOD_ALLOC, "AllocatedResources": {"Tasks": {"t": {"Devices": {"a": 1}}}}}]
    ),
    "DeviceIDs numbers": json.dumps(
        [
            {
                **GOOD_ALLOC,
                "AllocatedResources": {
                    "Tasks": {
                        "t": {"Devices": [{"Vendor": "nvidia", "Type": "gpu", "DeviceIDs": [1]}]}
                    }
                },
            }
        ]
    ),
    "lone surrogate in the job": f'[{{"ID": "{ALLOC}", "JobID": {SURROGATE}}}]',
}


def nomad(canned: Canned, **bodies: str) -> NomadReader:
    canned.bodies.update(
        {
            "/v1/agent/self": json.dumps({"stats": {"client": {"node_id": NODE}}}),
            f"/v1/node/{NODE}": json.dumps({"ID": NODE, "Name": "gpu-1"}),
            f"/v1/node/{NODE}/allocations": "[]",
        }
    )
    canned.bodies.update(bodies)
    return NomadReader(NomadSettings(addr=canned.url))


@pytest.mark.parametrize("body", ALLOCS.values(), ids=ALLOCS.keys())
def test_a_malformed_allocation_list_is_nomads_source_error(canned: Canned, body: str) -> None:
    reader = nomad(canned, **{f"/v1/node/{NODE}/allocations": body})
    with pytest.raises(SourceError) as caught:
        reader.read()
    assert caught.value.source == "nomad"


@pytest.mark.parametrize("body", ["[]", '"x"', '{"stats": [1]}', '{"stats": {"client": 5}}'])
def test_a_malformed_agent_self_is_nomads_source_error(canned: Canned, body: str) -> None:
    with pytest.raises(SourceError, match=r"stats\.client\.node_id"):
        nomad(canned, **{"/v1/agent/self": body}).read()


def test_a_malformed_node_is_nomads_source_error(canned: Canned) -> None:
    with pytest.raises(SourceError, match="answered no object"):
        nomad(canned, **{f"/v1/node/{NODE}": "[1]"}).read()


@pytest.mark.parametrize("body", ["[1]", json.dumps({**GOOD_ALLOC, "Namespace": []})])
def test_a_malformed_allocation_lookup_is_nomads_source_error(canned: Canned, body: str) -> None:
    reader = nomad(canned, **{f"/v1/allocation/{ALLOC}": body})
    with pytest.raises(SourceError, match="cannot read"):
        reader.read([ALLOC])


def test_parse_allocation_names_what_is_malformed() -> None:
    with pytest.raises(ValueError, match=r"allocation .*\.Namespace is not a string"):
        parse_allocation({**GOOD_ALLOC, "Namespace": 5})
    assert parse_allocation({**GOOD_ALLOC, "Namespace": None}).namespace == "default"
