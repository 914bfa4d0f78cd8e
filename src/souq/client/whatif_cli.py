"""``souq simulate --from-cluster`` and ``souq simulate --tasks``: the simulator on the live
cluster's snapshot, and on a trace with departures (docs/simulator.md). The ``simulate``
command (:mod:`souq.client.simulate_cli`) takes the options declared here and hands them on.

* ``--from-cluster``: the workers as the broker lists them now, and a planned batch (``--count``
  machines of a size in ``--region``, or the machines a deploy of ``--config souq.toml`` would
  make) placed one after another on virtual time, each shown with the record a dry run gives.
  Nothing is created. Exit status 3 when a planned machine would not fit.
* ``--tasks TASKS.csv --workers SPEC``: the tasks (the generic format, or openb pods) arrive and
  leave on virtual time on workers of ``SPEC`` (``COUNTxCPUS/MEMORY[/GPUS[:MODEL]]`` or an
  openb node list); the report says what was placed, what failed and why, and how hot the
  workers ran. ``--policy`` repeated: one replay per policy.
"""

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from souq.client import cli
from souq.client.cli import EXIT_NO_CAPACITY
from souq.client.options import size_option
from souq.errors import InvalidInput

if TYPE_CHECKING:
    from souq.client.api import SouqClient
    from souq.model.machine import Machine
    from souq.model.policy import PlacementPolicy
    from souq.model.resources import Resources
    from souq.sim.departures import Report
    from souq.sim.fleet import FleetReport
    from souq.sim.traces import Task
    from souq.sim.whatif import Existing, Planned, WhatIf

__all__ = ["FleetOptions", "from_cluster", "placement_policy", "run", "trace", "trace_fleet"]

WHAT_IF_APP = "what-if"  # the app of planned machines when --app names none

FromClusterOpt = Annotated[
    bool,
    typer.Option(
        "--from-cluster",
        help="Snapshot the live cluster and place a planned batch on it; nothing is created.",
    ),
]
RegionOpt = Annotated[
    str | None, typer.Option("--region", "-r", help="Where the planned machines would go.")
]
# Each machine's size is checked as a machine's guest config is (souq.client.options).
CpusOpt = Annotated[float | None, size_option("--cpus", help="CPU cores of each machine.")]
MemoryOpt = Annotated[
    int | None, size_option("--memory-mb", "--memory", help="Memory of each machine, in MiB.")
]
GpusOpt = Annotated[int | None, size_option("--gpus", help="Whole GPUs of each machine.")]
GpuMilliOpt = Annotated[
    int | None, size_option("--gpu-milli", help="A share of one GPU, in thousandths.")
]
GpuModelOpt = Annotated[str | None, typer.Option("--gpu-model", help="The GPU model it needs.")]
CountOpt = Annotated[
    int | None, typer.Option("--count", "-n", min=1, help="How many machines (default 1).")
]
AppOpt = Annotated[
    str | None,
    typer.Option("--app", "-a", help="The app they belong to (its machines count for spreading)."),
]
ConfigOpt = Annotated[
    Path | None,
    typer.Option("--config", "-c", help="Plan the machines a deploy of this souq.toml makes."),
]
TasksOpt = Annotated[
    Path | None,
    typer.Option("--tasks", help="A trace with departures: the generic CSV, or openb pods."),
]
WorkersOpt = Annotated[
    str | None,
    typer.Option(
        "--workers",
        help="The cluster a trace runs on: COUNTxCPUS/MEMORY[/GPUS[:MODEL]] groups joined by + "
        "(memory in MiB, or 128G), or an openb node list (CSV).",
    ),
]
SampleOpt = Annotated[
    float | None,
    typer.Option("--sample-every", help="Sample every N virtual seconds (default: every event)."),
]
SpeedupOpt = Annotated[
    float,
    typer.Option("--speedup", help="Tasks arrive this many times as fast (durations kept)."),
]
EngineOpt = Annotated[
    str,
    typer.Option(
        "--engine",
        help="--tasks: cluster (each create through a broker's book, auction and the workers' "
        "admission) or fleet (the same placement stages over columns: traces of millions of "
        "instances, queues, batches).",
    ),
]
QueueOpt = Annotated[
    bool,
    typer.Option("--queue", help="--engine fleet: a task that does not fit waits (FIFO)."),
]
BackfillOpt = Annotated[
    bool,
    typer.Option(
        "--backfill",
        help="--queue by the batch-jobs queue's rule: the oldest task that fits goes first, one "
        "that does not fit holds up none behind it.",
    ),
]
OneByOneOpt = Annotated[
    bool,
    typer.Option(
        "--one-by-one",
        help="--tasks: each instance a create of its own (default: a task's instances as one "
        "batch create, all or none).",
    ),
]
HotOpt = Annotated[
    float,
    typer.Option("--hot", min=0.0, max=1.0, help="A host above this share of a resource is hot."),
]
PreemptOpt = Annotated[
    int,
    typer.Option(
        "--preempt",
        min=0,
        max=64,
        help="--tasks: a create that fits nowhere may displace at most this many machines of "
        "a lower priority class (the broker's preempt_max_victims; 0: none).",
    ),
]
ComparePreemptionOpt = Annotated[
    bool,
    typer.Option(
        "--compare-preemption",
        help="--tasks: replay three ways per policy (the reserved tasks alone; every task "
        "without preemption; with it) and print them side by side.",
    ),
]
ENGINES = ("cluster", "fleet")


