"""The API under a fuzzer, on a real, secured cluster: no request gets a 5xx, and a malformed
body gets a 4xx naming its field.

Three sources of requests, each bounded (the file runs in about a minute):

* **malformed bodies**, every part of a real body as Fly's client sends it (a machine's create,
  update and quote, with services, checks, guest, stop config, mounts) replaced by JSON of each
  other shape: a mapping given a list or a scalar, a list given a mapping, a string given an
  object, at every depth, so that a validator that assumes a shape is found deterministically;
* **schema-derived** requests for every operation of ``/openapi.json``, well formed and not
  (Schemathesis' positive and negative modes), more of them for the machine bodies;
* **stateful** sequences along the links Schemathesis infers between operations (a created
  machine's id into its update, stop, lease and destroy).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode

from souq.testing import Cluster, auth_headers
from tests.clusters import ClusterSpec
from tests.fly.flaps import (
    go_json,
    launch_input,
    machine_check,
    machine_config,
    machine_guest,
    machine_init,
    machine_mount,
    machine_port,
    machine_restart,
    machine_service,
    stop_config,
)
from tests.json_paths import paths, put

APP = "fuzzed"
# JSON of each shape (each wrong for most parts of a body).
WRONG: list[Any] = [None, True, 1.5, "x", [None, None], [{}], {}, {"a": None}]
# The bodies whose models reshape Fly's input before validating it: fed the most examples.
MACHINE_BODIES = {
    ("POST", "/v1/apps/{app}/machines"),
    ("POST", "/v1/apps/{app}/machines/{machine_id}"),
    ("POST", "/v1/apps/{app}/quotes"),
}
SKIPPED = {"/v1/events"}  # a followed stream never ends by itself
_SETTINGS = settings(deadline=None, database=None, suppress_health_check=list(HealthCheck))


CLUSTER = ClusterSpec("fuzz", regions={"mad": 1})


@pytest.fixture(scope="module")
def http(cluster: Cluster) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=cluster.api_url, headers=auth_headers(), timeout=30) as client:
        yield client


def fly_launch(volume: str) -> dict[str, Any]:
    """A create body as flaps sends it, with every part a validator reshapes."""
    check = machine_check(port=8080, type="http", interval="15s", timeout="2s", path="/up")
    service = machine_service(
        protocol="tcp",
        internal_port=8080,
        autostop=True,
        autostart=True,
        ports=[machine_port(port=80, handlers=["http"])],
        checks=[check],
        concurrency={"type": "requests", "soft_limit": 5, "hard_limit": 10},
    )
    config = machine_config(
        env={"GREETING": "hi"},
        init=machine_init(exec=["sleep", "600"]),
        guest=machine_guest(cpu_kind="shared", cpus=1, memory_mb=64),
        metadata={"team": "a"},
        mounts=[machine_mount(path="/data", volume=volume)],
        services=[service],
        checks={"alive": machine_check(port=8080, type="tcp")},
        restart=machine_restart(policy="on-failure", max_retries=3),
        stop_config=stop_config(timeout="5s", signal="SIGTERM"),
    )
    body: dict[str, Any] = json.loads(go_json(launch_input(config=config, region="mad")))
    return body


def _get(value: Any, at: tuple[Any, ...]) -> Any:
    for part in at:
        value = value[part]
    return value


def _shape(value: Any) -> str:
    """A JSON value's kind: a number given for another number is not of another shape."""
    if isinstance(value, bool):
        return "bool"
    return "number" if isinstance(value, int | float) else type(value).__name__


def _malformed(wrong: Any, given: Any) -> bool:
    """Whether ``wrong`` is of another shape than the part it replaces (``null`` is not: in
    Fly's bodies it means unset, and the refusal may then name what is missing instead)."""
    return wrong is not None and _shape(wrong) != _shape(given)


def test_every_malformed_part_of_a_machine_body_is_a_4xx_naming_it(
    http: httpx.Client,
) -> None:
    """A create (as a dry run: nothing is made of a body that passes), an update of a machine
    that does not exist (the body is read first) and a quote."""
    made = http.post(f"/v1/apps/{APP}/volumes", json={"name": "data", "region": "mad"})
    assert made.status_code == 200, made.text
    launch = fly_launch(made.json()["id"])
    # A quote holds capacity anywhere in the region: it mounts no volume.
    quote = {"region": "mad", "config": {**launch["config"], "mounts": []}}
    bodies = [
        (f"/v1/apps/{APP}/machines?dry_run=true", launch),
        (f"/v1/apps/{APP}/machines/nonesuch", launch),
        (f"/v1/apps/{APP}/quotes", quote),
    ]
    good = http.post(bodies[0][0], json=launch)
    assert good.status_code == 200, good.text  # the body itself is good
    tried = 0
    for route, body in bodies:
        for at in list(paths(body))[1:]:  # every part, not the body itself
            named = [part for part in at if isinstance(part, str)][-1]
            for wrong in WRONG:
                r = http.post(route, json=put(body, at, wrong))
                where = f"POST {route} with {'.'.join(map(str, at))} = {wrong!r}"
                assert r.status_code < 500, f"{where}: {r.status_code} {r.text[:500]}"
                if r.status_code == 422 and _malformed(wrong, _get(body, at)):
                    assert named in r.json()["error"], f"{where}: {r.text[:500]}"
                tried += 1
    assert tried > 1_000


