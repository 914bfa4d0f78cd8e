"""Finding an exchange a machine when the fast path could not, or when the first one failed.

* :func:`connect`: wait for a machine (:class:`~souq.proxy.admission.Admission`), then take an
  idle connection to it or open one; a machine that refuses the connection (or does not
  accept it in time) is replaced by another, up to :data:`CONNECT_TRIES` machines. Nothing
  was sent yet, so this holds for every method.
* :func:`retry_slot`: a machine failed before the client got a byte of its answer; an
  idempotent request whose body was kept goes once more, to another machine, or to the same
  one on a new connection when the failed one was a kept-alive connection the machine had
  already closed.
* :func:`replay_slot`: the machine answered ``souq-replay``: the machine it names, or one in
  the region it names, takes the request (once), if it can at once.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from souq.errors import SouqError
from souq.proxy.errors import MachineError, NoMachines
from souq.proxy.exchange import Exchange
from souq.proxy.table import Slot
from souq.proxy.upstream import Replay, UpstreamConnection

if TYPE_CHECKING:
    from souq.proxy.downstream import ClientConnection
    from souq.proxy.relay import Relay

__all__ = [
    "CONNECT_TRIES",
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


async def connect(
    relay: Relay, ex: Exchange, slot: Slot | None, *, fresh: bool = False
) -> tuple[Slot, UpstreamConnection]:
    """A machine for ``ex`` (claimed) and a connection to it; raises a :class:`SouqError` to
    answer with. ``fresh`` skips the idle connections."""
    app = ex.app
    assert app is not None
    try:
        if slot is None:
            slot = await relay.admission.claim(
                app, relay.loop.time() + relay.config.queue_timeout_s
            )
        conn = None if fresh else relay.pool.checkout(slot.address)
        refused: list[str] = []
        tries = CONNECT_TRIES if ex.attempts == 0 else 0  # a retry's connect is not retried
        while conn is None:
            try:
                conn = await relay.pool.connect(slot.address)
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
                if slot is None:
                    raise MachineError.of(failed.machine_id, app, what) from None
    except BaseException:
        if slot is not None:
            relay.admission.release(slot)
        raise
    return slot, conn


def retry_slot(
    relay: Relay, ex: Exchange, machine_id: str, reused: bool
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


def replay_slot(relay: Relay, ex: Exchange, target: Replay, origin: str) -> Slot:
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
    client: ClientConnection, ex: Exchange, slot: Slot | None, *, fresh: bool = False
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


def retry_or_fail(
    client: ClientConnection, ex: Exchange, conn: UpstreamConnection, what: str
) -> None:
    """The machine behind ``conn`` failed ``ex`` before the client got a byte."""
    ex.upstream = None
    slot = client.release(ex)
    machine_id = slot.machine_id if slot is not None else "?"
    retry, fresh = retry_slot(client.relay, ex, machine_id, conn.uses > 1)
    if retry is not None:
        client.later(ex, retry, fresh=fresh)
    else:
        client.answer(ex, MachineError.of(machine_id, ex.app or "?", what))


def replay(client: ClientConnection, ex: Exchange, target: Replay) -> None:
    """Send ``ex`` where the machine's ``souq-replay`` said."""
    ex.upstream = None
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
