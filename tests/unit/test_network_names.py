"""The ``.internal`` names, answered by the pure index from a fake snapshot of machines."""

from __future__ import annotations

import pytest

from souq.network.addresses import flycast_ip, network_of
from souq.network.names import NameIndex, NameRow, Rcode, Scope, is_internal

OTHER = Scope("acme")
OURS = Scope("personal")


def row(
    mid: str,
    app: str = "web",
    region: str = "mad",
    *,
    state: str = "started",
    healthy: bool = True,
    ip: str | None = None,
    created: str = "",
    scope: Scope = OURS,
    network: str = "",
) -> NameRow:
    return NameRow(
        machine_id=mid,
        app=app,
        region=region,
        state=state,
        healthy=healthy,
        private_ip=ip if ip is not None else f"fdaa::{mid}",
        created_at=created or f"2026-01-01T00:00:0{len(mid) % 10}",
        scope=scope,
        network=network,
    )


def aaaa(index: NameIndex, name: str, asker: str | None = None) -> list[str]:
    answer = index.resolve(name, "AAAA", asker=asker)
    assert answer.rcode is Rcode.NOERROR, (name, answer)
    return list(answer.values)


def snapshot(*rows: NameRow, regions: tuple[str, ...] = ()) -> NameIndex:
    index = NameIndex(nearby={"mad": ["lhr"]}, regions=regions)
    for r in rows:
        index.put(r)
    return index


def test_app_name_lists_started_machines_healthy_first_oldest_first() -> None:
    index = snapshot(
        row("a1", created="2026-01-01T00:00:01", healthy=False),
        row("a2", created="2026-01-01T00:00:02"),
        row("a3", created="2026-01-01T00:00:03"),
        row("a4", state="stopped"),
        row("b1", app="db"),
    )
    assert aaaa(index, "web.internal") == ["fdaa::a2", "fdaa::a3", "fdaa::a1"]
    assert aaaa(index, "db.internal") == ["fdaa::b1"]


def test_region_and_machine_names() -> None:
    index = snapshot(
        row("a1"), row("a2", region="lhr"), row("a3", state="stopped"), regions=("ord",)
    )
    assert aaaa(index, "mad.web.internal") == ["fdaa::a1"]
    assert aaaa(index, "lhr.web.internal") == ["fdaa::a2"]
    assert aaaa(index, "ord.web.internal") == []  # a region Souq knows, nothing of web there
    assert index.resolve("xyz.web.internal", "AAAA").rcode is Rcode.NXDOMAIN
    assert aaaa(index, "a2.vm.web.internal") == ["fdaa::a2"]
    assert aaaa(index, "a3.vm.web.internal") == []  # stopped: the name exists, no address
    assert index.resolve("zz.vm.web.internal", "AAAA").rcode is Rcode.NXDOMAIN
    assert index.resolve("a1.vm.db.internal", "AAAA").rcode is Rcode.NXDOMAIN


def test_txt_names() -> None:
    index = snapshot(row("a1"), row("a2", region="lhr"), row("b1", app="db"))
    assert index.resolve("_apps.internal", "TXT").values == ("db,web",)
    assert index.resolve("vms.web.internal", "TXT").values == ("a1 mad,a2 lhr",)
    assert index.resolve("regions.web.internal", "TXT").values == ("lhr,mad",)
    many = snapshot(*(row(f"m{i}", app=f"app-{i:03d}-{'x' * 40}") for i in range(20)))
    parts = many.resolve("_apps.internal", "TXT").values
    assert len(parts) > 1 and all(len(p) <= 255 for p in parts)
    assert "".join(parts).split(",") == sorted(f"app-{i:03d}-{'x' * 40}" for i in range(20))


def test_a_stopped_or_removed_machine_leaves_and_a_new_one_joins() -> None:
    index = snapshot(row("a1"), row("a2"))
    assert aaaa(index, "web.internal") == ["fdaa::a1", "fdaa::a2"]
    index.put(row("a1", state="stopping"))
    assert aaaa(index, "web.internal") == ["fdaa::a2"]
    index.remove("a2")
    assert aaaa(index, "web.internal") == []  # a1 is still there, stopped: NOERROR
    index.remove("a1")
    assert index.resolve("web.internal", "AAAA").rcode is Rcode.NXDOMAIN
    index.put(row("a9"))
    assert aaaa(index, "web.internal") == ["fdaa::a9"]
    assert index.resolve("_apps.internal", "TXT").values == ("web",)


