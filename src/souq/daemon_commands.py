"""The daemons' commands of the ``souq`` command line: ``souq agent``, ``souq broker``, ``souq
fleet`` and ``souq dev``. Each builds its component's config from the options and runs it in the
foreground; the component is imported only then, so the client's commands never load it."""

from __future__ import annotations

import importlib
import logging
from pathlib import Path
from typing import Annotated, Any, Literal

import typer

from souq.client.cli import pairs, reporting

__all__ = ["register_daemons"]

daemons = typer.Typer()


def register_daemons(app: typer.Typer) -> None:
    """Add the daemons' commands to ``app``."""
    for command in daemons.registered_commands:
        app.registered_commands.append(command)


# The fixed sets of values the daemons' options take: each option offers exactly the values of
# the config field it sets.
LogFormat = Literal["text", "json"]
Candidates = Literal["book", "offers"]
Cgroups = Literal["auto", "v2", "v1", "none"]
DefaultDriver = Literal["auto", "exec", "sandbox"]
PrivateNetwork = Literal["auto", "on", "off"]

NatsOpt = Annotated[
    str,
    typer.Option(
        "--nats", help="NATS URL, e.g. nats://127.0.0.1:4222; a NATS cluster's: comma-separated."
    ),
]
AuthDirOpt = Annotated[
    Path | None,
    typer.Option(
        "--auth-dir",
        envvar="SOUQ_AUTH_DIR",
        help="The cluster's auth directory (souq cluster init): credentials and token keys.",
    ),
]
LogFormatOpt = Annotated[
    LogFormat, typer.Option("--log-format", help="text, or json: one object per line with ids.")
]
# Options more than one daemon takes, alike (None: the config's own default).
CpusOpt = Annotated[float | None, typer.Option("--cpus", help="CPU cores a worker offers.")]
MemoryOpt = Annotated[
    int | None, typer.Option("--memory-mb", help="MiB of memory a worker offers.")
]
ImageCacheOpt = Annotated[
    int | None,
    typer.Option(
        "--image-cache-mb", help="Bound of a worker's image cache in MiB (default 10240)."
    ),
]
MachineUserOpt = Annotated[
    str | None,
    typer.Option(
        "--machine-user",
        help="The user every machine runs as, NAME or UID (default: a root agent gives each "
        "machine a uid of its own; another runs them as itself).",
    ),
]


DefaultDriverOpt = Annotated[
    DefaultDriver | None,
    typer.Option(
        "--default-driver",
        help="The driver of a machine whose config names none: auto (default) isolates where "
        "this host can; exec runs plain processes unless a machine asks for the sandbox.",
    ),
]
DomainOpt = Annotated[
    str | None,
    typer.Option("--domain", help="APP.<domain> reaches app APP through the proxy (localhost)."),
]
AutostopOpt = Annotated[
    float | None,
    typer.Option(
        "--autostop-interval", help="Seconds between the proxy's autostop rounds (default 60)."
    ),
]


def _daemon_logging(log_format: str = "text") -> None:
    from souq.logs import configure

    configure("json" if log_format == "json" else "text", logging.INFO)


def _given(ctx: typer.Context, **converted: Any) -> dict[str, Any]:
    """The config a daemon's command line asks for: every option the user gave, under its
    parameter's name, which is the config field it sets, with ``converted`` in place of the
    options the config takes in another form (None: an option that is not the config's). An
    option left out (None) keeps the config's own default."""
    options = ctx.params | converted
    return {k: v for k, v in options.items() if v is not None}


def _run_component(config: str, run: str, given: dict[str, Any]) -> None:
    """Run a component in the foreground: its config class (``config``, ``module.Class``) built
    from ``given``, handed to its ``run`` (``module.function``). Both are imported only now, so
    that the command line loads no component; an error of the config or the component is
    reported as every command reports one (its message, exit 1)."""

    def load(name: str) -> Any:
        module, _, attribute = name.rpartition(".")
        return getattr(importlib.import_module(module), attribute)

    with reporting():
        load(run)(load(config)(**given))


