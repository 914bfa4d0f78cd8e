"""``souq deploy``, ``souq releases``, ``souq status``, ``souq rollback``, ``souq scale count``
and ``souq scale reconcile``: the app's policy, carried out by this client through the API
(docs/apps.md); and ``souq apps create|show|list|destroy``: the app resource itself."""

import contextlib
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from souq.client.cli import AppNameOpt, JsonOpt, make_client, reporting
from souq.client.options import StrategyOpt, release_version
from souq.model.choices import EventType

if TYPE_CHECKING:
    from souq.apps.config import AppConfig
    from souq.client.api import SouqClient
    from souq.client.deploy import Deployer, DeployEvent
    from souq.model.machine import Machine
    from souq.model.release import Release

__all__ = ["register_apps"]

scale_app = typer.Typer(help="Change how many machines an app runs.", no_args_is_help=True)
apps_group = typer.Typer(
    help="Create, show, list and destroy apps (an app with machines exists without a create).",
    no_args_is_help=True,
)


def register_apps(app: typer.Typer) -> None:
    """Add the app commands to ``app``."""
    app.command("deploy")(deploy)
    app.command("releases")(releases)
    app.command("status")(status)
    app.command("rollback")(rollback)
    app.add_typer(scale_app, name="scale")
    app.add_typer(apps_group, name="apps")


def deploy(
    *,
    config: Annotated[Path, typer.Option("--config", "-c", help="The app's souq.toml.")] = Path(
        "souq.toml"
    ),
    strategy: StrategyOpt = None,
    image: Annotated[
        str | None, typer.Option("--image", help="Deploy this image instead of [build].")
    ] = None,
    dry_run: Annotated[
        bool,
        typer.Option(
            "--dry-run", help="Show the plan and where each new machine would go; change nothing."
        ),
    ] = False,
    as_json: JsonOpt = False,
) -> None:
    """Deploy the app as souq.toml says: a new release, live everywhere (exit 0), or rolled back
    everywhere with the failing phase, region, machine and check named (exit 1)."""
    from souq.apps import load_app_config
    from souq.client import render_deploy
    from souq.client.deploy import Deployer, check_regions
    from souq.errors import InvalidInput

    with reporting(as_json):
        try:
            text = config.read_text()
        except OSError as exc:
            raise InvalidInput(
                f"cannot read {config}: {exc.strerror or exc}",
                hint="run `souq deploy` where souq.toml is, or give --config",
            ) from None
        app_config = load_app_config(text, str(config))
        client = make_client()
        check_regions(client, app_config)  # before an image is packed and pushed
        reference = image or _image_of(client, app_config, config.parent)
        if dry_run:  # the plan, not the events of holding capacity and letting it go
            quiet = Deployer(client, app_config, image=reference, strategy=strategy)
            render_deploy.deploy_plan(_plan_rows(quiet), as_json=as_json)
            return
        _deploy(
            client,
            app_config.app,
            lambda tell: Deployer(
                client, app_config, image=reference, strategy=strategy, on_event=tell
            ),
            as_json=as_json,
        )


def _plan_rows(deployer: "Deployer") -> list[dict[str, object]]:
    """The dry run's plan: a row per step, with the worker that would take each new machine."""
    rows: list[dict[str, object]] = []
    for phase, steps in deployer.dry_run():
        for step, quote in steps:
            rows.append(
                {
                    "phase": phase.name,
                    "action": "create (canary)" if step.canary else step.action,
                    "group": step.group,
                    "region": step.region,
                    "machine_id": step.machine_id,
                    "worker_id": quote.worker_id if quote else None,
                    "waits_for_health": phase.wait_healthy,
                }
            )
    return rows


def _deploy(
    client: "SouqClient",
    app: str,
    build: Callable[[Callable[["DeployEvent"], None]], "Deployer"],
    *,
    as_json: bool,
) -> None:
    """Deploy (the events shown live), then, for people, the app's machines as they are,
    however it ended."""
    from souq.client import render_deploy

    try:
        with render_deploy.deploy_progress(as_json=as_json) as show:
            build(lambda e: show(e.as_dict())).run()
    finally:
        if not as_json:
            render_deploy.app_status(_by_group(client.list_machines(app)))


def _by_group(machines: list["Machine"]) -> list["Machine"]:
    return sorted(
        machines,
        key=lambda m: (m.config.metadata.get("souq_process_group", ""), m.region, m.id),
    )


