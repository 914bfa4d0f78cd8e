"""The agent's reaper leaves an exited child to its own waiter for GRACE_S, then reaps it
(an orphan, which nobody else waits for). Real child processes, an injected clock."""

from __future__ import annotations

import asyncio
import os
import subprocess
import time

import uvloop

from souq.agent import reaper
from souq.agent.reaper import GRACE_S, SWEEP_S, Reaper


def _exited(child: subprocess.Popen[bytes]) -> None:
    """Until the child has exited (it stays a zombie: nothing reaps it here)."""
    os.waitid(os.P_PID, child.pid, os.WEXITED | os.WNOWAIT)


def _reaper_of(child: subprocess.Popen[bytes], now: list[float]) -> Reaper:
    """A reaper that sees only ``child`` (this process's other children are left be)."""
    return Reaper(lambda: reaper._children() - {child.pid}, clock=lambda: now[0])


def test_a_child_its_waiter_reaps_within_the_grace_keeps_its_status() -> None:
    child = subprocess.Popen(["sh", "-c", "exit 3"], start_new_session=True)
    _exited(child)
    now = [100.0]
    r = _reaper_of(child, now)
    assert r.reap() == []
    now[0] += GRACE_S / 2
    assert r.reap() == []
    assert child.wait(timeout=10) == 3  # its own waiter's status, not lost to the reaper
    assert r.reaped == 0


def test_an_exited_child_nobody_waits_for_is_reaped_after_the_grace() -> None:
    child = subprocess.Popen(["true"], start_new_session=True)
    _exited(child)
    now = [100.0]
    r = _reaper_of(child, now)
    assert r.reap() == []  # first seen exited
    now[0] += GRACE_S
    assert r.reap() == [child.pid]
    assert r.reaped == 1
    child.returncode = 0  # reaped here: Popen must not wait for it again


def test_a_child_of_the_agents_own_process_group_is_never_reaped() -> None:
    """A thread's command (``ip``, ``iptables-restore``) is in the agent's group: its status is
    its waiter's however long that waiter takes (the reaper would make it read 0)."""
    child = subprocess.Popen(["sh", "-c", "exit 4"])
    _exited(child)
    now = [100.0]
    r = _reaper_of(child, now)
    assert r.reap() == []
    now[0] += GRACE_S * 10
    assert r.reap() == []
    assert child.wait(timeout=10) == 4


def test_an_orphan_is_still_reaped_once_the_event_loop_has_run_a_command() -> None:
    """uvloop's libuv owns SIGCHLD for its commands (exec's): it puts the default back once its
    last one has ended, so a reaper that waited for SIGCHLD was deaf from the first exec on."""
    seen: list[int] = []

    async def main() -> int:
        r = Reaper(lambda: reaper._children() - set(seen))
        r.install()
        try:
            command = await asyncio.create_subprocess_exec("true")
            assert await command.wait() == 0
            orphan = subprocess.Popen(["true"], start_new_session=True)
            seen.append(orphan.pid)
            orphan.returncode = 0  # the reaper's, not Popen's, to wait for
            give_up = time.monotonic() + 10 * (GRACE_S + SWEEP_S)
            while r.reaped == 0 and time.monotonic() < give_up:
                await asyncio.sleep(0.05)
            return r.reaped
        finally:
            r.uninstall()

    assert uvloop.run(main()) == 1