def _schema(cluster: Cluster) -> Any:
    schema = schemathesis.openapi.from_url(cluster.api_url + "/openapi.json")
    return schema.exclude(path=sorted(SKIPPED))


def _can_be_malformed(operation: Any) -> bool:
    """Whether a request of the operation can break its schema: it takes a body, a query,
    header or cookie parameter, or a path parameter with more to it than being a string. (A
    path segment is a string whatever it holds: asked for a malformed one, the generator draws
    for about a second and gives up, having sent nothing.)"""
    if list(operation.body):
        return True
    for parameter in operation.iter_parameters():
        if parameter.definition.get("in") != "path":
            return True
        schema = parameter.definition.get("schema", {})
        if set(schema) - {"type", "title", "description"} or schema.get("type") != "string":
            return True
    return False


# Every operation of the API fed a few requests each: about 10 s alone, and past the suite's 120 s
# per test when the box runs three workers and more operations come (a bound, not a hang).
@pytest.mark.timeout(480)
def test_no_operation_answers_a_server_error(cluster: Cluster) -> None:
    """Every operation, fed requests derived from its schema: well formed and malformed (each
    that can be: its body, its query, a path parameter with a format)."""
    tried = malformed = 0
    for found in _schema(cluster).get_all_operations():
        operation = found.ok()
        many = (operation.method.upper(), operation.path) in MACHINE_BODIES
        modes = [GenerationMode.POSITIVE]
        if _can_be_malformed(operation):
            modes.append(GenerationMode.NEGATIVE)
            malformed += 1
        for mode in modes:
            examples = 20 if many else 2

            @given(case=operation.as_strategy(generation_mode=mode))
            @settings(_SETTINGS, max_examples=examples)
            def answers(case: schemathesis.Case) -> None:
                response = case.call(base_url=cluster.api_url, headers=auth_headers(), timeout=30)
                assert response.status_code < 500, (
                    f"{case.method} {case.formatted_path} {case.query} answered "
                    f"{response.status_code}: {response.text[:500]}"
                )

            try:
                answers()
            except Unsatisfiable:  # nothing of it can be malformed (no body, no parameter)
                assert mode is GenerationMode.NEGATIVE, operation.label
        tried += 1
    assert tried >= 30  # every operation of the API was fed
    assert malformed >= 10  # the machines, quotas, audit, secrets ... operations, malformed too


NESTED = ("[" * 100_000 + "]" * 100_000, '{"values":' * 100_000 + "1" + "}" * 100_000)


def test_a_body_nested_past_any_decoder_is_a_4xx_on_every_operation(
    cluster: Cluster, http: httpx.Client
) -> None:
    """JSON nested deeper than a recursive decoder goes (100,000 levels): malformed, never a 500,
    on every operation that takes a body."""
    spec = http.get("/openapi.json").json()
    tried = 0
    for path, operations in spec["paths"].items():
        if path in SKIPPED:
            continue
        concrete = path.replace("{app}", APP)
        while "{" in concrete:
            concrete = concrete[: concrete.index("{")] + "x" + concrete[concrete.index("}") + 1 :]
        for method, operation in operations.items():
            if "requestBody" not in operation:
                continue
            for body in NESTED:
                r = http.request(
                    method.upper(),
                    concrete,
                    content=body,
                    headers={"Content-Type": "application/json"},
                )
                assert 400 <= r.status_code < 500, f"{method} {path}: {r.text[:300]}"
                tried += 1
    assert tried >= 20, tried  # the secrets, machines, volumes, apps ... bodies were all fed


def test_no_sequence_of_linked_calls_answers_a_server_error(cluster: Cluster) -> None:
    """Calls chained along the links between operations (a machine made, then acted on)."""
    base = _schema(cluster).as_state_machine()
    answered: list[int] = []

    class Links(base):  # type: ignore[valid-type, misc]
        def get_call_kwargs(self, case: schemathesis.Case) -> dict[str, Any]:
            return {"base_url": cluster.api_url, "headers": auth_headers(), "timeout": 30}

        def validate_response(self, response: Any, case: schemathesis.Case, **kwargs: Any) -> None:
            answered.append(response.status_code)
            assert response.status_code < 500, (
                f"{case.method} {case.formatted_path} answered {response.status_code}: "
                f"{response.text[:500]}"
            )

    Links.run(settings=settings(_SETTINGS, max_examples=20, stateful_step_count=6))
    assert len(answered) >= 40, answered  # sequences were run, not only their first calls
