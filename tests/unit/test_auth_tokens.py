"""Tokens: what a grant allows, narrowing, expiry, forgery, another cluster's key."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import biscuit_auth as biscuit
import pytest

from souq.auth.tokens import (
    Scope,
    Verifier,
    generate_key,
    mint,
    narrow,
    private_key_from_text,
    private_key_text,
    public_key_from_text,
    public_key_text,
)
from souq.errors import Forbidden, Unauthorized

KEY = generate_key()
PUBLIC = public_key_from_text(public_key_text(KEY))


def check(token: str, app: str | None, action: Scope) -> str:
    return Verifier(PUBLIC).authorize(f"Bearer {token}", app=app, action=action).identity


def test_keys_round_trip_as_text() -> None:
    again = private_key_from_text(private_key_text(KEY))
    assert public_key_text(again) == public_key_text(KEY)


def test_a_grant_reaches_its_app_and_scope_only() -> None:
    token, grant = mint(KEY, app="web", scope=Scope.WRITE, name="w")
    assert grant.app == "web" and grant.scope is Scope.WRITE and grant.name == "w"
    assert check(token, "web", Scope.READ) == grant.token_id
    assert check(token, "web", Scope.WRITE) == grant.token_id
    for app, action in [("web", Scope.DEPLOY), ("db", Scope.READ), (None, Scope.READ)]:
        with pytest.raises(Forbidden):
            check(token, app, action)


def test_a_queue_token_works_its_apps_queue_and_reaches_nothing_else() -> None:
    token, _ = mint(KEY, app="web", scope=Scope.QUEUE)
    assert check(token, "web", Scope.QUEUE)
    for app, action in [("web", Scope.READ), ("web", Scope.WRITE), ("db", Scope.QUEUE)]:
        with pytest.raises(Forbidden):
            check(token, app, action)
    deployer, _ = mint(KEY, app="web", scope=Scope.DEPLOY)
    assert check(deployer, "web", Scope.QUEUE)  # it may read the secrets a job's env holds
    writer, _ = mint(KEY, app="web", scope=Scope.WRITE)
    with pytest.raises(Forbidden):
        check(writer, "web", Scope.QUEUE)
    # Narrowed to queue, a deploy token keeps only that.
    worker = narrow(deployer, PUBLIC, scope=Scope.QUEUE)
    assert check(worker, "web", Scope.QUEUE)
    with pytest.raises(Forbidden):
        check(worker, "web", Scope.READ)
    assert not Verifier(PUBLIC).allows(f"Bearer {worker}", app="web", action=Scope.WRITE)


def test_all_apps_reach_the_cluster() -> None:
    token, _ = mint(KEY, scope=Scope.ADMIN)
    assert check(token, None, Scope.ADMIN)
    assert check(token, "anything", Scope.DEPLOY)


def test_narrowing_takes_away_and_never_adds() -> None:
    token, grant = mint(KEY, scope=Scope.ADMIN)
    web_reader = narrow(narrow(token, PUBLIC, app="web"), PUBLIC, scope=Scope.READ)
    assert check(web_reader, "web", Scope.READ) == grant.token_id + "+2"
    for app, action in [("web", Scope.WRITE), ("db", Scope.READ), (None, Scope.READ)]:
        with pytest.raises(Forbidden):
            check(web_reader, app, action)
    forged = (
        biscuit.Biscuit.from_base64(web_reader, PUBLIC)
        .append(biscuit.BlockBuilder('right("*", "admin"); app("db");'))
        .to_base64()
    )
    with pytest.raises(Forbidden):
        check(forged, "db", Scope.READ)


def test_expiry_from_the_grant_and_from_a_narrowing() -> None:
    past = datetime.now(UTC) - timedelta(hours=2)
    old, _ = mint(KEY, scope=Scope.ADMIN, ttl_s=60, now=past)
    with pytest.raises(Unauthorized, match="expired"):
        check(old, None, Scope.READ)
    fresh, _ = mint(KEY, scope=Scope.ADMIN)
    briefly = narrow(fresh, PUBLIC, ttl_s=60, now=past)
    with pytest.raises(Unauthorized, match="expired"):  # past a narrowed ttl: expired too
        check(briefly, None, Scope.READ)
    later = narrow(fresh, PUBLIC, ttl_s=3600)  # the earliest ttl is the token's expiry
    with pytest.raises(Unauthorized, match="expired"):
        check(narrow(later, PUBLIC, ttl_s=60, now=past), None, Scope.READ)
    assert check(later, None, Scope.READ)


def test_bad_tokens_are_unauthorized() -> None:
    other, _ = mint(generate_key(), scope=Scope.ADMIN)
    for header in [None, "", "Basic abc", "Bearer ", "Bearer garbage", f"Bearer {other}"]:
        with pytest.raises(Unauthorized):
            Verifier(PUBLIC).authorize(header, app=None, action=Scope.READ)
