"""Quotations of what users and sources gave: one line, and never hiding what is there."""

from __future__ import annotations

from gpuledger.model.text import excerpt


def test_a_final_newline_is_shown_not_cut() -> None:
    # `--set node.job=$'gpuledger\n'` was refused as "'gpuledger' is not a job name".
    assert excerpt("gpuledger\n") == "'gpuledger\\n'"


def test_a_quotation_of_many_lines_is_one_line_and_says_how_long_it_was() -> None:
    quoted = excerpt("a\n" * 100, limit=10)
    assert "\n" not in quoted
    assert quoted == "'a\\na\\na\\na\\na\\n'… (200 characters)"
    assert excerpt("short") == "'short'"
    assert excerpt("unquoted\nsecond", quoted=False) == "unquoted… (15 characters)"