@dataclass(frozen=True)
class FleetOptions:
    """How ``--tasks`` runs: the engine and, for the fleet, its settings and figure."""

    engine: str = "cluster"
    queue: bool = False
    one_by_one: bool = False
    hot: float = 0.9
    plot: Path | None = None
    backfill: bool = False
    preempt: int = 8  # the broker's preempt_max_victims (souq.market.preemption)
    compare: bool = False  # --compare-preemption

    def check(self) -> None:
        if self.engine not in ENGINES:
            raise InvalidInput(
                f"unknown engine {self.engine!r}",
                hint=f"choose one of {', '.join(ENGINES)}",
                details={"field": "engine"},
            )
        if self.engine == "cluster" and (self.queue or self.plot):
            raise InvalidInput(
                "--queue and --plot are the fleet engine's",
                hint="add --engine fleet",
                details={"field": "engine"},
            )
        if self.backfill and not self.queue:
            raise InvalidInput(
                "--backfill is a rule of the queue", hint="add --queue", details={"field": "queue"}
            )
        if self.compare and self.plot:
            raise InvalidInput(
                "--compare-preemption prints a table: not with --plot",
                details={"field": "plot"},
            )


def run(
    *,
    cluster: bool,
    tasks: Path | None,
    workers: str | None,
    sample_every: float | None,
    speedup: float,
    app: str | None,
    region: str | None,
    size: Mapping[str, object],
    count: int | None,
    config: Path | None,
    policies: list[str],
    as_json: bool,
    fleet: FleetOptions | None = None,
) -> None:
    """``souq simulate --from-cluster`` or ``--tasks``: the options as the command took them."""
    chosen = [placement_policy(name) for name in policies]
    if cluster and tasks is not None:
        raise InvalidInput(
            "--from-cluster and --tasks are two simulations: give one",
            hint="--from-cluster places a batch on the live cluster; --tasks replays a trace",
        )
    if cluster:
        if len(chosen) > 1:
            raise InvalidInput(
                "--from-cluster places with one --policy", details={"field": "policy"}
            )
        from_cluster(
            app=app,
            region=region,
            size=size,
            count=count,
            config=config,
            policy=chosen[0] if chosen else None,
            as_json=as_json,
        )
    else:
        assert tasks is not None
        fleet = fleet or FleetOptions()
        fleet.check()
        if fleet.engine == "fleet":
            trace_fleet(
                tasks,
                workers,
                chosen,
                fleet,
                sample_every=sample_every,
                speedup=speedup,
                as_json=as_json,
            )
            return
        trace(
            tasks,
            workers,
            chosen,
            sample_every=sample_every,
            speedup=speedup,
            as_json=as_json,
            batch=not fleet.one_by_one,
            hot=fleet.hot,
            preempt=fleet.preempt,
            compare=fleet.compare,
        )


def placement_policy(name: str) -> "PlacementPolicy":
    """A ``--policy`` name (``souq simulate``'s, or a broker's) as a placement policy."""
    from pydantic import ValidationError

    from souq.model.policy import PlacementPolicy
    from souq.sim.market_replay import POLICY_NAMES

    if name in POLICY_NAMES:
        return POLICY_NAMES[name]
    try:
        return PlacementPolicy.model_validate({"policy": name})
    except ValidationError:
        raise InvalidInput(
            f"unknown policy {name!r}",
            hint=f"choose among {', '.join(POLICY_NAMES)}",
            details={"field": "policy"},
        ) from None


# -- the live cluster --------------------------------------------------------------------------


