"""``souq machine <verb> ID --app APP`` for every operation whose declaration names a CLI verb
(:mod:`souq.operations`): the operation through :meth:`SouqClient.operate`, its answer through
the renderer it names (a record's fields when it names none; JSON with ``--json``)."""

import importlib
from collections.abc import Callable
from typing import Any

import typer

from souq.client import cli
from souq.client.cli import AppOpt, IdArg, JsonOpt, machine_app, reporting
from souq.operations import OPERATIONS, Operation

__all__ = ["register_operations"]


def register_operations(app: typer.Typer) -> None:
    """The commands add themselves to ``souq machine`` when this module is imported."""


def _renderer(op: Operation) -> Callable[..., None]:
    """The view ``op`` names, called with the answer and ``as_json``; when it names none, a
    record's fields (:func:`souq.client.render.record`)."""
    module, _, name = (op.render or "render.record").rpartition(".")
    view: Callable[..., None] = getattr(importlib.import_module(f"souq.client.{module}"), name)
    return view


def _command(op: Operation) -> Callable[..., None]:
    def command(machine_id: IdArg, app_name: AppOpt, as_json: JsonOpt = False) -> None:
        with reporting(as_json):
            answer: Any = cli.make_client().operate(op.name, app_name, machine_id)
            _renderer(op)(answer, as_json=as_json)

    command.__doc__ = op.summary
    command.__name__ = f"machine_{op.name}"
    return command


for _op in OPERATIONS:
    if _op.cli is not None:
        machine_app.command(_op.cli)(_command(_op))
