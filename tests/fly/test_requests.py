"""The requests of this suite are the bytes flaps sends: its bodies as Go's ``json.Marshal``
writes them, its query strings as it builds them (checked against what Go gives for the same
inputs: the literals below)."""

from __future__ import annotations

from tests.fly.decode import GoDecoder
from tests.fly.flaps import (
    create_volume_request,
    extend_volume_request,
    go_duration,
    go_json,
    launch_input,
    machine_config,
    machine_init,
    machine_port,
    machine_service,
    stop_input,
    update_secrets_request,
    values_encode,
)


def test_bodies_are_gos_marshal() -> None:
    assert go_json(stop_input(id="m1")) == '{"id":"m1","timeout":"0s"}'
    assert go_json(stop_input(id="m1", signal="SIGTERM", timeout="5s")) == (
        '{"id":"m1","signal":"SIGTERM","timeout":"5s"}'
    )
    smallest = launch_input(config=machine_config(image="nginx"))
    assert go_json(smallest) == '{"config":{"init":{},"image":"nginx"},"skip_secrets":false}'
    service = machine_service(
        protocol="tcp",
        internal_port=8080,
        autostop=True,
        autostart=True,
        ports=[machine_port(port=80, handlers=["http"])],
    )
    config = machine_config(
        env={"B": "2", "A": "<&>"}, init=machine_init(cmd=["sleep", "600"]), services=[service]
    )
    assert go_json(launch_input(config=config, region="mad")) == (
        '{"config":{"env":{"A":"\\u003c\\u0026\\u003e","B":"2"},"init":{"cmd":["sleep","600"]},'
        '"services":[{"protocol":"tcp","internal_port":8080,"autostop":true,"autostart":true,'
        '"ports":[{"port":80,"handlers":["http"]}],"force_instance_key":null}]},'
        '"region":"mad","skip_secrets":false}'
    )
    assert go_json(update_secrets_request(values={"B": None, "A": "1"})) == (
        '{"values":{"A":"1","B":null}}'
    )
    # CreateVolumeRequest's pointers have no omitempty: a zero request is all nulls.
    assert go_json(create_volume_request()) == (
        '{"name":"","region":"","size_gb":null,"encrypted":null,"require_unique_zone":null,'
        '"unique_zone_app_wide":null,"snapshot_retention":null,"auto_backup_enabled":null,'
        '"fstype":null,"snapshot_id":null,"source_volume_id":null,"compute":null}'
    )
    assert go_json(extend_volume_request()) == '{"size_gb":0}'


def test_query_strings_are_flaps() -> None:
    assert [go_duration(n) for n in (0, 500 * 10**6, 90 * 10**9, 3600 * 10**9, 1500)] == [
        "0s",
        "500ms",
        "1m30s",
        "1h0m0s",
        "1.5µs",
    ]
    # go-querystring then url.Values.Encode(): keys sorted, a key's values in order.
    pairs = [("version", "v 1"), ("timeout", "60"), ("state", "started"), ("state", "failed")]
    assert values_encode(pairs) == "state=started&state=failed&timeout=60&version=v+1"


def test_the_go_decoder_is_live(go_only: GoDecoder) -> None:
    """The decode step refuses what Fly's types refuse (so its ``ok`` means something)."""
    assert go_only.run("machine", '{"config":{"guest":{"cpus":1.0}}}').startswith("error:")
    assert go_only.run("start", "") == "error: EOF"  # an empty body, where a value is read
    assert go_only.run("machine", '{"image_ref":"nginx"}').startswith("error:")
    assert go_only.run("lease", '{"data":{"expires_at":1.5}}').startswith("error:")
    assert go_only.run("machine", '{"config":{"checks":{"a":{"interval":"1x"}}}}').startswith(
        "error:"
    )
    assert go_only.run("apps", '{"apps":[]}') == 'ok {"apps":[]}'
