"""``souq workers [cordon|drain|uncordon WORKER]``: the workers the broker knows, and taking one
out of placement (cordon), emptying it (drain) or putting it back (uncordon)."""

from typing import Annotated

import typer

from souq.client.cli import JsonOpt, make_client, reporting

__all__ = ["register_workers"]

workers_app = typer.Typer(help="List, cordon, drain and uncordon workers.")

WorkerArg = Annotated[str, typer.Argument(metavar="WORKER", help="The worker's id.")]


def register_workers(app: typer.Typer) -> None:
    """Add ``souq workers ...`` to ``app``."""
    app.add_typer(workers_app, name="workers")


@workers_app.callback(invoke_without_command=True)
def workers(ctx: typer.Context, as_json: JsonOpt = False) -> None:
    """List the workers the broker knows, with their state and capacity."""
    if ctx.invoked_subcommand is not None:
        return
    from souq.client import render

    with reporting(as_json):
        render.workers(make_client().workers(), as_json=as_json)


@workers_app.command("cordon")
def workers_cordon(worker_id: WorkerArg, as_json: JsonOpt = False) -> None:
    """Stop offers from a worker; its machines keep running."""
    from souq.client import render

    with reporting(as_json):
        render.workers([make_client().cordon(worker_id)], as_json=as_json)


@workers_app.command("drain")
def workers_drain(worker_id: WorkerArg, as_json: JsonOpt = False) -> None:
    """Cordon a worker and stop its machines gracefully (uncordon ends the drain)."""
    from souq.client import render

    with reporting(as_json):
        render.workers([make_client().drain(worker_id)], as_json=as_json)


@workers_app.command("uncordon")
def workers_uncordon(worker_id: WorkerArg, as_json: JsonOpt = False) -> None:
    """Let a cordoned worker make offers again."""
    from souq.client import render

    with reporting(as_json):
        render.workers([make_client().uncordon(worker_id)], as_json=as_json)
