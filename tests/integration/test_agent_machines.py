"""A real agent over a real nats-server, running real processes: the machine commands."""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path

import pytest

from souq.agent import Agent, AgentConfig
from souq.bus import MemoryTransport, subjects
from souq.bus.codec import encode, unwrap
from souq.errors import CommandNotRunnable, IllegalTransition, InvalidInput, NotFound, WaitTimeout
from souq.model import (
    ClaimRequest,
    DestroyCommand,
    EventsCommand,
    ListCommand,
    LocateCommand,
    LocateReply,
    LogsCommand,
    Machine,
    MachineConfig,
    MachineRef,
    MachineState,
    SignalCommand,
    StopCommand,
    WaitCommand,
)
from souq.protocol import verbs as v
from tests.integration.agent_harness import APP, eventually, load, pid_alive, running_agent

S = MachineState
SLEEPER = ["sleep", "60"]


def test_claim_starts_the_process_with_souq_env(nats_url: str, tmp_path: Path) -> None:
    async def body() -> None:
        async with running_agent(nats_url, tmp_path) as h:
            script = "echo SOUQ_MACHINE_ID=$SOUQ_MACHINE_ID SOUQ_APP=$SOUQ_APP; env; sleep 60"
            m = await h.claim(["sh", "-c", script], env={"GREETING": "hola"}, name="web-1")
            assert m.state is S.STARTED
            assert m.worker_id == h.worker_id
            assert m.region == "mad"
            assert m.name == "web-1"
            assert m.pid is not None and pid_alive(m.pid)
            assert [(e.type, e.status) for e in m.events] == [
                ("start", S.STARTED),
                ("start", S.STARTING),
                ("launch", S.CREATED),
            ]
            out = await h.output(m.id, "SOUQ_WORKER_ID=")
            assert f"SOUQ_MACHINE_ID={m.id} SOUQ_APP={APP}" in out
            assert "SOUQ_REGION=mad" in out
            assert f"SOUQ_WORKER_ID={h.worker_id}" in out
            assert "GREETING=hola" in out
            log_file = tmp_path / "machines" / ".agent" / m.id / "output.log"
            assert log_file.read_text() == out
            assert (await h.get(m.id)).state is S.STARTED

    asyncio.run(body())


def test_a_machine_inherits_no_descriptor_of_the_agent(nats_url: str, tmp_path: Path) -> None:
    """The agent holds SQLite files, sockets, pidfds and pipes, and whatever its own parent left
    open; its waiters are started with posix_spawn, which closes only close-on-exec
    descriptors. The machine has its three (``ls`` adds the one it lists with)."""
    leaked = os.open(os.devnull, os.O_RDONLY)
    os.set_inheritable(leaked, True)  # as a careless parent of the agent would leave it

    async def body() -> None:
        async with running_agent(nats_url, tmp_path) as h:
            for _ in range(2):  # a waiter started on demand, then one kept ready
                m = await h.claim(["ls", "/proc/self/fd"])
                await h.wait(m.id, S.STOPPED)
                out = (await h.logs(m.id)).data
                assert out.split() == ["0", "1", "2", "3"], out

    try:
        asyncio.run(body())
    finally:
        os.close(leaked)


