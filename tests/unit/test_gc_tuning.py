"""The daemons' garbage-collector settings."""

from __future__ import annotations

import gc

from souq import gc_tuning


def test_tune_freezes_the_start_up_heap_and_makes_young_collections_rarer() -> None:
    before = gc.get_threshold()
    try:
        gc_tuning.tune()
        assert gc.get_threshold()[0] == gc_tuning.YOUNG_THRESHOLD > before[0]
        assert gc.get_threshold()[1:] == before[1:]
        assert gc.get_freeze_count() > 0  # what existed at start is never scanned again
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)
