"""``souq volume create|list|show|extend|destroy``: an app's volumes (Fly's
``/v1/apps/{app}/volumes``), each a directory of a given size on one worker that one machine
at a time mounts through ``config.mounts``."""

from typing import Annotated

import typer

from souq.client.cli import AppNameOpt, JsonOpt, make_client, reporting
from souq.client.options import checked_option

__all__ = ["register_volumes"]

volume_app = typer.Typer(
    help="Create, list, show, extend and destroy an app's volumes.", no_args_is_help=True
)

VolumeArg = Annotated[str, typer.Argument(metavar="VOLUME_ID", help="The volume's id.")]


def register_volumes(app: typer.Typer) -> None:
    """Add ``souq volume ...`` to ``app``."""
    app.add_typer(volume_app, name="volume")


@volume_app.command("create")
def create(
    name: Annotated[str, typer.Argument(help="Lowercase letters, digits and underscores.")],
    *,
    app_name: AppNameOpt,
    region: Annotated[str, typer.Option("--region", "-r", help="Where it lives.")],
    size_gb: Annotated[
        int,
        checked_option(
            "--size",
            "-s",
            help="Its size in GB.",
            checks="souq.model.volume.CreateVolumeRequest.size_gb",
        ),
    ] = 1,
    unique_zone: Annotated[
        bool,
        typer.Option(help="Not on a worker that holds another volume of this name in the app."),
    ] = False,
    as_json: JsonOpt = False,
) -> None:
    """Create a volume on a worker of the region with the disk for it."""
    from souq.client import render_volumes

    body = {"name": name, "region": region, "size_gb": size_gb, "require_unique_zone": unique_zone}
    with reporting(as_json):
        render_volumes.volume(make_client().create_volume(app_name, body), as_json=as_json)


@volume_app.command("list")
def list_volumes(*, app_name: AppNameOpt, as_json: JsonOpt = False) -> None:
    """The app's volumes, oldest first."""
    from souq.client import render_volumes

    with reporting(as_json):
        render_volumes.volumes(make_client().volumes(app_name), as_json=as_json)


@volume_app.command("show")
def show(volume_id: VolumeArg, *, app_name: AppNameOpt, as_json: JsonOpt = False) -> None:
    """One volume: its worker, size, what its files use, the machine it is attached to."""
    from souq.client import render_volumes

    with reporting(as_json):
        render_volumes.volume(make_client().volume(app_name, volume_id), as_json=as_json)


@volume_app.command("extend")
def extend(
    volume_id: VolumeArg,
    *,
    app_name: AppNameOpt,
    size_gb: Annotated[
        int,
        checked_option(
            "--size",
            "-s",
            help="The new size in GB.",
            checks="souq.model.volume.ExtendVolumeRequest.size_gb",
        ),
    ],
    as_json: JsonOpt = False,
) -> None:
    """Grow a volume (no restart needed)."""
    from souq.client import render_volumes

    with reporting(as_json):
        extended = make_client().extend_volume(app_name, volume_id, size_gb)
        render_volumes.volume(extended.volume, as_json=as_json)


@volume_app.command("destroy")
def destroy(volume_id: VolumeArg, *, app_name: AppNameOpt, as_json: JsonOpt = False) -> None:
    """Destroy a volume no machine has attached, and its files."""
    from souq.client import render_volumes

    with reporting(as_json):
        render_volumes.volume(make_client().destroy_volume(app_name, volume_id), as_json=as_json)
