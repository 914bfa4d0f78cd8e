"""``souq image build|import|pull|list``: images packed (or read) here, stored in the cluster.

``build`` packs a directory into an OCI image on this machine (one layer, reproducible: the same
files give the same reference), ``import`` reads an OCI image layout (a directory, or a tar of
one, as skopeo or a registry export writes it) and checks every digest, ``pull`` fetches one
from an OCI registry (the distribution API); each sends the layout to the broker, which keeps it
in the cluster's image store, and prints the image's reference. The printing and the image code
load inside the commands: the daemons' start-up never loads them."""

from pathlib import Path
from typing import Annotated

import typer

from souq.client.cli import JsonOpt, make_client, pairs, reporting

__all__ = ["register_images"]

images_app = typer.Typer(help="Build, import and list the cluster's images.")

NameOpt = Annotated[
    str | None,
    typer.Option(
        "--name",
        help="A name to store it under: NAME[:TAG], or a registry's name "
        "(docker.io/library/busybox:latest) that machines' `image` then finds here.",
    ),
]
AppOpt = Annotated[
    str | None,
    typer.Option(
        "--app",
        help="Whose names: this app's (only its machines find them). An app's token stores "
        "in its app's names whatever this says; a token of every app, in the cluster's "
        "without it.",
    ),
]


def register_images(app: typer.Typer) -> None:
    """Add ``souq image ...`` to ``app``."""
    app.add_typer(images_app, name="image")


@images_app.command("build")
def build(
    *,
    directory: Annotated[
        Path, typer.Argument(metavar="DIR", help="The directory whose files the image holds.")
    ],
    name: NameOpt = None,
    cmd: Annotated[
        str | None,
        typer.Option("--cmd", help="What the image runs, as one shell-quoted string."),
    ] = None,
    env: Annotated[
        list[str] | None, typer.Option("--env", "-e", help="K=V in the image's environment.")
    ] = None,
    workdir: Annotated[
        str, typer.Option("--workdir", help="The working directory inside the image.")
    ] = "/",
    app: AppOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Pack DIR into an OCI image and store it in the cluster; prints its reference."""
    import shlex

    from souq.client import render
    from souq.images import layout_tar, pack_directory

    with reporting(as_json):
        image = pack_directory(
            directory,
            cmd=shlex.split(cmd) if cmd else (),
            env=pairs(env, "--env"),
            workdir=workdir,
            name=name,
        )
        record = make_client().push_image(layout_tar(image), name=name, app=app)
        render.image_reference(record, as_json=as_json)


@images_app.command("import")
def import_(
    path: Annotated[
        Path,
        typer.Argument(metavar="PATH", help="An OCI image layout: a directory or a tar of one."),
    ],
    name: NameOpt = None,
    app: AppOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Store an OCI image layout in the cluster (every digest checked); prints its reference."""
    from souq.client import render
    from souq.images import layout_tar, read_layout

    with reporting(as_json):
        image = read_layout(path)
        record = make_client().push_image(layout_tar(image), name=name or image.name, app=app)
        render.image_reference(record, as_json=as_json)


@images_app.command("pull")
def pull(
    reference: Annotated[
        str,
        typer.Argument(
            metavar="REF", help="HOST[:PORT]/REPOSITORY[:TAG|@sha256:…] in an OCI registry."
        ),
    ],
    name: NameOpt = None,
    app: AppOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Pull an image from an OCI registry (every digest checked) into the cluster's store;
    prints its reference. HTTPS, except for a registry on this machine."""
    from souq.client import render
    from souq.images import layout_tar
    from souq.images.registry import parse_reference
    from souq.images.registry import pull as pull_image

    with reporting(as_json):
        image = pull_image(parse_reference(reference))
        record = make_client().push_image(layout_tar(image), name=name, app=app)
        render.image_reference(record, as_json=as_json)


@images_app.command("list")
def list_(app: AppOpt = None, as_json: JsonOpt = False) -> None:
    """The images in the cluster's store (an app's token: those its app may run), newest
    first."""
    from souq.client import render

    with reporting(as_json):
        render.images(make_client().images(app=app), as_json=as_json)
