"""Running an agent: :class:`Agent` wires the pieces, :func:`serve` embeds one in an event loop,
:func:`run` is the blocking entry point behind ``souq agent``.

Start-up order: open the store (which locks the data dir), fingerprint the host, re-adopt running
machines and resume unfinished operations, connect to NATS, subscribe, announce a heartbeat,
start pulling batch jobs (:mod:`souq.agent.jobs.runner`; what an earlier agent's job runs left is
killed first). Shutdown order: stop taking requests, stop the batch jobs and give them back to
the queue, stop the machines (only with ``stop_machines_on_exit``; otherwise they keep running
for the next agent to re-adopt), publish the last events, close the store and the connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import sys
import time
from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any

from nats.aio.client import Client

from souq import daemon
from souq.agent import network
from souq.agent.capacity.admission import Admission
from souq.agent.capacity.load import LoadGauge
from souq.agent.capacity.ports import PortPool
from souq.agent.config import AgentConfig
from souq.agent.fingerprint import fingerprint
from souq.agent.jobs.process import JobProcesses, Runs
from souq.agent.jobs.runner import JobRunner
from souq.agent.machines.commands import Commands
from souq.agent.machines.executor import Executor
from souq.agent.machines.faults import fault_point
from souq.agent.machines.images import AgentImages
from souq.agent.machines.schedule import Scheduler
from souq.agent.machines.secrets import AgentSecrets
from souq.agent.machines.spot_prices import SpotWatch
from souq.agent.outbox import Outbox
from souq.agent.publisher import Pacer
from souq.agent.reaper import Reaper, make_subreaper
from souq.agent.service import AgentService
from souq.agent.state.store import Store
from souq.agent.volumes.disks import VolumeDisks
from souq.agent.volumes.worker_volumes import AgentVolumes
from souq.auth.bus import NatsCredential, agent_credential
from souq.auth.files import AuthDir
from souq.bus.transport import Transport
from souq.clock import Clock
from souq.drivers.base import Driver
from souq.drivers.exec import RECORDS
from souq.drivers.host import HostDriver
from souq.drivers.identity import own_uids
from souq.drivers.logfile import LogRotator
from souq.drivers.users import check_reachable, machine_user, shut_in
from souq.errors import InvalidInput, SouqError
from souq.limits import LOG_CHECK_INTERVAL_S
from souq.loop_clock import daemon_clock
from souq.model.base import copy_fields
from souq.model.resources import Resources
from souq.model.worker import WorkerInfo
from souq.network import links
from souq.network.addresses import DNS_ADDRESS, edge_host
from souq.network.link_probes import LinkProber
from souq.network.overlay import Overlay
from souq.network.wireguard import WireGuard

if TYPE_CHECKING:
    from souq.agent.metrics import MetricsServer
    from souq.network.name_service import NameService

__all__ = ["Agent", "run", "serve"]

log = logging.getLogger(__name__)
SLOW_EXIT_S = 5.0  # an exit's machine stops that take longer are explained in the log


class Agent:
    """One worker agent. ``await start()``, then ``await aclose()``.

    Pass a ``transport`` to run on a bus you own (e.g. :class:`souq.bus.MemoryTransport`);
    otherwise the agent connects to ``config.nats_url`` and closes the connection itself.
    """

    def __init__(
        self,
        config: AgentConfig,
        *,
        transport: Transport | None = None,
        clock: Clock | None = None,
        store: Store | None = None,
        driver: Driver | None = None,
        load: LoadGauge | None = None,
        pacer: Pacer | None = None,
        hollow_jobs: tuple[Client, Runs] | None = None,
    ) -> None:
        """``store``, ``driver``, ``load``, ``pacer``: the hollow fleet's (in-memory state, no
        processes, one load gauge and one publishing schedule for every worker of the host);
        by default the agent's own. ``hollow_jobs``: the fleet's connection and hollow runs, for
        batch jobs that start no process."""
        self.config = config
        self._hollow_jobs = hollow_jobs
        self._given_store = store  # e.g. the hollow fleet's in-memory store
        self._given_driver = driver  # e.g. the hollow fleet's no-op driver
        self._load = load
        self._pacer = pacer
        self._transport = transport
        self._own_transport = transport is None
        self._clock = clock or daemon_clock()  # real time (a test's: set ahead, souq.loop_clock)
        self._store: Store | None = None
        self._executor: Executor | None = None
        self._commands: Commands | None = None
        self._service: AgentService | None = None
        self.jobs: JobRunner | None = None  # batch jobs (--jobs: not the hollow fleet's)
        self.metrics: MetricsServer | None = None  # --metrics-port
        self.names: NameService | None = None  # --dns: the .internal names
        self.overlay: Overlay | WireGuard | None = None  # the routes to other workers' machines
        self.link_prober: LinkProber | None = None  # probes of the paths over an IPv4 link
        self._probing: asyncio.Task[None] | None = None
        self.log_rotator = LogRotator(
            config.data_dir / "machines" / RECORDS,  # each machine's log: the agent's files
            max_bytes=config.log_max_bytes,
            interval_s=LOG_CHECK_INTERVAL_S,
        )
        self._rotating: asyncio.Task[None] | None = None
        self._scheduler: Scheduler | None = None
        self.spot: SpotWatch | None = None  # spot machines outbid by the region's price
        self._host_driver = (
            None
            if driver is not None
            else HostDriver(
                config.data_dir / "machines",
                cgroups=config.cgroups,
                pids_max=config.pids_max,
                user=machine_user(config.machine_user, allow_root=config.allow_root_machines),
                ids=own_uids(config.machine_user),
                default=config.default_driver,
                log_max_bytes=config.log_max_bytes,
            )
        )
        host = self._host_driver
        if host is not None and host.user.switch:
            host_root = config.data_dir / "machines"
            host_root.mkdir(parents=True, exist_ok=True)
            shut_in(config.data_dir)
            try:  # a machine still starts in its directory: said, not refused
                check_reachable(host.user, host_root)
            except InvalidInput as unreachable:
                log.warning("%s: %s", unreachable.message, unreachable.hint)
        if host is not None and host.user.is_root:
            log.warning("machines run as root (--allow-root-machines): they own this host")
        self.network_why_not = network.why_not(config.private_network, self._host_driver)
        isolation = host.isolation if host else None
        if isolation is not None and config.private_network != "off":
            isolation["private_network"] = self.network_why_not is None
            if self.network_why_not is not None:
                isolation["private_network_why_not"] = self.network_why_not
        self.fingerprint = fingerprint(
            config,
            drivers=host.drivers if host else None,
            isolation=isolation,
            machine_user=host.describe_user() if host else "",
        )
        self.capacity = copy_fields(Resources, self.fingerprint)
        self.worker_id = ""
        # App secrets (not the hollow fleet's: it runs nothing).
        self._secrets = None if driver is not None else AgentSecrets(config.auth_dir)

    def _worker_network(self) -> links.WorkerNetwork | None:
        """The worker's private network (souq.network.links), where its machines have one."""
        if self.network_why_not is not None:
            if self.config.private_network != "off":
                log.warning("machines here get no private network: %s", self.network_why_not)
            return None
        return links.WorkerNetwork(
            self.worker_id,
            self.config.data_dir / "network",
            flycast_port=self.config.flycast_port,
            names_port=self.config.names_port,
            edge_host=edge_host(self.config.advertise),
        )

    def _volumes(self, store: Store, admission: Admission) -> AgentVolumes | None:
        """This worker's volumes (a hollow worker keeps none)."""
        if self._given_driver is not None:
            return None
        return AgentVolumes(
            store,
            self.config.data_dir / "volumes",
            admission,
            self._clock,
            worker_id=self.worker_id,
            disks=VolumeDisks(self.config.data_dir / "volumes"),
        )

    def _start_network(self, executor: Executor) -> None:
        """The worker's private network started, and the routes to other workers where it has
        an underlay address (the fingerprint then says it, for the others to route here)."""
        if executor.network is None or executor.addresses is None:
            return
        executor.network.start(executor.addresses.held())
        self.overlay = network.start_overlay(self.config, self.worker_id, executor.network)
        if self.overlay is not None:
            key = self.overlay.public_key if isinstance(self.overlay, WireGuard) else ""
            link = "" if isinstance(self.overlay, WireGuard) else self.overlay.link_local
            self.fingerprint = self.fingerprint.model_copy(
                update={"underlay": self.overlay.underlay, "underlay_key": key,
                        "underlay_link": link}
            )  # fmt: skip
        if isinstance(self.overlay, Overlay) and self.overlay.probing:
            self.link_prober = LinkProber(self.overlay)
            self._probing = asyncio.create_task(self.link_prober.run(), name="souq-link-probes")

    def _heard_worker(self, info: WorkerInfo) -> None:
        """A worker's record from its heartbeat: the route to its machines as it says."""
        if self.overlay is not None and info.id != self.worker_id:
            fp = info.fingerprint
            if fp is None:
                self.overlay.heard(info.id, "")
            else:
                self.overlay.heard(info.id, fp.underlay, fp.underlay_key, fp.underlay_link)
            if self.link_prober is not None:  # its path probed again (Overlay.heard)
                self.link_prober.wake()

    def _images(self) -> AgentImages | None:
        """The image cache (not the hollow fleet's: it runs nothing)."""
        if self._given_driver is not None:
            return None
        return AgentImages(self.config.data_dir / "images", limit_mb=self.config.image_cache_mb)

    def _require_host_driver(self) -> HostDriver:
        assert self._host_driver is not None
        return self._host_driver

    @property
    def executor(self) -> Executor:
        assert self._executor is not None, "the agent is not started"
        return self._executor

    @property
    def commands(self) -> Commands:
        assert self._commands is not None, "the agent is not started"
        return self._commands

    @property
    def store(self) -> Store:
        assert self._store is not None, "the agent is not started"
        return self._store

    async def start(self) -> None:
        config = self.config
        self._store = self._given_store or Store(config.data_dir)
        try:
            credential = self._credential(self._store)
            self.worker_id = self._store.worker_id(credential.worker_id if credential else None)
            outbox = Outbox()  # events wait here while the bus is down
            cordoned, draining = self._store.flags()
            admission = Admission(
                worker_id=self.worker_id,
                region=config.region,
                capacity=self.capacity,
                reserved=self._store.allocated(),
                cordoned=cordoned,
                draining=draining,
            )
            self._executor = Executor(
                worker_id=self.worker_id,
                region=config.region,
                store=self._store,
                driver=self._given_driver or self._require_host_driver(),
                backoff=config.backoff,
                clock=self._clock,
                on_event=outbox.put,
                admission=admission,
                ports=PortPool(*config.ports),
                advertise=config.advertise,
                network=self._worker_network(),
                images=self._images(),
                secrets=self._secrets,
                volumes=self._volumes(self._store, admission),
                fault=fault_point(config.data_dir),
            )
            # Before any machine is re-adopted: their rules, then the routes to other workers.
            self._start_network(self._executor)
            if self._host_driver is not None:  # machine output logs: bounded, rotated
                self.log_rotator.recover_all()  # a rotation of the agent's, interrupted
                if not self._host_driver.exec.bounds_logs:  # each souq-waiter bounds its own
                    self._rotating = asyncio.create_task(self.log_rotator.run(), name="souq-logs")
            self._commands = Commands(self._executor, self._clock)
            self._executor.recover()
            self._scheduler = Scheduler(
                self._executor.rows, self._commands.start_scheduled, self._clock
            )
            self._scheduler.start()
            if self._executor.volumes is not None:
                self._executor.volumes.reconcile(self._executor.rows())
            if self._transport is None:
                from souq.bus.nats import connect

                self._transport = await connect(
                    config.nats_url, name=f"souq-agent-{self.worker_id}", credential=credential
                )
            client = getattr(self._transport, "client", None)  # NATS: JetStream holds images
            if self._executor.images is not None and client is not None:
                self._executor.images.attach(client)
            if client is not None:
                self._follow_buckets(self._executor, client)
            self._service = AgentService(
                self._executor,
                self._commands,
                self._transport,
                outbox,
                labels=config.labels,
                fingerprint=self.fingerprint,
                heartbeat_interval_s=config.heartbeat_interval_s,
                clock=self._clock,
                load=self._load,
                pacer=self._pacer,
            )
            await self._service.start()
            if config.jobs > 0 and self._hollow_jobs is not None:
                job_client, runs = self._hollow_jobs
                self.jobs = self._job_runner(runs, admission, self._service)
                self.jobs.start(job_client)
            elif client is not None and self._host_driver is not None and config.jobs > 0:
                host = self._host_driver
                runs = JobProcesses(
                    self.config.data_dir / "jobs", user=host.user, cgroups=host.cgroups
                )
                self.jobs = self._job_runner(runs, admission, self._service)
                self.jobs.start(client)
            if config.metrics_port:
                from souq.agent.metrics import AgentCollector, serve_metrics

                self.metrics = serve_metrics(
                    config.metrics_port,
                    AgentCollector(self.worker_id, self._executor.rows, self._service.stats),
                )
            self.names = await self._names()
        except BaseException:
            await self.aclose()
            raise
        log.info("agent %s ready in region %s", self.worker_id, config.region)

    async def _names(self) -> NameService | None:
        """The ``.internal`` names: on ``--dns``, or for this worker's private network."""
        if self.config.dns is not None:
            return await self._start_names(self.config.dns)
        if self._executor is not None and self._executor.network is not None:
            return await self._names_for_machines()
        return None

    async def _names_for_machines(self) -> NameService | None:
        """A private-network worker answers its machines' names at the address their
        ``resolv.conf`` names, ``[fdaa::3]`` at ``--names-port`` (53 unless the cluster has a
        port of its own there), unless ``--dns`` says elsewhere. Several agents of one host
        and cluster share that address: the first one up takes it and answers for all (from
        the whole cluster's view), the others leave it be without reading the view. An agent
        that holds neither its ``names-<W>`` credential (``souq cluster add-agent`` makes it)
        nor the ``view``'s (``souq dev``'s, whose own process answers the names) answers none."""
        from souq.network.name_service import names_role

        if names_role(self.config.auth_dir, self.worker_id) is None:
            log.info(
                "machines' names here are not answered by this agent: it holds no names "
                "credential (nats/names-%s.nk, from souq cluster add-agent; under souq dev, "
                "the host's name server answers them)",
                self.worker_id,
            )
            return None
        try:
            return await self._start_names((DNS_ADDRESS, self.config.names_port))
        except InvalidInput as exc:
            log.info("machines' names here are answered by another agent of this host: %s", exc)
        except (SouqError, OSError) as exc:
            log.warning("machines here get no .internal names: %s", exc)
        return None

    async def _start_names(self, listen: tuple[str, int]) -> NameService:
        """The worker's DNS server (--dns), in this process: its view of the cluster on a
        connection of its own, as this worker's ``names-<W>`` user or the bus's read-only
        ``view`` role (the agent's credential sees only its own worker), or on the transport
        the agent was given."""
        from souq.network.name_service import NameService, connect_view

        config = self.config
        if self._own_transport or self._transport is None:
            name = f"souq-names-{self.worker_id}"
            transport = await connect_view(
                config.nats_url, config.auth_dir, name=name, worker_id=self.worker_id
            )
        else:
            transport = self._transport
        names = NameService(
            transport,
            listen=listen,
            clock=self._clock,
            upstreams=config.dns_upstreams,
            owns_transport=transport is not self._transport,
            on_worker=self._heard_worker,
        )
        try:
            await names.start()
        except OSError as exc:
            await names.aclose()
            raise InvalidInput(
                f"--dns {listen[0]}:{listen[1]}: cannot listen there: {exc.strerror or exc}",
                hint="give an address this host has and a free port (port 53 needs root or "
                "CAP_NET_BIND_SERVICE)",
            ) from exc
        return names

    def _job_runner(self, runs: Runs, admission: Admission, service: AgentService) -> JobRunner:
        """The batch job runner; preemption may displace its runs
        (souq.agent.machines.evictions)."""
        transport = self._transport
        assert transport is not None
        runner = JobRunner(
            worker_id=self.worker_id,
            region=self.config.region,
            slots=self.config.jobs,
            lease_s=self.config.job_lease_s,
            processes=runs,
            admission=admission,
            clock=self._clock,
            announce=service.publisher.announce,
            publish=transport.publish,
        )
        if self._executor is not None:
            self._executor.job_runs = runner
        return runner

    def owned_pids(self) -> set[int]:
        """Pids of the children the agent reaps itself: its machines' (the driver's), its
        batch jobs' and the commands ``exec`` runs."""
        driver = self._executor.driver if self._executor is not None else self._host_driver
        owned = getattr(driver, "owned_pids", None)
        pids: set[int] = owned() if owned is not None else set()
        if self._service is not None:
            pids |= self._service.verbs.tools.running
        return pids | (self.jobs.owned_pids() if self.jobs is not None else set())

    def _follow_buckets(self, executor: Executor, client: Client) -> None:
        """What the agent reads from JetStream: app secrets, and its region's spot price (to preempt
        the spot machines it outbids: souq.agent.machines.spot_prices). Not the hollow fleet's."""
        if self._secrets is not None:
            self._secrets.attach(client)
        if self._given_driver is None:
            notice_s = self.config.spot_notice_s
            self.spot = SpotWatch(executor, self.config.region, self._clock, notice_s=notice_s)
            self.spot.attach(client)

    def _credential(self, store: Store) -> NatsCredential | None:
        """With an auth directory, the agent's own credential: the worker id it speaks as
        (adopted by a new data dir; a data dir of another worker is refused)."""
        auth = AuthDir.from_env(self.config.auth_dir)
        if auth is None or self._transport is not None:
            return None
        stored = store.meta("worker_id")
        return agent_credential(auth, stored=stored, asked=self.config.worker_id)

    async def _close_names(self) -> None:
        if self.names is not None:
            await self.names.aclose()
            self.names = None

    async def _close_side_tasks(self) -> None:
        """The machines' schedule, the key rotation, the link probes and the metrics server,
        stopped."""
        if self._scheduler is not None:
            await self._scheduler.aclose()
            self._scheduler = None
        for task in (self._rotating, self._probing):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        self._rotating = self._probing = self.link_prober = None
        if self.metrics is not None:
            self.metrics.close()
            self.metrics = None

    async def aclose(self) -> None:
        await self._close_names()
        await self._close_side_tasks()
        if self._service is not None:
            await self._service.stop_listening()
        if self.jobs is not None:
            await self.jobs.aclose()  # given back to the queue while the bus is still there
            self.jobs = None
        if self.spot is not None:
            await self.spot.aclose()
            self.spot = None
        if self._commands is not None and self.config.stop_machines_on_exit:
            await self._stop_machines(self._commands)
        if self._executor is not None:
            if self._executor.network is not None:
                network.leave(self._executor, self._executor.network)
            await self._executor.shutdown()
            self._executor = self._commands = None
        if self._service is not None:
            await self._service.aclose()
            self._service = None
        if self._secrets is not None:
            await self._secrets.aclose()
        if self._store is not None:
            self._store.close()
            self._store = None
        if self._transport is not None and self._own_transport:
            await self._transport.close()
            self._transport = None

    async def _stop_machines(self, commands: Commands) -> None:
        """Stop every machine, then take down what their mounts left in the host's table: the
        volumes' file systems and the machines' roots (a later start mounts them again). Says
        how long each part took when that was long (:data:`SLOW_EXIT_S`)."""
        began = time.monotonic()
        await commands.stop_all()
        stopped = time.monotonic()
        if self._executor is not None and self._executor.volumes is not None:
            self._executor.volumes.unmount_all()
        if self._host_driver is not None:
            self._host_driver.unmount_roots()
        took = (stopped - began, time.monotonic() - stopped)
        if sum(took) > SLOW_EXIT_S:
            log.warning(
                "leaving took long: machines stopped in %.2f s, their mounts taken down in %.2f s",
                *took,
            )

    def ready_line(self) -> str:
        return (
            f"souq agent {self.worker_id} ready in region {self.config.region} "
            f"({self.capacity.cpus:g} cpus, {self.capacity.memory_mb} MiB)"
        )


