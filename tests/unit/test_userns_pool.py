"""The user namespaces idmapped mounts map through, made ahead (souq.drivers.userns)."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from souq.drivers.userns import UsernsPool

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("unshare") is None, reason="maps need root"
)


def namespace_maps(fd: int) -> list[str]:
    """The uid and gid maps of the namespace `fd` names, as a process in it reads them."""
    maps = ["/proc/self/uid_map", "/proc/self/gid_map"]
    out = subprocess.run(
        ["nsenter", f"--user=/proc/self/fd/{fd}", "cat", *maps],
        pass_fds=(fd,),
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return [" ".join(line.split()) for line in out.splitlines()]


def test_a_ready_namespace_is_mapped_to_the_uid_asked_and_the_pool_fills_again() -> None:
    pool = UsernsPool(size=2)
    try:
        assert pool.wait_ready(10)
        taken = [made.pid for made in pool._ready]
        first = pool.take(100_123)
        second = pool.take(100_456)
        try:
            assert namespace_maps(first) == ["0 100123 1", "0 100123 1"]
            assert namespace_maps(second) == ["0 100456 1", "0 100456 1"]
            assert (
                os.stat(f"/proc/self/fd/{first}").st_ino
                != os.stat(f"/proc/self/fd/{second}").st_ino
            )
        finally:
            os.close(first)
            os.close(second)
        assert pool.wait_ready(10)
        assert pool.ready() == 2
        # the processes whose namespaces were taken were reaped before the pool filled again
        assert not any(os.path.exists(f"/proc/{pid}") for pid in taken)
    finally:
        pool.close()
    assert pool.ready() == 0


def test_a_ready_process_that_died_is_replaced_by_one_made_then() -> None:
    pool = UsernsPool(size=1)
    try:
        assert pool.wait_ready(10)
        dead = pool._ready[0]
        os.kill(dead.pid, 9)
        os.waitpid(dead.pid, 0)
        fd = pool.take(100_789)
        try:
            assert namespace_maps(fd) == ["0 100789 1", "0 100789 1"]
        finally:
            os.close(fd)
    finally:
        pool.close()


def test_no_ready_process_outlives_the_pool() -> None:
    pool = UsernsPool(size=2)
    assert pool.wait_ready(10)
    pids = [made.pid for made in pool._ready]
    pool.close()
    for pid in pids:
        assert not os.path.exists(f"/proc/{pid}")


def test_a_ready_one_holds_no_descriptor_of_the_agent_s_even_an_inheritable_one() -> None:
    """A ready process lives until it is taken: a descriptor the agent has made inheritable
    for a moment (uvloop does, for the far end of an exec's output pipe while it spawns the
    command) must not stay open in it, or the exec never sees the end of its output."""
    read_end, write_end = os.pipe()
    os.set_inheritable(write_end, True)
    pool = UsernsPool(size=1)
    try:
        assert pool.wait_ready(10)
        (made,) = pool._ready
        held = {
            os.readlink(f"/proc/{made.pid}/fd/{fd}") for fd in os.listdir(f"/proc/{made.pid}/fd")
        }
        assert os.readlink(f"/proc/self/fd/{write_end}") not in held
        os.close(write_end)
        assert os.read(read_end, 1) == b""  # the pipe's only writer was ours: closed, it ends
    finally:
        pool.close()
        os.close(read_end)
