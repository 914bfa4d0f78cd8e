"""Finding an exchange a machine when the fast path could not, or when the first one failed.

* :func:`connect`: wait for a machine (:class:`~souq.proxy.admission.Admission`), then take an
  idle connection to it or open one; a machine that refuses the connection (or does not
  accept it in time) is replaced by another, up to :data:`CONNECT_TRIES` machines. Nothing
  was sent yet, so this holds for every method. When no other can take it and the machine
  that refused was not yet seen listening since it started (its server may still be binding
  its port), its port is waited for within the request's deadline, as a wake-up waits for a
  machine it started (:func:`~souq.proxy.wake.port_accepts`), and it is tried again.
* :func:`retry_slot`: a machine failed before the client got a byte of its answer; an
  idempotent request whose body was kept goes once more, to another machine, or to the same
  one on a new connection when the failed one was a kept-alive connection the machine had
  already closed.
* :func:`replay_slot`: the machine answered ``souq-replay``: the machine it names, or one in
  the region it names, takes the request (once), if it can at once.

These stand on the relay's core (:class:`~souq.proxy.core.RelayCore`); the client's connection
calls them, and is known here only as the :class:`Client` the slow path answers through.
"""

from __future__ import annotations

from typing import Protocol

from souq.errors import SouqError
from souq.proxy.core import RelayCore
from souq.proxy.errors import MachineError, NoMachines
from souq.proxy.exchange import Exchange, Replay
from souq.proxy.table import Slot
from souq.proxy.upstream import UpstreamConnection
from souq.proxy.wake import port_accepts

__all__ = [
    "CONNECT_TRIES",
    "Client",
    "connect",
    "replay",
    "replay_slot",
    "retry_or_fail",
    "retry_slot",
    "serve_later",
]

# Machines tried after the first one refused the connection (or did not accept it in time):
# nothing was sent, so this holds for every method. A machine just started may not listen yet
# (a deploy's new machines, before their checks pass), a stopped one no longer does.
CONNECT_TRIES = 4
_LISTEN_SLICE_S = 0.25  # waiting for a port: how often the table is looked at again


class Client(Protocol):
    """A client's connection as the slow path sees it (the one is
    :class:`~souq.proxy.downstream.ClientConnection`)."""

    relay: RelayCore

    def attach(self, ex: Exchange, slot: Slot, conn: UpstreamConnection) -> None: ...
    def later(self, ex: Exchange, slot: Slot | None, *, fresh: bool = False) -> None: ...
    def answer(self, ex: Exchange, err: SouqError) -> None: ...
    def release(self, ex: Exchange) -> Slot | None: ...


async def connect(
    relay: RelayCore, ex: Exchange, slot: Slot | None, *, fresh: bool = False
) -> tuple[Slot, UpstreamConnection]:
    """A machine for ``ex`` (claimed) and a connection to it; raises a :class:`SouqError` to
    answer with. ``fresh`` skips the idle connections."""
    app = ex.app
    assert app is not None
    deadline = relay.loop.time() + relay.config.queue_timeout_s
    try:
        if slot is None:
            slot = await relay.admission.claim(app, deadline)
        conn = None if fresh else relay.pool.checkout(slot.address)
        refused: list[str] = []
        tries = CONNECT_TRIES if ex.attempts == 0 else 0  # a retry's connect is not retried
        waited: set[str] = set()  # the machines whose port was waited for
        while conn is None:
            try:
                conn = await relay.pool.connect(slot.address)
                slot.listened = True
            except (OSError, TimeoutError) as err:
                failed, slot = slot, None
                relay.admission.release(failed)
                refused.append(failed.machine_id)
                what = (
                    "did not accept a connection in time"
                    if isinstance(err, TimeoutError)
                    else f"refused the connection ({err.strerror or err})"
                )
                if len(refused) <= tries:
                    ex.attempts = 1
                    slot = relay.table.claim(app, relay.region, exclude=tuple(refused))
                if slot is None and not failed.listened and failed.machine_id not in waited:
                    waited.add(failed.machine_id)
                    if await _until_listening(relay, failed, deadline):
                        slot = relay.table.claim_machine(failed.machine_id)
                if slot is None:
                    raise MachineError.of(failed.machine_id, app, what) from None
    except BaseException:
        if slot is not None:
            relay.admission.release(slot)
        raise
    return slot, conn


