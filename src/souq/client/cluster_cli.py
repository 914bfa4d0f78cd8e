"""``souq cluster init`` and ``souq cluster add-agent``: what a cluster outside ``souq dev``
needs, in one auth directory (:mod:`souq.auth.files`, :mod:`souq.auth.bus`)."""

from __future__ import annotations

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
    """Add an agent's NATS user (DIR/nats/agent-ID.nk) and reload a nats-server running from
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
        render.note(
            f"credential: {auth.nats_dir / ('agent-' + worker_id + '.nk')} (copy it to the "
            f"agent's host, with tls/ca.pem if any); nats-server {where}"
        )