def test_skip_launch_then_start_stop_and_destroy(nats_url: str, tmp_path: Path) -> None:
    async def body() -> None:
        async with running_agent(nats_url, tmp_path) as h:
            m = await h.claim(SLEEPER, skip_launch=True)
            assert m.state is S.CREATED
            assert m.pid is None
            ref = MachineRef(app=APP, machine_id=m.id)
            started = await h.call(v.START, ref)
            assert started.state is S.STARTED
            with pytest.raises(IllegalTransition, match="cannot be started"):
                await h.call(v.START, ref)
            stopping = await h.call(v.STOP, StopCommand(app=APP, machine_id=m.id))
            assert stopping.state is S.STOPPING
            stopped = await h.wait(m.id, S.STOPPED)
            assert stopped.events[0].type == "exit"
            assert stopped.events[0].signal == "SIGINT"  # Fly's default stop signal
            assert stopped.pid is None
            assert not pid_alive(started.pid or 0)
            again = await h.call(v.STOP, StopCommand(app=APP, machine_id=m.id))
            assert again.state is S.STOPPED  # nothing to stop
            restarted = await h.call(v.START, ref)
            assert restarted.state is S.STARTED
            assert restarted.pid != started.pid
            with pytest.raises(IllegalTransition) as info:
                await h.call(v.DESTROY, DestroyCommand(app=APP, machine_id=m.id))
            assert "force" in (info.value.hint or "")
            gone = await h.call(v.DESTROY, DestroyCommand(app=APP, machine_id=m.id, force=True))
            assert gone.state is S.DESTROYED
            assert not pid_alive(restarted.pid or 0)
            assert not (tmp_path / "machines" / m.id).exists()
            with pytest.raises(IllegalTransition, match="destroyed; it cannot be started"):
                await h.call(v.START, ref)

    asyncio.run(body())


def test_commands_check_the_app(nats_url: str, tmp_path: Path) -> None:
    async def body() -> None:
        async with running_agent(nats_url, tmp_path) as h:
            m = await h.claim(SLEEPER, skip_launch=True)
            with pytest.raises(NotFound) as info:
                await h.get(m.id, app="other")
            assert m.id in info.value.message
            assert "other" in info.value.message
            ref = {"app": "other", "machine_id": m.id}
            for verb, msg in (
                (v.START, MachineRef(**ref)),
                (v.STOP, StopCommand(**ref)),
                (v.RESTART, StopCommand(**ref)),
                (v.SIGNAL, SignalCommand(**ref, signal="TERM")),
                (v.DESTROY, DestroyCommand(**ref)),
                (v.EVENTS, EventsCommand(**ref)),
                (v.WAIT, WaitCommand(**ref, state=S.STARTED, timeout_s=1)),
                (v.LOGS, LogsCommand(**ref)),
            ):
                with pytest.raises(NotFound):
                    await h.call(verb, msg)
            with pytest.raises(NotFound):
                await h.get("00000000000000")

    asyncio.run(body())


def test_signal_restart_and_events(nats_url: str, tmp_path: Path) -> None:
    async def body() -> None:
        async with running_agent(nats_url, tmp_path) as h:
            script = "trap 'echo got-usr1' USR1; echo ready; while true; do sleep 0.05; done"
            m = await h.claim(["sh", "-c", script])
            await h.output(m.id, "ready")
            signalled = await h.call(
                v.SIGNAL, SignalCommand(app=APP, machine_id=m.id, signal="usr1")
            )
            assert signalled.events[0].type == "signal"
            assert signalled.events[0].signal == "SIGUSR1"
            await h.output(m.id, "got-usr1")
            with pytest.raises(InvalidInput, match="unknown signal"):
                await h.call(v.SIGNAL, SignalCommand(app=APP, machine_id=m.id, signal="SIGNOPE"))
            restarted = await h.call(
                v.RESTART, StopCommand(app=APP, machine_id=m.id, signal="SIGTERM")
            )
            assert restarted.state is S.STARTED
            assert restarted.pid != m.pid
            events = await h.call(v.EVENTS, EventsCommand(app=APP, machine_id=m.id))
            history = events
            assert [(e.type, e.status) for e in history][:5] == [
                ("restart", S.STARTED),
                ("start", S.STARTING),
                ("exit", S.STOPPED),
                ("restart", S.STOPPING),
                ("signal", S.STARTED),
            ]
            assert history[2].signal == "SIGTERM"
            assert history[-1].type == "launch"
            assert [e.timestamp for e in history] == sorted(
                (e.timestamp for e in history), reverse=True
            )

    asyncio.run(body())


