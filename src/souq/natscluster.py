"""A NATS cluster on one machine: N nats-server nodes routed to each other, with JetStream
clustered over them (``souq dev --nats-cluster N`` and the tests of failover run one). Several
clusters joined by gateways make a supercluster (:func:`supercluster`): one per region, say.

Each node is a :class:`souq.natsserver.NatsServer` with its own port, route port, monitoring
port and store directory. :meth:`NatsCluster.start` returns once every node says it is healthy,
which includes JetStream having a leader; :attr:`NatsCluster.url` is the comma-separated list a
daemon's ``--nats`` takes.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from souq.errors import Unavailable
from souq.natsserver import Gateway, NatsServer, Peers, free_port

__all__ = ["NatsCluster", "supercluster"]


class NatsCluster:
    """``size`` clustered nats-server nodes named ``<name>-1`` ... under ``root``."""

    def __init__(
        self,
        root: Path,
        size: int = 3,
        *,
        name: str = "souq",
        config: Path | None = None,
        host: str = "127.0.0.1",
        ports: Sequence[int] | None = None,
    ) -> None:
        if size < 1:
            raise ValueError("a NATS cluster has at least one node")
        if ports is not None and len(ports) != size:
            raise ValueError(f"{len(ports)} client ports for {size} nodes")
        self.name = name
        self.root = root
        route_ports = [free_port(host) for _ in range(size)]
        routes = [f"nats://{host}:{p}" for p in route_ports]
        self.nodes = [
            NatsServer(
                port=(ports[i] or None) if ports is not None else None,
                store_dir=root / f"{name}-{i + 1}",
                host=host,
                config=config,
                peers=Peers(cluster=name, name=f"{name}-{i + 1}", route_port=rp, routes=routes),
            )
            for i, rp in enumerate(route_ports)
        ]
        self._gateway_ports: list[int] = []

    @property
    def url(self) -> str:
        """Every node's client URL, comma-separated (what ``--nats`` takes)."""
        return ",".join(node.url for node in self.nodes)

    @property
    def config(self) -> Path | None:
        return self.nodes[0].config

    @config.setter
    def config(self, path: Path | None) -> None:
        for node in self.nodes:
            node.config = path

    def join(self, others: Mapping[str, Sequence[str]]) -> None:
        """Join other clusters by gateways (``{cluster name: their gateway URLs}``); before
        :meth:`start`."""
        ports = self._gateway_ports_()
        for node, port in zip(self.nodes, ports, strict=True):
            node.gateway = Gateway(port=port, others=dict(others))

    def _gateway_ports_(self) -> list[int]:
        if not self._gateway_ports:
            self._gateway_ports = [free_port(n.host) for n in self.nodes]
        return self._gateway_ports

    @property
    def gateway_urls(self) -> list[str]:
        """Where other clusters reach this one's gateways (one per node)."""
        ports = self._gateway_ports_()
        return [f"nats://{n.host}:{p}" for n, p in zip(self.nodes, ports, strict=True)]

    def start(self, timeout: float = 30.0) -> None:
        """Start every node, and return once each is healthy (routed, JetStream current)."""
        self.launch(timeout)
        self.wait_healthy(timeout)

    def launch(self, timeout: float = 30.0) -> None:
        """Start every node (each accepting clients), without waiting for the cluster to
        form."""
        try:
            for node in self.nodes:
                node.start(timeout=timeout)
        except BaseException:
            self.stop()
            raise

    def wait_healthy(self, timeout: float = 30.0, nodes: Sequence[NatsServer] = ()) -> None:
        """Until every running node (or those given) says it is healthy."""
        deadline = time.monotonic() + timeout
        while True:
            dead = [n for n in (nodes or self.nodes) if n.process is not None and not n.running]
            if dead:  # the others would wait out the timeout for it
                raise Unavailable(f"NATS node {dead[0].url} exited: {dead[0].log_tail()}")
            sick = [n.url for n in (nodes or self.nodes) if n.running and not n.healthy()]
            if not sick:
                return
            if time.monotonic() > deadline:
                raise Unavailable(f"NATS nodes {', '.join(sick)} are not healthy after {timeout}s")
            time.sleep(0.05)

    def reload(self) -> None:
        """Every node reads its configuration again (an agent's credential was added)."""
        for node in self.nodes:
            node.reload()

    def stop(self, *, keep_store: bool = False) -> None:
        """Stop every node (``keep_store``: for a :meth:`start` to come)."""
        for node in self.nodes:
            node.stop(keep_store=keep_store)

    def __enter__(self) -> NatsCluster:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


def supercluster(
    root: Path, sizes: Mapping[str, int], *, config: Path | None = None
) -> dict[str, NatsCluster]:
    """Clusters named by ``sizes``' keys (``{"mad": 3, "syd": 1}``), each joined to all the
    others by gateways; not started."""
    clusters = {
        name: NatsCluster(root / name, size, name=name, config=config)
        for name, size in sizes.items()
    }
    for name, cluster in clusters.items():
        cluster.join({o: c.gateway_urls for o, c in clusters.items() if o != name})
    return clusters