async def serve(
    config: AgentConfig,
    *,
    ready: asyncio.Event | None = None,
    stop: asyncio.Event | None = None,
    transport: Transport | None = None,
) -> None:
    """Run an agent until ``stop`` is set (forever without one). ``ready`` is set once it
    answers on the bus."""
    agent = Agent(config, transport=transport)
    await agent.start()
    try:
        if ready is not None:
            ready.set()
        await (stop or asyncio.Event()).wait()
    finally:
        await asyncio.shield(agent.aclose())


def run(config: AgentConfig) -> None:
    """Run an agent in the foreground until SIGINT or SIGTERM (blocking). Prints one line to
    stderr when ready: ``souq agent <worker id> ready in region <region> (<n> cpus, <m> MiB)``.
    Uses uvloop when it is installed."""
    daemon.run(_main(config))


def _main(config: AgentConfig) -> Coroutine[Any, Any, None]:
    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        # Orphans of machines become ours, not init's, and are reaped (souq.agent.reaper).
        if not make_subreaper():
            log.warning("cannot become a child subreaper: orphans of machines go to init")
        agent = Agent(config)
        await agent.start()
        reaper = Reaper(agent.owned_pids)
        reaper.install()
        print(agent.ready_line(), file=sys.stderr, flush=True)
        try:
            await stop.wait()
        finally:
            await agent.aclose()
            reaper.uninstall()

    return main()
