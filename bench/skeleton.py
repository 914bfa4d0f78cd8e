"""The placement path's skeleton: the spine benchmark's hops with none of Souq's work on them.

A create here crosses the same processes and wires as a create in Souq: an HTTP request to a
front process (uvicorn with httptools and uvloop, like the broker), a request for offers
scatter-gathered over NATS to four worker processes (nats-py, like the agents), a request to
the best of them, which spawns the same command with ``subprocess.Popen`` and answers, and the
answer back to the client. Nothing is validated, recorded, synced, isolated or supervised. Its
latency is what the hops alone cost on this machine, the floor under any design with these
processes, measured in the same run as the spine's create→started.

Run as a benchmark through :func:`measure`; the processes are ``python -m bench.skeleton
worker NATS_URL NAME`` and ``python -m bench.skeleton front NATS_URL PORT``.

**The CPU skeleton** (:func:`cpu_stack`, for the ``creates`` suite): the floor under a broker's
and a hollow fleet's CPU per create. Its front answers Souq's own route, ``POST
/v1/apps/{app}/machines``, checks the bearer token with Souq's verifier (the cluster's key from
``SOUQ_AUTH_DIR``, as a broker does; none set: no check) and makes one NATS request to a worker
picked in turn; ``python -m bench.skeleton hollow NATS_URL COUNT`` is that many workers in one
process (one subscription) that answer at once, spawning nothing, as hollow workers do. Nothing
is parsed, validated, recorded or announced.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import httpx

from souq import daemon
from souq.natsserver import NatsServer, free_port
from souq.procs import terminate
from souq.testing import wait_until

CMD = ["sleep", "3600"]
OFFERS = "skeleton.offers"

Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]


def spawn(cmd: list[str]) -> subprocess.Popen[bytes]:
    """Start ``cmd`` directly, in a session of its own, with no stdio: how both floors spawn."""
    return subprocess.Popen(
        cmd,
        start_new_session=True,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


async def _hollow(nats_url: str) -> None:
    """Workers that answer a claim at once (one subscription for them all)."""
    import nats

    nc = await nats.connect(nats_url)
    answer = json.dumps({"state": "started"}).encode()

    async def claim(msg: Any) -> None:
        await msg.respond(answer)

    await nc.subscribe("skeleton.claim.*", cb=claim)
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    await stop.wait()
    await nc.close()


async def _worker(nats_url: str, name: str) -> None:
    import nats

    spawned: list[subprocess.Popen[bytes]] = []
    nc = await nats.connect(nats_url)

    async def offer(msg: Any) -> None:
        await msg.respond(json.dumps({"worker": name, "free": 1000 - len(spawned)}).encode())

    async def claim(msg: Any) -> None:
        proc = spawn(CMD)
        spawned.append(proc)
        await msg.respond(json.dumps({"pid": proc.pid, "state": "started"}).encode())

    await nc.subscribe(OFFERS, cb=offer)
    await nc.subscribe(f"skeleton.claim.{name}", cb=claim)
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    await stop.wait()
    for proc in spawned:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    await nc.close()


def _front_app(nats_url: str, workers: int) -> Callable[..., Awaitable[None]]:
    import nats

    from souq.auth.files import AuthDir
    from souq.auth.tokens import Scope
    from souq.errors import SouqError

    auth = AuthDir.from_env(None)
    verifier = auth.verifier() if auth is not None else None
    conn: dict[str, Any] = {}
    gatherings: dict[str, tuple[list[bytes], asyncio.Event]] = {}
    tokens = itertools.count()

    async def on_offer(msg: Any) -> None:  # one subscription for every gathering, as Souq's
        gathering = gatherings.get(msg.subject.rsplit(".", 1)[1])
        if gathering is None:
            return  # late: its gathering is over
        offers, done = gathering
        offers.append(msg.data)
        if len(offers) == workers:
            done.set()

    async def gather(body: bytes, timeout: float) -> list[bytes]:
        token = str(next(tokens))
        offers: list[bytes] = []
        done = asyncio.Event()
        gatherings[token] = (offers, done)
        try:
            await conn["nc"].publish(OFFERS, body, reply=f"{conn['inbox']}.{token}")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(done.wait(), timeout)
        finally:
            del gatherings[token]
        return offers

    async def place(body: bytes) -> bytes:
        offers = [json.loads(o) for o in await gather(body, 2)]
        if len(offers) < workers:
            raise RuntimeError(f"{len(offers)} offers of {workers}")
        best = max(offers, key=lambda o: o["free"])["worker"]
        reply = await conn["nc"].request(f"skeleton.claim.{best}", body, timeout=2)
        return bytes(reply.data)

    turns = itertools.count()

    async def place_direct(body: bytes) -> bytes:
        """The hops of a create that draws its worker from the broker's book: no offers, one
        claim (the worker picked in turn)."""
        best = f"w{next(turns) % workers}"
        reply = await conn["nc"].request(f"skeleton.claim.{best}", body, timeout=2)
        return bytes(reply.data)

    async def ready() -> bytes:
        """Every worker answers (they subscribe after the front may already serve)."""
        return json.dumps({"workers": len(await gather(b"{}", 0.2))}).encode()

    async def app(scope: dict[str, Any], receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            while (await receive())["type"] != "lifespan.shutdown":
                conn["nc"] = nc = await nats.connect(nats_url)
                conn["inbox"] = nc.new_inbox()
                await nc.subscribe(conn["inbox"] + ".*", cb=on_offer)
                await send({"type": "lifespan.startup.complete"})
            await conn["nc"].close()
            await send({"type": "lifespan.shutdown.complete"})
            return
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        status = 200
        if scope["path"].startswith("/v1/apps/"):  # Souq's create route, its token checked
            status = 201
            try:
                if verifier is not None:
                    header = dict(scope["headers"]).get(b"authorization", b"").decode()
                    verifier.authorize(header, app=scope["path"].split("/")[3], action=Scope.WRITE)
                out = await place_direct(body)
            except SouqError as exc:
                status, out = exc.http_status, json.dumps({"status": exc.status}).encode()
        elif scope["path"] == "/healthz":
            out = b"{}"
        elif scope["path"] == "/ready":
            out = await ready()
        elif scope["path"] == "/create-direct":
            out = await place_direct(body)
        else:
            out = await place(body)
        headers = [(b"content-type", b"application/json")]
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": out})

    return app


def _front(nats_url: str, port: int, workers: int) -> None:
    import uvicorn

    uvicorn.run(
        _front_app(nats_url, workers),
        host="127.0.0.1",
        port=port,
        loop="uvloop",
        http="httptools",
        log_level="warning",
    )


def measure(n: int, warmup: int, workers: int = 4, *, offers: bool = True) -> list[float]:
    """Time ``n`` sequential creates through the skeleton (after ``warmup`` untimed ones), on a
    nats-server, ``workers`` worker processes and one front process of its own. ``offers``:
    the front gathers offers before its claim (Souq's `offers` path); otherwise it claims on a
    worker it picks itself (the `book` path, Souq's default)."""
    port = free_port("127.0.0.1")
    me = [sys.executable, "-m", "bench.skeleton"]
    with NatsServer() as nats:
        procs = [subprocess.Popen([*me, "worker", nats.url, f"w{i}"]) for i in range(workers)]
        procs.append(subprocess.Popen([*me, "front", nats.url, str(port), str(workers)]))
        try:
            with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=10) as client:

                def ready() -> bool:
                    try:
                        return bool(client.get("/ready").json()["workers"] == workers)
                    except httpx.TransportError:
                        return False

                wait_until(ready, timeout=30, interval=0.05, message="the skeleton's workers")
                return _creates(client, n, warmup, "/create" if offers else "/create-direct")
        finally:
            terminate(*procs)


def _creates(client: httpx.Client, n: int, warmup: int, path: str) -> list[float]:
    body = {"config": {"cmd": CMD}}
    times: list[float] = []
    for i in range(warmup + n):
        t0 = time.perf_counter()
        r = client.post(path, json=body)
        elapsed = time.perf_counter() - t0
        r.raise_for_status()
        assert r.json()["state"] == "started"
        if i >= warmup:
            times.append(elapsed)
    return times


@contextlib.contextmanager
def cpu_stack(workers: int, env: dict[str, str]) -> Iterator[tuple[str, dict[str, int]]]:
    """The CPU skeleton on a nats-server of its own: its front's URL and its processes' pids
    (``front``, ``workers``, ``nats-server``); ``env`` for the front (``SOUQ_AUTH_DIR``)."""
    port = free_port("127.0.0.1")
    me = [sys.executable, "-m", "bench.skeleton"]
    with NatsServer() as nats:
        hollow = subprocess.Popen([*me, "hollow", nats.url])
        front = subprocess.Popen(
            [*me, "front", nats.url, str(port), str(workers)], env={**os.environ, **env}
        )
        url = f"http://127.0.0.1:{port}"
        try:

            def up() -> bool:
                try:
                    return httpx.get(url + "/healthz", timeout=5).status_code == 200
                except httpx.TransportError:
                    return False

            wait_until(up, timeout=30, interval=0.05, message="the CPU skeleton's front")
            assert nats.process is not None
            pids = {"front": front.pid, "workers": hollow.pid, "nats-server": nats.process.pid}
            yield url, pids
        finally:
            terminate(front, hollow)


def main(argv: list[str]) -> None:
    role, nats_url, *rest = argv
    if role == "worker":
        daemon.run(_worker(nats_url, rest[0]))
    elif role == "hollow":
        daemon.run(_hollow(nats_url))
    elif role == "front":
        _front(nats_url, int(rest[0]), int(rest[1]))
    else:
        raise SystemExit(f"unknown role {role!r}: worker, hollow or front")


if __name__ == "__main__":
    main(sys.argv[1:])
