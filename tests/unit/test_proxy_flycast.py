"""Which app and port a Flycast connection goes to (souq.proxy.flycast.FlycastApps), from
machine records: pure."""

from __future__ import annotations

from souq.model import Machine
from souq.network.addresses import AddressPool, flycast_ip, network_of
from souq.proxy.flycast import FlycastApps

ACME = network_of("acme")


def _machine(app: str, network: str, services: list[dict[str, object]]) -> Machine:
    address = AddressPool("w1").take(app + "m", network)
    return Machine.model_validate(
        {
            "id": app + "m",
            "name": app,
            "app": app,
            "region": "mad",
            "worker_id": "w1",
            "state": "stopped",
            "config": {"cmd": ["x"], "services": services},
            "created_at": "2026-01-01T00:00:00Z",
            "updated_at": "2026-01-01T00:00:00Z",
            "address": {
                "host": address.ip4,
                "private_ip": address.ip6,
                "ip4": address.ip4,
                "network": network,
            },
        }
    )


def test_an_edge_port_and_the_internal_port_reach_the_service() -> None:
    apps = FlycastApps()
    web = {"internal_port": 8080, "ports": [{"port": 80, "handlers": ["http"]}]}
    internal_only = {"internal_port": 5432, "ports": []}
    apps.note(_machine("web", ACME, [web, internal_only]))
    me = AddressPool("w2").take("client", ACME).ip6
    ip = flycast_ip(ACME, "web")
    assert apps.target(me, ip, 80) == ("web", 8080)
    assert apps.target(me, ip, 8080) == ("web", 8080)
    assert apps.target(me, ip, 5432) is None  # a service without edge ports: not Flycast's
    assert apps.target(me, flycast_ip(ACME, "nosuch"), 80) is None
    assert apps.refused == 2


def test_a_source_of_another_network_is_refused() -> None:
    apps = FlycastApps()
    apps.note(_machine("web", ACME, [{"internal_port": 8080, "ports": [{"port": 80}]}]))
    stranger = AddressPool("w2").take("s", network_of("other")).ip6
    assert apps.target(stranger, flycast_ip(ACME, "web"), 80) is None
    assert apps.target("10.0.0.1", flycast_ip(ACME, "web"), 80) is None


def test_http_at_the_proxys_own_port_is_port_80() -> None:
    apps = FlycastApps()
    apps.note(_machine("web", ACME, [{"internal_port": 8080}]))  # ports: HTTP, no port named
    me = AddressPool("w2").take("client", ACME).ip6
    assert apps.target(me, flycast_ip(ACME, "web"), 80) == ("web", 8080)