def _host_port(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit():
        raise typer.BadParameter(f"{text!r} is not HOST:PORT", param_hint="--listen")
    return host.strip("[]") or "127.0.0.1", int(port)


@daemons.command("agent")
def agent(
    ctx: typer.Context,
    *,
    region: Annotated[str, typer.Option("--region", help="The worker's region.")],
    nats_url: NatsOpt,
    auth_dir: AuthDirOpt = None,
    data_dir: Annotated[
        Path | None, typer.Option("--data-dir", help="Where the agent keeps its state.")
    ] = None,
    worker_id: Annotated[
        str | None,
        typer.Option(
            "--worker-id",
            help="Which agent credential of the auth directory (agent-ID.nk) to use, when it "
            "holds several; the worker takes its id from it.",
        ),
    ] = None,
    cpus: CpusOpt = None,
    memory_mb: MemoryOpt = None,
    disk_mb: Annotated[
        int | None,
        typer.Option("--disk-mb", help="Disk to offer, in MiB (default: the data dir's free)."),
    ] = None,
    gpus: Annotated[int | None, typer.Option("--gpus", help="GPUs to offer (default 0).")] = None,
    gpu_model: Annotated[
        str | None,
        typer.Option("--gpu-model", help="The model of its GPUs, e.g. V100M16 (default: none)."),
    ] = None,
    labels: Annotated[list[str] | None, typer.Option("--label", help="k=v, repeatable.")] = None,
    stop_machines_on_exit: Annotated[
        bool,
        typer.Option("--stop-machines-on-exit", help="Stop the machines when the agent exits."),
    ] = False,
    heartbeat_interval_s: Annotated[
        float | None,
        typer.Option("--heartbeat-interval", help="Seconds between heartbeats (default 1)."),
    ] = None,
    spot_notice_s: Annotated[
        float | None,
        typer.Option(
            "--spot-notice",
            help="Seconds of notice a spot machine outbid by its region's price gets before "
            "its stop (default 0: at once; AWS gives 120).",
        ),
    ] = None,
    metrics_port: Annotated[
        int | None,
        typer.Option("--metrics-port", help="Serve Prometheus /metrics on this port (0: off)."),
    ] = None,
    cgroups: Annotated[
        Cgroups,
        typer.Option(
            "--cgroups",
            envvar="SOUQ_CGROUPS",
            help="How machine limits are enforced: auto (v2, else v1, else none), v2, v1, none.",
        ),
    ] = "auto",
    advertise: Annotated[
        str | None,
        typer.Option("--advertise", help="The address machines are reached at (127.0.0.1)."),
    ] = None,
    ports: Annotated[
        str | None,
        typer.Option("--ports", help="Host ports for machines, LOW-HIGH (default 20000-29999)."),
    ] = None,
    image_cache_mb: ImageCacheOpt = None,
    log_max_bytes: Annotated[
        int | None,
        typer.Option(
            "--log-max-bytes",
            help="A machine's output log rotates past this size; one rotated file is kept "
            "(default 4 MiB).",
        ),
    ] = None,
    machine_user: MachineUserOpt = None,
    allow_root_machines: Annotated[
        bool,
        typer.Option("--allow-root-machines", help="Let --machine-user be root."),
    ] = False,
    default_driver: DefaultDriverOpt = None,
    private_network: Annotated[
        PrivateNetwork | None,
        typer.Option(
            "--private-network",
            help="Each sandboxed machine in a network namespace of its own with a private "
            "address (docs/network.md): auto (default: where the host can), on, off.",
        ),
    ] = None,
    underlay: Annotated[
        str | None,
        typer.Option(
            "--underlay",
            help="This host's address that other workers route its machines' private "
            "addresses to (default: --advertise unless loopback; docs/network.md).",
        ),
    ] = None,
    underlay_encryption: Annotated[
        str | None,
        typer.Option(
            "--underlay-encryption",
            help="none (default: a trusted network between hosts) or wireguard (encrypted, "
            "to workers that encrypt too).",
        ),
    ] = None,
    underlay_link: Annotated[
        str | None,
        typer.Option(
            "--underlay-link",
            help="auto (default), direct or vxlan: to workers on this host's IPv4 subnet that "
            "publish their link-local too, IPv6 routed straight over the link once a ping "
            "over it is answered (auto, else VXLAN), without one (direct), or always over "
            "VXLAN (vxlan; docs/network.md).",
        ),
    ] = None,
    flycast_port: Annotated[
        int | None,
        typer.Option(
            "--flycast-port",
            help="Port of this host's edge proxy at [fdaa::4] that machines' Flycast "
            "connections go to (souq proxy --flycast; default 4282; 0: no Flycast).",
        ),
    ] = None,
    names_port: Annotated[
        int | None,
        typer.Option(
            "--names-port",
            help="Port at [fdaa::3] where this cluster's name server answers the machines' "
            "names (their questions to port 53 are sent there; default 53; docs/names.md).",
        ),
    ] = None,
    jobs: Annotated[
        int | None,
        typer.Option(
            "--jobs",
            help="Batch jobs to run at once, pulled from the queue when there is room "
            "(default 4; 0: none).",
        ),
    ] = None,
    job_lease_s: Annotated[
        float | None,
        typer.Option(
            "--job-lease",
            help="Seconds a claimed job is leased for (default 30): renewed while it runs, "
            "back in the queue this long after its worker died.",
        ),
    ] = None,
    dns: Annotated[
        str | None,
        typer.Option(
            "--dns",
            help="Answer .internal names on ADDRESS:PORT, UDP and TCP, and forward the rest to "
            "the host's resolvers (e.g. [fdaa::3]:53; default: off).",
        ),
    ] = None,
    dns_upstreams: Annotated[
        list[str] | None,
        typer.Option(
            "--dns-upstream",
            help="ADDRESS:PORT to forward names outside .internal to, repeatable, in order "
            "(default: the host's resolvers, /etc/resolv.conf).",
        ),
    ] = None,
    log_format: LogFormatOpt = "text",
) -> None:
    """Run a worker agent in the foreground."""
    given = _given(ctx, labels=pairs(labels, "label"), log_format=None)
    if log_format == "json":
        _daemon_logging("json")
    _run_component("souq.agent.config.AgentConfig", "souq.agent.main.run", given)


@daemons.command("broker")
def broker(
    ctx: typer.Context,
    *,
    nats_url: NatsOpt,
    auth_dir: AuthDirOpt = None,
    listen: Annotated[
        str, typer.Option("--listen", help="HOST:PORT for the HTTP API.")
    ] = "127.0.0.1:4280",
    candidates_from: Annotated[
        Candidates | None,
        typer.Option(
            "--candidates-from",
            help="book: draw candidates from what workers said (default); "
            "offers: ask the workers every time.",
        ),
    ] = None,
    sample_above: Annotated[
        int | None,
        typer.Option(
            "--sample-above", help="Asking offers: ask a random sample past this many workers."
        ),
    ] = None,
    sample_factor_d: Annotated[
        float | None,
        typer.Option("--sample-d", help="Sparrow's d: candidates with room for d x m machines."),
    ] = None,
    placement: Annotated[
        Path | None,
        typer.Option(
            "--placement",
            help="A JSON file of the default placement policy: policy, weights, curves, limit, "
            "gpu_workload (docs/placement.md).",
        ),
    ] = None,
    quota_reservation_s: Annotated[
        float | None,
        typer.Option(
            "--quota-reservation",
            help="Seconds a create's quota reservation stands unsettled (default 120).",
        ),
    ] = None,
    spot_price: Annotated[
        list[str] | None,
        typer.Option(
            "--spot-price",
            help="The spot price rule, KEY=VALUE, repeatable: floor (0.01 an hour), knee "
            "(0.5), peak (10), interval_s (1); give every broker the same (docs/placement.md).",
        ),
    ] = None,
    log_format: LogFormatOpt = "text",
) -> None:
    """Run a broker (the HTTP API) in the foreground."""
    host, port = _host_port(listen)
    _daemon_logging(log_format)
    with reporting():  # the placement file's errors
        given = _given(
            ctx,
            listen=None,
            log_format=None,
            listen_host=host,
            listen_port=port,
            placement=None if placement is None else _placement(placement),
            spot_price=pairs(spot_price, "spot-price") if spot_price else None,
        )
    _run_component("souq.broker.config.BrokerConfig", "souq.broker.main.run", given)


def _placement(path: Path) -> Any:
    """The broker's default placement policy from a JSON file, checked (a clear error)."""
    from pydantic import ValidationError

    from souq.errors import InvalidInput
    from souq.model.policy import PlacementDefaults

    try:
        return PlacementDefaults.model_validate_json(path.read_bytes())
    except OSError as exc:
        raise InvalidInput(f"cannot read {path}: {exc.strerror}", hint="give a JSON file") from exc
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(x) for x in first["loc"]) or "the file"
        raise InvalidInput(
            f"{path}: {where}: {first['msg']}", hint="docs/placement.md lists the fields"
        ) from exc


