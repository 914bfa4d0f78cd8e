"""The proxy's errors and the HTTP answers it makes of them.

They hang from Souq's one error tree (:mod:`souq.errors`), so a proxy error carries a message,
a stable ``status`` code and an HTTP status like every other Souq error::

    SouqError
    ├── NotFound
    │   └── AppNotFound        404 app_not_found   (no app of that name behind this proxy)
    ├── MalformedRequest
    │   ├── BadRequest         400 bad_request     (the client sent something that is not HTTP)
    │   └── HeadersTooLarge    431 headers_too_large
    ├── WaitTimeout
    │   └── RequestTimeout     408 request_timeout (the request did not arrive in time)
    ├── Unavailable
    │   └── NoMachines         503 no_machines     (nothing could serve before the deadline)
    └── MachineError           502 machine_error   (the machine refused, reset or sent garbage)

:func:`answer` renders one as a complete HTTP/1.1 response with a JSON body
``{"error": ..., "status": ...}`` (and ``machine_id`` for a machine's error).
"""

from __future__ import annotations

import json
from http import HTTPStatus

from souq.errors import MalformedRequest, NotFound, SouqError, Unavailable, WaitTimeout

__all__ = [
    "AppNotFound",
    "BadRequest",
    "HeadersTooLarge",
    "MachineError",
    "NoMachines",
    "RequestTimeout",
    "answer",
]


class AppNotFound(NotFound, status="app_not_found"):
    @classmethod
    def named(cls, app: str) -> AppNotFound:
        return cls(f"no app named {app!r} is behind this proxy", hint="check the Host header")


class BadRequest(MalformedRequest, status="bad_request", http_status=400): ...


class HeadersTooLarge(MalformedRequest, status="headers_too_large", http_status=431): ...


class NoMachines(Unavailable, status="no_machines"): ...


class RequestTimeout(WaitTimeout, status="request_timeout"):
    """A client's request did not arrive in time (headers, or a body too slow): a slowloris."""


class MachineError(SouqError, status="machine_error", http_status=502):
    @classmethod
    def of(cls, machine_id: str, app: str, what: str) -> MachineError:
        return cls(f"machine {machine_id} of app {app} {what}", details={"machine_id": machine_id})


def answer(
    error: SouqError,
    *,
    request_id: bytes = b"",
    keep_alive: bool = True,
    head_only: bool = False,
) -> bytes:
    """The whole HTTP response for ``error``; ``head_only`` for a HEAD request."""
    body = json.dumps(error.to_body()).encode()
    code = error.http_status
    lines = [
        b"HTTP/1.1 %d %s" % (code, HTTPStatus(code).phrase.encode()),
        b"Content-Type: application/json",
        b"Content-Length: %d" % len(body),
        b"Via: 1.1 souq",
    ]
    if request_id:
        lines.append(b"X-Request-Id: " + request_id)
    if not keep_alive:
        lines.append(b"Connection: close")
    head = b"\r\n".join(lines) + b"\r\n\r\n"
    return head if head_only else head + body
