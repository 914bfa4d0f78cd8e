"""A machine's row in the agent's SQLite file, declared once from its record.

:class:`~souq.agent.state.records.MachineRow` is the one form of a machine the agent keeps; the
API's :class:`~souq.model.machine.Machine` is a view of it (``MachineRow.to_machine``). Its
table is not a third form: each column below is one field of the record, with its SQL type, how
it is written and read, and which statement writes it. The ``machines`` table, its statements
(:mod:`souq.agent.state.schema`), the conversions both ways and the set of fields an update
writes apart are all made from :data:`COLUMNS`, so a field added to the record is one line here
(``added=True``: older state files gain the column when the agent opens them). A machine's
events are not a column: they are rows of their own table, its most recent ones kept on the
record.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields
from typing import Any, Literal

from pydantic import BaseModel

from souq.agent.state.records import MachineRow
from souq.model.machine import MachineConfig, MachineEvent, MachineState
from souq.model.placement import Placement
from souq.model.services import MachineAddress

__all__ = [
    "COLUMNS",
    "SPEC_FIELDS",
    "Column",
    "column_names",
    "placeholders",
    "row_of",
    "values_of",
]

# How a field is kept: as it is (text, a number, None), a 0/1 (bool), a model's JSON, an enum's
# value, or GPU indexes as "0,3".
Kind = Literal["plain", "bool", "json", "enum", "ids"]
# Which statement writes it: the claim's insert only, every change of the machine's run (state,
# process, exit), or an update of what changes now and then (its spec: a config, a cordon).
Written = Literal["claim", "run", "spec"]


@dataclass(frozen=True)
class Column:
    name: str  # the record's field, and the column
    sql: str  # its type and constraints
    kind: Kind = "plain"
    written: Written = "claim"
    read_as: Callable[[Any], Any] | None = None  # from its SQL value (a JSON column: its text)
    added: bool = False  # not in the first schema: an older file gains it

    def write(self, value: Any, json_of: Callable[[BaseModel], str]) -> Any:
        if self.kind == "json":
            return json_of(value) if value is not None else None
        if self.kind == "bool":
            return int(value)
        if self.kind == "enum":
            return str(value)
        if self.kind == "ids":
            return ",".join(str(i) for i in value) or None
        return value

    def read(self, raw: Any) -> Any:
        if self.kind == "json":
            assert self.read_as is not None, self.name
            return self.read_as(str(raw)) if raw else None
        if self.kind == "bool":
            return bool(raw)
        if self.kind == "ids":
            return tuple(int(i) for i in str(raw).split(",")) if raw else ()
        if raw is None or self.read_as is None:
            return raw
        return self.read_as(raw)

    def placeholder(self) -> Any:
        """A value the column takes, for statements compiled ahead of the first claim."""
        if "NOT NULL" not in self.sql and "PRIMARY KEY" not in self.sql:
            return None
        return 0 if self.sql.startswith(("INTEGER", "REAL")) else "-"


COLUMNS: tuple[Column, ...] = (
    Column("id", "TEXT PRIMARY KEY", read_as=str),
    Column("app", "TEXT NOT NULL", read_as=str),
    Column("name", "TEXT NOT NULL", read_as=str),
    Column("region", "TEXT NOT NULL", read_as=str),
    Column("request_id", "TEXT NOT NULL UNIQUE", read_as=str),
    Column("body_hash", "TEXT NOT NULL", read_as=str),
    Column("state", "TEXT NOT NULL", "enum", "run", MachineState),
    Column("config", "TEXT NOT NULL", "json", "spec", MachineConfig.model_validate_json),
    Column("placement", "TEXT", "json", "spec", Placement.model_validate_json),
    Column("pid", "INTEGER", written="run", read_as=int),
    Column("pid_start_time", "REAL", written="run", read_as=float),
    Column("restarts", "INTEGER NOT NULL DEFAULT 0", written="run", read_as=int),
    Column("exit_code", "INTEGER", written="run", read_as=int),
    Column("created_at", "INTEGER NOT NULL", read_as=int),
    Column("updated_at", "INTEGER NOT NULL", written="run", read_as=int),
    # the host and the host ports it was given
    Column("address", "TEXT", "json", "spec", MachineAddress.model_validate_json, added=True),
    # the version of its config (none: made before updates were; its id stands for it)
    Column("instance_id", "TEXT", written="spec", read_as=str, added=True),
    Column("gpu_ids", "TEXT", "ids", added=True),  # the GPUs it got, by index: "0,3"
    Column("cordoned", "INTEGER NOT NULL DEFAULT 0", "bool", "spec", added=True),
    # started without its app's secrets (made by a token without them)
    Column("skip_secrets", "INTEGER NOT NULL DEFAULT 0", "bool", "spec", added=True),
)

# The fields an update writes with UPDATE_SPEC: a change to any of them is written apart.
SPEC_FIELDS = frozenset(c.name for c in COLUMNS if c.written == "spec")
_STORED = frozenset(c.name for c in COLUMNS)
# Every field of the record is a column, but its recent events (a table of their own).
assert {f.name for f in fields(MachineRow)} - _STORED == {"events"}, "a field without a column"


def column_names(written: Written | None = None) -> list[str]:
    return [c.name for c in COLUMNS if written is None or c.written == written]


def values_of(
    row: MachineRow, json_of: Callable[[BaseModel], str], written: Written | None = None
) -> tuple[Any, ...]:
    """The row's values of the columns :func:`column_names` names, in that order."""
    return tuple(
        c.write(getattr(row, c.name), json_of)
        for c in COLUMNS
        if written is None or c.written == written
    )


def placeholders(written: Written | None = None) -> tuple[Any, ...]:
    return tuple(c.placeholder() for c in COLUMNS if written is None or c.written == written)


def row_of(raw: Sequence[Any], events: Sequence[MachineEvent]) -> MachineRow:
    """The record from the values of every column, in :data:`COLUMNS`' order."""
    given = {c.name: c.read(v) for c, v in zip(COLUMNS, raw, strict=True)}
    given["instance_id"] = given["instance_id"] or given["id"]
    return MachineRow(**given, events=tuple(events))
