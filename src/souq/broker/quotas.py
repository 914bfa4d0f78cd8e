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
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from nats.js.kv import KeyValue

from souq.broker.app_store import AppStore
from souq.broker.quota_scopes import QuotaScopes
from souq.broker.quota_store import BUCKET, Change, QuotaStore, key_of
from souq.bus.jetstream import OnFirstUse, reconnects
from souq.clock import Clock
from souq.errors import QuotaExceeded, Unavailable
from souq.ids import new_request_id
from souq.model import Machine, MachineState
from souq.model.app import DEFAULT_ORG
from souq.model.machine import MachineConfig, preempted_event
from souq.model.quota import (
    ClassLimits,
    Excess,
    QuotaEntry,
    QuotaLimits,
    QuotaRecord,
    QuotaUse,
    QuotaView,
    Scope,
    excess,
    held,
    released,
    reserved,
    view_of,
    with_line,
)
from souq.model.quota_reconcile import ClusterMachine, ClusterVolumes, reconciled
from souq.model.volume import Volume

if TYPE_CHECKING:
    from nats.aio.client import Client

    from souq.broker.volume_listing import VolumeListing
    from souq.view import ClusterView

__all__ = ["BUCKET", "Quotas", "Reservation", "use_of_config", "use_of_machine", "use_of_volume"]

log = logging.getLogger(__name__)

# An app's organization, once read, is remembered this long: an app deleted and created again
# in another organization counts in the old one's quota on this broker until then.
ORG_REMEMBERED_S = 30.0
_MAX_REMEMBERED = 100_000


def use_of_config(config: MachineConfig, count: int = 1) -> QuotaUse:
    """What ``count`` machines of ``config`` count against a quota (in its class)."""
    size = config.guest.resources()
    return QuotaUse(
        cpus=round(size.cpus * count, 3), memory_mb=size.memory_mb * count, machines=count
    )


def use_of_machine(machine: Machine) -> QuotaUse:
    """What ``machine`` counts against a quota as it is: one machine, and its size but when a
    preemption displaced it (then it holds no room on its worker, until a start takes some:
    :meth:`Quotas.regaining`)."""
    if preempted_event(machine) is not None:
        return QuotaUse(machines=1)
    return use_of_config(machine.config)


def use_of_volume(size_gb: int) -> QuotaUse:
    return QuotaUse(volume_gb=size_gb)


_Seen = dict[str, tuple[set[str], list[ClusterMachine], ClusterVolumes | None]]  # read once


class _Refused(Exception):
    def __init__(self, over: Excess) -> None:
        self.over = over


@dataclass
class Reservation:
    """What one change took: the keys it reserved on, under its request id."""

    request_id: str
    keys: list[str] = field(default_factory=list)