def test_health_moves_a_machine_back_and_forth() -> None:
    index = snapshot(row("a1", created="1"), row("a2", created="2"))
    assert aaaa(index, "web.internal") == ["fdaa::a1", "fdaa::a2"]
    index.put(row("a1", created="1", healthy=False))
    assert aaaa(index, "web.internal") == ["fdaa::a2", "fdaa::a1"]


def test_machines_without_a_private_address_are_in_no_answer() -> None:
    index = NameIndex()
    index.put(NameRow("a1", "web", "mad", "started", True, None))
    assert aaaa(index, "web.internal") == []
    assert aaaa(index, "a1.vm.web.internal") == []


def test_nearest_takes_the_askers_region_then_the_near_ones_then_the_rest() -> None:
    index = snapshot(
        row("s1", region="syd", created="1"),
        row("o1", region="ord", created="1"),
        row("l1", region="lhr", created="1"),
        row("m1", region="mad", created="2"),
        row("m2", region="mad", created="1", healthy=False),
        row("m3", region="mad", created="3"),
        row("me", app="client", region="mad"),
        row("you", app="client", region="syd"),
    )
    from_mad = "fdaa::me"
    assert aaaa(index, "top1.nearest.of.web.internal", from_mad) == ["fdaa::m1"]
    assert aaaa(index, "top3.nearest.of.web.internal", from_mad) == [
        "fdaa::m1",
        "fdaa::m3",
        "fdaa::m2",
    ]
    # then lhr (told near mad), then the rest by name: ord, syd
    assert aaaa(index, "top9.nearest.of.web.internal", from_mad)[3:] == [
        "fdaa::l1",
        "fdaa::o1",
        "fdaa::s1",
    ]
    assert aaaa(index, "top2.nearest.of.web.internal", "fdaa::you") == ["fdaa::s1", "fdaa::l1"]
    # an asker that is no machine: regions by name
    assert aaaa(index, "top1.nearest.of.web.internal") == ["fdaa::l1"]
    for bad in ("top0", "topx", "top01", "top"):
        name = f"{bad}.nearest.of.web.internal"
        assert index.resolve(name, "AAAA").rcode is Rcode.NXDOMAIN, bad


@pytest.mark.parametrize(
    "name",
    [
        "nope.internal",
        "a.b.c.web.internal",
        "x.nearest.of.web.internal",
        "a1.vm.nope.internal",
        "top1.nearest.of.nope.internal",
    ],
)
def test_unknown_names_are_nxdomain(name: str) -> None:
    index = snapshot(row("a1"))
    assert index.resolve(name, "AAAA").rcode is Rcode.NXDOMAIN


def test_a_known_name_of_another_type_is_empty_not_nxdomain() -> None:
    index = snapshot(row("a1"))
    for name in ("web.internal", "mad.web.internal", "a1.vm.web.internal", "_apps.internal"):
        for rdtype in ("A", "MX"):
            answer = index.resolve(name, rdtype)
            assert answer.rcode is Rcode.NOERROR and answer.empty, (name, rdtype)
    assert index.resolve("web.internal", "TXT").empty
    assert index.resolve("internal", "SOA").rcode is Rcode.NOERROR
    assert index.resolve("nope.internal", "A").rcode is Rcode.NXDOMAIN
    assert index.resolve("web.internal", "ANY").values == ("fdaa::a1",)


def test_an_asker_sees_only_its_own_network() -> None:
    index = snapshot(
        row("a1"),
        row("me", app="client"),
        row("x1", app="secret", scope=OTHER),
        row("x2", app="peer", scope=OTHER),
    )
    ours, theirs = "fdaa::me", "fdaa::x2"
    assert index.resolve("_apps.internal", "TXT", asker=ours).values == ("client,web",)
    assert index.resolve("_apps.internal", "TXT", asker=theirs).values == ("peer,secret",)
    assert index.resolve("secret.internal", "AAAA", asker=ours).rcode is Rcode.NXDOMAIN
    assert index.resolve("x1.vm.secret.internal", "AAAA", asker=ours).rcode is Rcode.NXDOMAIN
    assert aaaa(index, "secret.internal", theirs) == ["fdaa::x1"]
    assert index.resolve("web.internal", "AAAA", asker=theirs).rcode is Rcode.NXDOMAIN
    # an asker the index does not know (the worker itself) sees every network
    assert index.resolve("_apps.internal", "TXT").values == ("client,peer,secret,web",)
    # a machine that leaves is no longer known by its address
    index.remove("me")
    assert index.asker(ours) is None


def test_an_address_taken_over_by_a_new_machine_names_the_new_one() -> None:
    index = snapshot(row("a1", ip="fdaa::1"))
    index.put(row("b1", app="db", ip="fdaa::1", scope=OTHER))
    index.remove("a1")
    asker = index.asker("fdaa::1")
    assert asker is not None and asker.machine_id == "b1"


