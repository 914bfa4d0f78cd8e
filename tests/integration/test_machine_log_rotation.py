"""A machine's output log is bounded (souq.drivers.logfile): it rotates while the machine
writes, nothing is lost or reordered, reads go on across a rotation, and a rotation that an
agent crash cut short is finished."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from souq.drivers import logfile
from souq.drivers.waiter import waiter_path
from tests.integration.agent_harness import APP, eventually, running_agent

BOUND = 64 * 1024


def lines(first: int, last: int) -> bytes:
    return b"".join(b"line %08d\n" % i for i in range(first, last))


def numbers(data: bytes) -> list[int]:
    """The numbers of the whole lines (the oldest byte kept may be in the middle of one)."""
    return [int(w[5:]) for w in data.decode().splitlines() if len(w) == 13 and w[:5] == "line "]


def read_all(workdir: Path, offset: int = 0) -> bytes:
    out = b""
    offset = max(offset, logfile.output_start(workdir))
    while True:
        data, _ = logfile.read_output(workdir, offset, 10_000)
        if not data:
            return out
        out += data
        offset += len(data)


def test_rotation_keeps_every_byte_in_order_and_reads_across_it(tmp_path: Path) -> None:
    log = tmp_path / logfile.LOG
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND)  # as a machine holds it
    try:
        os.write(fd, lines(0, 10_000))  # 140 000 bytes
        assert logfile.rotate(tmp_path, BOUND)
        os.write(fd, lines(10_000, 12_000))  # the machine's descriptor goes on writing
        # Kept: the newest BOUND bytes before the rotation, then everything after it, in order.
        kept = numbers(read_all(tmp_path))
        assert kept == list(range(kept[0], 12_000))
        assert 10_000 - kept[0] >= (BOUND - 4096) // 14
        assert (tmp_path / logfile.ROTATED).stat().st_size <= BOUND
        assert log.stat().st_size < os.statvfs(log).f_bsize + 28_000  # whole blocks moved out
        size = logfile.read_output(tmp_path, 0, 0)[1]
        assert size == len(lines(0, 12_000))  # offsets go on across the rotation
        # A reader that was at an offset still kept reads on from there.
        offset = size - len(lines(11_000, 12_000))
        assert numbers(logfile.read_output(tmp_path, offset, 1 << 20)[0]) == list(
            range(11_000, 12_000)
        )
        # Rotated twice: older output is gone, reads start at the oldest byte kept.
        os.write(fd, lines(12_000, 20_000))
        assert logfile.rotate(tmp_path, BOUND)
        kept = numbers(read_all(tmp_path))
        assert kept == list(range(kept[0], 20_000))
        assert kept[0] > 12_000
    finally:
        os.close(fd)


def test_a_rotation_cut_short_by_a_crash_is_finished(tmp_path: Path) -> None:
    log = tmp_path / logfile.LOG
    log.write_bytes(lines(0, 10_000))
    block = os.statvfs(log).f_bsize
    head = (log.stat().st_size - 1) // block * block
    # The agent died after renaming the copy into place, before the collapse.
    (tmp_path / logfile.ROTATED).write_bytes(log.read_bytes()[:head])
    (tmp_path / logfile.STATE).write_text(f'{{"base": 0, "rotating": {head}}}')
    logfile.recover(tmp_path)
    assert numbers(read_all(tmp_path)) == list(range(10_000))
    assert log.stat().st_size < head
    # Recovering again changes nothing; a copy never renamed is thrown away.
    (tmp_path / (logfile.ROTATED + ".tmp")).write_bytes(b"junk")
    logfile.recover(tmp_path)
    assert numbers(read_all(tmp_path)) == list(range(10_000))
    assert not (tmp_path / (logfile.ROTATED + ".tmp")).exists()


def test_a_real_agent_bounds_a_machine_s_log(nats_url: str, tmp_path: Path) -> None:
    """The machine writes 40 bounds' worth of numbered lines, then waits: neither file of its
    log is ever over the bound (its souq-waiter rotates as it writes; without one, the agent
    every second), and `logs` reads, from the oldest byte kept, every later line in order."""

    async def body() -> None:
        async with running_agent(nats_url, tmp_path, log_max_bytes=BOUND) as h:
            total = 40 * BOUND // 14
            script = (
                f"i=0; while [ $i -lt {total} ]; do printf 'line %08d\\n' $i; i=$((i+1)); "
                "done; echo done; sleep 60"
            )
            m = await h.claim(["sh", "-c", script])
            workdir = tmp_path / "machines" / ".agent" / m.id  # the agent's files of it
            by_waiter = h.agent._host_driver is not None and h.agent._host_driver.exec.bounds_logs

            async def done() -> bool:
                start = logfile.output_start(workdir)
                reply = await h.logs(m.id, offset=start)
                return reply.next_offset > start and "done" in read_all(workdir).decode()

            await eventually(done, timeout=60, message="the machine's last line")

            def bounded() -> bool:  # (without a waiter, checked every second)
                current = (workdir / logfile.LOG).stat().st_size
                return (by_waiter or h.agent.log_rotator.rotations >= 1) and current <= BOUND

            await eventually(bounded, timeout=10, message="the log back within its bound")
            assert (workdir / logfile.ROTATED).stat().st_size <= BOUND
            # Read through the agent, as `souq machine logs` does, from the start.
            text, offset = "", 0
            while True:
                reply = await h.logs(m.id, offset=offset)
                if not reply.data:
                    break
                if not text:
                    assert reply.next_offset - len(reply.data.encode()) >= 0
                text += reply.data
                offset = reply.next_offset
            got = numbers(text.encode())
            assert got == list(range(got[0], total)), "lost or reordered output"
            assert got[0] > 0  # the oldest output was rotated out
            assert text.endswith("done\n")
            assert APP

    asyncio.run(body())


@pytest.mark.skipif(waiter_path() is None, reason="rotations as it writes need souq-waiter")
def test_a_follower_reads_on_across_rotations(nats_url: str, tmp_path: Path) -> None:
    """Following the output (the long-polled reads `--follow` makes) while the log rotates
    many times as the machine writes: every line comes once and in order, to the last."""

    async def body() -> None:
        async with running_agent(nats_url, tmp_path, log_max_bytes=BOUND) as h:
            total = 20 * BOUND // 14
            script = (
                f"i=0; while [ $i -lt {total} ]; do printf 'line %08d\\n' $i; i=$((i+1)); "
                "done; echo done; sleep 60"
            )
            m = await h.claim(["sh", "-c", script])
            text, offset = "", 0
            while not text.endswith("done\n"):
                reply = await h.logs(m.id, offset=offset, wait_s=2.0)
                assert reply.next_offset >= offset
                text += reply.data
                offset = reply.next_offset
            got = numbers(text.encode())
            assert got == sorted(set(got)), "a line read twice or out of order"
            assert got[-1] == total - 1
            workdir = tmp_path / "machines" / ".agent" / m.id
            assert logfile.output_start(workdir) > 0  # it did rotate, more than once
            assert offset == logfile.read_output(workdir, 0, 0)[1]

    asyncio.run(body())
