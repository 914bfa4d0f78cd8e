"""The agent's side of spot prices: it follows its region's published price (JetStream's
``souq-spot-prices`` bucket, which brokers write: :mod:`souq.broker.spot_prices`) and preempts
its own running ``spot`` machines whose ``max_price`` the price has passed
(:func:`souq.market.prices.outbid`, pure).

The worker is the authority over its machines, so it alone decides: no broker acts on them, and
brokers that publish at once cannot stop a machine twice. With ``--spot-notice N`` a machine outbid
gets an event ``preempt_notice`` (the price, its bid, when it stops) and is stopped N seconds later,
whatever the price does meanwhile (as AWS's two-minute notice); with none (the default) at once. The
stop is a preemption's (:func:`souq.agent.machines.displacing.displace`): an event ``preempted``
saying the price rose and to what, the stop signal, SIGKILL after the machine's ``kill_timeout``,
its reservation given back (its room lowers the price).

The agent looks when a figure arrives and every ``_TICK_S`` (a spot machine started while the
price is above its bid goes at the next look). A notice lives in memory: an agent started
again gives the machine a new one. Without a bucket (no broker made it yet, NATS away) the
last figure heard stands; none heard, nothing is preempted.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from nats.aio.client import Client
from nats.js.kv import KeyValue
from pydantic import ValidationError

from souq.agent.machines.displacing import RUNNING, displace
from souq.agent.machines.executor import Executor
from souq.bus.jetstream import BucketWatch, open_key_value, reconnects
from souq.clock import Clock, iso_from_ms
from souq.daemon import cancel_tasks
from souq.market.prices import BUCKET, Bid, outbid
from souq.model.choices import EventType
from souq.model.prices import SpotPrice

__all__ = ["SpotWatch"]

log = logging.getLogger(__name__)

_TICK_S = 1.0  # how often the agent looks again without a new figure


class SpotWatch:
    """``attach(client)`` once connected; ``await aclose()``."""

    def __init__(self, ex: Executor, region: str, clock: Clock, *, notice_s: float) -> None:
        self._ex = ex
        self._region = region
        self._clock = clock
        self.notice_s = notice_s
        self.price: SpotPrice | None = None
        self._noticed: dict[str, tuple[int, SpotPrice, float]] = {}  # id -> (due ms, price, bid)
        self._moved = asyncio.Event()
        self._watch: BucketWatch | None = None
        self._task: asyncio.Task[None] | None = None

    def attach(self, client: Client) -> None:
        async def bucket() -> KeyValue:
            return await open_key_value(client, BUCKET, "", what="the spot prices", make=False)

        self._watch = BucketWatch(
            bucket, self._on_entry, name="souq-spot-watch", reconnects=lambda: reconnects(client)
        )
        self._watch.start()
        self._task = asyncio.get_running_loop().create_task(self._run(), name="souq-spot-sweep")

    async def aclose(self) -> None:
        await cancel_tasks([self._task])
        self._task = None
        if self._watch is not None:
            await self._watch.close()
            self._watch = None

    def _on_entry(self, entry: KeyValue.Entry) -> None:
        if entry.key != self._region or entry.operation is not None or not entry.value:
            return
        try:
            self.heard(SpotPrice.model_validate_json(entry.value))
        except ValidationError as exc:
            log.warning("the spot price of %s is unreadable: %s", self._region, exc)

    def heard(self, price: SpotPrice) -> None:
        """A figure for this worker's region (the bucket's order is the figures' order, not
        their brokers' clocks): look at once."""
        self.price = price
        self._moved.set()

    async def _run(self) -> None:
        while True:
            try:
                self.sweep()
            except Exception:
                log.exception("spot price preemption failed; looking again")
            self._moved.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self._wait_s()):
                    await self._moved.wait()

    def _wait_s(self) -> float:
        if not self._noticed:
            return _TICK_S
        due = min(d for d, _, _ in self._noticed.values())
        return max(0.0, min(_TICK_S, (due - self._clock.now_ms()) / 1000))

    def _bids(self) -> list[Bid]:
        """The settled machines here that hold room, as the price sees them."""
        ex = self._ex
        return [
            Bid(row.id, row.config.priority_class, row.config.max_price, row.state in RUNNING)
            for row in ex.rows()
            if row.id not in ex.unreserved and ex.current_op(row.id) is None
        ]

    def sweep(self) -> list[str]:
        """Stop what is due, give notice to (or stop) what the price outbids; the machines
        stopped."""
        price = self.price
        now = self._clock.now_ms()
        bids = {b.machine_id: b for b in self._bids()}
        stopped = []
        for machine_id, (due, was, bid) in list(self._noticed.items()):
            if machine_id not in bids or not bids[machine_id].running:
                del self._noticed[machine_id]  # stopped or gone meanwhile, or busy: look again
                continue
            if due <= now:
                del self._noticed[machine_id]
                self._preempt(machine_id, was, bid, noticed=True)
                stopped.append(machine_id)
        if price is None:
            return stopped
        for loser in outbid(bids.values(), price.price):
            if loser.machine_id in self._noticed or loser.machine_id in stopped:
                continue
            bid = loser.max_price if loser.max_price is not None else 0.0
            if self.notice_s <= 0:
                self._preempt(loser.machine_id, price, bid, noticed=False)
                stopped.append(loser.machine_id)
                continue
            notice_ms = int(self.notice_s * 1000)
            self._ex.apply(
                loser.machine_id,
                type=EventType.PREEMPT_NOTICE,
                source="agent",
                message=f"{_rose(self._region, price, bid)}: it stops in {self.notice_s:g} s, "
                f"at {iso_from_ms(self._clock.now_ms() + notice_ms)}",
            )
            # Counted from a time read after the notice's own: never less notice than promised.
            self._noticed[loser.machine_id] = (self._clock.now_ms() + notice_ms, price, bid)
        return stopped

    def _preempt(self, machine_id: str, price: SpotPrice, bid: float, *, noticed: bool) -> None:
        after = f", after {self.notice_s:g} s of notice" if noticed else ""
        message = f"preempted: {_rose(self._region, price, bid)}{after}"
        log.info("machine %s %s", machine_id, message)
        displace(self._ex, self._ex.row_by_id(machine_id), message, durable=True)


def _rose(region: str, price: SpotPrice, bid: float) -> str:
    return (
        f"the spot price in region {region} rose to {price.price:g} an hour "
        f"({price.used:.0%} used), above its max_price {bid:g}"
    )