def from_cluster(
    *,
    app: str | None,
    region: str | None,
    size: Mapping[str, object],
    count: int | None,
    config: Path | None,
    policy: "PlacementPolicy | None",
    as_json: bool,
) -> "WhatIf":
    """Snapshot the cluster, place the planned machines on it, print where each would go;
    exit 3 (after printing) when one would not fit."""
    from souq.client import render
    from souq.sim.whatif import snapshot, what_if

    given = {k: v for k, v in size.items() if v is not None}
    if config is not None and (given or region or count):
        raise InvalidInput(
            "--config plans the machines souq.toml says: it takes no --region, size or --count",
            hint="give either --config souq.toml, or --region with a size and --count",
        )
    client = cli.make_client()
    if config is not None:
        app, planned = _deploy_plan(client, config)
    elif region is None:
        raise InvalidInput(
            "--from-cluster needs --region (where the machines would go), or --config",
            hint="e.g. souq simulate --from-cluster --region mad --cpus 2 --memory-mb 512 "
            "--count 10",
        )
    else:
        planned = _batch(app or WHAT_IF_APP, region, given, count or 1)
    existing = _existing(client.list_machines(app)) if app else []
    snap = snapshot(client.workers(), machines=existing, policy=policy)
    outcome = what_if(snap, planned)
    render.what_if(outcome, as_json=as_json)
    if outcome.unplaced:
        raise typer.Exit(EXIT_NO_CAPACITY)
    return outcome


def _batch(app: str, region: str, size: Mapping[str, object], count: int) -> list["Planned"]:
    from souq.model.machine import GuestConfig
    from souq.sim.whatif import batch

    return batch(app, region, GuestConfig.model_validate(size).resources(), count)


def _deploy_plan(client: "SouqClient", path: Path) -> tuple[str, list["Planned"]]:
    """The machines a deploy of ``path`` would create now (the app's machines as they are)."""
    from souq.apps import load_app_config
    from souq.apps.plan import plan
    from souq.client.deploy import current_machines
    from souq.model.machine import GuestConfig
    from souq.sim.whatif import Planned

    try:
        text = path.read_text()
    except OSError as exc:
        raise InvalidInput(
            f"cannot read {path}: {exc.strerror or exc}", hint="give the app's souq.toml"
        ) from None
    config = load_app_config(text, str(path))
    machines = client.list_machines(config.app)
    planned = []
    for phase in plan(config, current_machines(machines)):
        for step in (s for s in phase.steps if s.action == "create"):
            guest = config.machine_config(step.group, image="", release=0)["guest"]
            apart = config.served(step.group) and not config.regions  # as a deploy spreads
            resources = GuestConfig.model_validate(guest).resources()
            planned.append(
                Planned(config.app, step.region, resources, group=step.group, apart=apart)
            )
    return config.app, planned


def _existing(machines: list["Machine"]) -> list["Existing"]:
    """The app's machines (those on their way out left out), for the book to count."""
    from souq.model.machine import MachineState
    from souq.sim.whatif import Existing

    gone = (MachineState.DESTROYING, MachineState.DESTROYED)
    return [
        Existing(m.id, m.worker_id, m.app, m.region, m.config.metadata.get("souq_process_group"))
        for m in machines
        if m.state not in gone
    ]


# -- a trace with departures -------------------------------------------------------------------


def trace(
    tasks: Path,
    workers: str | None,
    policies: list["PlacementPolicy"],
    *,
    sample_every: float | None,
    speedup: float,
    as_json: bool,
    batch: bool = True,
    hot: float = 0.9,
    preempt: int = 8,
    compare: bool = False,
) -> list["Report"]:
    """Replay the tasks on the workers, once per policy (the default pipeline's when none),
    and print the reports; with ``compare``, three times per policy (what preemption buys)."""
    from souq.client import render_sim
    from souq.sim.departures import replay, speed_up

    cluster = _workers(workers)
    arriving = speed_up(_read_tasks(tasks, cluster), speedup)

    def run(
        policy: "PlacementPolicy | None",
        some: "Sequence[Task]",
        most: int,
        window: tuple[float, float] | None = None,
    ) -> "Report":
        return replay(
            cluster,
            some,
            policy=policy,
            sample_every_s=sample_every,
            batch=batch,
            hot=hot,
            preempt=most,
            window=window,
        )

    reports = _each_policy(run, policies, arriving, preempt, compare=compare, as_json=as_json)
    _print_reports(reports, render_sim.trace_replay, as_json)
    return reports


def _each_policy(
    run: "Callable[..., Any]",
    policies: list["PlacementPolicy"],
    tasks: "Sequence[Task]",
    preempt: int,
    *,
    compare: bool,
    as_json: bool,
) -> list[Any]:
    """``run`` once per policy (the default pipeline's when none), its reports; with
    ``compare``, the three runs of each printed side by side, and no reports."""
    each: list[PlacementPolicy | None] = [*policies] or [None]
    if compare:
        _compare([partial(run, policy) for policy in each], tasks, preempt, as_json)
        return []
    return [run(policy, tasks, preempt) for policy in each]


