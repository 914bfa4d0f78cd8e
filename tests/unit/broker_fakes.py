"""Small fake workers on a :class:`MemoryTransport`, for the broker's unit tests: they speak the
bus protocol (offers, claims, commands, heartbeats) with none of the agent's machinery."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field

from souq.broker.config import BrokerConfig
from souq.broker.schemas import CreateMachineRequest
from souq.broker.service import BrokerService
from souq.bus import MemoryTransport, decode, encode, error_reply, ok_reply, subjects
from souq.bus.subjects import verb_of
from souq.clock import Clock, ManualClock, iso_from_ms
from souq.errors import (
    ClaimRefused,
    IdempotencyConflict,
    IllegalTransition,
    NotFound,
    SouqError,
    WaitTimeout,
)
from souq.model import (
    ClaimRequest,
    DestroyCommand,
    Heartbeat,
    ListCommand,
    LocateCommand,
    LocateReply,
    LogsCommand,
    LogsReply,
    Machine,
    MachineEvent,
    MachineEventMessage,
    MachineRef,
    MachineState,
    Offer,
    OfferRequest,
    Resources,
    StopCommand,
    WaitCommand,
    WorkerInfo,
    WorkerState,
)

NOW_MS = 1_700_000_000_000


@dataclass
class FakeWorker:
    bus: MemoryTransport
    id: str
    region: str = "mad"
    cpus: float = 4
    memory_mb: int = 4096
    allocated: Resources = field(default_factory=Resources.zero)
    cordoned: bool = False
    refuse_claims: bool = False  # as if another broker won every race
    refusal_reason: str | None = None  # the reason its refusals give (None: none)
    silent_claims: bool = False  # claims get no answer
    slow_claims: int = 0  # the first ones are answered (made) only after this long, in ms
    silent_offers: bool = False
    interval_s: float = 1.0
    output: str = ""
    machines: dict[str, Machine] = field(default_factory=dict)
    by_request: dict[str, tuple[str, str]] = field(default_factory=dict)
    claims: list[ClaimRequest] = field(default_factory=list)
    offer_requests: int = 0
    seq: int = 0
    changed: asyncio.Event = field(default_factory=asyncio.Event)
    polling: asyncio.Event = field(default_factory=asyncio.Event)  # a logs long-poll waits
    labels: dict[str, str] = field(default_factory=dict)
    images: list[str] = field(default_factory=list)  # images cached (sha256:…), newest first
    layers: set[str] = field(default_factory=set)  # short digests of the image layers held

    async def start(self) -> FakeWorker:
        await self.bus.subscribe(subjects.offers(self.region), self._offer)
        await self.bus.subscribe(subjects.worker_verbs(self.id), self._command)
        await self.bus.subscribe(subjects.all_workers("list"), self._list)
        await self.bus.subscribe(subjects.all_workers("locate"), self._locate)
        await self.bus.subscribe(subjects.DISCOVER, self._discover)
        return self

    async def stop(self) -> None:
        """Go away: unsubscribe from everything (a crash, as far as the bus can tell)."""
        self.bus._subs = [
            s for s in self.bus._subs if getattr(s.handler, "__self__", None) is not self
        ]

    def info(self) -> WorkerInfo:
        return WorkerInfo(
            id=self.id,
            region=self.region,
            state=WorkerState.CORDONED if self.cordoned else WorkerState.UP,
            capacity=Resources(cpus=self.cpus, memory_mb=self.memory_mb),
            allocated=self.allocated,
            labels=self.labels,
            images=self.images,
            machines=sum(1 for m in self.machines.values() if m.state != "destroyed"),
        )

    def app_machines(self, app: str) -> int:
        return sum(1 for m in self.machines.values() if m.app == app and m.state != "destroyed")

    async def heartbeat(self) -> None:
        self.seq += 1
        beat = Heartbeat(
            worker=self.info(), seq=self.seq, interval_s=self.interval_s, layers=sorted(self.layers)
        )
        await self.bus.publish(subjects.heartbeat(self.region, self.id), encode(beat))

    async def _discover(self, subject: str, data: bytes) -> None:
        await self.heartbeat()

    def _free(self) -> Resources:
        return Resources(cpus=self.cpus, memory_mb=self.memory_mb).minus(self.allocated)

    async def _offer(self, subject: str, data: bytes) -> bytes | None:
        self.offer_requests += 1
        if self.silent_offers:
            return None
        ask = decode(data, OfferRequest)
        known = self.by_request.get(ask.request_id)
        if known is not None:
            offer = Offer(worker=self.info(), eligible=True, existing_machine_id=known[1])
        elif self.cordoned:
            offer = Offer(worker=self.info(), eligible=False, reason="cordoned")
        else:
            offer = Offer(worker=self.info(), eligible=ask.resources.fits_within(self._free()))
            if not offer.eligible:
                offer = Offer(worker=self.info(), eligible=False, reason="full", detail="full")
        held, pull = self.image_terms(ask)
        live = {
            "image_layers": held,
            "image_bytes": pull,
            "app_machines": self.app_machines(ask.app),
        }
        return ok_reply(offer.model_copy(update=live))

    def image_terms(self, ask: OfferRequest) -> tuple[int | None, int | None]:
        """(layers held, bytes to pull) for the asked image, as an agent's cache says them."""
        if ask.image is None:
            return None, None
        if ask.image in self.images:
            return len(ask.image_layers), 0
        held = [d for d in ask.image_layers if d in self.layers]
        return len(held), sum(n for d, n in ask.image_layers.items() if d not in self.layers)

    async def _list(self, subject: str, data: bytes) -> bytes:
        cmd = decode(data, ListCommand)
        found = [
            m
            for m in self.machines.values()
            if (cmd.app is None or m.app == cmd.app)
            and (cmd.include_destroyed or m.state != "destroyed")
        ]
        return ok_reply(found)

    async def _locate(self, subject: str, data: bytes) -> bytes:
        cmd = decode(data, LocateCommand)
        return ok_reply(LocateReply(worker_id=self.id, found=cmd.machine_id in self.machines))

    async def _command(self, subject: str, data: bytes) -> bytes | None:
        verb = verb_of(subject)
        if verb == "claim" and self.silent_claims:
            self.claims.append(decode(data, ClaimRequest))  # heard, never answered
            return None
        try:
            return ok_reply(await getattr(self, "_" + verb)(data))
        except SouqError as err:
            return error_reply(err)

    async def _claim(self, data: bytes) -> Machine:
        claim = decode(data, ClaimRequest)
        self.claims.append(claim)
        known = self.by_request.get(claim.request_id)
        if known is not None:
            if known[0] != claim.body_hash:
                raise IdempotencyConflict("same key, different body")
            return self.machines[known[1]]
        want = claim.config.guest.resources()
        if self.refuse_claims or not want.fits_within(self._free()):
            raise ClaimRefused(
                f"worker {self.id} has no room",
                details={"reason": self.refusal_reason} if self.refusal_reason else None,
            )
        self.allocated = self.allocated.plus(want)
        machine_id = f"m{len(self.claims):02d}{self.id}"
        state = MachineState.CREATED if claim.skip_launch else MachineState.STARTED
        machine = Machine(
            id=machine_id,
            name=claim.name or machine_id,
            app=claim.app,
            region=self.region,
            worker_id=self.id,
            state=state,
            config=claim.config,
            created_at=iso_from_ms(NOW_MS + len(self.claims)),
            updated_at=iso_from_ms(NOW_MS + len(self.claims)),
            events=[MachineEvent(type="launch", status=state, source="user", timestamp=NOW_MS)],
            placement=claim.placement,
        )
        self.machines[machine_id] = machine
        self.by_request[claim.request_id] = (claim.body_hash, machine_id)
        if self.slow_claims:  # made at once, answered late (a worker busy with a burst)
            await asyncio.sleep(self.slow_claims / 1000)
            self.slow_claims = 0
        return machine

    def _find(self, ref: MachineRef) -> Machine:
        machine = self.machines.get(ref.machine_id)
        if machine is None or machine.app != ref.app:
            raise NotFound(f"machine {ref.machine_id} not found")
        return machine

    async def set_state(self, machine_id: str, state: MachineState) -> Machine:
        machine = self.machines[machine_id].model_copy(update={"state": state})
        self.machines[machine_id] = machine
        message = MachineEventMessage(
            machine_id=machine_id,
            app=machine.app,
            worker_id=self.id,
            region=self.region,
            state=state,
            event=MachineEvent(type=str(state), status=state, source="agent", timestamp=NOW_MS),
        )
        await self.bus.publish(subjects.events(self.region, self.id), encode(message))
        self.changed.set()
        self.changed = asyncio.Event()
        return machine

    async def _get(self, data: bytes) -> Machine:
        return self._find(decode(data, MachineRef))

    async def _start(self, data: bytes) -> Machine:
        machine = self._find(decode(data, MachineRef))
        return await self.set_state(machine.id, MachineState.STARTED)

    async def _stop(self, data: bytes) -> Machine:
        machine = self._find(decode(data, StopCommand))
        return await self.set_state(machine.id, MachineState.STOPPED)

    async def _destroy(self, data: bytes) -> Machine:
        cmd = decode(data, DestroyCommand)
        machine = self._find(cmd)
        if machine.state == MachineState.STARTED and not cmd.force:
            raise IllegalTransition("stop it first, or force")
        self.allocated = self.allocated.minus(machine.config.guest.resources())
        return await self.set_state(machine.id, MachineState.DESTROYED)

    async def _wait(self, data: bytes) -> Machine:
        cmd = decode(data, WaitCommand)
        try:
            async with asyncio.timeout(cmd.timeout_s):
                while (machine := self._find(cmd)).state != cmd.state:
                    await self.changed.wait()
        except TimeoutError:
            raise WaitTimeout(f"machine {cmd.machine_id} is not {cmd.state}") from None
        return machine

    async def _events(self, data: bytes) -> list[MachineEvent]:
        return self._find(decode(data, MachineRef)).events

    async def _logs(self, data: bytes) -> LogsReply:
        cmd = decode(data, LogsCommand)
        machine = self._find(cmd)
        raw = self.output.encode()
        if cmd.offset >= len(raw) and cmd.wait_s > 0 and machine.state != "destroyed":
            try:
                async with asyncio.timeout(cmd.wait_s):
                    while (
                        cmd.offset >= len(self.output.encode())
                        and self._find(cmd).state != "destroyed"
                    ):
                        self.polling.set()
                        await self.changed.wait()
            except TimeoutError:
                pass
            raw = self.output.encode()
        chunk = raw[cmd.offset : cmd.offset + cmd.max_bytes]
        finished = self._find(cmd).state == "destroyed" and cmd.offset + len(chunk) >= len(raw)
        return LogsReply(
            data=chunk.decode(), next_offset=cmd.offset + len(chunk), finished=finished
        )

    def write(self, text: str) -> None:
        """The machine prints ``text``."""
        self.output += text
        self.changed.set()
        self.changed = asyncio.Event()


