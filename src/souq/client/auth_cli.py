"""``souq token`` (create, narrow, show) and ``souq audit``: who may do what, and who did."""

from typing import Annotated

import typer

from souq.client.cli import JsonOpt, make_client, reporting
from souq.client.options import checked_option
from souq.model.choices import ScopeName

__all__ = ["register_auth"]

token_app = typer.Typer(help="Make, narrow and inspect API tokens.", no_args_is_help=True)

AppOpt = Annotated[
    str | None, typer.Option("--app", "-a", help="Only this app (default: every app).")
]
ScopeOpt = Annotated[
    ScopeName | None,
    typer.Option(
        "--scope",
        help="read, write, deploy or admin (each includes the last), or queue (a batch "
        "worker of the app's queue; deploy includes it).",
    ),
]
TtlOpt = Annotated[
    float | None,
    checked_option(
        "--ttl",
        help="Seconds it lasts (default: no end).",
        checks="souq.model.tokens.NewToken.ttl_s",
    ),
]


def register_auth(app: typer.Typer) -> None:
    app.add_typer(token_app, name="token")
    app.command("audit")(audit)


@token_app.command("create")
def create(
    *,
    app_name: AppOpt = None,
    scope: ScopeOpt = None,
    ttl: TtlOpt = None,
    name: Annotated[str, typer.Option("--name", help="Who or what will hold it.")] = "",
    as_json: JsonOpt = False,
) -> None:
    """A new token (needs an admin token): printed once, kept nowhere."""
    from souq.client import render

    with reporting(as_json):
        info = make_client().create_token(
            app=app_name or "*", scope=scope or "read", ttl_s=ttl, name=name
        )
        if as_json:
            render.json_value(info)
        else:
            render.line(info.token or "")


@token_app.command("narrow")
def narrow(
    *,
    app_name: AppOpt = None,
    scope: ScopeOpt = None,
    ttl: TtlOpt = None,
) -> None:
    """A narrower copy of your token (SOUQ_TOKEN), made here, asking nobody: no more than
    yours can, and only what the options leave."""
    from souq.auth.locate import find_token
    from souq.auth.tokens import Scope, narrow, public_key_from_text
    from souq.client import render
    from souq.errors import Unauthorized

    with reporting():
        token = find_token()
        if token is None:
            raise Unauthorized("no token to narrow", hint="set SOUQ_TOKEN")
        wanted = Scope(scope) if scope else None
        key = public_key_from_text(make_client().token_key())
        render.line(narrow(token, key, app=app_name, scope=wanted, ttl_s=ttl))


@token_app.command("revoke")
def revoke(token_id: Annotated[str, typer.Argument(help="The token's id: t_…")]) -> None:
    """Revoke a token and every narrowed copy of it, on every broker, for good (admin)."""
    from souq.client import render

    with reporting():
        make_client().revoke_token(token_id)
        render.line(f"token {token_id} revoked")


@token_app.command("show")
def show(*, as_json: JsonOpt = False) -> None:
    """What your token grants (never the token)."""
    from souq.client import render

    with reporting(as_json):
        render.token_info(make_client().token_self(), as_json=as_json)


def audit(
    *,
    app_name: AppOpt = None,
    limit: Annotated[int, typer.Option("--limit", min=1, help="The newest N entries.")] = 50,
    as_json: JsonOpt = False,
) -> None:
    """The newest mutating calls and the token that made each (needs an admin token)."""
    from souq.client import render

    with reporting(as_json):
        render.audit(make_client().audit(app=app_name, limit=limit), as_json=as_json)
