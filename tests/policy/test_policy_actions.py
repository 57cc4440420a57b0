"""The policy's actions and acting: the issue's example loads into the values the model names,
every wrong key is a problem at its own line and column, and the grace is checked against the
fleet's interval."""

from __future__ import annotations

import io
import re
import textwrap
from datetime import timedelta
from pathlib import Path

import pytest

from gpuledger.cli import build_parser, main
from gpuledger.errors import PolicyError
from gpuledger.model import Code
from gpuledger.model.actions import Act, ActingRules, ActionRule, Exclusions
from gpuledger.policy.actions_load import action_problems, duration_text, webhook_problem
from gpuledger.policy.load import default_policy_text, parse_policy
from tests.paths import REPO

ISSUE_EXAMPLE = """\
version: 1
acting:                          # optional; defaults: max_per_hour 10, no exclusions
  max_per_hour: 10               # all actions together, any hour
  exclude:
    namespace: ["prod-*"]        # globs; a job/alloc matched is never acted on
    job: ["*-critical"]
    owner: ["oncall"]
actions:
  - on: reserved-idle            # a finding code
    where: {namespace: "default"} # optional: the policy's own match keys (node, namespace, job)
    notify: true                 # optional (default false): label on the finding's series
    webhook: https://hooks.example/gpu   # optional: notice POSTed there too
    after: 2h                    # the grace, from the finding's since (default 2h)
    act: scale-down              # optional: scale-down | stop-allocation | node-ineligible
    min: 0                       # scale-down only: never below (default 0)
    max_per_hour: 3              # optional, this action
    exclude: {job: ["batch-*"]}  # optional, this action (same keys as acting.exclude)
"""


def problems(text: str) -> list[str]:
    with pytest.raises(PolicyError) as caught:
        parse_policy(text, "p.yaml")
    return caught.value.problems


def policy_of(actions: str) -> str:
    return "version: 1\nactions:\n" + textwrap.indent(textwrap.dedent(actions), "  ")


def test_the_issues_example_loads_into_the_values_of_the_model() -> None:
    policy = parse_policy(ISSUE_EXAMPLE, "p.yaml")
    assert policy.actions == (
        ActionRule(
            on=Code.RESERVED_IDLE,
            act=Act.SCALE_DOWN,
            notify=True,
            webhook="https://hooks.example/gpu",
            after=timedelta(hours=2),
            where={"namespace": "default"},
            exclude=Exclusions(jobs=("batch-*",)),
            min=0,
            max_per_hour=3,
            line=9,
        ),
    )
    assert policy.acting == ActingRules(
        max_per_hour=10,
        exclude=Exclusions(namespaces=("prod-*",), jobs=("*-critical",), owners=("oncall",)),
    )


def test_what_an_action_leaves_out_takes_its_default() -> None:
    policy = parse_policy(policy_of("- on: hot\n  notify: true\n"), "p.yaml")
    assert policy.actions == (
        ActionRule(
            on=Code.HOT,
            act=None,
            notify=True,
            webhook=None,
            after=timedelta(hours=2),
            where={},
            exclude=Exclusions((), (), ()),
            min=0,
            max_per_hour=None,
            line=3,
        ),
    )
    assert policy.acting == ActingRules(max_per_hour=10, exclude=Exclusions((), (), ()))


def test_a_policy_without_actions_has_none_and_the_default_acting() -> None:
    policy = parse_policy("version: 1\n", "p.yaml")
    assert (policy.actions, policy.acting) == ((), ActingRules(10, Exclusions()))
    acting = parse_policy("version: 1\nacting: {exclude: {owner: [oncall]}}\n", "p.yaml").acting
    assert acting == ActingRules(10, Exclusions(owners=("oncall",)))


def test_actions_keep_their_file_order_and_lines() -> None:
    text = policy_of(
        """\
        - on: unreserved-tenant
          act: stop-allocation
          after: 30m
        - on: gpu-unhealthy
          webhook: http://hooks.example:8080/gpu
          act: node-ineligible
        - on: held-idle
          where: {node: "gpu-*", job: "train-*"}
          act: scale-down
          min: 1
        """
    )
    acts = parse_policy(text, "p.yaml").actions
    assert [(a.on, a.act, a.line) for a in acts] == [
        (Code.UNRESERVED_TENANT, Act.STOP_ALLOCATION, 3),
        (Code.GPU_UNHEALTHY, Act.NODE_INELIGIBLE, 6),
        (Code.HELD_IDLE, Act.SCALE_DOWN, 9),
    ]
    assert acts[0].after == timedelta(minutes=30)
    assert acts[1].webhook == "http://hooks.example:8080/gpu"
    assert (acts[2].where, acts[2].min, acts[2].notify) == (
        {"node": "gpu-*", "job": "train-*"},
        1,
        False,
    )


