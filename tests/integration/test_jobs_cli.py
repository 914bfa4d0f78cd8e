"""``souq job ...`` as a user runs it (a child process), on a real cluster (NATS with JetStream,
a broker, auth on) with no agents, so that only the test's own worker, speaking the /sched API,
runs jobs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import datetime
from zoneinfo import ZoneInfo

from souq.client import SouqClient
from souq.testing import Cluster
from tests.clusters import ClusterSpec

CLUSTER = ClusterSpec("jobs-cli", regions={})


def souq(cluster: Cluster, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "souq", "job", *args],
        env={**os.environ, "SOUQ_API": cluster.api_url, **env},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def run_as_worker(client: SouqClient, name: str, exit_code: int) -> None:
    """What a worker of the pull model does with a job: claim it, start it, say how it ended."""
    client.claim_job(name, worker="w1")
    client.job_started(name, worker="w1")
    client.job_stopped(name, worker="w1", exit_code=exit_code)


def test_submit_list_status_and_errors(cluster: Cluster) -> None:
    sent = souq(cluster, "submit", "cli-echo", "--json", "-e", "A=1", "--", "echo $A > out")
    assert sent.returncode == 0, sent.stderr
    job = json.loads(sent.stdout)
    assert (job["state"], job["spec"]["command"], job["spec"]["env"]) == (
        "pending",
        "echo $A > out",
        {"A": "1"},
    )
    again = souq(cluster, "submit", "cli-echo", "--", "true")
    assert again.returncode == 1 and "job cli-echo exists" in again.stderr
    argv = souq(cluster, "submit", "cli-argv", "--cpus", "2", "--", "ls", "-l", "/")
    assert argv.returncode == 0 and argv.stdout == "cli-argv pending\n", argv.stderr
    every = ("--restart", "on-failure", "--max-retries", "5", "--backoff", "0.5")
    every += ("--deadline", "900", "--memory-mb", "128")
    tuned = souq(cluster, "submit", "cli-tuned", "--json", *every, "--", "true")
    assert tuned.returncode == 0, tuned.stderr
    spec = json.loads(tuned.stdout)["spec"]
    assert (spec["restart"], spec["max_retries"], spec["backoff_s"]) == ("on-failure", 5, 0.5)
    assert (spec["deadline_s"], spec["memory_mb"], spec["cpus"]) == (900, 128, 0.1)
    listed = souq(cluster, "list", "--state", "pending", "--json")
    names = [j["name"] for j in json.loads(listed.stdout)]
    assert {"cli-echo", "cli-argv"} <= set(names)
    shown = souq(cluster, "status", "cli-argv")
    assert "pending" in shown.stdout and "ls -l /" in shown.stdout and "2 cpus" in shown.stdout
    missing = souq(cluster, "status", "nope")
    assert missing.returncode == 1 and "error: no job nope" in missing.stderr
    refused = souq(cluster, "list", SOUQ_TOKEN="not-a-token")
    assert refused.returncode == 1 and "error:" in refused.stderr
    bad = souq(cluster, "submit", "x y", "--", "true")
    assert bad.returncode == 1 and "name" in bad.stderr
    logs = souq(cluster, "logs", "nope")  # no such job, or a broker without job logs
    assert logs.returncode == 1 and "error:" in logs.stderr and "Traceback" not in logs.stderr


def test_wait_exits_as_the_job_ended(cluster: Cluster) -> None:
    client = cluster.client()
    for name in ("cli-ok", "cli-bad", "cli-cancel", "cli-slow"):
        assert souq(cluster, "submit", name, "--", "true").returncode == 0
    waiting = subprocess.Popen(
        [sys.executable, "-m", "souq", "job", "wait", "cli-ok", "--timeout", "60"],
        env={**os.environ, "SOUQ_API": cluster.api_url},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        run_as_worker(client, "cli-ok", 0)
        out, err = waiting.communicate(timeout=60)
    finally:
        waiting.kill()
    assert waiting.returncode == 0, err
    assert out.startswith("cli-ok succeeded")

    run_as_worker(client, "cli-bad", 3)
    failed = souq(cluster, "wait", "cli-bad", "--timeout", "10")
    assert failed.returncode == 1 and "cli-bad failed, exit code 3" in failed.stderr

    cancelled = souq(cluster, "cancel", "cli-cancel")
    assert cancelled.returncode == 0 and cancelled.stdout.startswith("cli-cancel cancelled")
    assert souq(cluster, "wait", "cli-cancel").returncode == 1

    late = souq(cluster, "wait", "cli-slow", "--timeout", "0.5")
    assert late.returncode == 1 and "still pending" in late.stderr


def test_a_periodic_job_from_the_command_line(cluster: Cluster) -> None:
    made = souq(
        cluster,
        "submit",
        "nightly",
        "--cron",
        "0 3 * * *",
        "--tz",
        "Europe/Madrid",
        "--prohibit-overlap",
        "--",
        "./backup.sh",
    )
    assert made.returncode == 0, made.stderr
    assert made.stdout.startswith("nightly periodic: At 03:00 every day (Europe/Madrid); next ")
    at = datetime.fromisoformat(made.stdout.rstrip().rsplit(" ", 1)[1])
    assert at.astimezone(ZoneInfo("Europe/Madrid")).strftime("%H:%M:%S") == "03:00:00"
    listed = souq(cluster, "periodic", "--json")
    (record,) = [p for p in json.loads(listed.stdout) if p["name"] == "nightly"]
    assert record["spec"]["prohibit_overlap"] is True and record["spec"]["command"] == "./backup.sh"
    shown = souq(cluster, "periodic", "nightly")
    assert "overlap" in shown.stdout and "prohibited" in shown.stdout
    never = souq(cluster, "submit", "never", "--cron", "0 0 30 2 *", "--", "true")
    assert never.returncode != 0 and "never fires" in never.stderr and "cron" in never.stderr
    assert souq(cluster, "periodic-delete", "nightly").returncode == 0
    assert souq(cluster, "periodic", "nightly").returncode != 0
