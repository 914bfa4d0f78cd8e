"""The exec driver on its own: real processes, pidfd exit watching, signals, adoption."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import resource
import signal
from pathlib import Path

import pytest

from souq.drivers import ExecDriver, ExitStatus, Handle, MachineSpec, SpawnError
from souq.drivers.cgroups import CgroupEntry
from souq.drivers.exec import machine_nofile
from souq.drivers.waiter import waiter_path
from souq.testing import wait_until
from tests.integration.agent_harness import eventually, pid_alive


def spec(*cmd: str, env: dict[str, str] | None = None, machine_id: str = "m1") -> MachineSpec:
    return MachineSpec(
        machine_id=machine_id,
        app="demo",
        region="mad",
        worker_id="w1",
        cmd=cmd,
        env=env or {},
    )


def test_exit_codes_and_signals_are_reported(tmp_path: Path) -> None:
    async def body() -> None:
        driver = ExecDriver(tmp_path)
        ok = driver.start(spec("sh", "-c", "exit 0", machine_id="ok"))
        bad = driver.start(spec("sh", "-c", "exit 42", machine_id="bad"))
        killed = driver.start(spec("sleep", "60", machine_id="killed"))
        assert driver.inspect(killed)
        assert driver.signal(killed, signal.SIGTERM)
        statuses = await asyncio.gather(driver.wait(ok), driver.wait(bad), driver.wait(killed))
        assert statuses == [ExitStatus(code=0), ExitStatus(code=42), ExitStatus(signal="SIGTERM")]
        assert not driver.inspect(killed)
        assert not driver.signal(killed, signal.SIGTERM)
        driver.close()

    asyncio.run(body())


def test_an_exit_before_anyone_waits_is_not_lost(tmp_path: Path) -> None:
    async def body() -> None:
        driver = ExecDriver(tmp_path)
        handle = driver.start(spec("sh", "-c", "exit 3"))
        # Let the loop run the exit callback (and reap) before anyone waits.
        watch = driver._watches[handle.pid]
        await eventually(lambda: watch.status is not None, message="the exit callback")
        assert await driver.wait(handle) == ExitStatus(code=3)
        # Delivered once: the watch is gone, and a later watch learns nothing more.
        assert handle.pid not in driver._watches
        assert await driver.wait(handle) == ExitStatus()
        driver.close()

    asyncio.run(body())


def test_every_watcher_of_an_exit_is_told_once(tmp_path: Path) -> None:
    async def body() -> None:
        driver = ExecDriver(tmp_path)
        handle = driver.start(spec("sleep", "60"))
        seen: list[tuple[str, ExitStatus]] = []
        driver.watch(handle, lambda status: seen.append(("supervisor", status)))
        driver.watch(handle, lambda status: seen.append(("stop", status)))
        assert driver.signal(handle, signal.SIGTERM)
        await eventually(lambda: len(seen) == 2, message="both watchers")
        killed = ExitStatus(signal="SIGTERM")
        assert seen == [("supervisor", killed), ("stop", killed)]
        driver.close()

    asyncio.run(body())


def test_stop_escalates_to_sigkill(tmp_path: Path) -> None:
    async def body() -> None:
        driver = ExecDriver(tmp_path)
        handle = driver.start(spec("sh", "-c", "trap '' INT; echo ready; exec sleep 60"))
        log = tmp_path / ".agent" / "m1" / "output.log"
        await eventually(lambda: log.exists() and "ready" in log.read_text())
        status = await driver.stop(handle, signal.SIGINT, 0.2)
        assert status == ExitStatus(signal="SIGKILL")
        driver.close()

    asyncio.run(body())


def test_the_environment_is_minimal(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SOUQ_TEST_SECRET", "leak")

    async def body() -> None:
        driver = ExecDriver(tmp_path)
        handle = driver.start(spec("sh", "-c", "env; pwd", env={"ONE": "1"}))
        assert await driver.wait(handle) == ExitStatus(code=0)
        data, size = driver.read_output("m1", 0, 1 << 20)
        lines = data.decode().splitlines()
        names = {line.split("=", 1)[0] for line in lines if "=" in line}
        assert "SOUQ_TEST_SECRET" not in names
        assert {"ONE", "SOUQ_MACHINE_ID", "SOUQ_APP", "SOUQ_REGION", "SOUQ_WORKER_ID"} <= names
        assert names <= {
            "ONE",
            "SOUQ_MACHINE_ID",
            "SOUQ_APP",
            "SOUQ_REGION",
            "SOUQ_WORKER_ID",
            "PATH",
            "HOME",
            "LANG",
            "PWD",  # set by the shell itself
            "SHLVL",
            "_",
            "OLDPWD",
        }
        assert str(tmp_path / "m1") in lines  # the working directory is the machine's
        assert size == len(data)
        assert driver.read_output("m1", size, 10) == (b"", size)
        assert driver.read_output("nope", 0, 10) == (b"", 0)
        driver.close()

    asyncio.run(body())


def test_spawn_failures_raise_spawn_error(tmp_path: Path) -> None:
    async def body() -> None:
        driver = ExecDriver(tmp_path)
        with pytest.raises(SpawnError, match="/no/such"):
            driver.start(spec("/no/such/thing"))
        with pytest.raises(SpawnError, match="ermission"):
            driver.start(spec(str(tmp_path)))  # a directory cannot be executed
        driver.close()

    asyncio.run(body())


WAITER_MODES = [
    pytest.param(
        True,
        id="waiter",
        marks=pytest.mark.skipif(
            waiter_path() is None, reason="no C compiler to build souq-waiter"
        ),
    ),
    pytest.param(False, id="direct"),
]


@pytest.mark.parametrize("use_waiter", WAITER_MODES)
def test_recover_checks_identity_by_start_time(tmp_path: Path, use_waiter: bool) -> None:
    async def body() -> None:
        first = ExecDriver(tmp_path, use_waiter=use_waiter)
        handle = first.start(spec("sleep", "60"))
        assert first.find("m1") == handle  # the pid file
        first.close()  # an agent going away: the process keeps running
        assert pid_alive(handle.pid)

        second = ExecDriver(tmp_path, use_waiter=use_waiter)
        impostor = dataclasses.replace(handle, start_time=handle.start_time - 100)
        assert not second.recover(impostor)
        assert not second.recover(Handle("m1", 2**22 + 7, 0.0))
        assert second.recover(handle)
        assert second.inspect(handle)
        # The driver's signal, not a bare killpg: souq-waiter reports the pid before its child's
        # setsid, and on a busy host the child may not have made its group yet.
        assert second.signal(handle, signal.SIGKILL)
        # Not our child: the exit is seen; its status only through souq-waiter.
        known = ExitStatus(signal="SIGKILL") if use_waiter else ExitStatus()
        assert await second.wait(handle) == known
        assert not second.find("m1")  # the pid file goes with the process
        second.destroy("m1")
        assert not (tmp_path / "m1").exists()
        second.close()

    asyncio.run(body())


@pytest.mark.skipif(waiter_path() is None, reason="no C compiler to build souq-waiter")
def test_exit_codes_outlive_the_driver_through_souq_waiter(tmp_path: Path) -> None:
    async def body() -> None:
        first = ExecDriver(tmp_path)
        assert first.waiter is not None
        gate = tmp_path / "gate"
        later = first.start(spec("sh", "-c", f"while [ ! -e {gate} ]; do sleep 0.01; done; exit 7"))
        gone = first.start(spec("sh", "-c", "exit 3", machine_id="m2"))
        first.close()  # the agent dies; m2 exits while nobody watches

        second = ExecDriver(tmp_path)
        assert second.recover(later)  # adopted through its waiter
        wait_until(lambda: second.last_exit("m2").known, message="m2's waiter to record it")
        assert not second.recover(gone)
        assert second.last_exit("m2") == ExitStatus(code=3)
        gate.touch()
        assert await second.wait(later) == ExitStatus(code=7)
        assert second.last_exit("m1") == ExitStatus(code=7)
        # A new start forgets the last status.
        again = second.start(spec("sleep", "60"))
        assert second.last_exit("m1") == ExitStatus()
        second.signal(again, signal.SIGTERM)
        assert await second.wait(again) == ExitStatus(signal="SIGTERM")
        second.close()

    asyncio.run(body())


@pytest.mark.skipif(waiter_path() is None, reason="no C compiler to build souq-waiter")
def test_ready_waiters_start_machines_and_go_quietly(tmp_path: Path) -> None:
    async def body() -> None:
        driver = ExecDriver(tmp_path)
        first = driver.start(spec("sleep", "60", env={"GREETING": "hi"}))
        # A waiter is kept ready after a spawn; the next machine takes it.
        await eventually(lambda: len(driver.waiters.ready()) == 2, message="ready waiters")
        ready = {idle.pid for idle in driver.waiters.ready()}
        assert ready <= driver.owned_pids()  # the agent's reaper leaves them be
        echo = driver.start(
            spec(
                "sh",
                "-c",
                'echo "$GREETING $SOUQ_APP $PWD"',
                env={"GREETING": "hi"},
                machine_id="m2",
            )
        )
        assert driver._children[echo.pid] in ready
        assert await driver.wait(echo) == ExitStatus(code=0)
        assert driver.read_output("m2", 0, 100)[0] == f"hi demo {tmp_path / 'm2'}\n".encode()
        driver.signal(first, signal.SIGKILL)
        assert await driver.wait(first) == ExitStatus(signal="SIGKILL")
        idle = [i.pid for i in driver.waiters.ready()]
        driver.close()  # ready waiters get an empty job, exit, and are reaped (no zombies)
        assert not any(os.path.exists(f"/proc/{pid}") for pid in idle)

    asyncio.run(body())


@pytest.mark.skipif(waiter_path() is None, reason="no C compiler to build souq-waiter")
def test_a_ready_waiter_killed_while_it_waited_is_passed_over(tmp_path: Path) -> None:
    async def body() -> None:
        driver = ExecDriver(tmp_path)
        first = driver.start(spec("sleep", "60"))
        await eventually(lambda: len(driver.waiters.ready()) == 2, message="ready waiters")
        killed = [idle.pid for idle in driver.waiters.ready()]
        for pid in killed:
            os.kill(pid, signal.SIGKILL)
        await eventually(
            lambda: not any(pid_alive(pid) for pid in killed), message="the killed waiters to die"
        )
        second = driver.start(spec("sleep", "60", machine_id="m2"))
        assert pid_alive(second.pid)
        assert driver._children[second.pid] not in killed  # a new waiter runs it
        assert not any(os.path.exists(f"/proc/{pid}") for pid in killed)  # reaped, no zombies
        for handle in (first, second):
            driver.signal(handle, signal.SIGKILL)
            assert await driver.wait(handle) == ExitStatus(signal="SIGKILL")
        driver.close()

    asyncio.run(body())


@pytest.mark.skipif(waiter_path() is None, reason="no C compiler to build souq-waiter")
def test_a_program_that_cannot_be_exec_d_exits_127_with_the_reason_in_its_log(
    tmp_path: Path,
) -> None:
    async def body() -> None:
        bogus = tmp_path / "bogus"
        bogus.write_text("#!/no/such/interpreter\n")
        bogus.chmod(0o755)  # passes the check before the spawn; the exec itself fails
        driver = ExecDriver(tmp_path)
        handle = driver.start(spec(str(bogus)))
        assert await driver.wait(handle) == ExitStatus(code=127)
        out = driver.read_output("m1", 0, 1000)[0].decode()
        assert f"souq-waiter: cannot run {bogus}: No such file or directory" in out
        # A cgroup the child cannot join: it exits 127 before its exec, saying why.
        procs = tmp_path / "no" / "cgroup.procs"
        jailed = driver.start(
            spec("sleep", "60", machine_id="m2"), place=lambda spare: CgroupEntry(join=(procs,))
        )
        assert await driver.wait(jailed) == ExitStatus(code=127)
        out = driver.read_output("m2", 0, 1000)[0].decode()
        assert f"souq-waiter: cannot join cgroup {procs}: No such file or directory" in out
        driver.close()

    asyncio.run(body())


@pytest.mark.skipif(waiter_path() is None, reason="no C compiler to build souq-waiter")
def test_the_agent_takes_more_descriptors_and_machines_keep_its_old_limit(tmp_path: Path) -> None:
    """The agent holds a pidfd per running machine: it raises its soft RLIMIT_NOFILE to the
    hard one and still watches machines whose descriptors are past 1024 (no ``select``), while
    each machine gets the limit the agent started with."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard < 2048:
        pytest.skip("the hard descriptor limit is too low to try")
    resource.setrlimit(resource.RLIMIT_NOFILE, (1024, hard))
    machine_nofile.cache_clear()
    padding: list[int] = []

    async def body() -> None:
        driver = ExecDriver(tmp_path)
        assert resource.getrlimit(resource.RLIMIT_NOFILE)[0] == hard
        while len(padding) < 1100:  # the next descriptors are past select()'s 1024
            padding.append(os.open(os.devnull, os.O_RDONLY))
        handle = driver.start(spec("sh", "-c", "ulimit -n; exec sleep 60"))
        log = tmp_path / ".agent" / "m1" / "output.log"
        await eventually(lambda: log.exists() and log.read_text().strip() != "")
        assert log.read_text().split() == ["1024"]
        assert driver.inspect(handle)
        assert await driver.stop(handle, signal.SIGTERM, 5) == ExitStatus(signal="SIGTERM")
        assert not driver.inspect(handle)
        driver.close()

    try:
        asyncio.run(body())
    finally:
        for fd in padding:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
        machine_nofile.cache_clear()


