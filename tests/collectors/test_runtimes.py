"""Runtime collector against the fake Docker/Podman API, through the real docker SDK."""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import docker
import docker.errors
import pytest

from gpuledger.collectors.runtimes import RuntimeClient, check_url, default_socket
from gpuledger.errors import ConfigError, SourceError
from gpuledger.model import Container
from gpuledger.model.labels import alloc_of
from gpuledger.sim.docker_api import FakeDockerApi
from tests.paths import FIXTURES

FIXTURES = FIXTURES / "containers"

ALLOC = "8d3f1a6c-2b4e-4c1d-9f0a-7e5b3c2d1a90"
OTHER_ALLOC = "0b2c1d7e-1111-4222-8333-944455556666"
TRAINER = "72e5a5ff5eef3c4222a6551b992b9360a99122f77d2229783f0ee0946dfd800e"
PODMAN_TASK = "a2bc7b153f034b17f358cde43a7f8c7475147e8a0d1b2573c26473244ec44ce4"
NOTEBOOK = "31cb02944da7a12196a193cf0e0f6c226d7c453a1db62e65ba98287593a2ee30"

DOCKER_TRAINER = {
    "id": TRAINER,
    "name": f"trainer-{ALLOC}",
    "labels": {"com.hashicorp.nomad.alloc_id": ALLOC, "team": "vision"},
    "pid": 4242,
}
PODMAN_ENCODER = {"id": PODMAN_TASK, "name": f"encode-{ALLOC}", "labels": {}, "pid": 5151}
NOTEBOOK_CONTAINER = {"id": NOTEBOOK, "name": "jupyter", "labels": {}, "pid": 6161}


@pytest.fixture
def sockdir() -> Iterator[Path]:
    # pytest's tmp_path can exceed the 107-byte limit of a unix socket path.
    directory = Path(tempfile.mkdtemp(prefix="gl-", dir="/tmp"))
    yield directory
    shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture
def docker_api(sockdir: Path) -> Iterator[FakeDockerApi]:
    api = FakeDockerApi(sockdir / "docker.sock", flavor="docker")
    api.set_containers([DOCKER_TRAINER, NOTEBOOK_CONTAINER])
    api.start()
    yield api
    api.stop()


@pytest.fixture
def podman_api(sockdir: Path) -> Iterator[FakeDockerApi]:
    api = FakeDockerApi(sockdir / "podman.sock", flavor="podman")
    api.set_containers([PODMAN_ENCODER])
    api.start()
    yield api
    api.stop()


def _inspects(api: FakeDockerApi) -> list[str]:
    return [path for _, path in api.requests if path.endswith("/json") and "/containers/" in path]


# ----------------------------------------------------------------------------- RuntimeClient


def test_labelled_docker_container(docker_api: FakeDockerApi) -> None:
    client = RuntimeClient("docker", docker_api.url)
    found = client.inspect([TRAINER])
    assert found == {
        TRAINER: Container(
            id=TRAINER,
            name=f"trainer-{ALLOC}",
            runtime="docker",
            labels={"com.hashicorp.nomad.alloc_id": ALLOC, "team": "vision"},
        )
    }
    assert alloc_of(found[TRAINER]) == (ALLOC, "trainer", False)


def test_podman_container_named_by_nomad(podman_api: FakeDockerApi) -> None:
    client = RuntimeClient("podman", podman_api.url)
    found = client.inspect([PODMAN_TASK])
    assert found[PODMAN_TASK].name == f"encode-{ALLOC}"
    assert found[PODMAN_TASK].runtime == "podman"
    assert found[PODMAN_TASK].labels == {}
    assert alloc_of(found[PODMAN_TASK]) == (ALLOC, "encode", True)


def test_exited_container_is_absent_not_an_error(docker_api: FakeDockerApi) -> None:
    client = RuntimeClient("docker", docker_api.url)
    gone = "f" * 64
    assert set(client.inspect([TRAINER, gone, NOTEBOOK])) == {TRAINER, NOTEBOOK}


def test_podman_404_body_is_absent_too(podman_api: FakeDockerApi) -> None:
    client = RuntimeClient("podman", podman_api.url)
    assert client.inspect(["e" * 64]) == {}


def test_each_container_is_inspected_once(docker_api: FakeDockerApi) -> None:
    client = RuntimeClient("docker", docker_api.url)
    client.inspect([TRAINER, NOTEBOOK, TRAINER, TRAINER])
    assert _inspects(docker_api) == [
        f"/v1.45/containers/{TRAINER}/json",
        f"/v1.45/containers/{NOTEBOOK}/json",
    ]


