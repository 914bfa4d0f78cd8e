from __future__ import annotations

import asyncio

import pytest

from souq.bus import MemoryTransport, error_reply, ok_reply, subject_matches, subjects, unwrap
from souq.errors import NotFound, Unavailable


@pytest.mark.parametrize(
    ("pattern", "subject", "match"),
    [
        ("souq.hb.>", "souq.hb.mad.w1", True),
        ("souq.hb.>", "souq.hb", False),
        ("souq.worker.*.claim", "souq.worker.w1.claim", True),
        ("souq.worker.*.claim", "souq.worker.w1.get", False),
        ("souq.worker.w1.*", "souq.worker.w1.claim.x", False),
    ],
)
def test_subject_wildcards(pattern: str, subject: str, match: bool) -> None:
    assert subject_matches(pattern, subject) is match


def test_subjects_refuse_tokens_that_would_break_routing() -> None:
    assert subjects.offers("mad") == "souq.offers.mad"
    with pytest.raises(ValueError):
        subjects.offers("mad.syd")
    with pytest.raises(ValueError):
        subjects.worker("*", "claim")


def test_reply_envelope_carries_typed_errors() -> None:
    assert unwrap(ok_reply({"a": 1})) == {"a": 1}
    with pytest.raises(NotFound, match="machine x"):
        unwrap(error_reply(NotFound("machine x is not here")))


def test_memory_gather_stops_at_expected_count() -> None:
    async def main() -> None:
        bus = MemoryTransport()
        release = asyncio.Event()

        async def fast(subject: str, data: bytes) -> bytes:
            return b"fast"

        async def slow(subject: str, data: bytes) -> bytes:
            await release.wait()
            return b"slow"

        await bus.subscribe("souq.offers.mad", fast)
        await bus.subscribe("souq.offers.mad", fast)
        await bus.subscribe("souq.offers.mad", slow)
        assert await bus.gather("souq.offers.mad", b"", expect=2, timeout=5) == [b"fast", b"fast"]
        # Without an expected count, the slow worker is cut off by the deadline.
        assert sorted(await bus.gather("souq.offers.mad", b"", expect=None, timeout=0.05)) == [
            b"fast",
            b"fast",
        ]
        with pytest.raises(Unavailable):
            await bus.request("souq.worker.nobody.get", b"", timeout=1)
        release.set()
        await bus.close()

    asyncio.run(main())
