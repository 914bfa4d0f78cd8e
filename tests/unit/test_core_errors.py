from __future__ import annotations

import pytest

from souq.errors import (
    DeployFailed,
    DeployNoCapacity,
    IllegalTransition,
    ImageInvalid,
    ImageNotFound,
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
        (ImageNotFound, 404, "image_not_found"),
        (ImageInvalid, 422, "image_invalid"),
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


def test_image_errors_sit_under_their_families_and_round_trip() -> None:
    # A handler of NotFound / InvalidInput also handles the image errors, and the codes survive
    # the bus and the HTTP API.
    assert issubclass(ImageNotFound, NotFound)
    assert issubclass(ImageInvalid, InvalidInput)
    for cls in (ImageNotFound, ImageInvalid):
        again = error_from_body(cls("x", hint="y").to_body())
        assert type(again) is cls


def test_a_deploy_short_of_room_is_a_failed_deploy_and_a_refused_placement() -> None:
    err = DeployNoCapacity("release v4 cannot start: no room", details={"phase": "reserve"})
    assert isinstance(err, DeployFailed) and isinstance(err, InsufficientCapacity)  # exit 3
    assert (err.http_status, err.to_body()["status"]) == (409, "insufficient_capacity")
    # Its code is the placement's: a body with it reads back as the placement's error.
    assert type(error_from_body(err.to_body())) is InsufficientCapacity
