"""``souq regions``: the cluster's regions, their room and their spot prices."""

from typing import Annotated

import typer

from souq.client.cli import JsonOpt, make_client, reporting

__all__ = ["register_regions"]


def register_regions(app: typer.Typer) -> None:
    """Add ``souq regions`` to ``app``."""
    app.command("regions")(regions)


def regions(
    cpus: Annotated[
        float, typer.Option("--cpus", help="Size of one machine, for FITS (default 1).")
    ] = 1,
    memory_mb: Annotated[
        int, typer.Option("--memory-mb", help="Size of one machine, MiB (default 256).")
    ] = 256,
    as_json: JsonOpt = False,
) -> None:
    """List the regions: workers up, capacity promised, how many machines of a size fit, and the
    spot price (a spot machine bidding less is refused or preempted) with its recent history."""
    from souq.client import render, render_regions

    with reporting(as_json):
        found = make_client().regions(cpus=cpus, memory_mb=memory_mb)
        if as_json:
            render.json_value(found)
        else:
            render_regions.regions(found)