@daemons.command("proxy")
def proxy(
    ctx: typer.Context,
    *,
    nats_url: NatsOpt,
    region: Annotated[str, typer.Option("--region", help="The proxy's own region.")],
    auth_dir: AuthDirOpt = None,
    listen: Annotated[
        str, typer.Option("--listen", help="HOST:PORT for HTTP (APP.<domain> routes to APP).")
    ] = "127.0.0.1:4281",
    domain: DomainOpt = None,
    autostop_interval_s: AutostopOpt = None,
    admin_port: Annotated[
        int | None,
        typer.Option("--admin-port", help="Serve /metrics and /decisions here (0: off)."),
    ] = None,
    flycast: Annotated[
        str | None,
        typer.Option(
            "--flycast",
            help="Take the Flycast connections of this host's machines on ADDRESS:PORT "
            "(the workers' [fdaa::4]:4282; docs/network.md; default: off).",
        ),
    ] = None,
    log_format: LogFormatOpt = "text",
) -> None:
    """Run the edge proxy in the foreground: HTTP to apps' machines, scale from zero."""
    given = _given(
        ctx,
        listen=_host_port(listen),
        flycast=_host_port(flycast) if flycast else None,
        log_format=None,
    )
    _daemon_logging(log_format)
    _run_component("souq.proxy.daemon.ProxyConfig", "souq.proxy.main.run", given)


