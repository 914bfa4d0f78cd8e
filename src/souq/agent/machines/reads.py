"""What a broker reads of a machine on its worker: wait for a state, its output (logs, long-polled,
secrets redacted), its op log and its events. :class:`~souq.agent.machines.commands.Commands` has
these beside the commands that change a machine.

Every read takes the ``app`` the caller believes the machine belongs to; a machine of another
app is :class:`~souq.errors.NotFound`, as if it did not exist.
"""

from __future__ import annotations

import asyncio
import contextlib

from souq.agent.machines.executor import Executor
from souq.errors import Conflict, WaitTimeout
from souq.model.machine import Machine, MachineEvent, MachineState, OpRecord
from souq.model.protocol import LogsReply, WaitCommand
from souq.secrets.redact import redact

__all__ = ["LOG_POLL_S", "MachineReads"]

S = MachineState
LOG_POLL_S = 0.1  # `logs` long-polling checks the output file this often (tail -f)
_ROTATED_PAST_TRIES = 8  # reads of the output a fast writer's rotations may cut short


class MachineReads:
    _ex: Executor

    async def wait(self, cmd: WaitCommand) -> Machine:
        """Answer once the machine is in ``cmd.state`` or one of ``cmd.states`` (at
        ``instance_id``, the version of its config, when given; and, with ``healthy``, every
        health check of it passing); :class:`WaitTimeout` after ``timeout_s``. Woken by the
        machine's transitions and its checks' changes: no polling."""
        ex = self._ex
        machine_id, state, timeout_s = cmd.machine_id, cmd.state, cmd.timeout_s
        healthy, instance_id = cmd.healthy, cmd.instance_id
        ex.row(cmd.app, machine_id)
        wanted = {state, *cmd.states}
        try:
            async with asyncio.timeout(timeout_s):
                while True:
                    row = ex.row_by_id(machine_id)
                    shown = ex.shown(row)
                    version = instance_id is None or shown.instance_id == instance_id
                    if (
                        row.state in wanted
                        and version
                        and (not healthy or ex.checks.healthy(row.id))
                    ):
                        return shown
                    if row.state is S.DESTROYED and S.DESTROYED not in wanted:
                        raise Conflict(
                            f"machine {machine_id} is destroyed; it will never be {state}"
                        )
                    await ex.changed(machine_id).wait()
        except TimeoutError:
            now = ex.row_by_id(machine_id).state
            failing = [s for s in ex.checks.statuses(machine_id) if s.status != "passing"]
            if now is state and healthy and failing:
                said = "; ".join(f"check {s.name} is {s.status}: {s.output}" for s in failing)
                raise WaitTimeout(
                    f"machine {machine_id} is {state} but not healthy within {timeout_s:g}s: "
                    f"{said}",
                    details={"state": str(now), "checks": [s.name for s in failing]},
                ) from None
            raise WaitTimeout(
                f"machine {machine_id} did not reach {state} within {timeout_s:g}s (it is {now})",
                details={"state": str(now)},
            ) from None

    async def logs(
        self, app: str, machine_id: str, *, offset: int, max_bytes: int, wait_s: float
    ) -> LogsReply:
        """Output from byte ``offset``; with ``wait_s``, wait up to that long for new output.
        ``finished`` once no more output is coming (:meth:`_ended`)."""
        ex = self._ex
        ex.row(app, machine_id)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait_s
        while True:
            finished = self._ended(machine_id)  # before the read: what it reads is all
            offset, data = self._output(machine_id, offset, max_bytes)
            text, used = self._shown(app, machine_id, data, finished=finished)
            remaining = deadline - loop.time()
            if text or finished or remaining <= 0:
                break
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(min(LOG_POLL_S, remaining)):
                    await ex.changed(machine_id).wait()
        return LogsReply(data=text, next_offset=offset + used, finished=finished)

    def _ended(self, machine_id: str) -> bool:
        """The machine's output has ended (as ``docker logs -f`` ends): it is destroyed, or
        down (stopped, failed) with no operation under way and no restart waiting out its
        backoff. A later start is a new stream, to follow again."""
        ex = self._ex
        state = ex.row_by_id(machine_id).state
        if state is S.DESTROYED:
            return True
        return (
            state in (S.STOPPED, S.FAILED)
            and ex.current_op(machine_id) is None
            and not ex.supervisor.restart_pending(machine_id)
        )

    def _output(self, machine_id: str, offset: int, max_bytes: int) -> tuple[int, bytes]:
        """Output from ``offset`` or, if that was rotated out, from the oldest byte kept: where
        it starts, and the bytes. A rotation past the read's start while it read may have moved
        the read on unseen: read again (a few times; then nothing, this time)."""
        driver = self._ex.driver
        start = offset
        for _ in range(_ROTATED_PAST_TRIES):
            start = max(offset, driver.output_start(machine_id))  # older output rotated out
            data, _ = driver.read_output(machine_id, start, max_bytes)
            if driver.output_start(machine_id) <= start:
                return start, data
        return start, b""

    def _shown(self, app: str, machine_id: str, data: bytes, *, finished: bool) -> tuple[str, int]:
        """Output as served: decoded, the machine's secret values ``[redacted]`` (an end that
        may be the start of one held back for the next read); and the bytes it covers."""
        text, used = _decode(data)
        secrets = self._ex.secrets
        values = secrets.to_redact(machine_id, app) if secrets is not None else set()
        if not values:
            return text, used
        shown, held = redact(text, values, final=finished)
        if held:
            used -= len(text[len(text) - held :].encode())
        return shown, used

    def ops(self, app: str, machine_id: str) -> list[OpRecord]:
        """The machine's op log: every step of every operation, oldest first."""
        self._ex.row(app, machine_id)
        return [
            OpRecord(
                op_id=s.op_id,
                kind=str(s.kind),
                state=str(s.state),
                event=str(s.event),
                timestamp=s.ts,
                detail=dict(s.detail),
            )
            for s in self._ex.store.op_log(machine_id)
        ]

    def events(self, app: str, machine_id: str) -> list[MachineEvent]:
        """Every event of the machine, newest first."""
        self._ex.row(app, machine_id)
        return self._ex.store.events(machine_id)


def _decode(data: bytes) -> tuple[str, int]:
    """Text of ``data`` and how many bytes it used: a UTF-8 character cut at the end is left
    for the next read."""
    try:
        return data.decode(), len(data)
    except UnicodeDecodeError as exc:
        if exc.reason == "unexpected end of data" and exc.start > 0:
            return data[: exc.start].decode(errors="replace"), exc.start
        return data.decode(errors="replace"), len(data)
