"""Codes named once: the groups of rejection reasons the market and the client test by, the
worker's flags as its store keeps them, an exit's OOM reason."""

from __future__ import annotations

from pathlib import Path

from souq.agent.state.store import Store
from souq.drivers.base import OOM, OOM_NOTE, ExitStatus
from souq.errors import InsufficientCapacity
from souq.market.auction import _for_room
from souq.model.reasons import CLOSED, SHORT_OF_ROOM, Reason
from souq.model.worker import WorkerState


def test_short_of_room_is_every_insufficient_reason() -> None:
    assert {r.value for r in SHORT_OF_ROOM} == {
        r.value for r in Reason if r.value.startswith("insufficient_")
    }


def test_a_refusal_for_want_of_room() -> None:
    for reason in SHORT_OF_ROOM:
        assert _for_room(reason)
        assert _for_room(str(reason))  # as a claim's refusal carries it
    assert _for_room(InsufficientCapacity.status)  # a refusal that names no reason
    for other in set(Reason) - SHORT_OF_ROOM:
        assert not _for_room(other)
    assert not _for_room(None)
    assert not _for_room("claim_refused")


def test_the_closed_reasons_are_the_closed_states() -> None:
    assert {r.value for r in CLOSED} == {
        s.value for s in WorkerState if s not in (WorkerState.UP, WorkerState.DOWN)
    }


def test_the_workers_flags_are_kept(tmp_path: Path) -> None:
    store = Store(tmp_path)
    assert store.flags() == (False, False)
    store.set_flags(cordoned=True, draining=True)
    store.close()
    store = Store(tmp_path)
    assert store.flags() == (True, True)
    store.set_flags(cordoned=True, draining=False)
    assert store.flags() == (True, False)
    # (the keys an older agent wrote are the same)
    assert (store.meta("cordoned"), store.meta("draining")) == ("1", "0")
    store.close()


def test_an_oom_kill_says_so() -> None:
    killed = ExitStatus(signal="SIGKILL", reason=OOM)
    assert killed.oom_killed
    assert killed.describe() == f"killed by SIGKILL: {OOM_NOTE}"
    assert not ExitStatus(code=1).oom_killed
