"""The route table: which scope each route needs, and of what."""

from __future__ import annotations

import pytest

from souq.auth.routes import Need, need_of
from souq.auth.tokens import Scope


@pytest.mark.parametrize(
    ("method", "path", "need"),
    [
        ("GET", "/healthz", None),
        ("GET", "/openapi.json", None),
        ("GET", "/ui", None),
        ("GET", "/ui/dashboard.js", None),
        ("GET", "/v1/apps/web/machines", Need(Scope.READ, "web")),
        ("GET", "/v1/apps/web/machines/abc/logs", Need(Scope.READ, "web")),
        ("POST", "/v1/apps/web/machines", Need(Scope.WRITE, "web")),
        ("DELETE", "/v1/apps/web/machines/abc", Need(Scope.WRITE, "web")),
        ("POST", "/v1/apps/web/machines/abc/lease", Need(Scope.WRITE, "web")),
        ("POST", "/v1/apps/web/quotes", Need(Scope.WRITE, "web")),
        ("POST", "/v1/apps/web/releases", Need(Scope.DEPLOY, "web")),
        ("POST", "/v1/apps/web/releases/3", Need(Scope.DEPLOY, "web")),
        ("POST", "/v1/apps/web/secrets", Need(Scope.DEPLOY, "web")),
        ("DELETE", "/v1/apps/web/secrets/DB_URL", Need(Scope.DEPLOY, "web")),
        ("GET", "/v1/apps/web/secrets", Need(Scope.DEPLOY, "web")),
        ("GET", "/v1/images", Need(Scope.READ, any_app=True)),
        ("POST", "/v1/images", Need(Scope.DEPLOY, any_app=True)),
        ("GET", "/v1/regions", Need(Scope.READ, any_app=True)),
        ("GET", "/v1/tokens/self", Need(Scope.READ, any_app=True)),
        ("POST", "/v1/tokens", Need(Scope.ADMIN)),
        ("GET", "/v1/audit", Need(Scope.ADMIN)),
        ("GET", "/v1/workers", Need(Scope.READ)),
        ("POST", "/v1/workers/w1/drain", Need(Scope.ADMIN)),
        ("GET", "/v1/events", Need(Scope.READ)),
        ("GET", "/metrics", Need(Scope.READ)),
        ("GET", "/v1/apps", Need(Scope.READ, any_app=True)),
        ("POST", "/v1/apps", Need(Scope.WRITE, any_app=True)),
        ("GET", "/v1/apps/web", Need(Scope.READ, "web")),
        ("DELETE", "/v1/apps/web", Need(Scope.WRITE, "web")),
        ("PUT", "/somewhere/else", Need(Scope.ADMIN)),
    ],
)
def test_need_of(method: str, path: str, need: Need | None) -> None:
    assert need_of(method, path) == need


def test_scopes_nest() -> None:
    assert Scope.ADMIN.covers() == [
        Scope.READ,
        Scope.WRITE,
        Scope.DEPLOY,
        Scope.QUEUE,
        Scope.ADMIN,
    ]
    assert Scope.READ.covers() == [Scope.READ]
    # A batch worker's scope stands beside the chain: deploy includes it, write does not, and
    # it includes nothing but itself.
    assert Scope.QUEUE in Scope.DEPLOY.covers() and Scope.QUEUE not in Scope.WRITE.covers()
    assert Scope.QUEUE.covers() == [Scope.QUEUE]


def test_the_sched_routes_check_the_jobs_app_themselves() -> None:
    assert need_of("GET", "/sched/status/j") == Need(Scope.READ, by_route=True)
    assert need_of("POST", "/sched/claim/j") == Need(Scope.WRITE, by_route=True)


def test_a_stream_counts_against_its_token_else_its_address() -> None:
    from starlette.requests import Request

    from souq.auth.tokens import Grant
    from souq.broker.cluster_routes import client_address

    grant = Grant("t_1", "", "web", Scope.READ, None, 1)
    base = {"type": "http", "method": "GET", "path": "/", "headers": [], "client": ("10.0.0.7", 5)}
    assert client_address(Request({**base, "state": {"grant": grant}})) == "token t_1"
    assert client_address(Request(base)) == "10.0.0.7"
