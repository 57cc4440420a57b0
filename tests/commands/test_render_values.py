"""``gpuledger render``'s values: merged as Helm merges them, and every mistake told where it is.

The expected merges follow Helm's documentation and code (``pkg/cli/values/options.go``
``MergeValues``, ``pkg/chart/common/util/coalesce.go``): files merged in order, every ``--set``
then every ``--set-string`` parsed into what the files made, and the result laid over the
built-in values, a user's ``null`` deleting a built-in key.
"""

from __future__ import annotations

import contextlib
import io
from pathlib import Path

import pytest
import yaml

from gpuledger.cli import main
from gpuledger.commands.render import values_file
from gpuledger.commands.render.values_file import coalesce, merge_maps, merged_values
from gpuledger.errors import ConfigError
from tests.paths import REPO

PACKAGE = REPO / "src" / "gpuledger" / "commands" / "render"
SHA = "sha256:" + "ab" * 32


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def render(*args: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stderr(err):
        code = main(["render", *args], out=out)
    return code, out.getvalue(), err.getvalue()


# --------------------------------------------------------------------------- one source of truth


@pytest.mark.parametrize("name", ["values.yaml", "values.schema.json"])
def test_the_top_level_copy_is_the_packaged_one(name: str) -> None:
    # The packaged file is the one gpuledger reads; the top-level copy is for people browsing
    # the repository. After a change: cp src/gpuledger/commands/render/NAME NAME
    assert (REPO / name).read_text() == (PACKAGE / name).read_text(), (
        f"{name} differs from src/gpuledger/commands/render/{name}: copy the packaged one over"
    )


def test_the_shown_values_are_the_built_in_ones() -> None:
    code, out, _ = render("--show-values")
    assert code == 0
    assert out == (PACKAGE / "values.yaml").read_text()


def test_every_default_passes_the_schema_and_every_key_is_commented() -> None:
    text = (PACKAGE / "values.yaml").read_text()
    assert merged_values([]) == yaml.safe_load(text)
    lines = text.splitlines()
    for i, line in enumerate(lines):
        top_level_key = line and not line.startswith((" ", "#", "-"))
        if top_level_key:
            assert lines[i - 1].startswith("#"), f"values.yaml: {line!r} has no comment above"


def test_the_default_artifact_url_names_this_version() -> None:
    from gpuledger import __version__  # noqa: PLC0415

    url = merged_values([])["artifact"]["url"]
    assert url.endswith(f"/{__version__}/gpuledger-{__version__}-linux-x86_64.pex")


# --------------------------------------------------------------------------- how Helm merges


def test_maps_merge_and_lists_and_scalars_replace() -> None:
    base = {"a": {"b": 1, "c": [1, 2]}, "d": "x"}
    assert merge_maps(base, {"a": {"c": [3]}, "d": {"e": 1}}) == {
        "a": {"b": 1, "c": [3]},
        "d": {"e": 1},
    }


def test_a_user_null_deletes_the_default_and_a_map_deep_merges() -> None:
    defaults = {"a": {"b": 1, "c": 2}, "keep": True}
    assert coalesce(defaults, {"a": {"b": None, "d": 3}}) == {"a": {"c": 2, "d": 3}, "keep": True}


def test_later_files_win_then_set_then_set_string(tmp_path: Path) -> None:
    first = write(tmp_path, "a.yaml", "node:\n  port: 9000\n  interval: 20s\nnamespace: ops\n")
    second = write(tmp_path, "b.yaml", "node:\n  port: 9100\n")
    values = merged_values(
        [first, second], sets=["node.interval=25s,fleet.shards=3"], set_strings=["namespace=gpu"]
    )
    assert values["node"]["port"] == 9100
    assert values["node"]["interval"] == "25s"
    assert values["fleet"]["shards"] == 3
    assert values["namespace"] == "gpu"
    assert values["node"]["killTimeout"] == "30s"  # untouched defaults stay


def test_set_string_comes_after_every_set_whatever_the_order_given(tmp_path: Path) -> None:
    # helm template --set-string a=1 --set a=2 gives "1": all --set first, then --set-string
    code, out, err = render(
        "--set-string", "node.extraArgs[0]=first", "--set", "node.extraArgs[0]=second"
    )
    assert code == 0, err
    assert '"first",' in out
    assert '"second"' not in out


def test_set_index_into_a_list_only_the_defaults_have_replaces_it() -> None:
    # Helm's gotcha: the defaults' list is not in what --set is parsed into
    values = merged_values([], sets=["node.constraints[0].attribute=${node.class}"])
    assert values["node"]["constraints"] == [{"attribute": "${node.class}"}]


def test_set_index_into_a_list_a_file_gave_edits_it(tmp_path: Path) -> None:
    given = write(
        tmp_path,
        "c.yaml",
        "node:\n  constraints:\n    - {attribute: '${meta.gpu}', value: 'true'}\n"
        "    - {attribute: '${node.class}', value: batch}\n",
    )
    values = merged_values([given], sets=["node.constraints[1].value=gpu"])
    assert values["node"]["constraints"][1] == {"attribute": "${node.class}", "value": "gpu"}
    assert values["node"]["constraints"][0]["attribute"] == "${meta.gpu}"


def test_an_empty_file_changes_nothing(tmp_path: Path) -> None:
    assert merged_values([write(tmp_path, "e.yaml", "# nothing\n")]) == merged_values([])


# --------------------------------------------------------------------------- mistakes


def problem(files: list[Path], sets: list[str] = [], strings: list[str] = []) -> str:  # noqa: B006
    with pytest.raises(ConfigError) as caught:
        merged_values(files, sets, strings)
    return str(caught.value)


def test_a_wrong_value_in_a_file_names_the_file_line_and_key(tmp_path: Path) -> None:
    path = write(tmp_path, "v.yaml", "# mine\nnode:\n  port: nine\n  intervall: 15s\n")
    text = problem([path])
    assert f"{path}:3:3: node.port: 'nine' is not a port from 1 to 65535" in text
    assert f"{path}:4:3: node.intervall: unknown key 'intervall'" in text
    assert "did you mean 'interval'?" in text


def test_a_wrong_value_from_set_names_the_pair_and_key() -> None:
    text = problem([], ["driver=podman"], ["fleet.shards=4"])
    assert "--set driver=podman: driver: 'podman' is not raw_exec or docker" in text
    assert "--set-string fleet.shards=4: fleet.shards: '4' is not a whole number" in text


@pytest.mark.parametrize(
    "checksum",
    ["sha256:abc", "md5:" + "ab" * 16, "ab" * 32, "sha256:" + "g" * 64, "sha256:" + "ab" * 33],
)
def test_a_checksum_that_is_not_sha256_and_64_hex_digits_is_refused(checksum: str) -> None:
    text = problem([], [f"artifact.checksum={checksum}"])
    assert f"--set artifact.checksum={checksum}: artifact.checksum:" in text
    assert '"sha256:" and 64 hex digits' in text


def test_a_good_checksum_passes() -> None:
    assert merged_values([], [f"artifact.checksum={SHA}"])["artifact"]["checksum"] == SHA


def test_a_malformed_set_names_the_pair() -> None:
    text = problem([], ["node.port"])
    assert text == '--set node.port: key "port" has no value'


def test_a_file_that_is_not_yaml_names_its_line(tmp_path: Path) -> None:
    path = write(tmp_path, "bad.yaml", "node:\n  port: [9877\n")
    assert problem([path]).startswith(f"{path}:")


def test_a_file_that_is_not_a_mapping(tmp_path: Path) -> None:
    path = write(tmp_path, "list.yaml", "- a\n- b\n")
    assert problem([path]) == f"{path}:1:1: values must be a mapping of keys, as values.yaml is"


def test_a_duplicate_key_is_refused(tmp_path: Path) -> None:
    path = write(tmp_path, "dup.yaml", "driver: docker\ndriver: raw_exec\n")
    assert "duplicate key 'driver'" in problem([path])


def test_deleting_a_required_key_names_the_set_that_did() -> None:
    assert problem([], ["artifact=null"]).startswith("--set artifact=null: artifact: missing")


def test_a_missing_file() -> None:
    assert problem([Path("/nonexistent/v.yaml")]).startswith("-f /nonexistent/v.yaml: cannot read")


@pytest.mark.parametrize(
    ("sets", "expected"),
    [
        (["node.killTimeout=15s"], "node.killTimeout: 15s is not longer than node.interval (15s)"),
        (["fleet.interval=0s"], "fleet.interval: must be longer than 0s"),
        (["service.provider=none"], "fleet.discovery: 'auto' finds the node controllers"),
        (["fleet.discovery=consul"], "fleet.discovery: 'consul' finds no node controller"),
        (["fleet.discovery=targets"], "fleet.targets: is empty"),
        (
            ["fleet.update.healthyDeadline=10m"],
            "fleet.update.healthyDeadline: 10m is not shorter than fleet.update.progressDeadline "
            "(10m)",
        ),
        (
            ["fleet.update.minHealthyTime=30s,fleet.update.healthyDeadline=30s"],
            "fleet.update.minHealthyTime: 30s is not shorter than fleet.update.healthyDeadline",
        ),
        (["fleet.update.healthyDeadline=99999999999999999999h"], "fleet.update: "),
    ],
)
def test_keys_that_must_agree(sets: list[str], expected: str) -> None:
    assert expected in problem([], sets)


def test_keys_that_need_not_agree_when_the_fleet_is_off() -> None:
    values = merged_values([], ["service.provider=none,fleet.enabled=false"])
    assert values["service"]["provider"] == "none"


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--set", "node.port=x"], "gpuledger render: --set node.port=x: node.port: 'x' is not"),
        (["--set", "a=x,a.b=c"], "gpuledger render: --set a=x,a.b=c: unable to parse key"),
        (["-f", "/nonexistent.yaml"], "gpuledger render: -f /nonexistent.yaml: cannot read"),
        (
            ["--set", "nomad.gpuDevices={amd}"],
            "gpuledger render: --set nomad.gpuDevices={amd}: nomad.gpuDevices[0]: 'amd' is not "
            "VENDOR/TYPE",
        ),
    ],
)
def test_the_command_line_exits_2_with_one_message(args: list[str], expected: str) -> None:
    code, out, err = render(*args)
    assert code == 2
    assert out == ""
    assert err.startswith(expected)
    assert "Traceback" not in err


