"""API tokens: biscuits signed with the cluster's token key, narrowed offline by their holders.

A token's first block (its *authority*, signed with the cluster's private token key) says who it
is and what it may do::

    token("t_5f3a…");  name("ci for web");  right("web", "deploy");
    check if time($t), $t < 2026-12-01T00:00:00Z;

``right(APP, SCOPE)`` grants SCOPE on one app, or on every app and the cluster itself when APP is
``"*"``. Scopes nest: ``admin`` ⊇ ``deploy`` ⊇ ``write`` ⊇ ``read``, and ``deploy`` ⊇ ``queue``.

* ``read`` — every ``GET``: machines, releases, events, metrics.
* ``write`` — a machine's life: create, start, stop, update, destroy, leases, signals, quotes.
* ``deploy`` — what a deploy does beyond that: releases, images, secrets.
* ``admin`` — the cluster: workers, tokens, the audit log.
* ``queue`` — a batch worker of the app's queue, and only that: list the app's waiting jobs,
  claim them (their env included) and report their runs. Beside the chain, not in it: it
  reads nothing else of the app, and neither ``read`` nor ``write`` covers it.

Whoever holds a token can make a narrower one without the key and without asking anyone
(:func:`narrow`): it appends a block of checks (one app, a lower scope, an earlier expiry) that
every later use must pass too. No block can widen what the first grants: the policy trusts only
the authority block and the facts of the request.

Checking needs only the public key (:class:`Verifier`): no database, no call to anyone. A token
seen before is not parsed again, and a decision holds for a second (:data:`DECISION_TTL_S`).
"""

from __future__ import annotations

import functools
import re
import secrets
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from typing import Any

import biscuit_auth as biscuit

from souq.errors import Forbidden, InvalidInput, Unauthorized

__all__ = [
    "ALL_APPS",
    "DECISION_TTL_S",
    "Grant",
    "Scope",
    "Verifier",
    "generate_key",
    "mint",
    "narrow",
    "private_key_from_text",
    "private_key_text",
    "public_key_from_text",
    "public_key_text",
]

ALL_APPS = "*"
DECISION_TTL_S = 1.0  # a decision is reused this long (a token expiring meanwhile: 1 s late)
_CACHE = 4096  # tokens (and decisions) remembered
_MAX_TOKEN = 16 * 1024  # characters: a longer Authorization header is refused unread
# The checks' own time bound. The library's default (1 ms of wall time) is met by the check
# itself (tens of microseconds) but not by a busy process that is preempted in the middle of
# one: a valid token was refused (403) under load. A token's blocks are small and Souq's policy
# is fixed, so this bound only stops a pathological token.
_MAX_CHECK_TIME = timedelta(milliseconds=250)


class Scope(StrEnum):
    READ = "read"
    WRITE = "write"
    DEPLOY = "deploy"
    ADMIN = "admin"
    QUEUE = "queue"  # a batch worker of the app's queue (beside the chain)

    def covers(self) -> list[Scope]:
        """The scopes this one includes (itself among them)."""
        return list(_COVERS[self])


_COVERS: dict[Scope, tuple[Scope, ...]] = {
    Scope.READ: (Scope.READ,),
    Scope.WRITE: (Scope.READ, Scope.WRITE),
    Scope.DEPLOY: (Scope.READ, Scope.WRITE, Scope.DEPLOY, Scope.QUEUE),
    Scope.ADMIN: (Scope.READ, Scope.WRITE, Scope.DEPLOY, Scope.QUEUE, Scope.ADMIN),
    Scope.QUEUE: (Scope.QUEUE,),
}


@dataclass(frozen=True)
class Grant:
    """What a token is, as its authority block says (narrowing blocks only take away)."""

    token_id: str
    name: str
    app: str  # ALL_APPS: every app and the cluster
    scope: Scope
    expires_at: datetime | None
    narrowed: int  # blocks appended by holders

    @property
    def identity(self) -> str:
        """Who did it, for the audit log: the token's id (and how often it was narrowed)."""
        return self.token_id + (f"+{self.narrowed}" if self.narrowed else "")


# -- keys ----------------------------------------------------------------------------------


def generate_key() -> biscuit.PrivateKey:
    return biscuit.KeyPair().private_key


def private_key_text(key: biscuit.PrivateKey) -> str:
    """``ed25519-private/<hex>``."""
    return str(key)


def private_key_from_text(text: str) -> biscuit.PrivateKey:
    return biscuit.PrivateKey(text.strip())


def public_key_text(key: biscuit.PrivateKey) -> str:
    """``ed25519/<hex>``: what a verifier needs, and all it needs."""
    return str(biscuit.KeyPair.from_private_key(key).public_key)


def public_key_from_text(text: str) -> biscuit.PublicKey:
    return biscuit.PublicKey(text.strip())


# -- making tokens -------------------------------------------------------------------------


