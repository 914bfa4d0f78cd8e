"""Slow and idle clients against a real broker (``python -m bench attack``).

A real cluster (``souq.testing.Cluster``: nats-server, one agent, one ``souq broker`` process,
secured, on loopback). A normal client asks ``GET /healthz`` every 10 ms over one keep-alive
connection and times each answer:

* **baseline**: nothing else runs;
* **attack**, in the same run: a slowloris of ``SLOW`` connections (each sends a request line
  and then one header byte a second, and opens a new connection whenever the broker closes
  it) and ``STREAMS`` followed event streams (``/v1/events?follow=true`` with the cluster's
  token) that never read a byte, all from this host, held open through the whole phase.

The result is the ratio of the attack's ``/healthz`` p50 and p99 to the baseline's, with
what the broker did to the attackers: the slowloris connections it closed at the head
deadline, and the streams it accepted and refused (429).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import tempfile
import threading
import time
from pathlib import Path

import httpx

from bench.scale import _write
from bench.stats import machine_line, summary_ms
from souq.testing import Cluster

SLOW = 300
STREAMS = 300
BASELINE_S = 5.0
ATTACK_S = 15.0  # longer than the head deadline (10 s): the broker cuts slowloris meanwhile
PACE_S = 0.01


def _probe(url: str, seconds: float) -> list[float]:
    """``GET /healthz`` every PACE_S for ``seconds``: each answer's latency."""
    out: list[float] = []
    with httpx.Client(base_url=url, timeout=10) as client:
        client.get("/healthz")
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            t0 = time.perf_counter()
            r = client.get("/healthz")
            out.append(time.perf_counter() - t0)
            assert r.status_code == 200, r.text
            time.sleep(PACE_S)
    return out


class Attack:
    """The attackers, on an event loop of their own in a thread of this process."""

    def __init__(self, port: int, token: str) -> None:
        self.port = port
        self.token = token
        self.slow_open = 0
        self.slow_closed = 0
        self.streams: dict[str, int] = {"accepted": 0, "refused_429": 0, "other": 0}
        self.ready = threading.Event()
        self._stop: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> None:
        self._thread.start()
        if not self.ready.wait(60):
            raise RuntimeError("the attackers did not get going")

    def stop(self) -> None:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(30)

    def _run(self) -> None:
        asyncio.run(self._main())

    async def _main(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        writers: list[asyncio.StreamWriter] = []
        started = asyncio.Event()
        slow = [asyncio.create_task(self._slowloris(started)) for _ in range(SLOW)]
        for _ in range(STREAMS):
            writer = await self._stream()
            if writer is not None:
                writers.append(writer)
        while self.slow_open < SLOW:
            await asyncio.sleep(0.05)
        self.ready.set()
        await self._stop.wait()
        for task in slow:
            task.cancel()
        await asyncio.gather(*slow, return_exceptions=True)
        for writer in writers:
            writer.close()

    async def _slowloris(self, started: asyncio.Event) -> None:
        first = True
        while True:
            try:
                reader, writer = await asyncio.open_connection("127.0.0.1", self.port)
            except OSError:
                await asyncio.sleep(0.1)
                continue
            try:
                writer.write(b"GET /healthz HTTP/1.1\r\nHost: souq\r\nX-Slow: ")
                await writer.drain()
                if first:
                    self.slow_open += 1
                    first = False
                while not reader.at_eof():
                    writer.write(b"a")
                    await writer.drain()
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(reader.read(4096), 1.0)
                self.slow_closed += 1
            except (ConnectionError, OSError):
                self.slow_closed += 1
            finally:
                writer.close()

    async def _stream(self) -> asyncio.StreamWriter | None:
        reader, writer = await asyncio.open_connection("127.0.0.1", self.port)
        writer.write(
            b"GET /v1/events?follow=true HTTP/1.1\r\nHost: souq\r\n"
            b"Authorization: Bearer " + self.token.encode() + b"\r\n\r\n"
        )
        await writer.drain()
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 30)
        status = head.split(b" ", 2)[1]
        key = {b"200": "accepted", b"429": "refused_429"}.get(status, "other")
        self.streams[key] += 1
        if key == "accepted":
            return writer  # held open, never read again
        writer.close()
        return None


def attack() -> None:
    print(f"# slow and idle clients against a broker — {machine_line()}", flush=True)
    results: dict[str, object] = {"slowloris": SLOW, "streams": STREAMS}
    with (
        tempfile.TemporaryDirectory(prefix="souq-bench-") as tmp,
        Cluster(Path(tmp), regions={"mad": 1}) as cluster,
    ):
        url = cluster.api_url
        port = int(url.rsplit(":", 1)[1])
        token = os.environ.get("SOUQ_TOKEN", "")
        base = _probe(url, BASELINE_S)
        results["baseline"] = summary_ms(base)
        print("baseline", json.dumps(results["baseline"]), flush=True)
        attackers = Attack(port, token)
        attackers.start()
        try:
            during = _probe(url, ATTACK_S)
        finally:
            attackers.stop()
        results["attack"] = summary_ms(during)
        results["slowloris_closed_by_broker"] = attackers.slow_closed
        results["stream_answers"] = attackers.streams
        print("attack", json.dumps(results["attack"]), flush=True)
    b, a = results["baseline"], results["attack"]
    assert isinstance(b, dict) and isinstance(a, dict)
    results["ratio"] = {k: round(a[k] / b[k], 2) for k in ("p50", "p99")}
    _write("attack", results)


def main() -> None:
    attack()
