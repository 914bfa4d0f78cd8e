"""A NATS node's configuration text (souq.natsconf): what each setting becomes, the route
secret in every route and gateway URL, TLS on both links, and the operator's input checked."""

from __future__ import annotations

import pytest

from souq.errors import InvalidInput
from souq.natsconf import (
    NodeConf,
    RouteAuth,
    RouteTls,
    hosts_of,
    node_conf,
    parse_gateways,
    parse_routes,
    with_auth,
)

ROUTES = ["nats://h1:6222", "nats://h2:6222", "nats://h3:6222"]


def test_a_dev_node_names_itself_its_cluster_and_routes() -> None:
    text = node_conf(
        NodeConf(
            name="souq-1",
            cluster="souq",
            route_listen="127.0.0.1:6222",
            pid_file="/a/nats-server-souq-1.pid",
            routes=ROUTES,
            include="../auth/nats.conf",
        )
    )
    assert 'include "../auth/nats.conf"' in text
    assert 'server_name: "souq-1"' in text
    assert 'pid_file: "/a/nats-server-souq-1.pid"' in text
    assert 'routes: ["nats://h1:6222", "nats://h2:6222", "nats://h3:6222"]' in text
    for absent in ("authorization", "tls {", "gateway {", 'listen: "0', "http:", "jetstream"):
        assert absent not in text


def test_the_include_comes_before_what_the_node_overrides() -> None:
    text = node_conf(
        NodeConf(
            name="n1",
            cluster="souq",
            route_listen="0.0.0.0:6222",
            pid_file="/p",
            include="nats.conf",
            store_dir="/var/lib/souq/nats",
            client_listen="0.0.0.0:4222",
            monitor="127.0.0.1:8222",
        )
    )
    lines = text.splitlines()
    assert lines.index('include "nats.conf"') < lines.index('pid_file: "/p"')
    assert 'jetstream { store_dir: "/var/lib/souq/nats" }' in lines
    assert 'listen: "0.0.0.0:4222"' in lines and 'http: "127.0.0.1:8222"' in lines


def test_routes_and_gateways_carry_the_secret_and_tls() -> None:
    auth = RouteAuth("souq-route", "s3cret")
    tls = RouteTls(cert="/d/tls/route-n1.pem", key="/d/tls/route-n1.key", ca="/d/tls/ca.pem")
    text = node_conf(
        NodeConf(
            name="n1",
            cluster="mad",
            route_listen="0.0.0.0:6222",
            pid_file="/p",
            routes=ROUTES,
            gateway_listen="0.0.0.0:7222",
            gateways={"syd": ["nats://s1:7222"]},
            advertise="h1:6222",
            auth=auth,
            tls=tls,
        )
    )
    assert text.count('user: "souq-route"') == 2  # the cluster's and the gateway's
    assert text.count('password: "s3cret"') == 2
    assert text.count('ca_file: "/d/tls/ca.pem"') == 2
    assert "nats://souq-route:s3cret@h2:6222" in text
    assert '{name: "syd", urls: ["nats://souq-route:s3cret@s1:7222"]}' in text
    assert 'advertise: "h1:6222"' in text
    assert "keep it 0600" in text


def test_with_auth_keeps_host_and_port() -> None:
    assert with_auth("nats://[::1]:6222", RouteAuth("u", "p")) == "nats://u:p@[::1]:6222"
    assert with_auth("nats://h:1", None) == "nats://h:1"


def test_routes_are_parsed_and_checked() -> None:
    assert parse_routes(" nats://h1:6222, nats-route://h2:6222,nats://h1:6222") == [
        "nats://h1:6222",
        "nats://h2:6222",
    ]
    for bad in ("", "h1:6222", "http://h1:6222", "nats://h1", "nats://u:p@h1:6222"):
        with pytest.raises(InvalidInput) as err:
            parse_routes(bad)
        assert err.value.hint


def test_gateways_are_parsed_and_checked() -> None:
    assert parse_gateways(["syd=nats://s1:7222,nats://s2:7222"]) == {
        "syd": ["nats://s1:7222", "nats://s2:7222"]
    }
    for bad in (["syd"], ["s d=nats://s:1"], ["syd="], ["syd=ftp://s:1"]):
        with pytest.raises(InvalidInput):
            parse_gateways(bad)


def test_hosts_of_urls() -> None:
    assert hosts_of([*ROUTES, "nats://h1:7000", "nats://10.0.0.1:1"]) == [
        "h1",
        "h2",
        "h3",
        "10.0.0.1",
    ]
