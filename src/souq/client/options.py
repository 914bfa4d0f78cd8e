"""The types of the command line's values, checked as the line is parsed: a value outside its
set or its bounds is a usage error (exit 2) that names what it takes, the same in every command.

- A value from a fixed set is typed by the project's own enum or ``Literal``
  (:mod:`souq.model.choices`, the one the model validates with): the CLI offers exactly its
  choices.
- A number is checked by :func:`as_field`, with the bounds of the model field it becomes (the
  bound is written once, in the model): :func:`checked_option` names the field,
  :func:`field_option` takes it from the option's name, :func:`size_option` for a machine's
  size. The model is named, and imported only when a value is checked: building the command
  line (all of it, for any command) imports no record.
- A constraint is parsed by :func:`constraint` (``label.disk=ssd``), a release's version by
  :func:`release_version` (``v3``, ``V3`` or ``3``), a signal by :func:`signal_name`
  (``term``, ``SIGTERM`` or ``15``).

Errors only the server can tell (a release that does not exist, a size a worker cannot hold)
stay errors (exit 1).
"""

from __future__ import annotations

import functools
import importlib
import re
from collections.abc import Callable
from typing import TYPE_CHECKING, Annotated, Any

import typer

from souq.model.choices import Autostop, FitPolicy, PriorityClass, Strategy

if TYPE_CHECKING:
    from pydantic import TypeAdapter

__all__ = [
    "AutostopOpt",
    "ConstraintOpt",
    "CpusOpt",
    "DistinctOpt",
    "EnvOpt",
    "ImageOpt",
    "MemoryOpt",
    "PolicyOpt",
    "PortOpt",
    "StrategyOpt",
    "TimeoutOpt",
    "as_field",
    "checked_option",
    "constraint",
    "field_option",
    "release_version",
    "signal_name",
    "size_option",
]


def as_field(model: str, field: str) -> Callable[[str], Any]:
    """A parser of a value that checks it as ``model`` (``module.Class``, a pydantic model)
    checks ``field`` (its type, its bounds): ``--cpus -1`` is refused here as the broker would
    refuse ``guest.cpus: -1``."""

    @functools.cache
    def adapter() -> TypeAdapter[Any]:
        from pydantic import TypeAdapter

        module, _, name = model.rpartition(".")
        info = getattr(importlib.import_module(module), name).model_fields[field]
        return TypeAdapter[Any](Annotated[info.annotation, info])  # type: ignore[arg-type]

    def parse(text: str) -> Any:
        from pydantic import ValidationError

        try:
            return adapter().validate_python(text)
        except ValidationError as exc:
            raise ValueError(exc.errors()[0]["msg"]) from None

    return parse


def checked_option(*flags: str, help: str, checks: str) -> Any:
    """A typer option named ``flags`` whose value is checked as the model field ``checks``
    (``module.Class.field``) checks it (:func:`as_field`)."""
    model, _, field = checks.rpartition(".")
    return typer.Option(*flags, help=help, parser=as_field(model, field))


def field_option(model: str, *flags: str, help: str) -> Any:
    """A typer option named ``flags`` whose value is checked as the field of ``model`` that the
    first flag names checks it: ``--memory-mb``, ``model.memory_mb`` (:func:`checked_option`)."""
    field = flags[0].removeprefix("--").replace("-", "_")
    return checked_option(*flags, help=help, checks=f"{model}.{field}")


def size_option(*flags: str, help: str) -> Any:
    """An option of a machine's size (``--cpus``, ``--memory-mb``, ``--gpus``, ...), checked as
    the field of the machine's guest config it names (:func:`field_option`)."""
    return field_option("souq.model.machine.GuestConfig", *flags, help=help)


_CONSTRAINT = re.compile(
    r"^\s*(?P<attribute>[^\s=!<>]+)\s*"
    r"(?P<operator>!=|<=|>=|=|<|>|\s(?:in|not_in|regexp)\s)\s*(?P<value>.+?)\s*$"
)


