"""Hosts as network namespaces (souq.multihost): root only, with ip, tc and iptables."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from souq.multihost import Hosts
from souq.netns import missing

REGIONS = ["mad", "mad", "mad", "syd"]  # three hosts in mad (the broker on the first), one in syd
HEARTBEAT_S = 0.5


@pytest.fixture(scope="module")
def hosts(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Hosts]:
    """Four hosts, each a namespace with its NATS node and its agent; torn down however the
    module ends."""
    reason = missing()
    if reason is not None:
        pytest.skip(f"hosts as network namespaces: {reason}")
    with Hosts(
        tmp_path_factory.mktemp("hosts"), REGIONS, heartbeat_interval_s=HEARTBEAT_S
    ) as built:
        yield built
