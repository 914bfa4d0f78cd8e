"""One NATS node's configuration, as text: the one place Souq writes it, for the nodes
``souq dev --nats-cluster`` runs on one machine (:mod:`souq.natsserver`) and for a node of a
cluster on real hosts (``souq cluster nats-node``, :mod:`souq.auth.nodes`). Pure.

A node's file includes the auth directory's ``nats.conf`` (users, permissions, client TLS) and
adds what is the node's own: its name (JetStream knows its peers by it), its pid file, its
cluster (the route port, the other nodes' routes) and its cluster's gateway to other clusters.
With :class:`RouteAuth` the routes (and gateways) are authenticated: every node expects that
user and password and gives them in the URLs it dials. With :class:`RouteTls` they speak TLS
both ways (nats-server always verifies the peer's certificate on a route: the certificate is
used as a client's and a server's, and the CA must have signed it).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from souq.errors import InvalidInput

__all__ = [
    "NodeConf",
    "RouteAuth",
    "RouteTls",
    "check_name",
    "hosts_of",
    "node_conf",
    "parse_gateways",
    "parse_routes",
    "with_auth",
]

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$")
_SCHEMES = ("nats", "nats-route", "tls")


@dataclass(frozen=True)
class RouteAuth:
    """The user and password every node of a cluster (and of its supercluster) expects on a
    route or a gateway, and gives when it dials one."""

    user: str
    password: str


@dataclass(frozen=True)
class RouteTls:
    """A node's certificate for routes and gateways (client and server), its key, and the CA
    every peer's certificate must be signed by."""

    cert: str
    key: str
    ca: str


@dataclass(frozen=True)
class NodeConf:
    """What one node's file says. Empty strings leave a setting to nats-server's command line
    (or its default): ``client_listen`` (``--addr``/``--port``), ``monitor`` (``--http_port``),
    ``store_dir`` (``--store_dir``)."""

    name: str
    cluster: str
    route_listen: str  # HOST:PORT the other nodes route to
    pid_file: str
    routes: Sequence[str] = ()  # every node's route URL, its own included (skipped by the server)
    include: str = ""  # the auth directory's nats.conf, relative to this file's directory
    client_listen: str = ""
    monitor: str = ""
    store_dir: str = ""
    advertise: str = ""  # HOST:PORT the other nodes are told to route to (NAT, TLS names)
    gateway_listen: str = ""
    gateways: Mapping[str, Sequence[str]] = field(default_factory=dict)
    auth: RouteAuth | None = None
    tls: RouteTls | None = None


