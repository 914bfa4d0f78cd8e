"""``souq job submit|status|cancel|list|logs|wait``: batch jobs in the cluster's queue (the
``/sched`` API, docs/jobs.md). A job waits its turn and runs on whichever worker takes it;
``wait`` exits 0 when it succeeded and 1 otherwise, so a script or a CI step can run a job as it
would run a command."""

import importlib
from typing import Annotated, Any

import typer

from souq.client import cli
from souq.client.cli import JsonOpt, pairs, reporting
from souq.client.options import EnvOpt, TimeoutOpt, checked_option, field_option
from souq.model.choices import JobRestart, JobState

AppOpt = Annotated[
    str | None,
    typer.Option(
        "--app",
        "-a",
        help="The app the job belongs to (default: your token's app; for a token of every "
        "app, the default queue's).",
    ),
]
# `job list` and `job periodic`: a filter.
OnlyAppOpt = Annotated[str | None, typer.Option("--app", "-a", help="Only this app's jobs.")]

__all__ = ["register_jobs", "submit_body"]

job_app = typer.Typer(
    help="Submit batch jobs to the cluster's queue, follow and cancel them.", no_args_is_help=True
)


# `job submit` checks its numbers as the record it sends checks them.
_JOB = "souq.model.job.JobSubmit"
NameArg = Annotated[str, typer.Argument(metavar="NAME", help="The job's name (unique).")]


def register_jobs(app: typer.Typer) -> None:
    """Add ``souq job ...`` to ``app``."""
    app.add_typer(job_app, name="job")


def submit_body(
    name: str, command: list[str], env: list[str] | None, **options: Any
) -> dict[str, Any]:
    """The body of ``POST /sched/submit`` from the command line (the broker validates it): one
    word after ``--`` is a shell command line, several are an argv run without a shell;
    ``options`` are the job's other fields, those left out (None) taking the broker's
    defaults."""
    if not command:
        raise typer.BadParameter(
            "give the command after `--`, e.g. -- ./build.sh or -- 'make test > out.log'",
            param_hint="COMMAND",
        )
    body: dict[str, Any] = {"name": name, "command": command[0] if len(command) == 1 else command}
    body |= {k: v for k, v in options.items() if v is not None}
    if env:
        body["env"] = pairs(env, "env")
    return body