# Each: the actions (from line 3, indented by two), and the one problem, columns by hand.
BAD = {
    "an act the code cannot take": (
        "- on: unmanaged-tenant\n  act: node-ineligible\n",
        "p.yaml:4:10: actions[0].act: 'node-ineligible' cannot be done on unmanaged-tenant "
        "findings, which take no act (notify and webhook only); node-ineligible is taken by "
        "gpu-unhealthy findings: remove act, or change on",
    ),
    "an act of another code": (
        "- on: gpu-unhealthy\n  act: scale-down\n",
        "p.yaml:4:10: actions[0].act: 'scale-down' cannot be done on gpu-unhealthy findings, "
        "which take node-ineligible only; scale-down is taken by held-idle and reserved-idle "
        "findings: change act, or on",
    ),
    "no act, notify or webhook": (
        "- on: hot\n",
        "p.yaml:3:5: actions[0]: does nothing: set notify: true, a webhook, or act (hot takes "
        "no act)",
    ),
    "notify false and nothing else": (
        "- on: reserved-idle\n  notify: false\n",
        "p.yaml:3:5: actions[0]: does nothing: set notify: true, a webhook, or act "
        "(reserved-idle takes scale-down)",
    ),
    "min on stop-allocation": (
        "- on: unreserved-tenant\n  act: stop-allocation\n  min: 1\n",
        "p.yaml:5:5: actions[0].min: min is the count scale-down never goes below: it applies "
        "to act: scale-down only; remove it",
    ),
    "min without an act": (
        "- on: reserved-idle\n  notify: true\n  min: 1\n",
        "p.yaml:5:5: actions[0].min: min shapes the act, and this action has none: remove "
        "min, or set act",
    ),
    "after without an act": (
        "- on: hot\n  notify: true\n  after: 1h\n",
        "p.yaml:5:5: actions[0].after: after shapes the act, and this action has none: remove "
        "after, or set act",
    ),
    "a negative min": (
        "- on: held-idle\n  act: scale-down\n  min: -1\n",
        "p.yaml:5:10: actions[0].min: -1 is not a whole number from 0 to 2147483647",
    ),
    "a fractional min": (
        "- on: held-idle\n  act: scale-down\n  min: 1.5\n",
        "p.yaml:5:10: actions[0].min: 1.5 is not a whole number from 0 to 2147483647",
    ),
    "max_per_hour 0": (
        "- on: held-idle\n  act: scale-down\n  max_per_hour: 0\n",
        "p.yaml:5:19: actions[0].max_per_hour: 0 is not a whole number of acts from 1 to 3600",
    ),
    "a huge max_per_hour": (
        "- on: held-idle\n  act: scale-down\n  max_per_hour: 99999999999999999999999\n",
        "p.yaml:5:19: actions[0].max_per_hour: 99999999999999999999999 is not a whole number "
        "of acts from 1 to 3600",
    ),
    "a huge min": (
        "- on: held-idle\n  act: scale-down\n  min: 2147483648\n",
        "p.yaml:5:10: actions[0].min: 2147483648 is not a whole number from 0 to 2147483647",
    ),
    "a grace without a unit": (
        "- on: held-idle\n  act: scale-down\n  after: 2\n",
        "p.yaml:5:12: actions[0].after: 2 is not a duration such as 0s, 90s, 30m, 6h or 1d12h",
    ),
    "a grace too long": (
        "- on: held-idle\n  act: scale-down\n  after: 999999999999d\n",
        "p.yaml:5:12: actions[0].after: '999999999999d' is longer than 36500d",
    ),
    "an unknown code": (
        "- on: reserved_idle\n  notify: true\n",
        "p.yaml:3:9: actions[0].on: 'reserved_idle' is not a finding code: one of "
        "controller-missing, device-health-mismatch, device-unscheduled, encoder-saturated, "
        "gpu-unhealthy, gpu-xid, held-idle, hot, policy-invalid, reserved-idle, "
        "source-unavailable, unmanaged-tenant, unreserved-tenant",
    ),
    "no code": (
        "- notify: true\n",
        "p.yaml:3:5: actions[0].on: missing (actions[0] needs on)",
    ),
    "an unknown act": (
        "- on: held-idle\n  act: drain\n",
        "p.yaml:4:10: actions[0].act: 'drain' is not one of scale-down, stop-allocation, "
        "node-ineligible",
    ),
    "notify not a boolean": (
        "- on: hot\n  notify: yes\n",
        "p.yaml:4:13: actions[0].notify: 'yes' is not true or false",
    ),
    "where on profile": (
        "- on: hot\n  notify: true\n  where: {profile: '1g.*'}\n",
        "p.yaml:5:13: actions[0].where.profile: unknown key 'profile'; allowed: job, namespace, "
        "node",
    ),
    "an empty where": (
        "- on: hot\n  notify: true\n  where: {}\n",
        "p.yaml:5:12: actions[0].where: is empty: give at least one of job, namespace, node",
    ),
    "a where glob that cannot match": (
        "- on: reserved-idle\n  notify: true\n  where: {namespace: ml_team}\n",
        "p.yaml:5:24: actions[0].where.namespace: 'ml_team' cannot match any Nomad namespace: "
        "'_' is not allowed (letters, digits and '-' only)",
    ),
    "a where that never applies": (
        "- on: gpu-unhealthy\n  act: node-ineligible\n  where: {job: 'train-*'}\n",
        "p.yaml:5:13: actions[0].where.job: never applies: gpu-unhealthy findings name no job; "
        "match them on node only, or leave where out",
    ),
    "a where on namespace of a node's code": (
        "- on: unmanaged-tenant\n  notify: true\n  where: {namespace: research}\n",
        "p.yaml:5:13: actions[0].where.namespace: never applies: unmanaged-tenant findings "
        "name no namespace; match them on node only, or leave where out",
    ),
    "an empty exclusion": (
        "- on: held-idle\n  act: scale-down\n  exclude: {job: ['']}\n",
        "p.yaml:5:21: actions[0].exclude.job[0]: '' is not a non-empty glob such as 'nightly-*'",
    ),
    "a null exclusion": (
        "- on: held-idle\n  act: scale-down\n  exclude: {owner: [null]}\n",
        "p.yaml:5:23: actions[0].exclude.owner[0]: null is not a non-empty glob such as "
        "'nightly-*'",
    ),
    "an owner glob with a control character": (
        '- on: held-idle\n  act: scale-down\n  exclude: {owner: ["on\\x07call"]}\n',
        "p.yaml:5:23: actions[0].exclude.owner[0]: 'on\\x07call' cannot match any owner: "
        "'\\x07' is not allowed (printable characters only, as an owner label holds)",
    ),
    "an owner glob longer than any owner": (
        f"- on: held-idle\n  act: scale-down\n  exclude: {{owner: [{'a' * 257}]}}\n",
        f"p.yaml:5:23: actions[0].exclude.owner[0]: {'a' * 257!r} cannot match any owner: it "
        "needs 257 characters, more than the 256 allowed",
    ),
    "an unknown exclusion key": (
        "- on: held-idle\n  act: scale-down\n  exclude: {team: [a]}\n",
        "p.yaml:5:15: actions[0].exclude.team: unknown key 'team'; allowed: job, namespace, owner",
    ),
    "a webhook of another scheme": (
        "- on: hot\n  webhook: ftp://hooks.example/gpu\n",
        "p.yaml:4:14: actions[0].webhook: is not an http or https URL: write it as "
        "https://host/path",
    ),
    "a webhook with credentials": (
        "- on: hot\n  webhook: https://bot:s3cret@hooks.example/gpu\n",
        "p.yaml:4:14: actions[0].webhook: holds credentials (user:password@): a webhook's URL "
        "is shown in the plan, the audit and the logs; remove them, and let the receiver take "
        "its secret otherwise",
    ),
    "a webhook without a host": (
        "- on: hot\n  webhook: 'https:///gpu'\n",
        "p.yaml:4:14: actions[0].webhook: has no host: write it as https://host/path",
    ),
    "a webhook with a NUL": (
        '- on: hot\n  webhook: "https://hooks.example/\\0"\n',
        "p.yaml:4:14: actions[0].webhook: holds a blank or a control character: write the URL "
        "percent-encoded",
    ),
    "a webhook not a string": (
        "- on: hot\n  webhook: 5\n",
        "p.yaml:4:14: actions[0].webhook: 5 is not an http or https URL such as "
        "https://hooks.example/gpu",
    ),
    "a second action acting alike": (
        "- on: reserved-idle\n  where: {namespace: a}\n  act: scale-down\n"
        "- on: reserved-idle\n  where: {namespace: a}\n  after: 4h\n  act: scale-down\n",
        "p.yaml:9:5: actions[1].act: actions[0] (line 3) already acts on reserved-idle findings "
        "with the same where: this one would never be the one planned; merge the two, or give "
        "one a where of its own",
    ),
    "an action not a mapping": (
        "- reserved-idle\n",
        "p.yaml:3:5: actions[0]: 'reserved-idle' is not a mapping such as {on: reserved-idle, "
        "notify: true, after: 2h, act: scale-down}",
    ),
}