def constraint(text: str) -> dict[str, Any]:
    """``label.disk=ssd``, ``fingerprint.cpus >= 4``, ``label.zone in a,b`` as a constraint (the
    broker checks its attribute and its value)."""
    match = _CONSTRAINT.match(text)
    if match is None:
        raise ValueError(
            f"constraint {text!r} is not ATTRIBUTE OPERATOR VALUE, e.g. 'label.disk=ssd' or "
            "'label.zone in a,b' (operators: = != < <= > >= in not_in regexp)"
        )
    operator = match["operator"].strip()
    raw = match["value"]
    value: Any = raw
    if operator in {"in", "not_in"}:
        value = [v.strip() for v in raw.split(",") if v.strip()]
    elif operator in {"<", "<=", ">", ">="}:
        try:
            value = float(raw)
        except ValueError:
            raise ValueError(f"constraint {text!r}: {raw!r} is not a number") from None
    return {"attribute": match["attribute"], "operator": operator, "value": value}


def signal_name(text: str) -> str:
    """A signal as a user writes it (``term``, ``SIGTERM``, ``15``), as the API reads it:
    :func:`souq.model.machine.normalise_signal`, imported when a signal is given."""
    from souq.model.machine import normalise_signal

    return normalise_signal(text)


def release_version(text: str) -> int:
    """A release's version as a user writes it: ``v3`` (as ``souq releases`` shows it), ``V3``
    or its number ``3``."""
    digits = text.strip().removeprefix("v").removeprefix("V")
    if not digits.isdecimal() or int(digits) < 1:
        raise ValueError(
            f"{text!r} is not a release version: write it as `souq releases` shows it (v3) "
            "or as its number (3)"
        )
    return int(digits)


# The options of a machine's config, as `machine run`, `machine update` and `quote create` take
# them.
CpusOpt = Annotated[float | None, size_option("--cpus", help="CPU cores.")]
MemoryOpt = Annotated[int | None, size_option("--memory-mb", help="Memory in MiB.")]
ConstraintOpt = Annotated[
    list[Any] | None,  # each a constraint's dict: typer takes no element type of its own
    typer.Option(
        "--constraint",
        "-c",
        metavar="CONSTRAINT",
        help="Where it may run, e.g. 'label.disk=ssd', 'fingerprint.cpus>=4', "
        "'label.zone in a,b'; repeatable.",
        parser=constraint,
    ),
]
DistinctOpt = Annotated[
    bool,
    typer.Option("--distinct-workers", help="Never on a worker that runs this app already."),
]
ImageOpt = Annotated[
    str | None,
    typer.Option("--image", help="The image it runs (sha256:… or a name; see `souq image list`)."),
]
ClassOpt = Annotated[
    PriorityClass | None,
    typer.Option(
        "--priority-class",
        help="reserved (never displaced), standard (the default) or spot (displaced first, "
        "when a machine of a higher class fits nowhere else).",
    ),
]
MaxPriceOpt = Annotated[
    float | None,
    checked_option(
        "--max-price",
        help="The most it bids, per hour (the cheapest bids are displaced first).",
        checks="souq.model.machine.MachineConfig.max_price",
    ),
]
PolicyOpt = Annotated[
    FitPolicy | None, typer.Option("--policy", help="How to rank offers (default: best-fit).")
]
PortOpt = Annotated[
    list[int] | None,
    checked_option(
        "--port",
        "-p",
        help="An internal port it serves HTTP on, reached through the proxy (repeatable); "
        "the process reads the host port it must listen on from $PORT.",
        checks="souq.model.services.Service.internal_port",
    ),
]
AutostopOpt = Annotated[
    Autostop | None,
    typer.Option("--autostop", help="What the proxy does to its idle service (needs --port)."),
]
StrategyOpt = Annotated[
    Strategy | None, typer.Option("--strategy", help="How to deploy (default: souq.toml's).")
]

# Options more than one command takes alike: `machine run` and `job submit` set an environment,
# `machine wait` and `job wait` wait (each with its own default).
EnvOpt = Annotated[
    list[str] | None, typer.Option("--env", "-e", help="K=V in its environment; repeatable.")
]
TimeoutOpt = Annotated[float, typer.Option("--timeout", min=0, help="Seconds.")]
