"""Policy validation: every problem at once, by file, line and column; the schema; usage errors."""

from __future__ import annotations

import io
import json
from datetime import timedelta
from pathlib import Path

import jsonschema
import pytest
import yaml

from gpuledger.cli import main
from gpuledger.errors import PolicyError
from gpuledger.model import Code, Level
from gpuledger.policy.evaluate import policy_invalid
from gpuledger.policy.globs import CONTAINER, JOB, NAMESPACE, PROCESS, why_unmatchable
from gpuledger.policy.load import default_policy, default_policy_text, parse_policy
from gpuledger.policy.schema import policy_schema, schema_text
from tests.paths import REPO

EXAMPLE = REPO / "examples" / "policy" / "research.yaml"

# One problem of each kind the issue names; columns counted by hand (1-based).
SEEDED = """\
version: 1
exit_on: BAD
findings:
  hot: {level: SEVERE, margin_c: 5}
  hott: {level: WARN}
  reserved-idle: {after: 6 hours}
  held-idle: {below_percent: high}
  unmanaged-tenant:
    ignore_processes: [/usr/bin/Xorg]
    ignore_containrs: [dcgm-exporter]
overrides:
  - match: {namespace: ml_team}
    findings:
      reserved-idle: {level: sometimes}
"""


def run(*argv: str) -> tuple[int, str]:
    out = io.StringIO()
    code = main(list(argv), out=out)
    return code, out.getvalue()


def test_policy_check_reports_every_seeded_problem_with_its_line_and_column(
    tmp_path: Path,
) -> None:
    path = tmp_path / "seeded.yaml"
    path.write_text(SEEDED)
    code, out = run("policy", "check", str(path))
    assert code == 1
    assert out.splitlines() == [
        f"{path}:4:16: findings.hot.level: 'SEVERE' is not one of OK, WARN, BAD, ERROR, off",
        f"{path}:5:3: findings.hott: unknown finding code 'hott'; allowed: controller-missing, "
        "device-health-mismatch, device-unscheduled, encoder-saturated, gpu-unhealthy, "
        "gpu-xid, held-idle, hot, policy-invalid, reserved-idle, source-unavailable, "
        "unmanaged-tenant, unreserved-tenant; did you mean 'hot'?",
        f"{path}:6:26: findings.reserved-idle.after: '6 hours' is not a duration such as 0s, "
        "90s, 30m, 6h or 1d12h",
        f"{path}:7:30: findings.held-idle.below_percent: 'high' is not a number from 0 to 100",
        f"{path}:9:24: findings.unmanaged-tenant.ignore_processes[0]: '/usr/bin/Xorg' cannot "
        "match any short process name: '/' is not allowed (the program's name without its "
        "directory: no '/', '\\' or blanks)",
        f"{path}:10:5: findings.unmanaged-tenant.ignore_containrs: unknown key "
        "'ignore_containrs'; allowed: ignore_containers, ignore_labels, ignore_processes, "
        "level; did you mean 'ignore_containers'?",
        f"{path}:12:24: overrides[0].match.namespace: 'ml_team' cannot match any Nomad "
        "namespace: '_' is not allowed (letters, digits and '-' only)",
        f"{path}:14:30: overrides[0].findings.reserved-idle.level: 'sometimes' is not one of "
        "OK, WARN, BAD, ERROR, off",
    ]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("version: 2\n", "x.yaml:1:10: version: 2 is not supported; use 1"),
        ("exit_on: BAD\n", "x.yaml:1:1: version: missing (the top level needs version)"),
        ("version: 1\nexit_on: off\n", "x.yaml:2:10: exit_on: 'off' is not one of OK, WARN"),
        ("version: 1\nlevels: {}\n", "x.yaml:2:1: levels: unknown key 'levels'; allowed: "),
        ("version: 1\nversion: 1\n", "x.yaml:2:1: version: duplicate key 'version'"),
        ("version: 1\nfindings: [hot]\n", "x.yaml:2:11: findings: must be a mapping of finding"),
        (
            "version: 1\nfindings:\n  unreserved-tenant: BAD\n",
            "x.yaml:3:22: findings.unreserved-tenant: 'BAD' is not a mapping such as {level: WARN}",
        ),
        (
            "version: 1\nfindings:\n  hot: {after: 6h}\n",
            "x.yaml:3:9: findings.hot.after: unknown key 'after'; allowed: level, margin_c, "
            "temp_max_c",
        ),
        (
            "version: 1\nfindings:\n  held-idle: {after: 3600}\n",
            "x.yaml:3:22: findings.held-idle.after: 3600 is not a duration",
        ),
        (
            "version: 1\nfindings:\n  encoder-saturated: {max_sessions: 0}\n",
            "x.yaml:3:37: findings.encoder-saturated.max_sessions: 0 is not 'card'",
        ),
        (
            "version: 1\nfindings:\n  hot: {margin_c: 2.5}\n",
            "x.yaml:3:19: findings.hot.margin_c: 2.5 is not a whole number of degrees",
        ),
        (
            "version: 1\noverrides:\n  - match: {}\n    findings: {}\n",
            "x.yaml:3:12: overrides[0].match: is empty: give at least one of job, namespace, node",
        ),
        (
            "version: 1\noverrides:\n  - findings: {}\n",
            "x.yaml:3:5: overrides[0].match: missing (overrides[0] needs match and findings)",
        ),
        (
            "version: 1\noverrides:\n  - match: {job: 'nightly *'}\n    findings: {}\n",
            "x.yaml:3:18: overrides[0].match.job: 'nightly *' cannot match any Nomad job: ' ' "
            "is not allowed (no spaces)",
        ),
        (
            "version: 1\nfindings:\n  unmanaged-tenant: {ignore_processes: ['dcgm[']}\n",
            "x.yaml:3:41: findings.unmanaged-tenant.ignore_processes[0]: 'dcgm[' has a '[' "
            "without its ']'",
        ),
        ("version: 1\nfindings: {hot: {level: WARN}\n", "x.yaml:3:1: not valid YAML: "),
        ("", "x.yaml:1:1: the file is empty: it needs at least 'version: 1'"),
        ("[]\n", "x.yaml:1:1: (top level): must be a gpuledger policy (version 1), not a list"),
    ],
)
def test_each_kind_of_problem_names_line_column_key_and_what_is_allowed(
    text: str, expected: str
) -> None:
    with pytest.raises(PolicyError) as caught:
        parse_policy(text, "x.yaml")
    assert any(p.startswith(expected) for p in caught.value.problems), caught.value.problems


