"""souq.toml: fly.toml's shape read into an app config, the machine configs it makes, and
errors that name the file, the line and the key."""

from __future__ import annotations

import json

import pytest

from souq.apps import line_of, load_app_config
from souq.errors import InvalidInput
from souq.model.machine import MachineConfig

FULL = """\
app = "web"
primary_region = "mad"

[build]
dir = "."

[env]
GREETING = "salaam"

[processes]
app = "python3 server.py --port 8080"
worker = "python3 worker.py"

[http_service]
internal_port = 8080
force_https = true
auto_stop_machines = "stop"
auto_start_machines = true
min_machines_running = 1
processes = ["app"]
  [http_service.concurrency]
  type = "requests"
  soft_limit = 20
  hard_limit = 25
  [[http_service.checks]]
  path = "/healthz"
  interval = "5s"
  timeout = "2s"

[[vm]]
cpus = 2
memory = "1gb"
processes = ["app"]

[[vm]]
cpus = 0.5
memory_mb = 128

[deploy]
strategy = "canary"
max_unavailable = 2
wait_timeout = "2m"

[regions]
mad = 2
syd = 1
"""


def test_a_full_config_makes_one_machine_config_per_group() -> None:
    cfg = load_app_config(FULL)
    assert cfg.groups() == ["app", "worker"]
    assert cfg.counts() == {"mad": 2, "syd": 1}
    assert cfg.served("app") and not cfg.served("worker")
    assert cfg.deploy.strategy == "canary" and cfg.deploy.wait_timeout == 120.0
    assert cfg.deploy.unavailable(10) == 2

    app = MachineConfig.model_validate_json(
        json.dumps(cfg.machine_config("app", image="web:v1", release=3))
    )
    assert app.cmd == ["python3", "server.py", "--port", "8080"] and app.image == "web:v1"
    assert app.env == {"GREETING": "salaam"}
    assert (app.guest.cpus, app.guest.memory_mb) == (2, 1024)
    assert app.metadata == {"souq_release": "3", "souq_process_group": "app"}
    (service,) = app.services
    assert (service.internal_port, service.autostop, service.min_machines_running) == (
        8080,
        "stop",
        1,
    )
    assert service.concurrency.type == "requests"
    (check,) = app.checks.values()
    assert (check.type, check.port, check.path, check.interval) == ("http", 8080, "/healthz", 5.0)

    worker = MachineConfig.model_validate_json(
        json.dumps(cfg.machine_config("worker", image="web:v1", release=3))
    )
    assert worker.services == [] and worker.checks == {}
    assert (worker.guest.cpus, worker.guest.memory_mb) == (0.5, 128)
    assert worker.metadata["souq_process_group"] == "worker"


def test_services_take_their_checks_in_each_of_flys_forms() -> None:
    text = (
        'app = "svc"\nprimary_region = "mad"\n[[services]]\ninternal_port = 9000\n'
        '  [[services.checks]]\n  path = "/a"\n'
        '  [[services.http_checks]]\n  path = "/b"\n'
        '  [[services.tcp_checks]]\n  interval = "3s"\n'
    )
    checks = load_app_config(text).machine_config("app", image="x:1", release=1)["checks"]
    assert sorted((c["type"], c.get("path"), c["port"]) for c in checks.values()) == [
        ("http", "/a", 9000),
        ("http", "/b", 9000),
        ("tcp", "/", 9000),
    ]


def test_the_smallest_config_has_one_group_in_the_primary_region() -> None:
    cfg = load_app_config('app = "tiny"\nprimary_region = "syd"\n[build]\nimage = "tiny:v1"\n')
    assert cfg.groups() == ["app"] and cfg.counts() == {"syd": 1}
    config = MachineConfig.model_validate_json(
        json.dumps(cfg.machine_config("app", image="sha256:" + "a" * 64, release=1))
    )
    assert config.cmd == [] and config.restart.policy.value == "on-failure"


@pytest.mark.parametrize(
    ("text", "line", "key", "says"),
    [
        (FULL.replace("force_https", "forse_https"), 16, "http_service.forse_https", "unknown key"),
        (
            FULL.replace("hard_limit = 25", 'hard_limit = "lots"'),
            24,
            "http_service.concurrency.hard_limit",
            "integer",
        ),
        (
            FULL.replace('interval = "5s"', 'interval = "soon"'),
            27,
            "http_service.checks[0].interval",
            "not a duration",
        ),
        (FULL.replace('memory = "1gb"', 'memory = "huge"'), 32, "vm[0].memory", "not a size"),
        (
            FULL.replace('strategy = "canary"', 'strategy = "yolo"'),
            40,
            "deploy.strategy",
            "rolling",
        ),
        (FULL.replace("syd = 1", "Syd = 1"), 44, "regions", "region 'Syd'"),
        (
            FULL.replace('processes = ["app"]\n  [http', 'processes = ["web"]\n  [http'),
            20,
            "http_service.processes",
            "process group 'web'",
        ),
        (FULL.replace('app = "web"\n', ""), None, "app", "required"),
        (
            FULL.replace('dir = "."', 'dir = "."\nimage = "x"'),
            4,
            "build",
            "either `dir` or `image`",
        ),
    ],
)
def test_bad_values_name_the_line_and_the_key(
    text: str, line: int | None, key: str, says: str
) -> None:
    with pytest.raises(InvalidInput) as caught:
        load_app_config(text, "deploy/souq.toml")
    err = caught.value
    assert says in err.message
    if line is not None:
        assert err.message.startswith(f"deploy/souq.toml:{line}: "), err.message
        assert err.details["line"] == line
    if key:
        assert f": {key}: " in err.message


def test_a_syntax_error_names_its_line() -> None:
    with pytest.raises(InvalidInput) as caught:
        load_app_config('app = "web"\nprimary_region = \n', "souq.toml")
    assert caught.value.message.startswith("souq.toml:2: not valid TOML")


def test_line_of_reads_tables_arrays_of_tables_and_dotted_keys() -> None:
    text = "a = 1\n[t]\nb.c = 2\n[[arr]]\nx = 1\n[[arr]]\nx = 2\ny = { z = 3 }\n"
    assert line_of(text, ["a"]) == 1
    assert line_of(text, ["t", "b", "c"]) == 3
    assert line_of(text, ["arr", 1, "x"]) == 7
    assert line_of(text, ["arr", 1, "y", "z"]) == 8  # inside an inline table: its key's line
    assert line_of(text, ["arr", 0]) == 4
    assert line_of(text, ["nowhere"]) is None
