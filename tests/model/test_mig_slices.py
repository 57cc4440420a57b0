"""A MIG instance's share, against NVIDIA's MIG User Guide ("Supported MIG Profiles": the
"Fraction of SMs" column) and the prices applied to it."""

from __future__ import annotations

from decimal import Decimal
from fractions import Fraction

import pytest

from gpuledger.model.mig_slices import card_slices, mig_share, profile_slices
from gpuledger.model.prices import ModelPrice, Prices


@pytest.mark.parametrize(
    ("model", "profile", "share"),
    [
        # The guide's A100 table: 1g.10gb, 2g.20gb, 3g.40gb, 4g.40gb, 7g.80gb on an 80 GB card.
        ("NVIDIA A100-SXM4-80GB", "1g.10gb", Fraction(1, 7)),
        ("NVIDIA A100-SXM4-80GB", "1g.10gb+me", Fraction(1, 7)),
        ("NVIDIA A100-SXM4-80GB", "1g.20gb", Fraction(1, 7)),
        ("NVIDIA A100-PCIE-40GB", "3g.20gb", Fraction(3, 7)),
        ("NVIDIA A100-SXM4-80GB", "4g.40gb", Fraction(4, 7)),
        ("NVIDIA A100-SXM4-80GB", "7g.80gb", Fraction(1)),
        # A30: four slices; 4g.24gb is the whole card ("Full").
        ("NVIDIA A30", "1g.6gb", Fraction(1, 4)),
        ("NVIDIA A30", "2g.12gb+me", Fraction(2, 4)),
        ("NVIDIA A30", "4g.24gb", Fraction(1)),
        ("NVIDIA H100 80GB HBM3", "MIG 1g.10gb", Fraction(1, 7)),
        ("NVIDIA H200", "3g.71gb", Fraction(3, 7)),
        ("NVIDIA GH200 480GB", "2g.24gb", Fraction(2, 7)),
        # A compute instance of a GPU instance: its own compute slices (the guide's
        # "1c.3g.20gb" is one of the 3g instance's three), so three of them cost the 3g.
        ("NVIDIA A100-SXM4-40GB", "1c.3g.20gb", Fraction(1, 7)),
        ("NVIDIA A100-SXM4-40GB", "2c.3g.20gb", Fraction(2, 7)),
        ("NVIDIA H100 80GB HBM3", "MIG 1c.4g.40gb", Fraction(1, 7)),
        ("NVIDIA A100-SXM4-40GB", "", Fraction(1)),
    ],
)
def test_share_is_the_guides_fraction_of_sms(model: str, profile: str, share: Fraction) -> None:
    assert mig_share(model, profile) == share


@pytest.mark.parametrize(
    ("model", "profile"),
    [
        ("Tesla T4", "1g.5gb"),  # not a MIG card: no share is guessed
        ("NVIDIA A30", "7g.80gb"),  # more slices than the card has
        ("NVIDIA A100-SXM4-40GB", "a.b"),  # not a profile name
        ("NVIDIA A100-SXM4-40GB", "0g.5gb"),
        ("NVIDIA A100-SXM4-40GB", "4c.3g.20gb"),  # more compute slices than its instance
    ],
)
def test_no_share_is_made_up(model: str, profile: str) -> None:
    assert mig_share(model, profile) is None


def test_h20_is_not_h200_and_both_have_seven() -> None:
    assert card_slices("NVIDIA H20") == 7
    assert card_slices("NVIDIA H200 NVL") == 7
    assert card_slices("NVIDIA RTX PRO 6000 Blackwell Server Edition") == 4
    assert card_slices("NVIDIA GeForce RTX 4090") is None
    assert profile_slices("2g.20gb") == 2


def test_first_matching_glob_wins_then_the_default() -> None:
    prices = Prices(
        currency="EUR",
        default=Decimal("1.00"),
        models=(
            ModelPrice("NVIDIA H100*", Decimal("4.00")),
            ModelPrice("NVIDIA *", Decimal("2.50")),
        ),
    )
    assert prices.card_price("NVIDIA H100 80GB HBM3") == Decimal("4.00")
    assert prices.card_price("NVIDIA A100-SXM4-80GB") == Decimal("2.50")
    assert prices.card_price("Tesla T4") == Decimal("1.00")
    assert prices.card_price("nvidia h100") == Decimal("1.00")  # names are case-sensitive
    # 1g.10gb on an H100: a seventh of 4.00, exactly (no decimal rounding before the bill).
    assert prices.hourly("NVIDIA H100 80GB HBM3", "1g.10gb") == Fraction(4, 7)
    assert prices.unmatched({"Tesla T4"}) == prices.models
    assert prices.unmatched({"NVIDIA H100 PCIe"}) == ()


def test_no_default_and_no_match_is_no_price() -> None:
    prices = Prices(currency="EUR", default=None, models=(ModelPrice("NVIDIA H100*", Decimal(4)),))
    assert prices.hourly("Tesla T4") is None
    assert prices.hourly("Tesla T4", "1g.5gb") is None