def test_a_command_that_cannot_run_fails_the_machine(nats_url: str, tmp_path: Path) -> None:
    async def body() -> None:
        async with running_agent(nats_url, tmp_path) as h:
            m = await h.claim(["/no/such/program"])
            assert m.state is S.FAILED
            assert m.events[0].type == "fail"
            assert "/no/such/program" in (m.events[0].message or "")
            # A program that is there but that the machine's user may not run is refused at
            # once, naming it, and nothing is reserved for it.
            script = tmp_path / "not-executable.sh"
            script.write_text("#!/bin/sh\necho hi\n")
            with pytest.raises(CommandNotRunnable, match=r"not-executable\.sh"):
                await h.claim([str(script)])
            # A failed machine can be destroyed, and its reservation goes with it.
            await h.call(v.DESTROY, DestroyCommand(app=APP, machine_id=m.id))
            assert h.agent.executor.allocated.cpus == 0

    asyncio.run(body())


def test_wait_answers_on_the_transition_or_times_out(nats_url: str, tmp_path: Path) -> None:
    async def body() -> None:
        async with running_agent(nats_url, tmp_path) as h:
            m = await h.claim(SLEEPER)
            with pytest.raises(WaitTimeout) as info:
                await h.wait(m.id, S.STOPPED, timeout_s=0.2)
            assert info.value.http_status == 408
            assert "started" in info.value.message
            waiter = asyncio.create_task(h.wait(m.id, S.STOPPED, timeout_s=5))
            # The wait has reached the agent (it asked to hear of the machine's next change).
            await eventually(lambda: m.id in h.agent.executor._changed, message="the wait")
            await h.call(v.STOP, StopCommand(app=APP, machine_id=m.id))
            assert (await waiter).state is S.STOPPED
            assert (await h.wait(m.id, S.STOPPED, timeout_s=0.1)).state is S.STOPPED

    asyncio.run(body())


def test_logs_offsets_long_poll_and_finish(nats_url: str, tmp_path: Path) -> None:
    async def body() -> None:
        async with running_agent(nats_url, tmp_path) as h:
            # Prints "one", then "two" once a file named `go` appears in its directory.
            script = "echo one; while [ ! -e go ]; do sleep 0.01; done; echo two"
            m = await h.claim(["sh", "-c", script], skip_launch=True)
            first = await h.logs(m.id)
            assert (first.data, first.next_offset, first.finished) == ("", 0, False)
            await h.call(v.START, MachineRef(app=APP, machine_id=m.id))
            await h.output(m.id, "one\n")
            out = await h.logs(m.id)
            assert (out.data, out.next_offset) == ("one\n", 4)
            # Nothing new: a long poll waits about wait_s, then answers empty.
            loop = asyncio.get_running_loop()
            t0 = loop.time()
            empty = await h.logs(m.id, offset=4, wait_s=0.3)
            assert (empty.data, empty.next_offset, empty.finished) == ("", 4, False)
            assert loop.time() - t0 >= 0.25
            # New output ends a long poll early.
            poll = asyncio.create_task(h.logs(m.id, offset=4, wait_s=10))
            (tmp_path / "machines" / m.id / "go").touch()
            more = await asyncio.wait_for(poll, 5)
            assert (more.data, more.next_offset) == ("two\n", 8)
            await h.wait(m.id, S.STOPPED)
            # Down (exit 0: on-failure restarts nothing): the stream has ended, at once.
            t0 = loop.time()
            ended = await h.logs(m.id, offset=8, wait_s=10)
            assert (ended.data, ended.finished) == ("", True) and loop.time() - t0 < 5
            # Started again (waiting for `go` again): a new stream; the machine's destruction
            # ends a long poll.
            (tmp_path / "machines" / m.id / "go").unlink()
            await h.call(v.START, MachineRef(app=APP, machine_id=m.id))
            await h.output(m.id, "one\ntwo\none\n")
            poll = asyncio.create_task(h.logs(m.id, offset=12, wait_s=10))
            # The poll is waiting at the agent: it asked to hear of the machine's next change.
            await eventually(lambda: m.id in h.agent.executor._changed, message="the long poll")
            await h.call(v.DESTROY, DestroyCommand(app=APP, machine_id=m.id, force=True))
            done = await asyncio.wait_for(poll, 5)
            assert done.finished

    asyncio.run(body())


