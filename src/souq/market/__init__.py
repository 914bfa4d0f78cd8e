"""The market core (pure): what the broker knows of its workers, and one placement as a state
machine, events in and actions out.

* :mod:`~souq.market.book` — :class:`WorkerBook`: every worker's promised capacity, kept fresh
  by heartbeats, usage messages and refusals; draws candidates without asking anyone;
* :mod:`~souq.market.auction` — :class:`Auction`: candidates → rank → assign → claim → finish,
  for single creates, batches, quotes and dry runs alike;
* :mod:`~souq.market.orders` — what one auction places, and what for;
* :mod:`~souq.market.records` — the placement record each auction writes as it goes.

The broker's shell (:mod:`souq.broker.market`) drives auctions over the bus; the simulator and
the tests drive the same cores with no bus at all.

Compiled with mypyc where a C compiler is at hand (:mod:`souq.compiled`).
"""

from souq.compiled import refuse_stale

refuse_stale()

# ruff: noqa: E402 - the check above must come before the compiled modules are imported
from souq.market.auction import (
    Action,
    AskOffers,
    Auction,
    Finished,
    Rules,
    SendClaim,
)
from souq.market.book import Candidates, WorkerBook
from souq.market.orders import Order, Purpose
from souq.market.records import RecordKeeper

__all__ = [
    "Action",
    "AskOffers",
    "Auction",
    "Candidates",
    "Finished",
    "Order",
    "Purpose",
    "RecordKeeper",
    "Rules",
    "SendClaim",
    "WorkerBook",
]
