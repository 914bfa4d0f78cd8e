"""An app as a resource: the record ``POST /v1/apps`` keeps, and the ``App`` every app route
answers — Fly's Machines-API shape (``id``, ``internal_numeric_id``, ``status``,
``machine_count``, ``organization``...) with Souq's own counts beside it.

An app exists when it was created, or when it has machines (an *implicit* app: Souq, unlike Fly,
does not require a create before the first machine). Its status is derived from its machines
(:func:`app_status`), never stored. Pure: no I/O.
"""

from __future__ import annotations

import re
import zlib
from collections.abc import Iterable, Mapping
from enum import StrEnum

from pydantic import Field, field_validator, model_validator

from souq.model.base import Input, Record
from souq.model.machine import APP_NAME_PATTERN, MachineState

__all__ = [
    "DEFAULT_ORG",
    "App",
    "AppDeleted",
    "AppList",
    "AppOrganization",
    "AppRecord",
    "AppStatus",
    "MachineCounts",
    "NewApp",
    "app_name_problem",
    "app_of",
    "app_status",
    "numeric_id",
]

DEFAULT_ORG = "personal"  # Souq has no organizations: a slug is kept, and this is the default
_APP = re.compile(APP_NAME_PATTERN)
_SLUG = re.compile(r"^[a-z0-9][a-z0-9-]{0,62}$")
_RUNNING = {MachineState.STARTING, MachineState.STARTED, MachineState.STOPPING}


def app_name_problem(name: str) -> str | None:
    """Why ``name`` is not a valid app name, or None when it is (Souq's app-name rule)."""
    if _APP.match(name):
        return None
    if not name:
        return "give the app's name: 1-63 lowercase letters, digits and '-'"
    return (
        f"app name {name!r} is not valid: use 1-63 lowercase letters, digits and '-', "
        "starting with a letter or digit"
    )


class AppStatus(StrEnum):
    """Fly's meanings: ``pending`` (no machine yet), ``deployed`` (a machine runs),
    ``suspended`` (machines, none running). fly-go's ``App.Deployed()`` is true for the last two."""

    PENDING = "pending"
    DEPLOYED = "deployed"
    SUSPENDED = "suspended"


class NewApp(Input):
    """``POST /v1/apps``: what Fly's clients send. flaps sends ``name`` (and all four keys,
    always; any may be empty); Fly's Machines API reference and older flaps send ``app_name``
    instead: either names the app, and both may be given when they agree."""

    name: str = Field(
        default="", description="the app's name: 1-63 lowercase letters, digits and '-'"
    )
    app_name: str = Field(default="", description="the same, as Fly's Machines API names it")
    org_slug: str = Field(default="", description=f"kept as given (default {DEFAULT_ORG!r})")
    network: str = Field(
        default="", max_length=63, description="its machines' private network (default: its org's)"
    )
    app_role_id: str = Field(default="", max_length=63, description="kept as the app's role")

    @field_validator("name", "app_name")
    @classmethod
    def _name(cls, value: str) -> str:
        problem = app_name_problem(value) if value else None
        if problem:
            raise ValueError(problem)
        return value

    @field_validator("org_slug")
    @classmethod
    def _slug(cls, value: str) -> str:
        if value and not _SLUG.match(value):
            raise ValueError(
                f"org slug {value!r} is not valid: use 1-63 lowercase letters, digits and '-'"
            )
        return value

    @property
    def app(self) -> str:
        """The app's name, whichever key gave it."""
        return self.name or self.app_name

    @model_validator(mode="after")
    def _one_name(self) -> NewApp:
        if self.name and self.app_name and self.name != self.app_name:
            raise ValueError(
                f"name {self.name!r} and app_name {self.app_name!r} differ: "
                "give the app's name once (app_name is Fly's key for name)"
            )
        if not (self.name or self.app_name):
            raise ValueError(
                "give the app's name (name, or Fly's app_name): "
                "1-63 lowercase letters, digits and '-'"
            )
        return self