@pytest.mark.parametrize(("actions", "expected"), BAD.values(), ids=BAD.keys())
def test_each_wrong_action_is_one_problem_at_its_key(actions: str, expected: str) -> None:
    assert problems(policy_of(actions)) == [expected]


def test_an_action_differing_in_where_or_not_acting_is_no_duplicate() -> None:
    text = policy_of(
        """\
        - on: reserved-idle
          act: scale-down
        - on: reserved-idle
          where: {namespace: research}
          act: scale-down
        - on: reserved-idle
          notify: true
        - on: held-idle
          act: scale-down
        """
    )
    assert len(parse_policy(text, "p.yaml").actions) == 4


BAD_ACTING = {
    "acting's rate not a number": (
        "acting: {max_per_hour: true}\n",
        "p.yaml:2:24: acting.max_per_hour: true is not a whole number of acts from 1 to 3600",
    ),
    "acting's exclusion that cannot match": (
        "acting:\n  exclude:\n    namespace: ['prod team']\n",
        "p.yaml:4:17: acting.exclude.namespace[0]: 'prod team' cannot match any Nomad "
        "namespace: ' ' is not allowed (letters, digits and '-' only)",
    ),
    "acting's job exclusion with a space": (
        "acting: {exclude: {job: ['a b']}}\n",
        "p.yaml:2:26: acting.exclude.job[0]: 'a b' cannot match any Nomad job: ' ' is not "
        "allowed (no spaces)",
    ),
    "acting's unknown key": (
        "acting: {dry_run: true}\n",
        "p.yaml:2:10: acting.dry_run: unknown key 'dry_run'; allowed: exclude, max_per_hour",
    ),
    "actions a mapping": (
        "actions: {on: hot}\n",
        "p.yaml:2:10: actions: must be a list of actions, each {on: CODE, ...}, not a mapping",
    ),
}


