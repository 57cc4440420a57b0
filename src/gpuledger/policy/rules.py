"""The policy as values: one rule per finding code, and overrides scoped by node, namespace, job.

Overrides apply in order of specificity (how many of node, namespace, job they match on), the
more specific last so that it wins; overrides equally specific apply in file order, the later
winning. Each override changes only the keys it sets.
"""

from __future__ import annotations

import fnmatch
import functools
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import timedelta
from typing import Any, Literal

from gpuledger.model import Code, Level
from gpuledger.model.actions import ActingRules, ActionRule
from gpuledger.policy.note_rules import NoteRules

MaxSessions = int | Literal["card"]

LEGACY_XIDS = (48, 63, 64, 74, 79, 92, 93, 94, 95)
"""The Xids that made a card unhealthy before the catalog judged them (issue 37): a policy that
lists ``xids: [48, 63, 64, 74, 79, 92, 93, 94, 95]`` gets that judgement back."""


@dataclass(frozen=True)
class Rule:
    """The level (None: off) and thresholds of one finding code."""

    level: Level | None
    after: timedelta = timedelta(hours=6)
    below_percent: float = 5.0
    margin_c: int = 5
    temp_max_c: int = 85
    max_sessions: MaxSessions = "card"
    ignore_processes: tuple[str, ...] = ()
    ignore_containers: tuple[str, ...] = ()
    ignore_labels: Mapping[str, str] = field(default_factory=dict)
    ecc_uncorrected: int = 0
    retired_pages_pending: bool = True
    remap_pending: bool = True
    remap_failure: bool = True
    gpu_lost: bool = True
    pcie_width_below_max: bool = True
    pcie_gen_below_max: bool = False
    hw_slowdown: bool = False
    power_brake: bool = False
    xids: tuple[int, ...] | None = None
    """Set (a policy written before issue 37): exactly these Xids are faults, as they were;
    ``None``: NVIDIA's Xid catalog decides (``policy/xid_calls.py``)."""
    xids_fault: tuple[int, ...] = ()
    xids_warn: tuple[int, ...] = ()
    xids_ignored: tuple[int, ...] = ()
    """Xids the policy calls a fault, a warning (``gpu-xid``) or nothing, whatever the catalog
    or the driver's line says."""
    xid_window: timedelta = timedelta(hours=24)
    kernel_only_logs: tuple[str, ...] = ()
    """Text logs (``--kernel-log`` paths) that only the kernel writes: their Xid lines are
    trusted as ``/dev/kmsg`` records are; any other text log's lines are judged at most WARN."""
    pcie_busy_percent: float = 5.0
    """A card above this utilisation (or in performance state P0) is busy: only a busy card's
    narrower or slower link is a fault (``nvidia-smi --help-query-gpu``: the current link "may
    be reduced when the GPU is not in use")."""
    pcie_after: timedelta = timedelta(minutes=1)
    """How long a busy card's link must stay reduced before it is a fault."""
    ignore_devices: tuple[str, ...] = ()

    def with_changes(self, changes: Mapping[str, Any]) -> Rule:
        """This rule with the keys an override sets."""
        return replace(self, **dict(changes))

    @functools.cached_property
    def _process_globs(self) -> re.Pattern[str] | None:
        return _any_of(self.ignore_processes)

    @functools.cached_property
    def health_key(self) -> tuple[object, ...]:
        """The thresholds and switches ``gpu-unhealthy`` judges a card's health by: two rules
        with the same key find the same faults."""
        return (
            self.ecc_uncorrected,
            self.retired_pages_pending,
            self.remap_pending,
            self.remap_failure,
            self.pcie_width_below_max,
            self.pcie_gen_below_max,
            self.hw_slowdown,
            self.power_brake,
        )

    @functools.cached_property
    def _device_globs(self) -> re.Pattern[str] | None:
        return _any_of(self.ignore_devices)

    def ignores_device(self, uuid: str) -> bool:
        """Whether a glob of ``ignore_devices`` matches the device UUID ``uuid``."""
        globs = self._device_globs
        return globs is not None and globs.match(uuid) is not None

    @functools.cached_property
    def _container_globs(self) -> re.Pattern[str] | None:
        return _any_of(self.ignore_containers)

    def ignores_process(self, name: str) -> bool:
        """Whether a glob of ``ignore_processes`` matches the process name ``name``."""
        globs = self._process_globs
        return globs is not None and globs.match(name) is not None

    def ignores_container(self, name: str) -> bool:
        """Whether a glob of ``ignore_containers`` matches the container name ``name``."""
        globs = self._container_globs
        return globs is not None and globs.match(name) is not None


