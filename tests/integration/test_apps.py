"""The app resource on a real cluster (NATS with JetStream, a broker, an agent), driven with the
requests a Fly Machines-API client builds (method, path, ``?wait=true``, a JSON body with all
four keys, ``Authorization: Bearer``) and its answers decoded as such a client does (Go's
``encoding/json`` into the API's types, when a Go toolchain is here; JSON types checked always);
and through ``souq apps``."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx

from souq.model import MachineState
from souq.testing import Cluster, wait_until
from tests.clusters import ClusterSpec

GO_DECODER = Path(__file__).parents[1] / "fly" / "fly_decode.go"
SLEEPER = {"region": "mad", "config": {"cmd": ["sleep", "600"]}}
INT32_MAX = 2**31 - 1


CLUSTER = ClusterSpec("apps", regions={"mad": 1})


def fly(cluster: Cluster, token: str | None = None) -> httpx.Client:
    """An HTTP client that sends what Fly's Go client sends."""
    token = token or (cluster.auth.admin() if cluster.auth else "")
    headers = {"User-Agent": "fly-go/0.0.0", "Authorization": f"Bearer {token}"}
    return httpx.Client(base_url=cluster.api_url, headers=headers, timeout=60)


def create_body(name: str, org: str = "personal") -> dict[str, str]:
    return {"name": name, "org_slug": org, "network": "", "app_role_id": ""}


def is_int(value: Any, bound: int | None = None) -> bool:
    ok = isinstance(value, int) and not isinstance(value, bool)
    return ok and (bound is None or 0 <= value <= bound)


def assert_fly_app(app: dict[str, Any]) -> None:
    """Every field Fly's ``App`` has, with the JSON type its Go field takes."""
    for key in ("id", "name", "network", "status", "cname_target", "app_role"):
        assert isinstance(app[key], str), key
    assert is_int(app["internal_numeric_id"], INT32_MAX)
    assert is_int(app["machine_count"]) and is_int(app["volume_count"])
    org = app["organization"]
    assert isinstance(org["name"], str) and isinstance(org["slug"], str)
    assert is_int(org["internal_numeric_id"], INT32_MAX)


