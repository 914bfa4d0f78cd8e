from __future__ import annotations

import pytest

from souq.errors import (
    IllegalTransition,
    InsufficientCapacity,
    InvalidInput,
    NotFound,
    SouqError,
    Unavailable,
    error_from_body,
)


@pytest.mark.parametrize(
    ("cls", "http", "status"),
    [
        (NotFound, 404, "not_found"),
        (IllegalTransition, 409, "illegal_transition"),
        (InsufficientCapacity, 409, "insufficient_capacity"),
        (InvalidInput, 422, "invalid_input"),
        (Unavailable, 503, "unavailable"),
    ],
)
def test_every_error_maps_to_an_http_status_and_code(
    cls: type[SouqError], http: int, status: str
) -> None:
    err = cls("boom", hint="do this")
    assert err.http_status == http
    assert err.to_body() == {"error": "boom", "status": status, "hint": "do this"}


def test_errors_survive_a_round_trip_through_a_body() -> None:
    original = InsufficientCapacity("no room", details={"placement": {"winner": None}})
    again = error_from_body(original.to_body())
    assert type(again) is InsufficientCapacity
    assert again.message == "no room"
    assert again.details == {"placement": {"winner": None}}


def test_an_unknown_code_keeps_its_code_and_status() -> None:
    err = error_from_body({"error": "new thing", "status": "from_the_future"}, http_status=418)
    assert type(err) is SouqError
    assert err.status == "from_the_future"
    assert err.http_status == 418
