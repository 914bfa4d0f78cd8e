"""The bus messages a create sends most, as their readers decode them: msgspec structs, read in
one pass, with what a reader may not need left as the JSON it came as (:class:`msgspec.Raw`).

A machine's launch event carries its whole record (config and placement: most of its bytes) so
that a view learns a new machine from its events alone. But the broker that made the machine
has its record already (the claim's answer, which its view applies first, holding the events
until then: :mod:`souq.view.held`): validating it again from the event cost about seven times
the rest of the event. :class:`MachineEventNote` is
:class:`~souq.model.protocol.MachineEventMessage` as the view reads it: the record stays undecoded
until :meth:`MachineEventNote.record_version` says it is newer than what the view holds, and is
then validated once (:meth:`MachineEventNote.record`).

The wire is the same: a note is decoded from what the agent encodes (``souq.agent.wire``), and
keys a newer peer added are dropped, as everywhere (:mod:`souq.model.base`).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

import msgspec

from souq.errors import InvalidInput
from souq.model.base import FROM_PEER, as_peer
from souq.model.machine import Machine, MachineEvent, MachineState
from souq.model.protocol import MachineEventMessage

__all__ = ["MachineEventNote", "decode_notes", "note_of"]


class _Stamp(msgspec.Struct):
    timestamp: int


class _Made(msgspec.Struct):
    request_id: str = ""


class _Head(msgspec.Struct):
    """What of a machine record says how new it is (souq.view.store.version_of), and which
    create made it."""

    updated_at: str
    events: list[_Stamp] = []
    placement: _Made | None = None


_HEAD = msgspec.json.Decoder(_Head)


def _decoded(kind: type, obj: Any) -> Any:
    if kind is MachineEvent:
        with as_peer():
            return MachineEvent.model_validate(obj, extra=FROM_PEER)
    raise NotImplementedError(f"no decoding for {kind!r}")


class MachineEventNote(msgspec.Struct, frozen=True):
    """A machine event as the cluster view reads it (``souq.evt.<region>.<worker>``)."""

    machine_id: str
    app: str
    worker_id: str
    region: str
    state: MachineState
    event: MachineEvent
    machine_json: msgspec.Raw = msgspec.field(default=msgspec.Raw(), name="machine")

    @property
    def carries_record(self) -> bool:
        raw = self.machine_json
        return bool(raw) and not (len(raw) == 4 and bytes(raw) == b"null")

    def record_version(self) -> int:
        """The version of the record it carries (the newest time, in ms, it speaks for),
        read without decoding the record."""
        head = _HEAD.decode(self.machine_json)
        updated = int(datetime.fromisoformat(head.updated_at).timestamp() * 1000)
        return max(updated, *(e.timestamp for e in head.events)) if head.events else updated

    def made_by(self) -> str:
        """The request id of the create that made the machine of the record it carries ("":
        none said), read without decoding the record."""
        placement = _HEAD.decode(self.machine_json).placement
        return "" if placement is None else placement.request_id

    def record(self) -> Machine:
        """The record it carries, validated (call once: nothing is kept)."""
        with as_peer():
            return Machine.model_validate_json(bytes(self.machine_json), extra=FROM_PEER)


_NOTE = msgspec.json.Decoder(MachineEventNote, dec_hook=_decoded)
_NOTES = msgspec.json.Decoder(list[MachineEventNote], dec_hook=_decoded)


def decode_notes(data: bytes) -> list[MachineEventNote]:
    """One event message or a worker's batch of them (a JSON array, souq.bus.codec.encode_many);
    a malformed one is :class:`InvalidInput`."""
    try:
        if data.lstrip()[:1] == b"[":
            return _NOTES.decode(data)
        return [_NOTE.decode(data)]
    except msgspec.DecodeError as exc:
        raise InvalidInput(f"malformed MachineEventMessage: {exc}") from exc


def note_of(msg: MachineEventMessage) -> MachineEventNote:
    """An event message as its reader gets it (what the bus would carry: tests, in-process)."""
    return _NOTE.decode(msg.model_dump_json())
