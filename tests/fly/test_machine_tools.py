"""``Exec``, ``GetProcesses``, ``Cordon``, ``Uncordon`` and the metadata calls of flaps, sent
as it sends them and read into ``MachineExecResponse``, ``[]ProcessStat`` and
``map[string]string``."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

from souq.testing import wait_until
from tests.fly.conftest import fly_error, ok
from tests.fly.decode import GoDecoder
from tests.fly.flaps import Flaps, exec_request, machine_config, machine_init
from tests.integration.services_harness import ECHO

Started = Callable[..., dict[str, Any]]
ECHO_APP = machine_config(env={"PORT": "8080"}, init=machine_init(cmd=[sys.executable, ECHO]))


def test_exec(flaps: Flaps, go: GoDecoder, app: str, started: Started) -> None:
    m = started()
    given = exec_request(cmd="sh -c 'echo out; echo err >&2; cat; exit 3'", stdin="fed\n")
    r = ok(flaps.exec(app, m["id"], given))
    assert r.request.content == (
        b'{"cmd":"sh -c \'echo out; echo err \\u003e\\u00262; cat; exit 3\'","stdin":"fed\\n"}'
    )
    got = go.decode("exec", r)
    assert got == {"exit_code": 3, "stdout": "out\nfed\n", "stderr": "err\n"}
    r = ok(flaps.exec(app, m["id"], exec_request(cmd="echo hi", timeout=5)))
    assert go.decode("exec", r) == {"stdout": "hi\n"}  # exit_code 0: omitted, as Go does
    # Past its timeout (whole seconds): killed, 408.
    r = flaps.exec(app, m["id"], exec_request(cmd="sleep 30", timeout=1))
    fly_error(go, r, 408, "timeout")


def test_get_processes(flaps: Flaps, go: GoDecoder, app: str, started: Started) -> None:
    m = started(ECHO_APP)
    r = ok(flaps.get_processes(app, m["id"]))
    assert r.request.url.raw_path.decode().endswith(f"/{m['id']}/ps")
    processes = go.decode("ps", r)
    assert processes and ECHO in processes[0]["command"]
    assert processes[0]["pid"] > 0 and processes[0]["rss"] > 0 and processes[0]["directory"]

    def listening() -> list[dict[str, str]]:
        listed = go.decode("ps", ok(flaps.get_processes(app, m["id"])))
        return [s for p in listed for s in p.get("listen_sockets") or []]

    wait_until(listening, message="the echo app listening, as ps sees it")
    assert all(s["proto"] in ("tcp", "tcp6") and ":" in s["address"] for s in listening())


def test_cordon_and_uncordon(flaps: Flaps, go: GoDecoder, app: str, started: Started) -> None:
    m = started()
    r = ok(flaps.cordon(app, m["id"]))
    assert r.request.url.raw_path.decode().endswith(f"/{m['id']}/cordon")
    assert not r.request.content and "content-type" not in r.request.headers
    held = go.decode("machine", ok(flaps.get(app, m["id"])))
    assert held["cordoned"] is True and held["state"] == "started"
    assert held["instance_id"] == m["instance_id"]
    r = ok(flaps.uncordon(app, m["id"]))
    assert r.request.url.raw_path.decode().endswith(f"/{m['id']}/uncordon")
    assert go.decode("machine", ok(flaps.get(app, m["id"])))["cordoned"] is False


def test_metadata(flaps: Flaps, go: GoDecoder, app: str, started: Started) -> None:
    m = started()
    r = ok(flaps.set_metadata(app, m["id"], "role", "primary"))
    assert r.request.url.raw_path.decode().endswith(f"/{m['id']}/metadata/role")
    assert r.request.content == b'{"value":"primary"}'
    r = ok(flaps.get_metadata(app, m["id"]))
    assert go.decode("metadata", r) == {"role": "primary"}
    r = ok(flaps.delete_metadata(app, m["id"], "role"))
    assert r.request.method == "DELETE" and not r.request.content
    assert go.decode("metadata", ok(flaps.get_metadata(app, m["id"]))) == {}
    held = go.decode("machine", ok(flaps.get(app, m["id"])))
    assert held["instance_id"] == m["instance_id"]  # no new version, no restart
