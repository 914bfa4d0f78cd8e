"""The dashboard in a real browser: Debian's chromium, driven by playwright-core from npm
(``tests/browser/package.json``; ``make browser-deps`` installs both, no browser download).

One page load each: a machine created through the API appears, its stop shows as ``stopped``,
and a click shows the placement winner; on a real cluster a batch job appears in the Jobs table,
and its cancel shows as ``cancelled``. Against a real cluster, the page uses whatever the
broker offers; against stand-in brokers with and without the event stream, it must follow the
stream, or poll. Skipped only when the tooling is missing and this user cannot install
it (not root); as root (CI) a missing tool is a failure.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from souq.testing import Cluster, auth_headers
from tests.clusters import ClusterSpec

from .stub_broker import running_stub

HERE = Path(__file__).parent
SCRIPT = HERE / "dashboard_check.mjs"


def _missing() -> list[str]:
    missing = [tool for tool in ("chromium", "node") if shutil.which(tool) is None]
    if not (HERE / "node_modules" / "playwright-core" / "package.json").exists():
        missing.append("tests/browser/node_modules (npm ci)")
    return missing


@pytest.fixture(scope="module")
def chromium() -> str:
    missing = _missing()
    if missing:
        message = f"browser tooling missing: {', '.join(missing)}; run `make browser-deps`"
        if os.geteuid() == 0:
            pytest.fail(message + " (root can install it, so this is not skipped)")
        pytest.skip(message)
    path = shutil.which("chromium")
    assert path is not None
    return path


CLUSTER = ClusterSpec("cluster", regions={"mad": 2}, needs=("chromium",))


def _iso(ms: int) -> str:
    """``ms`` as JavaScript's ``Date.toISOString`` writes it."""
    whole = datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%dT%H:%M:%S")
    return f"{whole}.{ms % 1000:03d}Z"


def check_dashboard(api: str, chromium: str, out: Path, *extra: str) -> dict[str, Any]:
    """Run dashboard_check.mjs against ``api``; what it saw, or a failure with its story."""
    args = ["node", str(SCRIPT), "--api", api, "--app", "web", "--region", "mad"]
    args += ["--out", str(out), "--chromium", chromium, *extra]
    if token := auth_headers().get("Authorization", "").removeprefix("Bearer "):
        args += ["--token", token]
    done = subprocess.run(args, cwd=HERE, capture_output=True, text=True, timeout=90, check=False)
    assert done.returncode == 0, f"{done.stderr}\n(screenshot: {out / 'failure.png'})"
    seen: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["stateText"] == "stopped"
    assert seen["winner"] == seen["winnerRow"]
    assert seen["notReloaded"] is True
    assert seen["pageErrors"] == []
    return seen


def test_dashboard_follows_a_machine_live(cluster: Cluster, chromium: str, tmp_path: Path) -> None:
    seen = check_dashboard(cluster.api_url, chromium, tmp_path, "--jobs")
    assert seen["jobState"] == "cancelled"
    assert seen["spotPrice"].startswith("0.01 (")  # the region's spot price: idle, at its floor

    machine = cluster.client().get_machine("web", seen["machine"])
    assert machine.state.value == "stopped"
    assert machine.placement is not None
    assert seen["winner"] == machine.placement.winner == machine.worker_id
    assert seen["mode"] in {"events", "polling"}
    if seen["mode"] == "events":  # each line is stamped with its event's own time
        with cluster.client() as client:
            stamps = {_iso(e.timestamp) for e in client.events("web", machine.id)}
        assert seen["feedTimes"] and set(seen["feedTimes"]) <= stamps, (seen["feedTimes"], stamps)


@pytest.mark.parametrize(("cluster_view", "mode"), [(True, "events"), (False, "polling")])
def test_dashboard_uses_the_event_stream_or_polls(
    chromium: str, tmp_path: Path, cluster_view: bool, mode: str
) -> None:
    """A stand-in broker with the cluster view's endpoints, and one from before them (no
    /v1/events, /v1/apps or /v1/regions): the page follows the stream, or polls."""
    with running_stub(cluster_view=cluster_view) as api:
        seen = check_dashboard(api, chromium, tmp_path, "--expect-mode", mode)
    assert seen["winner"] == "wb"
    assert seen["jobsHidden"] is True  # a broker without /sched: no Jobs table
    # Each line is stamped with when its change happened by the broker's clock, not the page's.
    times = seen["feedTimes"]
    assert times, seen
    assert all(t.startswith("2026-01-01T00:00:0") for t in times), times
