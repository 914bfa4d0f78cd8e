from __future__ import annotations

import pytest

from souq.placement import DEFAULT_CURVE, Curve


def test_interpolates_between_points_and_holds_the_ends() -> None:
    curve = Curve(((0.0, 0.0), (0.5, 1.0), (1.0, 0.0)))
    assert curve.value(0.25) == pytest.approx(0.5)
    assert curve.value(0.75) == pytest.approx(0.5)
    assert curve.value(-1) == 0.0
    assert curve.value(2) == 0.0


def test_default_curve_prefers_comfortable_over_empty_over_hot() -> None:
    empty, comfortable, hot = (
        DEFAULT_CURVE.value(0.05),
        DEFAULT_CURVE.value(0.7),
        DEFAULT_CURVE.value(0.95),
    )
    assert comfortable > empty > hot


@pytest.mark.parametrize(
    "points",
    [((0.0, 0.0),), ((0.5, 0.0), (0.2, 1.0)), ((0.0, 0.0), (1.0, 1.5))],
)
def test_bad_curves_are_refused(points: tuple[tuple[float, float], ...]) -> None:
    with pytest.raises(ValueError):
        Curve(points)
