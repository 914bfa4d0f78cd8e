"""Several hosts on one machine, for real: each a network namespace with its own address, its
own nats-server (one node of a NATS cluster routed over the hosts' links) and its own ``souq
agent``; one broker, on the first host. Built on :mod:`souq.netns`; needs root.

Every daemon lists only its own host's NATS node in ``--nats``: its connection never crosses the
network, as on hosts that each run a node, so a partition cuts the *routes* between nodes and
not a client's connection. A partitioned agent stays connected to its node and goes on running
its machines; nobody outside hears it until the partition heals, when the routes come back and
its heartbeats reach the broker again. (Listing the other nodes too would only matter when a
host's own node dies; then the agent would fail over across the network.)

With ``private_network=True`` every agent runs ``--private-network on`` with its host's IPv6
address as its ``--underlay`` (or what ``underlay`` says: the IPv4 one, for VXLAN): sandboxed
machines (of uids of their own, so ``root`` must be reachable by them: mode 0711, not under
pytest's base) on each host's private network, routed to the other hosts' (docs/network.md).

Secured as ``souq cluster init`` makes a cluster: one auth directory for every host (its
credentials made before the nodes start), ``SOUQ_AUTH_DIR`` and ``SOUQ_TOKEN`` set in this
process's environment while the hosts run.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Self

import httpx

from souq.auth.bus import add_agent, init_bus, worker_id_for
from souq.auth.files import AuthDir
from souq.lifespan import Lifespan
from souq.natsserver import NatsServer, Peers
from souq.netns import NetHost, Network, netns_exec
from souq.network.links import NETNS_DIR
from souq.testing import AgentProcess, BrokerProcess, auth_headers, environment, wait_until

__all__ = ["CLIENT_PORT", "Host", "Hosts"]

CLIENT_PORT = 4222  # every host has its own addresses: the same ports on each
ROUTE_PORT = 6222
MONITOR_PORT = 8222
BROKER_PORT = 4280


@dataclass(eq=False)
class Host:
    """One host: its place on the network, its region, its NATS node and its agent."""

    net: NetHost
    region: str
    nats: NatsServer
    agent: AgentProcess

    @property
    def name(self) -> str:
        return self.net.namespace

    @property
    def worker_id(self) -> str:
        assert self.agent.worker_id is not None, "the agent has not started"
        return self.agent.worker_id


def _private_network(
    net: NetHost, underlay: str = "", encryption: str = "none", link: str = ""
) -> dict[str, Any]:
    """An agent's arguments for machines on the private network, routed over ``underlay``
    (default: the host's IPv6 address, on the hosts' one segment: routed straight), with
    ``--underlay-link link`` (empty: the agent's default)."""
    return {
        "machine_user": None,  # a uid per machine
        "default_driver": None,  # the sandbox
        "extra_args": [
            "--advertise",  # where a proxy of another host reaches its machines (edge ports)
            net.address,
            "--private-network",
            "on",
            "--underlay",
            underlay or net.address6,
            "--underlay-encryption",
            encryption,
            *(["--underlay-link", link] if link else []),
        ],
    }


def _forget_machine_namespaces(hosts: Sequence[Host]) -> None:
    """The names the hosts' agents gave their machines' namespaces: each agent bound them in
    the mount namespace of its host's ``ip netns exec``, gone with it, so only the empty
    files are left in ``/run/netns``."""
    for host in hosts:
        if host.agent.worker_id is None:
            continue
        tag = hashlib.blake2b(host.agent.worker_id.encode(), digest_size=3).hexdigest()
        for path in NETNS_DIR.glob(f"souq-{tag}-*"):
            with contextlib.suppress(OSError):
                if not os.path.ismount(path):
                    path.unlink()


class Hosts(Lifespan):
    """One host per entry of ``regions`` (its region), under ``root``; a context manager that
    tears everything down (processes, namespaces, bridge, rules) however it ends."""

    def __init__(
        self,
        root: Path,
        regions: Sequence[str],
        *,
        heartbeat_interval_s: float = 1.0,
        cpus: float = 2,
        memory_mb: int = 1024,
        auth: bool = True,
        private_network: bool = False,
        underlay: Callable[[NetHost], str] = lambda net: net.address6,
        underlay_encryption: str = "none",
        underlay_link: str = "",
    ) -> None:
        """``underlay``: each host's agent's ``--underlay`` with ``private_network`` (its
        IPv4 address: over VXLAN, or straight over the hosts' segment once probed);
        ``underlay_encryption``, ``underlay_link``: its ``--underlay-encryption``,
        ``--underlay-link`` (empty: the agent's default, ``auto``)."""
        self.root = root
        self.network = Network(len(regions))
        self.auth: AuthDir | None = None
        self._secured = auth
        self._environment = contextlib.ExitStack()
        routes = [f"nats://{h.address}:{ROUTE_PORT}" for h in self.network.hosts]
        self.hosts = [
            Host(
                net=net,
                region=region,
                nats=NatsServer(
                    port=CLIENT_PORT,
                    store_dir=root / f"nats-{net.index}",
                    host=net.address,
                    peers=Peers("souq", f"h{net.index}", ROUTE_PORT, routes),
                    monitor_port=MONITOR_PORT,
                    prefix=netns_exec(net.namespace),
                ),
                agent=AgentProcess(
                    region=region,
                    nats_url=f"nats://{net.address}:{CLIENT_PORT}",
                    data_dir=root / "workers" / f"h{net.index}",
                    netns=net.namespace,
                    cpus=cpus,
                    memory_mb=memory_mb,
                    heartbeat_interval_s=heartbeat_interval_s,
                    **(
                        _private_network(net, underlay(net), underlay_encryption, underlay_link)
                        if private_network
                        else {}
                    ),
                ),
            )
            for net, region in zip(self.network.hosts, regions, strict=True)
        ]
        first = self.hosts[0]
        self.broker = BrokerProcess(
            nats_url=first.agent.nats_url,
            log_path=root / "broker.log",
            netns=first.name,
            host=first.net.address,
            port=BROKER_PORT,
        )
        self.heartbeat_interval_s = heartbeat_interval_s

    @property
    def api_url(self) -> str:
        return self.broker.url

    def in_region(self, region: str) -> list[Host]:
        return [h for h in self.hosts if h.region == region]

    # -- starting and stopping -----------------------------------------------------------------

    def start(self, timeout: float = 60.0) -> Self:
        self.root.mkdir(parents=True, exist_ok=True)
        self.network.start()
        if self._secured:
            self.auth = AuthDir.create(self.root / "auth")
            init_bus(self.auth)
            for host in self.hosts:  # every credential before the nodes read nats.conf
                add_agent(self.auth, worker_id_for(host.agent.data_dir), reload=False)
                host.nats.config = self.auth.nats_conf
            self._environment.enter_context(
                environment(SOUQ_AUTH_DIR=str(self.auth.path), SOUQ_TOKEN=self.auth.admin())
            )
        for host in self.hosts:
            host.nats.start(timeout=timeout)
        self.wait_nats_healthy(timeout)
        for host in self.hosts:
            host.agent.start(timeout=timeout)
        self.broker.start(timeout=timeout)
        self.wait_workers_up(timeout=timeout)
        return self

    def wait_nats_healthy(self, timeout: float = 30.0) -> None:
        """Until every node says it is healthy (routed, JetStream current)."""

        def healthy() -> bool:
            return all(h.nats.healthy() for h in self.hosts)

        wait_until(healthy, timeout=timeout, interval=0.1, message="every NATS node to be healthy")

    def stop(self) -> None:
        """Stop everything; whatever is left dies with its namespace."""
        with contextlib.suppress(Exception):
            self.network.clear_faults()
        self.broker.stop()
        for host in self.hosts:
            with contextlib.suppress(Exception):
                host.agent.stop(timeout=10)
        for host in self.hosts:
            with contextlib.suppress(Exception):
                host.nats.stop()
        self.network.stop()
        _forget_machine_namespaces(self.hosts)
        self._environment.close()

    # -- what the broker says ------------------------------------------------------------------

    def client(self, timeout: float = 30.0) -> httpx.Client:
        return httpx.Client(base_url=self.api_url, headers=auth_headers(), timeout=timeout)

    def worker_states(self, http: httpx.Client) -> dict[str, str]:
        r = http.get("/v1/workers")
        r.raise_for_status()
        return {w["id"]: w["state"] for w in r.json()}

    def wait_workers_up(self, hosts: Sequence[Host] = (), *, timeout: float = 30.0) -> float:
        """Until the broker lists every host's worker (or those given) as up; the seconds it
        took."""
        started = time.monotonic()
        want = {h.worker_id for h in (hosts or self.hosts)}
        with self.client() as http:

            def up() -> bool:
                states = self.worker_states(http)
                return all(states.get(w) == "up" for w in want)

            wait_until(up, timeout=timeout, interval=0.02, message="the workers to be up")
        return time.monotonic() - started

    def machines(self, http: httpx.Client, app: str) -> list[dict[str, Any]]:
        r = http.get(f"/v1/apps/{app}/machines")
        r.raise_for_status()
        listed: list[dict[str, Any]] = r.json()
        return listed
