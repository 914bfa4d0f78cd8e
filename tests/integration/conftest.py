from __future__ import annotations

from collections.abc import Iterator

import pytest

from souq.natsserver import NatsServer
from souq.testing import Cluster


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """A real cluster: nats-server, two agents in `mad` (4 cpus, 4096 MiB each), one broker."""
    with Cluster(tmp_path_factory.mktemp("cluster"), regions={"mad": 2}) as c:
        yield c


@pytest.fixture(scope="module")
def nats_url() -> Iterator[str]:
    """A real nats-server for the tests of one module."""
    with NatsServer() as server:
        yield server.url
