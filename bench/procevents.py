"""Process starts and exits as the kernel reports them: the process connector (``cn_proc``, a
netlink socket; root only, Linux), read by one thread.

The supervision benchmark (``bench/supervise.py``) uses it as the one stopwatch for every
supervisor: a program counts as running at the moment its ``execve`` completes, and the time is
the kernel's own (``CLOCK_MONOTONIC`` nanoseconds, the same clock as ``time.monotonic_ns``), so
no supervisor is timed through its own API and the reading thread's delays do not count.

A tracked program runs ``sleep MARKER`` (``MARKER`` is unique to a benchmark phase) and carries
its name in the environment variable ``SOUQ_MACHINE_ID``: Souq sets it for each machine, and the
benchmark sets it in the program's environment for the other supervisors.
"""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import socket
import struct
import threading
import time
from collections import defaultdict
from dataclasses import dataclass
from types import TracebackType

__all__ = ["KEY_VAR", "ProcEvents", "Start"]

KEY_VAR = "SOUQ_MACHINE_ID"

_NETLINK_CONNECTOR = 11
_CN_IDX_PROC = 1
_CN_VAL_PROC = 1
_PROC_CN_MCAST_LISTEN = 1
_NLMSG_DONE = 3
_NLMSG_HDR = struct.Struct("=IHHII")  # len, type, flags, seq, pid
_CN_MSG = struct.Struct("=IIIIHH")  # idx, val, seq, ack, len, flags
_EVENT_HDR = struct.Struct("=IIQ")  # what, cpu, timestamp_ns
_PIDS = struct.Struct("=II")  # pid, tgid
_PROC_EVENT_EXEC = 0x00000002
_PROC_EVENT_EXIT = 0x80000000
_EVENT_AT = _NLMSG_HDR.size + _CN_MSG.size
_DATA_AT = _EVENT_AT + _EVENT_HDR.size
_RCVBUF = 32 * 2**20  # enough for thousands of events while the reader is descheduled


@dataclass(frozen=True)
class Start:
    key: str  # the program's name (its SOUQ_MACHINE_ID)
    pid: int
    at_ns: int  # when its exec completed, kernel CLOCK_MONOTONIC


