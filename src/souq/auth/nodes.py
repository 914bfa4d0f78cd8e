"""A NATS node's configuration on a real host (``souq cluster nats-node``), written into the
auth directory beside the ``nats.conf`` it includes::

    DIR/nats-NODE.conf   node NODE: its name, pid file, cluster, routes, gateways (0600: it
                         holds the route secret)
    DIR/nats/route.secret  the password every node expects on a route or a gateway (0600)
    DIR/tls/route-NODE.* with TLS: the node's certificate for routes and gateways

The text is :func:`souq.natsconf.node_conf`'s, as for the nodes ``souq dev`` runs.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from souq.auth.files import AuthDir, write_private
from souq.auth.tls import make_route_cert
from souq.errors import InvalidInput
from souq.natsconf import NodeConf, RouteAuth, RouteTls, check_name, hosts_of, node_conf

__all__ = ["ROUTE_USER", "NodeSpec", "route_auth", "write_node"]

ROUTE_USER = "souq-route"


@dataclass(frozen=True)
class NodeSpec:
    """What the operator says about one node: ``souq cluster nats-node``'s options, whose
    defaults are the command's."""

    name: str
    routes: Sequence[str]
    cluster: str
    route_listen: str
    client_listen: str
    monitor: str
    store_dir: str
    advertise: str
    gateway_listen: str
    gateways: Mapping[str, Sequence[str]]
    tls_hosts: Sequence[str]


def route_auth(auth: AuthDir) -> RouteAuth:
    """The cluster's route user and its password (made once, kept in ``DIR/nats/route.secret``)."""
    path = auth.nats_dir / "route.secret"
    write_private(path, secrets.token_urlsafe(32) + "\n")
    return RouteAuth(user=ROUTE_USER, password=path.read_text().strip())


def _host_port(value: str, what: str) -> str:
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise InvalidInput(f"{what} {value!r} is not HOST:PORT", hint="e.g. 0.0.0.0:6222")
    return value


def write_node(auth: AuthDir, spec: NodeSpec) -> Path:
    """Write ``DIR/nats-NAME.conf`` (and the route secret and certificate it needs); returns
    its path."""
    if not auth.nats_conf.exists():
        raise InvalidInput(
            f"{auth.path} has no nats.conf", hint=f"run `souq cluster init {auth.path}` first"
        )
    name = check_name(spec.name, "node name")
    check_name(spec.cluster, "cluster name")
    for value, what in (
        (spec.route_listen, "--listen"),
        (spec.client_listen, "--client-listen"),
        (spec.monitor, "--monitor"),
    ):
        if value:
            _host_port(value, what)
    if spec.advertise:
        _host_port(spec.advertise, "--advertise")
    if spec.gateways and not spec.gateway_listen:
        raise InvalidInput(
            "gateways given without --gateway-listen", hint="add --gateway-listen 0.0.0.0:7222"
        )
    if spec.cluster in spec.gateways:
        raise InvalidInput(
            f"--gateway names this node's own cluster {spec.cluster!r}",
            hint="name the other clusters only: each reaches this one by its --gateway-listen",
        )
    tls = None
    tls_dir = auth.path / "tls"
    if (tls_dir / "server.pem").exists():
        hosts = [*spec.tls_hosts, *hosts_of(spec.routes)]
        hosts += hosts_of([f"nats://{spec.advertise}"]) if spec.advertise else []
        cert, key = make_route_cert(tls_dir, name, hosts)
        tls = RouteTls(cert=str(cert.resolve()), key=str(key.resolve()), ca=str(_ca(tls_dir)))
    path = auth.path / f"nats-{name}.conf"
    text = node_conf(
        NodeConf(
            name=name,
            cluster=spec.cluster,
            route_listen=spec.route_listen,
            pid_file=str((auth.path / f"nats-server-{name}.pid").resolve()),
            routes=list(spec.routes),
            include=auth.nats_conf.name,
            client_listen=spec.client_listen,
            monitor=spec.monitor,
            store_dir=spec.store_dir,
            advertise=spec.advertise,
            gateway_listen=spec.gateway_listen,
            gateways={k: list(v) for k, v in spec.gateways.items()},
            auth=route_auth(auth),
            tls=tls,
        )
    )
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(tmp, path)
    return path


def _ca(tls_dir: Path) -> Path:
    return (tls_dir / "ca.pem").resolve()