class AppRecord(Record):
    """What Souq keeps of a created app (one key of the ``souq-apps`` bucket)."""

    name: str
    id: str
    org_slug: str = DEFAULT_ORG
    network: str = ""
    app_role: str = ""
    created_at: str

    @classmethod
    def new(cls, body: NewApp, *, app_id: str, created_at: str) -> AppRecord:
        return cls(
            name=body.app,
            id=app_id,
            org_slug=body.org_slug or DEFAULT_ORG,
            network=body.network,
            app_role=body.app_role_id,
            created_at=created_at,
        )


class MachineCounts(Record):
    """An app's machines not destroyed: how many, by state, and the regions they are in."""

    machines: int = 0
    states: dict[str, int] = Field(default_factory=dict)
    regions: list[str] = Field(default_factory=list)

    @classmethod
    def of(cls, machines: Iterable[tuple[str, str]]) -> MachineCounts:
        """Counts of ``(state, region)`` pairs (destroyed ones left out)."""
        states: dict[str, int] = {}
        regions: list[str] = []
        for state, region in machines:
            if state == MachineState.DESTROYED:
                continue
            states[state] = states.get(state, 0) + 1
            if region not in regions:
                regions.append(region)
        return cls(machines=sum(states.values()), states=states, regions=regions)


class AppOrganization(Record):
    name: str
    slug: str
    internal_numeric_id: int = Field(description="a 31-bit number derived from the slug")


class App(Record):
    """``GET /v1/apps/{name}``: Fly's ``App`` (its field names and JSON types: the counts and
    numeric ids are integers) plus Souq's ``machines``, ``states``, ``regions``, ``created_at``
    and ``explicit``."""

    id: str = Field(description="given at the create; the name for an implicit app")
    name: str
    internal_numeric_id: int = Field(description="a 31-bit number derived from the name")
    network: str
    status: AppStatus
    machine_count: int
    volume_count: int = Field(default=0, description="always 0: not counted (see GET .../volumes)")
    organization: AppOrganization
    cname_target: str = Field(default="", description="always empty in Souq")
    app_role: str = ""
    machines: int = Field(description="machines not destroyed (= machine_count)")
    states: dict[str, int] = Field(description="machines by state")
    regions: list[str]
    created_at: str | None = Field(description="when it was created; null for an implicit app")
    explicit: bool = Field(description="created by POST /v1/apps; false: it only has machines")


class AppList(Record):
    """``GET /v1/apps``: an object, as Fly's clients decode it."""

    apps: list[App]


class AppDeleted(Record):
    """``DELETE /v1/apps/{name}``: the app is gone, with the machines it had."""

    name: str
    destroyed_machines: list[str]


def numeric_id(text: str) -> int:
    """A stable 31-bit number for ``text`` (fits Fly's ``int32`` ids on every broker)."""
    return zlib.crc32(text.encode()) & 0x7FFFFFFF


def app_status(states: Mapping[str, int]) -> AppStatus:
    """Fly's status of an app whose machines are in ``states`` (counts by state)."""
    alive = {s: n for s, n in states.items() if n > 0 and s != MachineState.DESTROYED}
    if not alive:
        return AppStatus.PENDING
    if any(s in _RUNNING for s in alive):
        return AppStatus.DEPLOYED
    return AppStatus.SUSPENDED


def app_of(name: str, record: AppRecord | None, counts: MachineCounts | None) -> App | None:
    """The app ``name`` as the routes answer it; None when the name is free (no record and no
    machine)."""
    counts = counts or MachineCounts()
    if record is None and counts.machines == 0:
        return None
    slug = record.org_slug if record else DEFAULT_ORG
    return App(
        id=record.id if record else name,
        name=name,
        internal_numeric_id=numeric_id(name),
        network=record.network if record else "",
        status=app_status(counts.states),
        machine_count=counts.machines,
        organization=AppOrganization(name=slug, slug=slug, internal_numeric_id=numeric_id(slug)),
        app_role=record.app_role if record else "",
        machines=counts.machines,
        states=counts.states,
        regions=counts.regions,
        created_at=record.created_at if record else None,
        explicit=record is not None,
    )
