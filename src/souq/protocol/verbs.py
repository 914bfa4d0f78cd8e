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
PROTOCOL_MINOR = 5

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


OFFER = _verb(
    "offer", msg.OfferRequest, msg.Offer, "what the worker can offer a machine of this size"
)
CLAIM = _verb(
    "claim", msg.ClaimRequest, Machine, "reserve the capacity and make the machine, atomically"
)
CLAIM_BATCH = _verb(
    "claim_batch", BatchClaimRequest, BatchClaimReply, "several machines of one config, all or none"
)
GET = _verb("get", msg.MachineRef, Machine, "one machine's record")
START = _verb("start", msg.StartCommand, Machine, "start a machine")
STOP = _verb("stop", msg.StopCommand, Machine, "send the stop signal")
SUSPEND = _verb(
    "suspend", msg.MachineRef, Machine, "freeze a started machine (a start resumes it)", since=2
)
RESTART = _verb(
    "restart", msg.StopCommand, Machine, "stop, then start again; answered once started"
)
SIGNAL = _verb("signal", msg.SignalCommand, Machine, "send a signal to the machine's process")
UPDATE = _verb(
    "update", msg.UpdateCommand, Machine, "replace a machine's config on its worker", since=3
)
LEASE = _verb("lease", msg.LeaseRequest, msg.Lease, "take or extend a machine's lease", since=3)
LEASE_GET = _verb("lease_get", msg.MachineRef, msg.Lease, "a machine's live lease", since=3)
LEASE_RELEASE = _verb(
    "lease_release", msg.MachineRef, msg.Lease, "end a machine's lease (its nonce)", since=3
)
DESTROY = _verb("destroy", msg.DestroyCommand, Machine, "destroy and release the reservation")
WAIT = _verb("wait", msg.WaitCommand, Machine, "answer once the machine reaches a state")
LOGS = _verb("logs", msg.LogsCommand, msg.LogsReply, "output from an offset")
EVENTS = _verb(
    "events", msg.EventsCommand, list[MachineEvent], "every event of a machine, newest first"
)
OPS = _verb("ops", msg.MachineRef, list[OpRecord], "the machine's op log, oldest first")
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
EXEC = _verb(
    "exec", ExecCommand, ExecReply, "run a command in a started machine's context", since=4
)
PS = _verb("ps", msg.MachineRef, list[ProcessStat], "a started machine's processes", since=4)
METADATA = _verb(
    "metadata", MetadataCommand, dict[str, str], "set or delete one metadata key", since=4
)
MACHINE_CORDON = _verb(
    "machine_cordon",
    MachineCordonCommand,
    Machine,
    "take a machine out of the proxies' rotation, or back in",
    since=4,
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
