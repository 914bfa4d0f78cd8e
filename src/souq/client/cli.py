"""The ``souq`` command line: client commands over the HTTP API, and the daemons.

Exit status: 0 on success, 3 when a placement was refused for lack of capacity, 1 for any other
error (2 for a command line that does not parse, a value outside its set or its bounds among
them: :mod:`souq.client.options`). Messages go to stderr; every client command takes ``--json``.
Only :mod:`souq.client.render` prints.
"""

import importlib
import importlib.util
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from types import ModuleType
from typing import TYPE_CHECKING, Annotated, Any

import typer

from souq import __version__
from souq.client.options import (
    AutostopOpt,
    ClassOpt,
    ConstraintOpt,
    CpusOpt,
    DistinctOpt,
    EnvOpt,
    ImageOpt,
    MaxPriceOpt,
    MemoryOpt,
    PolicyOpt,
    PortOpt,
    TimeoutOpt,
    checked_option,
    signal_name,
)
from souq.errors import InsufficientCapacity, InvalidInput, SouqError
from souq.model.choices import Driver, MachineState, RestartPolicy


def _lazy(name: str) -> ModuleType:
    """Import ``name`` on first use (``importlib.util.LazyLoader``): the daemons (``souq agent``
    keeps one per host) never load the client's HTTP and rendering stack, about 8 MiB."""
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.find_spec(name)
    assert spec is not None, name
    assert spec.loader is not None, name
    loader = importlib.util.LazyLoader(spec.loader)
    spec.loader = loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    loader.exec_module(module)
    return module


if TYPE_CHECKING:
    from pydantic import ValidationError

    from souq.client import render
    from souq.client.api import SouqClient
else:
    render = _lazy("souq.client.render")

__all__ = ["app", "main", "make_client"]

EXIT_ERROR = 1
EXIT_NO_CAPACITY = 3
STOP_WAIT_MARGIN_S = 10.0