@pytest.mark.parametrize(("text", "expected"), BAD_ACTING.values(), ids=BAD_ACTING.keys())
def test_each_wrong_acting_key_is_one_problem_at_its_key(text: str, expected: str) -> None:
    assert problems("version: 1\n" + text) == [expected]


def test_every_problem_of_several_actions_is_reported_at_once() -> None:
    text = policy_of(
        """\
        - on: hot
        - on: unreserved-tenant
          act: scale-down
          webhook: https://u:p@hooks.example/
        """
    )
    assert [p.split(": ")[0] for p in problems(text)] == [
        "p.yaml:3:5",
        "p.yaml:5:10",
        "p.yaml:6:14",
    ]


@pytest.mark.parametrize(
    "url",
    [
        "https://hooks.example/gpu",
        "http://10.0.0.1:9000/hook?team=ml",
        "https://[::1]:8443/x",
        "https://hooks.example/services/T0/B0/XXXX",
    ],
)
def test_a_webhook_with_a_host_and_no_credentials_is_taken(url: str) -> None:
    assert webhook_problem(url) is None


@pytest.mark.parametrize(
    "url",
    ["http://[::1/x", "https://hooks.example:99999/", "https://hooks.example:0/", "hooks.example"],
)
def test_a_webhook_that_is_no_usable_url_is_refused(url: str) -> None:
    assert webhook_problem(url) is not None