def test_client_is_reused_across_ticks(docker_api: FakeDockerApi) -> None:
    client = RuntimeClient("docker", docker_api.url)
    client.inspect([TRAINER])
    client.inspect([TRAINER])
    # The API version is asked once, at the first use, not at every tick.
    assert [path for _, path in docker_api.requests if path.endswith("/version")] == ["/version"]
    assert len(_inspects(docker_api)) == 2


def test_constructing_a_client_contacts_nothing(docker_api: FakeDockerApi, sockdir: Path) -> None:
    RuntimeClient("docker", docker_api.url)
    RuntimeClient("docker", f"unix://{sockdir}/missing.sock")
    assert docker_api.requests == []


def test_server_error_is_a_source_error(docker_api: FakeDockerApi) -> None:
    client = RuntimeClient("docker", docker_api.url)
    client.inspect([TRAINER])
    docker_api.fail_with(500)
    with pytest.raises(SourceError) as caught:
        client.inspect([TRAINER])
    assert caught.value.source == "docker"
    assert docker_api.url in caught.value.message
    assert "HTTP 500" in caught.value.message
    assert caught.value.hint is not None
    assert "--docker off" in caught.value.hint


def test_server_error_at_first_contact_is_a_source_error(podman_api: FakeDockerApi) -> None:
    podman_api.fail_with(503)
    with pytest.raises(SourceError) as caught:
        RuntimeClient("podman", podman_api.url).inspect([PODMAN_TASK])
    assert caught.value.source == "podman"
    assert podman_api.url in caught.value.message
    assert "503" in caught.value.message


def test_recovers_after_the_daemon_heals(docker_api: FakeDockerApi) -> None:
    client = RuntimeClient("docker", docker_api.url)
    docker_api.fail_with(500)
    with pytest.raises(SourceError):
        client.inspect([TRAINER])
    docker_api.fail_with(None)
    assert set(client.inspect([TRAINER])) == {TRAINER}


def test_socket_without_daemon_is_a_source_error(docker_api: FakeDockerApi) -> None:
    client = RuntimeClient("docker", docker_api.url)
    assert set(client.inspect([TRAINER])) == {TRAINER}
    docker_api.stop(keep_socket=True)
    assert docker_api.socket_path.exists()
    with pytest.raises(SourceError) as caught:
        client.inspect([TRAINER])
    assert str(docker_api.socket_path) in caught.value.message
    assert "refused" in caught.value.message
    # And a client that never talked to it fails the same way.
    with pytest.raises(SourceError, match="refused"):
        RuntimeClient("docker", docker_api.url).inspect([TRAINER])
    # The daemon comes back on the same socket: the same client reconnects.
    docker_api.start()
    assert set(client.inspect([TRAINER])) == {TRAINER}


def test_missing_socket_is_a_source_error(sockdir: Path) -> None:
    url = f"unix://{sockdir}/podman.sock"
    with pytest.raises(SourceError) as caught:
        RuntimeClient("podman", url).inspect([PODMAN_TASK])
    assert caught.value.source == "podman"
    assert f"{sockdir}/podman.sock" in caught.value.message
    assert "no such socket" in caught.value.message
    assert caught.value.hint is not None
    assert "podman.socket" in caught.value.hint


def test_no_ids_pings_the_daemon_so_that_read_means_read(
    sockdir: Path, docker_api: FakeDockerApi
) -> None:
    """With no container to ask about, the daemon is still asked whether it is there: a
    socket that is not there fails the source (issue 41: it said "docker ok")."""
    with pytest.raises(SourceError, match="no such socket"):
        RuntimeClient("docker", f"unix://{sockdir}/missing.sock").inspect([])
    assert RuntimeClient("docker", docker_api.url).inspect([]) == {}
    assert [path for _, path in docker_api.requests if path.endswith("/_ping")]
    assert not [path for _, path in docker_api.requests if "/containers/" in path]


def test_bare_socket_path_is_accepted(docker_api: FakeDockerApi) -> None:
    client = RuntimeClient("docker", str(docker_api.socket_path))
    assert set(client.inspect([NOTEBOOK])) == {NOTEBOOK}