def test_an_output_dir_that_cannot_be_made(tmp_path: Path) -> None:
    blocker = write(tmp_path, "file", "")
    code, _, err = render("--output-dir", str(blocker / "sub"))
    assert code == 2
    assert err.startswith(f"gpuledger render: --output-dir {blocker / 'sub'}: cannot write")


def test_every_file_is_printed_after_its_source_line() -> None:
    code, out, _ = render()
    assert code == 0
    sources = [line for line in out.splitlines() if line.startswith("# Source: ")]
    assert sources == [
        "# Source: gpuledger.nomad.hcl",
        "# Source: gpuledger.wi.nomad.hcl",
        "# Source: gpuledger-fleet.nomad.hcl",
    ]


def test_output_dir_writes_the_files(tmp_path: Path) -> None:
    code, out, _ = render("--output-dir", str(tmp_path / "jobs"), "--set", "fleet.enabled=false")
    assert code == 0
    assert sorted(p.name for p in (tmp_path / "jobs").iterdir()) == [
        "gpuledger.nomad.hcl",
        "gpuledger.wi.nomad.hcl",
    ]
    assert out == "".join(
        f"wrote {tmp_path / 'jobs' / n}\n"
        for n in ("gpuledger.nomad.hcl", "gpuledger.wi.nomad.hcl")
    )


