"""Isolation (``python -m bench isolation``): what a machine's isolation costs at its start,
against a plain process and against the bare runtimes, side by side in one run.

Every variant starts the same program, busybox's ``sleep MARKER`` (Debian's busybox-static),
as a host uid of the range Souq gives machines (:mod:`souq.drivers.identity`), and is timed
from the request until the program's ``execve`` completed, as the kernel reports it
(:mod:`bench.procevents`: the one stopwatch, which none of them can see):

* **souq exec** — a machine of driver ``exec`` claimed from a real agent (one ``claim`` over
  NATS, as a broker sends it; the agent is root and gives each machine a uid of its own);
* **souq sandbox** — the same through the ``sandbox`` driver, a machine of an image of busybox
  as its whole root (cached on the worker): the agent mounts its root (an idmapped read-only
  mount of the image's files under a writable layer of its own, :mod:`souq.drivers.rootfs`)
  and runs ``bwrap`` as the machine's uid (:mod:`souq.drivers.sandbox`);
* **souq sandbox, 100 MB image** — the same with an image of busybox and 100 MB more in
  1,000 files: a warm start must not grow with the image (its files are never copied);
* **souq sandbox, 0.01 cpu** — the same with a small cpu share, whose quota bwrap's own setup
  is charged to (every other variant has 1 cpu, whose quota no start reaches);
* **souq sandbox, no slot made ahead** — the same on an agent that makes no sandbox ahead of
  its machines (``SOUQ_WARM_SANDBOXES=off``): every start cold, as before
  :mod:`souq.drivers.warm` (the other sandboxed variants take the slot their agent made after
  the machine before: each round claims one machine of each, so one is always ready);
* **souq sandbox, before** — with ``SOUQ_BENCH_BEFORE=DIR`` (a ``src`` directory of another
  checkout), the sandbox variant on an agent of that code, in the same rounds;
* **floors**, from a warm Python launcher (``subprocess.Popen``, :mod:`bench.bare`): the
  program spawned bare; ``bwrap`` with the argv Souq builds (checked against the agent's)
  binding a root mounted once beforehand; and ``runc run -d`` of an OCI bundle of the same
  busybox root with the same namespaces (pid, ipc, uts, mount, user: ``runc spec
  --rootless``), rootless as the uid, and as root mapping the uid (as containerd runs it).

Every agent but one runs with ``--private-network off``: what is timed is the isolation of
issue 32 (mount, PID, IPC, UTS and user namespaces, the image's root). The one, ``souq
sandbox, private network``, has the default config (``--private-network auto``: on, as root):
its machine's own network namespace, made with the slot its machine takes (for a machine id
chosen ahead: :mod:`souq.agent.machines.network_slots`; before, made at the claim: where its
time went, ``bench network_take``; docs/benchmarks.md).

Rounds are interleaved (each round starts every variant once, in an order that rotates) so
that drift on a shared machine falls on all alike; each sample is stopped and reaped before
the next starts. CPU per start: each Souq variant has an agent of its own, and each floor a
launcher of its own; their CPU times with their reaped children's over the rounds (their idle
rate, measured before, taken off), per start and stop.

Then, with the agents stopped: the parts of a sandboxed start, each alone in this process (a
user namespace of the uid; a machine's root mounted whole: that, the idmapped mount and the
overlay; the overlay alone), and bwrap and rootless runc started from mount tables of 500 and
2,000 mounts more than the host's (:mod:`bench.mount_table`), interleaved."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import statistics
import subprocess
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from bench import isolation_images, isolation_parts
from bench.bare import Bare, runc_bundle
from bench.isolation_images import Images, busybox_root
from bench.isolation_parts import ms as _ms
from bench.mount_table import MountTable
from bench.procevents import ProcEvents
from bench.stats import machine_line
from bench.supervisors import REGION, SouqAgent
from souq.bus import subjects
from souq.bus.codec import encode, unwrap_as
from souq.drivers import rootfs, sandbox
from souq.drivers.identity import MachineIds
from souq.drivers.programs import DEFAULT_PATH
from souq.images import Image
from souq.images.manifest import record_of
from souq.model import Machine
from souq.model.image import ImageRecord
from souq.model.machine import MachineConfig
from souq.model.protocol import ClaimRequest, DestroyCommand
from souq.natsserver import NatsServer

ROUNDS = 40
WARMUP = 3
PARTS_ROUNDS = 30
IDLE_S = 3.0
TABLE_EXTRA = (0, 500, 2000)  # mounts more in the table: as 250 and 1,000 machines of images add
TABLE_ROUNDS = 15
GUEST = {"cpus": 1, "memory_mb": 64}  # the default cpu (1), so the quota never throttles a start
_NO_NETWORK = {"private_network": "off"}  # the isolation alone (the docstring)
COLD = "souq sandbox, no slot made ahead"  # every start cold, as before souq.drivers.warm
_NO_SLOTS = {"SOUQ_WARM_SANDBOXES": "off"}
NETWORK = "souq sandbox, private network"  # the default config: a namespace of its own
SMALL_CPUS = 0.01  # a machine's share that its start does feel: 1 ms of CPU per 100 ms


@dataclass
class Variant:
    """One way of starting the program: ``start(key)`` returns the key the program carries in
    ``SOUQ_MACHINE_ID`` (Souq: the machine's id) and what ``stop`` needs."""

    label: str
    start: Callable[[str], tuple[str, Any]]
    stop: Callable[[Any], None]
    cpu_s: Callable[[], float]
    claims: Claims | None = None  # Souq: the start is a claim the agent answers
    starts: list[float] = field(default_factory=list)  # request -> program's execve, s
    answers: list[float] = field(default_factory=list)  # request -> claim answered, s
    idle_cpu_per_s: float = 0.0
    cpu_used_s: float = 0.0


# -- Souq ------------------------------------------------------------------------------------


class Claims:
    """Machines claimed from one agent, each of ``config``."""

    def __init__(self, agent: SouqAgent, config: dict[str, Any], image: ImageRecord | None) -> None:
        self.agent = agent
        self.config = MachineConfig.model_validate_json(json.dumps(config))
        self.image = image
        self.answered: dict[str, int] = {}  # the claims' answers: how many in each state
        self.warm = 0  # of those, machines started in a sandbox made ahead (souq.drivers.warm)

    def start(self, _key: str) -> tuple[str, Any]:
        req = ClaimRequest(
            request_id=uuid.uuid4().hex,
            body_hash="bench",
            app="bench",
            region=REGION,
            config=self.config,
            image=self.image,
        )
        assert self.agent._bus is not None
        reply = self.agent._run(
            self.agent._bus.request(
                subjects.worker(self.agent.worker_id, "claim"), encode(req), timeout=60
            )
        )
        machine = unwrap_as(reply, Machine)
        self.agent.ids.append(machine.id)
        self.answered[machine.state.value] = self.answered.get(machine.state.value, 0) + 1
        return machine.id, machine.id

    def seen(self, pid: int) -> None:
        """The program ``pid`` runs: count it if its bwrap ran the stub of a slot."""
        with contextlib.suppress(psutil.Error, ValueError):
            bwrap = psutil.Process(pid).parent()
            while bwrap is not None and bwrap.name() != "bwrap":
                bwrap = bwrap.parent()
            argv = [] if bwrap is None else bwrap.cmdline()
            self.warm += argv[argv.index("--") + 1 :] == ["/proc/self/fd/4", "stub"]

    def stop(self, machine_id: str) -> None:
        assert self.agent._bus is not None
        cmd = DestroyCommand(app="bench", machine_id=machine_id, force=True)
        subject = subjects.worker(self.agent.worker_id, "destroy")
        unwrap_as(
            self.agent._run(self.agent._bus.request(subject, encode(cmd), timeout=60)), Machine
        )
        self.agent.ids.remove(machine_id)

    def cpu_s(self) -> float:
        times = psutil.Process(self.agent.pid).cpu_times()
        return float(times.user + times.system + times.children_user + times.children_system)


# -- the run ---------------------------------------------------------------------------------


def _sample(variant: Variant, events: ProcEvents, marker: str, key: str) -> tuple[float, float]:
    """One start, timed until the program's execve (and until the answer), then its stop,
    waited for."""
    t0 = time.monotonic_ns()
    key, handle = variant.start(key)
    answered = time.monotonic_ns()
    start = events.wait_start(marker, key, t0, 60)
    if variant.claims is not None:
        variant.claims.seen(start.pid)
    variant.stop(handle)
    events.wait_gone([start.pid], 60)
    return (start.at_ns - t0) / 1e9, (answered - t0) / 1e9


def _round(variants: list[Variant], events: ProcEvents, marker: str, r: int, *, keep: bool) -> None:
    """Each variant once, starting with the ``r``-th: the order rotates from round to round."""
    for i in range(len(variants)):
        variant = variants[(i + r) % len(variants)]
        key = f"{r}-{i}-{uuid.uuid4().hex[:8]}"
        to_execve, to_answer = _sample(variant, events, marker, key)
        if keep:
            variant.starts.append(to_execve)
            if variant.claims is not None:
                variant.answers.append(to_answer)


def _cpu_rounds(variants: list[Variant], rounds: int, run: Callable[[int], None]) -> None:
    """Run the rounds, noting each variant's CPU over them (its idle rate taken off)."""
    before = {v.label: v.cpu_s() for v in variants}
    t0 = time.monotonic()
    for r in range(rounds):
        run(r)
        if (r + 1) % 10 == 0:
            print(f"round {r + 1} of {rounds} done", flush=True)
    time.sleep(0.5)  # the last machines' waiters reaped
    elapsed = time.monotonic() - t0
    for v in variants:
        v.cpu_used_s = v.cpu_s() - before[v.label] - v.idle_cpu_per_s * elapsed


def _idle(variants: list[Variant]) -> None:
    before = {v.label: v.cpu_s() for v in variants}
    time.sleep(IDLE_S)
    for v in variants:
        v.idle_cpu_per_s = max(0.0, (v.cpu_s() - before[v.label]) / IDLE_S)


def _mounts_under(root: Path) -> list[str]:
    with open("/proc/self/mountinfo") as f:
        points = [line.split()[4] for line in f]
    return [p for p in points if p.startswith(str(root) + "/")]


def _options(argv: list[str]) -> list[str]:
    """A bwrap command line's options and fixed values, its paths left out."""
    return [a for a in argv if not a.startswith("/")]


def isolation() -> None:
    if os.geteuid() != 0:
        print("# isolation: skipped: machines of their own uid need a root agent", flush=True)
        return
    missing = sandbox.unavailable() or next(
        (f"{tool} is not installed (make isolation-tools)" for tool in ("runc", "busybox")
         if shutil.which(tool) is None),
        None,
    )  # fmt: skip
    if missing:
        print(f"# isolation: skipped: {missing}", flush=True)
        return
    rounds = int(os.environ.get("ISOLATION_ROUNDS", ROUNDS))
    print(f"# isolation benchmark — {machine_line()}", flush=True)
    root = Path(tempfile.mkdtemp(prefix="souq-bench-iso-", dir="/var/tmp"))
    root.chmod(0o711)  # each machine's uid reaches its own directory
    ids = MachineIds()
    floor_id = f"bench-isolation-{os.getpid()}"
    try:
        with ProcEvents() as events, NatsServer(store_dir=root / "nats") as server:
            out = _run(root, server.url, events, ids.user(floor_id, root / "floor").uid, rounds)
            out["events_dropped"] = events.dropped
    finally:
        ids.release(floor_id, root / "floor")
        left = _mounts_under(root)
        if left:  # never remove files through a mount: say so, and leave them
            print(f"# isolation: still mounted, not removed: {left}", flush=True)
        else:
            shutil.rmtree(root, ignore_errors=True)
    print(json.dumps(out, indent=2))
    path = Path("bench/results")
    path.mkdir(parents=True, exist_ok=True)
    (path / "isolation.json").write_text(json.dumps(out, indent=2) + "\n")


class _AgentFrom(SouqAgent):
    """An agent of another checkout's code (``src``, a ``src`` directory), or of this one with
    more in its environment (``env``)."""

    def __init__(
        self, root: Path, marker: str, nats_url: str, src: str | None, env: dict[str, str]
    ) -> None:
        super().__init__(root, marker, nats_url, options=_NO_NETWORK)
        self.src, self.env = src, env

    def _spawn(self, args: list[str], log: Path) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, **self.env, **({"PYTHONPATH": self.src} if self.src else {})}
        with open(log, "ab") as err:
            self.proc = subprocess.Popen(
                args, stdin=subprocess.DEVNULL, stdout=err, stderr=err, env=env,
                start_new_session=True,
            )  # fmt: skip


