"""The pipeline: filter every offer, sample, score the survivors, order them best first.

The result is an ordered list of workers to claim on and the per-offer record that goes into the
machine's placement explanation. Pure: no I/O, no clock, randomness seeded from the request id.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

from souq.model.placement import OfferOutcome
from souq.model.protocol import Offer
from souq.placement import select
from souq.placement.gpus import free_on
from souq.placement.request import PlacementRequest
from souq.placement.stages import Filter, Rejection, Scorer

__all__ = ["NOT_SAMPLED", "Pipeline", "Ranking"]

NOT_SAMPLED = "not_sampled"  # feasible, but left out by the pipeline's limit


@dataclass(frozen=True)
class Ranking:
    ordered: list[Offer]  # feasible offers that were scored, best first: the claim order
    outcomes: list[OfferOutcome]  # every offer, scored ones first (best first)
    rejections: dict[str, int]  # count per rejection reason
    unmet: dict[str, list[str]] = field(default_factory=dict)  # reason -> what was not met

    @property
    def winner(self) -> str | None:
        return self.ordered[0].worker.id if self.ordered else None

    @property
    def runner_up(self) -> str | None:
        return self.ordered[1].worker.id if len(self.ordered) > 1 else None


@dataclass(frozen=True)
class Pipeline:
    name: str  # the policy: best-fit, binpack or spread
    filters: Sequence[Filter]
    scorers: Sequence[Scorer]
    limit: int | None = None  # score at most this many feasible offers (a seeded sample)
    # Among equal scores: "random" (the seeded order), "first" (the smallest worker id), or
    # "gpu-first" (the smallest id when GPU workers are among the candidates or the request
    # wants GPUs, else the seeded order).
    ties: str = "random"

    @property
    def weights(self) -> dict[str, float]:
        return {s.name: s.weight for s in self.scorers}

    def rank(self, request: PlacementRequest, offers: Sequence[Offer]) -> Ranking:
        rejected: list[OfferOutcome] = []
        counts: Counter[str] = Counter()
        unmet: dict[str, list[str]] = {}
        feasible: list[Offer] = []
        # Sorted first, so that the order replies happened to arrive in does not matter: the
        # same request over the same offers always ranks the same way.
        in_order = sorted(offers, key=lambda o: o.worker.id)
        for offer in select.shuffled(in_order, request.request_id):
            rejection = self._reject(request, offer)
            if rejection is None:
                feasible.append(offer)
                continue
            counts[rejection.reason] += 1
            if rejection.unmet is not None and rejection.unmet not in unmet.get(
                rejection.reason, []
            ):
                unmet.setdefault(rejection.reason, []).append(rejection.unmet)
            rejected.append(
                OfferOutcome(
                    worker_id=offer.worker.id,
                    rejected=rejection.reason,
                    detail=rejection.detail,
                    gpu_free=_gpus_seen(request, offer),
                )
            )

        sampled, left_out = select.limit(feasible, self.limit)
        for offer in left_out:
            counts[NOT_SAMPLED] += 1
            rejected.append(
                OfferOutcome(
                    worker_id=offer.worker.id,
                    rejected=NOT_SAMPLED,
                    detail=f"feasible, but not among the {self.limit} sampled",
                )
            )

        if self.first_wins(request, any(o.worker.capacity.gpus > 0 for o in sampled)):
            sampled.sort(key=lambda o: o.worker.id)
        weights = self.weights
        scored: list[tuple[float, tuple[Offer, OfferOutcome]]] = []
        for offer in sampled:
            raw = {s.name: s.score(request, offer) for s in self.scorers}
            final = select.weighted_mean(raw, weights)
            scores = {name: round(v, 6) for name, v in raw.items() if v is not None}
            outcome = OfferOutcome(
                worker_id=offer.worker.id,
                scores=scores,
                score=round(final, 6),
                gpu_free=_gpus_seen(request, offer),
            )
            scored.append((final, (offer, outcome)))
        best = [pair for _, pair in select.best_first(scored)]
        return Ranking(
            ordered=[offer for offer, _ in best],
            outcomes=[outcome for _, outcome in best] + rejected,
            rejections=dict(counts),
            unmet={reason: sorted(items) for reason, items in unmet.items()},
        )

    def first_wins(self, request: PlacementRequest, gpu_workers: bool) -> bool:
        """Whether ties go to the smallest worker id (else to the seeded order), given whether
        workers with GPUs are among the candidates."""
        if self.ties == "gpu-first":
            return request.resources.wants_gpu or gpu_workers
        return self.ties == "first"

    def _reject(self, request: PlacementRequest, offer: Offer) -> Rejection | None:
        for f in self.filters:
            rejection = f.check(request, offer)
            if rejection is not None:
                return rejection
        return None


def _gpus_seen(request: PlacementRequest, offer: Offer) -> list[int] | None:
    """What the record shows of a worker's GPUs: their free thousandths, for a GPU request."""
    return list(free_on(offer.worker)) if request.resources.wants_gpu else None
