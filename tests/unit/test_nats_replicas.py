"""How many copies a new stream keeps (souq.bus.jetstream.replicas_for): of the nodes a client
knows, not only those its server names at the moment it connected."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, cast
from urllib.parse import urlparse

import pytest

from souq.bus.jetstream import REPLICAS_ENV, replicas_for


def client(listed: list[str], pool: list[str]) -> Any:
    return cast(
        Any,
        SimpleNamespace(_server_info={"connect_urls": listed}, servers=[urlparse(u) for u in pool]),
    )


def test_a_node_lost_before_the_client_reconnected_still_counts(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(REPLICAS_ENV, raising=False)
    # Reconnected after a node died: the server names the two left; the pool kept all three.
    nodes = ["nats://127.0.0.1:1", "nats://127.0.0.1:2", "nats://127.0.0.1:3"]
    assert replicas_for(client(["127.0.0.1:2", "127.0.0.1:3"], nodes)) == 3


def test_a_lone_server_or_two_nodes_keep_one_copy(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(REPLICAS_ENV, raising=False)
    assert replicas_for(client([], ["nats://127.0.0.1:4222"])) == 1
    two = ["nats://127.0.0.1:1", "nats://127.0.0.1:2"]
    assert replicas_for(client(["127.0.0.1:1", "127.0.0.1:2"], two)) == 1
    # The same node given twice is one node.
    assert replicas_for(client([], ["nats://127.0.0.1:1", "nats://127.0.0.1:1"])) == 1
