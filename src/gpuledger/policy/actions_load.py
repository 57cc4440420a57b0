"""The policy's ``actions`` and ``acting``: checked beyond the schema, and built into values.

The schema (``schema.json``) holds their keys and types; this module adds what it cannot say,
each a problem at the offending key: an act the finding code cannot take (``ACTS_FOR``), an
action that does nothing, a key that shapes an act on an action without one, globs that cannot
match, a ``where`` that never applies, a webhook that is no http(s) URL or holds credentials,
and a second action that acts where an earlier one already does. ``action_problems`` adds the
one check that needs the fleet's ``--interval``: a grace shorter than two sweeps.

Nothing here acts; ``fleet serve`` plans the actions, and acts only with ``--act apply``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator, Mapping
from datetime import timedelta
from typing import Any
from urllib.parse import urlsplit

from gpuledger.located import JsonPath, Located, Problem
from gpuledger.model import Code
from gpuledger.model.actions import (
    ACTS_FOR,
    DEFAULT_GRACE,
    Act,
    ActingRules,
    ActionRule,
    Exclusions,
)
from gpuledger.model.time_text import parse_duration
from gpuledger.policy.globs import JOB, NAMESPACE, NODE, OWNER, NameKind, why_unmatchable
from gpuledger.policy.rules import Policy
from gpuledger.policy.schema import policy_schema

NAMESPACED = frozenset(
    {Code.UNRESERVED_TENANT, Code.RESERVED_IDLE, Code.HELD_IDLE, Code.SOURCE_UNAVAILABLE}
)
"""Codes whose findings name an allocation's namespace and job (``source-unavailable`` only
when Nomad hid an allocation or a reserved device is missing): a ``where`` on namespace or job
of any other code never applies."""

_ACT_ONLY = ("after", "max_per_hour", "exclude", "min")
"""Keys that shape the act: on an action without ``act`` they would be silently ignored."""
MAX_WEBHOOK = 2048
"""The longest webhook URL taken: longer is a pasted document, not an address."""
_WHERE_KINDS = {"node": NODE, "namespace": NAMESPACE, "job": JOB}
_EXCLUDE_KINDS = {"namespace": NAMESPACE, "job": JOB, "owner": OWNER}
_EXCLUDE_FIELDS = {"namespace": "namespaces", "job": "jobs", "owner": "owners"}


def actions_beyond_schema(doc: Located) -> Iterator[Problem]:
    """What the schema cannot say about ``acting`` and ``actions``."""
    root = doc.value if isinstance(doc.value, dict) else {}
    acting = root.get("acting")
    if isinstance(acting, dict):
        yield from _exclusion_globs(doc, ("acting", "exclude"), acting.get("exclude"))
    actions = root.get("actions")
    acting_at: dict[tuple[str, tuple[tuple[str, str], ...]], int] = {}
    for i, action in enumerate(actions if isinstance(actions, list) else []):
        if not isinstance(action, dict):
            continue
        here: JsonPath = ("actions", i)
        yield from _entry(doc, here, action)
        yield from _exclusion_globs(doc, (*here, "exclude"), action.get("exclude"))
        yield from _where(doc, here, action)
        key = _acting_key(action)
        if key is None:
            continue
        if key in acting_at:
            first = acting_at[key]
            yield doc.problem(
                (*here, "act"),
                f"actions[{first}] (line {doc.at(('actions', first))[0]}) already acts on "
                f"{key[0]} findings with the same where: this one would never be the one "
                "planned; merge the two, or give one a where of its own",
                on_key=True,
            )
        else:
            acting_at[key] = i


def _acting_key(action: Mapping[str, Any]) -> tuple[str, tuple[tuple[str, str], ...]] | None:
    """An acting action's code and ``where``, to tell two that plan the same acts."""
    on, where = action.get("on"), action.get("where", {})
    if "act" not in action or not isinstance(on, str) or not isinstance(where, dict):
        return None
    return on, tuple(sorted((str(k), repr(v)) for k, v in where.items()))


