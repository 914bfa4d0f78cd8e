"""The hollow driver: a :class:`souq.drivers.base.Driver` that runs nothing.

``start`` hands out a handle for a fake pid; the "process" never exits unless a terminating
signal is sent (a stop, a kill, a forced destroy), and then it exits at once. There is no
output. One instance serves every worker of a fleet: machine ids are unique.
"""

from __future__ import annotations

import asyncio
import itertools
import signal as _signal
import time
from collections.abc import Callable

from souq.drivers.base import ExitStatus, Handle, MachineSpec

__all__ = ["HollowDriver"]

# Signals whose default action does not end a process: they leave a hollow machine running.
_HARMLESS = frozenset(
    {
        _signal.SIGCHLD,
        _signal.SIGCONT,
        _signal.SIGURG,
        _signal.SIGWINCH,
        _signal.SIGSTOP,
        _signal.SIGTSTP,
        _signal.SIGTTIN,
        _signal.SIGTTOU,
    }
)
_FIRST_PID = 4_000_000  # above any real pid (pid_max is at most 2^22), so never a live process


class HollowDriver:
    name = "hollow"

    def __init__(self) -> None:
        self._pids = itertools.count(_FIRST_PID)
        self._running: dict[str, asyncio.Future[ExitStatus]] = {}

    def start(self, spec: MachineSpec, *, meanwhile: Callable[[], None] | None = None) -> Handle:
        if meanwhile is not None:
            meanwhile()
        self._running[spec.machine_id] = asyncio.get_running_loop().create_future()
        return Handle(spec.machine_id, next(self._pids), time.time())

    def watch(self, handle: Handle, on_exit: Callable[[ExitStatus], None]) -> None:
        exit_ = self._running.get(handle.machine_id)
        if exit_ is None:
            asyncio.get_running_loop().call_soon(on_exit, ExitStatus())
        else:
            exit_.add_done_callback(lambda done: on_exit(done.result()))

    async def wait(self, handle: Handle) -> ExitStatus:
        exit_ = self._running.get(handle.machine_id)
        if exit_ is None:
            return ExitStatus()
        # Shielded: a supervisor that stops watching must not "kill" the machine.
        return await asyncio.shield(exit_)

    def signal(self, handle: Handle, sig: int) -> bool:
        exit_ = self._running.get(handle.machine_id)
        if exit_ is None or exit_.done():
            return False
        if sig not in _HARMLESS:
            exit_.set_result(ExitStatus.from_returncode(-sig))
        return True

    def freeze(self, handle: Handle, frozen: bool) -> bool:
        exit_ = self._running.get(handle.machine_id)
        return exit_ is not None and not exit_.done()  # nothing runs to freeze

    async def stop(self, handle: Handle, sig: int, timeout_s: float) -> ExitStatus:
        self.signal(handle, sig)
        return await self.wait(handle)

    def destroy(self, machine_id: str) -> None:
        exit_ = self._running.pop(machine_id, None)
        if exit_ is not None and not exit_.done():
            exit_.set_result(ExitStatus(signal="SIGKILL"))

    def inspect(self, handle: Handle) -> bool:
        exit_ = self._running.get(handle.machine_id)
        return exit_ is not None and not exit_.done()

    def recover(self, handle: Handle) -> bool:
        return False  # nothing outlives the fleet process

    def find(self, machine_id: str) -> Handle | None:
        return None

    def read_output(self, machine_id: str, offset: int, max_bytes: int) -> tuple[bytes, int]:
        return b"", 0

    def output_start(self, machine_id: str) -> int:
        return 0

    def close(self) -> None:
        pass

    def running(self) -> int:
        return sum(1 for f in self._running.values() if not f.done())