app = typer.Typer(
    name="souq",
    help="Souq: a cluster orchestrator that schedules like a market.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
machine_app = typer.Typer(help="Run and manage machines.", no_args_is_help=True)
app.add_typer(machine_app, name="machine")
quote_app = typer.Typer(
    help="Hold capacity now, place a machine on it later.", no_args_is_help=True
)
app.add_typer(quote_app, name="quote")


def make_client() -> "SouqClient":
    """The client every command uses (``$SOUQ_API``, ``$SOUQ_TOKEN``); tests replace it."""
    from souq.client.api import SouqClient

    return SouqClient()


@contextmanager
def reporting(as_json: bool = False) -> Iterator[None]:
    """Turn an error into its message on stderr and the exit status."""
    try:
        yield
    except SouqError as err:
        render.error(err, as_json=as_json)
        code = EXIT_NO_CAPACITY if isinstance(err, InsufficientCapacity) else EXIT_ERROR
        raise typer.Exit(code) from None
    except KeyboardInterrupt:
        raise typer.Exit(130) from None
    except Exception as exc:
        # A record the API sent that does not read (pydantic's ValidationError: imported only
        # by a command that reads one, and then it is loaded).
        pydantic = sys.modules.get("pydantic")
        if pydantic is None or not isinstance(exc, pydantic.ValidationError):
            raise
        render.error(InvalidInput(_first_error(exc)), as_json=as_json)
        raise typer.Exit(EXIT_ERROR) from None


def _first_error(exc: "ValidationError") -> str:
    e = exc.errors()[0]
    where = ".".join(str(p) for p in e["loc"])
    return f"{where}: {e['msg']}" if where else str(e["msg"])


def pairs(values: list[str] | None, what: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in values or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise typer.BadParameter(f"{item!r} is not {what}=VALUE", param_hint=f"--{what}")
        out[key] = value
    return out


JsonOpt = Annotated[bool, typer.Option("--json", help="Print machine-readable JSON.")]
AppOpt = Annotated[str, typer.Option("--app", "-a", help="The app the machine belongs to.")]
AppNameOpt = Annotated[str, typer.Option("--app", "-a", help="The app.")]
IdArg = Annotated[str, typer.Argument(metavar="ID", help="The machine's id.")]
CommandArg = Annotated[
    list[str] | None,
    typer.Argument(
        metavar="-- COMMAND [ARG...]",
        help="What the machine runs (with --image: optional, the image's own command runs).",
    ),
]
QuoteArg = Annotated[str, typer.Argument(metavar="QUOTE", help="The quote's id.")]


@app.callback(invoke_without_command=True)
def _root(
    version: Annotated[bool, typer.Option("--version", help="Print the version.")] = False,
) -> None:
    if version:
        render.line(f"souq {__version__}")
        raise typer.Exit(0)


# -- client commands ---------------------------------------------------------------------------


@machine_app.command("run", context_settings={"allow_interspersed_args": False})
def machine_run(
    *,
    command: CommandArg = None,
    app_name: AppOpt,
    region: Annotated[str, typer.Option("--region", "-r", help="Where to place it.")],
    cpus: CpusOpt = None,
    memory_mb: MemoryOpt = None,
    restart: Annotated[
        RestartPolicy | None, typer.Option("--restart", help="Restart policy.")
    ] = None,
    max_retries: Annotated[
        int | None,
        checked_option(
            "--max-retries",
            help="Restarts allowed by on-failure.",
            checks="souq.model.machine.RestartConfig.max_retries",
        ),
    ] = None,
    env: EnvOpt = None,
    port: PortOpt = None,
    autostop: AutostopOpt = None,
    name: Annotated[str | None, typer.Option("--name", help="The machine's name.")] = None,
    skip_start: Annotated[
        bool, typer.Option("--skip-start", help="Create it, but do not start it.")
    ] = False,
    wait_timeout: Annotated[
        float, typer.Option("--wait-timeout", min=0, help="Seconds to wait for it to start.")
    ] = 300.0,
    quote: Annotated[
        str | None, typer.Option("--quote", help="Use exactly this quote's held capacity.")
    ] = None,
    constraint: ConstraintOpt = None,
    distinct: DistinctOpt = False,
    image: ImageOpt = None,
    driver: Annotated[
        Driver | None,
        typer.Option(
            "--driver",
            help="sandbox: isolated (its own namespaces; an image as its root); exec: a plain "
            "process (default: isolated wherever the worker can).",
        ),
    ] = None,
    policy: PolicyOpt = None,
    priority_class: ClassOpt = None,
    max_price: MaxPriceOpt = None,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Show where it would go and why; claim nothing.")
    ] = False,
    as_json: JsonOpt = False,
) -> None:
    """Place a machine and start it; prints its id once it has started (exit 1, and why, if
    it could not be)."""
    with reporting(as_json):
        config = _config(
            command, cpus, memory_mb, constraints=constraint, distinct=distinct, image=image
        )
        config |= _run_config(restart, max_retries, env)
        if driver is not None:
            config["driver"] = driver.value
        if priority_class is not None:
            config["priority_class"] = priority_class.value
        if max_price is not None:
            config["max_price"] = max_price
        if autostop is not None and not port:
            raise typer.BadParameter(
                "it says what the proxy does to an idle service: give the service's --port",
                param_hint="--autostop",
            )
        if port:
            service: dict[str, Any] = {"autostop": autostop} if autostop else {}
            config["services"] = [{"internal_port": p, **service} for p in port]
        placement = {"policy": policy} if policy else None
        client = make_client()
        if dry_run:
            record = client.explain_create(
                app_name, region, config, quote=quote, placement=placement
            )
            render.placement(record, as_json=as_json)
            return
        machine = client.create_machine(
            app_name,
            region,
            config,
            name=name,
            skip_launch=skip_start,
            quote=quote,
            placement=placement,
        )
        if not skip_start:
            from souq.client.started import until_started

            machine = until_started(client, machine, timeout=wait_timeout)
        render.machine_id(machine, as_json=as_json)


def _config(
    command: list[str] | None,
    cpus: float | None,
    memory_mb: int | None,
    *,
    constraints: list[dict[str, Any]] | None,
    distinct: bool,
    image: str | None,
) -> dict[str, Any]:
    """A machine config from command-line options (validated by the broker): what it runs,
    what it needs and where it may run, as `machine run` and `quote create` both take them."""
    if not command and not image:
        raise typer.BadParameter("give the command after `--`, or an --image", param_hint="COMMAND")
    config: dict[str, Any] = {"cmd": command or []}
    if constraints:
        config["constraints"] = constraints
    if distinct:
        config["distinct_workers_for"] = "app"
    if image:
        config["image"] = image
    guest = {k: v for k, v in (("cpus", cpus), ("memory_mb", memory_mb)) if v is not None}
    if guest:
        config["guest"] = guest
    return config


def _run_config(
    restart: RestartPolicy | None, max_retries: int | None, env: list[str] | None
) -> dict[str, Any]:
    """The part of a machine config only `machine run` takes: its restart policy and its
    environment."""
    config: dict[str, Any] = {}
    restart_config: dict[str, Any] = {}
    if restart is not None:
        restart_config["policy"] = restart.value
    if max_retries is not None:
        restart_config["max_retries"] = max_retries
    if restart_config:
        config["restart"] = restart_config
    if env:
        config["env"] = pairs(env, "env")
    return config


# The commands that differ only in data: (group, verb) -> the argument, the client's call, the
# view of its answer, the summary; each is added where it stands in its group's help.
_RECORD_COMMANDS: dict[tuple[str, str], tuple[object, str, str, str]] = {
    ("quote", "show"): (
        QuoteArg,
        "get_quote",
        "quote",
        "Show a quote: what it holds, where, until when, and why there.",
    ),
    ("quote", "release"): (
        QuoteArg,
        "release_quote",
        "quote",
        "Give a quote's capacity back before its TTL.",
    ),
    ("machine", "show"): (
        IdArg,
        "get_machine",
        "machine",
        "Show a machine: config, state, events and placement.",
    ),
    ("machine", "start"): (
        IdArg,
        "start",
        "machine_state",
        "Start a stopped machine, or resume a suspended one.",
    ),
    ("machine", "restart"): (
        IdArg,
        "restart",
        "machine_state",
        "Stop a machine and start it again.",
    ),
}


def _record_command(group: str, verb: str) -> None:
    """Add ``souq <group> <verb> ID --app APP``: the client's ``call`` on the record, its answer
    through ``render.<view>`` (JSON with ``--json``), as :data:`_RECORD_COMMANDS` has them."""
    arg, call, view, summary = _RECORD_COMMANDS[group, verb]

    def command(record_id: str, app_name: AppOpt, as_json: JsonOpt = False) -> None:
        with reporting(as_json):
            answer = getattr(make_client(), call)(app_name, record_id)
            getattr(render, view)(answer, as_json=as_json)

    command.__annotations__["record_id"] = arg
    command.__doc__ = summary
    command.__name__ = f"{call}_command"
    {"machine": machine_app, "quote": quote_app}[group].command(verb)(command)


@machine_app.command("explain")
def machine_explain(machine_id: IdArg, app_name: AppOpt, as_json: JsonOpt = False) -> None:
    """Why the machine landed where it did: offers, rejections, scores per stage, claims."""
    with reporting(as_json):
        m = make_client().get_machine(app_name, machine_id)
        if m.placement is None:
            render.line(f"machine {m.id} has no placement record")
            return
        render.placement(m.placement, as_json=as_json)


# -- quotes ------------------------------------------------------------------------------------


@quote_app.command("create", context_settings={"allow_interspersed_args": False})
def quote_create(
    *,
    command: CommandArg = None,
    app_name: AppOpt,
    region: Annotated[str, typer.Option("--region", "-r", help="Where to hold capacity.")],
    cpus: CpusOpt = None,
    memory_mb: MemoryOpt = None,
    ttl: Annotated[
        float | None,
        checked_option(
            "--ttl",
            help="Seconds the hold lasts (default 10).",
            checks="souq.model.protocol.HoldRequest.ttl_s",
        ),
    ] = None,
    constraint: ConstraintOpt = None,
    distinct: DistinctOpt = False,
    image: ImageOpt = None,
    policy: PolicyOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Hold capacity for a machine (a dry run that binds); use it with `machine run --quote`."""
    with reporting(as_json):
        config = _config(
            command, cpus, memory_mb, constraints=constraint, distinct=distinct, image=image
        )
        placement = {"policy": policy} if policy else None
        quote = make_client().create_quote(app_name, region, config, ttl_s=ttl, placement=placement)
        render.quote(quote, as_json=as_json)


_record_command("quote", "show")


_record_command("quote", "release")


@machine_app.command("list")
def machine_list(app_name: AppOpt, as_json: JsonOpt = False) -> None:
    """List the app's machines."""
    with reporting(as_json):
        render.machines(make_client().list_machines(app_name), as_json=as_json)


_record_command("machine", "show")


_record_command("machine", "start")


@machine_app.command("stop")
def machine_stop(
    machine_id: IdArg,
    app_name: AppOpt,
    signal: Annotated[
        str | None,
        typer.Option("--signal", "-s", help="Signal to send first.", parser=signal_name),
    ] = None,
    timeout: Annotated[
        float | None,
        checked_option(
            "--timeout",
            help="Seconds before SIGKILL.",
            checks="souq.model.machine.StopConfig.timeout_s",
        ),
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Stop a machine and wait until it has stopped."""
    with reporting(as_json):
        client = make_client()
        machine = client.stop(app_name, machine_id, signal=signal, timeout_s=timeout)
        grace = timeout if timeout is not None else machine.config.stop_config.timeout_s
        machine = client.wait(
            app_name, machine_id, MachineState.STOPPED, timeout=grace + STOP_WAIT_MARGIN_S
        )
        render.machine_state(machine, as_json=as_json)


@machine_app.command("update")
def machine_update(
    machine_id: IdArg,
    *,
    app_name: AppOpt,
    command: CommandArg = None,
    image: ImageOpt = None,
    cpus: CpusOpt = None,
    memory_mb: MemoryOpt = None,
    env: Annotated[
        list[str] | None, typer.Option("--env", "-e", help="K=V, added or replaced; repeatable.")
    ] = None,
    skip_start: Annotated[
        bool, typer.Option("--skip-start", help="A stopped machine stays stopped.")
    ] = False,
    as_json: JsonOpt = False,
) -> None:
    """Change a machine's config in place (its image, command, env or size): it keeps its
    worker and restarts with the new config."""
    with reporting(as_json):
        client = make_client()
        config = client.get_machine(app_name, machine_id).config.model_dump(mode="json")
        if image is not None:
            config["image"] = image
        if command:
            config["cmd"] = command
        if env:
            config["env"] = {**config["env"], **pairs(env, "env")}
        if cpus is not None:
            config["guest"]["cpus"] = cpus
        if memory_mb is not None:
            config["guest"]["memory_mb"] = memory_mb
        machine = client.update(app_name, machine_id, config, skip_launch=skip_start)
        render.machine_state(machine, as_json=as_json)


_record_command("machine", "restart")


@machine_app.command("destroy")
def machine_destroy(
    machine_id: IdArg,
    app_name: AppOpt,
    force: Annotated[
        bool, typer.Option("--force", "-f", help="Kill it at once if it runs.")
    ] = False,
    as_json: JsonOpt = False,
) -> None:
    """Destroy a machine and free its reservation."""
    with reporting(as_json):
        render.machine_state(
            make_client().destroy(app_name, machine_id, force=force), as_json=as_json
        )


@machine_app.command("wait")
def machine_wait(
    machine_id: IdArg,
    app_name: AppOpt,
    state: Annotated[MachineState, typer.Option("--state", help="The state to wait for.")],
    timeout: TimeoutOpt = 60.0,
    as_json: JsonOpt = False,
) -> None:
    """Wait until a machine reaches a state."""
    with reporting(as_json):
        machine = make_client().wait(app_name, machine_id, state, timeout=timeout)
        render.machine_state(machine, as_json=as_json)


@machine_app.command("logs")
def machine_logs(
    machine_id: IdArg,
    app_name: AppOpt,
    follow: Annotated[
        bool, typer.Option("--follow", "-f", help="Keep printing new output.")
    ] = False,
    as_json: JsonOpt = False,
) -> None:
    """Print a machine's output (stdout and stderr)."""
    with reporting(as_json):
        client = make_client()
        chunks = (
            client.follow_logs(app_name, machine_id)
            if follow
            else [client.logs(app_name, machine_id)]
        )
        for chunk in chunks:
            render.logs(chunk, as_json=as_json)


@app.command("events")
def cluster_events(
    app_name: Annotated[str | None, typer.Option("--app", help="Only this app's machines.")] = None,
    worker: Annotated[str | None, typer.Option("--worker", help="Only this worker.")] = None,
    follow: Annotated[
        bool, typer.Option("--follow", "-f", help="Keep printing new events.")
    ] = False,
    since: Annotated[
        int | None,
        typer.Option("--since", min=0, help="Only events after this sequence number."),
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Print the cluster's machine and worker events (the broker keeps the recent ones)."""
    with reporting(as_json):
        for event in make_client().cluster_events(
            app=app_name, worker=worker, follow=follow, since=since
        ):
            render.cluster_event(event, as_json=as_json)


# -- the other commands ------------------------------------------------------------------------


# The other commands live in their own modules; each adds itself to ``app`` (they use the helpers
# above, so they come after them). The daemons' commands stand outside the client, in
# ``souq.daemon_commands``: they build a component's config and run it, calling no API. Run as
# ``python -m souq.client.cli`` this file is ``__main__`` and the modules import it again as
# ``souq.client.cli``: that one registers them.
for _module, _register in (
    ()
    if __name__ == "__main__"
    else (
        ("souq.daemon_commands", "register_daemons"),  # agent, broker, proxy, fleet, dev
        ("souq.client.images", "register_images"),
        ("souq.client.apps_cli", "register_apps"),
        ("souq.client.auth_cli", "register_auth"),
        ("souq.client.cluster_cli", "register_cluster"),
        ("souq.client.workers_cli", "register_workers"),  # list, cordon, drain, uncordon
        ("souq.client.regions_cli", "register_regions"),  # regions and their spot prices
        ("souq.client.secrets_cli", "register_secrets"),
        ("souq.client.volumes_cli", "register_volumes"),  # Fly's volumes
        ("souq.client.quota_cli", "register_quota"),  # quotas of apps and organizations
        ("souq.client.jobs_cli", "register_jobs"),  # batch jobs: the /sched API
        ("souq.client.simulate_cli", "register_simulate"),
        ("souq.client.machine_tools_cli", "register_machine_tools"),  # machine exec, metadata
        # souq.operations: ps, ops, events, suspend, cordon
        ("souq.client.op_cli", "register_operations"),
    )
):
    getattr(importlib.import_module(_module), _register)(app)


def main() -> None:
    """The ``souq`` console script."""
    app(prog_name="souq")


if __name__ == "__main__":
    from souq.client.cli import main as _main

    _main()
