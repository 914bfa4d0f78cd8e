"""`souq regions`: each region's room and its spot price with its recent history."""

from __future__ import annotations

import pytest

from souq.client import render_regions
from souq.model import Resources
from souq.model.prices import SpotPrice
from souq.view.regions import RegionSummary


def figure(price: float, at_ms: int) -> SpotPrice:
    return SpotPrice(
        region="mad", price=price, used=0.5, cpu_used=0.5, memory_used=0.1, at_ms=at_ms
    )


def test_a_sparkline_spans_the_lowest_to_the_highest() -> None:
    assert render_regions.sparkline([]) == ""
    assert render_regions.sparkline([0.01, 0.01]) == "▁▁"
    assert render_regions.sparkline([0, 1, 2, 7]) == "▁▂▃█"


def test_the_table_shows_the_price_its_used_fraction_and_its_trail(
    capsys: pytest.CaptureFixture[str],
) -> None:
    region = RegionSummary(
        name="mad",
        workers=2,
        workers_up=2,
        workers_cordoned=0,
        workers_down=0,
        capacity=Resources(cpus=8, memory_mb=8192),
        allocated=Resources(cpus=6, memory_mb=384),
        machines=6,
        fits=2,
        spot_price=0.055,
        spot_price_used=0.75,
        spot_price_source="published",
        spot_price_history=[figure(0.01, 1), figure(0.02, 2), figure(0.08, 3)],
    )
    unpriced = region.model_copy(
        update={"name": "syd", "spot_price": None, "spot_price_history": []}
    )
    render_regions.regions([region, unpriced])
    lines = capsys.readouterr().out.splitlines()
    assert "SPOT PRICE" in lines[0]
    [mad] = [line for line in lines if line.startswith("mad")]
    assert "6/8" in mad and "0.055 (75% used)" in mad and mad.rstrip().endswith("▁▂█")
    [syd] = [line for line in lines if line.startswith("syd")]
    assert " - " in syd