def _print_reports(reports: list[Any], view: "Callable[[Any], None]", as_json: bool) -> None:
    """The reports through ``view``, or as JSON (one report alone, not in a list); none when
    they were compared (printed already)."""
    from souq.client import render

    if reports and as_json:
        render.json_value(reports[0] if len(reports) == 1 else reports)
    for report in [] if as_json else reports:
        view(report)


def _compare(
    runs: "list[Callable[[Sequence[Task], int, tuple[float, float]], Any]]",
    tasks: "Sequence[Task]",
    preempt: int,
    as_json: bool,
) -> None:
    """``--compare-preemption``: the three runs of each policy, printed side by side."""
    from souq.client import render, render_sim
    from souq.sim.preemption_compare import compare

    comparisons = [compare(run, tasks, preempt=preempt) for run in runs]
    if as_json:
        render.json_value(comparisons[0] if len(comparisons) == 1 else comparisons)
        return
    for comparison in comparisons:
        render_sim.preemption_comparison(comparison)


def _workers(workers: str | None) -> list["Resources"]:
    from souq.sim.departures import parse_workers, workers_of
    from souq.sim.traces import read_nodes

    if not workers:
        raise InvalidInput(
            "--tasks needs --workers: the cluster the trace runs on",
            hint="e.g. --workers 1000x32/128G, or an openb node list (CSV)",
        )
    spec = Path(workers)
    return workers_of(read_nodes(spec)) if spec.is_file() else parse_workers(workers)


def trace_fleet(
    tasks: Path,
    workers: str | None,
    policies: list["PlacementPolicy"],
    options: FleetOptions,
    *,
    sample_every: float | None,
    speedup: float,
    as_json: bool,
) -> list["FleetReport"]:
    """Replay the tasks on a fleet of the workers (:mod:`souq.sim.fleet`), once per policy,
    and print the reports (and draw the first one's timeline with ``--plot``)."""
    from souq.client import render_sim
    from souq.model.policy import PlacementDefaults
    from souq.placement import build_pipeline
    from souq.sim.departures import speed_up
    from souq.sim.fleet import Settings, replay_fleet

    hosts = _workers(workers)
    arriving = speed_up(_read_tasks(tasks, hosts), speedup)
    settings = Settings(
        batch=not options.one_by_one,
        queue=options.queue,
        backfill=options.backfill,
        hot=options.hot,
        sample_every_s=sample_every,
        preempt=options.preempt,
    )

    def run(
        policy: "PlacementPolicy | None",
        some: "Sequence[Task]",
        most: int,
        window: tuple[float, float] | None = None,
    ) -> "FleetReport":
        return replay_fleet(
            hosts,
            some,
            pipeline=build_pipeline(policy, PlacementDefaults()),
            settings=replace(settings, preempt=most, window=window),
        )

    reports = _each_policy(
        run, policies, arriving, options.preempt, compare=options.compare, as_json=as_json
    )
    if reports and options.plot is not None:
        from souq.sim.fleet_plot import plot_timeline

        plot_timeline(reports, options.plot)
    _print_reports(reports, render_sim.fleet_replay, as_json)
    return reports


def _read_tasks(path: Path, hosts: list["Resources"]) -> list["Task"]:
    """The generic trace, openb's pods (their creation and deletion times), or Alibaba's
    cluster-trace-v2017 or v2018 batch tasks (no header, eight or nine cells; memory as a share
    of the largest worker's)."""
    from souq.sim.alibaba import BATCH_TASK_COLUMNS, BATCH_TASK_V2018_COLUMNS, read_batch_tasks
    from souq.sim.traces import read_pods, read_tasks, tasks_from_pods

    try:
        with path.open(encoding="utf-8") as f:
            header = f.readline()
    except OSError as exc:
        raise InvalidInput(f"{path}: cannot read the trace: {exc.strerror or exc}") from None
    cells = [column.strip() for column in header.split(",")]
    if "creation_time" in cells:
        return tasks_from_pods(read_pods(path))
    memory = max(h.memory_mb for h in hosts)
    if len(cells) == len(BATCH_TASK_COLUMNS) and cells[0].lstrip("-").isdigit():
        return read_batch_tasks(path, host_memory_mib=memory)
    if len(cells) == len(BATCH_TASK_V2018_COLUMNS) and cells[1].isdigit():
        return read_batch_tasks(path, host_memory_mib=memory, version=2018)
    return read_tasks(path)