@daemons.command("fleet")
def fleet(
    ctx: typer.Context,
    *,
    nats_url: NatsOpt,
    workers: Annotated[int, typer.Option("--workers", help="How many hollow workers.")],
    auth_dir: AuthDirOpt = None,
    region: Annotated[str, typer.Option("--region", help="Their region.")],
    cpus: CpusOpt = None,
    memory_mb: MemoryOpt = None,
    jobs: Annotated[
        int | None,
        typer.Option("--jobs", help="Batch jobs each runs at once (hollow: a run sleeps)."),
    ] = None,
    data_dir: Annotated[
        Path | None,
        typer.Option("--data-dir", help="Keep each worker's state in a file (default: memory)."),
    ] = None,
) -> None:
    """Run N hollow workers in one process: the real protocol, no processes (for scale)."""
    given = _given(ctx)
    _daemon_logging()
    logging.getLogger().setLevel(logging.WARNING)  # one line per worker would drown the rest
    _run_component("souq.fleet.FleetConfig", "souq.fleet.run", given)


@daemons.command("dev")
def dev(
    ctx: typer.Context,
    *,
    port: Annotated[int, typer.Option("--port", help="Port of the HTTP API.")] = 4280,
    nats_port: Annotated[
        int | None, typer.Option("--nats-port", help="Port of the embedded NATS server.")
    ] = None,
    nats_cluster: Annotated[
        int,
        typer.Option(
            "--nats-cluster",
            min=1,
            max=7,
            help="Run NATS as a cluster of this many nodes (3: any one may die).",
        ),
    ] = 1,
    regions: Annotated[str, typer.Option("--regions", help="Comma-separated regions.")] = "mad,syd",
    workers_per_region: Annotated[
        int, typer.Option("--workers-per-region", help="Workers started in each region.")
    ] = 2,
    worker_cpus: Annotated[
        float | None,
        typer.Option(
            "--worker-cpus",
            help="CPU cores each worker offers (default: its share of the host's, at least 1).",
        ),
    ] = None,
    worker_memory_mb: Annotated[
        int | None,
        typer.Option(
            "--worker-memory-mb",
            help="MiB each worker offers (default: its share of the host's memory).",
        ),
    ] = None,
    image_cache_mb: ImageCacheOpt = None,
    data_dir: Annotated[
        Path | None, typer.Option("--data-dir", help="Where the cluster keeps its state.")
    ] = None,
    proxy_port: Annotated[
        int, typer.Option("--proxy-port", help="Port of the edge proxy (APP.<domain>).")
    ] = 4281,
    domain: DomainOpt = None,
    autostop_interval_s: AutostopOpt = None,
    machine_user: MachineUserOpt = None,
    log_format: LogFormatOpt = "text",
) -> None:
    """Run a whole local cluster: NATS, a broker, an edge proxy and workers, on loopback."""
    if log_format == "json":
        _daemon_logging("json")
    names = tuple(r.strip() for r in regions.split(",") if r.strip())
    if not names:
        raise typer.BadParameter("name at least one region", param_hint="--regions")
    # The cluster's processes log in the format asked for (text: their default).
    log_as = None if log_format == "text" else log_format
    given = _given(ctx, regions=names, log_format=log_as)
    _run_component("souq.dev.DevConfig", "souq.dev.run", given)