@job_app.command("submit")
def submit(
    name: NameArg,
    *,
    command: Annotated[
        list[str] | None,
        typer.Argument(
            metavar="-- COMMAND [ARG...]",
            help="What it runs: an argv, or one shell command line in one argument.",
        ),
    ] = None,
    restart: Annotated[
        JobRestart | None,
        typer.Option("--restart", help="on-failure: run it again after a non-zero exit."),
    ] = None,
    max_retries: Annotated[
        int | None, field_option(_JOB, "--max-retries", help="Runs after the first (default 3).")
    ] = None,
    backoff: Annotated[
        float | None,
        checked_option(
            "--backoff",
            help="Seconds before a retry, doubling each time (default 1).",
            checks=f"{_JOB}.backoff_s",
        ),
    ] = None,
    deadline: Annotated[
        float | None,
        checked_option(
            "--deadline",
            help="Fail it if not finished this many seconds after now.",
            checks=f"{_JOB}.deadline_s",
        ),
    ] = None,
    cpus: Annotated[float | None, field_option(_JOB, "--cpus", help="CPU cores it needs.")] = None,
    memory_mb: Annotated[
        int | None, field_option(_JOB, "--memory-mb", help="Memory it needs, MiB.")
    ] = None,
    env: EnvOpt = None,
    cron: Annotated[
        str | None,
        typer.Option(
            "--cron",
            help="A periodic job: queue a run NAME-<time> at each time this cron expression "
            "names (e.g. '0 3 * * *'; also hourly, daily, weekly, monthly).",
        ),
    ] = None,
    tz: Annotated[
        str | None,
        typer.Option("--tz", help="The IANA time zone --cron is read in (default UTC)."),
    ] = None,
    prohibit_overlap: Annotated[
        bool,
        typer.Option(
            "--prohibit-overlap", help="With --cron: skip a time while the last run lives."
        ),
    ] = False,
    app_name: AppOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Queue a job; prints its name and state (pending). With --cron, a periodic job: prints
    its schedule in words and its next time (`souq job periodic` lists its runs)."""
    with reporting(as_json):
        body = submit_body(
            name,
            command or [],
            env,
            restart=restart,
            max_retries=max_retries,
            backoff_s=backoff,
            deadline_s=deadline,
            cpus=cpus,
            memory_mb=memory_mb,
            app=app_name,
            cron=cron,
            time_zone=tz,
            prohibit_overlap=prohibit_overlap or None,
        )
        from souq.client import render_jobs

        if cron is not None:
            made = cli.make_client().submit_periodic(body)
            render_jobs.periodic_state(made, as_json=as_json)
            return
        render_jobs.job_state(cli.make_client().submit_job(body), as_json=as_json)


@job_app.command("periodic")
def periodic(
    name: Annotated[str | None, typer.Argument(help="Show this one and its runs.")] = None,
    app_name: OnlyAppOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """List the periodic jobs (their schedule, next time, last run and why), or show one
    with its recent runs: each time, the run queued for it or why it was skipped."""
    from souq.client import render_jobs

    with reporting(as_json):
        client = cli.make_client()
        if name is not None:
            render_jobs.periodic(client.periodic_job(name), as_json=as_json)
        else:
            render_jobs.periodic_list(client.periodic_jobs(app=app_name), as_json=as_json)


# The commands on one job (or periodic job) by its name that differ only in data: verb -> the
# client's call, the view of its answer (module.function), the summary; each is added where it
# stands in the group's help.
_BY_NAME_COMMANDS: dict[str, tuple[str, str, str]] = {
    "periodic-delete": (
        "delete_periodic",
        "render_jobs.periodic_state",
        "Stop queuing runs of a periodic job (the runs already queued stay).",
    ),
    "status": (
        "job",
        "render_jobs.job",
        "Show a job: its state and why, its worker, its attempts, how it ended.",
    ),
    "cancel": (
        "cancel_job",
        "render_jobs.job_state",
        "Cancel a job: a waiting one at once; a running one once its worker has stopped it.",
    ),
    "logs": ("job_logs", "render.logs", "Print what a job's runs printed."),
}


def _by_name_command(verb: str) -> None:
    """Add ``souq job <verb> NAME``: the client's ``call`` with the name, its answer through
    the view (JSON with ``--json``), as :data:`_BY_NAME_COMMANDS` has them."""
    call, view, summary = _BY_NAME_COMMANDS[verb]
    module, _, function = view.partition(".")

    def command(name: NameArg, as_json: JsonOpt = False) -> None:
        with reporting(as_json):
            answer = getattr(cli.make_client(), call)(name)
            printer = getattr(importlib.import_module(f"souq.client.{module}"), function)
            printer(answer, as_json=as_json)

    command.__doc__ = summary
    command.__name__ = verb.replace("-", "_")
    job_app.command(verb)(command)


_by_name_command("periodic-delete")
_by_name_command("status")
_by_name_command("cancel")


@job_app.command("list")
def list_jobs(
    state: Annotated[
        JobState | None, typer.Option("--state", help="Only jobs in this state.")
    ] = None,
    app_name: OnlyAppOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """List the queue's jobs your token may read, newest first (ended ones too)."""
    from souq.client import render_jobs

    with reporting(as_json):
        items = cli.make_client().jobs(app=app_name)
        if state is not None:
            items = [j for j in items if j.state == state]
        render_jobs.jobs(items, as_json=as_json)


_by_name_command("logs")


@job_app.command("wait")
def wait(
    name: NameArg,
    timeout: TimeoutOpt = 600.0,
    as_json: JsonOpt = False,
) -> None:
    """Wait until a job has ended; exit 0 if it succeeded, else 1 (and at --timeout)."""
    from souq.client import render_jobs
    from souq.errors import JobFailed

    with reporting(as_json):
        job = cli.make_client().wait_job(name, timeout=timeout)
        render_jobs.job_state(job, as_json=as_json)
        if job.state is not JobState.SUCCEEDED:
            code = "" if job.exit_code is None else f", exit code {job.exit_code}"
            raise JobFailed(
                f"job {name} {job.state}{code}: {job.why}",
                hint=f"`souq job logs {name}` shows its output",
                details={"state": str(job.state), "exit_code": job.exit_code},
            )