def _q(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _list(items: Sequence[str]) -> str:
    return "[" + ", ".join(_q(item) for item in items) + "]"


def with_auth(url: str, auth: RouteAuth | None) -> str:
    """``url`` with the route user and password in it (unchanged without ``auth``)."""
    if auth is None:
        return url
    parts = urlsplit(url)
    host = parts.hostname or ""
    host = f"[{host}]" if ":" in host else host
    return f"{parts.scheme}://{auth.user}:{auth.password}@{host}:{parts.port}"


def _link(auth: RouteAuth | None, tls: RouteTls | None, indent: str) -> list[str]:
    """A route's or a gateway's ``authorization`` and ``tls`` blocks."""
    lines: list[str] = []
    if auth is not None:
        lines += [
            f"{indent}authorization {{",
            f"{indent}  user: {_q(auth.user)}",
            f"{indent}  password: {_q(auth.password)}",
            f"{indent}  timeout: 2",
            f"{indent}}}",
        ]
    if tls is not None:
        lines += [
            f"{indent}tls {{",
            f"{indent}  cert_file: {_q(tls.cert)}",
            f"{indent}  key_file: {_q(tls.key)}",
            f"{indent}  ca_file: {_q(tls.ca)}",
            f"{indent}  verify: true",
            f"{indent}  timeout: 5",
            f"{indent}}}",
        ]
    return lines


def node_conf(conf: NodeConf) -> str:
    """The node's nats-server configuration."""
    secret = " It holds the route secret: keep it 0600." if conf.auth is not None else ""
    lines = [f"# Written by souq for node {conf.name} of NATS cluster {conf.cluster}.{secret}"]
    if conf.include:
        lines.append(f"include {_q(conf.include)}")
    lines += [f"server_name: {_q(conf.name)}", f"pid_file: {_q(conf.pid_file)}"]
    if conf.client_listen:
        lines.append(f"listen: {_q(conf.client_listen)}")
    if conf.monitor:
        lines.append(f"http: {_q(conf.monitor)}")
    if conf.store_dir:
        # after the include: this map replaces its `jetstream: enabled` (still enabled)
        lines.append(f"jetstream {{ store_dir: {_q(conf.store_dir)} }}")
    lines += ["cluster {", f"  name: {_q(conf.cluster)}", f"  listen: {_q(conf.route_listen)}"]
    if conf.advertise:
        lines.append(f"  advertise: {_q(conf.advertise)}")
    lines += _link(conf.auth, conf.tls, "  ")
    # its own route too: the server skips it, and a cluster of one still has routes
    # (JetStream clustered across gateways needs them)
    routes = [with_auth(r, conf.auth) for r in conf.routes]
    lines += [f"  routes: {_list(routes)}", "}"]
    if conf.gateway_listen:
        lines += [
            "gateway {",
            f"  name: {_q(conf.cluster)}",
            f"  listen: {_q(conf.gateway_listen)}",
            *_link(conf.auth, conf.tls, "  "),
            "  gateways: [",
            *(
                f"    {{name: {_q(name)}, urls: {_list([with_auth(u, conf.auth) for u in urls])}}}"
                for name, urls in sorted(conf.gateways.items())
            ),
            "  ]",
            "}",
        ]
    return "\n".join(lines) + "\n"


def check_name(value: str, what: str) -> str:
    if not _NAME.match(value):
        raise InvalidInput(
            f"{what} {value!r} is not a name nats-server takes",
            hint="use letters, digits, '-' and '_' (at most 64), starting with a letter or digit",
        )
    return value


def _url(raw: str, what: str) -> str:
    url = raw.strip()
    hint = f"give {what} as nats://HOST:PORT (no user or password: souq adds the route secret)"
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        raise InvalidInput(f"{what} {url!r} is not a URL", hint=hint) from None
    if parts.scheme not in _SCHEMES or not parts.hostname or port is None:
        raise InvalidInput(f"{what} {url!r} is not nats://HOST:PORT", hint=hint)
    if parts.username or parts.password or parts.path not in ("", "/"):
        raise InvalidInput(f"{what} {url!r} has more than a host and a port", hint=hint)
    host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
    return f"nats://{host}:{port}"


def parse_routes(text: str) -> list[str]:
    """``nats://h1:6222,nats://h2:6222,...`` as a list of URLs (each checked)."""
    routes = [_url(r, "route") for r in text.split(",") if r.strip()]
    if not routes:
        raise InvalidInput("no routes given", hint="--routes nats://h1:6222,nats://h2:6222,...")
    return list(dict.fromkeys(routes))


def parse_gateways(items: Sequence[str]) -> dict[str, list[str]]:
    """``NAME=URL[,URL...]`` items as ``{cluster name: URLs}``."""
    out: dict[str, list[str]] = {}
    for item in items:
        name, sep, urls = item.partition("=")
        if not sep:
            raise InvalidInput(
                f"gateway {item!r} is not NAME=URL[,URL...]",
                hint="e.g. --gateway syd=nats://s1:7222,nats://s2:7222",
            )
        check_name(name, "cluster name")
        parsed = [_url(u, "gateway") for u in urls.split(",") if u.strip()]
        if not parsed:
            raise InvalidInput(f"gateway {name!r} has no URL", hint="--gateway NAME=URL[,URL...]")
        out.setdefault(name, []).extend(parsed)
    return out


def hosts_of(urls: Sequence[str]) -> list[str]:
    """The host names and addresses in URLs, in order, once each."""
    hosts = [urlsplit(u).hostname or "" for u in urls]
    return list(dict.fromkeys(h for h in hosts if h))
