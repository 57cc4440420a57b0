"""What ``report --by owner`` does after the bill: the notes (``--notes``), a page per owner
(``--split DIR``) and a mail of each page (``--mail``, a dry run unless ``--mail-send``).

The notes need more of Prometheus than the bill (``core/report_note_queries.py``: reservations,
held states, utilisation, tenants' memory, findings over the window), so they are asked only
with ``--notes``; their rules and thresholds are the policy's ``notes`` (``--policy``, else the
built-in one). The pages are the bill's, one owner each (``views/owner_pages.py``), and the
mails carry those very pages: what an owner is sent is what ``--split`` writes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TextIO

from gpuledger.collectors.prometheus import PrometheusClient, PrometheusSettings
from gpuledger.commands.options import MailRequest, OwnerOutputs
from gpuledger.core.report_note_queries import job_measures, note_queries
from gpuledger.core.report_notes import JobStats, notes_for
from gpuledger.errors import ExitCode, SourceError, SourceName
from gpuledger.model.addresses import OwnerMap
from gpuledger.model.report_values import Bill, Report, Sample
from gpuledger.policy.note_rules import NoteRules
from gpuledger.views.owner_pages import render_owner_html, render_owner_markdown, write_split
from gpuledger.views.table import printable


def note_rules(policy: Path | None) -> NoteRules:
    """The ``notes`` of ``--policy`` (``PolicyError`` naming its lines), else the built-in."""
    from gpuledger.policy.load import default_policy, load_policy  # noqa: PLC0415

    return (load_policy(policy, "--policy") if policy is not None else default_policy()).notes


def ask_notes(
    settings: PrometheusSettings, report: Report, rules: NoteRules
) -> dict[str, list[Sample]]:
    """The note queries' answers by name; ``SourceError`` naming the query Prometheus failed
    (no note is made of the answers that came before it)."""
    client = PrometheusClient(settings)
    answers: dict[str, list[Sample]] = {}
    try:
        for name, query in note_queries(report.window, rules).items():
            try:
                answers[name] = client.query(query, report.window.until)
            except SourceError as exc:
                raise SourceError(
                    SourceName.PROMETHEUS, f"--notes, the {name!r} query: {exc.message}", exc.hint
                ) from None
    finally:
        client.close()
    return answers


def with_notes(report: Report, answers: Mapping[str, Sequence[Sample]], rules: NoteRules) -> Report:
    """The report with each job's notes. The idle share is the bill's (the same counters); a
    job no answer mentions gets only the idle note, if its share calls for one."""
    bill = report.bill
    if bill is None:
        return report
    measures = job_measures(answers, report.window)
    owners = []
    for owner in bill.owners:
        jobs = []
        for job in owner.jobs:
            stats = JobStats(
                reserved_hours=job.hours.reserved,
                idle_share=job.hours.idle_share,
                measured=measures.get((job.namespace, job.job)),
            )
            jobs.append(replace(job, notes=notes_for(stats, rules)))
        owners.append(replace(owner, jobs=tuple(jobs)))
    return replace(report, bill=replace(bill, owners=tuple(owners)))


def owner_pages(report: Report) -> dict[str, tuple[str, str]]:
    """Each owner's (HTML, Markdown) page, by owner: what ``--split`` writes and ``--mail``
    sends."""
    bill = report.bill
    if bill is None:
        return {}
    return {
        o.owner: (render_owner_html(o, report), render_owner_markdown(o, report))
        for o in bill.owners
    }


def mail_pages(report: Report, request: MailRequest, owner_map: OwnerMap, out: TextIO) -> ExitCode:
    """A mail per owner (the owner map's address first, else the ``owner_email`` meta where the
    map trusts it), sent or, in a dry run, said; ``FAILED`` when a mail was not delivered."""
    from gpuledger.commands.report_mail import plan_mails, send_mails  # noqa: PLC0415

    bill: Bill | None = report.bill
    if bill is None:
        return ExitCode.OK
    plan = plan_mails(bill.owners, owner_pages(report), owner_map, request.sender, request.subject)
    for skipped in plan.skipped:
        out.write(f"no mail to {printable(skipped.owner)}: {printable(skipped.why)}\n")
    result = send_mails(plan.mails, request.settings, send=request.send, out=out)
    return ExitCode.OK if result.ok else ExitCode.FAILED


def load_owner_map(request: MailRequest | None) -> OwnerMap:
    """``--owner-map``'s owners and addresses (``ConfigError`` naming its problem), or none."""
    if request is None or request.owner_map is None:
        return OwnerMap()
    from gpuledger.policy.owner_map import load_owner_map as load  # noqa: PLC0415

    return load(request.owner_map)


def owner_outputs(
    report: Report, asked: OwnerOutputs, owner_map: OwnerMap, out: TextIO
) -> ExitCode:
    """``--split`` and ``--mail`` of a report whose notes (if asked) are in."""
    if asked.split is not None:
        write_split(owner_pages(report), asked.split, out)
    if asked.mail is not None:
        return mail_pages(report, asked.mail, owner_map, out)
    return ExitCode.OK