def test_password_in_the_url_is_never_shown() -> None:
    # The SDK itself refuses a password in the address, and repeats the address when it does.
    with pytest.raises(SourceError) as caught:
        RuntimeClient("docker", "tcp://admin:hunter2@127.0.0.1:2375").inspect([TRAINER])
    shown = f"{caught.value.message} {caught.value.hint}"
    assert "tcp://admin:***@127.0.0.1:2375" in shown
    assert "hunter2" not in shown


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("unix:///run/podman/podman.sock", "unix:///run/podman/podman.sock"),
        ("/var/run/docker.sock", "unix:///var/run/docker.sock"),
        ("tcp://10.0.0.5:2375", "tcp://10.0.0.5:2375"),
        ("http://10.0.0.5:2375", "http://10.0.0.5:2375"),
        ("https://docker.example:2376", "https://docker.example:2376"),
        ("ssh://ops@gpu-node-1", "ssh://ops@gpu-node-1"),
        ("ssh://ops@gpu-node-1:2222", "ssh://ops@gpu-node-1:2222"),
    ],
)
def test_check_url_accepts_what_the_sdk_uses(url: str, expected: str) -> None:
    assert check_url(url) == expected
    # The SDK takes it too (ssh:// would need paramiko to connect, not to parse).
    docker.utils.parse_host(expected)


@pytest.mark.parametrize(
    ("url", "words"),
    [
        ("ftp://10.0.0.5:2375", "'ftp'"),
        ("npipe:////./pipe/docker_engine", "'npipe'"),
        ("docker.sock", "docker.sock"),
        ("", "''"),
        ("tcp://10.0.0.5", "port"),
        ("http://10.0.0.5", "port"),
        ("tcp://10.0.0.5:2375/path?x=1", "query"),
        ("ssh://ops@gpu-node-1/path", "path"),
        ("tcp://admin:***@10.0.0.5:2375", "password"),
    ],
)
def test_check_url_refuses_what_the_sdk_cannot_use(url: str, words: str) -> None:
    with pytest.raises(ConfigError) as caught:
        check_url(url)
    message = str(caught.value)
    assert words in message
    # It says what is allowed.
    for allowed in ("unix://", "tcp://", "http://", "https://", "ssh://", "/path"):
        assert allowed in message


def test_check_url_never_shows_a_password() -> None:
    with pytest.raises(ConfigError) as caught:
        check_url("tcp://admin:hunter2@10.0.0.5:2375")
    assert "tcp://admin:***@10.0.0.5:2375" in str(caught.value)
    assert "hunter2" not in str(caught.value)


def test_container_looked_up_by_prefix_keeps_the_asked_key(docker_api: FakeDockerApi) -> None:
    found = RuntimeClient("docker", docker_api.url).inspect([TRAINER[:12]])
    assert found[TRAINER[:12]].id == TRAINER


# ----------------------------------------------------------------------------- default_socket


def test_default_socket_off_when_missing(tmp_path: Path) -> None:
    assert default_socket("docker", root=tmp_path) is None
    assert default_socket("podman", root=tmp_path) is None


def test_default_socket_when_present(tmp_path: Path) -> None:
    (tmp_path / "var" / "run").mkdir(parents=True)
    (tmp_path / "var" / "run" / "docker.sock").touch()
    (tmp_path / "run" / "podman").mkdir(parents=True)
    (tmp_path / "run" / "podman" / "podman.sock").touch()
    assert default_socket("docker", root=tmp_path) == f"unix://{tmp_path}/var/run/docker.sock"
    assert default_socket("podman", root=tmp_path) == f"unix://{tmp_path}/run/podman/podman.sock"


# ----------------------------------------------------------------------------- alloc_of


def _c(name: str, labels: dict[str, str] | None = None) -> Container:
    return Container(id="a" * 64, name=name, runtime="docker", labels=labels or {})


@pytest.mark.parametrize(
    ("container", "expected"),
    [
        pytest.param(
            _c(f"/trainer-{ALLOC}", {"com.hashicorp.nomad.alloc_id": ALLOC}),
            (ALLOC, "trainer", False),
            id="label, task from name",
        ),
        pytest.param(
            _c(
                "/whatever",
                {
                    "com.hashicorp.nomad.alloc_id": ALLOC,
                    "com.hashicorp.nomad.task_name": "train",
                },
            ),
            (ALLOC, "train", False),
            id="label and task label",
        ),
        pytest.param(
            _c("/custom-name", {"com.hashicorp.nomad.alloc_id": ALLOC}),
            (ALLOC, None, False),
            id="label, name not nomad's",
        ),
        pytest.param(
            _c(f"/trainer-{OTHER_ALLOC}", {"com.hashicorp.nomad.alloc_id": ALLOC}),
            (ALLOC, None, False),
            id="label wins, task not taken from a name naming another alloc",
        ),
        pytest.param(
            _c(f"/nomad_init_{ALLOC}", {"com.hashicorp.nomad.alloc_id": ALLOC}),
            (ALLOC, None, False),
            id="pause container labelled",
        ),
        pytest.param(_c(f"nomad_init_{ALLOC}"), (None, None, False), id="pause container bare"),
        pytest.param(_c(f"encode-{ALLOC}"), (ALLOC, "encode", True), id="podman name"),
        pytest.param(
            _c(f"/pre-process-step-{ALLOC}"),
            (ALLOC, "pre-process-step", True),
            id="task with dashes",
        ),
        pytest.param(_c(f"/{ALLOC}"), (None, None, False), id="alloc alone is no task"),
        pytest.param(_c("/jupyter"), (None, None, False), id="not nomad"),
        pytest.param(
            _c(f"/trainer-{ALLOC.upper()}"), (None, None, False), id="nomad ids are lowercase"
        ),
        pytest.param(
            _c(f"/trainer-{ALLOC}-2"), (None, None, False), id="suffix after the alloc id"
        ),
    ],
)
def test_alloc_of(container: Container, expected: tuple[str | None, str | None, bool]) -> None:
    assert alloc_of(container) == expected


