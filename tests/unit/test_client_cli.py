"""The ``souq`` CLI: argument parsing, output and exit codes, against a stubbed client."""

from __future__ import annotations

import json
import subprocess
import sys
import types
from typing import Any

import pytest
from typer.testing import CliRunner

from souq.client import cli, workers_cli
from souq.errors import InsufficientCapacity, NotFound, SouqError
from souq.model import Machine, MachineEvent, Placement, Resources, WorkerInfo
from souq.model.machine import CheckStatus

runner = CliRunner()


def machine(state: str = "started", **config: Any) -> Machine:
    return Machine.model_validate_json(
        json.dumps(
            {
                "id": "0123456789abcd",
                "name": "web-1",
                "app": "web",
                "region": "mad",
                "worker_id": "w1",
                "state": state,
                "config": {"cmd": ["sleep", "60"], **config},
                "created_at": "2026-01-01T00:00:00.000Z",
                "updated_at": "2026-01-01T00:00:00.000Z",
                "events": [{"type": "launch", "status": state, "source": "user", "timestamp": 0}],
                "placement": {"request_id": "r", "region": "mad", "winner": "w1"},
            }
        )
    )


class StubClient:
    def __init__(self) -> None:
        self.calls: list[tuple[str, tuple[Any, ...], dict[str, Any]]] = []
        self.error: SouqError | None = None

    def __getattr__(self, name: str) -> Any:
        def call(*args: Any, **kwargs: Any) -> Any:
            self.calls.append((name, args, kwargs))
            if self.error is not None:
                raise self.error
            return self.answer(name, args)

        return call

    def answer(self, name: str, args: tuple[Any, ...]) -> Any:
        if name == "operate":  # an operation of souq.operations, by its name
            return self.answer(args[0], args[1:])
        if name == "list_machines":
            return [machine(), machine("stopped")]
        if name == "workers":
            return [
                WorkerInfo(
                    id="w1",
                    region="mad",
                    capacity=Resources(cpus=4, memory_mb=4096),
                    allocated=Resources(cpus=1, memory_mb=256),
                    labels={"disk": "ssd"},
                )
            ]
        if name == "logs":
            return "hello\n"
        if name == "follow_logs":
            return iter(["a\n", "b\n"])
        if name == "events":
            return [MachineEvent(type="launch", status="started", source="user", timestamp=0)]
        if name == "wait":
            return machine(str(args[2]))
        if name == "destroy":
            return machine("destroyed")
        return machine()


@pytest.fixture
def stub(monkeypatch: pytest.MonkeyPatch) -> StubClient:
    client = StubClient()
    monkeypatch.setattr(cli, "make_client", lambda: client)
    monkeypatch.setattr(workers_cli, "make_client", lambda: client)
    return client


def invoke(*args: str) -> Any:
    return runner.invoke(cli.app, list(args))


