"""The parts of a sandboxed start, timed apart from the claims of ``bench isolation``.

* :func:`parts`: a user namespace for an idmap (made then, and taken ready-made), a machine's
  root mounted whole and the overlay alone, each in this process;
* :func:`in_the_driver`: :class:`~souq.drivers.host.HostDriver.start` in this process, with no
  NATS, admission or op log around it, for an exec machine, a sandboxed one started cold (a
  driver that makes no slot) and one that takes a slot made ahead (:mod:`souq.drivers.warm`),
  interleaved; to the program's ``execve`` (the process connector) and the call's own time,
  with the driver's steps timed by wrapping them (each wrapper adds about a microsecond).
"""

from __future__ import annotations

import asyncio
import functools
import os
import statistics
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from bench.procevents import ProcEvents
from bench.stats import percentile
from souq.drivers import cgroups, host, rootfs, userns, warm
from souq.drivers import exec as exec_driver
from souq.drivers.base import Limits, MachineSpec
from souq.drivers.identity import MachineIds

__all__ = ["in_the_driver", "ms", "parts"]

GUEST = Limits(memory_mb=64, cpus=1)
# The driver's steps: (owner, attribute, name in the results).
STEPS = (
    (MachineIds, "user", "a uid taken"),
    (rootfs.MachineRoot, "mount", "the machine's root mounted"),
    (cgroups.Cgroups, "prepare", "its cgroup prepared"),
    (exec_driver.ExecDriver, "_run_job", "the waiter's hand-off (cold)"),
    (warm.WarmSandboxes, "_cgroup", "warm: the slot's spare cgroup made the machine's"),
    (warm.WarmSandboxes, "_hand_over", "warm: the slot's uid and root handed over"),
    (warm, "_send", "warm: the job to the waiter, until its report"),
)


def ms(values: list[float]) -> dict[str, float]:
    out = [v * 1000 for v in values]
    return {
        "n": len(out),
        "p50": round(statistics.median(out), 2),
        "p90": round(percentile(out, 90), 2),
        "min": round(min(out), 2),
    }


def parts(image_root: Path, root: Path, uid: int, rounds: int) -> dict[str, Any]:
    """A sandboxed start's parts, each alone, interleaved: a user namespace of ``uid`` made
    then and taken ready-made (:mod:`souq.drivers.userns`), a machine's root mounted whole
    (user namespace, idmapped mount, overlay) and the overlay without the idmap; each then
    taken down."""
    times: dict[str, list[float]] = {
        "userns": [],
        "userns_ready": [],
        "root_mount": [],
        "overlay_alone": [],
    }
    for r in range(rounds):
        t0 = time.perf_counter()
        fd = userns._mapped(userns._unshared(), uid)
        times["userns"].append(time.perf_counter() - t0)
        os.close(fd)
        userns.USERNS.wait_ready(5)
        t0 = time.perf_counter()
        fd = userns.USERNS.take(uid)
        times["userns_ready"].append(time.perf_counter() - t0)
        os.close(fd)
        userns.USERNS.wait_ready(5)
        for name, owner in (("root_mount", uid), ("overlay_alone", None)):
            machine_root = rootfs.MachineRoot(root / f"part-{name}-{r}", image_root, owner)
            t0 = time.perf_counter()
            machine_root.mount(persist=False)
            times[name].append(time.perf_counter() - t0)
            machine_root.remove()
    return {name: ms(values) for name, values in times.items()}


@contextmanager
def _timed(times: dict[str, list[float]]) -> Iterator[None]:
    """The driver's steps wrapped to note their durations, for the block's length."""
    saved = [(owner, name, getattr(owner, name)) for owner, name, _ in STEPS]
    for (owner, name, label), (_, _, f) in zip(STEPS, saved, strict=True):
        setattr(owner, name, _wrap(f, times.setdefault(label, [])))
    try:
        yield
    finally:
        for owner, name, f in saved:
            setattr(owner, name, f)


def _wrap(f: Callable[..., Any], into: list[float]) -> Callable[..., Any]:
    @functools.wraps(f)
    def timed(*args: Any, **kwargs: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return f(*args, **kwargs)
        finally:
            into.append(time.perf_counter() - t0)

    return timed


def in_the_driver(
    image_root: Path, root: Path, hostbin: Path, marker: str, events: ProcEvents, rounds: int
) -> dict[str, Any]:
    """HostDriver.start alone: exec, sandbox cold, sandbox warm (see the module's docstring)."""
    return asyncio.run(_in_the_driver(image_root, root, hostbin, marker, events, rounds))


async def _in_the_driver(
    image_root: Path, root: Path, hostbin: Path, marker: str, events: ProcEvents, rounds: int
) -> dict[str, Any]:
    drivers = {
        "exec": host.HostDriver(root / "exec", ids=MachineIds()),
        "sandbox, cold": host.HostDriver(root / "cold", ids=MachineIds()),
        "sandbox, warm": host.HostDriver(root / "warm", ids=MachineIds()),
    }
    drivers["sandbox, cold"].warm.enabled = False
    calls: dict[str, list[float]] = {k: [] for k in drivers}
    execs: dict[str, list[float]] = {k: [] for k in drivers}
    steps: dict[str, list[float]] = {}
    sleep = (str(hostbin / "bin" / "sleep"), marker)
    try:
        for r in range(rounds + 2):  # the first two make the warm driver's slot, and warm up
            for kind, d in drivers.items():
                mid = f"parts-{uuid.uuid4().hex[:10]}"
                spec = MachineSpec(mid, "bench", "mad", "w", sleep, {}, limits=GUEST)
                if kind != "exec":
                    spec = MachineSpec(
                        mid, "bench", "mad", "w", ("sleep", marker), {}, driver="sandbox",
                        image_root=str(image_root), limits=GUEST,
                    )  # fmt: skip
                with _timed(steps if r >= 2 else {}):
                    t0 = time.monotonic_ns()
                    handle = d.start(spec)
                    t1 = time.monotonic_ns()
                start = events.wait_start(marker, mid, t0, 30)
                if r >= 2:
                    calls[kind].append((t1 - t0) / 1e9)
                    execs[kind].append((start.at_ns - t0) / 1e9)
                await d.stop(handle, 9, 5)
                events.wait_gone([start.pid], 30)
                d.destroy(mid)
                await _slot_ready(d)
    finally:
        for d in drivers.values():
            d.close()
    return {
        "start_call_ms": {k: ms(v) for k, v in calls.items()},
        "to_execve_ms": {k: ms(v) for k, v in execs.items()},
        "steps_ms": {k: ms(v) for k, v in steps.items() if v},
        "warm_taken": drivers["sandbox, warm"].warm.taken,
    }


async def _slot_ready(d: host.HostDriver) -> None:
    """Until a driver that makes slots has one (each round's start finds one, as in the
    claims' rounds); at most a second."""
    for _ in range(100):
        if not d.warm.enabled or d.warm.ready():
            return
        await asyncio.sleep(0.01)
