"""What Souq refuses of a Fly request, and how flaps reads the refusal: ``422 invalid_input``
whose message (the FlapsError's) names the field and says why (src/souq/model/fly_fields.py);
``insufficient_capacity`` as the status code flaps knows; and the differences a Fly client
can meet without an error."""

from __future__ import annotations

from typing import Any

import pytest

from souq.model.fly_fields import (
    CONFIG_UNSUPPORTED,
    CREATE_UNSUPPORTED,
    GUEST_UNSUPPORTED,
    INIT_UNSUPPORTED,
    PORT_UNSUPPORTED,
    SERVICE_UNSUPPORTED,
)
from tests.fly.conftest import fly_error, ok
from tests.fly.decode import GoDecoder
from tests.fly.flaps import (
    Flaps,
    launch_input,
    machine_config,
    machine_guest,
    machine_init,
    machine_port,
    machine_service,
    stop_config,
)

INIT = machine_init(exec=["sleep", "600"])
SET: dict[str, Any] = {  # a set value of each, as a Fly client would send it
    "statics": [{"guest_path": "/app/public", "url_prefix": "/static"}],
    "files": [{"guest_path": "/etc/x", "raw_value": "eA=="}],
    "dns": {"skip_registration": True},
    "processes": [{"cmd": ["x"]}],
    "containers": [{"name": "a", "image": "b"}],
    "volumes": [{"name": "v"}],
    "rootfs": {"size_gb": 2},
    "cache_drive": {"size_mb": 100},
    "metrics": {"port": 9091, "path": "/metrics"},
    "size": "shared-cpu-1x",
    "disable_machine_autostart": True,
    "max_memory_mb": 512,
    "host_dedication_id": "h1",
    "persist_rootfs": "always",
    "kernel_args": ["quiet"],
    "tty": True,
    "swap_size_mb": 256,
    "force_instance_key": "k",
    "force_instance_description": "d",
    "start_port": 8000,
    "end_port": 8010,
    "force_https": True,
    "tls_options": {"alpn": ["h2"]},
    "http_options": {"compress": True},
    "proxy_proto_options": {"version": "v2"},
    "skip_service_registration": True,
}


def body_with(field: str) -> Any:
    value = SET[field]
    if field in CONFIG_UNSUPPORTED:
        return launch_input(config=machine_config(init=INIT, **{field: value}), region="mad")
    if field in GUEST_UNSUPPORTED:
        guest = machine_guest(cpus=1, memory_mb=128, **{field: value})
        return launch_input(config=machine_config(init=INIT, guest=guest))
    if field in INIT_UNSUPPORTED:
        return launch_input(
            config=machine_config(init=machine_init(exec=["true"], **{field: value}))
        )
    port = machine_port(port=80, handlers=["http"])
    service = machine_service(protocol="tcp", internal_port=8080, ports=[port])
    if field in SERVICE_UNSUPPORTED:
        service = machine_service(protocol="tcp", internal_port=8080, **{field: value})
    elif field in PORT_UNSUPPORTED:
        service = machine_service(
            protocol="tcp", internal_port=8080, ports=[machine_port(port=80, **{field: value})]
        )
    config = machine_config(init=INIT, services=[service])
    if field in CREATE_UNSUPPORTED:
        return launch_input(config=config, **{field: value})
    return launch_input(config=config)


REFUSED = {
    *CONFIG_UNSUPPORTED,
    *GUEST_UNSUPPORTED,
    *INIT_UNSUPPORTED,
    *SERVICE_UNSUPPORTED,
    *PORT_UNSUPPORTED,
    *CREATE_UNSUPPORTED,
} - {"lsvd"}  # not a field of fly-go's LaunchMachineInput: flaps never sends it


def test_every_refused_field_is_sent_here() -> None:
    assert sorted(REFUSED - set(SET)) == []


@pytest.mark.parametrize("field", sorted(REFUSED))
def test_a_field_souq_cannot_honour_is_refused_naming_it(
    flaps: Flaps, go: GoDecoder, app: str, field: str
) -> None:
    r = flaps.launch(app, body_with(field))
    fly_error(go, r, 422, "invalid_input", field, "not supported by Souq")


def test_skip_secrets_true_is_kept_on_the_machine(flaps: Flaps, app: str) -> None:
    """Fly's ``skip_secrets``: the machine starts without its app's secrets, now and later."""
    body = launch_input(config=machine_config(init=INIT), skip_secrets=True)
    assert ok(flaps.launch(app, body)).json()["skip_secrets"] is True


def test_no_room_is_insufficient_capacity(flaps: Flaps, go: GoDecoder, app: str) -> None:
    guest = machine_guest(cpus=64, memory_mb=128)
    r = flaps.launch(app, launch_input(config=machine_config(init=INIT, guest=guest)))
    fly_error(go, r, 409, "insufficient_capacity")  # FlapsError.Suggestion() knows this one


def test_a_bare_number_as_a_duration_is_seconds(flaps: Flaps, go: GoDecoder, app: str) -> None:
    """Fly's Duration reads a JSON number as nanoseconds; Souq, as seconds. Souq answers
    with the string, which means the same to both."""
    config = machine_config(init=INIT, stop_config=stop_config(timeout=7))
    m = go.decode("machine", ok(flaps.launch(app, launch_input(config=config))))
    assert m["config"]["stop_config"]["timeout"] == "7s"


def test_a_fractional_cpu_does_not_decode(
    flaps: Flaps, go_only: GoDecoder, app: str, cluster: Any
) -> None:
    """A machine made with Souq's own API with a fraction of a core (``cpus: 0.5``) has no
    Fly form: ``guest.cpus`` is an int to Fly's client, and reading the machine fails."""
    with cluster.client() as client:
        m = client.create_machine(app, "mad", {"cmd": ["sleep", "600"], "guest": {"cpus": 0.5}})
    out = go_only.run("machine", flaps.get(app, m.id).text)
    assert out.startswith("error:") and "cpus" in out