def test_machine_run_builds_the_config_and_prints_the_id(stub: StubClient) -> None:
    result = invoke(
        "machine", "run", "--app", "web", "--region", "mad", "--cpus", "0.5",
        "--memory-mb", "128", "--restart", "on-failure", "--max-retries", "2",
        "--env", "A=1", "--env", "B=x=y", "--name", "web-1", "--skip-start",
        "--", "sh", "-c", "echo hi --app",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert result.stdout == "0123456789abcd\n"
    [(name, args, kwargs)] = stub.calls
    assert name == "create_machine"
    assert args == (
        "web",
        "mad",
        {
            "cmd": ["sh", "-c", "echo hi --app"],
            "guest": {"cpus": 0.5, "memory_mb": 128},
            "restart": {"policy": "on-failure", "max_retries": 2},
            "env": {"A": "1", "B": "x=y"},
        },
    )
    assert kwargs == {"name": "web-1", "skip_launch": True, "quote": None, "placement": None}


def test_machine_run_minimal_and_json(stub: StubClient) -> None:
    result = invoke("machine", "run", "--app", "web", "--region", "mad", "--json", "--", "sleep")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["id"] == "0123456789abcd"
    assert stub.calls[0][1] == ("web", "mad", {"cmd": ["sleep"]})


def test_a_refused_placement_exits_3_with_the_reason_on_stderr(stub: StubClient) -> None:
    record = Placement(request_id="r", region="mad", rejections={"insufficient_cpu": 2})
    stub.error = InsufficientCapacity(
        "no worker in region mad can take 8 cpus / 256 MiB: 2 insufficient_cpu",
        hint="ask for less",
        details={"placement": record.model_dump(mode="json")},
    )
    result = invoke("machine", "run", "--app", "web", "--region", "mad", "--cpus", "8", "--", "x")
    assert result.exit_code == 3
    assert result.stdout == ""
    assert "2 insufficient_cpu" in result.stderr
    assert "hint: ask for less" in result.stderr
    as_json = invoke("machine", "run", "--app", "w", "--region", "mad", "--json", "--", "x")
    assert as_json.exit_code == 3
    assert json.loads(as_json.stderr)["status"] == "insufficient_capacity"


def test_other_errors_exit_1(stub: StubClient) -> None:
    stub.error = NotFound("machine nope not found")
    result = invoke("machine", "show", "nope", "--app", "web")
    assert result.exit_code == 1
    assert "machine nope not found" in result.stderr


def test_bad_arguments_are_usage_errors(stub: StubClient) -> None:
    bad_env = invoke("machine", "run", "--app", "w", "--region", "mad", "--env", "NOEQ", "--", "x")
    assert bad_env.exit_code == 2
    assert "NOEQ" in bad_env.stderr
    bad_policy = invoke(
        "machine", "run", "--app", "w", "--region", "r", "--restart", "x", "--", "y"
    )
    assert bad_policy.exit_code == 2
    no_command = invoke("machine", "run", "--app", "w", "--region", "mad")
    assert no_command.exit_code == 2
    assert stub.calls == []


def test_stop_waits_until_stopped(stub: StubClient) -> None:
    result = invoke(
        "machine", "stop", "m1", "--app", "web", "--signal", "SIGTERM", "--timeout", "3"
    )
    assert result.exit_code == 0, result.output
    assert result.stdout == "0123456789abcd stopped\n"
    (stop, stop_args, stop_kw), (wait, wait_args, wait_kw) = stub.calls
    assert (stop, stop_args, stop_kw) == (
        "stop",
        ("web", "m1"),
        {"signal": "SIGTERM", "timeout_s": 3},
    )
    assert (wait, wait_args) == ("wait", ("web", "m1", "stopped"))
    assert wait_kw["timeout"] == 3 + cli.STOP_WAIT_MARGIN_S


@pytest.mark.parametrize(
    ("args", "call", "expected"),
    [
        (["start", "m1"], "start", (("web", "m1"), {})),
        (["restart", "m1"], "restart", (("web", "m1"), {})),
        (["destroy", "m1"], "destroy", (("web", "m1"), {"force": False})),
        (["destroy", "m1", "--force"], "destroy", (("web", "m1"), {"force": True})),
        (
            ["wait", "m1", "--state", "stopped", "--timeout", "5"],
            "wait",
            (("web", "m1", "stopped"), {"timeout": 5.0}),
        ),
    ],
)
def test_machine_commands(
    stub: StubClient, args: list[str], call: str, expected: tuple[Any, Any]
) -> None:
    result = invoke("machine", *args, "--app", "web")
    assert result.exit_code == 0, result.output
    [(name, call_args, kwargs)] = stub.calls
    assert (name, (call_args, kwargs)) == (call, expected)
    assert result.stdout.startswith("0123456789abcd ")
    as_json = invoke("machine", *args, "--app", "web", "--json")
    assert json.loads(as_json.stdout)["id"] == "0123456789abcd"


def test_wait_refuses_an_unknown_state(stub: StubClient) -> None:
    assert invoke("machine", "wait", "m1", "--app", "web", "--state", "asleep").exit_code == 2


def test_list_show_events_and_workers_render(stub: StubClient) -> None:
    listed = invoke("machine", "list", "--app", "web")
    assert listed.exit_code == 0, listed.output
    assert "0123456789abcd" in listed.stdout and "stopped" in listed.stdout
    assert len(json.loads(invoke("machine", "list", "--app", "web", "--json").stdout)) == 2
    shown = invoke("machine", "show", "m1", "--app", "web")
    assert shown.exit_code == 0, shown.output
    assert "sleep 60" in shown.stdout and "winner w1" in shown.stdout
    events = invoke("machine", "events", "m1", "--app", "web")
    assert events.exit_code == 0 and "launch" in events.stdout
    workers = invoke("workers")
    assert workers.exit_code == 0, workers.output
    assert "w1" in workers.stdout and "1/4" in workers.stdout and "disk=ssd" in workers.stdout
    [w] = json.loads(invoke("workers", "--json").stdout)
    assert w["capacity"] == {"cpus": 4.0, "memory_mb": 4096, "disk_mb": 0, "gpus": 0}


def test_logs_and_follow(stub: StubClient) -> None:
    assert invoke("machine", "logs", "m1", "--app", "web").stdout == "hello\n"
    assert invoke("machine", "logs", "m1", "--app", "web", "--follow").stdout == "a\nb\n"
    lines = invoke("machine", "logs", "m1", "--app", "web", "-f", "--json").stdout.splitlines()
    assert [json.loads(x) for x in lines] == [{"data": "a\n"}, {"data": "b\n"}]


def test_broker_command_builds_its_config(monkeypatch: pytest.MonkeyPatch) -> None:
    from souq.broker import main as broker_main

    seen: list[Any] = []
    monkeypatch.setattr(broker_main, "run", seen.append)
    result = invoke("broker", "--nats", "nats://n:4222", "--listen", "0.0.0.0:9000")
    assert result.exit_code == 0, result.output
    [config] = seen
    assert (config.nats_url, config.listen_host, config.listen_port) == (
        "nats://n:4222",
        "0.0.0.0",
        9000,
    )
    assert invoke("broker", "--nats", "x", "--listen", "nope").exit_code == 2


def test_dev_command_builds_its_config(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[Any] = []
    fake = types.ModuleType("souq.dev")

    class DevConfig:
        def __init__(self, **kwargs: Any) -> None:
            self.kwargs = kwargs

    fake.DevConfig = DevConfig  # type: ignore[attr-defined]
    fake.run = seen.append  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "souq.dev", fake)
    result = invoke(
        "dev",
        "--port",
        "5000",
        "--regions",
        "mad, syd,ams",
        "--worker-cpus",
        "2",
        "--proxy-port",
        "5001",
        "--domain",
        "test",
        "--autostop-interval",
        "5",
        "--nats-cluster",
        "3",
    )
    assert result.exit_code == 0, result.output
    [config] = seen
    assert config.kwargs == {
        "port": 5000,
        "nats_cluster": 3,
        "regions": ("mad", "syd", "ams"),
        "workers_per_region": 2,
        "worker_cpus": 2.0,
        "proxy_port": 5001,
        "domain": "test",
        "autostop_interval_s": 5.0,
    }


def test_agent_command_builds_its_config(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[Any] = []
    fake_main = types.ModuleType("souq.agent.main")
    fake_main.run = seen.append  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "souq.agent.main", fake_main)
    result = invoke(
        "agent", "--region", "mad", "--nats", "nats://n:4222", "--data-dir", "/tmp/souq-a",
        "--cpus", "2", "--label", "disk=ssd", "--label", "gpu=no", "--stop-machines-on-exit",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    [config] = seen
    assert config.region == "mad"
    assert config.nats_url == "nats://n:4222"
    assert str(config.data_dir) == "/tmp/souq-a"
    assert config.cpus == 2
    assert config.memory_mb is None
    assert config.labels == {"disk": "ssd", "gpu": "no"}
    assert config.stop_machines_on_exit is True


def test_version_and_help() -> None:
    assert invoke("--version").stdout.startswith("souq ")
    assert invoke("--help").exit_code == 0
    assert "COMMAND" in invoke("machine", "run", "--help").stdout


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("label.disk=ssd", {"attribute": "label.disk", "operator": "=", "value": "ssd"}),
        ("fingerprint.cpus >= 4", {"attribute": "fingerprint.cpus", "operator": ">=", "value": 4}),
        ("label.zone in a, b", {"attribute": "label.zone", "operator": "in", "value": ["a", "b"]}),
        ("region != mad", {"attribute": "region", "operator": "!=", "value": "mad"}),
        (
            "fingerprint.arch regexp ^x86",
            {"attribute": "fingerprint.arch", "operator": "regexp", "value": "^x86"},
        ),
    ],
)
def test_constraint_flags_read_as_a_person_writes_them(
    stub: StubClient, text: str, expected: dict[str, Any]
) -> None:
    result = invoke(
        "machine",
        "run",
        "--app",
        "web",
        "--region",
        "mad",
        "--constraint",
        text,
        "--distinct-workers",
        "--policy",
        "spread",
        "--",
        "true",
    )
    assert result.exit_code == 0, result.output
    [(name, args, kwargs)] = stub.calls
    assert name == "create_machine"
    assert args[2]["constraints"] == [expected]
    assert args[2]["distinct_workers_for"] == "app"
    assert kwargs["placement"] == {"policy": "spread"}