def test_logs_never_split_a_character(nats_url: str, tmp_path: Path) -> None:
    async def body() -> None:
        async with running_agent(nats_url, tmp_path) as h:
            m = await h.claim(["sh", "-c", "printf 'añb'; sleep 60"])
            await h.output(m.id, "añb")
            cmd = LogsCommand(app=APP, machine_id=m.id, offset=0, max_bytes=2)
            part = await h.call(v.LOGS, cmd)
            assert (part.data, part.next_offset) == ("a", 1)
            rest = await h.logs(m.id, offset=part.next_offset)
            assert rest.data == "ñb"

    asyncio.run(body())


def test_list_and_locate_over_the_all_subjects(nats_url: str, tmp_path: Path) -> None:
    async def body() -> None:
        async with running_agent(nats_url, tmp_path) as h:
            a = await h.claim(SLEEPER, skip_launch=True)
            b = await h.claim(SLEEPER, skip_launch=True, app="other")
            await h.call(v.DESTROY, DestroyCommand(app="other", machine_id=b.id))

            async def listing(cmd: ListCommand) -> list[str]:
                replies = await h.bus.gather(
                    subjects.all_workers("list"), encode(cmd), expect=1, timeout=5
                )
                return [Machine.model_validate_json(_json(m)).id for m in unwrap(replies[0])]

            assert await listing(ListCommand(app=APP)) == [a.id]
            assert await listing(ListCommand(app="other")) == []
            assert await listing(ListCommand(app="other", include_destroyed=True)) == [b.id]
            assert set(await listing(ListCommand(include_destroyed=True))) == {a.id, b.id}
            for machine_id, found in ((a.id, True), ("nope", False)):
                replies = await h.bus.gather(
                    subjects.all_workers("locate"),
                    encode(LocateCommand(machine_id=machine_id)),
                    expect=1,
                    timeout=5,
                )
                reply = LocateReply.model_validate(unwrap(replies[0]))
                assert reply == LocateReply(worker_id=h.worker_id, found=found)

    asyncio.run(body())


def test_destroy_without_force_after_stop_and_no_orphans(nats_url: str, tmp_path: Path) -> None:
    async def body() -> None:
        async with running_agent(nats_url, tmp_path) as h:
            # The machine's child keeps running after the leader exits: it goes too.
            m = await h.claim(
                ["sh", "-c", "sleep 60 & echo $! > child.pid; exec sleep 60"],
                restart={"policy": "no"},
            )
            pid_file = tmp_path / "machines" / m.id / "child.pid"
            child = int(await eventually(lambda: pid_file.exists() and pid_file.read_text()))
            assert pid_alive(child)
            os_kill(m.pid or 0, signal.SIGTERM)  # an exit the agent did not ask for
            stopped = await h.wait(m.id, S.STOPPED)
            assert stopped.events[0].signal == "SIGTERM"
            await eventually(lambda: not pid_alive(child), message="the orphan to be killed")
            gone = await h.call(v.DESTROY, DestroyCommand(app=APP, machine_id=m.id))
            assert gone.state is S.DESTROYED

    asyncio.run(body())


def os_kill(pid: int, sig: int) -> None:
    import os

    os.kill(pid, sig)


def _json(value: object) -> str:
    import json

    return json.dumps(value)


def test_the_agent_runs_on_the_in_memory_bus_too(tmp_path: Path) -> None:
    async def body() -> None:
        bus = MemoryTransport()
        config = AgentConfig(
            region="mad", nats_url="unused", data_dir=tmp_path, stop_machines_on_exit=True
        )
        agent = Agent(config, transport=bus)
        await agent.start()
        try:
            req = ClaimRequest(
                request_id="r",
                body_hash="h",
                app=APP,
                region="mad",
                config=MachineConfig(cmd=SLEEPER),
            )
            reply = await bus.request(subjects.worker(agent.worker_id, "claim"), encode(req), 5)
            machine = load(Machine, unwrap(reply))
            assert machine.state is S.STARTED
        finally:
            await agent.aclose()
        assert not pid_alive(machine.pid or 0)

    asyncio.run(body())