def _souq_variants(
    agents: dict[str, SouqAgent], images: Images, hostbin: Path, marker: str
) -> list[Variant]:
    """A variant per agent (each has one, so that its CPU is its own)."""
    base = {"guest": GUEST, "restart": {"policy": "no"}}
    host_sleep = {**base, "driver": "exec", "cmd": [str(hostbin / "bin" / "sleep"), marker]}

    def of_image(image: Image, **more: Any) -> tuple[dict[str, Any], ImageRecord]:
        config = {**base, "driver": "sandbox", "image": image.reference, "cmd": ["sleep", marker]}
        return {**config, **more}, record_of(image)

    small_cpu = {**GUEST, "cpus": SMALL_CPUS}
    configs: dict[str, tuple[dict[str, Any], ImageRecord | None]] = {
        "souq exec": (host_sleep, None),
        "souq sandbox": of_image(images.small),
        "souq sandbox, 100 MB image": of_image(images.large),
        f"souq sandbox, {SMALL_CPUS} cpu": of_image(images.small, guest=small_cpu),
        "souq sandbox, before": of_image(images.small),
        COLD: of_image(images.small),
        NETWORK: of_image(images.small),
    }
    variants = []
    for label, agent in agents.items():
        claims = Claims(agent, *configs[label])
        variants.append(Variant(label, claims.start, claims.stop, claims.cpu_s, claims=claims))
    return variants


