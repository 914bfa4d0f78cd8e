"""Every verb of the bus protocol, typed, in one registry.

A verb is a request one process sends and the reply it gets: its name (the last token of the
subject), the request's type, the reply's type, and the protocol's minor version that brought
it in. Brokers call verbs through :class:`souq.protocol.WorkerClient`; workers answer them through
a :class:`souq.protocol.Dispatcher`. Nothing else spells a verb's name.

=================  ======================  =============================  =====================
verb               request                 reply                          where
=================  ======================  =============================  =====================
``offer``          OfferRequest            Offer                          worker, region, all
``claim``          ClaimRequest            Machine                        worker
``claim_batch``    BatchClaimRequest       BatchClaimReply                worker
``get``            MachineRef              Machine                        worker
``start``          StartCommand            Machine                        worker
``stop``           StopCommand             Machine                        worker
``restart``        StopCommand             Machine                        worker
``signal``         SignalCommand           Machine                        worker
``destroy``        DestroyCommand          Machine                        worker
``wait``           WaitCommand             Machine                        worker
``logs``           LogsCommand             LogsReply                      worker
``events``         EventsCommand           list[MachineEvent]             worker
``ops``            MachineRef              list[OpRecord]                 worker
``hold``           HoldRequest             Quote                          worker
``quote``          QuoteRef                Quote                          worker
``release``        QuoteRef                Quote                          worker
``cordon``         CordonCommand           WorkerInfo                     worker
``drain``          DrainCommand            WorkerInfo                     worker
``list``           ListCommand             list[Machine]                  worker, all
``digest``         DigestCommand           WorkerDigest                   worker, all
``locate``         LocateCommand           LocateReply                    all
``exec``           ExecCommand             ExecReply                      worker
``ps``             MachineRef              list[ProcessStat]              worker
``metadata``       MetadataCommand         dict[str, str]                 worker
``machine_cordon`` MachineCordonCommand    Machine                        worker
``volume_*``       Volume... (below)       Volume, ...                    worker
``volume_list``    VolumeListCommand       list[Volume]                   worker, all
=================  ======================  =============================  =====================

**Versions.** The protocol is ``MAJOR.MINOR``. Peers of the same major version interoperate:
a message's unknown keys are dropped (``extra=FROM_PEER``, :mod:`souq.model.base`), and a verb
a peer does not know is answered with :class:`souq.errors.UnknownVerb` (``unknown_verb``). A
worker names the minor version it speaks in its heartbeats, so a broker can tell before it asks.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Generic, TypeVar

from pydantic import BaseModel, TypeAdapter

from souq.model import protocol as msg
from souq.model import volume as vol
from souq.model.base import FROM_PEER, as_peer
from souq.model.batch import BatchClaimReply, BatchClaimRequest
from souq.model.machine import Machine, MachineEvent, OpRecord
from souq.model.machine_tools import (
    ExecCommand,
    ExecReply,
    MachineCordonCommand,
    MetadataCommand,
    ProcessStat,
)
from souq.model.worker import WorkerInfo
from souq.operations import OPERATIONS, resolve

__all__ = [
    "CLAIM",
    "CLAIM_BATCH",
    "CORDON",
    "DESTROY",
    "DIGEST",
    "DRAIN",
    "EVENTS",
    "EXEC",
    "GET",
    "HOLD",
    "LEASE",
    "LEASE_GET",
    "LEASE_RELEASE",
    "LIST",
    "LOCATE",
    "LOGS",
    "MACHINE_CORDON",
    "METADATA",
    "OFFER",
    "OPS",
    "PROTOCOL_MAJOR",
    "PROTOCOL_MINOR",
    "PS",
    "QUOTE",
    "RELEASE",
    "RESTART",
    "SIGNAL",
    "START",
    "STOP",
    "SUSPEND",
    "UPDATE",
    "VERBS",
    "VOLUME_CREATE",
    "VOLUME_DESTROY",
    "VOLUME_EXTEND",
    "VOLUME_GET",
    "VOLUME_LIST",
    "VOLUME_SNAPSHOT",
    "VOLUME_SNAPSHOTS",
    "VOLUME_UPDATE",
    "WAIT",
    "Verb",
]

PROTOCOL_MAJOR = 1
# 1: heartbeats say which minor version they speak; unknown verbs are typed.
# 2: `suspend`; machines have an address (host and ports) and may be `suspended`.
# 3: `update` and leases; machines have an `instance_id`; claims and offers may name an image.
# 4: `exec`, `ps`, `metadata` and `machine_cordon`; machines may be `cordoned`.
# 5: volumes (`volume_*` verbs); a claim's config may mount one.
# 6 and later: as operations declare them (souq.operations: an operation's `since`).
PROTOCOL_MINOR = max(5, *(op.since for op in OPERATIONS))

Q = TypeVar("Q", bound=BaseModel)
A = TypeVar("A")


@dataclass(frozen=True, eq=False)
class Verb(Generic[Q, A]):
    """One verb: ``request`` goes out, a reply of type ``reply`` comes back."""

    name: str
    request: type[Q]
    reply: Any  # the reply's type: a model, or list[model]
    since: int = 0  # the protocol's minor version that brought this verb in
    doc: str = field(default="", compare=False)

    @cached_property
    def reply_adapter(self) -> TypeAdapter[A]:
        return TypeAdapter(self.reply)

    def decode_request(self, data: bytes) -> Q:
        """The request as this process knows it; unknown keys (a newer peer's) are dropped."""
        with as_peer():
            return self.request.model_validate_json(data or b"{}", extra=FROM_PEER)


VERBS: dict[str, Verb[Any, Any]] = {}


def _verb(name: str, request: type[Q], reply: type[A], doc: str, *, since: int = 0) -> Verb[Q, A]:
    verb: Verb[Q, A] = Verb(name, request, reply, since, doc)
    assert name not in VERBS, f"verb {name} defined twice"
    VERBS[name] = verb
    return verb


def _from_operations() -> None:
    """The verb of every operation on one machine (:mod:`souq.operations`), made from its
    declaration."""
    for op in OPERATIONS:
        request, reply = resolve(op.request), resolve(op.reply)
        made = VERBS.get(op.verb)
        if made is None:
            VERBS[op.verb] = Verb(op.verb, request, reply, op.since, op.doc)
        elif (made.request, made.reply, made.since) != (request, reply, op.since):
            raise AssertionError(
                f"operation {op.name}: verb {op.verb} is ({made.request.__name__}, "
                f"{made.reply}, since {made.since}), declared otherwise by another operation"
            )


def _declared(name: str, request: type[Q], reply: Any) -> Verb[Q, Any]:
    """The declared verb ``name``, checked to carry ``request`` and ``reply``."""
    verb = VERBS[name]
    assert (verb.request, verb.reply) == (request, reply), f"verb {name}: {verb} is declared"
    return verb


_from_operations()


OFFER = _verb(
    "offer", msg.OfferRequest, msg.Offer, "what the worker can offer a machine of this size"
)
CLAIM = _verb(
    "claim", msg.ClaimRequest, Machine, "reserve the capacity and make the machine, atomically"
)
CLAIM_BATCH = _verb(
    "claim_batch", BatchClaimRequest, BatchClaimReply, "several machines of one config, all or none"
)
HOLD = _verb("hold", msg.HoldRequest, msg.Quote, "hold capacity (a quote)")
QUOTE = _verb("quote", msg.QuoteRef, msg.Quote, "one quote")
RELEASE = _verb("release", msg.QuoteRef, msg.Quote, "give a quote's hold back")
CORDON = _verb("cordon", msg.CordonCommand, WorkerInfo, "cordon or uncordon the worker")
DRAIN = _verb("drain", msg.DrainCommand, WorkerInfo, "cordon the worker and stop its machines")
LIST = _verb("list", msg.ListCommand, list[Machine], "the worker's machines")
DIGEST = _verb(
    "digest", msg.DigestCommand, msg.WorkerDigest, "a hash of the worker's machines (anti-entropy)"
)
LOCATE = _verb("locate", msg.LocateCommand, msg.LocateReply, "whether the worker holds a machine")
# The verbs of the operations on one machine: declared in souq.operations (their types, docs and
# versions), made there and checked here against the types these names carry.
GET: Verb[msg.MachineRef, Machine] = _declared("get", msg.MachineRef, Machine)
START: Verb[msg.StartCommand, Machine] = _declared("start", msg.StartCommand, Machine)
STOP: Verb[msg.StopCommand, Machine] = _declared("stop", msg.StopCommand, Machine)
SUSPEND: Verb[msg.MachineRef, Machine] = _declared("suspend", msg.MachineRef, Machine)
RESTART: Verb[msg.StopCommand, Machine] = _declared("restart", msg.StopCommand, Machine)
SIGNAL: Verb[msg.SignalCommand, Machine] = _declared("signal", msg.SignalCommand, Machine)
UPDATE: Verb[msg.UpdateCommand, Machine] = _declared("update", msg.UpdateCommand, Machine)
LEASE: Verb[msg.LeaseRequest, msg.Lease] = _declared("lease", msg.LeaseRequest, msg.Lease)
LEASE_GET: Verb[msg.MachineRef, msg.Lease] = _declared("lease_get", msg.MachineRef, msg.Lease)
LEASE_RELEASE: Verb[msg.MachineRef, msg.Lease] = _declared(
    "lease_release", msg.MachineRef, msg.Lease
)
DESTROY: Verb[msg.DestroyCommand, Machine] = _declared("destroy", msg.DestroyCommand, Machine)
WAIT: Verb[msg.WaitCommand, Machine] = _declared("wait", msg.WaitCommand, Machine)
LOGS: Verb[msg.LogsCommand, msg.LogsReply] = _declared("logs", msg.LogsCommand, msg.LogsReply)
EVENTS: Verb[msg.EventsCommand, list[MachineEvent]] = _declared(
    "events", msg.EventsCommand, list[MachineEvent]
)
OPS: Verb[msg.MachineRef, list[OpRecord]] = _declared("ops", msg.MachineRef, list[OpRecord])
EXEC: Verb[ExecCommand, ExecReply] = _declared("exec", ExecCommand, ExecReply)
PS: Verb[msg.MachineRef, list[ProcessStat]] = _declared("ps", msg.MachineRef, list[ProcessStat])
METADATA: Verb[MetadataCommand, dict[str, str]] = _declared(
    "metadata", MetadataCommand, dict[str, str]
)
MACHINE_CORDON: Verb[MachineCordonCommand, Machine] = _declared(
    "machine_cordon", MachineCordonCommand, Machine
)
VOLUME_CREATE = _verb(
    "volume_create",
    vol.VolumeCreateCommand,
    vol.Volume,
    "reserve the disk and make the volume, atomically",
    since=5,
)
VOLUME_GET = _verb("volume_get", vol.VolumeRef, vol.Volume, "one volume, its use counted", since=5)
VOLUME_LIST = _verb(
    "volume_list",
    vol.VolumeListCommand,
    list[vol.Volume],
    "the worker's volumes (of an app)",
    since=5,
)
VOLUME_UPDATE = _verb(
    "volume_update", vol.VolumeUpdateCommand, vol.Volume, "change a volume's settings", since=5
)
VOLUME_EXTEND = _verb(
    "volume_extend", vol.VolumeExtendCommand, vol.ExtendVolumeResponse, "grow a volume", since=5
)
VOLUME_DESTROY = _verb(
    "volume_destroy", vol.VolumeRef, vol.Volume, "destroy a detached volume and its files", since=5
)
VOLUME_SNAPSHOT = _verb(
    "volume_snapshot", vol.VolumeRef, vol.VolumeSnapshot, "archive a volume's files now", since=5
)
VOLUME_SNAPSHOTS = _verb(
    "volume_snapshots", vol.VolumeRef, list[vol.VolumeSnapshot], "a volume's snapshots", since=5
)
