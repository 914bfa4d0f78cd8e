"""User namespaces for idmapped mounts, made ahead of the start that needs one.

An idmapped mount (:mod:`souq.drivers.rootfs`) maps through a user namespace in which 0 is the
machine's uid outside. Making one takes a process: ``unshare --user cat``, spawned with
``Popen`` (a vfork, every other descriptor closed), which has unshared once ``cat`` echoes a
byte back; its maps are then written from outside and its namespace is kept by a descriptor
after it is killed. Spawning it is most of a sandboxed start's root mount (about 3.7 ms of 4.4
on a quiet box), so :class:`UsernsPool` keeps a few such processes ready, unshared but with no
maps yet (a map can be written once, so a ready one serves any uid), and makes the next ones in
a thread of its own after each take. A start that finds none ready makes its own, as before.

A ready process holds nothing: its namespace has no map and so no rights, and it reads a pipe
the agent holds, so it exits when the agent does.
"""

from __future__ import annotations

import collections
import contextlib
import errno
import os
import signal
import subprocess
import threading
from dataclasses import dataclass

from souq.drivers.base import SpawnError

__all__ = ["USERNS", "UsernsPool"]


@dataclass(frozen=True)
class _Unshared:
    """One ``unshare --user cat`` that has unshared; its maps are not written yet."""

    proc: subprocess.Popen[bytes]
    to_cat: int  # its stdin: closed, it exits
    from_cat: int

    @property
    def pid(self) -> int:
        return self.proc.pid

    def close(self) -> None:
        self.proc.kill()  # nothing when it is gone, or reaped already
        self.proc.wait()
        for fd in (self.to_cat, self.from_cat):
            os.close(fd)


def _unshared() -> _Unshared:
    """A ready process. ``Popen`` (a vfork, and every other descriptor closed in the child),
    not ``posix_spawn``: a ready one lives until it is taken, and a descriptor the event loop
    has made inheritable for a moment (the far end of an ``exec``'s output pipe while uvloop
    spawns its command) would stay open in it as long, and the ``exec`` would never see the
    end of its output."""
    to_cat, cat_in = os.pipe2(os.O_CLOEXEC)
    cat_out, from_cat = os.pipe2(os.O_CLOEXEC)
    try:
        proc = subprocess.Popen(
            ["unshare", "--user", "--", "cat"],
            stdin=to_cat,
            stdout=from_cat,
            stderr=subprocess.DEVNULL,
            env={"PATH": os.environ.get("PATH", os.defpath)},
            close_fds=True,
        )
    except OSError:
        os.close(cat_in)
        os.close(cat_out)
        raise
    finally:
        os.close(to_cat)
        os.close(from_cat)
    made = _Unshared(proc, cat_in, cat_out)
    try:
        os.write(cat_in, b"\n")
        if os.read(cat_out, 1) != b"\n":
            raise OSError(errno.ESRCH, "unshare --user exited without making the namespace")
    except OSError:
        made.close()
        raise
    return made


def _mapped(made: _Unshared, uid: int) -> int:
    """Map 0 inside ``made``'s namespace to ``uid`` and return a descriptor of the namespace.
    ``made`` is killed (its namespace lives on by the descriptor) but not yet reaped."""
    try:
        for name in ("uid_map", "gid_map"):
            with open(f"/proc/{made.pid}/{name}", "w") as f:
                f.write(f"0 {uid} 1\n")
        return os.open(f"/proc/{made.pid}/ns/user", os.O_RDONLY | os.O_CLOEXEC)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(made.pid, signal.SIGKILL)


class UsernsPool:
    """Up to ``size`` unshared processes kept ready (see the module's doc)."""

    def __init__(self, size: int = 2) -> None:
        self.size = size
        self._ready: collections.deque[_Unshared] = collections.deque()
        self._spent: collections.deque[_Unshared] = collections.deque()  # killed, to reap
        self._lock = threading.Condition()
        self._filling = False

    def take(self, uid: int) -> int:
        """A descriptor of a user namespace in which 0 is ``uid`` outside (the caller closes
        it)."""
        with self._lock:
            made = self._ready.popleft() if self._ready else None
        try:
            if made is not None:
                try:
                    return _mapped(made, uid)
                except OSError:
                    pass  # it died while it waited: make one now
                finally:
                    self._spent.append(made)
            made = _unshared()
            try:
                return _mapped(made, uid)
            finally:
                self._spent.append(made)
        except OSError as exc:
            raise SpawnError(f"cannot make the user namespace of uid {uid}: {exc}") from exc
        finally:
            self.warm()  # reaps the spent ones (a killed process takes a while to go)

    def warm(self) -> None:
        """Make ready ones in the background until there are ``size``."""
        with self._lock:
            if self._filling or (len(self._ready) >= self.size and not self._spent):
                return
            self._filling = True
        threading.Thread(target=self._fill, name="souq-userns", daemon=True).start()

    def ready(self) -> int:
        with self._lock:
            return len(self._ready)

    def wait_ready(self, timeout: float) -> bool:
        """Whether ``size`` are ready within ``timeout`` seconds (started if they were not)."""
        self.warm()
        with self._lock:
            return self._lock.wait_for(lambda: len(self._ready) >= self.size, timeout)

    def _fill(self) -> None:
        try:
            while True:
                while self._spent:  # deque: appends and pops are atomic
                    self._spent.popleft().close()
                with self._lock:
                    if len(self._ready) >= self.size:
                        return
                try:
                    made = _unshared()
                except OSError:
                    return  # the next take makes its own, and says why if it cannot
                with self._lock:
                    self._ready.append(made)
                    self._lock.notify_all()
        finally:
            with self._lock:
                self._filling = False
                self._lock.notify_all()

    def close(self) -> None:
        with self._lock:
            ready, self._ready = list(self._ready), collections.deque()
        while self._spent:
            ready.append(self._spent.popleft())
        for made in ready:
            made.close()


USERNS = UsernsPool()
