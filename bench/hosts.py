"""Several hosts (network namespaces, souq.multihost): convergence after a partition heals, and
placement latency with 50 ms between regions.

Four hosts: ``mad`` x3 (the broker on the first), ``syd`` x1; heartbeats every 1 s (the agent's
default), the broker's defaults otherwise.

* Convergence: partition a mad worker until it is down, create machines elsewhere meanwhile,
  heal; the time from the heal until the broker lists the worker up *and* its machine list
  matches every agent's own state.db. Floor: one heartbeat interval (the worker's next beat).
* Latency: the delay line adds 25 ms each way between every mad host and the syd host (a round
  trip of 50 ms between the regions; nothing within a region, nothing to the client). Creates in
  mad (the broker's region) and in syd, timed at the client; the remote-minus-local difference
  is set against the RTT.
"""

from __future__ import annotations

import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from tests.multihost.hosts import converged, create, created, wait_view_complete

from bench.stats import machine_line
from souq.multihost import Hosts
from souq.netns import missing
from souq.testing import wait_until

ROUNDS = 9
CREATES = 30
RTT_MS = 50.0


def _convergence(hosts: Hosts) -> list[float]:
    victim = hosts.hosts[2]
    took = []
    with hosts.client() as http:
        wait_view_complete(http)
        for n in range(ROUNDS):
            app = f"conv-{n}"
            for _ in range(4):
                created(http, app, "mad")
            hosts.network.partition(victim.net)
            wait_until(
                lambda: hosts.worker_states(http)[victim.worker_id] == "down",
                timeout=10,
                message="down",
            )
            for _ in range(2):
                created(http, app, "mad")
            hosts.network.heal(victim.net)
            healed = time.monotonic()

            def done(app: str = app) -> bool:
                states = hosts.worker_states(http)
                return states[victim.worker_id] == "up" and converged(hosts, http, app)

            wait_until(done, timeout=30, interval=0.01, message="convergence")
            took.append(time.monotonic() - healed)
    return took


def _latency(hosts: Hosts, region: str, *, keyed: bool) -> list[float]:
    """Creates timed at the client: with an ``Idempotency-Key`` the broker asks for offers
    (they also find a machine the key made already); without one it draws the worker from its
    book and sends the claim at once."""
    out = []
    with hosts.client() as http:
        for _ in range(CREATES):
            started = time.monotonic()
            r = create(http, f"lat-{region}", region, keyed=keyed)
            assert r.status_code == 201, r.text
            out.append(time.monotonic() - started)
            gone = http.delete(
                f"/v1/apps/lat-{region}/machines/{r.json()['id']}", params={"force": "true"}
            )
            assert gone.status_code == 200, gone.text  # (capacity for the next one)
    return out


def run() -> dict[str, Any]:
    reason = missing()
    if reason is not None:
        raise SystemExit(f"bench hosts: {reason}")
    with Hosts(
        Path(tempfile.mkdtemp(prefix="souq-bench-hosts-")), ["mad", "mad", "mad", "syd"]
    ) as hosts:
        conv = _convergence(hosts)
        mad, syd = hosts.in_region("mad"), hosts.in_region("syd")
        times: dict[str, list[float]] = {}
        for delay in (False, True):
            if delay:
                hosts.network.delay([h.net for h in mad], [h.net for h in syd], rtt_ms=RTT_MS)
            try:
                for keyed in (True, False):
                    for region in ("mad", "syd"):
                        name = (
                            f"{'delay' if delay else 'no_delay'}_{'keyed' if keyed else 'unkeyed'}"
                        )
                        times[f"{name}_{region}_ms"] = _latency(hosts, region, keyed=keyed)
            finally:
                hosts.network.unshape()
    med = statistics.median
    result: dict[str, Any] = {
        "convergence_median_s": med(conv),
        "convergence_max_s": max(conv),
        "convergence_rounds": [round(x, 3) for x in conv],
        "heartbeat_interval_s": hosts.heartbeat_interval_s,
        "convergence_over_floor": med(conv) / hosts.heartbeat_interval_s,
        "rtt_ms": RTT_MS,
    }
    result.update({name: med(values) * 1000 for name, values in times.items()})
    for keyed in ("keyed", "unkeyed"):
        diff = result[f"delay_{keyed}_syd_ms"] - result[f"delay_{keyed}_mad_ms"]
        result[f"{keyed}_remote_minus_local_ms"] = diff
        result[f"{keyed}_difference_over_rtt"] = diff / RTT_MS
    return result


def main() -> None:
    print(machine_line(), flush=True)
    result = {k: round(v, 3) if isinstance(v, float) else v for k, v in run().items()}
    print(json.dumps(result, indent=2))
