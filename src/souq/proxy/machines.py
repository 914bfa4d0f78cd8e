"""From the cluster view to the routing table: which machines the proxy can send requests to.

The proxy keeps a replica of the cluster view (:class:`souq.view.ClusterView`, fed by every
worker's machine events and healed by anti-entropy: no polling). Each time a machine's row
changes, :class:`MachineFeed` reads the record again and tells the table what it now is
(:func:`backend_of`), or that it is gone. Only machines that serve are in the table: those with
a service whose ports have the ``http`` handler (the first such service is the one the proxy's
port routes to) or, failing that, a raw TCP service with an edge port of its own, and an address
the worker gave them.

The feed also keeps, for the standby failover (:mod:`souq.proxy.standby`), which stopped
machines stand by for which others.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from souq.model import Machine, Service
from souq.model.machine import preempted_event
from souq.proxy.table import Backend, RoutingTable
from souq.view.rows import RowFollower

__all__ = ["MachineFeed", "backend_of", "http_service", "port_at", "tcp_service"]


def http_service(machine: Machine) -> Service | None:
    """The service the proxy's HTTP port routes to: the first with the ``http`` handler."""
    for service in machine.config.services:
        if any("http" in p.handlers for p in service.ports):
            return service
    return None


def tcp_service(machine: Machine) -> tuple[Service, int] | None:
    """For a machine that serves no HTTP: its first service with an edge port and no handler
    (raw TCP, piped as it is), and that edge port."""
    for service in machine.config.services:
        for port in service.ports:
            if not port.handlers and port.port is not None:
                return service, port.port
    return None


def port_at(machine: Machine, internal_port: int) -> int | None:
    """The port the proxy reaches ``internal_port`` of the machine at, on its backend's host."""
    address = machine.address
    reached = None if address is None else address.reached_at(internal_port)
    return None if reached is None else reached[1]


def backend_of(machine: Machine) -> Backend | None:
    """The machine as the routing table sees it (its HTTP service's, else its raw TCP
    service's port), or None when it serves neither. One that preemption displaced is not
    started for a request (``autostart`` off until it starts again): its start takes room again,
    which its app's quota counts first, and only the API's start asks it."""
    service = http_service(machine)
    if service is None and (tcp := tcp_service(machine)) is not None:
        service = tcp[0]
    address = machine.address
    if service is None or address is None:
        return None
    reached = address.reached_at(service.internal_port)
    if reached is None:
        return None
    return Backend(
        machine_id=machine.id,
        app=machine.app,
        region=machine.region,
        host=reached[0],
        port=reached[1],
        worker_id=machine.worker_id,
        state=machine.state.value,
        kind=service.concurrency.type,
        soft_limit=service.concurrency.soft_limit,
        hard_limit=service.concurrency.hard_limit,
        autostart=service.autostart and preempted_event(machine) is None,
        cordoned=machine.cordoned,
    )


class MachineFeed(RowFollower):
    """Keeps ``table`` in step with the view: call :meth:`changed` with a machine's id after its
    row changed (the view's ``on_change``), and :meth:`seen` with a record fresh from a worker.
    ``read`` gives the view's record of a machine (None: destroyed or unknown)."""

    reader = "the proxy"

    def __init__(
        self,
        table: RoutingTable,
        read: Callable[[str], Machine | None],
        *,
        on_backend: Callable[[Machine, Backend | None], None] | None = None,
    ) -> None:
        self.table = table
        self._read = read
        self._on_backend = on_backend
        self.machines: dict[str, Machine] = {}  # the records behind the table's backends
        self.standbys: dict[str, set[str]] = {}  # machine id -> the standbys for it

    def follow(self, machine_id: str, machine: Machine | None) -> None:
        if machine is None:
            self._forget(machine_id)
        else:
            self.seen(machine)

    def seen(self, machine: Machine) -> None:
        """A record of ``machine`` (from the view, or the answer of a start)."""
        backend = backend_of(machine)
        if backend is None:
            self._forget(machine.id)
            return
        old = self.table.get(machine.id)
        if old is not None and old.state == backend.state and not old.healthy:
            # Health is the checker's to say, until the process is a new one.
            backend = replace(backend, healthy=False)
        self.machines[machine.id] = machine
        self._index_standby(machine)
        self.table.upsert(backend)
        if self._on_backend is not None:
            self._on_backend(machine, backend)

    def _forget(self, machine_id: str) -> None:
        machine = self.machines.pop(machine_id, None)
        if machine is None:
            return
        for primary in machine.config.standbys:
            waiting = self.standbys.get(primary)
            if waiting is not None:
                waiting.discard(machine_id)
                if not waiting:
                    del self.standbys[primary]
        self.table.remove(machine_id)
        if self._on_backend is not None:
            self._on_backend(machine, None)

    def _index_standby(self, machine: Machine) -> None:
        for primary in machine.config.standbys:
            self.standbys.setdefault(primary, set()).add(machine.id)

    def on_worker(self, worker_id: str) -> list[Machine]:
        """The machines the proxy routes to on ``worker_id``."""
        return [m for m in self.machines.values() if m.worker_id == worker_id]