def _image_of(client: "SouqClient", config: "AppConfig", base: Path) -> str:
    """The image [build] names, or its directory packed and stored now."""
    from souq.errors import InvalidInput
    from souq.images import layout_tar, pack_directory

    build = config.build
    if build is None:
        raise InvalidInput(
            "souq.toml has no [build]: say what to run with `dir` or `image`, or give --image",
            hint='add [build] with dir = "." (or image = "NAME:TAG")',
        )
    if build.image is not None:
        return build.image
    assert build.dir is not None
    image = pack_directory((base / build.dir).resolve())
    # Into the app's own names: never a name every app's machines would find.
    pushed = client.push_image(layout_tar(image), name=f"{config.app}:latest", app=config.app)
    return pushed.reference


def releases(*, app_name: AppNameOpt, as_json: JsonOpt = False) -> None:
    """The app's releases, newest first."""
    from souq.client import render_deploy

    with reporting(as_json):
        render_deploy.releases(make_client().releases(app_name), as_json=as_json)


def status(*, app_name: AppNameOpt, as_json: JsonOpt = False) -> None:
    """The app's machines: process group, region, release, state and health checks."""
    from souq.client import render_deploy

    with reporting(as_json):
        render_deploy.app_status(_by_group(make_client().list_machines(app_name)), as_json=as_json)


