"""Running sums of a quota's ledger (:mod:`souq.model.quota`), so that a change is checked
without adding up every machine the scope holds, and the ledger's held machines are written
without encoding each of them again. Pure.

A record's sums are kept beside it (a private attribute) with the very dicts they were made of:
a record whose ``pending``, ``held`` or ``volumes`` is another dict than its sums' is summed
again, so a sum is never stale, whatever made the record. The functions that change a ledger
(``reserved``, ``held``, ``released``) hand the new record sums moved by what they changed.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Protocol

__all__ = [
    "Held",
    "Part",
    "Pending",
    "Sums",
    "Vec",
    "held_part",
    "moved",
    "pending_part",
    "summed",
    "volume_part",
]

Held = tuple[float, int, str]  # a machine's (cpus, memory_mb, priority class): compact on purpose


class Use(Protocol):
    """What a share of use counts (:class:`souq.model.quota.QuotaUse` is one)."""

    @property
    def cpus(self) -> float: ...
    @property
    def memory_mb(self) -> int: ...
    @property
    def machines(self) -> int: ...
    @property
    def volume_gb(self) -> int: ...


class Pending(Protocol):
    """A change under way, as the sums see it (:class:`souq.model.quota.QuotaEntry` is one)."""

    @property
    def use(self) -> Use: ...
    @property
    def class_use(self) -> Use | None: ...
    @property
    def priority_class(self) -> str: ...


Vec = tuple[int, int, int, int]  # millicpus (exact sums), memory_mb, machines, volume_gb
Part = tuple[str, Vec, Vec]  # (class, what it counts on the all-classes line, in its class)
_ZERO: Vec = (0, 0, 0, 0)
_STANDARD = "standard"


@dataclass(frozen=True)
class Sums:
    sources: tuple[object, object, object]  # the pending, held and volumes dicts summed
    total: Vec
    by_class: Mapping[str, Vec]

    def made_of(self, pending: object, held: object, volumes: object) -> bool:
        a, b, c = self.sources
        return a is pending and b is held and c is volumes


def pending_part(entry: Pending) -> Part:
    use = entry.use
    total: Vec = (_milli(use.cpus), use.memory_mb, use.machines, use.volume_gb)
    in_class = use if entry.class_use is None else entry.class_use
    return (
        entry.priority_class or _STANDARD,
        total,
        (_milli(in_class.cpus), in_class.memory_mb, in_class.machines, 0),
    )


def held_part(size: Held) -> Part:
    vec: Vec = (_milli(size[0]), size[1], 1, 0)
    return (size[2] or _STANDARD, vec, vec)


def volume_part(size_gb: int) -> Part:
    return ("", (0, 0, 0, size_gb), _ZERO)


def _milli(cpus: float) -> int:
    return round(cpus * 1000)


def _add(a: Vec, b: Vec, sign: int) -> Vec:
    return (a[0] + sign * b[0], a[1] + sign * b[1], a[2] + sign * b[2], a[3] + sign * b[3])


def summed(
    pending: Mapping[str, Pending], held: Mapping[str, Held], volumes: Mapping[str, int]
) -> Sums:
    parts = [pending_part(e) for e in pending.values()]
    parts += [held_part(h) for h in held.values()]
    parts += [volume_part(s) for s in volumes.values()]
    return moved(Sums((pending, held, volumes), _ZERO, {}), (pending, held, volumes), parts, [])


def moved(
    base: Sums,
    sources: tuple[object, object, object],
    plus: Iterable[Part],
    minus: Iterable[Part],
) -> Sums:
    """``base`` with ``plus`` added and ``minus`` taken off, as the sums of ``sources``."""
    total = base.total
    by_class = dict(base.by_class)
    for sign, parts in ((1, plus), (-1, minus)):
        for klass, vec, in_class in parts:
            total = _add(total, vec, sign)
            if klass:
                by_class[klass] = _add(by_class.get(klass, _ZERO), in_class, sign)
    return Sums(sources, total, by_class)