# ----------------------------------------------------------------------------- the fake itself


def test_fake_version_matches_the_fixture_shape(
    docker_api: FakeDockerApi, podman_api: FakeDockerApi
) -> None:
    fixture = json.loads((FIXTURES / "version.json").read_text())
    sdk = docker.APIClient(base_url=docker_api.url, version="auto", timeout=5)
    answer = sdk.version(api_version=False)
    assert set(fixture) <= set(answer)
    assert answer["ApiVersion"] == "1.45"
    assert answer["Components"][0]["Name"] == "Engine"
    podman = docker.APIClient(base_url=podman_api.url, version="auto", timeout=5).version()
    assert podman["ApiVersion"] == "1.44"
    assert podman["Components"][0]["Name"] == "Podman Engine"


def test_fake_inspect_matches_the_fixture_shape(docker_api: FakeDockerApi) -> None:
    fixture = json.loads((FIXTURES / "container-inspect.json").read_text())
    sdk = docker.APIClient(base_url=docker_api.url, version="1.45", timeout=5)
    doc = sdk.inspect_container(f"trainer-{ALLOC}")
    for key in ("Id", "Name", "State", "Config", "HostConfig", "Image", "Created"):
        assert key in fixture
        assert key in doc
    assert doc["Id"] == TRAINER
    assert doc["Name"] == f"/trainer-{ALLOC}"
    assert doc["State"]["Running"] is True
    assert doc["State"]["Pid"] == 4242
    assert doc["Image"].startswith("sha256:")
    assert doc["Config"]["Labels"]["com.hashicorp.nomad.alloc_id"] == ALLOC


def test_fake_404_bodies_match_the_fixtures(
    docker_api: FakeDockerApi, podman_api: FakeDockerApi
) -> None:
    docker_fixture = json.loads((FIXTURES / "error-404-no-such-container.json").read_text())
    podman_fixture = json.loads((FIXTURES / "podman-compat-error-404.json").read_text())
    for api, fixture in ((docker_api, docker_fixture), (podman_api, podman_fixture)):
        sdk = docker.APIClient(base_url=api.url, version="1.44", timeout=5)
        with pytest.raises(docker.errors.NotFound) as caught:
            sdk.inspect_container("nosuch")
        assert set(caught.value.response.json()) == set(fixture)
        assert "nosuch" in caught.value.explanation


def test_fake_lists_with_sdk_query_params(docker_api: FakeDockerApi) -> None:
    sdk = docker.APIClient(base_url=docker_api.url, version="1.45", timeout=5)
    listed = sdk.containers(filters={"label": ["com.hashicorp.nomad.alloc_id"]})
    assert [item["Id"] for item in listed] == [TRAINER]
    assert listed[0]["Names"] == [f"/trainer-{ALLOC}"]
    assert listed[0]["State"] == "running"
    assert {item["Id"] for item in sdk.containers()} == {TRAINER, NOTEBOOK}


def test_fake_ping_and_version_check(docker_api: FakeDockerApi) -> None:
    sdk = docker.APIClient(base_url=docker_api.url, version="1.45", timeout=5)
    assert sdk.ping() is True
    too_new = docker.APIClient(base_url=docker_api.url, version="1.46", timeout=5)
    with pytest.raises(docker.errors.APIError, match="too new"):
        too_new.inspect_container(TRAINER)


def test_fake_exited_container_has_no_pid(docker_api: FakeDockerApi) -> None:
    docker_api.set_containers([{**DOCKER_TRAINER, "state": "exited"}])
    sdk = docker.APIClient(base_url=docker_api.url, version="1.45", timeout=5)
    state = sdk.inspect_container(TRAINER)["State"]
    assert (state["Running"], state["Pid"], state["Status"]) == (False, 0, "exited")
    assert sdk.containers() == []
    assert len(sdk.containers(all=True)) == 1
