"""A malformed value on the command line is a usage error (exit 2) that names what the option
takes, checked by ``souq`` as it parses, before it asks the server anything: run as a real
process, against an API address where nothing listens (a line that got past parsing would exit
1, unable to reach it)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import pytest

from souq.model.release import NewRelease, Strategy


@pytest.fixture(scope="module")
def nowhere() -> str:
    """An API address nothing listens on (a port that was free a moment ago)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"


def souq(api: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "SOUQ_API": api, "SOUQ_TOKEN": "t", "COLUMNS": "200"}
    return subprocess.run(
        [sys.executable, "-m", "souq", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )


RUN = ("machine", "run", "--app", "web", "--region", "mad")

# (command line, what its error names)
MALFORMED = [
    (("deploy", "--strategy", "sideways"), "'rolling', 'canary', 'bluegreen', 'immediate'"),
    (("deploy", "--dry-run", "--strategy", "sideways"), "'immediate'"),
    (("rollback", "--app", "web", "--strategy", "sideways"), "'bluegreen'"),
    (("rollback", "--app", "web", "vx"), "'vx' is not a release version"),
    (("rollback", "--app", "web", "v0"), "'v0' is not a release version"),
    (("job", "list", "--state", "weird"), "'pending'"),
    (("job", "submit", "j", "--restart", "always", "--", "true"), "'on-failure'"),
    (("job", "submit", "j", "--max-retries", "-1", "--", "true"), "greater than or equal to 0"),
    (("job", "submit", "j", "--cpus", "-1", "--", "true"), "greater than or equal to 0"),
    (("job", "wait", "j", "--timeout", "-1"), "greater than or equal to 0"),
    (("token", "create", "--scope", "god"), "'read', 'write', 'deploy', 'admin', 'queue'"),
    (("token", "narrow", "--scope", "god"), "'admin'"),
    (("token", "create", "--ttl", "0"), "greater than 0"),
    (("audit", "--limit", "0"), "greater than or equal to 1"),
    ((*RUN, "--cpus", "-1", "--", "true"), "greater than or equal to 0.001"),
    ((*RUN, "--cpus", "0", "--", "true"), "greater than or equal to 0.001"),
    ((*RUN, "--memory-mb", "0", "--", "true"), "greater than 0"),
    ((*RUN, "--port", "0", "--", "true"), "greater than or equal to 1"),
    ((*RUN, "--port", "70000", "--", "true"), "less than or equal to 65535"),
    ((*RUN, "--port", "80", "--autostop", "maybe", "--", "true"), "'off', 'stop', 'suspend'"),
    ((*RUN, "--autostop", "maybe", "--", "true"), "'off', 'stop', 'suspend'"),
    ((*RUN, "--autostop", "stop", "--", "true"), "give the service's --port"),
    ((*RUN, "--restart", "sometimes", "--", "true"), "'on-failure'"),
    ((*RUN, "--max-retries", "-1", "--", "true"), "greater than or equal to 0"),
    ((*RUN, "--policy", "cheapest", "--", "true"), "'best-fit'"),
    ((*RUN, "--wait-timeout", "-1", "--", "true"), "greater than or equal to 0"),
    ((*RUN, "--constraint", "label.disk", "--", "true"), "is not ATTRIBUTE OPERATOR VALUE"),
    (("quote", "create", "-a", "web", "-r", "mad", "-c", "cpus > many", "--", "true"), "number"),
    (("quote", "create", "--app", "web", "-r", "mad", "--ttl", "0", "--", "true"), "greater"),
    (("machine", "update", "m1", "--app", "web", "--cpus", "-2"), "greater than or equal to 0.001"),
    (("machine", "stop", "m1", "--app", "web", "--timeout", "-1"), "greater than or equal"),
    (("machine", "wait", "m1", "--app", "web", "--state", "asleep"), "'stopped'"),
    (("machine", "stop", "m1", "--app", "web", "--signal", "SIGNOPE"), "unknown signal"),
    (("machine", "exec", "--app", "web", "--timeout", "301", "m1", "--", "true"), "300"),
    (("events", "--since", "-1"), "greater than or equal to 0"),
    (("simulate", "--from-cluster", "--cpus", "-1"), "greater than or equal to 0.001"),
    (("simulate", "--from-cluster", "--gpus", "-1"), "greater than or equal to 0"),
    (("volume", "create", "data", "--app", "web", "-r", "mad", "--size", "0"), "greater"),
    (("volume", "extend", "vol_1", "--app", "web", "--size", "0"), "greater"),
]


@pytest.mark.parametrize(("args", "names"), MALFORMED, ids=[" ".join(a) for a, _ in MALFORMED])
def test_a_malformed_value_is_a_usage_error_naming_what_it_takes(
    nowhere: str, args: tuple[str, ...], names: str
) -> None:
    done = souq(nowhere, *args)
    assert done.returncode == 2, (done.stdout, done.stderr)
    flat = " ".join(done.stderr.replace("│", " ").split())
    assert names in flat, flat


WELL_FORMED = [
    ("rollback", "--app", "web", "V3", "--strategy", "canary"),
    ("job", "list", "--state", "pending"),
    ("token", "create", "--scope", "queue", "--ttl", "60"),
    (*RUN, "--cpus", "0.5", "--port", "8080", "--autostop", "suspend", "--", "true"),
    ("machine", "wait", "m1", "--app", "web", "--state", "stopped", "--timeout", "1"),
    ("machine", "stop", "m1", "--app", "web", "--signal", "int"),
]


@pytest.mark.parametrize("args", WELL_FORMED, ids=[" ".join(a) for a in WELL_FORMED])
def test_a_well_formed_value_gets_past_parsing_to_the_server(
    nowhere: str, args: tuple[str, ...]
) -> None:
    done = souq(nowhere, *args)
    assert done.returncode == 1, (done.stdout, done.stderr)  # the server is not there
    assert "Invalid value" not in done.stderr


def test_a_release_names_one_of_the_strategies() -> None:
    def body(strategy: str) -> str:
        return json.dumps({"image": "i", "config": {}, "strategy": strategy})

    assert NewRelease.model_validate_json(body("canary")).strategy is Strategy.CANARY
    with pytest.raises(ValueError, match="'rolling', 'canary', 'bluegreen' or 'immediate'"):
        NewRelease.model_validate_json(body("sideways"))