class Floors:
    """The floors' launchers, over the files they share: the machine root bwrap binds (mounted
    once, as Souq mounts one for each machine), bwrap's command line (as Souq builds it), the
    OCI bundles and runc's state."""

    def __init__(self, root: Path, uid: int, images: Images, hostbin: Path, marker: str) -> None:
        self.root, self.uid, self.images = root, uid, images
        self.args = ["sleep", marker]
        self.host_sleep = [str(hostbin / "bin" / "sleep"), marker]
        self.machine_root = rootfs.MachineRoot(root / "floor-root", images.small_root, uid)
        work = root / "floor-work"
        work.mkdir(mode=0o700)
        os.chown(work, uid, uid)
        self.bwrap_argv = sandbox.bwrap_argv(
            work,
            network=True,
            machines_root=root,
            image=sandbox.Image(images.small_root),
            overlay=self.machine_root.mount(persist=False),
            inner=(0, 0),
            die_with_parent=True,  # as the agent's are (souq-waiter is their parent)
        )
        self.rootless_state = root / "runc-rootless"
        self.rootless_state.mkdir(mode=0o700)
        os.chown(self.rootless_state, uid, uid)
        self.runc_env = {"PATH": DEFAULT_PATH, "XDG_RUNTIME_DIR": str(self.rootless_state)}
        self.launched: list[Bare] = []

    def _bare(self, argv: list[str], uid: int, **options: Any) -> Bare:
        bare = Bare(argv, uid, **options)
        self.launched.append(bare)
        return bare

    def spawn(self) -> Bare:
        return self._bare(self.host_sleep, self.uid)

    def bwrap(self, prefix: tuple[str, ...] = ()) -> Bare:
        """bwrap as the machine's uid (``prefix`` switches to it, if given: run as root)."""
        return self._bare([*prefix, *self.bwrap_argv, "/bin/sleep", *self.args[1:]],
                          0 if prefix else self.uid)  # fmt: skip

    def runc(self, cid: str, *, as_root: bool = False, prefix: tuple[str, ...] = ()) -> Bare:
        """``runc run -d``: rootless as the machine's uid (``prefix`` switches to it, if given),
        or as root mapping it into the container's user namespace."""
        state = self.root / "runc-root" if as_root else self.rootless_state
        runs_as = 0 if as_root else self.uid
        bundle = self.root / f"bundle-{cid}"
        config = runc_bundle(bundle, self.images.small_root, self.uid, self.args, owner=runs_as)
        runc = ["runc", "--root", str(state)]
        return self._bare(
            [*prefix, *runc, "run", "-d", "-b", str(bundle), cid],
            0 if prefix else runs_as,
            env=self.runc_env,
            stop=[[*prefix, *runc, "delete", "-f", cid]],
            config=config,
        )

    def close(self) -> None:
        for bare in self.launched:
            bare.close()
        self.machine_root.remove()


