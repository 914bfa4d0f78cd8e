"""Constraints in a machine config: which workers may take the machine.

A constraint names an attribute of a worker, an operator and a value, e.g.
``{"attribute": "label.disk", "operator": "=", "value": "ssd"}``. The placement pipeline
(:mod:`souq.placement.constraints`) evaluates them; this module only checks that they are well
formed, so that a typo fails the request with a message naming it instead of placing nowhere.

Attributes: ``region``, ``worker.id``, ``label.<key>`` and ``fingerprint.<field>`` with
``<field>`` one of :data:`FINGERPRINT_FIELDS`.
"""

from __future__ import annotations

import re
from enum import StrEnum

from pydantic import Field, field_validator, model_validator

from souq.model.base import Input

__all__ = ["FINGERPRINT_FIELDS", "Constraint", "ConstraintOperator"]

FINGERPRINT_FIELDS = ("hostname", "os", "arch", "cpus", "memory_mb", "disk_mb", "gpus")
_ATTRIBUTE = re.compile(
    r"^(region|worker\.id|label\.[A-Za-z0-9_.\-/]{1,128}|fingerprint\.("
    + "|".join(FINGERPRINT_FIELDS)
    + r"))$"
)
_ATTRIBUTE_FORMS = (
    "region, worker.id, label.<key> or fingerprint.<field> with <field> one of "
    + ", ".join(FINGERPRINT_FIELDS)
)


class ConstraintOperator(StrEnum):
    EQ = "="
    NE = "!="
    IN = "in"
    NOT_IN = "not_in"
    REGEXP = "regexp"
    LT = "<"
    LE = "<="
    GT = ">"
    GE = ">="


NUMERIC = (
    ConstraintOperator.LT,
    ConstraintOperator.LE,
    ConstraintOperator.GT,
    ConstraintOperator.GE,
)
SETS = (ConstraintOperator.IN, ConstraintOperator.NOT_IN)


class Constraint(Input):
    attribute: str = Field(
        description="region, worker.id, label.<key> or fingerprint.<field> (e.g. label.disk, "
        "fingerprint.arch)"
    )
    operator: ConstraintOperator = Field(
        default=ConstraintOperator.EQ,
        strict=False,  # "=" is as good as ConstraintOperator.EQ, from JSON or from Python
        description="=, !=, in, not_in, regexp, <, <=, >, >=",
    )
    value: str | float | list[str] = Field(
        description="a string or number; a list for in/not_in; a pattern for regexp; a number "
        "for <, <=, >, >="
    )

    @field_validator("attribute")
    @classmethod
    def _attribute(cls, v: str) -> str:
        if not _ATTRIBUTE.match(v):
            raise ValueError(f"unknown attribute {v!r}: use {_ATTRIBUTE_FORMS}")
        return v

    @model_validator(mode="after")
    def _value_fits_operator(self) -> Constraint:
        op, value = self.operator, self.value
        if op in SETS:
            if not isinstance(value, list) or not value:
                raise ValueError(f"operator {op} needs a non-empty list of strings as its value")
        elif isinstance(value, list):
            raise ValueError(f"operator {op} takes one value, not a list (use in or not_in)")
        elif op in NUMERIC:
            if not isinstance(value, float | int):
                raise ValueError(f"operator {op} needs a number as its value, not {value!r}")
        elif op is ConstraintOperator.REGEXP:
            if not isinstance(value, str):
                raise ValueError("operator regexp needs a pattern (a string) as its value")
            try:
                re.compile(value)
            except re.error as exc:
                raise ValueError(f"regexp {value!r} does not compile: {exc}") from None
        return self

    def __str__(self) -> str:
        """As a person would write it: ``label.disk = ssd``, ``label.zone in [a, b]``."""
        value = self.value
        if isinstance(value, list):
            text = "[" + ", ".join(value) + "]"
        elif isinstance(value, float):
            text = f"{value:g}"
        else:
            text = value
        return f"{self.attribute} {self.operator.value} {text}"
