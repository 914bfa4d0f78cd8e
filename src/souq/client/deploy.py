"""``souq deploy``: a release carried out through the API, phase by phase, and rolled back
everywhere when a phase fails.

0. Every region the config places machines in must be one of the cluster's
   (:func:`check_regions`): an unknown one fails before anything is made.
1. A release is made (``pending``; the next version, kept in JetStream by the brokers).
2. At once: every machine of the app is leased (a second deploy at the same time fails here,
   naming the machine and who holds it, before anything changed), and all the room the plan
   needs is held with quotes (:mod:`souq.client.deploy_capacity`: each new machine's, a served
   group's machines in a region on distinct workers; each update's growth on its machine's
   worker, or, where it does not fit, a replacement's elsewhere): a deploy that starts does
   not fail halfway for want of room (``--dry-run`` shows the plan and where each new machine
   would go, then lets go).
3. The plan's phases (:mod:`souq.apps.plan`) run in order; a phase's steps run at once: an
   update in place (the machine keeps its worker), a create, or a destroy (stopped gracefully
   first: it leaves the proxy's rotation, then its signal). A machine counts as done when it is
   started and every health check passes within ``wait_timeout``. A machine found stopped or
   suspended is started by its update (the release proves itself on it) and stopped again at
   the end, whether the deploy succeeded or was rolled back.
4. A failure anywhere (a refused update, a machine that does not become healthy) stops the
   deploy: every machine it updated gets its config back, every machine it made is destroyed,
   the release is ``failed`` with the reason, and :class:`~souq.errors.DeployFailed` names the
   phase, the region, the machine and what failed. Otherwise the release is ``complete``.

Each step is told as a :class:`DeployEvent` (``souq deploy --json`` prints one per line).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import Any

from souq.apps.config import DEFAULT_GROUP, AppConfig
from souq.apps.plan import Current, Phase, Step, desired_counts, plan, scale, standbys_wanted
from souq.client.api import SouqClient
from souq.client.deploy_capacity import GOING, WORKERS, Capacity, attempt, current_of
from souq.errors import (
    DeployFailed,
    DeployNoCapacity,
    InsufficientCapacity,
    LeaseHeld,
    SouqError,
    UnknownRegion,
)
from souq.model.machine import Machine, MachineState, preempted_event
from souq.model.protocol import Lease, Quote
from souq.model.release import NewRelease, Release, ReleaseState, Strategy

__all__ = ["DeployEvent", "Deployer", "check_regions", "current_machines"]

STOP_WAIT_S = 60.0  # a destroyed machine's graceful stop may take this (then it is killed)
_RESTING = (MachineState.STOPPED, MachineState.SUSPENDED)  # found so: stopped again at the end
STOP_MARGIN_S = 10.0  # a displaced machine stopped by its worker: its kill timeout and this


@dataclass(frozen=True)
class DeployEvent:
    kind: str  # release, lease, phase, step, healthy, rollback, done, failed
    message: str
    phase: str | None = None
    region: str | None = None
    machine_id: str | None = None
    version: int | None = None

    def as_dict(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if v is not None}


def current_machines(machines: list[Machine]) -> list[Current]:
    """The app's machines as a plan reads them (those destroyed, or on their way, left out;
    one displaced by preemption since its last start says so)."""
    return [
        Current(
            id=m.id,
            group=m.config.metadata.get("souq_process_group", DEFAULT_GROUP),
            region=m.region,
            state=str(m.state),
            release=int(m.config.metadata.get("souq_release", "0") or 0) or None,
            standby_for=tuple(m.config.standbys),
            preempted=preemption(m),
        )
        for m in machines
        if m.state not in GOING
    ]


def preemption(machine: Machine) -> str:
    """The message of the ``preempted`` event of ``machine`` if it is newer than its last
    start ("": it was not displaced, or it started again since)."""
    event = preempted_event(machine)
    return "" if event is None else event.message or "preempted"


def check_regions(client: SouqClient, config: AppConfig) -> None:
    """Every region ``config`` places machines in is one of the cluster's, or
    :class:`UnknownRegion` names it and the known ones (before a deploy makes anything)."""
    named = {r for g in config.groups() for r in desired_counts(config, g)}
    known = set(client.region_names())
    unknown = sorted(named - known)
    if not unknown:
        return
    where = "[regions] names" if config.regions else "primary_region is"
    raise UnknownRegion(
        f"{where} {', '.join(map(repr, unknown))}, which no worker of the cluster is in; "
        f"known regions: {', '.join(sorted(known)) or 'none yet'}; nothing was changed",
        hint="name a known region in souq.toml, or start a worker there "
        "(`souq agent --region REGION`)",
        details={"regions": unknown, "known": sorted(known)},
    )


@dataclass
class _Undo:
    updated: dict[str, dict[str, Any]] = field(default_factory=dict)  # machine -> old config
    created: list[tuple[str, str]] = field(default_factory=list)  # (machine id, region)
    lock: threading.Lock = field(default_factory=threading.Lock)


class Deployer:
    def __init__(
        self,
        client: SouqClient,
        config: AppConfig,
        *,
        image: str,
        strategy: Strategy | None = None,
        on_event: Callable[[DeployEvent], None] = lambda _: None,
        description: str = "",
        scale_regions: Iterable[str] | None = None,
    ) -> None:
        """``scale_regions``: a scale (:func:`souq.apps.plan.scale`), not a deploy: only these
        regions change, by creating and destroying machines to ``config``'s counts."""
        self.client = client
        self.config = config
        self.app = config.app
        self.image = image
        self.strategy = strategy or config.deploy.strategy
        self._tell = on_event
        self._description = description
        self._scale = None if scale_regions is None else list(scale_regions)
        self._leases: dict[str, Lease] = {}
        self._undo = _Undo()
        self._version = 0
        self._capacity = Capacity(
            client,
            config,
            image=image,
            strategy=self.strategy,
            tell=lambda kind, message, region: self._event(kind, message, region=region),
        )
        self._replaced: list[tuple[str, str]] = []  # (machine, region) a new machine replaced
        self._found: dict[str, Machine] = {}  # the app's machines as the run found them, by id
        self._resting: set[str] = set()  # machines found stopped or suspended
        self._woken: set[str] = set()  # of those, the ones an update of this deploy started
        self._displaced: set[str] = set()  # machines found displaced by preemption

    def run(self) -> Release:
        """Carry the release out; :class:`DeployFailed` (after the rollback) when it fails."""
        check_regions(self.client, self.config)
        self._found = machines = {
            m.id: m
            for m in self.client.list_machines(self.app)
            if m.state not in GOING  # a machine on its way out is not the deploy's to change
        }
        phases = self._plan(list(machines.values()))
        if self._scale is not None and not phases:
            return self._unchanged()
        release = self.client.create_release(
            self.app,
            NewRelease(
                image=self.image,
                config=self.config.model_dump(mode="json"),
                strategy=self.strategy,
                description=self._description,
            ),
        )
        self._version = release.version
        self._event(
            "release", f"release v{release.version} of {self.app}: {self.image}{self._why()}"
        )
        self._resting = {m.id for m in machines.values() if m.state in _RESTING}
        self._displaced = {m.id for m in machines.values() if preemption(m)}
        try:
            self._prepare(release.version, phases, list(machines.values()))
            for index, phase in enumerate(phases):
                self._phase(index, phase)
            if self._replaced:  # the machines others replaced go once the release is live
                steps = tuple(Step("destroy", "", r, m) for m, r in self._replaced)
                self._phase(len(phases), Phase("replaced", steps, wait_healthy=False))
            self._rest_again()
            self._standbys()
        except DeployFailed as failed:
            self._rollback()
            self._rest_again()
            self._capacity.release()
            self._release_leases()
            self.client.update_release(
                self.app, release.version, ReleaseState.FAILED, failed.message
            )
            self._event("failed", failed.message)
            raise
        self._capacity.release()
        self._release_leases()
        done = self.client.update_release(self.app, release.version, ReleaseState.COMPLETE)
        self._event("done", f"release v{release.version} is live everywhere{self._why()}")
        return done

    def _plan(self, machines: list[Machine]) -> list[Phase]:
        current = current_machines(machines)
        if self._scale is not None:
            return scale(self.config, current, self._scale)
        return plan(self.config, current, self.strategy)

    def _unchanged(self) -> Release:
        """A scale to the counts the app has: no release, no machine touched."""
        releases = self.client.releases(self.app)  # newest first
        live = next((r for r in releases if r.state is ReleaseState.COMPLETE), releases[0])
        self._event("done", f"{self.app} already runs that many machines: nothing changed")
        return live

    def _why(self) -> str:
        return f" ({self._description})" if self._description else ""

    def _prepare(self, version: int, phases: list[Phase], machines: list[Machine]) -> None:
        """Lease the machines, hold the room the plan needs and mark the release
        ``deploying``, the three at once (none needs another); the first failure is raised
        once all three are back, and the handler lets go of what the others took."""
        with ThreadPoolExecutor(max_workers=3) as pool:
            futures: list[Future[Any]] = [
                pool.submit(self._lease, [m.id for m in machines]),
                pool.submit(self._capacity.reserve, version, phases, machines),
                pool.submit(self.client.update_release, self.app, version, ReleaseState.DEPLOYING),
            ]
            errors = [f.exception() for f in futures]
        for error in errors:  # the lease's first: another deploy under way explains the rest
            if error is not None:
                raise error

    # -- leases ----------------------------------------------------------------------------

    def _lease(self, machine_ids: list[str]) -> None:
        """Lease every machine (at once); if one is held, end the leases taken and fail."""
        ttl = min(self.config.deploy.wait_timeout * 2 + STOP_WAIT_S + 60, 3600)
        why = f"deploy of {self.app} v{self._version}"

        def take(machine_id: str) -> Lease:
            return self.client.take_lease(self.app, machine_id, ttl_s=ttl, description=why)

        with ThreadPoolExecutor(max_workers=WORKERS) as pool:
            taken = dict(zip(machine_ids, pool.map(attempt(take), machine_ids), strict=True))
        self._leases = {m: lease for m, lease in taken.items() if isinstance(lease, Lease)}
        for machine_id, outcome in taken.items():
            if isinstance(outcome, SouqError):
                self._release_leases()
                if isinstance(outcome, LeaseHeld):
                    raise DeployFailed(
                        f"another deploy is under way: {outcome.message}",
                        hint="wait for it to finish, then deploy again",
                        details={"phase": "lease", "machine_id": machine_id},
                    ) from outcome
                raise outcome
        if machine_ids:
            self._event("lease", f"{len(machine_ids)} machines leased ({why})")

    def _release_leases(self) -> None:
        def end(item: tuple[str, Lease]) -> None:
            with contextlib.suppress(SouqError):  # destroyed meanwhile, or expired
                self.client.release_lease(self.app, item[0], item[1].nonce)

        leases, self._leases = list(self._leases.items()), {}
        with ThreadPoolExecutor(max_workers=WORKERS) as pool:
            list(pool.map(end, leases))

    def _nonce(self, machine_id: str) -> str | None:
        lease = self._leases.get(machine_id)
        return lease.nonce if lease else None

    # -- capacity ----------------------------------------------------------------------------

    def dry_run(self) -> list[tuple[Phase, list[tuple[Step, Quote | None]]]]:
        """The plan, each new machine's capacity held for a moment to show where it would go
        (then let go); nothing else is done."""
        check_regions(self.client, self.config)
        machines = [m for m in self.client.list_machines(self.app) if m.state not in GOING]
        phases = self._plan(machines)
        try:
            self._capacity.reserve(self._version, phases, machines)
            return [
                (
                    phase,
                    [
                        (
                            step,
                            self._capacity.quotes.get((i, j))
                            or self._capacity.replacing.get((i, j)),
                        )
                        for j, step in enumerate(phase.steps)
                    ],
                )
                for i, phase in enumerate(phases)
            ]
        finally:
            self._capacity.release()

    # -- phases ----------------------------------------------------------------------------

    def _phase(self, index: int, phase: Phase) -> None:
        self._event("phase", f"{phase.name}: {phase.describe()}", phase=phase)
        with ThreadPoolExecutor(max_workers=min(WORKERS, len(phase.steps) or 1)) as pool:
            futures = [
                pool.submit(self._step, phase, step, (index, j))
                for j, step in enumerate(phase.steps)
            ]
            errors = [f.exception() for f in futures]
        failed = [e for e in errors if e is not None]
        if failed:
            first = failed[0]
            if isinstance(first, DeployFailed):
                raise first
            raise DeployFailed(f"phase {phase.name}: {first}", details={"phase": phase.name})

    def _step(self, phase: Phase, step: Step, key: tuple[int, int]) -> None:
        capacity = self._capacity
        with self._undo.lock:  # the step's room, held before the deploy began
            quote = capacity.quotes.pop(key, None)
            growth = capacity.growth.pop(key, None)
            replacing = capacity.replacing.pop(key, None)
        where = {"phase": phase.name, "region": step.region, "machine_id": step.machine_id}
        try:
            if step.action == "destroy":
                assert step.machine_id is not None
                if step.machine_id in self._displaced:
                    self._stopped(self._found[step.machine_id])
                self._destroy(step.machine_id, phase, step.region, why=step.why)
                return
            config = self.config.machine_config(step.group, image=self.image, release=self._version)
            if step.action == "update":
                assert step.machine_id is not None
                if step.standby_for:
                    config["standbys"] = list(step.standby_for)
                machine, verb = self._in_place(step, config, growth, replacing)
                where["machine_id"] = machine.id
                if step.standby_for:
                    verb += " (standby)"
            else:
                machine = self.client.create_machine(
                    self.app, step.region, config, quote=quote.id if quote else None
                )
                with self._undo.lock:
                    self._undo.created.append((machine.id, step.region))
                where["machine_id"] = machine.id
                verb = "canary created" if step.canary else "created"
                if step.why:
                    verb += f" ({step.why})"
            self._event("step", f"machine {machine.id} {verb}", phase, step.region, machine.id)
            if phase.wait_healthy:
                self._healthy(machine, phase, step.region)
            if step.canary:
                self._destroy(machine.id, phase, step.region)
                with self._undo.lock:
                    self._undo.created.remove((machine.id, step.region))
        except DeployFailed:
            raise
        except SouqError as exc:
            room = isinstance(exc, InsufficientCapacity)
            raise self._failure(exc.message, where, room=room) from exc

    def _in_place(
        self, step: Step, config: dict[str, Any], growth: Quote | None, replacing: Quote | None
    ) -> tuple[Machine, str]:
        """``step``'s machine updated in place (on the growth its worker held for it), or,
        where its worker had no room for the new size, a new machine elsewhere (on the room
        held for it) in its place: the old one goes once the whole release is live."""
        assert step.machine_id is not None
        if replacing is None:
            if growth is not None:
                self._capacity.let_go(growth)  # the room it held is the update's now
            # (Taken by another in the instant between: replaced as below.)
            with contextlib.suppress(InsufficientCapacity):
                return self._update(step, config), "updated"
        machine = self._replacement(step, config, replacing)
        return machine, "replaces " + step.machine_id

    def _update(self, step: Step, config: dict[str, Any]) -> Machine:
        assert step.machine_id is not None
        before = self._found[step.machine_id].config.model_dump(mode="json")
        with self._undo.lock:
            self._undo.updated[step.machine_id] = before
        try:
            updated = self.client.update(
                self.app,
                step.machine_id,
                config,
                skip_launch=bool(step.standby_for),  # a standby stays stopped
                nonce=self._nonce(step.machine_id),
            )
            if step.machine_id in self._resting and not step.standby_for:
                with self._undo.lock:
                    self._woken.add(step.machine_id)
            return updated
        except InsufficientCapacity:
            with self._undo.lock:
                del self._undo.updated[step.machine_id]  # refused: nothing changed
            raise

    def _replacement(self, step: Step, config: dict[str, Any], quote: Quote | None) -> Machine:
        """A new machine in the place of ``step``'s, whose worker has no room for the new size:
        on ``quote``'s room (held away from the workers of its group's other machines in the
        region, as a new one's), or, without one, placed so now."""
        assert step.machine_id is not None
        skip = bool(step.standby_for)
        if quote is not None:
            machine = self.client.create_machine(
                self.app, step.region, config, skip_launch=skip, quote=quote.id
            )
            with self._undo.lock:
                self._undo.created.append((machine.id, step.region))
                self._replaced.append((step.machine_id, step.region))
            return machine
        siblings = {
            m.worker_id
            for m in current_of(list(self._found.values()), step.group, step.region)
            if m.id != step.machine_id
        }

        def create(body: dict[str, Any]) -> Machine:
            return self.client.create_machine(self.app, step.region, body, skip_launch=skip)

        machine = self._capacity.away(
            create, config, siblings if self.config.served(step.group) else set(), step
        )
        with self._undo.lock:
            self._undo.created.append((machine.id, step.region))
            self._replaced.append((step.machine_id, step.region))
        return machine

    def _rest_again(self) -> None:
        """The machines found stopped (or suspended) that an update started (to prove the
        release healthy, or to take their config back) are stopped again: a deploy leaves each
        machine running or at rest as it found it (the proxy wakes them for requests)."""

        def stop(machine_id: str) -> None:
            try:
                self.client.stop(self.app, machine_id, nonce=self._nonce(machine_id))
            except SouqError as exc:  # stopped meanwhile (the proxy's autostop), or gone
                self._event("step", f"machine {machine_id} not stopped again: {exc.message}")
                return
            self._event(
                "step",
                f"machine {machine_id} stopped again, as the deploy found it",
                machine_id=machine_id,
            )

        woken, self._woken = sorted(self._woken), set()
        with ThreadPoolExecutor(max_workers=WORKERS) as pool:
            list(pool.map(stop, woken))

    def _standbys(self) -> None:
        """A standby on another worker for each machine of a group without services that has
        none (stopped; the proxy starts it if the machine's worker is lost). A region with no
        other worker gets none, and says so."""
        now = current_machines(self.client.list_machines(self.app))
        wanted = standbys_wanted(self.config, now)
        if self._scale is not None:  # a scale changes its regions only
            wanted = [m for m in wanted if m.region in self._scale]
        for primary in wanted:
            config = self.config.machine_config(
                primary.group, image=self.image, release=self._version
            )
            config["standbys"] = [primary.id]
            try:
                machine = self.client.create_machine(self.app, primary.region, config)
            except InsufficientCapacity:
                self._event(
                    "standby",
                    f"machine {primary.id} has no standby: no other worker in {primary.region} "
                    "has room",
                    region=primary.region,
                    machine_id=primary.id,
                )
                continue
            except SouqError as exc:
                raise self._failure(
                    exc.message,
                    {"phase": "standbys", "region": primary.region, "machine_id": primary.id},
                ) from exc
            with self._undo.lock:
                self._undo.created.append((machine.id, primary.region))
            self._event(
                "standby",
                f"machine {machine.id} stands by for {primary.id} (stopped, another worker)",
                region=primary.region,
                machine_id=machine.id,
            )

    def _healthy(self, machine: Machine, phase: Phase, region: str) -> None:
        timeout = self.config.deploy.wait_timeout
        try:
            self.client.wait(
                self.app, machine.id, MachineState.STARTED, timeout=timeout, healthy=True
            )
        except SouqError as exc:
            raise self._failure(
                exc.message, {"phase": phase.name, "region": region, "machine_id": machine.id}
            ) from exc
        self._event("healthy", f"machine {machine.id} is healthy", phase, region, machine.id)

    def _stopped(self, machine: Machine) -> None:
        """A displaced machine may still be stopping (its signal, its kill timeout): wait for
        its worker to have stopped it, so that it can be destroyed."""
        limit = machine.config.stop_config.timeout_s + STOP_MARGIN_S
        self.client.wait(
            self.app, machine.id, [MachineState.STOPPED, MachineState.FAILED], timeout=limit
        )

    def _destroy(self, machine_id: str, phase: Phase | None, region: str, *, why: str = "") -> None:
        """A graceful destroy: the machine leaves rotation now; its worker stops it (its
        drain, its signal) and destroys it after."""
        nonce = self._nonce(machine_id)
        self.client.destroy(self.app, machine_id, graceful=True, nonce=nonce)
        self._leases.pop(machine_id, None)
        said = f" ({why})" if why else ""
        self._event("step", f"machine {machine_id} destroyed{said}", phase, region, machine_id)

    def _failure(
        self, message: str, where: dict[str, str | None], *, room: bool = False
    ) -> DeployFailed:
        """The deploy's error (:class:`DeployNoCapacity` when ``room`` was what failed)."""
        place = ", ".join(f"{k.replace('_id', '')} {v}" for k, v in where.items() if v)
        return (DeployNoCapacity if room else DeployFailed)(
            f"release v{self._version} failed ({place}): {message}; rolled back",
            hint="see `souq status` and the machine's events and logs",
            details={k: v for k, v in where.items() if v},
        )

    # -- rollback --------------------------------------------------------------------------

    def _rollback(self) -> None:
        """Every machine this deploy updated gets its old config back; every one it made goes."""
        for machine_id, region in list(self._undo.created):
            try:
                self.client.destroy(self.app, machine_id, force=True)
                self._event("rollback", f"machine {machine_id} destroyed", None, region, machine_id)
            except SouqError as exc:
                self._event("rollback", f"machine {machine_id} not destroyed: {exc.message}")
        for machine_id, before in self._undo.updated.items():
            try:
                self.client.update(
                    self.app,
                    machine_id,
                    before,
                    skip_launch=machine_id in self._resting,  # found at rest: kept so
                    nonce=self._nonce(machine_id),
                )
                self._event("rollback", f"machine {machine_id} has its config back")
            except SouqError as exc:
                self._event("rollback", f"machine {machine_id} not restored: {exc.message}")

    def _event(
        self,
        kind: str,
        message: str,
        phase: Phase | None = None,
        region: str | None = None,
        machine_id: str | None = None,
    ) -> None:
        self._tell(
            DeployEvent(
                kind=kind,
                message=message,
                phase=phase.name if phase else None,
                region=region,
                machine_id=machine_id,
                version=self._version or None,
            )
        )
