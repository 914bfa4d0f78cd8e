"""The app resource's pure parts: the create body Fly's clients send, the status Fly means,
the ids, and which names are free."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from souq.broker.app_routes import listed_apps
from souq.model.app import (
    DEFAULT_ORG,
    AppRecord,
    AppStatus,
    MachineCounts,
    NewApp,
    app_name_problem,
    app_of,
    app_status,
    numeric_id,
)
from souq.view import AppCount

FLY_BODY = '{"name":"web","org_slug":"","network":"","app_role_id":""}'  # every key, always


def record(name: str = "web", org: str = "personal", role: str = "") -> AppRecord:
    body = NewApp(name=name, org_slug=org, app_role_id=role)
    return AppRecord.new(body, app_id="a" * 16, created_at="2026-01-01T00:00:00.000Z")


def test_the_body_fly_clients_send_is_accepted_and_the_org_defaults() -> None:
    body = NewApp.model_validate_json(FLY_BODY)
    kept = AppRecord.new(body, app_id="x", created_at="t")
    assert (kept.org_slug, kept.network, kept.app_role) == (DEFAULT_ORG, "", "")


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ('{"name":"","org_slug":"","network":"","app_role_id":""}', "give the app's name"),
        ('{"name":"Web_1","org_slug":"","network":"","app_role_id":""}', "'Web_1' is not valid"),
        ('{"name":"web","org_slug":"Not A Slug","network":"","app_role_id":""}', "org slug"),
        ('{"name":"web","org":"x"}', "Extra inputs"),
        ('{"name":7}', "valid string"),
    ],
)
def test_a_bad_body_names_what_is_wrong(text: str, says: str) -> None:
    with pytest.raises(ValidationError, match=says):
        NewApp.model_validate_json(text)


def test_app_names_follow_the_machine_routes_rule() -> None:
    assert app_name_problem("web-1") is None
    assert app_name_problem("-web") is not None
    assert app_name_problem("a" * 64) is not None


def test_status_means_what_fly_means() -> None:
    assert app_status({}) is AppStatus.PENDING
    assert app_status({"destroyed": 3}) is AppStatus.PENDING
    assert app_status({"started": 1, "stopped": 2}) is AppStatus.DEPLOYED
    assert app_status({"starting": 1}) is AppStatus.DEPLOYED
    assert app_status({"stopped": 1, "suspended": 1}) is AppStatus.SUSPENDED
    assert app_status({"created": 1}) is AppStatus.SUSPENDED


def test_numeric_ids_are_stable_31_bit_integers() -> None:
    assert numeric_id("web") == numeric_id("web")
    assert all(0 <= numeric_id(n) < 2**31 for n in ("web", "personal", "x" * 63))


def test_counts_leave_destroyed_machines_out() -> None:
    counts = MachineCounts.of([("started", "mad"), ("destroyed", "ams"), ("stopped", "lhr")])
    assert (counts.machines, counts.states) == (2, {"started": 1, "stopped": 1})
    assert counts.regions == ["mad", "lhr"]


def test_a_name_is_free_only_without_a_record_and_without_machines() -> None:
    assert app_of("web", None, None) is None
    assert app_of("web", None, MachineCounts(machines=0)) is None
    implicit = app_of("web", None, MachineCounts(machines=1, states={"started": 1}))
    assert implicit is not None
    assert (implicit.id, implicit.explicit, implicit.created_at) == ("web", False, None)
    assert implicit.organization.slug == DEFAULT_ORG
    created = app_of("web", record(), None)
    assert created is not None and created.explicit and created.status is AppStatus.PENDING


def test_the_answer_has_fly_field_names_and_integer_types() -> None:
    app = app_of("web", record(org="acme"), MachineCounts(machines=2, states={"started": 2}))
    assert app is not None
    body = json.loads(app.model_dump_json())
    for key in ("machine_count", "volume_count", "internal_numeric_id"):
        assert type(body[key]) is int, key
    assert type(body["organization"]["internal_numeric_id"]) is int
    assert body["organization"]["slug"] == body["organization"]["name"] == "acme"
    assert (body["status"], body["cname_target"], body["app_role"]) == ("deployed", "", "")


def test_the_list_merges_records_and_machines_and_filters() -> None:
    counted = [AppCount(app="implicit", machines=1, states={"started": 1}, regions=["mad"])]
    records = [record("web"), record("db", org="acme", role="postgres_cluster")]
    assert [a.name for a in listed_apps(records, counted)] == ["db", "implicit", "web"]
    assert [a.name for a in listed_apps(records, counted, org_slug="personal")] == [
        "implicit",
        "web",
    ]
    assert [a.name for a in listed_apps(records, counted, role="postgres_cluster")] == ["db"]


def test_a_new_app_is_named_by_name_or_flys_app_name() -> None:
    assert NewApp.model_validate({"app_name": "web", "org_slug": "acme"}).app == "web"
    assert NewApp.model_validate({"name": "web", "app_name": "web"}).app == "web"
    assert NewApp.model_validate({"name": "web"}).app == "web"
    for body, field in (
        ({"name": "web", "app_name": "api"}, "differ"),
        ({"org_slug": "acme"}, "give the app's name"),
        ({"app_name": "Bad_Name"}, "Bad_Name"),
    ):
        with pytest.raises(ValidationError, match=field):
            NewApp.model_validate(body)
