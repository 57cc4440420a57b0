"""The owner map (``--owner-map FILE``): owner to one address each, every bad address a
FILE:LINE:COLUMN problem, all at once; the rule ``owner_email`` meta values are checked by."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuledger.errors import ConfigError
from gpuledger.policy.owner_map import address_problem, load_owner_map


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "owners.yaml"
    path.write_text(text, encoding="utf-8")
    return path


def _problems(tmp_path: Path, text: str) -> list[str]:
    path = _write(tmp_path, text)
    with pytest.raises(ConfigError) as caught:
        load_owner_map(path)
    lines = str(caught.value).splitlines()
    assert all(line.startswith(f"{path}:") for line in lines), lines
    return [line.removeprefix(f"{path}:") for line in lines]


def test_owners_map_to_addresses_with_display_names_kept_and_quoted(tmp_path: Path) -> None:
    owners = load_owner_map(
        _write(
            tmp_path,
            "owners:\n"
            "  alice: alice@example.org\n"
            "  ml-team: ML team <ml@lab.example.org>\n"
            "  bob: 'Bob J. Smith <bob.smith+gpu@example.org>'\n"
            "  zoë: Zoë <zoe@example.org>\n",
        )
    )
    assert owners.owner_email_namespaces == ()  # trusting no job's owner_email by default
    assert dict(owners.owners) == {
        "alice": "alice@example.org",
        "ml-team": "ML team <ml@lab.example.org>",
        "bob": '"Bob J. Smith" <bob.smith+gpu@example.org>',  # '.' is special in a phrase
        "zoë": "Zoë <zoe@example.org>",
    }


def test_every_bad_address_is_reported_at_its_line_at_once(tmp_path: Path) -> None:
    problems = _problems(
        tmp_path,
        "owners:\n"
        "  a: alice@localhost\n"
        "  b: b@@example.org\n"
        '  c: "c@example.org\\r\\nBcc: all@example.org"\n'
        "  d: c@example.org, d@example.org\n"
        "  e: e x@example.org\n"
        "  f: 7\n"
        "  g: Eve <e@example.org\n"
        "  h: jürgen@example.org\n"
        "  i: i@bücher.example\n"
        "  j: .j@example.org\n"
        "  k: ''\n",
    )
    not_an = "is not an e-mail address:"
    assert problems == [
        f"2:6: owners.a: 'alice@localhost' {not_an} the domain 'localhost' is not a domain "
        "with a dot, such as example.org",
        f"3:6: owners.b: 'b@@example.org' {not_an} an address holds exactly one '@', this one 2",
        "4:6: owners.c: 'c@example.org\\r\\nBcc: all@example.org' holds a control character "
        "(a line break would be a header)",
        "5:6: owners.d: 'c@example.org, d@example.org': one address only (',' or ';' would "
        "make several); use a list",
        f"6:6: owners.e: 'e x@example.org' {not_an} an address holds no blank",
        "7:6: owners.f: 7 is not an e-mail address such as alice@example.org or "
        "'Alice <alice@example.org>'",
        "8:6: owners.g: 'Eve <e@example.org': write one address, or a display name and the "
        "address in <>: Alice <a@x.org>",
        f"9:6: owners.h: 'jürgen@example.org' {not_an} a mailbox name beyond ASCII needs "
        "SMTPUTF8, which gpuledger does not send",
        f"10:6: owners.i: 'i@bücher.example' {not_an} write the domain 'bücher.example' in its "
        "ASCII (xn--) form",
        f"11:6: owners.j: '.j@example.org' {not_an} the part before '@' ('.j') is not a "
        "mailbox name",
        f"12:6: owners.k: '' {not_an} it is empty",
    ]


def test_the_file_shape_is_checked(tmp_path: Path) -> None:
    assert _problems(tmp_path, "alice: a@example.org\n") == [
        "1:1: alice: unknown key 'alice'; allowed: owner_email_namespaces, owners",
        "1:1: owners: missing (the top level needs owners)",
    ]
    assert _problems(tmp_path, "owners: [a@example.org]\n") == [
        "1:9: owners: must be a mapping of owner (or team) to an e-mail address, not a list"
    ]
    assert _problems(tmp_path, "owners:\n  '': a@example.org\n  a: x@example.org\n  a: y\n") == [
        "2:3: owners.: '' names no owner: no owner is blank or has a control character",
        "4:3: owners.a: duplicate key 'a': YAML would keep only the last one; keep one",
    ]
    assert _problems(tmp_path, "") == ["1:1: the owner map is empty: it needs 'owners'"]


def test_the_namespaces_trusted_for_owner_email_are_namespace_globs(tmp_path: Path) -> None:
    trusting = load_owner_map(
        _write(tmp_path, "owners: {}\nowner_email_namespaces: [research, ml-*]\n")
    )
    assert [trusting.trusts(ns) for ns in ("research", "ml-vision", "ml", "sandbox")] == [
        True, True, False, False]  # fmt: skip
    assert _problems(tmp_path, "owners: {}\nowner_email_namespaces: [ml_team, '', 7]\n") == [
        "2:26: owner_email_namespaces[0]: 'ml_team' cannot match any Nomad namespace: '_' is "
        "not allowed (letters, digits and '-' only)",
        "2:35: owner_email_namespaces[1]: '' should be non-empty",
        "2:39: owner_email_namespaces[2]: 7 is not a string",
    ]
    assert _problems(tmp_path, "owners: {a: [}\n")[0].startswith("1:")


def test_an_unreadable_owner_map_names_itself(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"nothere\.yaml': cannot read the owner map: No such"):
        load_owner_map(tmp_path / "nothere.yaml")


@pytest.mark.parametrize(
    "hostile",
    [
        "a@example.org\nBcc: b@example.org",
        "a@example.org\rX: y",
        "a@example.org\x00",
        "Eve <a@example.org>, b@example.org",
        "a@example.org; b@example.org",
        '"a@example.org" <b@example.org>',
        "<>",
        "Eve <>",
        "@example.org",
        "a@",
        "a@example..org",
    ],
)
def test_a_meta_address_that_could_inject_or_fan_out_is_refused(hostile: str) -> None:
    assert address_problem(hostile) is not None