def rollback(
    *,
    app_name: AppNameOpt,
    version: Annotated[
        int | None,
        typer.Argument(
            metavar="VERSION",
            parser=release_version,
            help="The release to go back to, as `souq releases` shows it (v3) or its number "
            "(3); default: the last good one before.",
        ),
    ] = None,
    strategy: StrategyOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Deploy an earlier release again (its image and config), as a new release."""
    from souq.apps.config import AppConfig
    from souq.client.deploy import Deployer
    from souq.errors import NotFound
    from souq.model.release import ReleaseState, Strategy

    with reporting(as_json):
        client = make_client()
        history = client.releases(app_name)
        if version is None:
            good = [r for r in history if r.state is ReleaseState.COMPLETE]
            if len(good) < 2:
                raise NotFound(
                    f"app {app_name} has no earlier good release to go back to",
                    hint=f"see `souq releases --app {app_name}`",
                )
            target = good[1]
        else:
            target = client.release(app_name, version)
        _deploy(
            client,
            app_name,
            lambda tell: Deployer(
                client,
                AppConfig.model_validate(target.config),
                image=target.image,
                strategy=strategy or Strategy(target.strategy),
                on_event=tell,
                description=f"rollback to v{target.version}",
            ),
            as_json=as_json,
        )


@scale_app.command("count")
def scale_count(
    *,
    count: Annotated[int, typer.Argument(min=0, max=1000, help="Machines per region.")],
    app_name: AppNameOpt,
    region: Annotated[
        str | None, typer.Option("--region", "-r", help="Only this region (default: every one).")
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Run COUNT machines of each process group (in REGION, or in each region of the app), from
    the app's current release: a new release that says so, whose only changes are machines
    created or destroyed in those regions (those that stay are not touched)."""
    with reporting(as_json):
        client = make_client()
        live, config = _live_release(client, app_name)
        regions = dict(config.regions) or {config.primary_region: 1}
        if region is None:
            regions = dict.fromkeys(regions, count)
        else:
            regions[region] = count
        scaled = config.model_copy(update={"regions": regions})
        why = f"scale to {count}" + (f" in {region}" if region else "")
        build = _scaling(client, live, scaled, [region] if region else list(regions), why)
        _deploy(client, app_name, build, as_json=as_json)


@scale_app.command("reconcile")
def scale_reconcile(
    *,
    app_name: AppNameOpt,
    watch: Annotated[
        bool,
        typer.Option(
            "--watch",
            help="Go on: reconcile again after each `preempted` event of the app's machines "
            "(the cluster's event stream), until interrupted.",
        ),
    ] = False,
    as_json: JsonOpt = False,
) -> None:
    """Bring the app back to its live release's counts in each of its regions: a machine of a
    group with services that preemption displaced is replaced by a new one elsewhere (then
    destroyed), a missing one created; the machines that run are not touched, and an app at
    its counts changes nothing."""
    from souq.client import render
    from souq.errors import SouqError

    with reporting(as_json):
        client = make_client()
        if not watch:
            _reconcile(client, app_name, as_json=as_json)
            return
        # Events after those seen now: one displaced while the first reconcile runs is seen.
        since = max((e.get("seq", 0) for e in client.cluster_events(app=app_name)), default=0)
        _reconcile(client, app_name, as_json=as_json)
        with contextlib.suppress(KeyboardInterrupt):  # interrupted: the watch ends, exit 0
            for event in client.cluster_events(app=app_name, follow=True, since=since):
                if not _displaced(event):
                    continue
                try:
                    _reconcile(client, app_name, as_json=as_json)
                except SouqError as exc:  # told, and the watch goes on
                    render.error(exc, as_json=as_json)


def _displaced(event: dict[str, Any]) -> bool:
    """Whether a cluster event calls for a reconcile: a machine of the app preempted, or
    events missed (a gap)."""
    if event.get("kind") == "gap":
        return True
    told = event.get("event") or {}
    return event.get("kind") == "machine" and told.get("type") == EventType.PREEMPTED


def _live_release(client: "SouqClient", app_name: str) -> tuple["Release", "AppConfig"]:
    """The app's live release (its newest complete one) and the app config it carries; not
    found when the app has none yet."""
    from souq.apps.config import AppConfig
    from souq.errors import NotFound
    from souq.model.release import ReleaseState

    live = next((r for r in client.releases(app_name) if r.state is ReleaseState.COMPLETE), None)
    if live is None:
        raise NotFound(f"app {app_name} has no live release", hint="`souq deploy` it first")
    return live, AppConfig.model_validate(live.config)


def _scaling(
    client: "SouqClient", live: "Release", config: "AppConfig", regions: list[str], why: str
) -> Callable[[Callable[["DeployEvent"], None]], "Deployer"]:
    """The deploy of a scale: a new release of the live one's image with ``config``, carried
    out at once and only in ``regions`` (the machines those need created or destroyed, the
    others not touched); ``why`` is its description."""
    from souq.client.deploy import Deployer
    from souq.model.release import Strategy

    return lambda tell: Deployer(
        client,
        config,
        image=live.image,
        strategy=Strategy.IMMEDIATE,
        on_event=tell,
        description=why,
        scale_regions=regions,
    )


def _reconcile(client: "SouqClient", app_name: str, *, as_json: bool) -> None:
    from souq.apps.plan import desired_counts

    live, config = _live_release(client, app_name)
    regions = sorted({r for g in config.groups() for r in desired_counts(config, g)})
    why = "reconcile: machines preempted or missing replaced"
    _deploy(client, app_name, _scaling(client, live, config, regions, why), as_json=as_json)


NameArg = Annotated[str, typer.Argument(metavar="NAME", help="The app's name.")]
OrgOpt = Annotated[
    str, typer.Option("--org", help="The organization slug kept with it (default: personal).")
]


@apps_group.command("create")
def apps_create(
    name: NameArg,
    *,
    org: OrgOpt = "",
    network: Annotated[str, typer.Option("--network", help="Kept with the app.")] = "",
    as_json: JsonOpt = False,
) -> None:
    """Create an app (exit 1, `name_taken`, when the name is in use)."""
    from souq.client import render_apps

    with reporting(as_json):
        render_apps.app(
            make_client().create_app(name, org_slug=org, network=network), as_json=as_json
        )


@apps_group.command("show")
def apps_show(name: NameArg, *, as_json: JsonOpt = False) -> None:
    """The app: its status, organization and machines."""
    from souq.client import render_apps

    with reporting(as_json):
        render_apps.app(make_client().get_app(name), as_json=as_json)


@apps_group.command("list")
def apps_list(*, org: OrgOpt = "", as_json: JsonOpt = False) -> None:
    """Every app: created ones, and those that have machines."""
    from souq.client import render_apps

    with reporting(as_json):
        render_apps.apps(make_client().list_apps(org_slug=org), as_json=as_json)


@apps_group.command("destroy")
def apps_destroy(
    name: NameArg,
    *,
    yes: Annotated[
        bool, typer.Option("--yes", "-y", help="Do not ask: destroy it and its machines.")
    ] = False,
    as_json: JsonOpt = False,
) -> None:
    """Destroy the app and every machine of it (killed if it runs). Its releases and secrets
    stay under its name."""
    from souq.client import render_apps

    with reporting(as_json):
        if not yes and not typer.confirm(f"Destroy app {name} and all its machines?"):
            raise typer.Exit(1)
        render_apps.app_deleted(make_client().destroy_app(name), as_json=as_json)
