"""The machine records in memory, indexed for what offers and commands ask: the base of the
executor, which alone changes them (:mod:`souq.agent.machines.executor`)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

from souq.agent.state.records import MachineRow, of_app
from souq.model.machine import CheckStatus, Machine, MachineState

__all__ = ["MachineTable"]

S = MachineState


class MachineTable:
    def __init__(self, worker_id: str, rows: list[MachineRow]) -> None:
        self.worker_id = worker_id
        self._rows: dict[str, MachineRow] = {r.id: r for r in rows}
        self._by_request: dict[str, str] = {r.request_id: r.id for r in rows}
        # Kept up to date so that offers never scan the machine records.
        self._live_by_app: Counter[str] = Counter(r.app for r in rows if r.state is not S.DESTROYED)
        # The statuses of a machine's health checks (souq.agent.machines.checks), shown on its
        # record.
        self.check_statuses: Callable[[str], list[CheckStatus]] = lambda _: []

    def shown(self, row: MachineRow) -> Machine:
        """The machine record of ``row``, with its health checks' statuses."""
        machine = row.to_machine(self.worker_id)
        statuses = self.check_statuses(row.id)
        return machine.model_copy(update={"checks": statuses}) if statuses else machine

    def machine_count(self, app: str | None = None) -> int:
        """Machines not destroyed (of ``app``, when given)."""
        if app is not None:
            return self._live_by_app[app]
        return sum(self._live_by_app.values())

    def machine_for_request(self, request_id: str) -> str | None:
        return self._by_request.get(request_id)

    def has(self, machine_id: str) -> bool:
        return machine_id in self._rows

    def row(self, app: str, machine_id: str) -> MachineRow:
        hint = "check the machine id and the app name"
        return of_app(self._rows.get(machine_id), app, "machine", machine_id, hint=hint)

    def machine(self, app: str, machine_id: str) -> Machine:
        return self.shown(self.row(app, machine_id))

    def list_machines(self, app: str | None, *, include_destroyed: bool = False) -> list[Machine]:
        return [
            self.shown(r)
            for r in self._rows.values()
            if (app is None or r.app == app) and (include_destroyed or r.state is not S.DESTROYED)
        ]

    def row_by_id(self, machine_id: str) -> MachineRow:
        return self._rows[machine_id]

    def rows(self) -> list[MachineRow]:
        return list(self._rows.values())
