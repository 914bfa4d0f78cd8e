"""Souq's typed data. Pure: imports nothing that does I/O.

The exports load lazily (each from its module, on first use), so a command or a pure module
that needs one record never pays for all of them."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from souq.model.base import Input, Record
    from souq.model.constraint import Constraint, ConstraintOperator
    from souq.model.machine import (
        APP_NAME_PATTERN,
        GuestConfig,
        Machine,
        MachineConfig,
        MachineEvent,
        MachineState,
        OpRecord,
        RestartConfig,
        RestartPolicy,
        StopConfig,
        normalise_signal,
    )
    from souq.model.placement import ClaimAttempt, OfferOutcome, Placement, Timings
    from souq.model.policy import Curves, PlacementDefaults, PlacementPolicy
    from souq.model.protocol import (
        ClaimRequest,
        CordonCommand,
        DestroyCommand,
        DigestCommand,
        DrainCommand,
        EventsCommand,
        HoldRequest,
        ListCommand,
        LocateCommand,
        LocateReply,
        LogsCommand,
        LogsReply,
        MachineEventMessage,
        MachineRef,
        Offer,
        OfferRequest,
        Quote,
        QuoteRef,
        QuoteState,
        Reply,
        SignalCommand,
        StopCommand,
        WaitCommand,
        WorkerDigest,
    )
    from souq.model.resources import Resources
    from souq.model.services import Check, Concurrency, MachineAddress, Service, ServicePort
    from souq.model.worker import (
        Fingerprint,
        Heartbeat,
        Load,
        WorkerInfo,
        WorkerState,
        WorkerUsage,
    )

__all__ = [
    "APP_NAME_PATTERN",
    "Check",
    "ClaimAttempt",
    "ClaimRequest",
    "Concurrency",
    "Constraint",
    "ConstraintOperator",
    "CordonCommand",
    "Curves",
    "DestroyCommand",
    "DigestCommand",
    "DrainCommand",
    "EventsCommand",
    "Fingerprint",
    "GuestConfig",
    "Heartbeat",
    "HoldRequest",
    "Input",
    "ListCommand",
    "Load",
    "LocateCommand",
    "LocateReply",
    "LogsCommand",
    "LogsReply",
    "Machine",
    "MachineAddress",
    "MachineConfig",
    "MachineEvent",
    "MachineEventMessage",
    "MachineRef",
    "MachineState",
    "Offer",
    "OfferOutcome",
    "OfferRequest",
    "OpRecord",
    "Placement",
    "PlacementDefaults",
    "PlacementPolicy",
    "Quote",
    "QuoteRef",
    "QuoteState",
    "Record",
    "Reply",
    "Resources",
    "RestartConfig",
    "RestartPolicy",
    "Service",
    "ServicePort",
    "SignalCommand",
    "StopCommand",
    "StopConfig",
    "Timings",
    "WaitCommand",
    "WorkerDigest",
    "WorkerInfo",
    "WorkerState",
    "WorkerUsage",
    "normalise_signal",
]

_WHERE = {
    name: module
    for module, names in (
        (
            "souq.model.machine",
            (
                "APP_NAME_PATTERN",
                "GuestConfig",
                "Machine",
                "MachineConfig",
                "MachineEvent",
                "MachineState",
                "OpRecord",
                "RestartConfig",
                "RestartPolicy",
                "StopConfig",
                "normalise_signal",
            ),
        ),
        (
            "souq.model.services",
            (
                "Check",
                "Concurrency",
                "MachineAddress",
                "Service",
                "ServicePort",
            ),
        ),
        (
            "souq.model.placement",
            (
                "ClaimAttempt",
                "OfferOutcome",
                "Placement",
                "Timings",
            ),
        ),
        (
            "souq.model.protocol",
            (
                "ClaimRequest",
                "CordonCommand",
                "DestroyCommand",
                "DigestCommand",
                "DrainCommand",
                "EventsCommand",
                "HoldRequest",
                "ListCommand",
                "LocateCommand",
                "LocateReply",
                "LogsCommand",
                "LogsReply",
                "MachineEventMessage",
                "MachineRef",
                "Offer",
                "OfferRequest",
                "Quote",
                "QuoteRef",
                "QuoteState",
                "Reply",
                "SignalCommand",
                "StopCommand",
                "WaitCommand",
                "WorkerDigest",
            ),
        ),
        (
            "souq.model.constraint",
            (
                "Constraint",
                "ConstraintOperator",
            ),
        ),
        (
            "souq.model.policy",
            (
                "Curves",
                "PlacementDefaults",
                "PlacementPolicy",
            ),
        ),
        (
            "souq.model.worker",
            (
                "Fingerprint",
                "Heartbeat",
                "Load",
                "WorkerInfo",
                "WorkerState",
                "WorkerUsage",
            ),
        ),
        (
            "souq.model.base",
            (
                "Input",
                "Record",
            ),
        ),
        ("souq.model.resources", ("Resources",)),
    )
    for name in names
}


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        value = getattr(importlib.import_module(_WHERE[name]), name)
        globals()[name] = value  # found once
        return value
    raise AttributeError(f"module 'souq.model' has no attribute {name!r}")
