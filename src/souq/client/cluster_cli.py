"""``souq cluster init`` and ``souq cluster add-agent``: what a cluster outside ``souq dev``
needs, in one auth directory (:mod:`souq.auth.files`, :mod:`souq.auth.bus`)."""

from pathlib import Path
from typing import Annotated

import typer

from souq.client.cli import reporting

__all__ = ["register_cluster"]

cluster_app = typer.Typer(
    help="Make a cluster's credentials: token keys, the admin token, NATS users, TLS.",
    no_args_is_help=True,
)

DirArg = Annotated[Path, typer.Argument(help="The auth directory.")]


def register_cluster(app: typer.Typer) -> None:
    app.add_typer(cluster_app, name="cluster")


@cluster_app.command("init")
def init(
    directory: DirArg,
    tls: Annotated[
        bool,
        typer.Option("--tls", help="Make a CA and a server certificate: NATS then needs TLS."),
    ] = False,
    tls_hosts: Annotated[
        list[str] | None,
        typer.Option("--tls-host", help="A name or address of the NATS server (repeatable)."),
    ] = None,
) -> None:
    """Write DIR: token keys, admin.token, one NATS user per role, nats.conf (and TLS files).

    What exists already is kept: running it again adds only what is missing (and rewrites
    nats.conf)."""
    with reporting():
        from souq.auth.bus import init_bus
        from souq.auth.files import AuthDir
        from souq.client import render

        auth = AuthDir.create(directory)
        init_bus(auth, tls_hosts=(tls_hosts or []) if tls or tls_hosts else None)
        render.line(f"wrote {auth.path}")
        render.line(f"  NATS: nats-server -c {auth.nats_conf} --port 4222 --store_dir DIR")
        render.line("  daemons: souq broker|proxy|agent|fleet --auth-dir " + str(auth.path))
        render.line("  agents: souq cluster add-agent " + str(auth.path) + " (one per host)")


@cluster_app.command("add-agent")
def add_agent(
    directory: DirArg,
    name: Annotated[
        str | None, typer.Option("--name", help="The worker's id (default: a new one).")
    ] = None,
) -> None:
    """Add an agent's NATS users (DIR/nats/agent-ID.nk, and DIR/nats/names-ID.nk: what its
    .internal names read of the cluster view) and reload a nats-server running from
    DIR/nats.conf on this host. Prints the worker id."""
    with reporting():
        from souq.auth.bus import add_agent as add
        from souq.auth.bus import reload_server
        from souq.auth.files import AuthDir
        from souq.client import render
        from souq.errors import InvalidInput

        auth = AuthDir.from_env(directory)
        assert auth is not None
        if not auth.nats_conf.exists():
            raise InvalidInput(
                f"{directory} has no nats.conf", hint=f"run `souq cluster init {directory}` first"
            )
        worker_id = add(auth, name, reload=False)
        reloaded = reload_server(auth)
        render.line(worker_id)
        where = "reloaded" if reloaded else "not running here: reload it with nats-server --signal"
        seeds = " and ".join(str(auth.nats_dir / f"{u}-{worker_id}.nk") for u in ("agent", "names"))
        render.note(
            f"credentials: {seeds} (copy both to the agent's host, with tls/ca.pem if any: the "
            f"second lets its .internal names read the cluster view); nats-server {where}"
        )


@cluster_app.command("nats-node")
def nats_node(  # noqa: PLR0917 (typer passes the options by name)
    directory: DirArg,
    name: Annotated[str, typer.Option("--name", help="This node's name (unique: n1, n2, ...).")],
    routes: Annotated[
        str,
        typer.Option(
            "--routes",
            help="Every node's route URL, this one's included: nats://h1:6222,nats://h2:6222,...",
        ),
    ],
    cluster_name: Annotated[
        str, typer.Option("--cluster-name", help="The cluster's name (one per region).")
    ] = "souq",
    listen: Annotated[
        str, typer.Option("--listen", help="Where this node takes routes (HOST:PORT).")
    ] = "0.0.0.0:6222",
    client_listen: Annotated[
        str, typer.Option("--client-listen", help="Where this node takes clients (HOST:PORT).")
    ] = "0.0.0.0:4222",
    monitor: Annotated[
        str, typer.Option("--monitor", help="The monitoring port: /healthz, /varz (HOST:PORT).")
    ] = "127.0.0.1:8222",
    store_dir: Annotated[
        str, typer.Option("--store-dir", help="JetStream's directory on this node.")
    ] = "/var/lib/souq/nats",
    advertise: Annotated[
        str,
        typer.Option("--advertise", help="HOST:PORT the other nodes are told to route to."),
    ] = "",
    gateway_listen: Annotated[
        str,
        typer.Option("--gateway-listen", help="Where other clusters reach this one (HOST:PORT)."),
    ] = "",
    gateways: Annotated[
        list[str] | None,
        typer.Option("--gateway", help="Another cluster: NAME=URL[,URL...] (repeatable)."),
    ] = None,
    tls_hosts: Annotated[
        list[str] | None,
        typer.Option("--tls-host", help="A name of this node for its route certificate."),
    ] = None,
) -> None:
    """Write DIR/nats-NAME.conf: one node of a NATS cluster on real hosts, including
    DIR/nats.conf. Routes and gateways need the route secret (DIR/nats/route.secret, made once)
    and, when DIR has TLS, a certificate the cluster's CA signed (DIR/tls/route-NAME.pem)."""
    with reporting():
        from souq.auth.files import AuthDir
        from souq.auth.nodes import NodeSpec, write_node
        from souq.client import render
        from souq.natsconf import parse_gateways, parse_routes

        auth = AuthDir.from_env(directory)
        assert auth is not None
        spec = NodeSpec(
            name=name,
            routes=parse_routes(routes),
            cluster=cluster_name,
            route_listen=listen,
            client_listen=client_listen,
            monitor=monitor,
            store_dir=store_dir,
            advertise=advertise,
            gateway_listen=gateway_listen,
            gateways=parse_gateways(gateways or []),
            tls_hosts=tls_hosts or [],
        )
        path = write_node(auth, spec)
        render.line(str(path))
        render.note(
            f"run it with: nats-server -c {path} (copy {auth.path} to the same path on the "
            "node's host: nats.conf, this file, nats/route.secret, tls/ca.pem, tls/server.*, "
            f"tls/route-{name}.*)"
        )
