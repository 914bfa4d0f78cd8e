"""The supervisor owns every background job that follows a machine's process:

* the *exit watch* of every running process (``driver.watch``: a callback, not a task), which
  hands the exit status to the agent's ``on_exit``;
* one *kill timer* per stop in progress (SIGKILL is due when it fires);
* one *restart timer* per machine waiting out its backoff.

It also applies the restart policy (:func:`souq.agent.restart.decide`, pure) with the agent's
backoff settings. Timers are loop timer handles kept here, so a stop or destroy cancels a pending
restart and shutdown cancels everything: nothing outlives its owner.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable

from souq.agent.restart import Backoff, Decision, decide
from souq.drivers.base import Driver, ExitStatus, Handle
from souq.model.machine import RestartConfig

__all__ = ["Supervisor"]

log = logging.getLogger(__name__)


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
        self._on_kill_due = on_kill_due
        self._on_restart_due = on_restart_due
        self._closed = False
        self._kill_timers: dict[str, asyncio.TimerHandle] = {}
        self._restart_timers: dict[str, asyncio.TimerHandle] = {}

    # -- exits ---------------------------------------------------------------------------------

    def watch(self, machine_id: str, handle: Handle) -> None:
        self._driver.watch(handle, functools.partial(self._exited, machine_id))

    def _exited(self, machine_id: str, status: ExitStatus) -> None:
        if not self._closed:
            self._guarded(self._on_exit, machine_id, status)

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
        self.disarm_kill(machine_id)
        self._kill_timers[machine_id] = asyncio.get_running_loop().call_later(
            timeout_s, self._fire, self._kill_timers, self._on_kill_due, machine_id
        )

    def disarm_kill(self, machine_id: str) -> None:
        timer = self._kill_timers.pop(machine_id, None)
        if timer is not None:
            timer.cancel()

    def schedule_restart(self, machine_id: str, delay_s: float) -> None:
        self.cancel_restart(machine_id)
        self._restart_timers[machine_id] = asyncio.get_running_loop().call_later(
            delay_s, self._fire, self._restart_timers, self._on_restart_due, machine_id
        )

    def cancel_restart(self, machine_id: str) -> bool:
        timer = self._restart_timers.pop(machine_id, None)
        if timer is None:
            return False
        timer.cancel()
        return True

    def restart_pending(self, machine_id: str) -> bool:
        return machine_id in self._restart_timers

    def _fire(
        self,
        timers: dict[str, asyncio.TimerHandle],
        callback: Callable[[str], None],
        machine_id: str,
    ) -> None:
        timers.pop(machine_id, None)
        self._guarded(callback, machine_id)

    @staticmethod
    def _guarded(callback: Callable[..., None], *args: object) -> None:
        try:
            callback(*args)
        except Exception:
            log.exception("supervising machine %s failed", args[0])

    # -- shutdown ------------------------------------------------------------------------------

    async def aclose(self) -> None:
        """Cancel every timer and stop passing exits on (the processes themselves keep
        running)."""
        self._closed = True
        for timers in (self._kill_timers, self._restart_timers):
            for timer in timers.values():
                timer.cancel()
            timers.clear()
