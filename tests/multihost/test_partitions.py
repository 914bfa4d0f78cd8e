"""Partitions, delay and loss between real hosts (network namespaces, souq.multihost).

Four hosts: three in ``mad`` (the broker on the first), one in ``syd``; each runs its own NATS
node (one cluster, routed over the links) and its own agent, heartbeats every 0.5 s. A partition
drops every packet in or out of a host (iptables in its namespace); delay and loss come from a
delay line between namespaces (souq.delayline).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid

import httpx
import pytest

from souq.multihost import Hosts
from souq.netns import Network, missing, sweep
from souq.testing import wait_until

from .conftest import HEARTBEAT_S
from .hosts import agent_rows, alive, converged, create, created, listed, wait_view_complete

DOWN_AFTER = 3  # missed heartbeats (the broker's default down_after_missed)
SLACK_S = 1.5  # scheduling on a 2-core machine with four hosts' daemons
DOWN_WITHIN_S = DOWN_AFTER * HEARTBEAT_S + SLACK_S
AT_ONCE_S = 2.0  # a placement that waits for nobody: offers (0.3 s at most), one claim
VIEW_ROUND_S = 5.0 + 2 * SLACK_S  # the broker's view_sync_interval_s, and slack


def test_a_partitioned_worker_is_down_its_machines_run_and_placements_go_elsewhere(
    hosts: Hosts,
) -> None:
    app = "part-a"
    victim = hosts.hosts[2]  # in mad, not the broker's host
    with hosts.client() as http:
        wait_view_complete(http)
        machines = [created(http, app, "mad") for _ in range(6)]
        while not any(m["worker_id"] == victim.worker_id for m in machines):
            assert len(machines) < 15, "no machine landed on the victim"
            machines.append(created(http, app, "mad"))
        theirs = {m["id"] for m in machines if m["worker_id"] == victim.worker_id}
        before = agent_rows(victim, app)

        hosts.network.partition(victim.net)
        try:
            cut = time.monotonic()
            wait_until(
                lambda: hosts.worker_states(http)[victim.worker_id] == "down",
                timeout=DOWN_WITHIN_S,
                interval=0.02,
                message=f"the partitioned worker to be down within {DOWN_WITHIN_S:g}s",
            )
            assert time.monotonic() - cut >= (DOWN_AFTER - 1) * HEARTBEAT_S  # not before

            # Its machines run on: same pids, alive, started in its own records.
            now = agent_rows(victim, app)
            for mid in theirs:
                state, pid = now[mid]
                assert (state, pid) == before[mid]
                assert state == "started" and alive(pid)
                assert victim.name in _ip("netns", "identify", str(pid))  # on its own host

            # The broker still lists them, on a worker it says is down, once its view is
            # complete again (until then it asks the live workers, which cannot tell).
            wait_view_complete(http, timeout=VIEW_ROUND_S)
            shown, _ = listed(http, app)
            assert {m["id"] for m in shown} == {m["id"] for m in machines}
            assert {m["worker_state"] for m in shown if m["id"] in theirs} == {"down"}

            # Placements in mad go to the two other workers, at once.
            others = {h.worker_id for h in hosts.in_region("mad") if h is not victim}
            for _ in range(4):
                started = time.monotonic()
                machine = created(http, app, "mad")
                assert time.monotonic() - started < AT_ONCE_S
                assert machine["worker_id"] in others
        finally:
            hosts.network.heal(victim.net)
        hosts.wait_workers_up([victim], timeout=15)


def test_a_region_whose_only_worker_is_cut_off_refuses_at_once_saying_why(hosts: Hosts) -> None:
    app = "part-b"
    (lone,) = hosts.in_region("syd")
    with hosts.client() as http:
        created(http, app, "syd")
        hosts.network.partition(lone.net)
        try:
            wait_until(
                lambda: hosts.worker_states(http)[lone.worker_id] == "down",
                timeout=DOWN_WITHIN_S,
                interval=0.02,
                message="syd's worker to be down",
            )
            started = time.monotonic()
            r = create(http, app, "syd")
            took = time.monotonic() - started
            assert r.status_code == 409, r.text
            error = r.json()
            assert error["status"] == "insufficient_capacity"
            assert "no live workers in region syd" in error["error"]
            assert lone.worker_id in error["error"] and "down" in error["error"]
            assert error["placement"]["expected_offers"] == 0
            assert took < AT_ONCE_S
            # Only syd is short: mad places as ever.
            assert created(http, app, "mad")["region"] == "mad"
        finally:
            hosts.network.heal(lone.net)
        hosts.wait_workers_up([lone], timeout=15)
        # Its heartbeats get through first; the way back to it may lag (the stalled route's
        # TCP retransmission backs off on each side on its own): until then a create says so.
        refusals: list[str] = []

        def placed() -> bool:
            r = create(http, app, "syd")
            if r.status_code != 201:
                assert r.status_code == 409, r.text
                refusals.append(r.json()["error"])
                return False
            return bool(r.json()["worker_id"] == lone.worker_id)

        wait_until(placed, timeout=15, interval=0.1, message="syd to place again")
        assert all("region syd" in e for e in refusals), refusals


def test_after_a_partition_heals_the_view_converges_nothing_lost_or_doubled(
    hosts: Hosts,
) -> None:
    app = "part-c"
    victim = hosts.hosts[1]
    with hosts.client() as http:
        wait_view_complete(http)
        before = [created(http, app, "mad") for _ in range(6)]
        hosts.network.partition(victim.net)
        try:
            wait_until(
                lambda: hosts.worker_states(http)[victim.worker_id] == "down",
                timeout=DOWN_WITHIN_S,
                interval=0.02,
                message="the partitioned worker to be down",
            )
            during = [created(http, app, "mad") for _ in range(4)]
            # one of the machines on a reachable worker goes away meanwhile
            gone = next(m for m in before if m["worker_id"] != victim.worker_id)
            r = http.delete(f"/v1/apps/{app}/machines/{gone['id']}", params={"force": "true"})
            assert r.status_code in (200, 202, 204), r.text
        finally:
            hosts.network.heal(victim.net)
        hosts.wait_workers_up([victim], timeout=15)
        wait_until(
            lambda: converged(hosts, http, app),
            timeout=15,
            interval=0.05,
            message="the broker's list to match every agent's records",
        )
        machines, _ = listed(http, app)
        ids = [m["id"] for m in machines]
        assert len(ids) == len(set(ids))
        expected = {m["id"] for m in [*before, *during]} - {gone["id"]}
        assert set(ids) == expected
        assert {m["worker_state"] for m in machines} == {"up"}
        on_victim = {m["id"] for m in before if m["worker_id"] == victim.worker_id}
        for mid in on_victim:
            state, pid = agent_rows(victim, app)[mid]
            assert state == "started" and alive(pid)


def test_creates_across_a_slow_lossy_link_succeed_once_each(hosts: Hosts) -> None:
    """50 ms between the regions and 10 % loss each way: a create in the remote region
    succeeds, or is refused saying why and succeeds when retried with its key; never two."""
    app = "part-d"
    mad, syd = hosts.in_region("mad"), hosts.in_region("syd")
    hosts.network.delay([h.net for h in mad], [h.net for h in syd], rtt_ms=50)
    hosts.network.loss([h.net for h in mad], [h.net for h in syd], percent=10)
    refusals: list[str] = []

    def made(http: httpx.Client, key: str) -> str:
        """Create with ``key`` until it answers with a machine; its id."""
        deadline = time.monotonic() + 30
        while True:
            r = create(http, app, "syd", key=key)
            if r.status_code in (200, 201):
                return str(r.json()["id"])
            # A lost offer (TCP retransmits after 200 ms or more, past the 0.3 s the broker
            # gathers offers) is a refusal saying so; a lost claim reply a 503.
            error = r.json()
            assert (r.status_code, error["status"]) in (
                (409, "insufficient_capacity"),
                (503, "unavailable"),
            ), r.text
            assert r.status_code == 503 or "region syd" in error["error"], r.text
            refusals.append(error["error"])
            assert time.monotonic() < deadline, f"no success within 30 s: {refusals[-3:]}"

    try:
        with hosts.client() as http:
            ids = {}
            for key in [uuid.uuid4().hex for _ in range(4)]:
                ids[key] = made(http, key)
                assert made(http, key) == ids[key]  # the same key: the same machine
            assert set(agent_rows(syd[0], app)) == set(ids.values())
            wait_until(
                lambda: converged(hosts, http, app), timeout=15, message="the list to converge"
            )
            assert len(listed(http, app)[0]) == len(ids)
            assert len(refusals) < 40  # retries help: the link is lossy, not cut
    finally:
        hosts.network.unshape()


def _ip(*args: str) -> str:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=True).stdout


def test_sweep_removes_what_a_crashed_run_left() -> None:
    reason = missing()
    if reason is not None:
        pytest.skip(f"hosts as network namespaces: {reason}")
    # A run "crashes": its process dies with its namespaces, links and a process in them left.
    code = (
        "import sys, subprocess; from souq.netns import Network;"
        "n = Network(2).start(); h = n.hosts[0];"
        "subprocess.Popen(['ip', 'netns', 'exec', h.namespace, 'sleep', '600'],"
        " stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL);"
        "print(n.tag, h.namespace, n.bridge, flush=True)"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env
    )
    tag, namespace, bridge = out.stdout.split()
    assert namespace in _ip("netns", "list")
    removed = sweep()
    assert namespace in removed
    assert bridge in removed
    assert namespace not in _ip("netns", "list")
    assert f"sq{tag}" not in _ip("-o", "link")
    # and a network made now starts clean
    with Network(1) as net:
        host = net.hosts[0]
        assert host.exec("ip", "-o", "addr", "show", "eth0").count(host.address) == 1
