"""Durations as Fly's Machines API writes them: Go's ``time.Duration`` text (``"5s"``,
``"1m30s"``, ``"1.5s"``, ``"500ms"``, ``"0s"``), read into seconds and written back the way Go
prints them. Souq also takes a plain number of seconds (a JSON number, or ``"15"``); Fly's own
server would read a bare JSON number as nanoseconds, but Fly's client never sends one."""

from __future__ import annotations

import math
import re
from typing import Any

__all__ = ["format_go_duration", "parse_go_duration", "seconds_of", "set_timeout_s"]

_UNITS_S = {
    "ns": 1e-9,
    "us": 1e-6,
    "µs": 1e-6,
    "μs": 1e-6,
    "ms": 1e-3,
    "s": 1.0,
    "m": 60.0,
    "h": 3600.0,
}
_TERM = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|μs|ms|s|m|h)")
_PLAIN = re.compile(r"^\d+(?:\.\d+)?$")


def parse_go_duration(text: str) -> float:
    """Go's duration syntax (``[+-]`` then one or more number-unit terms, or ``"0"``), in
    seconds. A negative duration is an error here: no Souq duration may be one."""
    raw = text.strip()
    body = raw[1:] if raw[:1] in "+-" else raw
    if raw.startswith("-") and body not in ("0", ""):
        raise ValueError(f"{text!r}: a duration must not be negative")
    if body == "0":
        return 0.0
    pos, seconds = 0, 0.0
    while pos < len(body):
        match = _TERM.match(body, pos)
        if match is None:
            raise ValueError(
                f"{text!r} is not a duration (use e.g. '15s', '500ms', '1m30s' or a number of "
                "seconds)"
            )
        seconds += float(match.group(1)) * _UNITS_S[match.group(2)]
        pos = match.end()
    if pos == 0:
        raise ValueError(f"{text!r} is not a duration (use e.g. '15s' or '500ms')")
    return seconds


def seconds_of(value: Any, *, key: str = "") -> float:
    """A duration given as a number of seconds, a plain number in a string, or Go's text; the
    refusal names ``key`` when given (a before-validator's field, which pydantic cannot)."""
    try:
        return _seconds_of(value)
    except ValueError as exc:
        raise ValueError(f"{key}: {exc}" if key else str(exc)) from None


def set_timeout_s(data: dict[str, Any], seconds: float | None, *, where: str = "") -> None:
    """Fly's ``timeout`` (``seconds``, None: not given) as ``data``'s ``timeout_s``: a
    ValueError (naming ``where``) when ``data`` gives a ``timeout_s`` that disagrees."""
    if seconds is None:
        return
    if data.get("timeout_s") not in (None, seconds):
        raise ValueError(f"{where}timeout and timeout_s disagree; give one")
    data["timeout_s"] = seconds


def _seconds_of(value: Any) -> float:
    if isinstance(value, bool):
        raise ValueError("a duration is a number of seconds or a string such as '15s'")
    if isinstance(value, int | float):
        if not math.isfinite(value) or value < 0:
            raise ValueError(f"{value!r} is not a duration")
        return float(value)
    if not isinstance(value, str):
        raise ValueError("a duration is a number of seconds or a string such as '15s'")
    if _PLAIN.match(value.strip()):
        return float(value)
    return parse_go_duration(value)


def format_go_duration(seconds: float) -> str:
    """``seconds`` as Go prints a ``time.Duration``: ``"0s"``, ``"500ms"``, ``"1.5s"``,
    ``"1m30s"``, ``"2h0m0s"`` (to the nanosecond)."""
    ns = round(seconds * 1e9)
    if ns == 0:
        return "0s"
    sign = "-" if ns < 0 else ""
    ns = abs(ns)
    if ns < 1_000_000_000:  # below a second: the largest unit that keeps it >= 1
        for unit, size in (("ms", 1_000_000), ("µs", 1_000), ("ns", 1)):
            if ns >= size:
                return sign + _decimal(ns, size) + unit
    hours, rest = divmod(ns, 3_600_000_000_000)
    minutes, rest = divmod(rest, 60_000_000_000)
    text = _decimal(rest, 1_000_000_000) + "s"
    if hours or minutes:
        text = f"{minutes}m" + text
    if hours:
        text = f"{hours}h" + text
    return sign + text


def _decimal(value: int, unit: int) -> str:
    """``value / unit`` with no trailing zeros (Go's way)."""
    whole, frac = divmod(value, unit)
    if not frac:
        return str(whole)
    digits = len(str(unit)) - 1
    return f"{whole}.{str(frac).rjust(digits, '0').rstrip('0')}"