def mint(
    key: biscuit.PrivateKey,
    *,
    app: str = ALL_APPS,
    scope: Scope = Scope.READ,
    ttl_s: float | None = None,
    name: str = "",
    now: datetime | None = None,
) -> tuple[str, Grant]:
    """A new token and what it grants."""
    _check_app(app)
    if ttl_s is not None and ttl_s <= 0:
        raise InvalidInput("a token's ttl must be positive", hint="give --ttl in seconds")
    token_id = "t_" + secrets.token_hex(8)
    code = "token({id}); name({name}); right({app}, {scope});"
    params: dict[str, Any] = {"id": token_id, "name": name, "app": app, "scope": str(scope)}
    expires = None
    if ttl_s is not None:
        expires = (now or datetime.now(UTC)) + timedelta(seconds=ttl_s)
        code += " expires({expires}); check if time($t), $t < {expires};"
        params["expires"] = expires
    token = biscuit.BiscuitBuilder(code, params).build(key)
    return token.to_base64(), Grant(token_id, name, app, scope, expires, 0)


def narrow(
    token: str,
    public_key: biscuit.PublicKey,
    *,
    app: str | None = None,
    scope: Scope | None = None,
    ttl_s: float | None = None,
    now: datetime | None = None,
) -> str:
    """The same token with one more block of checks: only APP, at most SCOPE, not after TTL.
    Needs no secret (the public key only reads it): anyone holding a token can pass on less
    than it grants."""
    if app is None and scope is None and ttl_s is None:
        raise InvalidInput("narrowing needs an app, a scope or a ttl")
    parsed = _verified(token, public_key)
    checks: list[str] = []
    params: dict[str, Any] = {}
    if app is not None:
        _check_app(app)
        checks.append("check if app({app});")
        params["app"] = app
    if scope is not None:
        ops = ", ".join(f'"{s}"' for s in scope.covers())
        checks.append(f"check if operation($op), [{ops}].contains($op);")
    if ttl_s is not None:
        if ttl_s <= 0:
            raise InvalidInput("a token's ttl must be positive", hint="give --ttl in seconds")
        checks.append("check if time($t), $t < {expires};")
        params["expires"] = (now or datetime.now(UTC)) + timedelta(seconds=ttl_s)
    block = biscuit.BlockBuilder(" ".join(checks), params)
    return str(parsed.append(block).to_base64())


def _verified(token: str, public_key: biscuit.PublicKey) -> Any:
    try:
        return biscuit.Biscuit.from_base64(token, public_key)
    except Exception as exc:  # the library's own errors: not a token, or another cluster's
        raise Unauthorized(
            "the token is not valid for this cluster",
            hint="check SOUQ_TOKEN (or the token file) belongs to this cluster",
        ) from exc


def _check_app(app: str) -> None:
    if app != ALL_APPS and not (0 < len(app) <= 63 and app.replace("-", "").isalnum()):
        raise InvalidInput(f"app {app!r} is not an app name (letters, digits and '-')")


# -- checking tokens -----------------------------------------------------------------------

_POLICY = (
    " ".join(f'covers("{s}", "{op}");' for s in Scope for op in _COVERS[s])
    + """
allow if operation($op), app($a), right($a, $s), covers($s, $op);
allow if operation($op), right("*", $s), covers($s, $op);
deny if true;
"""
)


