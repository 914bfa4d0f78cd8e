"""The machine records the agent sends most, as JSON, each config and placement record encoded
once.

A claim's config and placement record (most of a machine record's bytes: the placement alone is
about 1.7 kB with eight offers) were encoded three times: into the store, into the reply and
into the launch event. Here a machine record is encoded without them, and they are embedded as
``json_of`` gives them (:class:`msgspec.Raw`: written as they are, not parsed again), which is
the store's :meth:`~souq.agent.state.store.Store.json_of`: the very text it recorded, remembered
for the same objects. The result is the JSON object that ``model_dump_json()`` makes, its keys in
another order.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import msgspec
from pydantic import BaseModel

from souq.model.machine import Machine
from souq.model.protocol import MachineEventMessage

__all__ = ["JsonOf", "dump", "event_json", "machine_json"]

JsonOf = Callable[[BaseModel], str]
_MACHINE_PARTS = {"config", "placement"}
_MESSAGE_PARTS = {"machine"}
_ENCODER = msgspec.json.Encoder()


def dump(model: BaseModel) -> str:
    """A ``json_of`` that remembers nothing."""
    return model.model_dump_json()


def _record(machine: Machine, json_of: JsonOf, placement: bool) -> dict[str, Any]:
    record = machine.placement if placement else None
    fields = machine.model_dump(mode="json", exclude=_MACHINE_PARTS)
    fields["config"] = msgspec.Raw(json_of(machine.config).encode())
    fields["placement"] = None if record is None else msgspec.Raw(json_of(record).encode())
    return fields


def machine_json(machine: Machine, json_of: JsonOf = dump, *, placement: bool = True) -> bytes:
    """``machine`` as JSON, with its config and placement as ``json_of`` encodes them
    (``placement=False``: the placement left out, as ``null``)."""
    return _ENCODER.encode(_record(machine, json_of, placement))


def event_json(msg: MachineEventMessage, json_of: JsonOf = dump) -> bytes:
    """An event message as JSON; the machine record it may carry as :func:`machine_json`."""
    if msg.machine is None:
        return msg.model_dump_json().encode()
    fields = msg.model_dump(mode="json", exclude=_MESSAGE_PARTS)
    fields["machine"] = _record(msg.machine, json_of, True)
    return _ENCODER.encode(fields)