def go_decodes(kind: str, body: str) -> str:
    """What Go's ``encoding/json`` makes of ``body`` (``ok …`` or ``error: …``)."""
    if shutil.which("go") is None:
        return "ok (no Go toolchain here)"
    line = json.dumps({"kind": kind, "body": body})
    done = subprocess.run(
        ["go", "run", str(GO_DECODER)],
        input=line + "\n",
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    return done.stdout.strip()


def assert_error(r: httpx.Response, http_status: int, status: str, *names: str) -> None:
    assert r.status_code == http_status, r.text
    body = r.json()
    assert body["status"] == status and isinstance(body["error"], str)
    for name in names:
        assert name in body["error"], body
    assert go_decodes("error_status", r.text).startswith("ok")


def test_create_show_list_as_a_fly_client_does(cluster: Cluster) -> None:
    with fly(cluster) as c:
        assert_error(c.get("/v1/apps/fresh"), 404, "not_found", "fresh")  # the name is free
        made = c.post("/v1/apps?wait=true", json=create_body("fresh"))
        assert made.status_code == 201, made.text
        app = made.json()
        assert_fly_app(app)
        assert (app["name"], app["status"], app["machine_count"]) == ("fresh", "pending", 0)
        assert app["organization"]["slug"] == "personal" and app["explicit"] is True
        assert len(app["id"]) == 16 and app["created_at"]
        decoded = go_decodes("app", made.text)
        assert decoded.startswith("ok") and (
            '"internal_numeric_id"' in decoded or "no Go" in decoded
        )

        shown = c.get("/v1/apps/fresh")
        assert shown.status_code == 200 and shown.json() == app  # and not free any more
        again = c.post("/v1/apps?wait=true", json=create_body("fresh", "acme"))
        assert_error(again, 409, "name_taken", "fresh")

        # Empty strings, as Fly's client sends them when unset: the org defaults to personal.
        blank = c.post("/v1/apps?wait=true", json=create_body("blank-org", ""))
        assert blank.status_code == 201 and blank.json()["organization"]["slug"] == "personal"
        other = c.post("/v1/apps?wait=true", json=create_body("in-acme", "acme"))
        assert other.status_code == 201 and other.json()["organization"]["slug"] == "acme"

        listed = c.get("/v1/apps", params={"org_slug": "personal"})
        assert listed.status_code == 200
        assert go_decodes("apps", listed.text).startswith("ok")
        names = [a["name"] for a in listed.json()["apps"]]
        assert "fresh" in names and "blank-org" in names and "in-acme" not in names
        for a in listed.json()["apps"]:
            assert_fly_app(a)
        acme = c.get("/v1/apps", params={"org_slug": "acme", "app_role": ""}).json()["apps"]
        assert [a["name"] for a in acme] == ["in-acme"]
        assert c.get("/v1/apps", params={"org_slug": "acme", "app_role": "x"}).json() == {
            "apps": []
        }


def test_bad_bodies_name_what_to_fix(cluster: Cluster) -> None:
    with fly(cluster) as c:
        bad = c.post("/v1/apps?wait=true", json=create_body("Not_Valid"))
        assert_error(bad, 422, "invalid_input", "Not_Valid")
        empty = c.post("/v1/apps?wait=true", json=create_body(""))
        assert_error(empty, 422, "invalid_input", "name")
        typo = c.post("/v1/apps", json={**create_body("typo"), "orgslug": "x"})
        assert_error(typo, 422, "invalid_input", "orgslug")
        assert_error(c.get("/v1/apps/Bad_Name"), 422, "invalid_input", "Bad_Name")


def test_flys_reference_body_creates_the_app(cluster: Cluster) -> None:
    """Fly's Machines API reference: ``{"app_name", "org_slug", "network"?}``, answered ``201``
    with the app, which GET then shows and DELETE destroys. ``name`` beside it must agree."""
    with fly(cluster) as c:
        body = {"app_name": "by-app-name", "org_slug": "acme", "network": "net-a"}
        made = c.post("/v1/apps", json=body)
        assert made.status_code == 201, made.text
        app = made.json()
        assert_fly_app(app)
        assert (app["name"], app["organization"]["slug"], app["network"]) == (
            "by-app-name",
            "acme",
            "net-a",
        )
        got = c.get("/v1/apps/by-app-name")
        assert got.status_code == 200 and got.json()["id"] == app["id"], got.text
        taken = c.post("/v1/apps", json={"app_name": "by-app-name", "org_slug": "personal"})
        assert_error(taken, 409, "name_taken", "by-app-name")
        gone = c.delete("/v1/apps/by-app-name")
        assert gone.json() == {"name": "by-app-name", "destroyed_machines": []}, gone.text
        assert_error(c.get("/v1/apps/by-app-name"), 404, "not_found", "by-app-name")
        both = c.post("/v1/apps", json={"name": "both-same", "app_name": "both-same"})
        assert both.status_code == 201 and both.json()["organization"]["slug"] == "personal"
        differ = c.post("/v1/apps", json={"name": "one", "app_name": "other"})
        assert_error(differ, 422, "invalid_input", "app_name")
        assert_error(c.get("/v1/apps/one"), 404, "not_found", "one")
        bad = c.post("/v1/apps", json={"app_name": "Not_Valid", "org_slug": "personal"})
        assert_error(bad, 422, "invalid_input", "app_name")
        assert_error(c.post("/v1/apps", json={"org_slug": "acme"}), 422, "invalid_input", "name")


def test_an_app_with_machines_exists_without_a_create(cluster: Cluster) -> None:
    client = cluster.client()
    m = client.create_machine("implicit", "mad", SLEEPER["config"])
    client.wait("implicit", m.id, MachineState.STARTED)
    with fly(cluster) as c:
        found = c.get("/v1/apps/implicit")
        assert found.status_code == 200, found.text
        app = found.json()
        assert_fly_app(app)
        assert (app["status"], app["machine_count"], app["explicit"]) == ("deployed", 1, False)
        assert (app["id"], app["created_at"], app["regions"]) == ("implicit", None, ["mad"])
        assert_error(
            c.post("/v1/apps", json=create_body("implicit")), 409, "name_taken", "implicit"
        )
        wait_until(
            lambda: "implicit" in [a["name"] for a in c.get("/v1/apps").json()["apps"]],
            message="the implicit app in the list",
        )
    client.stop("implicit", m.id)
    client.wait("implicit", m.id, MachineState.STOPPED)
    assert client.get_app("implicit").status == "suspended"  # machines, none running
    client.destroy("implicit", m.id)
    with fly(cluster) as c:
        wait_until(lambda: c.get("/v1/apps/implicit").status_code == 404, message="a free name")


def test_delete_destroys_the_app_and_its_machines(cluster: Cluster) -> None:
    client = cluster.client()
    client.create_app("doomed")
    machines = [client.create_machine("doomed", "mad", SLEEPER["config"]) for _ in range(2)]
    for m in machines:
        client.wait("doomed", m.id, MachineState.STARTED)
    with fly(cluster) as c:
        gone = c.delete("/v1/apps/doomed")
        assert gone.status_code == 200, gone.text
        assert sorted(gone.json()["destroyed_machines"]) == sorted(m.id for m in machines)
        for m in machines:
            assert client.get_machine("doomed", m.id).state == MachineState.DESTROYED
        assert_error(c.get("/v1/apps/doomed"), 404, "not_found", "doomed")
        assert_error(c.delete("/v1/apps/doomed"), 404, "not_found", "doomed")
        again = c.post("/v1/apps?wait=true", json=create_body("doomed"))  # the name is free
        assert again.status_code == 201 and again.json()["machine_count"] == 0
        assert c.delete("/v1/apps/doomed").json() == {"name": "doomed", "destroyed_machines": []}


def test_an_app_token_creates_and_sees_its_app_only(cluster: Cluster) -> None:
    with cluster.client() as admin:
        token = admin.create_token(app="mine", scope="write", name="mine-ci").token
        reader = admin.create_token(app="mine", scope="read").token
    assert token and reader
    with fly(cluster, token) as c:
        assert_error(c.post("/v1/apps", json=create_body("theirs")), 403, "forbidden", "theirs")
        assert c.post("/v1/apps?wait=true", json=create_body("mine")).status_code == 201
        assert [a["name"] for a in c.get("/v1/apps").json()["apps"]] == ["mine"]
        assert c.get("/v1/apps/fresh").status_code == 403
    with fly(cluster, reader) as c:
        assert c.get("/v1/apps/mine").status_code == 200
        assert_error(c.post("/v1/apps", json=create_body("mine")), 403, "forbidden")
        assert_error(c.delete("/v1/apps/mine"), 403, "forbidden", "mine")
    with cluster.client() as admin:
        entries = wait_until(
            lambda: [e for e in admin.audit(app="mine") if e.method == "POST"],
            timeout=10,
            message="the create's audit entry",
        )
        assert any(e.path == "/v1/apps" and e.status == 201 for e in entries)
        assert any(e.token_name == "mine-ci" for e in entries)


def test_cli_create_show_list_destroy(cluster: Cluster) -> None:
    env = {**os.environ, "SOUQ_API": cluster.api_url}
    souq = [sys.executable, "-m", "souq", "apps"]

    def run(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*souq, *args], env=env, capture_output=True, text=True, check=check, timeout=120
        )

    made = json.loads(run("create", "by-cli", "--org", "acme", "--json").stdout)
    assert (made["name"], made["organization"]["slug"]) == ("by-cli", "acme")
    taken = run("create", "by-cli", check=False)
    assert taken.returncode == 1 and "by-cli" in taken.stderr and "taken" in taken.stderr
    shown = run("show", "by-cli").stdout
    assert "by-cli" in shown and "pending" in shown and "acme" in shown
    listed = json.loads(run("list", "--org", "acme", "--json").stdout)
    assert "by-cli" in [a["name"] for a in listed]
    assert "by-cli" in run("list").stdout
    assert "destroyed app by-cli" in run("destroy", "by-cli", "--yes").stdout
    missing = run("show", "by-cli", check=False)
    assert missing.returncode == 1 and "no app named by-cli" in missing.stderr
