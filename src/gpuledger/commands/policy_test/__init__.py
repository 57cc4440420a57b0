"""``gpuledger policy test FILE…``: a policy's unit tests, in the spirit of ``promtool test rules``.

A test file names the policy it tests and a list of cases. Each case gives a ledger — inline, a
compact list of GPUs with their reservation and tenants, or a named simulated scenario (``demo``,
or a scenario ``.yaml`` beside the test file) read through the real collectors — and, optionally,
how long each GPU has been as it is (``history``). The case passes when the findings the policy
gives are exactly the expected ones: each expected finding matches one given finding by
``code``, ``level``, ``gpu`` (its index, its UUID, or null for a node-wide finding; left out,
any) and ``subject`` (the keys given must be equal; others are not compared), and, with
``act`` (and ``after``), what the policy's ``actions`` do with it: the act of the first action
that takes it (``notify`` for one without an act, ``none`` when no action does) and its grace.
``codes`` limits both sides to those codes. A failing case prints a unified diff whose ``+``
lines can be pasted into the file.

::

    policy: research.yaml            # relative to the test file
    tests:
      - name: a research notebook may idle for a day
        gpus:
          - index: 1
            reservation: {id: a1, namespace: research, job: notebook-ana, task: jupyter}
        history: {1: {state: 20h}}   # GPU 1 has been in its state (reserved-idle) for 20h
        expect: []
      - name: the demo node
        scenario: demo
        codes: [hot]
        expect:
          - {code: hot, level: WARN, gpu: 3}

Exit 0 when every case passes, 1 when one fails; a test file (or its policy) that does not
validate is a usage error (exit 2) listing every problem as ``FILE:LINE:COLUMN: key: what``.

- ``suite``: reading a test file: its schema, its policy, and what a schema cannot check
- ``suite_schema``: the JSON Schema of a test file, built from the model's own names
- ``case_ledgers``: the ledger each case is judged on (inline, or a simulated scenario)
- ``compare``: the findings expected against those given, as a unified diff
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, TextIO

from gpuledger.commands.policy_test.case_ledgers import AT, Scenarios, inline_ledger, since_of
from gpuledger.commands.policy_test.compare import ActOf, compare
from gpuledger.commands.policy_test.suite import Case, Suite, load_suite
from gpuledger.core.act_plan import action_for
from gpuledger.errors import ConfigError, ExitCode, PolicyError
from gpuledger.model import Finding
from gpuledger.policy.evaluate import evaluate
from gpuledger.policy.rules import Policy

__all__ = ["run_case", "run_policy_tests"]


def run_case(suite: Suite, case: Case, scenarios: Scenarios) -> list[str]:
    """The diff of one case (empty when it passes)."""
    doc = case.doc
    ledger = scenarios.ledger(case, suite.policy) if case.scenario else inline_ledger(doc)
    since = since_of(ledger, doc.get("history", {}))
    findings = evaluate(ledger, suite.policy, since, AT)
    if "codes" in doc:
        codes = set(doc["codes"])
        findings = tuple(f for f in findings if f.code.value in codes)
        expected = [e for e in doc["expect"] if e["code"] in codes]
    else:
        expected = list(doc["expect"])
    index_of = {lgpu.gpu.uuid: lgpu.gpu.index for lgpu in ledger.gpus}
    return compare(expected, findings, index_of, _act_of(suite.policy))


def _act_of(policy: Policy) -> ActOf:
    """What the policy's actions do with a finding (nothing shown when it has none)."""
    if not policy.actions:
        return lambda f: {}

    def act_of(f: Finding) -> dict[str, Any]:
        rule = action_for(policy.actions, f)
        if rule is None:
            return {"act": "none"}
        if rule.act is None:
            return {"act": "notify"}
        return {"act": rule.act.value, "after": rule.after}

    return act_of


def run_policy_tests(files: list[Path], out: TextIO) -> ExitCode:
    """Run every case of ``files``: ``OK`` when all pass, ``FOUND`` when one fails (with its
    diff)."""
    suites: list[Suite] = []
    problems: list[str] = []
    for path in files:
        try:
            suites.append(load_suite(path))
        except PolicyError as exc:
            problems.extend(exc.problems)
        except ConfigError as exc:
            problems.append(str(exc))
    if problems:
        raise ConfigError("\n".join(problems))
    scenarios = Scenarios()
    passed = failed = 0
    for suite in suites:
        out.write(f"{suite.path} (policy {suite.policy.source})\n")
        for case in suite.cases:
            diff = run_case(suite, case, scenarios)
            if diff:
                failed += 1
                out.write(f"  FAIL  {case.name}\n")
                out.writelines(f"        {line}\n" for line in diff)
            else:
                passed += 1
                out.write(f"  ok    {case.name}\n")
    total = passed + failed
    out.write(f"{total} case{'s' if total != 1 else ''}: {passed} passed, {failed} failed\n")
    return ExitCode.FOUND if failed else ExitCode.OK