class Quotas:
    """The broker's quota use cases: set, show, reserve, settle, release, reconcile."""

    def __init__(
        self,
        nats_client: Callable[[], Client],
        clock: Clock,
        *,
        deadline_s: float,
        view: ClusterView,
        live_rows: Callable[[str], Awaitable[list[tuple[str, str]]]],
        volumes: VolumeListing,
    ) -> None:
        """``nats_client``: the bus's connection (Unavailable on another bus); ``view`` and
        ``live_rows`` (the broker's list of an app's live machines): what reconciliation counts;
        ``volumes``: the cluster's listing of volumes."""
        self._nats_client = nats_client
        self._clock = clock
        self.deadline_s = deadline_s  # a reservation's: past it, reconciliation decides
        self._view = view
        self._live_rows = live_rows
        self._volumes = volumes
        self._store = OnFirstUse(lambda: QuotaStore.open(nats_client())).get
        self._apps = OnFirstUse(lambda: AppStore.open(nats_client())).get
        self.scopes = QuotaScopes(self._bucket, lambda: reconnects(nats_client()))
        self._orgs: dict[str, tuple[str, float]] = {}  # app → (its org, until when)

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
            self._nats_client()
        except Unavailable:
            return False
        return True

    def _now_ms(self) -> int:
        return self._clock.now_ms()

    async def org_of(self, app: str) -> str:
        """The organization ``app`` counts in: its record's (remembered for
        :data:`ORG_REMEMBERED_S`), else — never created — the default one (read each time: it
        may be created in another organization any moment)."""
        now = self._clock.monotonic()
        known = self._orgs.get(app)
        if known is not None and known[1] > now:
            return known[0]
        record = await (await self._apps()).get(app)
        if record is None:
            return DEFAULT_ORG
        if len(self._orgs) >= _MAX_REMEMBERED:
            self._orgs.clear()
        self._orgs[app] = (record.org_slug, now + ORG_REMEMBERED_S)
        return record.org_slug

    def may_count(self, app: str) -> bool:
        """Whether a change of ``app`` may count against a quota (else it need not ask)."""
        return self.enabled and not self._none_for(app)

    def _none_for(self, app: str) -> bool:
        """Known (the watch) that no scope ``app`` counts in has a quota."""
        return self.scopes.without_quota(key_of("app", app))

    async def _keys_of(self, app: str) -> list[str]:
        """The scopes ``app`` counts in that may have a quota, the org's first (the watch
        known: only those it has; else both, and a key without a record counts nothing)."""
        keys = [key_of("org", await self.org_of(app)), key_of("app", app)]
        if self.scopes.known:
            keys = [k for k in keys if k in self.scopes.keys]
        return keys

    # -- limits ----------------------------------------------------------------------------

    async def set_limits(self, scope: Scope, name: str, limits: QuotaLimits) -> QuotaView:
        """Set (replace) the scope's limits; the first time, its ledger counts what it holds."""
        return await self._set(scope, name, lambda _: limits)

    async def set_line(self, scope: Scope, name: str, line: str, given: ClassLimits) -> QuotaView:
        """Replace one line of the scope's limits (``all`` or a class), keeping the others."""
        return await self._set(scope, name, lambda old: with_line(old, line, given))

    async def _set(
        self, scope: Scope, name: str, limits_of: Callable[[QuotaLimits], QuotaLimits]
    ) -> QuotaView:
        store = await self._store()

        async def change(record: QuotaRecord | None) -> QuotaRecord:
            fresh = record is None
            if record is None:
                record = QuotaRecord(scope=scope, name=name, limits=QuotaLimits())
            limits = limits_of(record.limits)
            if fresh or (record.limits.volume_gb is None and limits.volume_gb is not None):
                record = await self._reconciled(record, volumes=True)  # what it holds, now
            return record.model_copy(update={"limits": limits})

        record = await store.change(key_of(scope, name), change)
        assert record is not None
        self.scopes.applied(key_of(scope, name), "PUT")  # this broker counts it from now on
        return view_of(record)

    async def show(self, scope: Scope, name: str) -> QuotaView:
        """The scope's limits and use; no quota set: no limits, and the use counted now."""
        record, _ = await (await self._store()).read(key_of(scope, name))
        if record is None:
            record = QuotaRecord(scope=scope, name=name, limits=QuotaLimits())
        return view_of(await self._reconciled(record, volumes=True))

    async def clear(self, scope: Scope, name: str) -> None:
        await (await self._store()).remove(key_of(scope, name))
        self.scopes.applied(key_of(scope, name), "DEL")

    # -- a create's path -------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def counting(
        self, app: str, request_id: str, config: MachineConfig, *, count: int = 1
    ) -> AsyncIterator[list[Machine]]:
        """Around a create: ``count`` machines of ``config`` reserved first (403
        ``quota_exceeded`` before anything is claimed); the machines the body appends to the
        list it is given are held once it is done."""
        if not self.may_count(app):
            yield []
            return
        klass = config.priority_class.value
        one = use_of_config(config)
        asked = one if count == 1 else use_of_config(config, count)
        taken = await self.reserve(app, request_id, asked, klass=klass)
        made: list[Machine] = []
        async with self._settling(taken):
            yield made
        if taken.keys:  # each machine at its size (a create's: its config's, as reserved)
            sizes = {
                m.id: one if m.config.guest == config.guest else use_of_config(m.config)
                for m in made
            }
            await self.settle(taken, sizes)

    @contextlib.asynccontextmanager
    async def _settling(self, taken: Reservation) -> AsyncIterator[None]:
        """Failed, the reservation is given back — but for :class:`Unavailable` (an answer
        lost: what it asked may have been made), after which it waits for its deadline and
        reconciliation."""
        try:
            yield
        except Unavailable:
            raise
        except BaseException:
            await self.settle(taken, {})
            raise

    @contextlib.asynccontextmanager
    async def growing(
        self,
        app: str,
        machine_id: str,
        before: MachineConfig,
        after: MachineConfig,
        *,
        displaced: bool = False,
    ) -> AsyncIterator[None]:
        """Around an update of ``machine_id`` from ``before`` to ``after``: the growth reserved
        (403 past a limit: the machine is unchanged), then the machine held at its new size.
        A machine moved to another class counts all of it in the new class's line. A shrink
        changes nothing until it is done (:meth:`resized`). ``displaced``: the machine holds no
        room (preempted) and the change takes it again (a start, an update that launches it):
        all its size is the growth."""
        old = QuotaUse(machines=1) if displaced else use_of_config(before)
        new = use_of_config(after)
        klass = after.priority_class.value
        moved = klass != before.priority_class.value
        growth = old.growth_to(new).model_copy(update={"machines": 0})
        if growth.is_zero() and not moved:
            yield
            return
        taken = await self.reserve(
            app, new_request_id(), growth, klass=klass, class_use=new if moved else None
        )
        async with self._settling(taken):
            yield
        await self.settle(taken, {machine_id: new})

    def regaining(self, app: str, machine: Machine) -> contextlib.AbstractAsyncContextManager[None]:
        """Around a start of ``machine``: one that preemption displaced takes room again, so
        its size is reserved first (403 ``quota_exceeded``: it stays stopped), then held; any
        other counts already."""
        displaced = preempted_event(machine) is not None
        config = machine.config
        return self.growing(app, machine.id, config, config, displaced=displaced)

    @contextlib.asynccontextmanager
    async def counting_volume(self, app: str, size_gb: int) -> AsyncIterator[list[Volume]]:
        """Around a volume's create: its size reserved, the volume held once made."""
        taken = await self.reserve(app, new_request_id(), use_of_volume(size_gb))
        made: list[Volume] = []
        async with self._settling(taken):
            yield made
        await self.settle(taken, {}, {vol.id: vol.size_gb for vol in made})

    @contextlib.asynccontextmanager
    async def extending(
        self, app: str, volume_id: str, before_gb: int, after_gb: int
    ) -> AsyncIterator[None]:
        """Around a volume's extension: the growth reserved, the volume held at its size."""
        if after_gb <= before_gb:
            yield
            return
        taken = await self.reserve(app, new_request_id(), use_of_volume(after_gb - before_gb))
        async with self._settling(taken):
            yield
        await self.settle(taken, {}, {volume_id: after_gb})

    async def reserve(
        self,
        app: str,
        request_id: str,
        use: QuotaUse,
        *,
        klass: str = "",
        class_use: QuotaUse | None = None,
    ) -> Reservation:
        """Reserve ``use`` for the change ``request_id`` on every scope of ``app`` with a
        quota, all at once; :class:`QuotaExceeded` (nothing kept) when one would pass a limit.
        A reservation another scope's refusal gives back may, for that moment, have refused
        another change: never one too many admitted, at worst one too few."""
        taken = Reservation(request_id)
        if not self.enabled or self._none_for(app):
            return taken
        keys = await self._keys_of(app)
        if not keys:
            return taken
        store = await self._store()
        entry = QuotaEntry(
            app=app,
            request_id=request_id,
            use=use,
            deadline_ms=self._now_ms() + int(self.deadline_s * 1000),
            priority_class=klass,
            class_use=class_use,
        )
        # Every scope at once: each one's change under way before the first is awaited.
        futures = [store.submit(key, self._reserving(entry)) for key in keys]
        failed: list[BaseException] = []
        for key, future in zip(keys, futures, strict=True):
            try:
                if await future is not None:
                    taken.keys.append(key)
            except _Refused as refused:
                failed.append(quota_exceeded(refused.over))
            except Exception as exc:
                failed.append(exc)
        if failed:
            await self.settle(taken, {})
            raise failed[0]
        return taken

    def _reserving(self, entry: QuotaEntry) -> Change:
        """The change that reserves ``entry`` on a scope's record: refused (:class:`_Refused`)
        past a limit once the record is reconciled with the cluster."""
        seen: _Seen = {}

        async def change(record: QuotaRecord | None) -> QuotaRecord | None:
            if record is None:
                return None  # no quota: nothing to count
            over = excess(record, entry.use, entry.priority_class, entry.class_use)
            if over is not None:
                # Before refusing: the ledger against the machines the cluster has (pending
                # entries of crashed brokers, machines destroyed without this broker).
                record = await self._reconciled(record, seen)
                over = excess(record, entry.use, entry.priority_class, entry.class_use)
            if over is not None:
                raise _Refused(over)
            return reserved(record, entry)

        return change

    async def settle(
        self,
        taken: Reservation,
        machines: dict[str, QuotaUse],
        volumes: dict[str, int] | None = None,
    ) -> None:
        """The change ``taken`` is for answered: what it made held (nothing: all given back).
        A failure here leaves the pending entries to their deadline (and reconciliation)."""
        if not taken.keys:
            return
        store = await self._store()

        async def change(record: QuotaRecord | None) -> QuotaRecord | None:
            if record is None or taken.request_id not in record.pending:
                return record
            return held(record, taken.request_id, machines, volumes)

        futures = [store.submit(key, change) for key in taken.keys]  # the scopes at once
        for key, future in zip(taken.keys, futures, strict=True):
            try:
                await future
            except Unavailable as exc:
                log.warning("quota %s: change %s left pending: %s", key, taken.request_id, exc)

    async def release(self, app: str, ids: list[str]) -> None:
        """Machines (or volumes) of ``app`` destroyed: their use given back (best effort:
        reconciliation drops what a failure here leaves)."""
        if not self.enabled or self._none_for(app):
            return
        store = await self._store()

        async def change(record: QuotaRecord | None) -> QuotaRecord | None:
            if record is None or not any(i in record.held or i in record.volumes for i in ids):
                return record
            return released(record, ids)

        try:
            keys = await self._keys_of(app)
            await asyncio.gather(*(store.change(key, change) for key in keys))
        except Unavailable as exc:
            log.warning("quota of %s: release of %s left to reconciling: %s", app, ids, exc)

    async def resized(self, app: str, machine_id: str, after: MachineConfig) -> None:
        """A machine's update that shrank it done: held at its new size."""
        if not self.enabled or self._none_for(app):
            return
        store = await self._store()
        size = use_of_config(after)
        now = (size.cpus, size.memory_mb, after.priority_class.value)

        async def change(record: QuotaRecord | None) -> QuotaRecord | None:
            if record is None or record.held.get(machine_id) == now:
                return record
            return record.model_copy(update={"held": {**record.held, machine_id: now}})

        keys = await self._keys_of(app)
        await asyncio.gather(*(store.change(key, change) for key in keys))

    # -- reconciliation --------------------------------------------------------------------

    async def _reconciled(
        self, record: QuotaRecord, seen: _Seen | None = None, *, volumes: bool = False
    ) -> QuotaRecord:
        """``record`` reconciled with the cluster's machines of its scope, and its volumes when
        it has a limit on their size (or ``volumes``: a quota set or shown) — read once per
        ``seen``: a compare-and-set that goes round again reuses them. The time that decides
        which reservations are past their deadline is taken before the cluster is read."""
        now_ms = self._now_ms()
        seen = {} if seen is None else seen
        volumes = volumes or record.limits.volume_gb is not None
        if "" not in seen:
            apps = await self._apps_of(record)
            machines: list[ClusterMachine] = []
            for app in sorted(apps):
                machines.extend(await self._cluster_machines(app))
            seen[""] = (apps, machines, await self._cluster_volumes(apps) if volumes else None)
        apps, machines, listed = seen[""]
        return reconciled(record, machines, apps=apps, now_ms=now_ms, volumes=listed)

    async def _cluster_volumes(self, apps: set[str]) -> ClusterVolumes:
        sizes: dict[str, int] = {}
        complete = True
        for app in sorted(apps):
            listed, whole = await self._volumes.listing(app)
            sizes.update({vol.id: vol.size_gb for vol in listed})
            complete = complete and whole
        return ClusterVolumes(sizes, self._volumes.listed_for(complete))

    async def _apps_of(self, record: QuotaRecord) -> set[str]:
        if record.scope == "app":
            return {record.name}
        created = await (await self._apps()).all()
        apps = {r.name for r in created if r.org_slug == record.name}
        if record.name == DEFAULT_ORG:  # apps never created (only machines): the default org
            names = {r.name for r in created}
            apps |= {c.app for c in self._view.store.apps() if c.app not in names}
        return apps

    async def _cluster_machines(self, app: str) -> list[ClusterMachine]:
        """The app's machines: those the view still holds (destroyed ones too), then the live
        ones as the broker lists them (``live_rows``: the view once complete, else every
        worker)."""
        rows = self._view.store.app_rows(app, destroyed=True)
        rows += await self._live_rows(app)
        machines = {m.id: m for m in (Machine.model_validate_json(body) for _, body in rows)}
        return [
            ClusterMachine(
                machine_id=machine.id,
                app=machine.app,
                request_id=machine.placement.request_id if machine.placement else "",
                use=use_of_machine(machine),
                destroyed=machine.state is MachineState.DESTROYED,
                priority_class=machine.config.priority_class.value,
            )
            for machine in machines.values()
        ]


def quota_exceeded(over: Excess) -> QuotaExceeded:
    return QuotaExceeded(
        over.message(),
        hint=f"destroy machines or volumes of {over.scope} {over.name}, or ask an operator to "
        f"raise its quota (`souq quota show {over.name}`)",
        details={
            "scope": over.scope,
            "name": over.name,
            "quota": over.quota,
            "resource": over.dimension,
            "class": over.priority_class,
            "limit": over.limit,
            "use": over.use,
            "asked": over.asked,
        },
    )