def _any_of(globs: tuple[str, ...]) -> re.Pattern[str] | None:
    """One pattern matching what any of ``globs`` matches (``fnmatchcase`` rules), or None."""
    if not globs:
        return None
    return re.compile("|".join(f"(?:{fnmatch.translate(glob)})" for glob in globs))


@dataclass(frozen=True)
class Match:
    """Globs on node, namespace, job and MIG profile; an absent key matches anything."""

    node: str | None = None
    namespace: str | None = None
    job: str | None = None
    profile: str | None = None
    """A MIG instance's profile (``1g.*``): it never matches a whole GPU."""

    @property
    def specificity(self) -> int:
        """How many keys this match sets."""
        return sum(v is not None for v in (self.node, self.namespace, self.job, self.profile))

    def matches(
        self, node: str, namespace: str | None, job: str | None, profile: str | None = None
    ) -> bool:
        """Whether every glob set here matches; a glob never matches an unknown value."""
        pairs = (
            (self.node, node),
            (self.namespace, namespace),
            (self.job, job),
            (self.profile, profile),
        )
        return all(
            glob is None or (value is not None and fnmatch.fnmatchcase(value, glob))
            for glob, value in pairs
        )


@dataclass(frozen=True)
class Override:
    """Rule changes that apply where ``match`` matches."""

    match: Match
    findings: Mapping[Code, Mapping[str, Any]]
    line: int = 0
    """Where the override starts in its file (0: not from a file)."""


@dataclass(frozen=True)
class Policy:
    """A loaded, validated policy."""

    rules: Mapping[Code, Rule]
    exit_on: Level = Level.BAD
    overrides: tuple[Override, ...] = ()
    source: str = "<built-in>"
    notes: NoteRules = field(default_factory=NoteRules)
    """The rules of ``report --notes`` (the policy's ``notes``)."""
    actions: tuple[ActionRule, ...] = ()
    """The policy's ``actions``, in file order (``model/actions.py``); none: the fleet plans
    nothing."""
    acting: ActingRules = field(default_factory=ActingRules)
    """The policy's ``acting`` block: the overall rate limit and exclusions."""
    _resolved: dict[tuple[Code, str, str | None, str | None, str | None], Rule] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )
    """The rules already worked out: a tick asks for the same few scopes again and again."""

    def rule(
        self,
        code: Code,
        node: str,
        namespace: str | None = None,
        job: str | None = None,
        profile: str | None = None,
    ) -> Rule:
        """The rule for ``code`` where a finding is about ``node``, ``namespace`` and ``job``,
        on a MIG instance of ``profile`` (``None``: a whole GPU, or no GPU)."""
        key = (code, node, namespace, job, profile)
        rule = self._resolved.get(key)
        if rule is None:
            if len(self._resolved) >= 4096:
                self._resolved.clear()
            rule = self._resolved[key] = self._resolve(*key)
        return rule

    def _resolve(
        self, code: Code, node: str, namespace: str | None, job: str | None, profile: str | None
    ) -> Rule:
        rule = self.rules[code]
        ordered = sorted(enumerate(self.overrides), key=lambda p: (p[1].match.specificity, p[0]))
        for _, override in ordered:
            changes = override.findings.get(code)
            if changes and override.match.matches(node, namespace, job, profile):
                rule = rule.with_changes(changes)
        return rule
