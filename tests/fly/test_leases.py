"""Leases as flaps takes them: ``AcquireLease`` (``?ttl=`` seconds, no body), ``FindLease``,
``RefreshLease`` and ``ReleaseLease`` (the nonce in ``fly-machine-lease-nonce``), and the
other calls' nonce header while a lease is held; answers read as ``MachineLease``."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from tests.fly.conftest import fly_error, ok
from tests.fly.decode import GoDecoder
from tests.fly.flaps import (
    NONCE_HEADER,
    Flaps,
    launch_input,
    machine_config,
    machine_init,
    stop_input,
)

Started = Callable[..., dict[str, Any]]


def lease_data(go: GoDecoder, r: Any) -> dict[str, Any]:
    lease = go.decode("lease", r)
    assert lease["status"] == "success", lease
    data: dict[str, Any] = lease["data"]
    assert data["nonce"] and data["version"] and data["expires_at"]
    return data


def test_acquire_lease(flaps: Flaps, go: GoDecoder, app: str, started: Started) -> None:
    m = started()
    before = time.time()
    r = ok(flaps.acquire_lease(app, m["id"], 60))
    assert r.request.url.raw_path.decode().endswith(f"/{m['id']}/lease?ttl=60")
    assert not r.request.content and NONCE_HEADER not in r.request.headers
    data = lease_data(go, r)
    assert before + 50 <= data["expires_at"] <= time.time() + 70  # seconds since the epoch
    # Held by another: 409 (flaps retries AcquireLease on it).
    fly_error(go, flaps.acquire_lease(app, m["id"], None), 409, "lease_held")
    # Without a ttl (flaps sends no query): the default.
    ok(flaps.release_lease(app, m["id"], data["nonce"]))
    r = ok(flaps.acquire_lease(app, m["id"], None))
    assert r.request.url.raw_path.decode().endswith("/lease")
    assert lease_data(go, r)["expires_at"] > time.time()


def test_find_lease(flaps: Flaps, go: GoDecoder, app: str, started: Started) -> None:
    m = started()
    fly_error(go, flaps.find_lease(app, m["id"]), 404, "not_found")  # none held
    nonce = lease_data(go, ok(flaps.acquire_lease(app, m["id"], 30)))["nonce"]
    r = ok(flaps.find_lease(app, m["id"]))
    assert r.request.method == "GET"
    assert lease_data(go, r)["nonce"] == nonce


def test_refresh_lease(flaps: Flaps, go: GoDecoder, app: str, started: Started) -> None:
    m = started()
    first = lease_data(go, ok(flaps.acquire_lease(app, m["id"], 10)))
    r = ok(flaps.refresh_lease(app, m["id"], 120, first["nonce"]))
    assert r.request.headers[NONCE_HEADER] == first["nonce"]
    again = lease_data(go, r)
    assert again["nonce"] == first["nonce"] and again["expires_at"] > first["expires_at"]
    fly_error(go, flaps.refresh_lease(app, m["id"], 60, "wrong"), 409, "lease_held")


def test_release_lease(flaps: Flaps, go: GoDecoder, app: str, started: Started) -> None:
    m = started()
    nonce = lease_data(go, ok(flaps.acquire_lease(app, m["id"], 60)))["nonce"]
    fly_error(go, flaps.release_lease(app, m["id"], "wrong"), 409, "lease_held")
    r = ok(flaps.release_lease(app, m["id"], nonce))
    assert r.request.method == "DELETE" and r.request.headers[NONCE_HEADER] == nonce
    fly_error(go, flaps.find_lease(app, m["id"]), 404, "not_found")


def test_the_nonce_header_of_the_other_calls(
    flaps: Flaps, go: GoDecoder, app: str, started: Started
) -> None:
    m = started()
    nonce = lease_data(go, ok(flaps.acquire_lease(app, m["id"], 60)))["nonce"]
    # Without it, a change is refused; with it (Fly's header), each call flaps sends it on.
    fly_error(go, flaps.stop(app, stop_input(id=m["id"])), 409, "lease_held")
    ok(flaps.stop(app, stop_input(id=m["id"]), nonce))
    ok(flaps.wait(app, m["id"], "stopped"))
    ok(flaps.start(app, m["id"], nonce))
    ok(flaps.wait(app, m["id"], "started"))
    ok(flaps.restart(app, m["id"], nonce=nonce))
    ok(flaps.wait(app, m["id"], "started"))
    ok(flaps.cordon(app, m["id"], nonce))
    ok(flaps.uncordon(app, m["id"], nonce))
    config = machine_config(init=machine_init(exec=["sleep", "601"]))
    updated = go.decode(
        "machine", ok(flaps.update(app, m["id"], launch_input(config=config), nonce))
    )
    ok(flaps.wait(app, m["id"], "started", version=updated["instance_id"]))
    ok(flaps.suspend(app, m["id"], nonce))
    ok(flaps.wait(app, m["id"], "suspended"))
    ok(flaps.destroy(app, m["id"], kill=True, nonce=nonce))
    ok(flaps.wait(app, m["id"], "destroyed"))


def test_launch_with_a_lease_ttl(flaps: Flaps, go: GoDecoder, app: str) -> None:
    config = machine_config(init=machine_init(exec=["sleep", "600"]))
    m = go.decode("machine", ok(flaps.launch(app, launch_input(config=config, lease_ttl=30))))
    assert m["nonce"]
    assert lease_data(go, ok(flaps.find_lease(app, m["id"])))["nonce"] == m["nonce"]
    ok(flaps.destroy(app, m["id"], kill=True, nonce=m["nonce"]))
