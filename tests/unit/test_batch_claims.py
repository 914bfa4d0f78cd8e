"""How many machines one batch claim carries: as many as a reply holding each in full fits."""

from __future__ import annotations

from souq.model.batch import machines_per_claim
from souq.model.machine import MachineConfig


def test_a_claim_carries_what_its_reply_can_hold() -> None:
    small = MachineConfig(cmd=["serve"])
    big = MachineConfig(cmd=["serve"], env={f"V{i}": "x" * 1000 for i in range(60)})
    mib = 1024 * 1024
    assert 50 <= machines_per_claim(small, None, mib) <= 200
    assert machines_per_claim(big, None, mib) == 8  # ~64 KB each: 8 in half a MiB
    assert machines_per_claim(big, None, 64 * 1024) == 1  # never none
    assert machines_per_claim(small, None, 8 * mib) >= 8 * machines_per_claim(small, None, mib)