@pytest.mark.skipif(waiter_path() is None, reason="no C compiler to build souq-waiter")
def test_a_machine_starts_with_no_signal_ignored_or_blocked(tmp_path: Path) -> None:
    """An ignored signal stays ignored across exec. Python ignores SIGPIPE and glibc's
    posix_spawn ignores its two internal signals in the waiter: a machine must inherit none of
    it (an ignored SIGPIPE turns ``yes | head`` into EPIPE errors)."""
    assert signal.getsignal(signal.SIGPIPE) == signal.SIG_IGN  # the agent's own, as in Python

    async def body() -> None:
        driver = ExecDriver(tmp_path)
        for machine_id in ("first", "second"):  # a waiter started at once, then a ready one
            handle = driver.start(
                spec("grep", "^Sig[IB]", "/proc/self/status", machine_id=machine_id)
            )
            assert await driver.wait(handle) == ExitStatus(code=0)
            out = driver.read_output(machine_id, 0, 1000)[0].decode().split()
            assert out == ["SigBlk:", "0" * 16, "SigIgn:", "0" * 16], out
        driver.close()

    asyncio.run(body())


@pytest.mark.parametrize("use_waiter", WAITER_MODES)
def test_meanwhile_runs_once_while_the_process_is_on_its_way(
    tmp_path: Path, use_waiter: bool
) -> None:
    """``start(meanwhile=...)``: the agent makes its claim durable while the process is
    spawned. It runs once, when the job is already in the waiter's hands (the waiter opens the
    machine's log before it forks, so the log appears while ``meanwhile`` waits for it), and
    before ``start`` returns."""

    async def body() -> None:
        driver = ExecDriver(tmp_path, use_waiter=use_waiter)
        log = tmp_path / ".agent" / "m1" / "output.log"
        calls: list[bool] = []

        def meanwhile() -> None:
            wait_until(log.exists, timeout=10, message="the waiter to take the job")
            calls.append(True)

        handle = driver.start(spec("sleep", "60"), meanwhile=meanwhile)
        assert calls == [True]
        assert driver.inspect(handle)
        assert driver.signal(handle, signal.SIGKILL)
        assert await driver.wait(handle) == ExitStatus(signal="SIGKILL")
        driver.close()

    asyncio.run(body())


@pytest.mark.parametrize("use_waiter", WAITER_MODES)
def test_a_failing_meanwhile_leaves_no_process(tmp_path: Path, use_waiter: bool) -> None:
    """If ``meanwhile`` raises (the claim could not be made durable), the process it overlapped
    is killed and reaped, and the error is the caller's: nothing runs unrecorded."""

    class Boom(Exception):
        pass

    async def body() -> None:
        driver = ExecDriver(tmp_path, use_waiter=use_waiter)
        before = driver.owned_pids()

        def meanwhile() -> None:
            raise Boom("the disk is full")

        with pytest.raises(Boom):
            driver.start(spec("sh", "-c", "echo $$ > pid.txt; exec sleep 60"), meanwhile=meanwhile)
        assert driver.owned_pids() == before
        pid_file = tmp_path / "m1" / "pid.txt"
        if pid_file.exists() and pid_file.read_text().strip():  # it got as far as its exec
            pid = int(pid_file.read_text())
            await eventually(lambda: not pid_alive(pid), message="the process to be gone")
        assert driver.find("m1") is None
        driver.close()

    asyncio.run(body())
