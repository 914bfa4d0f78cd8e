"""The secrets calls of flaps (``flaps_secrets.go``): ``UpdateAppSecrets``, ``SetAppSecret``,
``GetAppSecrets``, ``ListAppSecrets``, ``DeleteAppSecret``, read into fly-go's secrets types.
Values are never shown (``show_secrets=true`` is refused)."""

from __future__ import annotations

from tests.fly.conftest import fly_error, ok
from tests.fly.decode import GoDecoder
from tests.fly.flaps import Flaps


def test_update_app_secrets(flaps: Flaps, go: GoDecoder, app: str) -> None:
    r = ok(flaps.update_app_secrets(app, {"B": "2", "A": "1"}))
    assert r.request.url.raw_path.decode() == f"/v1/apps/{app}/secrets"
    assert r.request.content == b'{"values":{"A":"1","B":"2"}}'
    first = go.decode("secrets_update", r)
    assert [s["name"] for s in first["secrets"]] == ["A", "B"] and first["version"] > 0
    assert all("value" not in s and s["digest"] for s in first["secrets"])
    r = ok(flaps.update_app_secrets(app, {"A": None, "C": "3"}))  # null unsets
    assert r.request.content == b'{"values":{"A":null,"C":"3"}}'
    second = go.decode("secrets_update", r)
    assert [s["name"] for s in second["secrets"]] == ["B", "C"]
    assert second["version"] > first["version"]


def test_set_and_get_app_secret(flaps: Flaps, go: GoDecoder, app: str) -> None:
    r = ok(flaps.set_app_secret(app, "TOKEN", "s3cret"))
    assert r.request.url.raw_path.decode() == f"/v1/apps/{app}/secrets/TOKEN"
    assert r.request.content == b'{"value":"s3cret"}'
    set_ = go.decode("secret_set", r)
    assert set_["name"] == "TOKEN" and set_["version"] > 0 and "value" not in set_
    r = ok(flaps.get_app_secrets(app, "TOKEN"))
    got = go.decode("secret", r)
    assert got["name"] == "TOKEN" and got["digest"] == set_["digest"]
    r = ok(flaps.get_app_secrets(app, "TOKEN", version=set_["version"]))
    assert r.request.url.raw_path.decode().endswith(f"/TOKEN?version={set_['version']}")
    fly_error(go, flaps.get_app_secrets(app, "NOPE"), 404, "not_found")


def test_list_app_secrets(flaps: Flaps, go: GoDecoder, app: str) -> None:
    version = go.decode("secrets_update", ok(flaps.update_app_secrets(app, {"A": "1"})))["version"]
    r = ok(flaps.list_app_secrets(app))
    assert [s["name"] for s in go.decode("secrets", r)["secrets"]] == ["A"]
    r = ok(flaps.list_app_secrets(app, version=version))
    assert r.request.url.raw_path.decode().endswith(f"/secrets?version={version}")
    assert [s["name"] for s in go.decode("secrets", r)["secrets"]] == ["A"]
    fly_error(go, flaps.list_app_secrets(app, version=version + 99), 404, "not_found")
    r = flaps.list_app_secrets(app, show_secrets=True)
    assert r.request.url.raw_path.decode().endswith("/secrets?show_secrets=true")
    fly_error(go, r, 422, "invalid_input", "never shown")


def test_delete_app_secret(flaps: Flaps, go: GoDecoder, app: str) -> None:
    before = go.decode("secret_set", ok(flaps.set_app_secret(app, "GONE", "x")))["version"]
    r = ok(flaps.delete_app_secret(app, "GONE"))
    assert r.request.method == "DELETE" and not r.request.content
    assert go.decode("secret_delete", r)["version"] > before
    fly_error(go, flaps.get_app_secrets(app, "GONE"), 404, "not_found")