def _floor(label: str, bare: Bare) -> Variant:
    return Variant(label, bare.start, bare.stop, bare.launcher.cpu_s)


def _floor_variants(floors: Floors) -> list[Variant]:
    return [
        _floor("floor: spawn", floors.spawn()),
        _floor("floor: bwrap", floors.bwrap()),
        _floor("floor: runc rootless", floors.runc("rootless")),
        _floor("floor: runc as root", floors.runc("root", as_root=True)),
    ]


def _mount_tables(floors: Floors, events: ProcEvents, marker: str) -> dict[str, Any]:
    """bwrap and rootless runc started from mount tables of ``TABLE_EXTRA`` more mounts,
    interleaved; each from a namespace of its own through ``nsenter`` (the 0 one too)."""
    out: dict[str, Any] = {}
    tables = []
    try:
        for extra in TABLE_EXTRA:
            tables.append(MountTable(floors.root / f"table-{extra}", extra))
        variants = []
        for table in tables:
            prefix = tuple(table.enter(floors.uid))
            bwrap, runc = floors.bwrap(prefix), floors.runc(f"table-{table.extra}", prefix=prefix)
            variants += [
                _floor(f"bwrap, {table.extra}", bwrap),
                _floor(f"runc, {table.extra}", runc),
            ]
        _round(variants, events, marker, 0, keep=False)
        for r in range(TABLE_ROUNDS):
            _round(variants, events, marker, r, keep=True)
        by = {v.label: v for v in variants}
        for table in tables:
            out[str(table.extra)] = {
                "mounts_in_table": table.mounts,
                "bwrap_to_execve_ms": _ms(by[f"bwrap, {table.extra}"].starts),
                "runc_rootless_to_execve_ms": _ms(by[f"runc, {table.extra}"].starts),
            }
    finally:
        for table in tables:
            table.close()
    return out