def test_a_node_scoped_code_under_a_namespace_match_never_applies() -> None:
    text = (
        "version: 1\noverrides:\n  - match: {namespace: research}\n    findings:\n"
        "      unmanaged-tenant: {level: 'off'}\n      hot: {level: 'off'}\n"
    )
    with pytest.raises(PolicyError) as caught:
        parse_policy(text, "x.yaml")
    assert caught.value.problems == [
        "x.yaml:5:7: overrides[0].findings.unmanaged-tenant: never applies: unmanaged-tenant "
        "findings have no namespace; match them on node only, or set them in the top-level "
        "findings"
    ]


def test_the_issue_example_is_accepted_with_its_meaning() -> None:
    text = """\
version: 1
exit_on: BAD
findings:
  unmanaged-tenant: {level: WARN, ignore_processes: [nvidia-persistenced, Xorg]}
  reserved-idle: {level: WARN, after: 6h}
  hot: {level: WARN, margin_c: 5, temp_max_c: 85}
  encoder-saturated: {level: WARN, max_sessions: card}
overrides:
  - match: {namespace: research}
    findings:
      unreserved-tenant: {level: WARN}
      reserved-idle: {after: 24h}
  - match: {namespace: research, job: "nightly-*"}
    findings:
      reserved-idle: {level: "off"}
"""
    policy = parse_policy(text, "issue.yaml")
    assert policy.exit_on is Level.BAD
    unmanaged = policy.rule(Code.UNMANAGED_TENANT, "n")
    assert unmanaged.ignore_processes == ("nvidia-persistenced", "Xorg")
    assert policy.rule(Code.HOT, "n").margin_c == 5
    assert policy.rule(Code.ENCODER_SATURATED, "n").max_sessions == "card"
    research = policy.rule(Code.RESERVED_IDLE, "n", "research", "train")
    assert (research.level, research.after) == (Level.WARN, timedelta(hours=24))
    assert policy.rule(Code.UNRESERVED_TENANT, "n", "research", "x").level is Level.WARN
    assert policy.rule(Code.UNRESERVED_TENANT, "n", "default", "x").level is Level.BAD
    assert policy.rule(Code.RESERVED_IDLE, "n", "research", "nightly-etl").level is None
    assert [o.line for o in policy.overrides] == [9, 13]


def test_a_bare_off_is_the_level_off_not_a_yaml_boolean() -> None:
    policy = parse_policy("version: 1\nfindings:\n  hot: {level: off}\n", "x.yaml")
    assert policy.rule(Code.HOT, "n").level is None
    with pytest.raises(PolicyError, match="'no' is not one of OK, WARN, BAD, ERROR, off"):
        parse_policy("version: 1\nfindings:\n  hot: {level: no}\n", "x.yaml")


def test_what_a_file_leaves_out_keeps_the_built_in_value() -> None:
    policy = parse_policy("version: 1\nfindings:\n  hot: {margin_c: 9}\n", "x.yaml")
    hot = policy.rule(Code.HOT, "n")
    assert (hot.level, hot.margin_c, hot.temp_max_c) == (Level.WARN, 9, 85)
    assert policy.rule(Code.UNRESERVED_TENANT, "n").level is Level.BAD


