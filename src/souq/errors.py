"""Souq's one error tree.

Every error a user can see is a :class:`SouqError`. Each carries a human message, an optional
hint naming what to do, a stable machine-readable ``status`` code and the HTTP status it maps to.
Lower layers (SQLite, NATS, the OS) raise their own exceptions; they are translated into this
tree at the boundary that catches them, so nothing above a boundary handles foreign errors::

    SouqError                      500 internal
    ├── InvalidInput               422 invalid_input     (a field of a request is wrong)
    │   ├── MalformedRequest       400 malformed_request (the body is not JSON at all)
    │   ├── UnknownRegion          422 unknown_region
    │   ├── ImageInvalid           422 image_invalid     (an OCI image or layout breaks the spec)
    │   │   └── ImageTooLarge      422 image_too_large   (its files unpack past their bound)
    │   ├── ExecUnavailable        422 exec_unavailable  (exec cannot run in that machine here)
    │   └── TraceInvalid           422 trace_invalid     (a bad trace row: file, line, column)
    ├── Unauthorized               401 unauthorized      (no token, or one that is not valid)
    ├── Forbidden                  403 forbidden         (a valid token outside its scope)
    │   └── QuotaExceeded          403 quota_exceeded    (a create would pass a quota's limit)
    ├── PayloadTooLarge            413 payload_too_large (a request body over the route's limit)
    ├── TooManyRequests            429 too_many_requests (a client over its share, e.g. streams)
    ├── NotFound                   404 not_found
    │   ├── ImageNotFound          404 image_not_found   (no image with that reference or name)
    │   └── JobNotFound            404 job_not_found     (no batch job of that name)
    ├── Conflict                   409 conflict
    │   ├── IllegalTransition      409 illegal_transition (e.g. start a destroyed machine)
    │   │   └── MachineNotStarted  409 machine_not_started (exec or ps on a machine not started)
    │   ├── JobExists              409 job_exists         (a batch job of that name was submitted)
    │   ├── NameTaken              409 name_taken         (an app of that name exists already)
    │   ├── IdempotencyConflict    409 idempotency_conflict (same key, different body)
    │   ├── QuoteUsed              409 quote_used         (a quote already made its machine)
    │   ├── LeaseHeld              409 lease_held         (the machine is leased: send its nonce)
    │   ├── VolumeAttached         409 volume_attached    (a volume is another machine's now)
    │   └── ClaimRefused           409 claim_refused      (a worker refused a claim; internal)
    ├── InsufficientCapacity       409 insufficient_capacity (carries the placement record)
    │   └── BidBelowPrice          409 bid_below_price   (a spot bid under the region's price)
    ├── QuoteExpired               410 quote_expired     (the hold's TTL passed or it was released)
    ├── WaitTimeout                408 timeout
    ├── Unavailable                503 unavailable       (NATS or the owning worker is unreachable)
    │   ├── NobodySubscribed       503 unavailable       (it reached nobody: nothing was done)
    │   ├── NoReply                503 unavailable       (no answer in time: it may have been done)
    │   └── SecretsUnavailable     503 secrets_unavailable (no auth directory: no secrets key)
    ├── SecretsUnreadable          500 secrets_unreadable (a secret does not open with this key)
    ├── UnknownVerb                501 unknown_verb      (a peer does not speak that protocol verb)
    ├── DeployFailed               500 deploy_failed     (a deploy's phase failed: rolled back)
    │   └── DeployNoCapacity       409 insufficient_capacity (no room: an InsufficientCapacity too)
    ├── JobFailed                  500 job_failed        (a job waited for did not succeed)
    └── StorageError               500 storage_error     (the agent's state file failed)

The CLI exits with status 3 for :class:`InsufficientCapacity` (a deploy that failed for want of
room among them: :class:`DeployNoCapacity` is both) and 1 for every other error.
"""

from __future__ import annotations

from typing import Any, ClassVar

__all__ = [
    "BidBelowPrice",
    "ClaimRefused",
    "CommandNotRunnable",
    "Conflict",
    "DeployFailed",
    "DeployNoCapacity",
    "ExecUnavailable",
    "Forbidden",
    "IdempotencyConflict",
    "IllegalTransition",
    "ImageInvalid",
    "ImageNotFound",
    "ImageTooLarge",
    "InsufficientCapacity",
    "InvalidInput",
    "JobExists",
    "JobFailed",
    "JobNotFound",
    "LeaseHeld",
    "MachineNotStarted",
    "MalformedRequest",
    "NameTaken",
    "NoReply",
    "NobodySubscribed",
    "NotFound",
    "PayloadTooLarge",
    "QuotaExceeded",
    "QuoteExpired",
    "QuoteUsed",
    "SecretsUnavailable",
    "SecretsUnreadable",
    "SouqError",
    "StorageError",
    "TooManyRequests",
    "TraceInvalid",
    "Unauthorized",
    "Unavailable",
    "UnknownRegion",
    "UnknownVerb",
    "VolumeAttached",
    "WaitTimeout",
    "error_from_body",
]