@pytest.mark.parametrize(
    "url", ["ftp://bot:t0ken@h/p4th", "https://bot:t0ken@h/p4th", f"https://h/p4th{'x' * 2048}"]
)
def test_a_webhooks_problem_never_quotes_its_secret(url: str) -> None:
    (problem,) = problems(policy_of(f"- on: hot\n  webhook: {url}\n"))
    assert "t0ken" not in problem and "p4th" not in problem


def test_a_webhook_over_2048_characters_is_refused_and_one_of_2048_taken() -> None:
    head = "https://hooks.example/"
    assert webhook_problem(head + "x" * (2048 - len(head))) is None
    assert webhook_problem(head + "x" * (2049 - len(head))) == (
        "is longer than 2048 characters: no receiver's URL is that long"
    )


# --------------------------------------------------------------------------- the interval


def acting_after(after: str) -> str:
    return policy_of(f"- on: held-idle\n  act: scale-down\n  after: {after}\n")


def test_a_grace_shorter_than_two_intervals_is_a_problem_at_its_action() -> None:
    policy = parse_policy(acting_after("59s"), "p.yaml")
    assert action_problems(policy, timedelta(seconds=30)) == [
        "p.yaml:3: actions[0].after: 59s is shorter than two intervals (1m at an interval of "
        "30s): the scale-down would be due before the fleet had seen the finding twice; set "
        "after: 1m or longer, or sweep more often"
    ]


def test_a_grace_of_exactly_two_intervals_is_enough() -> None:
    assert action_problems(parse_policy(acting_after("1m"), "p.yaml"), timedelta(seconds=30)) == []


def test_the_fix_a_short_interval_suggests_is_whole_seconds_as_the_policy_writes() -> None:
    policy = parse_policy(acting_after("0s"), "p.yaml")
    (problem,) = action_problems(policy, timedelta(milliseconds=250))
    assert "0s is shorter than two intervals (500ms at an interval of 250ms)" in problem
    assert problem.endswith("set after: 1s or longer, or sweep more often")


def test_an_action_that_only_notifies_has_no_grace_to_check() -> None:
    policy = parse_policy(policy_of("- on: hot\n  notify: true\n"), "p.yaml")
    assert action_problems(policy, timedelta(hours=3)) == []


def test_the_default_grace_is_checked_too() -> None:
    policy = parse_policy(policy_of("- on: held-idle\n  act: scale-down\n"), "p.yaml")
    assert action_problems(policy, timedelta(minutes=59)) == []
    (problem,) = action_problems(policy, timedelta(hours=1, seconds=1))
    assert problem.startswith("p.yaml:3: actions[0].after: 2h is shorter than two intervals")


@pytest.mark.parametrize(
    ("span", "text"),
    [
        (timedelta(0), "0s"),
        (timedelta(hours=2), "2h"),
        (timedelta(minutes=1, seconds=30), "1m30s"),
        (timedelta(days=1, hours=12), "1d12h"),
        (timedelta(milliseconds=500), "500ms"),
    ],
)
def test_a_duration_is_written_as_the_policy_writes_it(span: timedelta, text: str) -> None:
    assert duration_text(span) == text


# --------------------------------------------------------------------------- policy check


def run(*argv: str) -> tuple[int, str]:
    out = io.StringIO()
    code = main(list(argv), out=out)
    return code, out.getvalue()


def test_policy_check_counts_the_actions_that_act_and_says_nothing_acts_alone(
    tmp_path: Path,
) -> None:
    path = tmp_path / "p.yaml"
    path.write_text(ISSUE_EXAMPLE + "  - on: hot\n    notify: true\n")
    code, out = run("policy", "check", str(path))
    assert (code, out.splitlines()) == (
        0,
        [
            f"{path}: actions that act: 1 of 2 (scale-down); fleet serve only plans them, "
            "nothing is done without fleet serve --act apply",
            f"{path}: ok",
        ],
    )


def test_policy_check_without_acting_actions_says_only_ok(tmp_path: Path) -> None:
    path = tmp_path / "p.yaml"
    path.write_text(policy_of("- on: hot\n  notify: true\n"))
    assert run("policy", "check", str(path)) == (0, f"{path}: ok\n")