def test_the_default_and_the_example_pass_policy_check(tmp_path: Path) -> None:
    code, shown = run("policy", "show", "--default")
    assert code == 0 and shown == default_policy_text()
    default = tmp_path / "default.yaml"
    default.write_text(shown)
    assert run("policy", "check", str(default)) == (0, f"{default}: ok\n")
    assert run("policy", "check", str(EXAMPLE)) == (0, f"{EXAMPLE}: ok\n")


def test_the_default_policy_sets_every_code() -> None:
    doc = yaml.safe_load(default_policy_text())
    assert set(doc["findings"]) == {c.value for c in Code}
    assert all(default_policy().rules[c].level is not None for c in Code)


def test_policy_schema_prints_the_shipped_json_schema_that_validation_uses() -> None:
    code, text = run("policy", "schema")
    assert code == 0 and text == schema_text()
    schema = json.loads(text)
    jsonschema.Draft202012Validator.check_schema(schema)
    assert set(schema["$defs"]["findings"]["properties"]) == {c.value for c in Code}
    # The schema alone accepts the default and refuses a misspelt key, as editors will see.
    validator = jsonschema.Draft202012Validator(policy_schema())
    assert validator.is_valid(yaml.safe_load(default_policy_text().replace(": off", ': "off"')))
    assert not validator.is_valid({"version": 1, "findings": {"hot": {"margn_c": 5}}})


@pytest.mark.parametrize("command", ["ls", "check", "serve"])
def test_an_invalid_policy_is_a_usage_error_with_the_same_messages(
    command: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "seeded.yaml"
    path.write_text(SEEDED)
    _, problems = run("policy", "check", str(path))
    capsys.readouterr()
    argv = [command, "--policy", str(path), "--no-nomad", "--proc-root", str(tmp_path)]
    assert main([*argv, "--docker", "off", "--podman", "off"], out=io.StringIO()) == 2
    err = capsys.readouterr().err
    assert err == f"gpuledger {command}: {problems}"
    assert "Traceback" not in err


def test_a_missing_policy_file_is_a_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "nope.yaml"
    code, out = run("policy", "check", str(missing))
    assert (code, out) == (2, "")
    assert f"{missing}: no such file" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("glob", "kind", "matchable"),
    [
        ("research", NAMESPACE, True),
        ("ml-*", NAMESPACE, True),
        ("ml_*", NAMESPACE, False),
        ("team[0-9]", NAMESPACE, True),
        ("team[_.]", NAMESPACE, False),
        ("team[!_]", NAMESPACE, True),
        ("a" * 129, NAMESPACE, False),
        ("a" * 128, NAMESPACE, True),
        ("nightly-*", JOB, True),
        ("nightly *", JOB, False),
        ("Xorg", PROCESS, True),
        ("/usr/bin/Xorg", PROCESS, False),
        ("python 3", PROCESS, False),
        ("dcgm-exporter*", CONTAINER, True),
        ("*_sidecar", CONTAINER, True),
        (".hidden", CONTAINER, False),
        ("web/1", CONTAINER, False),
        ("[[]x", PROCESS, True),
        ("x[", PROCESS, False),
    ],
)
def test_globs_that_cannot_match_a_name_of_their_kind(
    glob: str, kind: object, matchable: bool
) -> None:
    assert (why_unmatchable(glob, kind) is None) is matchable  # type: ignore[arg-type]


def test_a_failed_reload_is_a_policy_invalid_error_naming_file_and_line() -> None:
    with pytest.raises(PolicyError) as caught:
        parse_policy(SEEDED, "/etc/gpuledger/policy.yaml")
    found = policy_invalid(caught.value, default_policy(), "gpu-07")
    assert found is not None
    assert (found.code, found.level, found.gpu) == (Code.POLICY_INVALID, Level.ERROR, None)
    assert found.subject == {"file": "/etc/gpuledger/policy.yaml", "line": 4}
    assert "the last good one (<built-in default.yaml>) stays in force" in found.message
    assert "/etc/gpuledger/policy.yaml:4:16: findings.hot.level: 'SEVERE'" in found.message
    assert "and 7 more" in found.message
    silenced = parse_policy("version: 1\nfindings:\n  policy-invalid: {level: 'off'}\n", "p")
    assert policy_invalid(caught.value, silenced, "gpu-07") is None


def test_policy_check_warns_when_source_unavailable_is_off(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "p.yaml"
    path.write_text("version: 1\nfindings:\n  source-unavailable: {level: 'off'}\n")
    assert main(["policy", "check", str(path)]) == 0
    out = capsys.readouterr().out
    assert f"{path}:3:31: findings.source-unavailable.level: warning: 'off' hides" in out
    path.write_text("version: 1\nfindings:\n  source-unavailable: {level: WARN}\n")
    assert main(["policy", "check", str(path)]) == 0
    assert "warning" not in capsys.readouterr().out
