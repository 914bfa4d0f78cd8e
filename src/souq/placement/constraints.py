"""Evaluating a machine's constraints against a worker's offer.

The attribute is read from the offer (``label.<key>``, ``fingerprint.<field>``, ``worker.id``,
``region``); a missing attribute satisfies only ``!=`` and ``not_in`` (a worker without a ``disk``
label is not ``label.disk = ssd``, and it is ``label.disk != hdd``). Values compare as text,
numbers written the short way (``4`` not ``4.0``); ``<``, ``<=``, ``>``, ``>=`` compare as numbers
and fail on an attribute that is not one. The model (:mod:`souq.model.constraint`) has already
checked that each constraint is well formed.
"""

from __future__ import annotations

import operator
import re
from collections.abc import Callable
from functools import lru_cache

from souq.model.constraint import Constraint
from souq.model.constraint import ConstraintOperator as Op
from souq.model.protocol import Offer

__all__ = ["attribute_of", "unmet"]

Value = str | float


def attribute_of(offer: Offer, attribute: str) -> Value | None:
    """The worker's value of ``attribute``, or None when it has none."""
    worker = offer.worker
    if attribute == "region":
        return worker.region
    if attribute == "worker.id":
        return worker.id
    kind, _, key = attribute.partition(".")
    if kind == "label":
        return worker.labels.get(key)
    if kind == "fingerprint" and worker.fingerprint is not None:
        value = getattr(worker.fingerprint, key, None)
        if isinstance(value, bool) or not isinstance(value, str | int | float):
            return None
        return value if isinstance(value, str) else float(value)
    return None


def unmet(constraint: Constraint, offer: Offer) -> str | None:
    """None when the worker meets ``constraint``; otherwise what it has instead, in words."""
    have = attribute_of(offer, constraint.attribute)
    if _holds(constraint, have):
        return None
    if have is None:
        return f"the worker has no {constraint.attribute}"
    return f"the worker has {constraint.attribute} = {_text(have)}"


def _holds(c: Constraint, have: Value | None) -> bool:
    op, want = c.operator, c.value
    if have is None:
        return op in (Op.NE, Op.NOT_IN)
    if op in (Op.EQ, Op.NE):
        return _equal(have, want) == (op is Op.EQ)
    if op in (Op.IN, Op.NOT_IN):
        inside = isinstance(want, list) and _text(have) in want
        return inside == (op is Op.IN)
    if op is Op.REGEXP:
        return isinstance(want, str) and _pattern(want).search(_text(have)) is not None
    number = _number(have)
    return number is not None and isinstance(want, float | int) and _COMPARE[op](number, want)


_COMPARE: dict[Op, Callable[[float, float], bool]] = {
    Op.LT: operator.lt,
    Op.LE: operator.le,
    Op.GT: operator.gt,
    Op.GE: operator.ge,
}


def _equal(have: Value, want: str | float | list[str]) -> bool:
    if isinstance(want, list):
        return False
    if isinstance(want, float | int):
        number = _number(have)
        return number is not None and number == want
    return _text(have) == want


def _text(value: Value) -> str:
    return f"{value:g}" if isinstance(value, float) else value


def _number(value: Value) -> float | None:
    if isinstance(value, float):
        return value
    try:
        return float(value)
    except ValueError:
        return None


@lru_cache(maxsize=256)
def _pattern(text: str) -> re.Pattern[str]:
    return re.compile(text)