class Verifier:
    """Checks tokens against the cluster's public key; thread-safe."""

    def __init__(self, public_key: biscuit.PublicKey) -> None:
        self._key = public_key
        # A token seen before is not checked again (a refused one is: errors are not kept).
        self._parse: Callable[[str], tuple[Any, Grant]] = functools.lru_cache(maxsize=_CACHE)(
            self._parse_anew
        )
        self._decisions: OrderedDict[tuple[str, str | None, Scope], tuple[float, bool]] = (
            OrderedDict()
        )
        self._lock = threading.Lock()
        self._revoked: set[str] = set()

    def revoke(self, token_id: str) -> None:
        """Refuse the token with that id (and every narrowed copy of it) from now on."""
        self._revoked.add(token_id)

    def authorize(self, header: str | None, *, app: str | None, action: Scope) -> Grant:
        """The grant of the bearer token in an ``Authorization`` header, if it may do
        ACTION on APP (None: the cluster); :class:`Unauthorized` without a valid token,
        :class:`Forbidden` when it is valid but does not reach that far."""
        token = _bearer(header)
        parsed, grant = self._parse(token)
        self._check_live(grant)
        key = (token, app, action)
        now = time.monotonic()
        with self._lock:
            cached = self._decisions.get(key)
        if cached is not None and cached[0] > now:
            allowed = cached[1]
        else:
            allowed = self._decide(parsed, app, action)
            with self._lock:
                self._decisions[key] = (now + DECISION_TTL_S, allowed)
                self._decisions.move_to_end(key)
                while len(self._decisions) > _CACHE:
                    self._decisions.popitem(last=False)
        if not allowed:
            where = f"app {app}" if app else "the cluster"
            raise Forbidden(
                f"token {grant.identity} may not {action} {where}",
                hint=f"use a token with {action} on {where}",
                details={"token": grant.identity, "action": str(action), "app": app},
            )
        return grant

    def allows(self, header: str | None, *, app: str | None, action: Scope) -> bool:
        """Whether the (valid) token may do ACTION on APP: :meth:`authorize` without the
        refusal."""
        try:
            self.authorize(header, app=app, action=action)
        except Forbidden:
            return False
        return True

    def grant(self, header: str | None) -> Grant:
        """What a token's authority block says, once its signature is checked."""
        return self._parse(_bearer(header))[1]

    def authenticate(self, header: str | None) -> Grant:
        """The grant of a valid token, not revoked nor past its first block's expiry, whatever
        it may do (for a route that checks the scope itself, against what it reads)."""
        grant = self.grant(header)
        self._check_live(grant)
        return grant

    def _check_live(self, grant: Grant) -> None:
        if grant.token_id in self._revoked:
            raise Unauthorized(
                f"token {grant.token_id} was revoked", hint="ask for a new one (souq token create)"
            )
        if grant.expires_at is not None and grant.expires_at <= datetime.now(UTC):
            raise Unauthorized(
                f"token {grant.token_id} expired at {grant.expires_at:%Y-%m-%d %H:%M:%S} UTC",
                hint="ask for a new one (souq token create)",
            )

    def _parse_anew(self, token: str) -> tuple[Any, Grant]:
        """The token checked against the key and its grant read (what ``_parse`` remembers)."""
        parsed = _verified(token, self._key)
        try:
            return parsed, _grant_of(parsed)
        except biscuit.AuthorizationError as exc:
            raise Unauthorized("the token's first block cannot be read") from exc

    @staticmethod
    def _decide(parsed: Any, app: str | None, action: Scope) -> bool:
        params: dict[str, Any] = {"now": datetime.now(UTC), "op": str(action)}
        code = "time({now}); operation({op});"
        if app is not None:
            code += " app({app});"
            params["app"] = app
        builder = _bounded(biscuit.AuthorizerBuilder(code + _POLICY, params))
        try:
            builder.build(parsed).authorize()
        except biscuit.AuthorizationError:
            return False
        return True


def _bounded(builder: Any) -> Any:
    limits = builder.limits()
    limits.max_time = _MAX_CHECK_TIME
    builder.set_limits(limits)
    return builder


def _bearer(header: str | None) -> str:
    if not header:
        raise Unauthorized(
            "this route needs a token",
            hint="send Authorization: Bearer TOKEN (the CLI reads SOUQ_TOKEN)",
        )
    kind, _, token = header.partition(" ")
    token = token.strip()
    if kind.lower() != "bearer" or not token:
        raise Unauthorized("the Authorization header must be 'Bearer TOKEN'")
    if len(token) > _MAX_TOKEN:
        raise Unauthorized(f"the token is longer than {_MAX_TOKEN} characters")
    return token


def _grant_of(parsed: Any) -> Grant:
    """The authority block's facts (which only the key's holder can have written)."""
    authorizer = _bounded(biscuit.AuthorizerBuilder("allow if true;")).build(parsed)
    rule = biscuit.Rule(
        "grant($id, $name, $app, $scope) <- token($id), name($name), right($app, $scope)"
    )
    facts = authorizer.query(rule)
    if not facts:
        raise Unauthorized("the token grants nothing", hint="ask for a new one (souq token create)")
    token_id, name, app, scope = (t for t in facts[0].terms)
    ends = authorizer.query(biscuit.Rule("ends($e) <- expires($e)"))
    expiries = [ends[0].terms[0]] if ends else []
    expiries += _narrowed_expiries(parsed)
    return Grant(
        token_id=str(token_id),
        name=str(name),
        app=str(app),
        scope=Scope(str(scope)),
        expires_at=min(expiries) if expiries else None,
        narrowed=int(parsed.block_count()) - 1,
    )


# A ttl a holder narrowed the token to, as :func:`narrow` writes it (and biscuit prints it).
_NARROWED_TTL = re.compile(r"^check if time\(\$t\), \$t < (\S+);$", re.MULTILINE)


def _narrowed_expiries(parsed: Any) -> list[datetime]:
    """When the ttls of the token's later blocks end: a token past one is expired (401), as one
    past its first block's expiry is, not merely refused (403)."""
    found = []
    for block in range(1, int(parsed.block_count())):
        for text in _NARROWED_TTL.findall(str(parsed.block_source(block))):
            try:
                found.append(datetime.fromisoformat(text))
            except ValueError:
                continue  # not a time: the check stays the authorizer's to refuse
    return found