class SouqError(Exception):
    """Base of every error Souq reports to a user.

    A subclass names its stable code and its HTTP status on its class line, as in the tree above:
    ``class NotFound(SouqError, status="not_found", http_status=404)``; what it leaves out it
    keeps from its parent (every :class:`Conflict` is a 409)."""

    status: ClassVar[str] = "internal"
    http_status: ClassVar[int] = 500

    def __init_subclass__(
        cls, *, status: str | None = None, http_status: int | None = None, **kwargs: Any
    ) -> None:
        super().__init_subclass__(**kwargs)
        if status is not None:
            cls.status = status
        if http_status is not None:
            cls.http_status = http_status

    def __init__(
        self, message: str, *, hint: str | None = None, details: dict[str, Any] | None = None
    ) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint
        self.details = details or {}

    def to_body(self) -> dict[str, Any]:
        """The JSON body of an API error: ``{error, status, hint?, ...details}``."""
        body: dict[str, Any] = {"error": self.message, "status": self.status}
        if self.hint:
            body["hint"] = self.hint
        body.update(self.details)
        return body

    def __str__(self) -> str:
        return f"{self.message} ({self.hint})" if self.hint else self.message


class InvalidInput(SouqError, status="invalid_input", http_status=422): ...


class MalformedRequest(InvalidInput, status="malformed_request", http_status=400): ...


class UnknownRegion(InvalidInput, status="unknown_region"): ...


class ImageInvalid(InvalidInput, status="image_invalid"):
    """An image, a layout or a layer breaks the OCI image-spec (or is corrupt): the message names
    the blob, the file or the field to fix."""


class ImageTooLarge(ImageInvalid, status="image_too_large"):
    """An image's files unpack past what the image may use (a worker's image cache): the
    unpacking stopped there and nothing of it was kept."""


class TraceInvalid(InvalidInput, status="trace_invalid"):
    """A trace file (the simulator's input) cannot be read: the message names the file, the line
    and the column, and ``details`` carry them as ``file``, ``line`` and ``column``."""


class Unauthorized(SouqError, status="unauthorized", http_status=401): ...


class Forbidden(SouqError, status="forbidden", http_status=403): ...


class QuotaExceeded(Forbidden, status="quota_exceeded"):
    """A create (or an update's growth) would pass a quota: ``details`` name the scope, the
    quota (``cpus``, ``memory_mb``, ``machines``), its limit, its use and what was asked."""


class PayloadTooLarge(SouqError, status="payload_too_large", http_status=413): ...


class TooManyRequests(SouqError, status="too_many_requests", http_status=429): ...


class NotFound(SouqError, status="not_found", http_status=404): ...


class ImageNotFound(NotFound, status="image_not_found"):
    """No image with that reference (or name) in the store or the layout."""


class JobNotFound(NotFound, status="job_not_found"):
    """No batch job of that name in the queue."""


class Conflict(SouqError, status="conflict", http_status=409): ...


class JobExists(Conflict, status="job_exists"):
    """A batch job of that name was submitted already (names are unique)."""


class NameTaken(Conflict, status="name_taken"):
    """An app of that name exists already (created, or it has machines). Fly's clients know
    the code (``IsNameTakenError``)."""


class IllegalTransition(Conflict, status="illegal_transition"): ...


class MachineNotStarted(IllegalTransition, status="machine_not_started"):
    """Exec and ps need the machine's processes: it must be ``started``."""


class CommandNotRunnable(InvalidInput, status="command_not_runnable"):
    """The machine's program is missing, or its user may not run it (details: program, path,
    user)."""


class ExecUnavailable(InvalidInput, status="exec_unavailable"):
    """The worker cannot run a command inside the machine: it lacks the tool (``setpriv``,
    ``nsenter``), or entering the machine's sandbox would give the command more than the
    machine's own has."""


class DeployFailed(SouqError, status="deploy_failed"):
    """A deploy's phase failed (``details`` name the phase, region, machine and check); what the
    deploy had changed was rolled back."""


