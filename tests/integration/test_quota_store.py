"""The quota store's compare-and-set against a real nats-server, two brokers' stores on one
bucket: a store computes a change on the revision it wrote last, and whenever the other wrote
since — or its change would refuse or write nothing — it computes it again on a fresh read, so
remembering never changes an outcome (souq.broker.quota_store)."""

from __future__ import annotations

import asyncio

from souq.broker.quota_store import QuotaStore
from souq.bus.nats import connect
from souq.model.quota import (
    QuotaEntry,
    QuotaLimits,
    QuotaRecord,
    QuotaUse,
    excess,
    released,
    reserved,
    use_of_record,
)

ONE = QuotaUse(cpus=1, memory_mb=64, machines=1)
KEY = "app.web"


class Refused(Exception):
    pass


def reserve(request_id: str):  # type: ignore[no-untyped-def]
    async def change(record: QuotaRecord | None) -> QuotaRecord | None:
        assert record is not None
        if excess(record, ONE) is not None:
            raise Refused(request_id)
        entry = QuotaEntry(app="web", request_id=request_id, use=ONE, deadline_ms=10**15)
        return reserved(record, entry)

    return change


def test_two_stores_on_one_key_never_pass_its_limit(nats_url: str) -> None:
    async def main() -> None:
        a_bus = await connect(nats_url, name="broker-a")
        b_bus = await connect(nats_url, name="broker-b")
        a = await QuotaStore.open(a_bus.client)
        b = await QuotaStore.open(b_bus.client)

        async def start(record: QuotaRecord | None) -> QuotaRecord:
            return QuotaRecord(scope="app", name="web", limits=QuotaLimits(machines=2))

        await a.change(KEY, start)
        await a.change(KEY, reserve("a1"))  # a remembers revision 2
        await b.change(KEY, reserve("b1"))  # b writes revision 3: the key is full
        reads = a.reads
        try:
            await a.change(KEY, reserve("a2"))  # a's remembered record had room: refused
        except Refused:
            pass
        else:
            raise AssertionError("a store admitted past the limit on a stale revision")
        assert a.reads == reads + 1  # the refusal was checked on a fresh read

        async def release_b1(record: QuotaRecord | None) -> QuotaRecord | None:
            assert record is not None
            return released(record, ["b1"])

        await b.change(KEY, release_b1)  # room again; a's remembered record is full
        assert await a.change(KEY, reserve("a3")) is not None  # fresh read: it fits
        final, _ = await b.read(KEY)
        assert final is not None and set(final.pending) == {"a1", "a3"}
        assert use_of_record(final).machines == 2

        # Many changes racing from both stores: exactly the limit's worth admitted.
        async def fill(record: QuotaRecord | None) -> QuotaRecord:
            assert record is not None
            return record.model_copy(update={"pending": {}, "limits": QuotaLimits(machines=7)})

        await a.change(KEY, fill)
        outcomes = await asyncio.gather(
            *((a if i % 2 else b).change(KEY, reserve(f"r{i}")) for i in range(40)),
            return_exceptions=True,
        )
        admitted = [o for o in outcomes if not isinstance(o, BaseException)]
        assert len(admitted) == 7, outcomes
        assert all(isinstance(o, Refused) for o in outcomes if isinstance(o, BaseException))
        last, _ = await a.read(KEY)
        assert last is not None and len(last.pending) == 7
        await a_bus.close()
        await b_bus.close()

    asyncio.run(main())