def test_only_an_ipv6_private_ip_is_an_address() -> None:
    from souq.network.name_feed import private_address

    assert private_address("fdaa:0000:0:1::0001") == "fdaa:0:0:1::1"
    for none in (None, "", "127.0.0.1", "not an address"):
        assert private_address(none) is None


def test_an_apps_record_moves_its_machines_to_its_network() -> None:
    from souq.model.app import AppRecord
    from souq.network.app_networks import AppNetworks
    from souq.network.name_feed import NameFeed

    index = snapshot(row("a1"), row("me", app="client"))
    feed = NameFeed(index, lambda _: None)
    changed: list[str] = []

    def on_change(app: str) -> None:
        changed.append(app)
        feed.app_changed(app)

    networks = AppNetworks(None, on_change=on_change)  # type: ignore[arg-type]
    feed.scope_of = networks.scope_of
    record = AppRecord(name="web", id="x", network="blue", created_at="2026-01-01T00:00:00Z")
    networks.apply("web", record.model_dump_json().encode())
    assert changed == ["web"] and networks.scope_of("web") == Scope("personal", "blue")
    assert index.resolve("web.internal", "AAAA", asker="fdaa::me").rcode is Rcode.NXDOMAIN
    networks.apply("web", record.model_dump_json().encode())  # the same again: no change
    networks.apply("web", b"not json")  # unreadable: kept as it was
    assert changed == ["web"]
    networks.apply("web", None)  # deleted: back on the default network
    assert aaaa(index, "web.internal", "fdaa::me") == ["fdaa::a1"]


def test_a_record_the_names_cannot_read_leaves_its_row_as_it_was(
    caplog: pytest.LogCaptureFixture,
) -> None:
    from souq.network.name_feed import NameFeed

    def unreadable(machine_id: str) -> None:
        raise ValueError("a field this worker does not know")

    index = snapshot(row("a1"))
    feed = NameFeed(index, unreadable)
    with caplog.at_level("WARNING", logger="souq.network.name_feed"):
        feed.changed("a1")
    assert feed.changes == 0 and aaaa(index, "web.internal", "fdaa::me") == ["fdaa::a1"]
    assert "the names cannot read machine a1: a field" in caplog.text


def test_an_apps_flycast_name_is_its_flycast_address_started_or_not() -> None:
    index = snapshot(
        row("a1", state="stopped"), row("me", app="client"), row("x1", app="secret", scope=OTHER)
    )
    web = flycast_ip(network_of("personal"), "web")
    assert aaaa(index, "web.flycast", "fdaa::me") == [web]
    assert aaaa(index, "secret.flycast") == [flycast_ip(network_of("acme"), "secret")]
    # another network's app does not exist for the asker; nor does an unknown app or form
    assert index.resolve("secret.flycast", "AAAA", asker="fdaa::me").rcode is Rcode.NXDOMAIN
    for name in ("nosuch.flycast", "a1.web.flycast"):
        assert index.resolve(name, "AAAA").rcode is Rcode.NXDOMAIN
    assert index.resolve("web.flycast", "A").values == ()
    assert is_internal("web.flycast") and not is_internal("web.flycastx")


def test_an_apps_flycast_address_is_on_the_network_its_machines_records_name() -> None:
    # The apps' records (the scopes) not in yet: every machine on the default scope, while
    # each record names the network its claim put it on, which the worker routes.
    acme, other = network_of("acme"), network_of("other")
    index = snapshot(
        row("a1", state="stopped", network=acme),
        row("me", app="client", network=acme),
        row("x1", app="secret", network=other),
    )
    assert aaaa(index, "web.flycast", "fdaa::me") == [flycast_ip(acme, "web")]
    assert aaaa(index, "web.flycast") == [flycast_ip(acme, "web")]
    # Another network's app, by the records, does not exist for the asker, whatever the scopes
    for name in ("secret.flycast", "secret.internal", "x1.vm.secret.internal"):
        assert index.resolve(name, "AAAA", asker="fdaa::me").rcode is Rcode.NXDOMAIN
    assert index.resolve("_apps.internal", "TXT", asker="fdaa::me").values == ("client,web",)
    assert index.resolve("_apps.internal", "TXT", asker="fdaa::x1").values == ("secret",)
    # A machine whose record names none (no private network) leaves it to the scope.
    index.put(row("b1", app="db"))
    assert aaaa(index, "db.flycast", "fdaa::me") == [flycast_ip(network_of("personal"), "db")]
