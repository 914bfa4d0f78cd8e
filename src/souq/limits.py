"""The limits Souq puts on the size of what a client sends, in one place (docs/limits.md lists
them; a field's own range is declared on its field in :mod:`souq.model`).

Field limits are checked by the models (:mod:`souq.model`) and answer 422 ``invalid_input``
naming the field; body limits by :mod:`souq.http_limits` (413 ``payload_too_large``); the
connection deadlines by :mod:`souq.http_guard`; the caps on long-lived streams by
:mod:`souq.broker.streams` (429 ``too_many_requests``). Pure: numbers, and the checks that
need only them.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Final

__all__ = [
    "BODY_DEFAULT_BYTES",
    "BODY_IMAGE_BYTES",
    "CMD_MAX_ARGS",
    "CMD_MAX_BYTES",
    "CONSTRAINTS_MAX",
    "DNS_LABEL",
    "DNS_LABEL_MAX",
    "ENV_MAX_BYTES",
    "ENV_MAX_COUNT",
    "ENV_NAME",
    "LABELS_MAX_COUNT",
    "LOG_CHECK_INTERVAL_S",
    "LOG_MAX_BYTES",
    "METADATA_KEY_MAX",
    "METADATA_MAX_BYTES",
    "METADATA_MAX_COUNT",
    "SERVICES_MAX",
    "UPLOADS_PER_TOKEN",
    "UPLOADS_TOTAL",
    "HttpLimits",
    "check_argv",
    "check_env",
    "check_metadata",
    "dns_label_problem",
    "require_positive",
    "size_text",
]

KiB: Final = 1024
MiB: Final = 1024 * KiB
GiB: Final = 1024 * MiB

# -- request bodies (413) ----------------------------------------------------------------------
BODY_DEFAULT_BYTES: Final = 1 * MiB  # every route that takes a JSON body
BODY_IMAGE_BYTES: Final = 2 * GiB  # POST /v1/images: an OCI layout as a tar

# -- uploads under way (429) -------------------------------------------------------------------
UPLOADS_PER_TOKEN: Final = 2  # POST /v1/images of one token at once (its narrowed copies too)
UPLOADS_TOTAL: Final = 16  # of one broker at once (each is spooled to disk, not memory)

# -- fields (422) ------------------------------------------------------------------------------
DNS_LABEL_MAX: Final = 63
DNS_LABEL: Final = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")  # RFC 1123 label
ENV_NAME: Final = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")  # POSIX: what a shell can name
ENV_MAX_COUNT: Final = 256
ENV_MAX_BYTES: Final = 64 * KiB  # names and values together
CMD_MAX_ARGS: Final = 1024
CMD_MAX_BYTES: Final = 128 * KiB  # every argument together (Linux allows one of 128 KiB)
METADATA_MAX_COUNT: Final = 64
METADATA_KEY_MAX: Final = 128
METADATA_MAX_BYTES: Final = 16 * KiB  # keys and values together
LABELS_MAX_COUNT: Final = 64  # a worker's labels (souq agent --label)
SERVICES_MAX: Final = 16  # services, checks and standbys of one machine, each
CONSTRAINTS_MAX: Final = 32

# -- machine output logs -----------------------------------------------------------------------
LOG_MAX_BYTES: Final = 4 * MiB  # the current file, and the one rotated file kept
LOG_CHECK_INTERVAL_S: Final = 1.0  # how often the agent looks at the logs' sizes


def require_positive(settings: object, *names: str) -> None:
    """Raise ValueError naming the first of the attributes ``names`` of ``settings`` that is
    not above zero (a dataclass's ``__post_init__`` check of its timeouts and sizes)."""
    for name in names:
        if getattr(settings, name) <= 0:
            raise ValueError(f"{name} must be positive")


@dataclass(frozen=True, slots=True)
class HttpLimits:
    """How long a connection may take to send its request, and how many streams it may hold.

    ``header_timeout_s``: from a connection's opening (or a request's first byte) to the end of
    a request's headers, which may hold up to ``max_header_bytes``. ``body_grace_s`` and
    ``body_min_rate``: a body must be in by ``body_grace_s`` after its headers plus one second
    per ``body_min_rate`` bytes received
    (a slow but steady upload goes on; one that dribbles is cut). ``write_stall_s``: a client
    that reads nothing of what is sent to it for this long is dropped. ``streams_per_client``
    and ``streams_total``: event and log streams open at once, from one address and in all."""

    header_timeout_s: float = 10.0
    max_header_bytes: int = 64 * KiB
    body_grace_s: float = 10.0
    body_min_rate: int = 8 * KiB
    write_stall_s: float = 30.0
    streams_per_client: int = 32
    streams_total: int = 1024

    def __post_init__(self) -> None:
        require_positive(self, "header_timeout_s", "body_grace_s", "write_stall_s")
        if self.max_header_bytes < 1024:
            raise ValueError("max_header_bytes must be at least 1024")
        if self.body_min_rate < 1 or self.streams_per_client < 1 or self.streams_total < 1:
            raise ValueError("body_min_rate, streams_per_client, streams_total must be >= 1")


def size_text(n: int) -> str:
    """``1 MiB``, ``64 KiB``, ``2 GiB``, or bytes."""
    for unit, size in (("GiB", GiB), ("MiB", MiB), ("KiB", KiB)):
        if n >= size and n % size == 0:
            return f"{n // size} {unit}"
    return f"{n} bytes"


def dns_label_problem(what: str, name: str) -> str | None:
    """Why ``name`` is not a DNS label, or None when it is."""
    if DNS_LABEL.match(name):
        return None
    return (
        f"{what} {name!r} is not valid: use 1-{DNS_LABEL_MAX} lowercase letters, digits and "
        "'-', starting and ending with a letter or digit"
    )


def check_env(env: Mapping[str, str]) -> None:
    """Raise ValueError naming what is wrong with ``env``: its count, a name, its size."""
    if len(env) > ENV_MAX_COUNT:
        raise ValueError(f"{len(env)} variables: at most {ENV_MAX_COUNT}")
    size = 0
    for key, value in env.items():
        if not ENV_NAME.match(key):
            raise ValueError(
                f"environment variable name {key!r} is not valid (letters, digits and '_', "
                "not starting with a digit)"
            )
        if "\0" in value:
            raise ValueError(f"the value of {key} holds a NUL byte")
        size += len(key.encode()) + len(value.encode()) + 2  # "=" and the NUL
    if size > ENV_MAX_BYTES:
        raise ValueError(f"{size} bytes of names and values: at most {size_text(ENV_MAX_BYTES)}")


def check_argv(argv: Sequence[str]) -> None:
    """Raise ValueError when a command line has too many arguments or too many bytes."""
    if len(argv) > CMD_MAX_ARGS:
        raise ValueError(f"{len(argv)} arguments: at most {CMD_MAX_ARGS}")
    size = sum(len(a.encode()) + 1 for a in argv)
    if size > CMD_MAX_BYTES:
        raise ValueError(f"{size} bytes of arguments: at most {size_text(CMD_MAX_BYTES)}")
    if any("\0" in a for a in argv):
        raise ValueError("an argument holds a NUL byte")


def check_metadata(metadata: Mapping[str, str], *, what: str = "entries") -> None:
    """Raise ValueError when metadata (or labels) are too many, a key too long, or too big."""
    limit = LABELS_MAX_COUNT if what == "labels" else METADATA_MAX_COUNT
    if len(metadata) > limit:
        raise ValueError(f"{len(metadata)} {what}: at most {limit}")
    size = 0
    for key, value in metadata.items():
        if not key or len(key) > METADATA_KEY_MAX:
            raise ValueError(f"key {key[:32]!r}: 1 to {METADATA_KEY_MAX} characters")
        size += len(key.encode()) + len(value.encode())
    if size > METADATA_MAX_BYTES:
        raise ValueError(
            f"{size} bytes of keys and values: at most {size_text(METADATA_MAX_BYTES)}"
        )
