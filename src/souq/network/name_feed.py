"""From the cluster view to the name index: what each machine's row now says of its names.

The worker keeps a replica of the cluster view (:class:`souq.view.ClusterView`: machine events
as they come, anti-entropy behind them; the proxy's machinery, not a second feed). Each time a
machine's row changes the view says so (``on_change``), and :class:`NameFeed` reads the record
again and puts what the names need of it in the :class:`~souq.network.names.NameIndex`
(:func:`name_row`), or takes it out once it is destroyed or gone. Answers are made from the
index alone: no lookup per query.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable
from dataclasses import replace

from souq.model import Machine, MachineState
from souq.model.app import DEFAULT_ORG
from souq.network.names import NameIndex, NameRow, Scope
from souq.view.rows import RowFollower

__all__ = ["NameFeed", "ScopeOf", "default_scope", "name_row", "private_address"]

ScopeOf = Callable[[str], Scope]  # an app's private network


def default_scope(app: str) -> Scope:
    """Souq has one organisation until apps say otherwise: every app is on its network."""
    return Scope(DEFAULT_ORG)


def private_address(value: str | None) -> str | None:
    """A machine's ``private_ip`` as the names give it: an IPv6 address in its shortest form,
    or None (absent, empty, or not IPv6: a worker's IPv4 host is no private address)."""
    if not value:
        return None
    try:
        address = ipaddress.ip_address(value)
    except ValueError:
        return None
    return address.compressed if address.version == 6 else None


def _healthy(machine: Machine) -> bool:
    """No check of it failing (``critical``), as its record in the view says. A check not run
    yet (``warning``) counts as healthy: the view has a record's check statuses as of its last
    refresh (a check's change is not an event of its own), so an unknown status must not sink
    every machine with checks below those without."""
    return not any(check.status == "critical" for check in machine.checks)


def name_row(machine: Machine, scope: Scope) -> NameRow | None:
    """What the names need of ``machine``; None once it is destroyed."""
    if machine.state == MachineState.DESTROYED:
        return None
    return NameRow(
        machine_id=machine.id,
        app=machine.app,
        region=machine.region,
        state=machine.state.value,
        healthy=_healthy(machine),
        private_ip=private_address(machine.private_ip),
        created_at=machine.created_at,
        scope=scope,
        network=machine.address.network if machine.address is not None else "",
    )


class NameFeed(RowFollower):
    """Keeps ``index`` in step with the view: :meth:`changed` after a machine's row changed
    (the view's ``on_change``). ``read`` gives the view's record of a machine (None: destroyed
    or unknown); ``scope_of`` an app's private network."""

    reader = "the names"

    def __init__(
        self,
        index: NameIndex,
        read: Callable[[str], Machine | None],
        *,
        scope_of: ScopeOf = default_scope,
    ) -> None:
        self.index = index
        self._read = read
        self.scope_of = scope_of
        self.changes = 0  # rows changed (a counter for metrics and tests)

    def follow(self, machine_id: str, machine: Machine | None) -> None:
        self.changes += 1
        row = None if machine is None else name_row(machine, self.scope_of(machine.app))
        if row is None:
            self.index.remove(machine_id)
        else:
            self.index.put(row)

    def app_changed(self, app: str) -> None:
        """The app's network may have changed (its record did): its machines move with it."""
        scope = self.scope_of(app)
        for row in self.index.machines_of(app):
            if row.scope != scope:
                self.index.put(replace(row, scope=scope))
