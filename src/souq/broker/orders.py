"""What a create, a dry run or a quote asks the market for (:func:`order`), and the small
readings of errors and quote ids the broker's service makes around it."""

from __future__ import annotations

from souq.broker.idempotency import body_hash
from souq.broker.schemas import CreateMachineRequest, QuoteRequest
from souq.errors import InvalidInput, NotFound, SouqError
from souq.ids import QUOTE_PREFIX, new_request_id, worker_in_id
from souq.model import ClaimRequest, Placement

__all__ = ["order", "placement_of", "worker_named_by", "worker_of_quote"]


def order(
    app: str,
    body: CreateMachineRequest | QuoteRequest,
    *,
    request_id: str | None = None,
    digest: str | None = None,
    name: str | None = None,
    skip_launch: bool = False,
    region_chosen: str | None = None,
) -> ClaimRequest:
    """What a create, a dry run or a quote asks the market to place: ``body``, under a fresh
    request id and the body's hash unless they are given."""
    if body.region is None:  # a create's is chosen (BrokerService.with_region) before this
        raise InvalidInput("region: name the region to place the machine in")
    return ClaimRequest(
        request_id=request_id or new_request_id(),
        body_hash=digest or body_hash(body),
        app=app,
        name=name,
        region=body.region,
        config=body.config,
        skip_launch=skip_launch,
        skip_secrets=isinstance(body, CreateMachineRequest) and body.skip_secrets,
        min_secrets_version=(
            body.min_secrets_version or 0 if isinstance(body, CreateMachineRequest) else 0
        ),
        policy=body.placement,
        region_chosen=region_chosen,
    )


def placement_of(exc: SouqError) -> Placement | None:
    """The placement record an ``insufficient_capacity`` error carries, if any."""
    raw = (exc.details or {}).get("placement")
    if not isinstance(raw, dict):
        return None
    try:
        return Placement.model_validate(raw)
    except ValueError:
        return None


def worker_of_quote(quote_id: str) -> str:
    return worker_named_by(quote_id, "quote", QUOTE_PREFIX, "ask for one with POST .../quotes")


def worker_named_by(identifier: str, kind: str, prefix: str, find: str) -> str:
    """The worker an id of ``kind`` names (:func:`souq.ids.new_id_on` made it with ``prefix``:
    a quote id, a volume id), or NotFound when it is not such an id (``find``: where to get
    one)."""
    worker_id = worker_in_id(identifier, prefix)
    if worker_id is None:
        raise NotFound(
            f"{kind} {identifier} not found: it is not a {kind} id",
            hint=f"{kind} ids look like {prefix}_<worker>_<hex>; {find}",
        )
    return worker_id
