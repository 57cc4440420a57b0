"""The prices file (``report --prices``): what it takes, read to the cent as written, and every
bad input a FILE:LINE:COLUMN problem, all of them at once, never a traceback."""

from __future__ import annotations

from decimal import Decimal
from pathlib import Path

import pytest

from gpuledger.errors import ConfigError, UsageError
from gpuledger.model.prices import ModelPrice
from gpuledger.policy.prices_load import load_prices


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "prices.yaml"
    path.write_text(text, encoding="utf-8")
    return path


def _problems(tmp_path: Path, text: str) -> list[str]:
    path = _write(tmp_path, text)
    with pytest.raises(ConfigError) as caught:
        load_prices(path)
    lines = str(caught.value).splitlines()
    assert all(line.startswith(f"{path}:") for line in lines), lines
    return [line.removeprefix(f"{path}:") for line in lines]


def test_the_issues_form_is_read_with_decimals_as_written_and_lines_of_entries(
    tmp_path: Path,
) -> None:
    path = _write(
        tmp_path,
        "currency: EUR\n"
        "default: 1.10\n"
        "models:\n"
        '  "NVIDIA H100*": 4.00\n'
        '  "NVIDIA A100-SXM4-?0GB": 2\n'
        "  Tesla T4: 0.350\n",
    )
    prices = load_prices(path)
    assert prices.currency == "EUR"
    assert prices.path == path
    # The text, not a float: Decimal(1.10) would be 1.100000000000000088817841970012523...
    assert str(prices.default) == "1.10"
    assert prices.models == (
        ModelPrice("NVIDIA H100*", Decimal("4.00"), 4),
        ModelPrice("NVIDIA A100-SXM4-?0GB", Decimal("2"), 5),
        ModelPrice("Tesla T4", Decimal("0.350"), 6),
    )
    assert [str(m.price) for m in prices.models] == ["4.00", "2", "0.350"]
    assert prices.card_price("NVIDIA H100 80GB HBM3") == Decimal("4.00")
    assert prices.card_price("NVIDIA A100-SXM4-40GB") == Decimal("2")
    assert prices.card_price("NVIDIA L4") == Decimal("1.10")


def test_a_default_alone_or_models_alone_is_enough(tmp_path: Path) -> None:
    assert load_prices(_write(tmp_path, "currency: USD\ndefault: 0\n")).models == ()
    only = load_prices(_write(tmp_path, "currency: USD\nmodels: {'Tesla T4': 0.5}\n"))
    assert only.default is None
    assert only.card_price("NVIDIA H100 80GB HBM3") is None


def test_every_bad_price_is_reported_at_its_line_at_once(tmp_path: Path) -> None:
    problems = _problems(
        tmp_path,
        "currency: EUR\n"
        'default: "4,00"\n'
        "models:\n"
        "  NVIDIA A: 4,00\n"
        "  NVIDIA B: -1\n"
        "  NVIDIA C: true\n"
        "  NVIDIA D: null\n"
        "  NVIDIA E: .nan\n"
        "  NVIDIA F: .inf\n"
        "  NVIDIA G: 1.1234567\n"
        "  NVIDIA H: 010\n"
        "  NVIDIA I: 1_000.0\n"
        "  NVIDIA J: 1.0e+3\n"
        "  NVIDIA K: 1234567890123\n"
        "  NVIDIA L: [4]\n",
    )
    not_a_price = "is not a price per GPU-hour: a number such as 4.00, 0 or more, without quotes"
    assert problems == [
        f"2:10: default: '4,00' {not_a_price}",
        f"4:13: models.NVIDIA A: '4,00' {not_a_price}",
        f"5:13: models.NVIDIA B: -1 {not_a_price}",
        f"6:13: models.NVIDIA C: true {not_a_price}",
        f"7:13: models.NVIDIA D: null {not_a_price}",
        f"8:13: models.NVIDIA E: '.nan' {not_a_price}",
        f"9:13: models.NVIDIA F: '.inf' {not_a_price}",
        "10:13: models.NVIDIA G: '1.1234567' has 7 decimals: at most 6",
        "11:13: models.NVIDIA H: '010' is read by YAML as 8: write the price as plain digits "
        "with at most one '.', such as 4.00",
        "12:13: models.NVIDIA I: '1_000.0' is read by YAML as 1000.0: write the price as plain "
        "digits with at most one '.', such as 4.00",
        "13:13: models.NVIDIA J: '1.0e+3' is read by YAML as 1000.0: write the price as plain "
        "digits with at most one '.', such as 4.00",
        "14:13: models.NVIDIA K: '1234567890123' has 13 digits before the point: at most 12; "
        "is it in the currency's unit, per GPU-hour?",
        "15:13: models.NVIDIA L: must be a price per GPU-hour: a number such as 4.00, 0 or "
        "more, without quotes, not a list",
    ]


def test_keys_and_currency_are_checked(tmp_path: Path) -> None:
    problems = _problems(tmp_path, "default: 1\ncurency: EUR\n")
    assert problems == [
        "1:1: currency: missing (the top level needs currency)",
        "2:1: curency: unknown key 'curency'; allowed: currency, default, models; "
        "did you mean 'currency'?",
    ]
    code = "is not an ISO 4217 currency code of three capital letters, such as EUR or USD"
    for bad in ("eur", "EURO", "€", "1"):
        shown = f"{bad!r}" if bad != "1" else "1"
        assert _problems(tmp_path, f"default: 1\ncurrency: {bad}\n") == [
            f"2:11: currency: {shown} {code}"
        ]


def test_a_file_with_no_price_at_all_is_refused(tmp_path: Path) -> None:
    assert _problems(tmp_path, "currency: EUR\nmodels: {}\n") == [
        "1:1: (top level): gives no price: add a default, models, or both"
    ]


