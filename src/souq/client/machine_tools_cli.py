"""``souq machine exec|metadata``: act on one machine in place (the routes of
:mod:`souq.broker.machine_tools_routes`). ``exec`` exits with the command's own exit code."""

import sys
from typing import Annotated

import typer

from souq.client.cli import AppOpt, IdArg, JsonOpt, machine_app, make_client, reporting
from souq.client.options import checked_option

__all__ = ["register_machine_tools"]


def register_machine_tools(app: typer.Typer) -> None:
    """The commands add themselves to ``souq machine`` when this module is imported."""


@machine_app.command("exec", context_settings={"allow_interspersed_args": False})
def machine_exec(
    machine_id: IdArg,
    command: Annotated[list[str], typer.Argument(metavar="-- COMMAND [ARG...]")],
    *,
    app_name: AppOpt,
    timeout: Annotated[
        int,
        checked_option(
            "--timeout",
            help="Seconds (at most 300).",
            checks="souq.model.machine_tools.ExecBody.timeout",
        ),
    ] = 30,
    stdin: Annotated[
        bool, typer.Option("--stdin", help="Send this command's stdin to the command.")
    ] = False,
    as_json: JsonOpt = False,
) -> None:
    """Run a command in a started machine: its env, directory, user and limits."""
    from souq.client import render_tools

    with reporting(as_json):
        if command[:1] == ["--"]:  # after the machine's id, `--` reaches us as an argument
            command = command[1:]
        data = sys.stdin.read() if stdin else None
        reply = make_client().exec(app_name, machine_id, command, stdin=data, timeout_s=timeout)
        render_tools.exec_reply(reply, as_json=as_json)
    raise typer.Exit(reply.exit_code)


@machine_app.command("metadata")
def machine_metadata(
    machine_id: IdArg,
    pairs: Annotated[
        list[str] | None,
        typer.Argument(metavar="[KEY=VALUE | KEY-]...", help="Set KEY, or delete it (KEY-)."),
    ] = None,
    *,
    app_name: AppOpt,
    as_json: JsonOpt = False,
) -> None:
    """Show the machine's metadata, or set and delete keys (no restart)."""
    from souq.client import render_tools
    from souq.errors import InvalidInput

    with reporting(as_json):
        client = make_client()
        for pair in pairs or []:
            key, sep, value = pair.partition("=")
            if sep and key:
                client.set_metadata(app_name, machine_id, key, value)
            elif pair.endswith("-") and len(pair) > 1:
                client.set_metadata(app_name, machine_id, pair[:-1], None)
            else:
                raise InvalidInput(f"{pair!r}: give KEY=VALUE to set a key, or KEY- to delete it")
        render_tools.metadata(client.metadata(app_name, machine_id), as_json=as_json)
