"""`souq workers`' isolation column: how the worker's machines are reached from other workers."""

from __future__ import annotations

from souq.client.render import _isolation
from souq.model import Resources, WorkerInfo
from souq.model.worker import Fingerprint


def _worker(**fingerprint: str) -> WorkerInfo:
    isolation = {"default_driver": "sandbox", "namespaces": "pid,mount", "private_network": True}
    return WorkerInfo(
        id="w1",
        region="mad",
        capacity=Resources(cpus=2, memory_mb=1024),
        allocated=Resources(cpus=0, memory_mb=0),
        fingerprint=Fingerprint(
            hostname="h",
            os="linux",
            arch="x86_64",
            cpus=2,
            memory_mb=1024,
            isolation=isolation,
            **fingerprint,
        ),
    )


def test_the_way_other_workers_reach_its_machines_is_shown() -> None:
    assert _isolation(_worker(underlay="10.0.0.2")).endswith(
        "routed from other workers (to 10.0.0.2))"
    )
    over_link = _isolation(_worker(underlay="10.0.0.2", underlay_link="fe80::2"))
    assert "routed from other workers (over its link to fe80::2, else to 10.0.0.2)" in over_link
    encrypted = _isolation(_worker(underlay="10.0.0.2", underlay_key="k"))
    assert "(encrypted, to 10.0.0.2)" in encrypted