def _entry(doc: Located, here: JsonPath, action: Mapping[str, Any]) -> Iterator[Problem]:
    """The act against its code, an action that does nothing, act-only keys without an act,
    the grace's length and the webhook."""
    code = _code(action.get("on"))
    act = _act(action.get("act"))
    if code is not None and act is not None and act not in ACTS_FOR.get(code, frozenset()):
        yield doc.problem((*here, "act"), _wrong_act(code, act))
    notify = action.get("notify", False)
    if "act" not in action and "webhook" not in action and notify is False:
        takes = _takes(code) if code is not None else "an act of its code"
        yield doc.problem(
            here, f"does nothing: set notify: true, a webhook, or act ({takes})", on_key=True
        )
    for key in _ACT_ONLY:
        if key in action and "act" not in action:
            yield doc.problem(
                (*here, key),
                f"{key} shapes the act, and this action has none: remove {key}, or set act",
                on_key=True,
            )
        elif key == "min" and key in action and act not in (None, Act.SCALE_DOWN):
            yield doc.problem(
                (*here, key),
                "min is the count scale-down never goes below: it applies to act: scale-down "
                "only; remove it",
                on_key=True,
            )
    after = action.get("after")
    if isinstance(after, str) and re.search(policy_schema()["$defs"]["duration"]["pattern"], after):
        # The schema reports what is no duration at all; this only what is too long.
        try:
            parse_duration(after)
        except ValueError as exc:
            yield doc.problem((*here, "after"), str(exc))
    webhook = action.get("webhook")
    if isinstance(webhook, str) and webhook and (why := webhook_problem(webhook)):
        yield doc.problem((*here, "webhook"), why)


def _code(value: object) -> Code | None:
    return Code(value) if isinstance(value, str) and value in _CODES else None


def _act(value: object) -> Act | None:
    return Act(value) if isinstance(value, str) and value in _ACTS else None


_CODES = frozenset(code.value for code in Code)
_ACTS = frozenset(act.value for act in Act)


def _takes(code: Code) -> str:
    acts = sorted(a.value for a in ACTS_FOR.get(code, frozenset()))
    return f"{code.value} takes {', '.join(acts)}" if acts else f"{code.value} takes no act"


def _wrong_act(code: Code, act: Act) -> str:
    """Which codes take ``act``, and what ``code`` takes instead."""
    takers = sorted(c.value for c, acts in ACTS_FOR.items() if act in acts)
    if code in ACTS_FOR:
        takes = f"which take {', '.join(sorted(a.value for a in ACTS_FOR[code]))} only"
        fix = "change act, or on"
    else:
        takes = "which take no act (notify and webhook only)"
        fix = "remove act, or change on"
    return (
        f"{act.value!r} cannot be done on {code.value} findings, {takes}; {act.value} is "
        f"taken by {' and '.join(takers)} findings: {fix}"
    )


def _where(doc: Located, here: JsonPath, action: Mapping[str, Any]) -> Iterator[Problem]:
    """``where`` globs that cannot match, and namespace or job on a code that names neither."""
    where = action.get("where")
    if not isinstance(where, dict):
        return
    for key, kind in _WHERE_KINDS.items():
        glob = where.get(key)
        if isinstance(glob, str) and glob and (why := why_unmatchable(glob, kind)):
            yield doc.problem((*here, "where", key), why)
    code = _code(action.get("on"))
    if code is None or code in NAMESPACED:
        return
    for key in ("namespace", "job"):
        if key in where:
            yield doc.problem(
                (*here, "where", key),
                f"never applies: {code.value} findings name no {key}; match them on node "
                "only, or leave where out",
                on_key=True,
            )


def _exclusion_globs(doc: Located, path: JsonPath, exclude: Any) -> Iterator[Problem]:
    if not isinstance(exclude, dict):
        return
    yield from _globs_of(doc, path, exclude, _EXCLUDE_KINDS)


def _globs_of(
    doc: Located, path: JsonPath, value: Mapping[str, Any], kinds: Mapping[str, NameKind]
) -> Iterator[Problem]:
    for key, kind in kinds.items():
        globs = value.get(key)
        for i, glob in enumerate(globs if isinstance(globs, list) else []):
            if isinstance(glob, str) and glob and (why := why_unmatchable(glob, kind)):
                yield doc.problem((*path, key, i), why)


