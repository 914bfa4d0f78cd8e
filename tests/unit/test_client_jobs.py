"""``souq job ...`` and the client's ``/sched`` calls: the requests they send, what they print,
their exit codes, against a stubbed client and a mock transport."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import httpx
import pytest
from typer.testing import CliRunner

from souq.client import SouqClient, cli
from souq.client.render import cluster_event
from souq.client.render_jobs import age
from souq.errors import JobNotFound, NotFound, SouqError, WaitTimeout
from souq.jobs.core import apply, new_job
from souq.model.job import Job, JobEvent, JobStopped, JobSubmit

runner = CliRunner()


def a_job(state: str = "pending", **spec: Any) -> Job:
    job = new_job(JobSubmit.model_validate({"name": "build", "command": "make", **spec}), 1_000)
    if state == "pending":
        return job
    job = apply(apply(job, JobEvent.CLAIM, 2_000, worker="w1"), JobEvent.START, 2_100)
    if state == "running":
        return job
    return apply(job, JobEvent.STOP, 3_000, stopped=JobStopped(exit_code=0 if state == "ok" else 2))


class Stub:
    def __init__(self) -> None:
        self.calls: list[tuple[str, tuple[Any, ...], dict[str, Any]]] = []
        self.answers: dict[str, Any] = {}

    def __getattr__(self, name: str) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            self.calls.append((name, args, kwargs))
            answer = self.answers.get(name, a_job())
            if isinstance(answer, SouqError):
                raise answer
            return answer

        return call


@pytest.fixture
def stub(monkeypatch: pytest.MonkeyPatch) -> Stub:
    client = Stub()
    monkeypatch.setattr(cli, "make_client", lambda: client)
    return client


def invoke(*args: str) -> Any:
    return runner.invoke(cli.app, ["job", *args])


def test_submit_sends_an_argv_and_the_options(stub: Stub) -> None:
    result = invoke(
        "submit", "build", "--restart", "on-failure", "--max-retries", "2", "--backoff", "0.5",
        "--deadline", "60", "--cpus", "2", "--memory-mb", "512", "-e", "A=1", "--env", "B=x=y",
        "--app", "web", "--", "make", "-j4", "--keep-going",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert result.stdout == "build pending\n"
    [(name, (body,), _)] = stub.calls
    assert name == "submit_job"
    assert body == {
        "name": "build",
        "command": ["make", "-j4", "--keep-going"],
        "restart": "on-failure",
        "max_retries": 2,
        "backoff_s": 0.5,
        "deadline_s": 60.0,
        "cpus": 2.0,
        "memory_mb": 512,
        "env": {"A": "1", "B": "x=y"},
        "app": "web",
    }


def test_one_word_after_the_dashes_is_a_shell_line(stub: Stub) -> None:
    result = invoke("submit", "build", "--json", "--", "make test > out.log 2>&1")
    assert result.exit_code == 0, result.output
    assert stub.calls[0][1] == ({"name": "build", "command": "make test > out.log 2>&1"},)
    assert json.loads(result.stdout)["name"] == "build"


@pytest.mark.parametrize(
    "args",
    [
        ["submit", "build"],  # no command
        ["submit", "build", "--restart", "always", "--", "x"],  # not a job's policy
        ["submit", "build", "-e", "NOEQUALS", "--", "x"],
        ["wait", "build", "--timeout", "soon"],
    ],
)
def test_bad_arguments_are_usage_errors(stub: Stub, args: list[str]) -> None:
    result = invoke(*args)
    assert result.exit_code == 2, result.output
    assert not stub.calls


def test_an_api_error_is_its_message_and_exit_1(stub: Stub) -> None:
    stub.answers["job"] = JobNotFound("no job nope", hint="`souq job list` shows the jobs")
    result = invoke("status", "nope")
    assert result.exit_code == 1
    assert "error: no job nope" in result.stderr and "souq job list" in result.stderr
    as_json = invoke("status", "nope", "--json")
    assert json.loads(as_json.stderr)["status"] == "job_not_found"


def test_status_and_list(stub: Stub) -> None:
    stub.answers["job"] = a_job("failed", restart="on-failure", max_retries=0)
    shown = invoke("status", "build")
    assert shown.exit_code == 0, shown.output
    for text in ("failed", "exited 2", "on-failure (at most 0 retries", "exit code", "make"):
        assert text in shown.stdout
    stub.answers["jobs"] = [a_job("running"), a_job()]
    listed = invoke("list")
    assert listed.stdout.splitlines()[0].split() == [
        "NAME", "STATE", "WORKER", "ATTEMPTS", "AGE", "WHY",
    ]  # fmt: skip
    running = invoke("list", "--state", "running", "--json")
    assert [j["state"] for j in json.loads(running.stdout)] == ["running"]
    none = invoke("list", "--state", "succeeded")
    assert none.exit_code == 0 and none.stdout == "" and "no jobs" in none.stderr
    bad = invoke("list", "--state", "done")
    assert bad.exit_code == 2 and "'done' is not one of 'pending'" in bad.stderr  # usage
    assert invoke("list", "--app", "web").exit_code == 0
    assert stub.calls[-1] == ("jobs", (), {"app": "web"})


def test_wait_exits_0_only_when_the_job_succeeded(stub: Stub) -> None:
    stub.answers["wait_job"] = a_job("ok")
    ok = invoke("wait", "build", "--timeout", "5")
    assert ok.exit_code == 0, ok.output
    assert ok.stdout == "build succeeded  (exited 0)\n"
    assert stub.calls[-1] == ("wait_job", ("build",), {"timeout": 5.0})
    stub.answers["wait_job"] = a_job("failed")
    failed = invoke("wait", "build", "--json")
    assert failed.exit_code == 1
    assert json.loads(failed.stdout)["state"] == "failed"
    assert json.loads(failed.stderr)["status"] == "job_failed"
    stub.answers["wait_job"] = WaitTimeout("job build is still running after 5s")
    late = invoke("wait", "build", "--timeout", "5")
    assert late.exit_code == 1 and "still running" in late.stderr


def test_cancel_and_logs(stub: Stub) -> None:
    stub.answers["cancel_job"] = apply(a_job("running"), JobEvent.CANCEL, 2_500)
    asked = invoke("cancel", "build")
    assert asked.exit_code == 0
    assert asked.stdout.startswith("build running  (cancel asked")
    stub.answers["job_logs"] = "compiling\ndone\n"
    assert invoke("logs", "build").stdout == "compiling\ndone\n"
    assert json.loads(invoke("logs", "build", "--json").stdout) == {"data": "compiling\ndone\n"}


def test_a_job_event_line_in_souq_events(capsys: pytest.CaptureFixture[str]) -> None:
    cluster_event(
        {
            "seq": 7,
            "kind": "job",
            "timestamp": 0,
            "worker_id": "w1",
            "region": "",
            "state": "succeeded",
            "previous": "running",
            "job": {"name": "build", "type": "succeeded", "why": "exited 0", "attempts": 1},
        }
    )
    out = capsys.readouterr().out
    assert "job     build worker=w1 running -> succeeded (succeeded: exited 0)" in out


def test_ages_read_as_people_write_them() -> None:
    assert [age(0, ms) for ms in (999, 42_000, 300_000, 7_200_000, 2 * 86_400_000)] == [
        "0s", "42s", "5m", "2h", "2d",
    ]  # fmt: skip


# -- the client's calls ------------------------------------------------------------------------


def client_with(handler: Callable[[httpx.Request], httpx.Response]) -> SouqClient:
    return SouqClient("http://broker:4280", token="t", transport=httpx.MockTransport(handler))


def test_the_client_sends_worker_names_and_bodies() -> None:
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        if request.url.path in ("/sched/list", "/sched/jobs", "/sched/cancellations"):
            return httpx.Response(200, json=[a_job().model_dump(mode="json")])
        return httpx.Response(200, json=a_job().model_dump(mode="json"))

    client = client_with(handler)
    client.submit_job(JobSubmit(name="build", command=["make"]))
    client.claim_job("build", worker="w1", lease_s=5)
    client.job_stopped("build", worker="w1", exit_code=3, error="boom")
    assert [j.name for j in client.cancellations(worker="w1")] == ["build"]
    submit, claim, stopped, cancellations = seen
    assert json.loads(submit.content)["command"] == ["make"]
    assert (claim.url.path, dict(claim.url.params)) == (
        "/sched/claim/build",
        {"worker": "w1", "lease_s": "5"},
    )
    assert json.loads(stopped.content) == {"exit_code": 3, "error": "boom"}
    assert cancellations.url.params["worker"] == "w1"
    assert submit.headers["Authorization"] == "Bearer t"


def test_job_logs_tells_a_missing_route_from_a_missing_job() -> None:
    def no_route(request: httpx.Request) -> httpx.Response:
        body = {"error": f"no such route: GET {request.url.path}", "status": "not_found"}
        return httpx.Response(404, json=body)

    with pytest.raises(NotFound) as err:
        client_with(no_route).job_logs("build")
    assert not isinstance(err.value, JobNotFound)
    assert "keeps no job logs" in err.value.message and "souq job status" in (err.value.hint or "")

    def no_job(request: httpx.Request) -> httpx.Response:
        return httpx.Response(404, json={"error": "no job build", "status": "job_not_found"})

    with pytest.raises(JobNotFound):
        client_with(no_job).job_logs("build")
    text = client_with(lambda _: httpx.Response(200, text="out\n")).job_logs("build")
    assert text == "out\n"


def test_wait_job_asks_until_the_job_ended_or_the_deadline() -> None:
    answers = [a_job(), a_job("running"), a_job("ok")]

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json=answers.pop(0).model_dump(mode="json"))

    assert client_with(handler).wait_job("build", timeout=30).state == "succeeded"
    assert not answers
    pending = client_with(lambda _: httpx.Response(200, json=a_job().model_dump(mode="json")))
    with pytest.raises(WaitTimeout, match="still pending"):
        pending.wait_job("build", timeout=0)
