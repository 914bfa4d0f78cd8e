"""Piecewise-linear utility curves: the shape behind best-fit by linear interpolation."""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Sequence
from dataclasses import dataclass

from souq.model.policy import check_curve_points

__all__ = ["DEFAULT_CURVE", "Curve"]


@dataclass(frozen=True)
class Curve:
    """Points ``(x, y)`` with x ascending in [0, 1]; ``value(x)`` interpolates linearly and holds
    the end values outside the points."""

    points: tuple[tuple[float, float], ...]

    def __post_init__(self) -> None:
        problem = check_curve_points(self.points)
        if problem is not None:
            raise ValueError(problem)

    @classmethod
    def of(cls, points: Sequence[Sequence[float]]) -> Curve:
        """A curve from ``[[x, y], ...]`` as written in a placement policy."""
        pairs = tuple((float(p[0]), float(p[1])) for p in points if len(p) == 2)
        if len(pairs) != len(points):
            raise ValueError("each curve point is a pair [x, y]")
        return cls(pairs)

    def value(self, x: float) -> float:
        pts = self.points
        if x <= pts[0][0]:
            return pts[0][1]
        if x >= pts[-1][0]:
            return pts[-1][1]
        i = bisect_right([p[0] for p in pts], x)
        (x0, y0), (x1, y1) = pts[i - 1], pts[i]
        return y0 + (y1 - y0) * (x - x0) / (x1 - x0)


# Utility rises while a worker fills towards a comfortable 75 %, then falls steeply: an empty
# worker (0.4) beats one that the placement would push past about 92 % (a little less for a
# large machine), yet workers fill before new ones are touched. Best-fit averages the CPU and
# memory curves, so the other resource near its peak can carry a worker past the knee in one:
# docs/placement.md, "Where the knee holds".
DEFAULT_CURVE = Curve(((0.0, 0.4), (0.75, 1.0), (0.9, 0.5), (1.0, 0.0)))