def webhook_problem(url: str) -> str | None:
    """Why ``url`` cannot be a webhook, or ``None``. The URL is never quoted back: a webhook's
    path is often its secret (a chat's incoming hook), and problems end up in logs."""
    if len(url) > MAX_WEBHOOK:
        return f"is longer than {MAX_WEBHOOK} characters: no receiver's URL is that long"
    if any(ch.isspace() or not ch.isprintable() for ch in url):
        return "holds a blank or a control character: write the URL percent-encoded"
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        return "is not a URL (its host or port cannot be read): write it as https://host/path"
    if parts.scheme not in ("http", "https"):
        return "is not an http or https URL: write it as https://host/path"
    if "@" in parts.netloc:
        return (
            "holds credentials (user:password@): a webhook's URL is shown in the plan, the "
            "audit and the logs; remove them, and let the receiver take its secret otherwise"
        )
    if not parts.hostname:
        return "has no host: write it as https://host/path"
    if port == 0:
        return "has port 0, which no server listens on: write another port, or none"
    return None


# --------------------------------------------------------------------------- values


def acting_values(doc: Located, base: Policy) -> tuple[tuple[ActionRule, ...], ActingRules]:
    """``actions`` and ``acting`` of a validated document; what it leaves out keeps ``base``'s."""
    value: Mapping[str, Any] = doc.value
    actions = base.actions
    if "actions" in value:
        actions = tuple(
            _action(a, doc.at(("actions", i))[0]) for i, a in enumerate(value["actions"])
        )
    acting = base.acting
    if "acting" in value:
        block = value["acting"]
        acting = ActingRules(
            max_per_hour=int(block.get("max_per_hour", ActingRules.max_per_hour)),
            exclude=_exclusions(block.get("exclude", {})),
        )
    return actions, acting


def _action(entry: Mapping[str, Any], line: int) -> ActionRule:
    per_hour = entry.get("max_per_hour")
    return ActionRule(
        on=Code(entry["on"]),
        act=Act(entry["act"]) if "act" in entry else None,
        notify=entry.get("notify", False) is True,
        webhook=entry.get("webhook"),
        after=parse_duration(entry["after"]) if "after" in entry else DEFAULT_GRACE,
        where=dict(entry.get("where", {})),
        exclude=_exclusions(entry.get("exclude", {})),
        min=int(entry.get("min", 0)),
        max_per_hour=None if per_hour is None else int(per_hour),
        line=line,
    )


def _exclusions(block: Mapping[str, Any]) -> Exclusions:
    return Exclusions(
        **{field: tuple(block.get(key, ())) for key, field in _EXCLUDE_FIELDS.items()}
    )


# --------------------------------------------------------------------------- the interval


def action_problems(policy: Policy, interval: timedelta) -> list[str]:
    """``FILE:LINE: actions[i].after: …`` for each action that acts with a grace shorter than
    two ``interval``s: its act would be due before the fleet had seen the finding twice, so
    one sweep's reading, maybe a passing one, would decide it. ``fleet serve`` checks its own
    ``--interval`` with this at start-up; ``policy check --interval`` does the same."""
    least = 2 * interval
    fix = duration_text(timedelta(seconds=math.ceil(least.total_seconds())))
    return [
        f"{policy.source}:{rule.line}: actions[{i}].after: {duration_text(rule.after)} is "
        f"shorter than two intervals ({duration_text(least)} at an interval of "
        f"{duration_text(interval)}): the {rule.act.value} would be due before the fleet had "
        f"seen the finding twice; set after: {fix} or longer, or sweep more often"
        for i, rule in enumerate(policy.actions)
        if rule.act is not None and rule.after < least
    ]


def acting_summary(policy: Policy) -> str | None:
    """One line for ``policy check``: how many actions act, and that none does without
    ``fleet serve --act apply``; ``None`` when no action acts."""
    acts = [rule.act.value for rule in policy.actions if rule.act is not None]
    if not acts:
        return None
    return (
        f"{policy.source}: actions that act: {len(acts)} of {len(policy.actions)} "
        f"({', '.join(sorted(set(acts)))}); fleet serve only plans them, nothing is done "
        "without fleet serve --act apply"
    )


_UNITS = (("d", 86_400_000), ("h", 3_600_000), ("m", 60_000), ("s", 1_000), ("ms", 1))


def duration_text(span: timedelta) -> str:
    """``span`` as a policy or a flag writes it: ``2h``, ``1m30s``, ``500ms``, ``0s``."""
    left = round(span / timedelta(milliseconds=1))
    parts = []
    for unit, size in _UNITS:
        count, left = divmod(left, size)
        if count:
            parts.append(f"{count}{unit}")
    return "".join(parts) or "0s"
