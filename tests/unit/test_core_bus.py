from __future__ import annotations

import asyncio
import json

import msgspec
import pytest

from souq.bus import MemoryTransport, error_reply, ok_reply, subject_matches, subjects, unwrap
from souq.bus.codec import Encoded, encode_many, unwrap_as, unwrap_with_ledger, with_members
from souq.errors import InvalidInput, NotFound, Unavailable
from souq.model import LocateReply


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


def test_reply_envelopes_are_the_bytes_peers_read() -> None:
    """The wire of docs/protocol.md: compact, ``ledger`` only when there is one, an encoded
    result embedded as it is, and ``result: null`` beside an error (as older peers wrote it)."""
    offer = LocateReply(worker_id="w1", found=True)
    assert ok_reply(offer) == b'{"ok":true,"result":{"worker_id":"w1","found":true}}'
    assert ok_reply(Encoded(b'{"x": [1,  2]}'), ledger=7) == (
        b'{"ok":true,"result":{"x": [1,  2]},"ledger":7}'
    )
    assert ok_reply([offer, {"a": None}]) == (
        b'{"ok":true,"result":[{"worker_id":"w1","found":true},{"a":null}]}'
    )
    failed = json.loads(error_reply(NotFound("gone")))
    assert failed["ok"] is False and failed["result"] is None
    assert failed["error"]["status"] == "not_found"
    # Read in one pass: the result decoded once as the caller's type, unknown keys dropped.
    newer = b'{"ok":true,"result":{"worker_id":"w1","found":false,"new":1},"ledger":3,"x":0}'
    assert unwrap_with_ledger(newer, LocateReply) == (LocateReply(worker_id="w1", found=False), 3)
    with pytest.raises(InvalidInput, match="malformed reply"):
        unwrap_as(b'{"ok":true,"result":{"worker_id":"w1"}}', LocateReply)
    with pytest.raises(InvalidInput, match="malformed reply"):
        unwrap_as(b'{"ok":tru', LocateReply)
    with pytest.raises(NotFound):  # an error whatever its result says
        unwrap_as(b'{"ok":false,"result":{"bad":1},"error":{"status":"not_found"}}', LocateReply)


class Pong(msgspec.Struct):
    worker_id: str
    seq: int = 0


def test_a_struct_travels_in_the_envelope_and_is_read_by_msgspec() -> None:
    reply = ok_reply(Pong("w1", 3))
    assert reply == b'{"ok":true,"result":{"worker_id":"w1","seq":3}}'
    assert unwrap_as(reply, Pong) == Pong("w1", 3)  # type: ignore[type-var]
    newer = b'{"ok":true,"result":{"worker_id":"w1","more":[1]}}'  # a newer peer's key: dropped
    assert unwrap_with_ledger(newer, Pong) == (Pong("w1"), None)
    with pytest.raises(InvalidInput, match="malformed reply"):
        unwrap_with_ledger(b'{"ok":true,"result":{"seq":1}}', Pong)


def test_json_parts_are_embedded_not_spliced() -> None:
    assert encode_many([b'{"a":1}', "[2]"]) == b'[{"a":1},[2]]' and encode_many([]) == b"[]"
    parts = {"a": {"x": [1, 2]}, "b": 'q"\\'}
    body = json.dumps(parts)
    assert json.loads(with_members(body, {"c": 3})) == {**parts, "c": 3}
    assert with_members("{}", {"c": "d"}) == b'{"c":"d"}'
    first = with_members('{"b":1,"s":0}', {"s": "new", "a": 0}, first=True)
    assert first == b'{"s":"new","a":0,"b":1}'


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


def test_a_memory_request_cancelled_as_its_reply_arrives_stays_cancelled() -> None:
    """The cancellation lands after the handler has answered and before the requester resumes
    (one turn of the loop): the requester ends cancelled, it does not go on with the reply."""

    async def main() -> None:
        bus = MemoryTransport()
        requester: asyncio.Task[bytes] | None = None

        async def answer_then_cancel(subject: str, data: bytes) -> bytes:
            assert requester is not None
            asyncio.get_running_loop().call_soon(requester.cancel)  # runs once this has replied
            return b"reply"

        await bus.subscribe("souq.worker.w1.get", answer_then_cancel)
        requester = asyncio.create_task(bus.request("souq.worker.w1.get", b"", timeout=5))
        with pytest.raises(asyncio.CancelledError):
            await requester
        assert requester.cancelled()

    asyncio.run(main())
