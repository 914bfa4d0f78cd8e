"""The machine records the agent sends most, as JSON, each config and placement record encoded
once.

A claim's config and placement record (most of a machine record's bytes: the placement alone is
about 1.7 kB with eight offers) were encoded three times: into the store, into the reply and
into the launch event. Here a machine record is encoded without them, and they are spliced in as
``json_of`` gives them, which is the store's :meth:`~souq.agent.state.store.Store.json_of`: the very
text it recorded, remembered for the same objects. The result is the JSON object that
``model_dump_json()`` makes, its keys in another order.
"""

from __future__ import annotations

from collections.abc import Callable

from pydantic import BaseModel

from souq.model.machine import Machine
from souq.model.protocol import MachineEventMessage

__all__ = ["JsonOf", "dump", "event_json", "machine_json"]

JsonOf = Callable[[BaseModel], str]
_MACHINE_PARTS = {"config", "placement"}
_MESSAGE_PARTS = {"machine"}


def dump(model: BaseModel) -> str:
    """A ``json_of`` that remembers nothing."""
    return model.model_dump_json()


def machine_json(machine: Machine, json_of: JsonOf = dump, *, placement: bool = True) -> str:
    """``machine`` as JSON, with its config and placement as ``json_of`` encodes them
    (``placement=False``: the placement left out, as ``null``)."""
    record = machine.placement if placement else None
    placement_json = "null" if record is None else json_of(record)
    rest = machine.model_dump_json(exclude=_MACHINE_PARTS)
    return f'{rest[:-1]},"config":{json_of(machine.config)},"placement":{placement_json}}}'


def event_json(msg: MachineEventMessage, json_of: JsonOf = dump) -> str:
    """An event message as JSON; the machine record it may carry as :func:`machine_json`."""
    if msg.machine is None:
        return msg.model_dump_json()
    rest = msg.model_dump_json(exclude=_MESSAGE_PARTS)
    return f'{rest[:-1]},"machine":{machine_json(msg.machine, json_of)}}}'
