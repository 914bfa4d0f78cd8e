"""Secret values taken out of a machine's output before it is served (``souq machine logs``).

Pure. Output is read in chunks from byte offsets, so a value may be cut at the end of a chunk:
:func:`redact` holds back the end of a chunk that could be the start of a value (the next read
starts there), unless the output is finished. Values shorter than :data:`MIN_REDACTED`
characters are not redacted: they would hide ordinary output (and are no secret worth the name).
"""

from __future__ import annotations

from collections.abc import Iterable

__all__ = ["MARK", "MIN_REDACTED", "redact"]

MARK = "[redacted]"
MIN_REDACTED = 4


def redact(text: str, values: Iterable[str], *, final: bool = False) -> tuple[str, int]:
    """``text`` with every value replaced by :data:`MARK`, and how many characters at its end
    were held back (not in the answer: a value may start there; none when ``final``)."""
    secrets = sorted({v for v in values if len(v) >= MIN_REDACTED}, key=len, reverse=True)
    if not secrets:
        return text, 0
    held = 0 if final else _held_back(text, secrets)
    kept = text[: len(text) - held]
    for value in secrets:  # longest first: a value inside another goes with it
        kept = kept.replace(value, MARK)
    return kept, held


def _held_back(text: str, secrets: list[str]) -> int:
    """The longest end of ``text`` that is the start of a value, unfinished."""
    longest = 0
    for value in secrets:
        for n in range(min(len(value) - 1, len(text)), longest, -1):
            if text.endswith(value[:n]):
                longest = n
                break
    return longest
