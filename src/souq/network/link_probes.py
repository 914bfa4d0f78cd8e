"""The probes of link peers' paths (:mod:`souq.network.mesh`, ``--underlay-link auto``): the
one task that runs them for a worker's :class:`~souq.network.overlay.Overlay` and tells it
what they said.

A probe is iputils' ``ping`` (:func:`~souq.network.mesh.probe_command`) from this worker's
probe address to the peer's, which the overlay routes via the peer's link-local address on
the underlay device, so it takes the path that the machines' packets would take straight: a
packet of this worker's /48 to the other's /48, over the segment, into the other host. An
answer proves the segment carries them (what a ping of the peer's link-local address alone
would not: a network may carry neighbour discovery and drop the rest); none, and the peer
stays on VXLAN or goes back to it. One round at a time: the probes due (at most
:data:`CONCURRENCY` processes at once), each bounded by its deadline, their answers given to
the overlay, then a wait until the next is due or :meth:`LinkProber.wake` (a peer heard).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable

from souq.network.mesh import PROBE_DEADLINE_S, PROBE_INTERVAL_S, Peer, probe_address, probe_command
from souq.network.overlay import Overlay

__all__ = ["CONCURRENCY", "LinkProber"]

log = logging.getLogger(__name__)

CONCURRENCY = 8  # probes running at once


class LinkProber:
    """Runs ``overlay``'s probes (:meth:`run`, a task of its owner's, cancelled to stop)."""

    def __init__(
        self,
        overlay: Overlay,
        *,
        interval_s: float = PROBE_INTERVAL_S,
        deadline_s: float = PROBE_DEADLINE_S,
        clock: Callable[[], float] = time.monotonic,
        command: Callable[[str, str, float], list[str]] = probe_command,
    ) -> None:
        """``command``: a probe's argv from (source, target, deadline)."""
        self.overlay = overlay
        self.command = command
        self.interval_s = interval_s
        self.deadline_s = deadline_s
        self.clock = clock
        self._wake = asyncio.Event()
        self._slots = asyncio.Semaphore(CONCURRENCY)

    def wake(self) -> None:
        """Look for probes due now (a peer was heard: its path is due again)."""
        self._wake.set()

    async def run(self) -> None:
        while True:
            self._wake.clear()  # before reading what is due: a wake meanwhile is kept
            due = self.overlay.probes_due(self.clock(), self.interval_s)
            if due:
                answers = await asyncio.gather(*(self._probe(p) for p in due))
                for peer, answered in zip(due, answers, strict=True):
                    try:
                        self.overlay.proved(peer.worker_id, peer.link, answered, self.clock())
                    except OSError as exc:  # the routes as they were: probed again later
                        log.warning("private network: the routes to %s: %s", peer.worker_id, exc)
                continue
            at = self.overlay.next_probe_at(self.interval_s)
            timeout = None if at is None else max(0.0, at - self.clock())
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timeout):
                    await self._wake.wait()

    async def _probe(self, peer: Peer) -> bool:
        """Whether the probe of ``peer``'s path was answered (the process killed if the task
        is cancelled meanwhile)."""
        argv = self.command(
            self.overlay.probe_source, probe_address(peer.worker_id), self.deadline_s
        )
        async with self._slots:
            try:
                proc = await asyncio.create_subprocess_exec(
                    *argv, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL
                )
            except OSError as exc:
                log.warning("private network: no probe of %s's link: %s", peer.worker_id, exc)
                return False
            try:
                return await proc.wait() == 0
            finally:
                if proc.returncode is None:
                    proc.kill()
                    await asyncio.shield(proc.wait())
