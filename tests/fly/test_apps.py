"""The app calls of flaps (``flaps_apps.go``): ``CreateApp`` (and the older flaps' body, Fly's
Machines API reference's ``app_name``), ``GetApp``, ``ListApps``,
``DeleteApp``, and what ``AppNameAvailable``, ``WaitForApp`` and ``IsNameTakenError`` make of
the answers."""

from __future__ import annotations

from tests.fly.conftest import fly_error, ok
from tests.fly.decode import GoDecoder
from tests.fly.flaps import Flaps, launch_input, machine_config, machine_init


def test_create_app(flaps: Flaps, go: GoDecoder, app: str) -> None:
    r = ok(flaps.create_app(app, "personal"))
    assert r.request.url.raw_path.decode() == "/v1/apps?wait=true"
    assert r.request.content == (
        b'{"name":"%s","org_slug":"personal","network":"","app_role_id":""}' % app.encode()
    )
    made = go.decode("app", r)
    assert made["name"] == app and made["organization"]["slug"] == "personal"
    assert made["status"] == "pending" and made["id"]
    # The name again: IsNameTakenError reads the status code.
    fly_error(go, flaps.create_app(app, "acme"), 409, "name_taken", app)


def test_create_app_by_app_name(flaps: Flaps, go: GoDecoder, app: str) -> None:
    """The body of Fly's Machines API reference, as the older flaps sends it: the app is made
    (201, the app), then found and destroyed by its name."""
    r = flaps.create_app_by_app_name(app, "acme")
    assert r.request.url.raw_path.decode() == "/v1/apps"
    assert r.request.content == b'{"app_name":"%s","org_slug":"acme"}' % app.encode()
    assert r.status_code == 201, r.text
    made = go.decode("app", r)
    assert made["name"] == app and made["organization"]["slug"] == "acme"
    assert go.decode("app", ok(flaps.get_app(app)))["id"] == made["id"]
    ok(flaps.delete_app(app))
    fly_error(go, flaps.get_app(app), 404, "not_found")


def test_get_app(flaps: Flaps, go: GoDecoder, app: str) -> None:
    # AppNameAvailable: a 404 is a free name.
    r = flaps.get_app(app)
    assert r.request.url.raw_path.decode() == f"/v1/apps/{app}"
    fly_error(go, r, 404, "not_found")
    ok(flaps.create_app(app, "personal", network="net1"))
    got = go.decode("app", ok(flaps.get_app(app)))  # also WaitForApp's success
    assert got["name"] == app and got["network"] == "net1" and got["machine_count"] == 0
    config = machine_config(init=machine_init(exec=["sleep", "600"]))
    ok(flaps.launch(app, launch_input(config=config)))
    got = go.decode("app", ok(flaps.get_app(app)))
    assert got["machine_count"] == 1


def test_list_apps(flaps: Flaps, go: GoDecoder, app: str) -> None:
    ok(flaps.create_app(app, "acme", role="postgres_cluster"))
    ok(flaps.create_app(app + "-b", "acme"))
    r = ok(flaps.list_apps("acme"))
    assert r.request.url.raw_path.decode() == "/v1/apps?org_slug=acme"
    names = {a["name"] for a in go.decode("apps", r)["apps"]}
    assert {app, app + "-b"} <= names
    r = ok(flaps.list_apps("acme", "postgres_cluster"))
    assert r.request.url.raw_path.decode() == "/v1/apps?app_role=postgres_cluster&org_slug=acme"
    listed = go.decode("apps", r)["apps"]
    assert [a["name"] for a in listed] == [app] and listed[0]["app_role"] == "postgres_cluster"
    assert go.decode("apps", ok(flaps.list_apps("nobody")))["apps"] in ([], None)
    ok(flaps.delete_app(app + "-b"))


def test_delete_app(flaps: Flaps, go: GoDecoder, app: str) -> None:
    ok(flaps.create_app(app, "personal"))
    config = machine_config(init=machine_init(exec=["sleep", "600"]))
    ok(flaps.launch(app, launch_input(config=config)))
    r = ok(flaps.delete_app(app))
    assert (r.request.method, r.request.url.raw_path.decode()) == ("DELETE", f"/v1/apps/{app}")
    fly_error(go, flaps.get_app(app), 404, "not_found")  # the name is free again
    fly_error(go, flaps.delete_app(app), 404, "not_found")