def test_policy_check_refuses_a_grace_under_two_of_its_interval(tmp_path: Path) -> None:
    path = tmp_path / "p.yaml"
    path.write_text(ISSUE_EXAMPLE)
    code, out = run("policy", "check", str(path), "--interval", "1h30m")
    assert (code, out.splitlines()) == (
        1,
        [
            f"{path}:9: actions[0].after: 2h is shorter than two intervals (3h at an interval "
            "of 1h30m): the scale-down would be due before the fleet had seen the finding "
            "twice; set after: 3h or longer, or sweep more often"
        ],
    )
    assert run("policy", "check", str(path), "--interval", "1h")[0] == 0


def test_policy_check_takes_the_interval_with_its_unit_only(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "p.yaml"
    path.write_text(ISSUE_EXAMPLE)
    with pytest.raises(SystemExit) as caught:
        main(["policy", "check", str(path), "--interval", "30"])
    assert caught.value.code == 2
    assert "--interval" in capsys.readouterr().err


def test_policy_checks_interval_is_fleet_serves_by_default() -> None:
    parser = build_parser()
    checked = parser.parse_args(["policy", "check", "p.yaml"]).interval
    served = parser.parse_args(["fleet", "serve", "--targets", "http://a"]).interval
    assert checked == served == timedelta(seconds=30)


HOSTILE = {
    "NUL in on": '- on: "hot\\0"\n  notify: true\n',
    "NUL in a where glob": '- on: hot\n  notify: true\n  where: {node: "a\\0"}\n',
    "a list for on": "- on: [hot]\n  notify: true\n",
    "a mapping for act": "- on: held-idle\n  act: {scale: down}\n",
    "a string for where": "- on: hot\n  notify: true\n  where: node\n",
    "a list for exclude": "- on: held-idle\n  act: scale-down\n  exclude: [a]\n",
    "a huge float rate": "- on: held-idle\n  act: scale-down\n  max_per_hour: 1.0e+300\n",
    "an infinite min": "- on: held-idle\n  act: scale-down\n  min: .inf\n",
    "a huge grace": "- on: held-idle\n  act: scale-down\n  after: 99999999999999999999999s\n",
    "a lone surrogate webhook": '- on: hot\n  webhook: "https://h/\\ud800"\n',
    "a long webhook": f"- on: hot\n  webhook: https://h/{'x' * 5000}\n",
    "a bracket host": "- on: hot\n  webhook: 'http://[::1/x'\n",
    "null action": "- null\n",
}


@pytest.mark.parametrize("actions", HOSTILE.values(), ids=HOSTILE.keys())
def test_policy_check_reports_hostile_actions_without_a_traceback(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], actions: str
) -> None:
    path = tmp_path / "p.yaml"
    path.write_text(policy_of(actions))
    code, out = run("policy", "check", str(path))
    assert code == 1
    assert out and all(
        re.match(rf"{re.escape(str(path))}:\d+:\d+: ", line) for line in out.splitlines()
    )
    assert capsys.readouterr().err == ""


# --------------------------------------------------------------------------- the docs


def _actions_example(text: str) -> str:
    lines = text.splitlines()
    start = lines.index("#   acting:")
    example = []
    for line in lines[start:]:
        if not line.startswith("#  "):
            break
        example.append(line.removeprefix("# "))
    return "version: 1\n" + textwrap.dedent("\n".join(example)) + "\n"


def test_the_built_in_policys_commented_actions_are_a_policy_that_loads() -> None:
    policy = parse_policy(_actions_example(default_policy_text()), "example.yaml")
    assert [(a.on, a.act) for a in policy.actions] == [
        (Code.RESERVED_IDLE, Act.SCALE_DOWN),
        (Code.GPU_UNHEALTHY, None),
    ]
    assert policy.acting == ActingRules(10, Exclusions(namespaces=("prod-*",), owners=("oncall",)))


def test_the_policy_pages_actions_example_loads_and_acts_twice() -> None:
    page = (REPO / "docs" / "policy.md").read_text(encoding="utf-8")
    section = page[page.index("## Actions") :]
    block = re.search(r"^```yaml\n(.*?)^```", section, flags=re.DOTALL | re.MULTILINE)
    assert block is not None
    policy = parse_policy(block.group(1), "policy.md")
    assert [(a.on, a.act) for a in policy.actions] == [
        (Code.RESERVED_IDLE, Act.SCALE_DOWN),
        (Code.GPU_UNHEALTHY, Act.NODE_INELIGIBLE),
    ]
    assert action_problems(policy, timedelta(seconds=30)) == []
    assert "(actions.md)" in section
