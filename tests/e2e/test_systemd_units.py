"""deploy/systemd: each unit parses (systemd-analyze verify where systemd is installed), every
ExecStart of a souq-* unit names a real `souq` command and only flags that command takes, and
the agent's unit keeps its machines running when it stops (KillMode=process, Delegate=yes)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from functools import cache
from pathlib import Path

import pytest

UNITS = Path(__file__).resolve().parents[2] / "deploy" / "systemd"
SERVICES = sorted(UNITS.glob("*.service"))


def settings(unit: Path) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for line in unit.read_text().splitlines():
        if line.strip() and not line.startswith(("#", "[")):
            key, _, value = line.partition("=")
            out.setdefault(key.strip(), []).append(value.strip())
    return out


@cache
def help_of(command: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "souq", command, "--help"],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "COLUMNS": "200"},
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_there_are_units_for_nats_agent_broker_and_proxy() -> None:
    names = {p.name for p in SERVICES}
    assert {"souq-nats@.service", "souq-agent.service", "souq-broker.service"} <= names
    assert "souq-proxy.service" in names
    assert (UNITS / "souq-nats.target").exists() and (UNITS / "souq.env").exists()


@pytest.mark.parametrize("unit", SERVICES, ids=lambda p: p.name)
def test_a_unit_restarts_and_reads_the_environment_file(unit: Path) -> None:
    s = settings(unit)
    assert s["Restart"] == ["always"]
    assert s.get("EnvironmentFile"), unit.name
    assert len(s["ExecStart"]) == 1


@pytest.mark.parametrize(
    "unit", [p for p in SERVICES if not p.name.startswith("souq-nats")], ids=lambda p: p.name
)
def test_exec_start_names_a_souq_command_and_its_flags(unit: Path) -> None:
    s = settings(unit)
    assert "souq-nats.target" in s["After"][0]
    argv = s["ExecStart"][0].split()
    assert argv[0].endswith("/souq")
    command = argv[1]
    usage = help_of(command)
    flags = [a for a in argv[2:] if a.startswith("--")]
    assert flags
    for flag in flags:
        assert re.search(rf"{re.escape(flag)}\b", usage), f"souq {command} has no {flag}"
    # every ${VAR} it uses is set in the example environment file
    env = (UNITS / "souq.env").read_text()
    for var in re.findall(r"\$\{?(\w+)\}?", s["ExecStart"][0]):
        assert re.search(rf"^{var}=", env, re.M), var


def test_the_agent_leaves_its_machines_running_and_owns_its_cgroup() -> None:
    s = settings(UNITS / "souq-agent.service")
    assert s["KillMode"] == ["process"]
    assert s["Delegate"] == ["yes"]
    assert s["DelegateSubgroup"] == ["agent"]  # souq.drivers.cgroups.AGENT_LEAF
    assert "--stop-machines-on-exit" not in s["ExecStart"][0]
    assert "User" not in s  # root: cgroups and the machines' own users


def test_a_nats_node_runs_its_node_config_and_stops_in_lame_duck_mode() -> None:
    s = settings(UNITS / "souq-nats@.service")
    assert "-c /etc/souq/nats-%i.conf" in s["ExecStart"][0]
    assert s["KillSignal"] == ["SIGUSR2"]
    assert s["ExecReload"] == ["/bin/kill -s HUP $MAINPID"]


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd is not installed")
@pytest.mark.parametrize("unit", [*SERVICES, UNITS / "souq-nats.target"], ids=lambda p: p.name)
def test_systemd_analyze_verify_finds_nothing_else(unit: Path) -> None:
    done = subprocess.run(
        ["systemd-analyze", "verify", "--man=no", str(unit)],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
    )
    tolerated = (
        "is not executable",  # /opt/souq is the operator's install, not this machine's
        "Unknown key 'DelegateSubgroup'",  # systemd before 254 ignores it (docs/operations.md)
    )
    problems = [
        line
        for line in (done.stdout + done.stderr).splitlines()
        if line.strip() and not any(t in line for t in tolerated)
    ]
    assert not problems, problems
