"""procfs collector: cgroup owners of every captured layout, names, redaction, /proc reads."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from gpuledger.collectors.procfs import read_processes
from gpuledger.errors import SourceError
from gpuledger.model import OwnerKind, ProcessOwner
from gpuledger.model.cgroups import classify_cgroup
from gpuledger.model.redact import redact_argv, short_name
from gpuledger.sim.proc import cgroup_text, write_proc_tree
from tests.paths import FIXTURES

FIXTURES = FIXTURES / "containers"

ALLOC = "8d3f1a6c-2b4e-4c1d-9f0a-7e5b3c2d1a90"
D, P, N, H, X = (
    OwnerKind.DOCKER,
    OwnerKind.PODMAN,
    OwnerKind.NOMAD_TASK,
    OwnerKind.HOST,
    OwnerKind.OTHER_CONTAINER,
)

# file → (kind, container id, alloc id, task); ids copied by hand from the fixture files.
EXPECTED: dict[str, tuple[OwnerKind, str | None, str | None, str | None]] = {
    "docker-cgroupfs-v1.cgroup": (
        D,
        "31cb02944da7a12196a193cf0e0f6c226d7c453a1db62e65ba98287593a2ee30",
        None,
        None,
    ),
    "docker-cgroupfs-v2.composed.cgroup": (
        D,
        "dd479c33249f6c3f0f1189aa88f07dad3eeb3e6fedfc71385c27ddd699994831",
        None,
        None,
    ),
    # The inner container of Docker-in-Docker, not the outer a9a5ad23….
    # The outer container: the one the host's Docker knows (issue 10, defect 2).
    "docker-in-docker-cgroupfs-v1.cgroup": (
        D,
        "a9a5ad238e59234193ee7ec3fcff5e735b3708ea1068826952255b69e3cfa413",
        None,
        None,
    ),
    "docker-systemd-v1.cgroup": (
        D,
        "9ec39b91f3d70e1beff50a308f77067065ea6be0d91a3378375056cd4422cf3d",
        None,
        None,
    ),
    "docker-systemd-v2-seen-from-private-cgroupns.cgroup": (
        D,
        "1f1d6e2d4940ddac13abd421a2617992bf89f0e0f9a902ed58278c5f843e9ae7",
        None,
        None,
    ),
    "docker-systemd-v2.composed.cgroup": (
        D,
        "72e5a5ff5eef3c4222a6551b992b9360a99122f77d2229783f0ee0946dfd800e",
        None,
        None,
    ),
    "host-proc1-v2-seen-from-private-cgroupns.cgroup": (H, None, None, None),
    "host-process-v1.cgroup": (H, None, None, None),
    "host-user-session-v2.cgroup": (H, None, None, None),
    "k8s-containerd-1.4-colon-path-v1.cgroup": (
        X,
        "d3d8ccf5cca91931c6285c1d7472c413dd5a7700fddc0aa9f89a9ac7008b003e",
        None,
        None,
    ),
    "k8s-containerd-systemd-v1.cgroup": (
        X,
        "f45298cd514d1930c4fe3afc4412e59547f7e3148fddd22ca33cefce046eb830",
        None,
        None,
    ),
    "k8s-containerd-systemd-v2.cgroup": (
        X,
        "25d057a4c6c9555f2a0eb106e8896968c28f1c44aca4754174851aca7f89ad26",
        None,
        None,
    ),
    "k8s-crio-systemd-v1.cgroup": (
        X,
        "d6d725b909f37c3e232aadfbafa950a58bfe7baa579ba8c47a12be88bb921607",
        None,
        None,
    ),
    "k8s-crio-systemd-v2.cgroup": (
        X,
        "f33f47b0db740bb647cb3e7ac62d96c74966dbb99cbfaf4563bfd42d387e8b44",
        None,
        None,
    ),
    # Kubernetes' containers stay OTHER_CONTAINER even when Docker made them (dockershim).
    "k8s-docker-cgroupfs-v1.cgroup": (
        X,
        "cb1eadb7abe3a6545e9856411207073277838e1bdc003337c2f8685faeedc32c",
        None,
        None,
    ),
    "k8s-docker-systemd-v1.cgroup": (
        X,
        "b5b6f2da8008be266864f896f93789762b2ce50792114a5c5f2cc3315af0bc70",
        None,
        None,
    ),
    "k8s-docker-systemd-v2-seen-from-private-cgroupns.cgroup": (
        X,
        "2cc65c162ca1388b6b8d5ccfb701d22fc96675ccf8b2f1590c490c2c4039547f",
        None,
        None,
    ),
    "lxc-v2.cgroup": (X, "waydroid", None, None),
    "nomad-docker-1.3-to-1.6-v2.composed.cgroup": (
        D,
        "72e5a5ff5eef3c4222a6551b992b9360a99122f77d2229783f0ee0946dfd800e",
        None,
        None,
    ),
    "nomad-exec-1.3-to-1.6-v2.composed.cgroup": (N, None, ALLOC, "train"),
    "nomad-exec-1.7plus-reserved-cores-v2.composed.cgroup": (N, None, ALLOC, "train"),
    "nomad-exec-1.7plus-v1.composed.cgroup": (N, None, ALLOC, "train"),
    "nomad-exec-1.7plus-v2.composed.cgroup": (N, None, ALLOC, "train"),
    "nomad-podman-driver-v2.composed.cgroup": (
        P,
        "a2bc7b153f034b17f358cde43a7f8c7475147e8a0d1b2573c26473244ec44ce4",
        None,
        None,
    ),
    # conmon's sibling scope is not the container.
    "podman-conmon-v2.derived.cgroup": (H, None, None, None),
    "podman-rootful-crun-in-root-user-session-v2.cgroup": (
        P,
        "cf21d19260ace8544fe8b769fc2638bf2c0873dfbfff0b6253f0569b26a1d5eb",
        None,
        None,
    ),
    "podman-rootful-crun-v2.derived.cgroup": (
        P,
        "a2bc7b153f034b17f358cde43a7f8c7475147e8a0d1b2573c26473244ec44ce4",
        None,
        None,
    ),
    "podman-rootful-systemd-in-container-v1.cgroup": (
        P,
        "2521e906f0a0c758c3a7dc4fd68c197e32e96abb4b36807d0b0ede6d014a7c24",
        None,
        None,
    ),
    "podman-rootless-cli-process-not-a-container-v2.cgroup": (H, None, None, None),
    # Rootless containers live in their user's delegated subtree, where any name can be
    # made up: the user's processes, judged as host processes (issue 10, defect 2).
    "podman-rootless-crun-v2.composed.cgroup": (H, None, None, None),
    "podman-rootless-runc-v2.derived.cgroup": (H, None, None, None),
}


def test_every_cgroup_fixture_has_an_expectation() -> None:
    on_disk = {path.name for path in FIXTURES.glob("*.cgroup")}
    assert on_disk, f"no fixtures found under {FIXTURES}"
    assert on_disk == set(EXPECTED), "add the new fixture to EXPECTED (or drop a stale entry)"


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_cgroup_fixture_is_classified(name: str) -> None:
    kind, container_id, alloc_id, task = EXPECTED[name]
    owner = classify_cgroup((FIXTURES / name).read_text())
    assert owner == ProcessOwner(kind, container_id=container_id, alloc_id=alloc_id, task=task)


DOCKER_ID = "72e5a5ff5eef3c4222a6551b992b9360a99122f77d2229783f0ee0946dfd800e"
PODMAN_ID = "a2bc7b153f034b17f358cde43a7f8c7475147e8a0d1b2573c26473244ec44ce4"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param(
            f"0::/nomad.slice/share.slice/{ALLOC}.my.task.v2.scope\n",
            ProcessOwner(N, alloc_id=ALLOC, task="my.task.v2"),
            id="task name with dots",
        ),
        pytest.param(
            f"0::/nomad.slice/share.slice/{ALLOC}.scope-like.scope\n",
            ProcessOwner(N, alloc_id=ALLOC, task="scope-like"),
            id="task name containing scope",
        ),
        pytest.param(
            f"4:cpuset:/nomad/reserved/{ALLOC}-train\n3:freezer:/nomad/0b2c1d7e-1111-4222-8333-944455556666\n",
            ProcessOwner(N, alloc_id=ALLOC, task="train"),
            id="nomad 1.6 reserved cpuset, random freezer uuid",
        ),
        pytest.param(
            "3:freezer:/nomad/0b2c1d7e-1111-4222-8333-944455556666\n",
            ProcessOwner(N),
            id="nomad 1.6 random freezer uuid alone: a nomad task of unknown allocation",
        ),
        pytest.param(
            f"0::/some.slice/{ALLOC}.train\n",
            ProcessOwner(H),
            id="alloc.task without .scope outside /nomad",
        ),
        pytest.param(
            f"0::/libpod_parent/libpod-{PODMAN_ID}\n",
            ProcessOwner(P, container_id=PODMAN_ID),
            id="podman cgroupfs",
        ),
        pytest.param(
            f"0::/libpod_parent/conmon\n5:memory:/libpod_parent/libpod-{PODMAN_ID}\n",
            ProcessOwner(P, container_id=PODMAN_ID),
            id="v2 names nothing so v1 decides",
        ),
        pytest.param(
            f"0::/machine.slice/machine-libpod_pod_{'1' * 64}.slice/libpod-{PODMAN_ID}.scope\n",
            ProcessOwner(P, container_id=PODMAN_ID),
            id="podman pod member",
        ),
        pytest.param(
            f"0::/machine.slice/libpod-payload-{PODMAN_ID}\n",
            ProcessOwner(P, container_id=PODMAN_ID),
            id="podman split cgroups",
        ),
        pytest.param(
            f"0::/system.slice/docker-{DOCKER_ID}.scope\n"
            f"4:memory:/machine.slice/libpod-{PODMAN_ID}.scope\n",
            ProcessOwner(D, container_id=DOCKER_ID),
            id="v2 line wins over v1 lines",
        ),
        pytest.param(
            f"9:cpuset:/docker/{'b' * 64}\n4:memory:/docker/{DOCKER_ID}\n",
            ProcessOwner(D, container_id=DOCKER_ID),
            id="memory before cpuset",
        ),
        pytest.param(
            f"10:net_prio:/{DOCKER_ID}\n",
            ProcessOwner(D, container_id=DOCKER_ID),
            id="debian docker without /docker prefix",
        ),
        pytest.param(
            f"0::/system.slice/docker-{DOCKER_ID}.scope/sub:group\n",
            ProcessOwner(D, container_id=DOCKER_ID),
            id="colon inside the path",
        ),
        pytest.param(
            f"0::/user.slice/user-1000.slice/user@1000.service/user.slice/docker-{DOCKER_ID}.scope\n",
            ProcessOwner(H),
            id="rootless docker is its user's",
        ),
        pytest.param(
            f"0::/docker/{DOCKER_ID}.mount\n",
            ProcessOwner(H),
            id="a .mount unit is not a container",
        ),
        pytest.param("0::/lxc.monitor.waydroid\n", ProcessOwner(H), id="lxc monitor"),
        pytest.param(
            "4:memory:/lxc/web01\n",
            ProcessOwner(X, container_id="web01"),
            id="old lxc v1",
        ),
        pytest.param(
            "0::/kubepods.slice/kubepods-besteffort.slice\n",
            ProcessOwner(X),
            id="kubepods without container id",
        ),
        pytest.param(
            "4:memory:/process_api/0bd3b0e691ffbb905a189c3b5afd3216\n",
            ProcessOwner(H),
            id="32 hex is not a container id",
        ),
        pytest.param("", ProcessOwner(H), id="empty"),
        pytest.param("0::/\n", ProcessOwner(H), id="root"),
        pytest.param("garbage without colons\n", ProcessOwner(H), id="garbage"),
    ],
)
def test_classify_cgroup_cases(text: str, expected: ProcessOwner) -> None:
    assert classify_cgroup(text) == expected


@pytest.mark.parametrize(
    ("owner", "expected"),
    [
        ({"docker": DOCKER_ID}, ProcessOwner(D, container_id=DOCKER_ID)),
        ({"docker_cgroupfs": DOCKER_ID}, ProcessOwner(D, container_id=DOCKER_ID)),
        ({"podman": PODMAN_ID}, ProcessOwner(P, container_id=PODMAN_ID)),
        ({"podman_cgroupfs": PODMAN_ID}, ProcessOwner(P, container_id=PODMAN_ID)),
        ({"podman_conmon": PODMAN_ID}, ProcessOwner(H)),
        ({"nomad_exec": {"alloc": ALLOC, "task": "train"}}, ProcessOwner(N, None, ALLOC, "train")),
        ({"nomad_exec_v1": {"alloc": ALLOC, "task": "t.1"}}, ProcessOwner(N, None, ALLOC, "t.1")),
        ({"host": True}, ProcessOwner(H)),
    ],
)
def test_sim_cgroup_text_classifies_back(owner: dict[str, object], expected: ProcessOwner) -> None:
    assert classify_cgroup(cgroup_text(owner)) == expected


def test_sim_cgroup_text_docker_cgroupfs_is_hybrid() -> None:
    lines = cgroup_text({"docker_cgroupfs": DOCKER_ID}).splitlines()
    assert lines[0] == f"12:name=systemd:/docker/{DOCKER_ID}"
    assert lines[-1] == f"0::/docker/{DOCKER_ID}"


def test_sim_cgroup_text_rejects_unknown_owner() -> None:
    with pytest.raises(ValueError, match="lxd"):
        cgroup_text({"lxd": "x"})


@pytest.mark.parametrize(
    ("process", "expected"),
    [
        ("/usr/bin/ffmpeg -i /data/x/match.mp4", "ffmpeg"),
        ("/usr/bin/ffmpeg", "ffmpeg"),
        ("./gpu_burn", "gpu_burn"),
        ("gpu_burn", "gpu_burn"),
        ("VLLM::EngineCore", "VLLM::EngineCore"),
        ("C:\\x\\y.exe", "y.exe"),
        ("python3 /opt/app/train.py --epochs 3", "python3"),
        ("  /usr/bin/python3  ", "python3"),
        ("nginx: worker process", "nginx:"),
        ("/opt/bin/", "bin"),
        ("", ""),
    ],
)
def test_short_name(process: str, expected: str) -> None:
    assert short_name(process) == expected


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["python3", "train.py", "--token=abc"], "python3 train.py --token=***"),
        (["app", "--api-key", "s3cr3t", "--epochs", "3"], "app --api-key *** --epochs 3"),
        (["env", "PASSWORD=hunter2", "run"], "env PASSWORD=*** run"),
        (["mysql", "-p", "hunter2"], "mysql -p hunter2"),
        (["app", "--Secret-Value", "x"], "app --Secret-Value ***"),
        (
            ["app", "--db-passwd=x", "--aws-credentials", "/c"],
            "app --db-passwd=*** --aws-credentials ***",
        ),
        (["app", "--SSH_KEY_FILE", "k"], "app --SSH_KEY_FILE ***"),
        (["app", "-token", "t"], "app -token ***"),
        (
            ["app", "AWS_SECRET_ACCESS_KEY=x", "MODE=fast"],
            "app AWS_SECRET_ACCESS_KEY=*** MODE=fast",
        ),
        # An option-looking word after a secret option is the next option, not its value.
        (["app", "--token", "--verbose"], "app --token --verbose"),
        # A secret option at the very end has no value to hide.
        (["app", "--password"], "app --password"),
        (["app", "--token="], "app --token=***"),
        # A value containing '=' is hidden whole.
        (["app", "--token=a=b"], "app --token=***"),
        # URLs with a secret query parameter: the name before '=' holds "key".
        (["curl", "https://h/x?api_key=abc"], "curl https://h/x?api_key=***"),
        (["app", "train.py", "--epochs=3", "-v"], "app train.py --epochs=3 -v"),
        # argv[0] is kept whatever it looks like.
        (["--token=x", "a"], "--token=x a"),
        # Blanks are quoted so the words stay apart.
        (["python3", "my script.py", "--name", "a b"], "python3 'my script.py' --name 'a b'"),
        (["app", ""], "app ''"),
        (["app", "--token", "a b"], "app --token ***"),
        # A process that rewrote its title: one blob with blanks.
        (["VLLM::EngineCore --api-key abc"], "VLLM::EngineCore --api-key ***"),
        (["nginx: worker process"], "nginx: worker process"),
        # A password in a URL, wherever the URL is.
        (["psql", "postgres://user:pa55@db/x"], "psql postgres://user:***@db/x"),
        (["app", "--dsn=postgres://user:pa55@db/x"], "app --dsn=postgres://user:***@db/x"),
        (["app", "--dsn", "postgres://user:pa55@db/x"], "app --dsn postgres://user:***@db/x"),
        (
            ["app", "--db", "mysql://root:p@ss:w0rd@db:3306/x?ssl=1"],
            "app --db mysql://root:***@db:3306/x?ssl=1",
        ),
        (
            ["git", "clone", "https://:ghp_abc@github.com/o/r"],
            "git clone https://:***@github.com/o/r",
        ),
        (
            ["curl", "https://u:pw@h/x?api_key=abc"],
            "curl https://u:***@h/x?api_key=***",
        ),
        # A password that holds the word "key" is hidden whole, not cut at its '='.
        (["app", "redis://u:mykey=1@cache:6379"], "app redis://u:***@cache:6379"),
        (["run", "a=postgres://u:pw@db"], "run a=postgres://u:***@db"),
        # No password: nothing to hide.
        (["app", "https://user@h/x", "ssh://git@h"], "app https://user@h/x ssh://git@h"),
        (
            ["app", "unix:///run/a.sock", "http://h:8080/p"],
            "app unix:///run/a.sock http://h:8080/p",
        ),
        # An HTTP Authorization value, whatever its scheme.
        (
            ["curl", "--header", "Authorization: Bearer abc", "https://h/"],
            "curl --header 'Authorization: ***' https://h/",
        ),
        (["curl", "-H", "Authorization: Basic xyz"], "curl -H 'Authorization: ***'"),
        (["curl", "-H", "authorization:token abc"], "curl -H authorization:***"),
        (["curl", "-H", "Authorization: token abc"], "curl -H 'Authorization: ***'"),
        (["curl", "-H", "Proxy-Authorization: Basic xyz"], "curl -H 'Proxy-Authorization: ***'"),
        (["curl", "--header=Authorization: Bearer a"], "curl '--header=Authorization: ***'"),
        (["curl", "-H", "Accept: text/plain"], "curl -H 'Accept: text/plain'"),
        (
            ["app", "--auth-mode", "Authorization-free"],
            "app --auth-mode Authorization-free",
        ),
        (
            ["wget --header Authorization: Bearer abc --quiet https://u:pw@h/"],
            "wget --header Authorization: *** --quiet https://u:***@h/",
        ),
    ],
)
def test_redact_argv_redacted(argv: list[str], expected: str) -> None:
    assert redact_argv(argv, "redacted") == expected


def test_redact_argv_full_and_none() -> None:
    argv = ["app", "--token=abc", "--api-key", "k", "my file"]
    assert redact_argv(argv, "full") == "app --token=abc --api-key k 'my file'"
    argv = ["psql", "postgres://u:pw@db", "-H", "Authorization: Bearer b"]
    assert redact_argv(argv, "full") == "psql postgres://u:pw@db -H 'Authorization: Bearer b'"
    assert (
        redact_argv(["VLLM::EngineCore --api-key abc"], "full") == "VLLM::EngineCore --api-key abc"
    )
    assert redact_argv(argv, "none") is None
    assert redact_argv([], "redacted") is None
    assert redact_argv([], "full") is None


# ----------------------------------------------------------------------------- read_processes


def test_read_processes_reads_owner_and_argv(tmp_path: Path) -> None:
    write_proc_tree(
        tmp_path,
        [
            {
                "pid": 4242,
                "cgroup": cgroup_text({"docker": DOCKER_ID}),
                "cmdline": ["python3", "train.py"],
            },
            {
                "pid": 77,
                "cgroup": cgroup_text({"nomad_exec": {"alloc": ALLOC, "task": "encode"}}),
                "cmdline": ["/usr/bin/ffmpeg", "-i", "/data/x/match.mp4"],
            },
            {"pid": 9, "cgroup": cgroup_text({"host": True}), "cmdline": "VLLM::EngineCore"},
            {"pid": 2, "cgroup": "0::/\n", "cmdline": []},
        ],
    )
    found = read_processes([4242, 77, 9, 2, 4242], tmp_path)
    assert sorted(found) == [2, 9, 77, 4242]
    assert found[4242].owner == ProcessOwner(D, container_id=DOCKER_ID)
    assert found[4242].argv == ("python3", "train.py")
    assert found[77].owner == ProcessOwner(N, alloc_id=ALLOC, task="encode")
    assert found[77].argv == ("/usr/bin/ffmpeg", "-i", "/data/x/match.mp4")
    assert found[9].argv == ("VLLM::EngineCore",)
    assert found[2].argv == ()
    assert found[2].owner == ProcessOwner(H)


def test_cmdline_layout_on_disk(tmp_path: Path) -> None:
    write_proc_tree(tmp_path, [{"pid": 5, "cgroup": "0::/\n", "cmdline": ["a", "b c"]}])
    assert (tmp_path / "5" / "cmdline").read_bytes() == b"a\0b c\0"


def test_cmdline_title_padded_with_nuls(tmp_path: Path) -> None:
    write_proc_tree(tmp_path, [{"pid": 5, "cgroup": "0::/\n", "cmdline": []}])
    (tmp_path / "5" / "cmdline").write_bytes(b"postgres: writer process\0\0\0\0")
    assert read_processes([5], tmp_path)[5].argv == ("postgres: writer process",)


def test_vanished_pid_is_dropped(tmp_path: Path) -> None:
    write_proc_tree(
        tmp_path,
        [
            {"pid": 10, "cgroup": cgroup_text({"host": True}), "cmdline": ["a"]},
            {"pid": 11, "cgroup": cgroup_text({"host": True}), "cmdline": ["b"]},
        ],
    )
    shutil.rmtree(tmp_path / "11")
    assert sorted(read_processes([10, 11, 12], tmp_path)) == [10]


def test_pid_that_vanishes_between_the_two_reads_is_dropped(tmp_path: Path) -> None:
    write_proc_tree(
        tmp_path, [{"pid": 10, "cgroup": cgroup_text({"host": True}), "cmdline": ["a"]}]
    )
    (tmp_path / "10" / "cmdline").unlink()
    assert read_processes([10], tmp_path) == {}


def test_missing_root_is_a_source_error(tmp_path: Path) -> None:
    with pytest.raises(SourceError) as caught:
        read_processes([1], tmp_path / "nope")
    assert caught.value.source == "procfs"
    assert str(tmp_path / "nope") in caught.value.message
    assert caught.value.hint is not None
    assert "--proc-root" in caught.value.hint


def test_root_that_is_a_file_is_a_source_error(tmp_path: Path) -> None:
    target = tmp_path / "file"
    target.write_text("x")
    with pytest.raises(SourceError, match="not a directory"):
        read_processes([1], target)


def test_directory_without_pids_is_not_a_proc(tmp_path: Path) -> None:
    (tmp_path / "etc").mkdir()
    with pytest.raises(SourceError, match="not a /proc"):
        read_processes([], tmp_path)


def test_empty_tree_still_has_pid_one(tmp_path: Path) -> None:
    write_proc_tree(tmp_path, [])
    assert read_processes([], tmp_path) == {}
    assert read_processes([1], tmp_path)[1].argv == ("/sbin/init",)


def test_real_proc_reads_this_process() -> None:
    pid = os.getpid()
    found = read_processes([pid], Path("/proc"))
    assert found[pid].argv
    assert short_name(found[pid].argv[0]).startswith("python")
