"""Supervision with real processes: stop escalation, restart policies, backoff, cancellation."""

from __future__ import annotations

import asyncio
from pathlib import Path

from souq.model import DestroyCommand, MachineRef, MachineState, StopCommand
from souq.protocol import verbs as v
from tests.integration.agent_harness import APP, eventually, pid_alive, running_agent

S = MachineState


ESCALATE_S = 2.0  # the stubborn machine's stop timeout


def runs(path: Path) -> int:
    return len(path.read_text().splitlines()) if path.exists() else 0


def test_stop_escalates_to_sigkill_after_the_timeout(nats_url: str, tmp_path: Path) -> None:
    async def body() -> None:
        async with running_agent(nats_url, tmp_path) as h:
            stubborn = ["sh", "-c", "trap '' INT; echo ready; exec sleep 60"]
            # An escalation far past any reply's time, so that the order, not a bound of a few
            # hundred ms, is what is asserted: the reply comes first, the SIGKILL after.
            m = await h.claim(stubborn, stop_config={"timeout_s": ESCALATE_S})
            await h.output(m.id, "ready")
            loop = asyncio.get_running_loop()
            t0 = loop.time()
            stopping = await h.call(v.STOP, StopCommand(app=APP, machine_id=m.id))
            assert stopping.state is S.STOPPING
            assert loop.time() - t0 < ESCALATE_S  # the reply does not wait for the exit
            stopped = await h.wait(m.id, S.STOPPED)
            assert loop.time() - t0 >= ESCALATE_S
            exit_event, kill_event, stop_event = stopped.events[:3]
            assert (stop_event.type, stop_event.signal, stop_event.source) == (
                "stop",
                "SIGINT",
                "user",
            )
            assert (kill_event.type, kill_event.signal, kill_event.source) == (
                "signal",
                "SIGKILL",
                "agent",
            )
            assert f"{ESCALATE_S:g}s after SIGINT" in (kill_event.message or "")
            assert (exit_event.type, exit_event.signal) == ("exit", "SIGKILL")
            assert not pid_alive(m.pid or 0)
            # The user stop is final: no restart is pending despite the on-failure policy.
            assert not h.agent.executor.supervisor.restart_pending(m.id)

    asyncio.run(body())


def test_a_stop_command_can_override_signal_and_timeout(nats_url: str, tmp_path: Path) -> None:
    async def body() -> None:
        async with running_agent(nats_url, tmp_path) as h:
            m = await h.claim(["sh", "-c", "trap '' INT TERM; echo ready; exec sleep 60"])
            await h.output(m.id, "ready")
            cmd = StopCommand(app=APP, machine_id=m.id, signal="TERM", timeout_s=0.1)
            assert (await h.call(v.STOP, cmd)).events[0].signal == "SIGTERM"
            stopped = await h.wait(m.id, S.STOPPED, timeout_s=3)
            assert stopped.events[0].signal == "SIGKILL"

    asyncio.run(body())


def test_on_failure_restarts_exactly_max_retries_times(nats_url: str, tmp_path: Path) -> None:
    async def body() -> None:
        async with running_agent(nats_url, tmp_path) as h:
            log = tmp_path / "runs.txt"
            m = await h.claim(
                ["sh", "-c", f"echo run >> {log}; exit 1"],
                restart={"policy": "on-failure", "max_retries": 2},
            )
            stopped = await h.wait(m.id, S.STOPPED)
            assert runs(log) == 3
            assert stopped.restarts == 2
            assert stopped.exit_code == 1
            last = stopped.events[0]
            assert (last.type, last.exit_code) == ("exit", 1)
            assert "gave up after 2 restarts" in (last.message or "")
            assert not h.agent.executor.supervisor.restart_pending(m.id)
            kinds = [(e.type, e.status) for e in reversed(stopped.events)]
            assert kinds.count(("exit", S.STARTING)) == 2
            assert kinds.count(("restart", S.STARTED)) == 2
            # A user start is a fresh start: the counter begins again.
            again = await h.call(v.START, MachineRef(app=APP, machine_id=m.id))
            assert again.restarts == 0
            await h.wait(m.id, S.STOPPED)
            assert runs(log) == 6

    asyncio.run(body())


