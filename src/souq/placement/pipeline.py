"""The pipeline: filter every offer, score the survivors, order them best first.

The result is an ordered list of workers to claim on and the per-offer record that goes into the
machine's placement explanation. Pure: no I/O, no clock, randomness seeded from the request id.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from souq.model.placement import OfferOutcome
from souq.model.protocol import Offer
from souq.placement.request import PlacementRequest
from souq.placement.stages import BestFitScorer, EligibleFilter, Filter, ResourcesFilter, Scorer

__all__ = ["Pipeline", "Ranking", "default_pipeline"]


@dataclass(frozen=True)
class Ranking:
    ordered: list[Offer]  # feasible offers, best first: the claim order
    outcomes: list[OfferOutcome]  # every offer, feasible ones first (best first)
    rejections: dict[str, int]  # count per rejection reason

    @property
    def winner(self) -> str | None:
        return self.ordered[0].worker.id if self.ordered else None

    @property
    def runner_up(self) -> str | None:
        return self.ordered[1].worker.id if len(self.ordered) > 1 else None


@dataclass(frozen=True)
class Pipeline:
    name: str
    filters: Sequence[Filter]
    scorers: Sequence[Scorer]

    def rank(self, request: PlacementRequest, offers: Sequence[Offer]) -> Ranking:
        rejected: list[OfferOutcome] = []
        scored: list[tuple[float, Offer, OfferOutcome]] = []
        counts: Counter[str] = Counter()
        # Shuffle first with a seed from the request id: equal scores then break ties at random,
        # yet the same request always ranks the same way.
        pool = list(offers)
        random.Random(request.request_id).shuffle(pool)
        total_weight = sum(s.weight for s in self.scorers) or 1.0
        for offer in pool:
            rejection = next(
                (r for f in self.filters if (r := f.check(request, offer)) is not None), None
            )
            if rejection is not None:
                counts[rejection.reason] += 1
                rejected.append(
                    OfferOutcome(
                        worker_id=offer.worker.id,
                        rejected=rejection.reason,
                        detail=rejection.detail,
                    )
                )
                continue
            scores = {s.name: round(s.score(request, offer), 6) for s in self.scorers}
            final = sum(s.weight * scores[s.name] for s in self.scorers) / total_weight
            outcome = OfferOutcome(worker_id=offer.worker.id, scores=scores, score=round(final, 6))
            scored.append((final, offer, outcome))
        scored.sort(key=lambda item: item[0], reverse=True)  # stable: keeps the seeded order
        return Ranking(
            ordered=[offer for _, offer, _ in scored],
            outcomes=[outcome for _, _, outcome in scored] + rejected,
            rejections=dict(counts),
        )


def default_pipeline() -> Pipeline:
    return Pipeline(
        name="best-fit",
        filters=(
            # The worker's own refusal first: its reason (cordoned, full) is the most precise.
            EligibleFilter(),
            # Then the broker re-checks the offer's free capacity against the request.
            ResourcesFilter(),
        ),
        scorers=(
            # Default scorer: fill workers to a comfortable level, never into hot spots.
            BestFitScorer(),
        ),
    )
