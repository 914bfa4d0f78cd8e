"""Every model Souq validates input with (a request's body, a peer's message) answers any JSON
with its value or a :class:`~pydantic.ValidationError` naming the field, never another
exception: a mapping given a list or a scalar, a list given a mapping, a string given an
object, at every depth of a body whose other parts are well formed. (Before-validators see the
raw input; one that assumed its shape was a 500 at the API: ``config.checks: [null, null]``.)"""

from __future__ import annotations

import enum
import inspect
import types
import typing
from typing import Any, Literal, get_args, get_origin

import pytest
from pydantic import BaseModel, ValidationError

import souq.broker.app  # every route's body model, imported
import souq.protocol  # noqa: F401  (every message between processes)
from souq.model.base import Input
from tests.json_paths import paths, put

# JSON of every shape, each wrong for most fields.
WRONG: list[Any] = [
    None,
    True,
    0,
    -1,
    1.5,
    "x",
    "",
    [],
    [None, None],
    [{}],
    [[]],
    [1],
    {},
    {"a": None},
    {"a": [1]},
    {"a": {}},
]
# The Fly-shaped parts that before-validators reshape (not fields of Souq's models).
FLY_CONFIG = {
    "services": [
        {"internal_port": 8080, "ports": [{"port": 80, "handlers": ["http"]}], "checks": [{}]}
    ],
    "checks": {"alive": {"type": "tcp", "port": 8080}},
    "stop_config": {"timeout": "5s", "signal": "SIGTERM"},
    "guest": {"gpu_kind": "a100", "cpus": 1},
    "init": {"exec": ["sleep", "1"], "tty": False},
}


def _models() -> list[type[Input]]:
    seen: dict[str, type[Input]] = {}
    todo: list[type[Input]] = [Input]
    while todo:
        for sub in todo.pop().__subclasses__():
            if f"{sub.__module__}.{sub.__qualname__}" not in seen:
                seen[f"{sub.__module__}.{sub.__qualname__}"] = sub
                todo.append(sub)
    return [seen[k] for k in sorted(seen)]


def _example(ann: Any, depth: int = 0) -> Any:
    """A value of the annotation's shape, at every level (not necessarily valid)."""
    origin = get_origin(ann)
    if inspect.isclass(ann) and issubclass(ann, BaseModel):
        if depth > 6:
            return {}
        body = {n: _example(f.annotation, depth + 1) for n, f in ann.model_fields.items()}
        return {**body, **FLY_CONFIG} if "checks" in body and "services" in body else body
    if origin in (typing.Union, types.UnionType):
        args = [a for a in get_args(ann) if a is not type(None)]
        models = [a for a in args if inspect.isclass(a) and issubclass(a, BaseModel)]
        return _example((models or args or [None])[0], depth)
    if origin is typing.Annotated:
        return _example(get_args(ann)[0], depth)
    if origin in (list, tuple, set, frozenset):
        return [_example(get_args(ann)[0], depth)] if get_args(ann) else []
    if origin is dict:
        return {"k": _example(get_args(ann)[1], depth)}
    if origin is Literal:
        return get_args(ann)[0]
    if inspect.isclass(ann) and issubclass(ann, enum.Enum):
        return next(iter(ann)).value
    return {bool: True, int: 1, float: 1.0, str: "a"}.get(ann)


MODELS = _models()


def test_every_input_model_is_fed() -> None:
    names = {m.__name__ for m in MODELS}
    assert {"CreateMachineRequest", "UpdateMachineRequest", "QuoteRequest", "NewApp"} <= names
    assert {"JobSubmit", "CreateVolumeRequest", "BatchCreateRequest", "ClaimRequest"} <= names


@pytest.mark.parametrize("model", MODELS, ids=lambda m: m.__name__)
def test_any_json_is_a_value_or_a_validation_error(model: type[Input]) -> None:
    example = _example(model)
    for at in paths(example):
        for wrong in WRONG:
            body = put(example, at, wrong)
            try:
                model.model_validate(body)
            except ValidationError:
                continue
            except Exception as exc:  # the bug this test is for
                pytest.fail(f"{model.__name__} at {list(at)} = {wrong!r}: {exc!r}")
