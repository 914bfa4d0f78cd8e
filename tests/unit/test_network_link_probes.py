"""The probes' task (souq.network.link_probes) against an overlay that records what it is told:
real processes stand in for ping (``true`` answers, ``false`` does not), due as the pure
schedule says (souq.network.mesh), one round at a time, and a wake brings a re-heard peer's
probe forward."""

from __future__ import annotations

import asyncio

from souq.network.link_probes import LinkProber
from souq.network.mesh import LinkProbe, Peer, next_probe_at, probe_address, probes_due


class _Overlay:
    """What LinkProber uses of an Overlay: the peers, the probes' record, the verdicts."""

    probe_source = probe_address("me")

    def __init__(self, peers: dict[str, Peer]) -> None:
        self.peers = peers
        self.probes: dict[str, LinkProbe] = {}
        self.told: list[tuple[str, str, bool]] = []
        self.changed = asyncio.Event()

    def probes_due(self, now: float, interval_s: float) -> list[Peer]:
        return probes_due(self.peers, self.probes, now, interval_s)

    def next_probe_at(self, interval_s: float) -> float | None:
        return next_probe_at(self.peers, self.probes, interval_s)

    def proved(self, worker_id: str, link: str, answered: bool, at: float) -> bool:
        self.probes[worker_id] = LinkProbe(link, at, answered, 0 if answered else 1)
        self.told.append((worker_id, link, answered))
        self.changed.set()
        return True


async def _until(overlay: _Overlay, count: int) -> None:
    async with asyncio.timeout(20):
        while len(overlay.told) < count:
            overlay.changed.clear()
            await overlay.changed.wait()


def test_each_link_peer_is_probed_and_the_answer_told_and_a_wake_probes_again() -> None:
    answering = {probe_address("a")}

    def command(source: str, target: str, deadline_s: float) -> list[str]:
        assert source == probe_address("me") and deadline_s == 2.0
        return ["true"] if target in answering else ["false"]

    peers = {
        "a": Peer("a", "10.0.0.2", link="fe80::a"),
        "b": Peer("b", "10.0.0.3", link="fe80::b"),
        "c": Peer("c", "10.9.0.4"),  # no link peer: never probed
    }
    overlay = _Overlay(peers)

    async def main() -> None:
        prober = LinkProber(overlay, interval_s=3600, command=command)  # type: ignore[arg-type]
        task = asyncio.create_task(prober.run())
        try:
            await _until(overlay, 2)
            assert sorted(overlay.told) == [("a", "fe80::a", True), ("b", "fe80::b", False)]
            # Heard anew (Overlay.heard marks it): probed at once, not an hour later.
            answering.add(probe_address("b"))
            overlay.probes["b"] = LinkProbe("fe80::b", 0.0, False, 1, recheck=True)
            prober.wake()
            await _until(overlay, 3)
            assert overlay.told[-1] == ("b", "fe80::b", True)
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    asyncio.run(main())
