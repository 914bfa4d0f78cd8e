"""``souq simulate``: replay a trace through Souq's placement and report what a policy would
do, before it is turned on (docs/simulator.md).

The openb form replays the ATC'23 experiment (GPU nodes only, pods shuffled per seed, inflated
to 130 % of GPU capacity, no departures) and reports the unallocated GPU % against the arrived
workload: a table, ``--json`` (the contract's shape) and ``--plot FILE.png``. ``--tasks`` replays
a trace with departures, ``--from-cluster`` a planned batch on the live cluster
(:mod:`souq.client.whatif_cli`).
"""

import os
from pathlib import Path
from typing import Annotated

import typer

from souq.client import whatif_cli as w
from souq.client.cli import JsonOpt, reporting

__all__ = ["register_simulate"]


def register_simulate(app: typer.Typer) -> None:
    """Add ``souq simulate`` to ``app``."""
    app.command("simulate")(simulate)


def simulate(
    *,
    nodes: Annotated[
        Path | None, typer.Option("--nodes", help="The nodes of an openb trace (CSV).")
    ] = None,
    pods: Annotated[
        Path | None, typer.Option("--pods", help="The pods of an openb trace (CSV).")
    ] = None,
    policy: Annotated[
        list[str] | None,
        typer.Option(
            "--policy",
            "-p",
            help="A placement policy (repeat to compare): souq (the default), fgd, bestfit, "
            "gpupacking, gpuclustering, dotprod, random.",
        ),
    ] = None,
    seeds: Annotated[
        str, typer.Option("--seeds", help="Seeds: a range (42-51) or a list (1,2,3).")
    ] = "42-51",
    inflate: Annotated[
        float,
        typer.Option("--inflate", help="Resample pods until the GPU request is this x capacity."),
    ] = 1.3,
    jobs: Annotated[
        int, typer.Option("--jobs", "-j", help="Seeds run in parallel processes.", min=1)
    ] = max(1, os.cpu_count() or 1),
    plot: Annotated[
        Path | None,
        typer.Option(
            "--plot",
            help="Write a figure as PNG: unallocated GPU against arrived (openb), or "
            "utilisation and waits over time (--tasks --engine fleet).",
        ),
    ] = None,
    reference: Annotated[
        bool,
        typer.Option(
            "--reference",
            help="Use the reference replay (the paper's scores on arrays) instead of Souq's "
            "placement pipeline: the yardstick the pipeline is checked against.",
        ),
    ] = False,
    tasks: w.TasksOpt = None,
    workers: w.WorkersOpt = None,
    sample_every: w.SampleOpt = None,
    speedup: w.SpeedupOpt = 1.0,
    engine: w.EngineOpt = "cluster",
    queue: w.QueueOpt = False,
    backfill: w.BackfillOpt = False,
    one_by_one: w.OneByOneOpt = False,
    hot: w.HotOpt = 0.9,
    preempt: w.PreemptOpt = 8,
    compare_preemption: w.ComparePreemptionOpt = False,
    cluster: w.FromClusterOpt = False,
    region: w.RegionOpt = None,
    cpus: w.CpusOpt = None,
    memory_mb: w.MemoryOpt = None,
    gpus: w.GpusOpt = None,
    gpu_milli: w.GpuMilliOpt = None,
    gpu_model: w.GpuModelOpt = None,
    count: w.CountOpt = None,
    app_name: w.AppOpt = None,
    config: w.ConfigOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Replay a trace through a placement policy and report unallocated GPUs; or replay a
    trace with departures (--tasks), or a planned batch on the live cluster (--from-cluster)."""
    from souq.errors import InvalidInput
    from souq.sim import experiment

    with reporting(as_json):
        if plot is not None:
            experiment.require_plotting()  # before a run of minutes, not after it
        if cluster or tasks is not None:
            if nodes is not None or pods is not None:
                raise InvalidInput(
                    "--nodes and --pods are the openb form: not with --tasks or --from-cluster",
                    hint="an openb node list is --workers for --tasks",
                )
            size = {"cpus": cpus, "memory_mb": memory_mb, "gpus": gpus, "gpu_milli": gpu_milli}
            w.run(
                cluster=cluster,
                tasks=tasks,
                workers=workers,
                sample_every=sample_every,
                speedup=speedup,
                app=app_name,
                region=region,
                size={**size, "gpu_model": gpu_model},
                count=count,
                config=config,
                policies=policy or [],
                as_json=as_json,
                fleet=w.FleetOptions(
                    engine,
                    queue,
                    one_by_one,
                    hot,
                    plot if tasks else None,
                    backfill,
                    preempt,
                    compare_preemption,
                ),
            )
            return
        if nodes is None or pods is None:
            raise InvalidInput(
                "an openb trace needs both --nodes and --pods",
                hint="for example --nodes traces/alibaba-gpu-v2023_openb_node_list_all_node.csv "
                "--pods traces/alibaba-gpu-v2023_openb_pod_list_default.csv; or --tasks "
                "TASKS.csv --workers SPEC, or --from-cluster",
            )
        for path in (nodes, pods):
            if not path.is_file():
                raise InvalidInput(f"{path} is not a file", hint="give the path of a trace CSV")
        policies = policy or ["souq"]
        experiment.check_policies(policies, reference=reference)
        replay = experiment.reference_replay if reference else experiment.pipeline_replay
        outcomes = experiment.run_experiment(
            replay,
            nodes,
            pods,
            policies,
            experiment.parse_seeds(seeds),
            inflate=inflate,
            jobs=jobs,
        )
        if plot is not None:
            experiment.plot(outcomes, plot)
        from souq.client.render_sim import experiment_outcomes

        experiment_outcomes(outcomes, plot, as_json=as_json)
