"""The broker's side of spot prices: it works out each region's price from its view of the
workers (:mod:`souq.market.prices`, pure), publishes a change in JetStream's
``souq-spot-prices`` bucket (one key per region; the bucket keeps each key's last 64 figures,
the recent history), watches the bucket for what other brokers publish, refuses a spot create
that bids below the published price, and shows the price in ``GET /v1/regions``.

Nobody coordinates the publishing: every broker works the figure out every ``spot_price.interval_s``
and writes it by compare-and-set on the key's last revision, when it differs from the figure there
and its view is not older than the one that figure came from
(:func:`~souq.market.prices.supersedes`). A write that loses a race is dropped (the watch brings the
winner's). The workers, not the brokers, preempt their spot machines when the published price passes
their bids (:mod:`souq.agent.machines.spot_prices`), so no two brokers can act on one machine.

Until a figure is published for a region (a new cluster, JetStream away), the price shown and
checked is the broker's own (``spot_price_source: view``).
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable, Iterator

import nats.errors
import nats.js.errors
from nats.aio.client import Client
from nats.js.kv import KeyValue
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from pydantic import ValidationError

from souq.bus.jetstream import BucketWatch, OnFirstUse, open_key_value, reconnects
from souq.clock import Clock
from souq.daemon import cancel_tasks
from souq.errors import BidBelowPrice
from souq.market.prices import BUCKET, HISTORY, refuses, region_price, region_prices, supersedes
from souq.model import WorkerInfo
from souq.model.machine import MachineConfig
from souq.model.prices import SpotPrice, SpotPriceRule
from souq.view import RegionSummary

__all__ = ["SpotPrices"]

log = logging.getLogger(__name__)

_DESCRIPTION = "souq spot prices: one key per region, its recent figures"
_WHAT = "the spot prices"
_STALE_INTERVALS = 10  # a figure this many intervals old yields to any broker's


class SpotPrices:
    """``start()`` once the broker is connected, ``await close()``. ``nats_client`` is None on
    a bus that is not NATS (unit tests, the simulator): then nothing is published and the
    price is the broker's own."""

    def __init__(
        self,
        rule: SpotPriceRule,
        workers: Callable[[], list[WorkerInfo]],
        clock: Clock,
        nats_client: Callable[[], Client] | None,
    ) -> None:
        self.rule = rule
        self._workers = workers
        self._clock = clock
        self._client = nats_client
        self._published: dict[str, SpotPrice] = {}
        self._revision: dict[str, int] = {}  # each key's last revision read
        self._history: dict[str, deque[SpotPrice]] = {}
        self._task: asyncio.Task[None] | None = None
        self._watch: BucketWatch | None = None
        self.writes = 0  # figures this broker published
        if nats_client is not None:
            client = nats_client
            self._bucket = OnFirstUse(
                lambda: open_key_value(client(), BUCKET, _DESCRIPTION, what=_WHAT, history=HISTORY)
            ).get
            self._watch = BucketWatch(
                self._bucket,
                self._on_entry,
                name="souq-spot-prices",
                reconnects=lambda: reconnects(client()),
                include_history=True,
            )

    @property
    def stale_ms(self) -> int:
        return int(self.rule.interval_s * 1000 * _STALE_INTERVALS)

    def start(self) -> None:
        if self._watch is None:
            return
        self._watch.start()
        self._task = asyncio.get_running_loop().create_task(self._run(), name="souq-spot-prices")

    async def close(self) -> None:
        await cancel_tasks([self._task])
        self._task = None
        if self._watch is not None:
            await self._watch.close()

    # -- reading ---------------------------------------------------------------------------

    def _on_entry(self, entry: KeyValue.Entry) -> None:
        revision = entry.revision or 0
        if revision <= self._revision.get(entry.key, 0):
            return  # seen already (the watch, started again, gives the history again)
        if entry.operation is not None or not entry.value:
            self._revision[entry.key] = revision
            self._published.pop(entry.key, None)
            return
        try:
            price = SpotPrice.model_validate_json(entry.value)
        except ValidationError as exc:
            log.warning("spot price of %s unreadable: %s", entry.key, exc)
            return
        self._took(entry.key, price, revision)

    def _took(self, region: str, price: SpotPrice, revision: int) -> None:
        self._revision[region] = revision
        self._published[region] = price
        self._history.setdefault(region, deque(maxlen=HISTORY)).append(price)

    def price_of(self, region: str) -> tuple[SpotPrice | None, str]:
        """The region's price and where it comes from: ``published``, else this broker's
        own figure (``view``)."""
        published = self._published.get(region)
        if published is not None:
            return published, "published"
        own = region_price(region, self._workers(), self.rule, at_ms=self._clock.now_ms())
        return own, "view"

    def history(self, region: str) -> list[SpotPrice]:
        return list(self._history.get(region, ()))

    def check_bid(self, region: str, config: MachineConfig) -> None:
        """Refuse (409 ``bid_below_price``) a spot create bidding below ``region``'s price."""
        price, source = self.price_of(region)
        if price is None or not refuses(config.priority_class, config.max_price, price):
            return
        raise BidBelowPrice(
            f"the spot price in region {region} is {price.price:g} an hour ({price.used:.0%} "
            f"used), above this machine's config.max_price {config.max_price:g}",
            hint=f"bid at least {price.price:g} (config.max_price), create it as priority_class "
            "standard, or pick a region whose spot price is lower (souq regions)",
            details={
                "region": region,
                "spot_price": price.price,
                "spot_price_used": price.used,
                "spot_price_source": source,
                "max_price": config.max_price,
            },
        )

    def annotate(self, regions: list[RegionSummary]) -> list[RegionSummary]:
        """``regions`` with their spot prices and recent history."""
        out = []
        for r in regions:
            price, source = self.price_of(r.name)
            if price is None:
                out.append(r)
                continue
            update = {
                "spot_price": price.price,
                "spot_price_used": price.used,
                "spot_price_at_ms": price.at_ms,
                "spot_price_source": source,
                "spot_price_history": self.history(r.name),
            }
            out.append(r.model_copy(update=update))
        return out

    def collector(self) -> Collector:
        """``souq_spot_price{region,source}`` and ``souq_spot_prices_published`` for
        ``GET /metrics``, read when scraped."""
        return _PriceCollector(self)

    # -- publishing ------------------------------------------------------------------------

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.rule.interval_s)
            try:
                await self.publish_once()
            except Exception as exc:  # NATS away, no JetStream: the next round tries again
                log.info("spot prices not published: %s", exc)

    async def publish_once(self) -> int:
        """Publish every region's figure that supersedes the one in the bucket; how many."""
        now = self._clock.now_ms()
        fresh = region_prices(self._workers(), self.rule, at_ms=now)
        wrote = 0
        for region, price in fresh.items():
            published = self._published.get(region)
            if not supersedes(price, published, now_ms=now, stale_ms=self.stale_ms):
                continue
            kv = await self._bucket()
            data = price.model_dump_json().encode()
            try:
                last = self._revision.get(region)
                if last is None:
                    revision = await kv.create(region, data)
                else:
                    revision = await kv.update(region, data, last=last)
            except (nats.js.errors.KeyWrongLastSequenceError, nats.js.errors.BadRequestError):
                continue  # another broker wrote first: its figure comes by the watch
            except (nats.errors.Error, nats.js.errors.Error) as exc:
                log.info("spot price of %s not published: %s", region, exc)
                continue
            log.info("spot price of %s: %g (%.0f%% used)", region, price.price, price.used * 100)
            self._took(region, price, revision)
            wrote += 1
        self.writes += wrote
        return wrote


class _PriceCollector(Collector):
    def __init__(self, prices: SpotPrices) -> None:
        self._prices = prices

    def collect(self) -> Iterator[Metric]:
        gauge = GaugeMetricFamily(
            "souq_spot_price",
            "each region's spot price, per hour (source: published, or this broker's view)",
            labels=["region", "source"],
        )
        for region in sorted({w.region for w in self._prices._workers()}):
            price, source = self._prices.price_of(region)
            if price is not None:
                gauge.add_metric([region, source], price.price)
        yield gauge
        written = CounterMetricFamily(
            "souq_spot_prices_published", "spot price changes this broker published"
        )
        written.add_metric([], self._prices.writes)
        yield written