def _run(root: Path, nats_url: str, events: ProcEvents, uid: int, rounds: int) -> dict[str, Any]:
    marker = str(1_000_000_000 + int.from_bytes(os.urandom(3)))
    events.track(marker)
    images = isolation_images.images(root, nats_url)
    hostbin = busybox_root(root / "host")  # the exec machine's busybox: the same binary
    agents: dict[str, SouqAgent] = {
        label: SouqAgent(root / f"agent{i}", marker, nats_url, options=_NO_NETWORK)
        for i, label in enumerate(
            [
                "souq exec",
                "souq sandbox",
                "souq sandbox, 100 MB image",
                f"souq sandbox, {SMALL_CPUS} cpu",
            ]
        )
    }
    before = os.environ.get("SOUQ_BENCH_BEFORE")
    if before:
        agents["souq sandbox, before"] = _AgentFrom(
            root / "agent-before", marker, nats_url, before, {}
        )
    agents[COLD] = _AgentFrom(root / "agent-cold", marker, nats_url, None, _NO_SLOTS)
    # The default config (``--private-network auto``: on, as root): its own network namespace.
    agents[NETWORK] = SouqAgent(root / "agent-net", marker, nats_url)
    floors: Floors | None = None
    try:
        for agent in agents.values():
            agent.launch(0)
        floors = Floors(root, uid, images, hostbin, marker)
        variants = _souq_variants(agents, images, hostbin, marker) + _floor_variants(floors)
        # The first start of each image pulls it; the warm-up rounds are not counted.
        for r in range(WARMUP):
            _round(variants, events, marker, r, keep=False)
        sandboxed = variants[1].claims
        assert sandboxed is not None
        argv_seen = _souq_bwrap_argv(sandboxed, events, marker)
        for variant in variants:
            if variant.claims is not None:
                variant.claims.answered.clear()
                variant.claims.warm = 0
        _idle(variants)
        _cpu_rounds(variants, rounds, lambda r: _round(variants, events, marker, r, keep=True))
        for agent in agents.values():  # only the floors from here on
            agent.close()
        parts = isolation_parts.parts(images.small_root, root / "parts", uid, PARTS_ROUNDS)
        parts["in_the_driver"] = isolation_parts.in_the_driver(
            images.small_root, root / "driver", hostbin, marker, events, PARTS_ROUNDS
        )
        tables = _mount_tables(floors, events, marker)
        same_argv = _options(argv_seen) == _options(floors.bwrap_argv)
        if not same_argv:
            print(f"# bwrap as souq ran it: {argv_seen}", flush=True)
            print(f"# bwrap as the floor runs it: {floors.bwrap_argv}", flush=True)
    finally:
        for agent in agents.values():
            agent.close()
        if floors is not None:
            floors.close()
    out = _results(variants, parts, images.sizes, same_argv, rounds)
    out["mount_table"] = tables
    return out