def test_schema_is_shown() -> None:
    code, out, _ = render("--show-schema")
    assert code == 0
    assert out == (PACKAGE / "values.schema.json").read_text()


# --------------------------------------------------------------------------- values that escape


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        # Python's $ matched before the final newline: a traceback with the default values,
        # and without workload identity a job named "gpuledger\n".
        (["--set", "node.job=gpuledger\n"], "--set 'node.job=gpuledger\\n': node.job: "),
        (
            ["--set", "node.job=gpuledger\n", "--set", "workloadIdentity.enabled=false"],
            "--set 'node.job=gpuledger\\n': node.job: ",
        ),
        (["--set", "namespace=default\n"], "namespace: "),
        (["--set", "node.interval=15s\n"], "node.interval: "),
        (["--set", "artifact.checksum=\n"], "artifact.checksum: "),
    ],
)
def test_a_value_with_a_final_newline_breaks_its_pattern(args: list[str], expected: str) -> None:
    code, out, err = render(*args)
    assert (code, out) == (2, "")
    assert expected in err
    assert "Traceback" not in err


def test_an_env_name_with_a_final_newline_in_a_file_is_refused(tmp_path: Path) -> None:
    values = write(tmp_path, "v.yaml", 'node:\n  extraEnv:\n    "GOOD\\n": x\n')
    code, out, err = render("-f", str(values))
    assert (code, out) == (2, "")
    assert "v.yaml:2:3: node.extraEnv: " in err
    assert "is not an environment variable name" in err