def test_on_failure_leaves_a_clean_exit_alone_and_no_never_restarts(
    nats_url: str, tmp_path: Path
) -> None:
    async def body() -> None:
        async with running_agent(nats_url, tmp_path) as h:
            log = tmp_path / "runs.txt"
            ok = await h.claim(["sh", "-c", f"echo run >> {log}; exit 0"])
            assert (await h.wait(ok.id, S.STOPPED)).exit_code == 0
            no = await h.claim(["sh", "-c", f"echo run >> {log}; exit 3"], restart={"policy": "no"})
            stopped = await h.wait(no.id, S.STOPPED)
            assert stopped.exit_code == 3
            assert "restart policy is no" in (stopped.events[0].message or "")
            assert runs(log) == 2

    asyncio.run(body())


def test_always_restarts_until_stopped_and_stop_cancels_the_restart(
    nats_url: str, tmp_path: Path
) -> None:
    async def body() -> None:
        async with running_agent(
            nats_url, tmp_path, restart_backoff_base_s=0.02, restart_backoff_max_s=0.02
        ) as h:
            log = tmp_path / "runs.txt"
            m = await h.claim(
                ["sh", "-c", f"echo run >> {log}; exit 0"], restart={"policy": "always"}
            )
            await eventually(lambda: runs(log) >= 3, message="three runs")
            await h.call(v.STOP, StopCommand(app=APP, machine_id=m.id))
            stopped = await h.wait(m.id, S.STOPPED)
            assert stopped.state is S.STOPPED
            assert not h.agent.executor.supervisor.restart_pending(m.id)
            assert h.agent.executor.handle(m.id) is None

    asyncio.run(body())


def test_a_pending_restart_waits_its_backoff_unless_started(nats_url: str, tmp_path: Path) -> None:
    async def body() -> None:
        async with running_agent(nats_url, tmp_path, restart_backoff_base_s=30) as h:
            flag = tmp_path / "healthy"
            # Fails at once unless the flag file exists; then it runs.
            m = await h.claim(["sh", "-c", f"test -e {flag} && exec sleep 60; exit 1"])
            supervisor = h.agent.executor.supervisor
            waiting = await h.wait(m.id, S.STARTING)
            assert waiting.events[0].type == "exit"
            assert "restart 1 of 10 in 30s" in (waiting.events[0].message or "")
            assert supervisor.restart_pending(m.id)
            # A user start does not wait out the backoff.
            flag.touch()
            started = await h.call(v.START, MachineRef(app=APP, machine_id=m.id))
            assert started.state is S.STARTED
            assert not supervisor.restart_pending(m.id)
            await h.call(v.STOP, StopCommand(app=APP, machine_id=m.id))
            await h.wait(m.id, S.STOPPED)
            # Stopping a machine that waits for its restart cancels the restart.
            flag.unlink()
            await h.call(v.START, MachineRef(app=APP, machine_id=m.id))
            await h.wait(m.id, S.STARTING)
            assert supervisor.restart_pending(m.id)
            stopped = await h.call(v.STOP, StopCommand(app=APP, machine_id=m.id))
            assert stopped.state is S.STOPPED
            assert not supervisor.restart_pending(m.id)
            # And so does destroying it.
            await h.call(v.START, MachineRef(app=APP, machine_id=m.id))
            await h.wait(m.id, S.STARTING)
            gone = await h.call(v.DESTROY, DestroyCommand(app=APP, machine_id=m.id))
            assert gone.state is S.DESTROYED
            assert not supervisor.restart_pending(m.id)

    asyncio.run(body())


def test_the_restart_counter_resets_after_a_long_run(nats_url: str, tmp_path: Path) -> None:
    async def body() -> None:
        async with running_agent(nats_url, tmp_path, restart_reset_after_s=0.15) as h:
            log = tmp_path / "runs.txt"
            m = await h.claim(
                ["sh", "-c", f"echo run >> {log}; sleep 0.2; exit 1"],
                restart={"policy": "on-failure", "max_retries": 1},
            )
            # Each run outlasts reset_after_s, so one retry allowed is never used up.
            await eventually(lambda: runs(log) >= 3, message="a third run")
            machine = await h.get(m.id)
            assert machine.restarts <= 1
            await h.call(v.DESTROY, DestroyCommand(app=APP, machine_id=m.id, force=True))

    asyncio.run(body())
