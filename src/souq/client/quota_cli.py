"""``souq quota set|show|clear APP``: an app's quota (``--org``: an organization's, over all
its apps), docs/quotas.md. A quota's limits are lines: ``all`` (every class, volumes' size
included) and one per priority class (``--class spot``); ``set`` replaces one line and keeps
the others. Setting one needs an admin token of the cluster."""

from enum import StrEnum
from typing import Annotated, Any

import typer

from souq.client.cli import JsonOpt, make_client, reporting
from souq.client.options import field_option

__all__ = ["register_quota"]

quota_app = typer.Typer(
    help="Set, show and clear the quota of an app or an organization.", no_args_is_help=True
)


class Line(StrEnum):
    ALL = "all"
    RESERVED = "reserved"
    STANDARD = "standard"
    SPOT = "spot"


NameArg = Annotated[str, typer.Argument(metavar="APP", help="The app (with --org: the org).")]
OrgOpt = Annotated[bool, typer.Option("--org", help="APP names an organization.")]
LineOpt = Annotated[
    Line,
    typer.Option(
        "--class", help="The line of limits: all classes (the default) or one priority class."
    ),
]


def _limit(*flags: str, help: str) -> Any:
    """An option of one limit, checked as the field of a quota's limits it names."""
    return field_option("souq.model.quota.AllLimits", *flags, help=help)


def register_quota(app: typer.Typer) -> None:
    """Add ``souq quota ...`` to ``app``."""
    app.add_typer(quota_app, name="quota")


@quota_app.command("set")
def set_quota(
    name: NameArg,
    *,
    cpus: Annotated[float | None, _limit("--cpus", help="CPU cores over all machines.")] = None,
    memory_mb: Annotated[int | None, _limit("--memory-mb", help="Memory in MiB.")] = None,
    machines: Annotated[int | None, _limit("--machines", help="Machines not destroyed.")] = None,
    volume_gb: Annotated[
        int | None, _limit("--volume-gb", help="GB of volumes not destroyed (all classes only).")
    ] = None,
    line: LineOpt = Line.ALL,
    org: OrgOpt = False,
    as_json: JsonOpt = False,
) -> None:
    """Replace one line of the limits (a limit not given: none on it); the others are kept."""
    from souq.client import render_quota

    if volume_gb is not None and line is not Line.ALL:
        raise typer.BadParameter(
            "volumes have no priority class: give --volume-gb without --class",
            param_hint="--volume-gb",
        )
    given = {"cpus": cpus, "memory_mb": memory_mb, "machines": machines, "volume_gb": volume_gb}
    limits: dict[str, Any] = {k: v for k, v in given.items() if v is not None}
    with reporting(as_json):
        view = make_client().set_quota(name, limits, org=org, line=line.value)
        render_quota.quota(view, as_json=as_json)


@quota_app.command("show")
def show_quota(name: NameArg, *, org: OrgOpt = False, as_json: JsonOpt = False) -> None:
    """The limits, and the use against them (creates under way included), per class too."""
    from souq.client import render_quota

    with reporting(as_json):
        render_quota.quota(make_client().quota(name, org=org), as_json=as_json)


@quota_app.command("clear")
def clear_quota(
    name: NameArg,
    *,
    line: Annotated[
        Line | None,
        typer.Option("--class", help="Clear only this line of limits (all, or a class)."),
    ] = None,
    org: OrgOpt = False,
) -> None:
    """No quota any more (``--class C``: no limits on that line, the others kept)."""
    with reporting():
        make_client().clear_quota(name, org=org, line=None if line is None else line.value)
