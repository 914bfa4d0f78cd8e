"""Leases on machines: whoever holds a machine's lease changes it alone.

A lease lasts ``ttl_s`` (its holder extends it with its nonce before then) and is kept in the
agent's store, so an agent restart keeps it. While it lasts every change of the machine (start,
stop, restart, suspend, signal, update, destroy) must bring its nonce: ``lease_held`` (409)
otherwise, naming when it ends and who holds it; the edge proxy's start for traffic (``wake``:
a wake-up for a request, a standby's failover) alone goes through, so a deploy's leases never
take an app offline. A deploy takes the leases of the machines it
changes, so a second deploy at the same time fails clearly instead of interleaving. Destroying
the machine ends its lease.
"""

from __future__ import annotations

import secrets

from souq.agent.state.hold_rows import LeaseRows
from souq.agent.state.store import Store
from souq.clock import Clock, iso_from_ms
from souq.errors import LeaseHeld, NotFound
from souq.model.protocol import Lease

__all__ = ["Leases"]


class Leases:
    def __init__(self, store: Store, clock: Clock) -> None:
        self._rows = LeaseRows(store)
        self._clock = clock
        self._leases: dict[str, Lease] = {lease.machine_id: lease for lease in self._rows.all()}

    def live(self, machine_id: str) -> Lease | None:
        """The machine's lease, if one lasts still."""
        lease = self._leases.get(machine_id)
        if lease is None or lease.expires_at <= self._clock.now_ms():
            return None
        return lease

    def take(self, machine_id: str, ttl_s: float, description: str, nonce: str | None) -> Lease:
        """A new lease, or the live one extended when ``nonce`` is its nonce; ``lease_held``
        when another lease lasts."""
        now = self._clock.now_ms()
        held = self.live(machine_id)
        if held is not None and nonce != held.nonce:
            raise self._held(held)
        lease = Lease(
            machine_id=machine_id,
            nonce=held.nonce if held else secrets.token_hex(16),
            expires_at=now + int(ttl_s * 1000),
            description=description if description or held is None else held.description,
            version=held.version + 1 if held else 1,
        )
        self._rows.put(lease)
        self._leases[machine_id] = lease
        return lease

    def release(self, machine_id: str, nonce: str | None) -> Lease:
        """End the live lease (its nonce needed); ``not_found`` when none lasts."""
        held = self.live(machine_id)
        if held is None:
            raise NotFound(f"machine {machine_id} has no lease", hint="take one first")
        if nonce != held.nonce:
            raise self._held(held)
        self.drop(machine_id)
        return held

    def check(self, machine_id: str, nonce: str | None) -> None:
        """Raise ``lease_held`` when a lease lasts and ``nonce`` is not its nonce."""
        held = self.live(machine_id)
        if held is not None and nonce != held.nonce:
            raise self._held(held)

    def drop(self, machine_id: str) -> None:
        if self._leases.pop(machine_id, None) is not None:
            self._rows.drop(machine_id)

    @staticmethod
    def _held(lease: Lease) -> LeaseHeld:
        who = f" ({lease.description})" if lease.description else ""
        return LeaseHeld(
            f"machine {lease.machine_id} is leased{who} until {iso_from_ms(lease.expires_at)}",
            hint="send the lease's nonce in the souq-lease-nonce header, or wait for it to end",
            details={"expires_at": lease.expires_at},
        )