@pytest.mark.parametrize("text", ["label.disk", "fingerprint.cpus > many", "=ssd"])
def test_a_malformed_constraint_is_a_clear_error(stub: StubClient, text: str) -> None:
    result = invoke(
        "machine", "run", "--app", "web", "--region", "mad", "--constraint", text, "--", "true"
    )
    assert result.exit_code == 2  # a usage error, found as the line is parsed
    assert "constraint" in result.stderr
    assert stub.calls == []


def test_the_daemons_do_not_load_the_client_stack() -> None:
    # `souq agent` runs on every host: the CLI it starts from must not load httpx or rich, nor
    # the metrics library unless a metrics port is set.
    code = (
        "import sys, souq.client.cli, souq.agent.main; "
        "print(sorted(m for m in ('httpx', 'rich.console', 'prometheus_client') "
        "if m in sys.modules))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert done.stdout.strip() == "[]"


@pytest.fixture
def app_stub(stub: StubClient, monkeypatch: pytest.MonkeyPatch) -> StubClient:
    """The stub, for the app commands too (they import ``make_client`` by name)."""
    from souq.client import apps_cli

    monkeypatch.setattr(apps_cli, "make_client", lambda: stub)
    return stub


@pytest.mark.parametrize("written", ["v3", "3", "V3"])
def test_rollback_takes_the_version_as_releases_shows_it_or_its_number(
    app_stub: StubClient, written: str
) -> None:
    app_stub.answer = lambda name, args: (  # type: ignore[method-assign]
        [] if name == "releases" else (_ for _ in ()).throw(NotFound("no release v3"))
    )
    result = invoke("rollback", "--app", "web", written)
    assert result.exit_code == 1  # the stub has no v3: the point is which one was asked for
    assert ("release", ("web", 3), {}) in app_stub.calls
    assert "no release v3" in result.stderr


def test_rollback_refuses_what_is_not_a_version(app_stub: StubClient) -> None:
    result = invoke("rollback", "--app", "web", "vnext")
    assert result.exit_code == 2
    assert "'vnext' is not a release version" in result.stderr
    assert not any(name == "release" for name, _, _ in app_stub.calls)


def test_status_does_not_call_a_stopped_machines_checks_passing(app_stub: StubClient) -> None:
    check = {"type": "http", "port": 8080, "path": "/healthz"}
    seen = [CheckStatus(name="http-0", status="passing", updated_at="2026-01-01T00:00:00Z")]
    up, down = (
        machine(state, checks={"http-0": check}).model_copy(update={"id": mid, "checks": seen})
        for state, mid in (("started", "up000000000000"), ("stopped", "down0000000000"))
    )
    app_stub.answer = lambda name, args: [up, down]  # type: ignore[method-assign]
    result = invoke("status", "--app", "web")
    assert result.exit_code == 0, result.output
    rows = {line.split()[0]: line for line in result.stdout.splitlines() if line.strip()}
    assert "1/1 passing" in rows["up000000000000"]
    assert "1 not running" in rows["down0000000000"]
    assert "passing" not in rows["down0000000000"]
