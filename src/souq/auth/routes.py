"""What each API route needs: the scope, and of which app (or of the cluster).

One table for every HTTP server Souq runs (the broker's API, the proxy's admin port), so that a
route added anywhere is covered by the same rule:

================================================  ===========  ===========================
route                                             scope        of
================================================  ===========  ===========================
``/healthz``, ``/openapi.json``, ``/ui…``, docs   none         (public: no data)
``/v1/apps/{app}/secrets…`` (any method)          deploy       the app
``/v1/apps/{app}/machines/{id}…``                 (declared)   the app: :mod:`souq.operations`
``POST /v1/apps/{app}/machines/{id}/exec``        deploy       the app (it sees the secrets)
``PUT|DELETE /v1/apps/{app}/quota…``              admin        the cluster (not the app's)
``GET /v1/apps/{app}/…``                          read         the app
``POST|DELETE /v1/apps/{app}/releases…|secrets…`` deploy       the app
``POST|PUT|DELETE /v1/apps/{app}/…`` (the rest)   write        the app (volumes too)
``POST /v1/apps`` (create an app)                 write        any app the token has (*)
``GET /v1/apps`` (list the apps)                  read         any app the token has (*)
``GET /v1/images…``, ``/v1/regions``              read         any app the token has
``POST /v1/images``                               deploy       any app the token has
``GET /v1/tokens/key``, ``/v1/tokens/self``       read         any app the token has
``GET /backends``, ``/decisions`` (proxy admin)   read         any app the token has (***)
``/v1/tokens…`` (the rest), ``/v1/audit``         admin        the cluster
``/sched/…`` (batch jobs)                         (the route)  the job's app (**)
``POST /v1/workers/…`` (cordon, drain)            admin        the cluster
``GET`` anything else (workers, events, metrics)  read         the cluster
anything else                                     admin        the cluster
================================================  ===========  ===========================

"Any app the token has": an app's token may push images and read regions (a deploy of its app
needs both); the image routes keep an app's token to its app's names and images
(:mod:`souq.broker.image_routes`). (*) The app is in the body or in the answer: an
app's token creates only its app and lists only its app (the route checks, see
:mod:`souq.broker.app_routes`). ``GET|DELETE /v1/apps/{app}`` are the app's read and write.
(***) The proxy's admin routes answer about the token's app only (a token of every app: all).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from souq.auth.tokens import Scope
from souq.operations import OPERATIONS

__all__ = ["Need", "need_of"]

_PUBLIC = {"/healthz", "/openapi.json", "/docs", "/docs/oauth2-redirect", "/redoc"}
_APP = re.compile(r"^/v1/apps/([^/]+)(/.*)?$")
_ANY_APP_READS = ("/v1/images", "/v1/regions", "/v1/tokens/key", "/v1/tokens/self")
_PROXY_APP_READS = ("/backends", "/decisions")  # the proxy's admin port: the route scopes them
_READ = {"GET", "HEAD"}
# Each route under one machine, with the scope its operation declares (souq.operations).
_MACHINE_ROUTES = tuple(
    (
        op.method,
        re.compile("^/machines/[^/]+" + re.sub(r"\{[^}]+\}", "[^/]+", op.path) + "/?$"),
        Scope(op.scope),
    )
    for op in OPERATIONS
)


@dataclass(frozen=True)
class Need:
    """A route's requirement: ``action`` on ``app`` (None: the cluster; ``any_app``: whichever
    app the token is for; ``by_route``: the route checks, against the app it reads)."""

    action: Scope
    app: str | None = None
    any_app: bool = False
    by_route: bool = False  # any valid token: the route checks the app it reads


def need_of(method: str, path: str) -> Need | None:
    """What ``method path`` needs; None for a public route."""
    if path in _PUBLIC or path == "/ui" or path.startswith("/ui/"):
        return None
    reading = method in _READ
    match = _APP.match(path)
    if match is not None:
        return _of_app(method, match.group(1), match.group(2) or "")
    return _of_cluster(reading, path)


def _of_app(method: str, app: str, rest: str) -> Need:
    if rest.startswith("/secrets"):
        return Need(Scope.DEPLOY, app)  # even their names and digests
    if rest.startswith("/machines/"):
        declared = _declared(method, rest)
        if declared is not None:
            return Need(declared, app)
    if method in _READ:
        return Need(Scope.READ, app)
    if rest.rstrip("/") == "/quota" or rest.startswith("/quota/"):  # an app may not raise it
        return Need(Scope.ADMIN)
    deploying = rest.startswith("/releases")
    return Need(Scope.DEPLOY if deploying else Scope.WRITE, app)


def _declared(method: str, rest: str) -> Scope | None:
    """The scope of the machine route ``method rest`` (``/machines/{id}…``) as its operation
    declares it; None for a route no operation declares."""
    method = "GET" if method == "HEAD" else method
    for declared_method, pattern, scope in _MACHINE_ROUTES:
        if declared_method == method and pattern.match(rest):
            return scope
    return None


def _of_cluster(reading: bool, path: str) -> Need:
    if path.startswith(("/v1/audit", "/v1/tokens/revoked")):
        return Need(Scope.ADMIN)
    if path == "/v1/apps":  # the route narrows it to the token's app
        return Need(Scope.READ if reading else Scope.WRITE, any_app=True)
    if path.startswith("/sched/"):  # batch jobs: the app is the job's, read by the route
        return Need(Scope.READ if reading else Scope.WRITE, by_route=True)
    if reading and path in _PROXY_APP_READS:
        return Need(Scope.READ, any_app=True)
    if path.startswith(_ANY_APP_READS) and (reading or path == "/v1/images"):
        return Need(Scope.READ if reading else Scope.DEPLOY, any_app=True)
    return Need(Scope.READ if reading else Scope.ADMIN)