@pytest.mark.parametrize(
    ("pattern", "text", "matches"),
    [
        ("^a$", "a", True),
        ("^a$", "a\n", False),
        ("^[$]$", "$", True),
        ("^\\$$", "$", True),
        ("^\\$$", "$\n", False),
        ("^(x)?$", "\n", False),
    ],
)
def test_patterns_are_read_as_ecma_262_reads_them(pattern: str, text: str, matches: bool) -> None:
    import re  # noqa: PLC0415

    assert bool(re.search(values_file.ecma_pattern(pattern), text)) is matches


@pytest.mark.parametrize(
    "line", ["a" + "[0]" * 3000 + "=x", "a" + "[0].a" * 3000 + "=x", "a" + ".a" * 3000 + "=x"]
)
def test_nesting_past_helms_limit_is_a_usage_error(line: str) -> None:
    # 3,000 nested [0] was a RecursionError.
    code, out, err = render("--set", line)
    assert (code, out) == (2, "")
    assert "maximum supported nested level of 30" in err
    assert len(err) < 1000  # the line is cut, not echoed whole


def test_an_index_past_helms_limit_is_a_usage_error() -> None:
    code, _, err = render("--set", "node.extraArgs[65537]=x")
    assert code == 2
    assert "index of 65537 is greater than maximum supported index of 65536" in err


def test_telling_where_many_problems_came_from_costs_linear_work(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # node.extraArgs[4000]=x took 14 s: each of 4,000 problems looked at every value's origin.
    calls = 0
    real = values_file.dotted

    def counted(path: tuple[str | int, ...]) -> str:
        nonlocal calls
        calls += 1
        return real(path)

    monkeypatch.setattr(values_file, "dotted", counted)

    def work(n: int) -> int:
        nonlocal calls
        calls = 0
        message = problem([], [f"node.extraArgs[{n}]=x"])
        assert message.count("null is not a string") == values_file.TOLD_AT_MOST
        assert f"… and {n - values_file.TOLD_AT_MOST:,} more problems" in message
        return calls

    small, large = work(500), work(1000)
    assert large <= 2.5 * small


def test_a_whole_number_written_as_a_float_is_a_number_in_the_job(tmp_path: Path) -> None:
    # The schema's "integer" takes YAML's 2.0; the job's HCL filter knew no float: a traceback.
    values = write(tmp_path, "v.yaml", "fleet:\n  shards: 2.0\nnode:\n  port: 9877.0\n")
    code, out, err = render("-f", str(values))
    assert code == 0, err
    assert "static = 9877\n" in out
    assert "--shard" in out
    assert "/2.0" not in out


def test_a_refusal_lists_a_screen_of_problems_and_counts_the_rest() -> None:
    # node.extraArgs[4000]=x printed 4,000 lines, one per null Helm's merge leaves.
    message = problem([], ["node.extraArgs[4000]=x"])
    assert len(message.splitlines()) == values_file.TOLD_AT_MOST + 1
    assert message.endswith("… and 3,980 more problems (fix these first)")


@pytest.mark.parametrize(
    ("files", "sets", "strings", "expected"),
    [
        ([], ["node.interval=5"], [],
         "--set node.interval=5: node.interval: 5 has no unit; write 5s"),
        ([], [], ["fleet.killTimeout=2.5"],
         "--set-string fleet.killTimeout=2.5: fleet.killTimeout: 2.5 has no unit; write 2.5s"),
        (["node:\n  interval: 5\n"], [], [], ":2:3: node.interval: 5 has no unit; write 5s"),
    ],
)  # fmt: skip
def test_a_duration_without_its_unit_is_refused_naming_the_fix(
    tmp_path: Path, files: list[str], sets: list[str], strings: list[str], expected: str
) -> None:
    paths = [write(tmp_path, f"v{i}.yaml", text) for i, text in enumerate(files)]
    told = problem(paths, sets, strings)
    assert told.endswith(expected)
    if paths:
        assert told.startswith(f"{paths[0]}:2:3")


@pytest.mark.parametrize("fix", ["5s", "2.5s", "500ms", "1m30s", "1h"])
def test_a_duration_with_its_unit_is_taken_as_the_flags_take_it(fix: str) -> None:
    values = merged_values([], [f"fleet.interval={fix},fleet.killTimeout=2h"])
    assert values["fleet"]["interval"] == fix