async def start_workers(bus: MemoryTransport, *workers: FakeWorker) -> list[FakeWorker]:
    for w in workers:
        await w.start()
    return list(workers)


def broker_config(**overrides: object) -> BrokerConfig:
    values: dict[str, object] = {
        "nats_url": "memory://",
        "offer_timeout_s": 0.2,
        "claim_timeout_s": 0.2,
        "gather_timeout_s": 0.2,
        "command_timeout_s": 2.0,
    }
    values.update(overrides)
    return BrokerConfig.model_validate(values)


async def started_service(
    bus: MemoryTransport, *workers: FakeWorker, clock: Clock | None = None, **config: object
) -> BrokerService:
    """Workers up, then a broker that has heard every worker's first heartbeat."""
    for w in workers:
        await w.start()
    service = BrokerService(bus, broker_config(**config), clock=clock or ManualClock())
    await service.start()
    assert await service.liveness.wait_workers(len(workers), timeout=5.0)
    return service


def create_body(
    region: str = "mad", cpus: float = 1, memory_mb: int = 256, **extra: object
) -> CreateMachineRequest:
    return CreateMachineRequest.model_validate_json(
        json.dumps(
            {
                "region": region,
                "config": {"cmd": ["sleep", "60"], "guest": {"cpus": cpus, "memory_mb": memory_mb}},
                **extra,
            }
        )
    )
