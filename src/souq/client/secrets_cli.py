"""``souq secrets set|list|unset``: an app's secrets, set here and kept sealed by the cluster;
its machines get them as environment variables at their next start or update. Values are
never printed: ``list`` shows names, digests and when each was set."""

import sys
from typing import Annotated

import typer

from souq.client.cli import AppNameOpt, JsonOpt, make_client, reporting

__all__ = ["register_secrets"]

secrets_app = typer.Typer(help="Set, list and unset an app's secrets.", no_args_is_help=True)


def register_secrets(app: typer.Typer) -> None:
    """Add ``souq secrets ...`` to ``app``."""
    app.add_typer(secrets_app, name="secrets")


def _values(pairs: list[str]) -> dict[str, str]:
    """``NAME=VALUE`` pairs; ``NAME=-`` reads the value from stdin (once, whole, without its
    final newline)."""
    from souq.errors import InvalidInput

    values: dict[str, str] = {}
    stdin: str | None = None
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or not name:
            raise InvalidInput(f"{pair.split('=')[0]!r} is not NAME=VALUE", hint="or NAME=-")
        if value == "-":
            if stdin is not None:
                raise InvalidInput("only one NAME=- can read stdin")
            stdin = sys.stdin.read().removesuffix("\n")
            value = stdin
        values[name] = value
    return values


@secrets_app.command("set")
def set_secrets(
    *,
    app_name: AppNameOpt,
    pairs: Annotated[
        list[str], typer.Argument(metavar="NAME=VALUE...", help="NAME=- reads the value on stdin.")
    ],
    as_json: JsonOpt = False,
) -> None:
    """Set secrets of the app (at its machines' next start or update)."""
    from souq.client import render

    with reporting(as_json):
        render.secrets(make_client().set_secrets(app_name, _values(pairs)), as_json=as_json)


@secrets_app.command("list")
def list_secrets(*, app_name: AppNameOpt, as_json: JsonOpt = False) -> None:
    """The app's secrets: names, digests of the values, when each was set."""
    from souq.client import render

    with reporting(as_json):
        render.secrets(make_client().secrets(app_name), as_json=as_json)


@secrets_app.command("unset")
def unset_secrets(
    *,
    app_name: AppNameOpt,
    names: Annotated[list[str], typer.Argument(metavar="NAME...", help="The secrets to unset.")],
) -> None:
    """Unset secrets of the app (its machines keep them until their next start or update)."""
    with reporting():
        client = make_client()
        for name in names:
            client.unset_secret(app_name, name)
