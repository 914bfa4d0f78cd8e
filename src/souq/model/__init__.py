"""Souq's typed data. Pure: imports nothing that does I/O.

The exports load lazily (each from its module, on first use), so a command or a pure module
that needs one record never pays for all of them."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from souq.model.app import App, AppDeleted, AppList
    from souq.model.base import Input, Record
    from souq.model.constraint import Constraint, ConstraintOperator
    from souq.model.image import ImageRecord
    from souq.model.job import Job, JobStopped, JobSubmit, Registration
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
    from souq.model.machine_tools import ExecReply, ProcessStat
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
        Lease,
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
    from souq.model.release import NewRelease, Release, ReleaseState
    from souq.model.resources import Resources
    from souq.model.secrets import SecretInfo
    from souq.model.services import Check, Concurrency, MachineAddress, Service, ServicePort
    from souq.model.tokens import AuditRecord, NewToken, TokenInfo, TokenKey
    from souq.model.volume import ExtendVolumeResponse, Volume
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
    "App",
    "AppDeleted",
    "AppList",
    "AuditRecord",
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
    "ExecReply",
    "ExtendVolumeResponse",
    "Fingerprint",
    "GuestConfig",
    "Heartbeat",
    "HoldRequest",
    "ImageRecord",
    "Input",
    "Job",
    "JobStopped",
    "JobSubmit",
    "Lease",
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
    "NewRelease",
    "NewToken",
    "Offer",
    "OfferOutcome",
    "OfferRequest",
    "OpRecord",
    "Placement",
    "PlacementDefaults",
    "PlacementPolicy",
    "ProcessStat",
    "Quote",
    "QuoteRef",
    "QuoteState",
    "Record",
    "Registration",
    "Release",
    "ReleaseState",
    "Reply",
    "Resources",
    "RestartConfig",
    "RestartPolicy",
    "SecretInfo",
    "Service",
    "ServicePort",
    "SignalCommand",
    "StopCommand",
    "StopConfig",
    "Timings",
    "TokenInfo",
    "TokenKey",
    "Volume",
    "WaitCommand",
    "WorkerDigest",
    "WorkerInfo",
    "WorkerState",
    "WorkerUsage",
    "normalise_signal",
]

# Where each export lives: the module, and the names it hands on.
_WHERE = {
    name: module
    for module, names in (
        ("souq.model.app", "App AppDeleted AppList"),
        ("souq.model.base", "Input Record"),
        ("souq.model.constraint", "Constraint ConstraintOperator"),
        ("souq.model.image", "ImageRecord"),
        ("souq.model.job", "Job JobStopped JobSubmit Registration"),
        (
            "souq.model.machine",
            "APP_NAME_PATTERN GuestConfig Machine MachineConfig MachineEvent MachineState "
            "OpRecord RestartConfig RestartPolicy StopConfig normalise_signal",
        ),
        ("souq.model.machine_tools", "ExecReply ProcessStat"),
        ("souq.model.placement", "ClaimAttempt OfferOutcome Placement Timings"),
        ("souq.model.policy", "Curves PlacementDefaults PlacementPolicy"),
        (
            "souq.model.protocol",
            "ClaimRequest CordonCommand DestroyCommand DigestCommand DrainCommand EventsCommand "
            "HoldRequest Lease ListCommand LocateCommand LocateReply LogsCommand LogsReply "
            "MachineEventMessage MachineRef Offer OfferRequest Quote QuoteRef QuoteState Reply "
            "SignalCommand StopCommand WaitCommand WorkerDigest",
        ),
        ("souq.model.release", "NewRelease Release ReleaseState"),
        ("souq.model.resources", "Resources"),
        ("souq.model.secrets", "SecretInfo"),
        ("souq.model.services", "Check Concurrency MachineAddress Service ServicePort"),
        ("souq.model.tokens", "AuditRecord NewToken TokenInfo TokenKey"),
        ("souq.model.volume", "ExtendVolumeResponse Volume"),
        ("souq.model.worker", "Fingerprint Heartbeat Load WorkerInfo WorkerState WorkerUsage"),
    )
    for name in names.split()
}


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        value = getattr(importlib.import_module(_WHERE[name]), name)
        globals()[name] = value  # found once
        return value
    raise AttributeError(f"module 'souq.model' has no attribute {name!r}")