def test_globs_that_can_match_no_card_name_are_refused_at_their_key(tmp_path: Path) -> None:
    problems = _problems(
        tmp_path,
        "currency: EUR\n"
        "models:\n"
        '  "": 1\n'
        '  "  ": 1\n'
        '  " NVIDIA H100*": 1\n'
        '  "nvidia h100*": 1\n'
        '  "Nvidia*": 1\n'
        '  "Tesla [V*": 1\n'
        '  "NVIDIA\\tT4": 1\n'
        f'  "{"X" * 96}": 1\n',
    )
    assert problems == [
        "3:3: models.: an empty glob matches no card: write the card's name, such as "
        "'NVIDIA H100*'",
        "4:3: models.  : an empty glob matches no card: write the card's name, such as "
        "'NVIDIA H100*'",
        "5:3: models. NVIDIA H100*: ' NVIDIA H100*' has a blank at an end: the driver's names "
        "have none; remove it",
        "6:3: models.nvidia h100*: 'nvidia h100*' cannot match any card: the driver writes "
        "'NVIDIA' in capitals and globs are case-sensitive",
        "7:3: models.Nvidia*: 'Nvidia*' cannot match any card: the driver writes 'NVIDIA' in "
        "capitals and globs are case-sensitive",
        "8:3: models.Tesla [V*: 'Tesla [V*' has a '[' without its ']' (fnmatch would read it as "
        "a literal '['); write '[[]' for a literal '['",
        "9:3: models.NVIDIA\tT4: 'NVIDIA\\tT4' cannot match any card name: '\\t' is not allowed "
        "(printable characters only, as the driver names cards)",
        f"10:3: models.{'X' * 96}: '{'X' * 96}' cannot match any card name: it needs 96 "
        "characters, more than the 95 allowed",
    ]


def test_a_glob_hidden_by_an_earlier_prefix_glob_is_refused_and_the_other_order_is_not(
    tmp_path: Path,
) -> None:
    hidden = "currency: EUR\nmodels:\n  'NVIDIA*': 1\n  'NVIDIA H100*': 4\n  'Tesla*': 1\n"
    assert _problems(tmp_path, hidden) == [
        "4:3: models.NVIDIA H100*: never applies: the earlier 'NVIDIA*' matches every card it "
        "could (the first match wins); move this line above it"
    ]
    fine = "currency: EUR\nmodels:\n  'NVIDIA H100*': 4\n  'NVIDIA*': 1\n  'NVIDIA A?00*': 2\n"
    prices = load_prices(_write(tmp_path, fine.replace("  'NVIDIA A?00*': 2\n", "")))
    assert [m.glob for m in prices.models] == ["NVIDIA H100*", "NVIDIA*"]
    assert _problems(tmp_path, fine) == [
        "5:3: models.NVIDIA A?00*: never applies: the earlier 'NVIDIA*' matches every card it "
        "could (the first match wins); move this line above it"
    ]


def test_a_duplicate_glob_is_a_problem_at_the_second(tmp_path: Path) -> None:
    text = "currency: EUR\nmodels:\n  'Tesla T4': 1\n  'Tesla T4': 2\n"
    assert _problems(tmp_path, text) == [
        "4:3: models.Tesla T4: duplicate key 'Tesla T4': YAML would keep only the last one; "
        "keep one"
    ]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("currency: [EUR\n", ":2:1: not valid YAML: "),
        ("- a\n- b\n", ":1:1: (top level): must be a prices file"),
        ("just words\n", ":1:1: (top level): 'just words' is not a prices file"),
        ("", ":1:1: the prices file is empty"),
        ("currency: !x EUR\n", ":1:11: not valid YAML here: the tag '!x' is not supported"),
    ],
    ids=["not yaml", "a list", "a string", "empty", "a tag"],
)
def test_a_file_that_is_not_a_prices_mapping_is_one_usage_error(
    tmp_path: Path, text: str, expected: str
) -> None:
    path = _write(tmp_path, text)
    with pytest.raises(UsageError) as caught:
        load_prices(path)
    assert str(caught.value).startswith(f"{path}{expected}"), str(caught.value)


def test_an_unreadable_file_names_itself_and_why(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"missing\.yaml': cannot read the prices file: No such"):
        load_prices(tmp_path / "missing.yaml")
    binary = tmp_path / "b.yaml"
    binary.write_bytes(b"\xff\xfe\x00")
    with pytest.raises(ConfigError, match="cannot read the prices file"):
        load_prices(binary)


HOSTILE = {
    "yaml bomb": "currency: EUR\n"
    + 'a: &a ["x","x","x","x","x","x","x","x","x"]\n'
    + "".join(
        f"{n}: &{n} [{','.join([f'*{p}'] * 9)}]\n"
        for p, n in zip("abcdefgh", "bcdefghi", strict=True)
    ),
    "recursive alias": "currency: EUR\nmodels: &m {x: *m}\n",
    "python tag": "currency: !!python/object:os.system EUR\n",
    "lone surrogate glob": 'currency: EUR\nmodels: {"\\ud800": 1}\n',
    "one 2 MB line": "x" * 2_000_000 + "\n",
    "mapping as a glob": "currency: EUR\nmodels: {? {a: 1} : 2}\n",
}


@pytest.mark.parametrize("text", HOSTILE.values(), ids=HOSTILE.keys())
def test_hostile_prices_files_are_one_usage_error_naming_the_file(
    tmp_path: Path, text: str
) -> None:
    path = tmp_path / "prices.yaml"
    path.write_text(text, encoding="utf-8", errors="surrogatepass")
    with pytest.raises(UsageError) as caught:
        load_prices(path)
    assert str(caught.value).startswith(f"{path}:")
    assert len(str(caught.value)) < 2000
