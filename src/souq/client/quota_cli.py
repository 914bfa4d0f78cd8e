"""``souq quota set|show|clear APP``: an app's quota (``--org``: an organization's, over all
its apps), docs/quotas.md. Setting one needs an admin token of the cluster."""

from typing import Annotated, Any

import typer

from souq.client.cli import JsonOpt, make_client, reporting
from souq.client.options import checked_option

__all__ = ["register_quota"]

quota_app = typer.Typer(
    help="Set, show and clear the quota of an app or an organization.", no_args_is_help=True
)

NameArg = Annotated[str, typer.Argument(metavar="APP", help="The app (with --org: the org).")]
OrgOpt = Annotated[bool, typer.Option("--org", help="APP names an organization.")]
_MODEL = "souq.model.quota.QuotaLimits"


def register_quota(app: typer.Typer) -> None:
    """Add ``souq quota ...`` to ``app``."""
    app.add_typer(quota_app, name="quota")


@quota_app.command("set")
def set_quota(
    name: NameArg,
    *,
    cpus: Annotated[
        float | None,
        checked_option("--cpus", help="CPU cores over all machines.", checks=f"{_MODEL}.cpus"),
    ] = None,
    memory_mb: Annotated[
        int | None,
        checked_option("--memory-mb", help="Memory in MiB.", checks=f"{_MODEL}.memory_mb"),
    ] = None,
    machines: Annotated[
        int | None,
        checked_option("--machines", help="Machines not destroyed.", checks=f"{_MODEL}.machines"),
    ] = None,
    org: OrgOpt = False,
    as_json: JsonOpt = False,
) -> None:
    """Replace the limits (a limit not given: none on it)."""
    from souq.client import render_quota

    limits: dict[str, Any] = {
        k: v
        for k, v in {"cpus": cpus, "memory_mb": memory_mb, "machines": machines}.items()
        if v is not None
    }
    with reporting(as_json):
        render_quota.quota(make_client().set_quota(name, limits, org=org), as_json=as_json)


@quota_app.command("show")
def show_quota(name: NameArg, *, org: OrgOpt = False, as_json: JsonOpt = False) -> None:
    """The limits, and the use against them (creates under way included)."""
    from souq.client import render_quota

    with reporting(as_json):
        render_quota.quota(make_client().quota(name, org=org), as_json=as_json)


@quota_app.command("clear")
def clear_quota(name: NameArg, *, org: OrgOpt = False) -> None:
    """No quota any more."""
    with reporting():
        make_client().clear_quota(name, org=org)