async def _until_listening(relay: RelayCore, slot: Slot, deadline: float) -> bool:
    """Whether ``slot``'s machine accepts a connection before ``deadline`` while the table
    still has it serving (not stopped, removed or drained meanwhile)."""
    loop = relay.loop
    host, port = slot.address
    while loop.time() < deadline:
        if not slot.serving or relay.table.get(slot.machine_id) is None:
            return False
        if await port_accepts(host, port, min(deadline, loop.time() + _LISTEN_SLICE_S)):
            return True
    return False


def retry_slot(
    relay: RelayCore, ex: Exchange, machine_id: str, reused: bool
) -> tuple[Slot | None, bool]:
    """Where ``ex`` goes after ``machine_id`` failed it: (a claimed slot, whether to use a new
    connection), or (None, False) for no retry."""
    app = ex.app
    if app is None or ex.attempts > 0 or not ex.replayable or not ex.idempotent:
        return None, False
    ex.attempts = 1
    retry = relay.table.claim(app, relay.region, exclude=(machine_id,))
    if retry is None and reused:
        # A kept-alive connection the machine had closed: the machine itself may be fine.
        return relay.table.claim_machine(machine_id), True
    return retry, False


def replay_slot(relay: RelayCore, ex: Exchange, target: Replay, origin: str) -> Slot:
    """The machine a ``souq-replay`` names, claimed; raises :class:`NoMachines`."""
    kind, value = target
    table = relay.table
    assert ex.app is not None
    if kind == "instance":
        found = table.get(value)
        slot = table.claim_machine(value) if found is not None and found.app == ex.app else None
    else:
        slot = table.claim(ex.app, value, only_region=value)
    asked = f"machine {origin} asked to replay the request to {kind} {value}"
    if slot is None:
        raise NoMachines(f"{asked}, where no machine can take it")
    if not ex.replayable:
        relay.admission.release(slot)
        raise NoMachines(f"{asked}, but its body was too large to keep")
    return slot


async def serve_later(
    client: Client, ex: Exchange, slot: Slot | None, *, fresh: bool = False
) -> None:
    """The slow path of :class:`~souq.proxy.downstream.ClientConnection`: :func:`connect`,
    then attach, or answer the error."""
    relay = client.relay
    try:
        slot, conn = await connect(relay, ex, slot, fresh=fresh)
    except SouqError as err:
        ex.task = None
        if not ex.closed:
            client.answer(ex, err)
        return
    ex.task = None
    if ex.closed:
        relay.pool.checkin(conn)
        relay.admission.release(slot)
        return
    client.attach(ex, slot, conn)


def retry_or_fail(client: Client, ex: Exchange, what: str, *, reused: bool) -> None:
    """The machine failed ``ex`` before the client got a byte (on a connection ``reused``
    from the pool, or a new one)."""
    slot = client.release(ex)
    machine_id = slot.machine_id if slot is not None else "?"
    retry, fresh = retry_slot(client.relay, ex, machine_id, reused)
    if retry is not None:
        client.later(ex, retry, fresh=fresh)
    else:
        client.answer(ex, MachineError.of(machine_id, ex.app or "?", what))


def replay(client: Client, ex: Exchange, target: Replay) -> None:
    """Send ``ex`` where the machine's ``souq-replay`` said."""
    slot = client.release(ex)
    ex.replays += 1
    try:
        new = replay_slot(client.relay, ex, target, slot.machine_id if slot else "?")
    except SouqError as err:
        client.answer(ex, err)
        return
    conn = client.relay.pool.checkout(new.address)
    if conn is not None:
        client.attach(ex, new, conn)
    else:
        client.later(ex, new)
