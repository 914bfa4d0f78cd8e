"""Quotas kept where the cluster keeps state that belongs to no worker: JetStream's key-value
bucket ``souq-quotas``, one key per scope (``app.<app>``, ``org.<slug>``) holding its limits and
its ledger (:mod:`souq.model.quota`). Every change is a compare-and-set on that key (the
revision it read), so brokers racing for the last slot each re-read and re-check: exactly one
takes it, the others see it taken (docs/quotas.md).

A create reserves (a pending entry with a deadline) before it claims, on every scope that has a
quota (the org's first, then the app's; a refusal by the second gives back the first), and
settles after the claim's answer: held for the machines made, dropped for none. A broker that
dies between the two leaves pending entries whose deadline passes; the next reservation that
would be refused reconciles the ledger against the machines the cluster has (the cluster view,
and each worker when the view is not complete) before it refuses.

A scope without a quota costs a create one read of its key (no write): nothing is counted
until a quota is set, and the PUT that sets one first counts what the scope holds.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import nats.errors
import nats.js.errors
from nats.js.kv import KeyValue

from souq.broker.app_store import AppStore
from souq.broker.quota_scopes import QuotaScopes
from souq.bus.jetstream import BucketStore, OnFirstUse, reconnects, unavailable
from souq.clock import Clock
from souq.errors import QuotaExceeded, Unavailable
from souq.model import Machine, MachineState
from souq.model.app import DEFAULT_ORG
from souq.model.machine import MachineConfig
from souq.model.quota import (
    ClusterMachine,
    Excess,
    QuotaEntry,
    QuotaLimits,
    QuotaRecord,
    QuotaUse,
    QuotaView,
    Scope,
    excess,
    held,
    reconciled,
    released,
    reserved,
    use_of,
    use_of_record,
)

if TYPE_CHECKING:
    from souq.broker.service import BrokerService

__all__ = ["BUCKET", "QuotaStore", "Quotas", "Reservation", "use_of_config"]

log = logging.getLogger(__name__)

BUCKET = "souq-quotas"
_WHAT = "the quota store"
_ATTEMPTS = 200  # compare-and-set rounds before a change gives up (503): contention, not a loop


def use_of_config(config: MachineConfig, count: int = 1) -> QuotaUse:
    """What ``count`` machines of ``config`` count against a quota."""
    size = config.guest.resources()
    return QuotaUse(
        cpus=round(size.cpus * count, 3), memory_mb=size.memory_mb * count, machines=count
    )


def key_of(scope: Scope, name: str) -> str:
    return f"{scope}.{name}"


_Seen = dict[str, tuple[set[str], list[ClusterMachine]]]  # the cluster's machines, read once


class _Refused(Exception):
    def __init__(self, over: Excess) -> None:
        self.over = over


_Change = Callable[[QuotaRecord | None], Awaitable[QuotaRecord | None]]


class QuotaStore(BucketStore):
    BUCKET = BUCKET
    DESCRIPTION = "souq quotas: each scope's limits and ledger"
    WHAT = _WHAT

    def __init__(self, kv: KeyValue, clock: Clock | None = None) -> None:
        super().__init__(kv, clock)
        self._queues: dict[str, list[tuple[_Change, asyncio.Future[QuotaRecord | None]]]] = {}
        self._draining: set[str] = set()
        self._parsed: dict[str, tuple[int, QuotaRecord]] = {}  # the last read, by revision

    async def read(self, key: str) -> tuple[QuotaRecord | None, int]:
        """The record of ``key`` and its revision (0: none)."""
        try:
            entry = await self._kv.get(key)
        except (nats.js.errors.KeyNotFoundError, nats.js.errors.KeyDeletedError):
            return None, 0
        except (nats.errors.Error, nats.js.errors.Error) as exc:
            raise unavailable(_WHAT, exc) from exc
        revision = entry.revision or 0
        if not entry.value:
            return None, revision
        seen = self._parsed.get(key)
        if seen is not None and seen[0] == revision:
            return seen[1], revision  # unchanged since: not parsed again
        record = QuotaRecord.model_validate_json(entry.value)
        self._parsed[key] = (revision, record)
        return record, revision

    async def change(self, key: str, change: _Change) -> QuotaRecord | None:
        """Apply ``change`` to the record of ``key`` by compare-and-set; ``change`` returning
        the record it was given (or None for none) writes nothing.

        Group commit: the changes this broker asks of one key while a write of it is under way
        wait, then go in one compare-and-set, each applied to the record as the ones before it
        left it (a change that raises is left out, and its caller gets the error). Another
        broker having written first, the batch is re-read and re-applied: exact, and one write
        per batch rather than one per create racing on the key."""
        future: asyncio.Future[QuotaRecord | None] = asyncio.get_running_loop().create_future()
        self._queues.setdefault(key, []).append((change, future))
        if key not in self._draining:
            self._draining.add(key)
            asyncio.get_running_loop().create_task(self._drain(key))
        return await future

    async def _drain(self, key: str) -> None:
        try:
            while self._queues.get(key):
                batch = self._queues.pop(key)
                try:
                    await self._commit(key, batch)
                except BaseException as exc:  # the store failed: every change of the batch
                    for _, future in batch:
                        if not future.done():
                            future.set_exception(exc)
                    if not isinstance(exc, Exception):
                        raise
        finally:
            self._draining.discard(key)

    async def _commit(
        self, key: str, batch: list[tuple[_Change, asyncio.Future[QuotaRecord | None]]]
    ) -> None:
        for attempt in range(_ATTEMPTS):
            record, revision = await self.read(key)
            current = record
            outcomes: list[tuple[asyncio.Future[QuotaRecord | None], Any]] = []
            for change, future in batch:
                try:
                    new = await change(current)
                except Exception as exc:  # this change's own refusal: the others go on
                    outcomes.append((future, exc))
                    continue
                current = current if new is None else new
                outcomes.append((future, current))
            if current is not record and current is not None:
                body = current.model_dump_json().encode()
                try:
                    if revision == 0:
                        written = await self._kv.create(key, body)
                    else:
                        written = await self._kv.update(key, body, last=revision)
                    self._parsed[key] = (written, current)
                except nats.js.errors.KeyWrongLastSequenceError:
                    # Another broker wrote first: back off a little, at random, and re-apply.
                    await asyncio.sleep(random.uniform(0, 0.002 * min(attempt + 1, 10)))
                    continue
                except (nats.errors.Error, nats.js.errors.Error) as exc:
                    raise unavailable(_WHAT, exc) from exc
            for future, outcome in outcomes:
                if future.done():
                    continue
                if isinstance(outcome, Exception):
                    future.set_exception(outcome)
                else:
                    future.set_result(outcome)
            return
        raise Unavailable(
            f"{_WHAT}: key {key} changed under every one of {_ATTEMPTS} tries",
            hint="too many creates race on one quota; try again",
        )

    async def remove(self, key: str) -> None:
        try:
            await self._kv.delete(key)
        except (nats.errors.Error, nats.js.errors.Error) as exc:
            raise unavailable(_WHAT, exc) from exc


@dataclass
class Reservation:
    """What one create took: the keys it reserved on, under its request id."""

    request_id: str
    keys: list[str] = field(default_factory=list)


class Quotas:
    """The broker's quota use cases: set, show, reserve, settle, release, reconcile."""

    def __init__(self, service: BrokerService, clock: Clock, *, deadline_s: float) -> None:
        self._service = service
        self._clock = clock
        self.deadline_s = deadline_s  # a reservation's: past it, reconciliation decides
        self._store = OnFirstUse(lambda: QuotaStore.open(service.nats_client())).get
        self._apps = OnFirstUse(lambda: AppStore.open(service.nats_client())).get
        self.scopes = QuotaScopes(self._bucket, lambda: reconnects(service.nats_client()))

    async def _bucket(self) -> KeyValue:
        return (await self._store()).bucket

    def start(self) -> None:
        """Watch which scopes have a quota (see :mod:`souq.broker.quota_scopes`)."""
        if self.enabled:
            self.scopes.start()

    async def close(self) -> None:
        await self.scopes.close()

    @property
    def enabled(self) -> bool:
        """Quotas are kept on a NATS bus (JetStream); on another (the in-memory bus of unit
        tests and the simulator) there are none."""
        try:
            self._service.nats_client()
        except Unavailable:
            return False
        return True

    def _now_ms(self) -> int:
        return self._clock.now_ms()

    async def org_of(self, app: str) -> str:
        record = await (await self._apps()).get(app)
        return record.org_slug if record is not None else DEFAULT_ORG

    def _none_for(self, app: str) -> bool:
        """Known (the watch) that no scope ``app`` counts in has a quota."""
        return self.scopes.without_quota(key_of("app", app))

    async def _keys_of(self, app: str) -> list[str]:
        """The scopes ``app`` counts in, the org's first."""
        return [key_of("org", await self.org_of(app)), key_of("app", app)]

    # -- limits ----------------------------------------------------------------------------

    async def set_limits(self, scope: Scope, name: str, limits: QuotaLimits) -> QuotaView:
        """Set (replace) the scope's limits; the first time, its ledger counts what it holds."""
        store = await self._store()

        async def change(record: QuotaRecord | None) -> QuotaRecord:
            if record is None:
                record = await self._reconciled(QuotaRecord(scope=scope, name=name, limits=limits))
            return record.model_copy(update={"limits": limits})

        record = await store.change(key_of(scope, name), change)
        assert record is not None
        return view_of(record)

    async def show(self, scope: Scope, name: str) -> QuotaView:
        """The scope's limits and use; no quota set: no limits, and the use counted now."""
        record, _ = await (await self._store()).read(key_of(scope, name))
        if record is None:
            record = await self._reconciled(
                QuotaRecord(scope=scope, name=name, limits=QuotaLimits())
            )
            return view_of(record)
        return view_of(await self._reconciled(record))

    async def clear(self, scope: Scope, name: str) -> None:
        await (await self._store()).remove(key_of(scope, name))

    # -- a create's path -------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def counting(
        self, app: str, request_id: str, config: MachineConfig, *, count: int = 1
    ) -> AsyncIterator[list[Machine]]:
        """Around a create: ``count`` machines of ``config`` reserved first (403
        ``quota_exceeded`` before anything is claimed); the machines the body appends to the
        list it is given are held once it is done. Failed, the reservation is given back, but
        for :class:`Unavailable` (a claim's answer lost: the machine may exist), after which it
        waits for its deadline and reconciliation."""
        taken = await self.reserve(
            app, request_id, use_of_config(config, count), deadline_s=self.deadline_s
        )
        made: list[Machine] = []
        try:
            yield made
        except Unavailable:
            raise
        except BaseException:
            await self.settle(taken, {m.id: use_of_config(m.config) for m in made})
            raise
        await self.settle(taken, {m.id: use_of_config(m.config) for m in made})

    async def reserve(
        self, app: str, request_id: str, use: QuotaUse, *, deadline_s: float
    ) -> Reservation:
        """Reserve ``use`` for the create ``request_id`` on every scope of ``app`` with a
        quota; :class:`QuotaExceeded` (nothing kept) when one would pass a limit."""
        taken = Reservation(request_id)
        if not self.enabled or self._none_for(app):
            return taken
        store = await self._store()
        entry = QuotaEntry(
            app=app,
            request_id=request_id,
            use=use,
            deadline_ms=self._now_ms() + int(deadline_s * 1000),
        )
        try:
            for key in await self._keys_of(app):
                if await self._reserve_on(store, key, entry):
                    taken.keys.append(key)
        except BaseException:
            await self.settle(taken, {})
            raise
        return taken

    async def _reserve_on(self, store: QuotaStore, key: str, entry: QuotaEntry) -> bool:
        seen: _Seen = {}

        async def change(record: QuotaRecord | None) -> QuotaRecord | None:
            if record is None:
                return None  # no quota: nothing to count
            over = excess(record, entry.use)
            if over is not None:
                # Before refusing: the ledger against the machines the cluster has (pending
                # entries of crashed brokers, machines destroyed without this broker).
                record = await self._reconciled(record, seen)
                over = excess(record, entry.use)
            if over is not None:
                raise _Refused(over)
            return reserved(record, entry)

        try:
            return await store.change(key, change) is not None
        except _Refused as refused:
            raise quota_exceeded(refused.over) from None

    async def settle(self, taken: Reservation, machines: dict[str, QuotaUse]) -> None:
        """The create ``taken`` is for answered: its machines held (none: all given back).
        A failure here leaves the pending entries to their deadline (and reconciliation)."""
        if not taken.keys:
            return
        store = await self._store()

        async def change(record: QuotaRecord | None) -> QuotaRecord | None:
            if record is None or taken.request_id not in record.pending:
                return record
            return held(record, taken.request_id, machines)

        async def settle_on(key: str) -> None:
            try:
                await store.change(key, change)
            except Unavailable as exc:
                log.warning("quota %s: create %s left pending: %s", key, taken.request_id, exc)

        await asyncio.gather(*(settle_on(key) for key in taken.keys))  # the scopes at once

    async def release(self, app: str, machine_ids: list[str]) -> None:
        """Machines of ``app`` destroyed: their use given back (best effort: reconciliation
        drops what a failure here leaves)."""
        if not self.enabled or self._none_for(app):
            return
        store = await self._store()

        async def change(record: QuotaRecord | None) -> QuotaRecord | None:
            if record is None or not any(m in record.held for m in machine_ids):
                return record
            return released(record, machine_ids)

        try:
            for key in await self._keys_of(app):
                await store.change(key, change)
        except Unavailable as exc:
            log.warning("quota of %s: release of %s left to reconciling: %s", app, machine_ids, exc)

    async def grow(self, app: str, machine_id: str, before: QuotaUse, after: QuotaUse) -> None:
        """An update of ``machine_id`` from ``before`` to ``after``: the growth reserved as
        the machine's (its entry takes the new size; :class:`QuotaExceeded` if a limit would
        pass). A shrink changes nothing until it is done (:meth:`resized`)."""
        growth = QuotaUse(
            cpus=max(0.0, round(after.cpus - before.cpus, 3)),
            memory_mb=max(0, after.memory_mb - before.memory_mb),
        )
        if growth.cpus <= 0 and growth.memory_mb <= 0:
            return
        await self.resized(app, machine_id, after, growth=growth)

    async def resized(
        self, app: str, machine_id: str, size: QuotaUse, *, growth: QuotaUse | None = None
    ) -> None:
        if not self.enabled or self._none_for(app):
            return
        store = await self._store()

        def change_for() -> Callable[[QuotaRecord | None], Awaitable[QuotaRecord | None]]:
            async def change(record: QuotaRecord | None) -> QuotaRecord | None:
                if record is None:
                    return None
                if growth is not None:
                    over = excess(record, growth)
                    if over is not None:
                        raise _Refused(over)
                old = record.held.get(machine_id)
                now = (size.cpus, size.memory_mb, old[2] if old else "")
                return record.model_copy(update={"held": {**record.held, machine_id: now}})

            return change

        try:
            for key in await self._keys_of(app):
                await store.change(key, change_for())
        except _Refused as refused:
            raise quota_exceeded(refused.over) from None

    # -- reconciliation --------------------------------------------------------------------

    async def _reconciled(self, record: QuotaRecord, seen: _Seen | None = None) -> QuotaRecord:
        """``record`` reconciled with the cluster's machines of its scope (read once per
        ``seen``: a compare-and-set that goes round again reuses them)."""
        seen = {} if seen is None else seen
        if "" not in seen:
            apps = await self._apps_of(record)
            machines: list[ClusterMachine] = []
            for app in sorted(apps):
                machines.extend(await self._cluster_machines(app))
            seen[""] = (apps, machines)
        apps, machines = seen[""]
        return reconciled(record, machines, apps=apps, now_ms=self._now_ms())

    async def _apps_of(self, record: QuotaRecord) -> set[str]:
        if record.scope == "app":
            return {record.name}
        created = await (await self._apps()).all()
        apps = {r.name for r in created if r.org_slug == record.name}
        if record.name == DEFAULT_ORG:  # apps never created (only machines): the default org
            names = {r.name for r in created}
            apps |= {c.app for c in self._service.view.store.apps() if c.app not in names}
        return apps

    async def _cluster_machines(self, app: str) -> list[ClusterMachine]:
        """The app's machines: those the view still holds (destroyed ones too), then the live
        ones as :meth:`BrokerService.list_rows` has them (the view once complete, else every
        worker)."""
        rows = self._service.view.store.app_rows(app, destroyed=True)
        rows += await self._service.list_rows(app)
        machines = {m.id: m for m in (Machine.model_validate_json(body) for _, body in rows)}
        return [
            ClusterMachine(
                machine_id=machine.id,
                app=machine.app,
                request_id=machine.placement.request_id if machine.placement else "",
                use=use_of_config(machine.config),
                destroyed=machine.state is MachineState.DESTROYED,
            )
            for machine in machines.values()
        ]


def view_of(record: QuotaRecord) -> QuotaView:
    pending = list(record.pending.values())
    return QuotaView(
        scope=record.scope,
        name=record.name,
        limits=record.limits,
        use=use_of_record(record),
        pending=use_of(pending),
        pending_creates=len(pending),
    )


def quota_exceeded(over: Excess) -> QuotaExceeded:
    return QuotaExceeded(
        over.message(),
        hint=f"destroy machines of {over.scope} {over.name}, or ask an operator to raise its "
        f"quota (`souq quota show {over.name}`)",
        details={
            "scope": over.scope,
            "name": over.name,
            "quota": over.dimension,
            "limit": over.limit,
            "use": over.use,
            "asked": over.asked,
        },
    )
