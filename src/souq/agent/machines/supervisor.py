"""The supervisor owns every background job that follows a machine's process:

* the *exit watch* of every running process (``driver.watch``: a callback, not a task), which
  hands the exit status to the agent's ``on_exit``;
* one *kill timer* per stop in progress (SIGKILL is due when it fires);
* one *restart timer* per machine waiting out its backoff.

It also applies the restart policy (:func:`souq.agent.machines.restart.decide`, pure) with the
agent's backoff settings. Timers are loop timer handles kept here, so a stop or destroy cancels a
pending restart and shutdown cancels everything: nothing outlives its owner.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable

from souq.agent.machines.restart import Backoff, Decision, decide
from souq.drivers.base import Driver, ExitStatus, Handle
from souq.model.machine import RestartConfig

__all__ = ["Supervisor"]

log = logging.getLogger(__name__)


def _guarded(callback: Callable[..., None], *args: object) -> None:
    try:
        callback(*args)
    except Exception:
        log.exception("supervising machine %s failed", args[0])


class _Timers:
    """Loop timers by machine id, at most one a machine: when one fires, ``callback`` gets the
    machine's id (an error it raises is logged)."""

    def __init__(self, callback: Callable[[str], None]) -> None:
        self._callback = callback
        self._handles: dict[str, asyncio.TimerHandle] = {}

    def arm(self, machine_id: str, delay_s: float) -> None:
        """Set the machine's timer ``delay_s`` from now, in place of any set before."""
        self.cancel(machine_id)
        self._handles[machine_id] = asyncio.get_running_loop().call_later(
            delay_s, self._fire, machine_id
        )

    def cancel(self, machine_id: str) -> bool:
        """Whether the machine had a timer (now cancelled)."""
        handle = self._handles.pop(machine_id, None)
        if handle is None:
            return False
        handle.cancel()
        return True

    def pending(self, machine_id: str) -> bool:
        return machine_id in self._handles

    def cancel_all(self) -> None:
        for handle in self._handles.values():
            handle.cancel()
        self._handles.clear()

    def _fire(self, machine_id: str) -> None:
        self._handles.pop(machine_id, None)
        _guarded(self._callback, machine_id)


class Supervisor:
    def __init__(
        self,
        driver: Driver,
        backoff: Backoff,
        *,
        on_exit: Callable[[str, ExitStatus], None],
        on_kill_due: Callable[[str], None],
        on_restart_due: Callable[[str], None],
    ) -> None:
        self._driver = driver
        self.backoff = backoff
        self._on_exit = on_exit
        self._closed = False
        self._kills = _Timers(on_kill_due)  # one per stop in progress: SIGKILL is due
        self._restarts = _Timers(on_restart_due)  # one per machine waiting out its backoff

    # -- exits ---------------------------------------------------------------------------------

    def watch(self, machine_id: str, handle: Handle) -> None:
        self._driver.watch(handle, functools.partial(self._exited, machine_id))

    def _exited(self, machine_id: str, status: ExitStatus) -> None:
        if not self._closed:
            _guarded(self._on_exit, machine_id, status)

    def decide(
        self,
        config: RestartConfig,
        status: ExitStatus,
        *,
        restarts: int,
        ran_for_s: float,
        user_stop: bool,
    ) -> Decision:
        return decide(
            config,
            exit_code=status.code,
            user_stop=user_stop,
            restarts=restarts,
            ran_for_s=ran_for_s,
            backoff=self.backoff,
        )

    # -- timers --------------------------------------------------------------------------------

    def arm_kill(self, machine_id: str, timeout_s: float) -> None:
        self._kills.arm(machine_id, timeout_s)

    def disarm_kill(self, machine_id: str) -> None:
        self._kills.cancel(machine_id)

    def schedule_restart(self, machine_id: str, delay_s: float) -> None:
        self._restarts.arm(machine_id, delay_s)

    def cancel_restart(self, machine_id: str) -> bool:
        return self._restarts.cancel(machine_id)

    def restart_pending(self, machine_id: str) -> bool:
        return self._restarts.pending(machine_id)

    # -- shutdown ------------------------------------------------------------------------------

    async def aclose(self) -> None:
        """Cancel every timer and stop passing exits on (the processes themselves keep
        running)."""
        self._closed = True
        self._kills.cancel_all()
        self._restarts.cancel_all()