def _souq_bwrap_argv(claims: Claims, events: ProcEvents, marker: str) -> list[str]:
    """The bwrap command line the agent ran for a sandboxed machine (its program's parent)."""
    machine_id, _ = claims.start("")
    start = events.wait_start(marker, machine_id, 0, 60)
    parent = psutil.Process(start.pid).ppid()
    while "bwrap" not in psutil.Process(parent).name():
        parent = psutil.Process(parent).ppid()
    argv = psutil.Process(parent).cmdline()
    claims.stop(machine_id)
    events.wait_gone([start.pid], 60)
    return argv[: argv.index("--") + 1]


def _results(
    variants: list[Variant],
    parts: dict[str, Any],
    images: dict[str, Any],
    same_argv: bool,
    rounds: int,
) -> dict[str, Any]:
    by = {v.label: v for v in variants}
    results: dict[str, Any] = {}
    for v in variants:
        row: dict[str, Any] = {"to_execve_ms": _ms(v.starts)}
        if v.claims is not None:
            row["claim_answered_ms"] = _ms(v.answers)
            row["claims_answered_in_state"] = v.claims.answered
            row["claims_started_warm"] = v.claims.warm
        row["cpu_ms_per_start"] = round(v.cpu_used_s / rounds * 1000, 2)
        row["samples_ms"] = [round(x * 1000, 2) for x in v.starts]
        results[v.label] = row

    def p50(label: str) -> float:
        return float(statistics.median(by[label].starts))

    ratios = {
        "sandbox - exec, p50 ms": round((p50("souq sandbox") - p50("souq exec")) * 1000, 2),
        "souq sandbox / floor bwrap, p50": round(p50("souq sandbox") / p50("floor: bwrap"), 2),
        "no slot - exec, p50 ms": round((p50(COLD) - p50("souq exec")) * 1000, 2),
        "no slot / floor bwrap, p50": round(p50(COLD) / p50("floor: bwrap"), 2),
        "private network - exec, p50 ms": round((p50(NETWORK) - p50("souq exec")) * 1000, 2),
        "private network / floor bwrap, p50": round(p50(NETWORK) / p50("floor: bwrap"), 2),
        "souq exec / floor spawn, p50": round(p50("souq exec") / p50("floor: spawn"), 2),
        "100 MB image / busybox image, p50": round(
            p50("souq sandbox, 100 MB image") / p50("souq sandbox"), 2
        ),
        "floor bwrap - floor spawn, p50 ms": round(
            (p50("floor: bwrap") - p50("floor: spawn")) * 1000, 2
        ),
        "runc rootless / bwrap, p50": round(p50("floor: runc rootless") / p50("floor: bwrap"), 2),
        "runc as root / bwrap, p50": round(p50("floor: runc as root") / p50("floor: bwrap"), 2),
    }
    return {
        "command": "python -m bench isolation",
        "machine": machine_line(),
        "nproc": os.cpu_count(),
        "kernel": os.uname().release,
        "rounds": rounds,
        "images": images,
        "bwrap_argv_as_souq_builds": same_argv,
        "results": results,
        "parts_ms": parts,
        "ratios": ratios,
    }


def main() -> None:
    isolation()