class ProcEvents:
    """Every exec of ``sleep MARKER`` for a tracked marker, and the exits of those processes."""

    def __init__(self) -> None:
        self._sock = socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, _NETLINK_CONNECTOR)
        with contextlib.suppress(OSError):  # SO_RCVBUFFORCE: past rmem_max, as root
            self._sock.setsockopt(socket.SOL_SOCKET, 33, _RCVBUF)
        self._sock.bind((0, _CN_IDX_PROC))
        self._sock.settimeout(0.2)  # so that the reader notices close()
        listen = struct.pack("=I", _PROC_CN_MCAST_LISTEN)
        cn = _CN_MSG.pack(_CN_IDX_PROC, _CN_VAL_PROC, 0, 0, len(listen), 0) + listen
        self._sock.send(_NLMSG_HDR.pack(_NLMSG_HDR.size + len(cn), _NLMSG_DONE, 0, 0, 0) + cn)
        self._markers: set[bytes] = set()
        self._starts: dict[str, list[Start]] = defaultdict(list)  # by marker
        self._exits: dict[int, int] = {}  # pid -> exit time, for tracked pids
        self._tracked: set[int] = set()
        self.dropped = 0  # receive-buffer overruns: events lost (should stay 0)
        self._cond = threading.Condition()
        self._closed = False
        self._thread = threading.Thread(target=self._read, name="procevents", daemon=True)
        self._thread.start()

    # -- reading -------------------------------------------------------------------------------

    def _read(self) -> None:
        while not self._closed:
            try:
                data = self._sock.recv(65536)
            except TimeoutError:
                continue
            except OSError as exc:
                if exc.errno == errno.ENOBUFS:
                    self.dropped += 1
                    continue
                return  # closed
            self._parse(data)

    def _parse(self, data: bytes) -> None:
        offset = 0
        while offset + _DATA_AT <= len(data):
            length = _NLMSG_HDR.unpack_from(data, offset)[0]
            what, _cpu, at_ns = _EVENT_HDR.unpack_from(data, offset + _EVENT_AT)
            _pid, tgid = _PIDS.unpack_from(data, offset + _DATA_AT)
            if what == _PROC_EVENT_EXEC:
                self._on_exec(tgid, at_ns)
            elif what == _PROC_EVENT_EXIT and tgid in self._tracked:
                with self._cond:
                    self._exits[tgid] = at_ns
                    self._cond.notify_all()
            offset += max(length, _NLMSG_HDR.size)
            offset = (offset + 3) & ~3

    def _on_exec(self, pid: int, at_ns: int) -> None:
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
        except OSError:
            return
        if len(argv) < 2 or argv[1] not in self._markers:
            return
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                env = f.read().split(b"\0")
        except OSError:
            return
        prefix = KEY_VAR.encode() + b"="
        key = next((v[len(prefix) :].decode() for v in env if v.startswith(prefix)), "")
        with self._cond:
            self._tracked.add(pid)
            self._starts[argv[1].decode()].append(Start(key, pid, at_ns))
            self._cond.notify_all()

    # -- asking --------------------------------------------------------------------------------

    def track(self, marker: str) -> None:
        self._markers.add(marker.encode())

    def watch_exit(self, pid: int) -> None:
        """Record the exit of ``pid`` too (say, the parent of a tracked program)."""
        with self._cond:
            self._tracked.add(pid)

    def _wait(self, ready: object, timeout: float, what: str) -> None:
        with self._cond:
            if not self._cond.wait_for(ready, timeout):  # type: ignore[arg-type]
                raise TimeoutError(f"timed out after {timeout:g}s waiting for {what}")

    def first_starts(self, marker: str, since_ns: int) -> dict[str, Start]:
        """The first start of each program of ``marker`` at or after ``since_ns``."""
        out: dict[str, Start] = {}
        with self._cond:
            for start in self._starts[marker]:
                if start.at_ns >= since_ns and start.key not in out:
                    out[start.key] = start
        return out

    def wait_all(self, marker: str, n: int, since_ns: int, timeout: float) -> dict[str, Start]:
        """Until ``n`` programs of ``marker`` have started since ``since_ns``."""
        self._wait(
            lambda: len(self.first_starts(marker, since_ns)) >= n,
            timeout,
            f"{n} programs to start",
        )
        return self.first_starts(marker, since_ns)

    def wait_start(self, marker: str, key: str, since_ns: int, timeout: float) -> Start:
        """Until program ``key`` of ``marker`` has started since ``since_ns``."""
        found: list[Start] = []

        def started() -> bool:
            for start in reversed(self._starts[marker]):
                if start.key == key and start.at_ns >= since_ns:
                    found.append(start)
                    return True
            return False

        self._wait(started, timeout, f"program {key} to start again")
        return found[0]

    def exit_ns(self, pid: int) -> int | None:
        with self._cond:
            return self._exits.get(pid)

    def wait_gone(self, pids: list[int], timeout: float) -> None:
        """Until every one of ``pids`` has exited (and been reaped, or is a zombie)."""
        deadline = time.monotonic() + timeout
        for pid in pids:
            while _alive(pid):
                if time.monotonic() > deadline:
                    raise TimeoutError(f"process {pid} did not exit within {timeout:g}s")
                time.sleep(0.005)

    def kill_leftovers(self) -> int:
        """SIGKILL every tracked process still running (a supervisor that failed to stop its
        programs, or died); returns how many there were."""
        killed = 0
        with self._cond:
            pids = sorted(self._tracked)
        for pid in pids:
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    argv = f.read().split(b"\0")
            except OSError:
                continue
            if len(argv) >= 2 and argv[1] in self._markers:  # the same process, not a reused pid
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
                    killed += 1
        return killed

    # -- life ----------------------------------------------------------------------------------

    def close(self) -> None:
        self._closed = True
        self._thread.join(1.0)
        self._sock.close()

    def __enter__(self) -> ProcEvents:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.kill_leftovers()
        self.close()


def _alive(pid: int) -> bool:
    """True while ``pid`` runs (a zombie counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError:
        return False
    return data[data.rindex(b")") + 2 : data.rindex(b")") + 3] != b"Z"