class MachineFailed(SouqError, status="machine_failed"):
    """A machine ``souq machine run`` waited for could not be started (``failed``: e.g. its
    program cannot run); the message says why, ``details`` name the machine. It holds no
    capacity; exit 1."""


class JobFailed(SouqError, status="job_failed"):
    """A batch job waited for ended without succeeding (``details``: its state and exit code);
    ``souq job wait`` exits 1 with it."""


class LeaseHeld(Conflict, status="lease_held"):
    """The machine is leased and the request did not bring the lease's nonce."""


class IdempotencyConflict(Conflict, status="idempotency_conflict"):
    @classmethod
    def other_body(cls, request_id: str, machine_id: str) -> IdempotencyConflict:
        """``request_id`` made ``machine_id`` already, from another body."""
        return cls(
            f"request {request_id} already created machine {machine_id} with a different body",
            hint="use a new idempotency key for a different request",
            details={"machine_id": machine_id},
        )


class VolumeAttached(Conflict, status="volume_attached"):
    """A volume is attached to another machine (one at a time), or cannot go while attached."""


class ClaimRefused(Conflict, status="claim_refused"): ...


class QuoteUsed(Conflict, status="quote_used"): ...


class InsufficientCapacity(SouqError, status="insufficient_capacity", http_status=409): ...


class BidBelowPrice(InsufficientCapacity, status="bid_below_price"):
    """A ``spot`` create whose ``max_price`` is below its region's spot price: no room at that
    price (the CLI exits 3, as for any want of room). ``details`` name the region, its
    ``spot_price``, the used fraction it comes from and the ``max_price`` bid."""


class DeployNoCapacity(
    DeployFailed, InsufficientCapacity, status="insufficient_capacity", http_status=409
):
    """A deploy failed for want of room (its capacity could not be held, or a machine found none
    to be replaced on): a :class:`DeployFailed` (rolled back; ``details`` name the phase and the
    region) that is also an :class:`InsufficientCapacity`, which the CLI exits 3 for. Its code is
    the placement's, ``insufficient_capacity`` (a body with it reads back as that)."""


class QuoteExpired(SouqError, status="quote_expired", http_status=410): ...


class WaitTimeout(SouqError, status="timeout", http_status=408): ...


class Unavailable(SouqError, status="unavailable", http_status=503): ...


class NobodySubscribed(Unavailable):
    """A request reached nobody (no subscriber on its subject): it was not carried out, so it
    may safely be sent elsewhere, unlike one that went unanswered."""


class NoReply(Unavailable):
    """A request on the bus went unanswered within its deadline: the peer may be gone, or busy
    and still doing it (unlike a refusal, nothing says it was not done)."""


class SecretsUnavailable(Unavailable, status="secrets_unavailable"):
    """App secrets need the cluster's secrets key, and this daemon has no auth directory."""


class SecretsUnreadable(SouqError, status="secrets_unreadable"):
    """A secret does not open with this daemon's secrets key (another cluster's key, or a
    replaced one)."""


class UnknownVerb(SouqError, status="unknown_verb", http_status=501):
    """A peer (an agent or broker of another version) does not know the verb it was sent."""


class StorageError(SouqError, status="storage_error", http_status=500): ...


def _all_subclasses(cls: type[SouqError]) -> list[type[SouqError]]:
    out: list[type[SouqError]] = [cls]
    for sub in cls.__subclasses__():
        out.extend(_all_subclasses(sub))
    return out


def _owns_status(cls: type[SouqError]) -> bool:
    """Whether ``cls`` brought its code in (a class that shares a base's reads back as that)."""
    bases = [b for b in cls.__mro__[1:] if issubclass(b, SouqError)]
    return not any(b.status == cls.status for b in bases)


_BY_STATUS: dict[str, type[SouqError]] = {
    c.status: c for c in _all_subclasses(SouqError) if _owns_status(c)
}


def error_from_body(body: dict[str, Any], http_status: int | None = None) -> SouqError:
    """Rebuild a typed error from an API or bus error body (the inverse of ``to_body``)."""
    status = str(body.get("status", "internal"))
    cls = _BY_STATUS.get(status, SouqError)
    details = {k: v for k, v in body.items() if k not in {"error", "status", "hint"}}
    err = cls(str(body.get("error", "unknown error")), hint=body.get("hint"), details=details)
    if cls is SouqError and status != "internal":
        # An unknown code from a newer peer: keep its code and HTTP status visible.
        err.status = status  # type: ignore[misc]
        if http_status is not None:
            err.http_status = http_status  # type: ignore[misc]
    return err
