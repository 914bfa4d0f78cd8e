"""The worker's admission core: the one place of the claim rules, pure."""

from __future__ import annotations

import pytest

from souq.agent.capacity.admission import Admission, HeldQuote, reserves
from souq.errors import ClaimRefused, InvalidInput, NotFound, QuoteExpired, QuoteUsed
from souq.model import MachineState, Resources
from souq.model.protocol import QuoteState

NOW = 1_000_000


def admission(**kw: object) -> Admission:
    return Admission(worker_id="w1", region="mad", capacity=Resources(cpus=4, memory_mb=4096), **kw)  # type: ignore[arg-type]


def res(cpus: float, memory_mb: int = 0) -> Resources:
    return Resources(cpus=cpus, memory_mb=memory_mb)


def refusal(call: object) -> str:
    with pytest.raises(ClaimRefused) as caught:
        call()  # type: ignore[operator]
    return str(caught.value.details["reason"])


def test_rules_are_checked_in_order_region_cordon_capacity() -> None:
    a = admission(reserved=res(4))
    a.set_flags(cordoned=True, draining=False)
    assert refusal(lambda: a.check_claim("syd", res(1), NOW)) == "wrong_region"
    assert refusal(lambda: a.check_claim("mad", res(1), NOW)) == "cordoned"
    a.set_flags(cordoned=False, draining=False)
    assert refusal(lambda: a.check_claim("mad", res(1), NOW)) == "insufficient_cpu"
    a.release(res(4))
    assert refusal(lambda: a.check_claim("mad", res(0, 5000), NOW)) == "insufficient_memory"
    a.check_claim("mad", res(4, 4096), NOW)  # exactly to the limit fits


def test_a_refusal_carries_the_usage_a_broker_corrects_its_book_with() -> None:
    a = admission()
    a.reserve(res(3))
    with pytest.raises(ClaimRefused) as caught:
        a.check_claim("mad", res(2), NOW)
    usage = caught.value.details["usage"]
    assert usage["version"] == a.version == 1
    assert usage["allocated"]["cpus"] == 3
    assert "2 cpus; 1 of 4 free" in caught.value.message


def test_live_holds_count_and_expired_ones_do_not() -> None:
    a = admission()
    a.hold("q1", res(3), expires_at=NOW + 1000)
    assert refusal(lambda: a.check_claim("mad", res(2), NOW)) == "insufficient_cpu"
    a.check_claim("mad", res(2), NOW + 1000)  # the hold is past its expiry: it holds nothing
    assert a.in_use(NOW) == res(3)
    assert a.end_hold("q1") and not a.end_hold("q1")
    assert a.in_use(NOW) == Resources.zero()


def test_a_batch_must_fit_together() -> None:
    a = admission(reserved=res(1))
    a.check_batch("mad", res(1), 3, NOW)
    assert refusal(lambda: a.check_batch("mad", res(1), 4, NOW)) == "insufficient_cpu"
    a.set_flags(cordoned=True, draining=True)
    assert refusal(lambda: a.check_batch("mad", res(1), 1, NOW)) == "cordoned"


def test_a_quote_is_judged_by_its_own_hold_even_on_a_cordoned_worker() -> None:
    a = admission(reserved=res(4))
    a.set_flags(cordoned=True, draining=False)
    quote = HeldQuote("q1", "web", res(1), expires_at=NOW + 10, state=QuoteState.HELD)
    a.check_claim("mad", res(1), NOW, quote=quote)  # the hold was made before the cordon
    with pytest.raises(InvalidInput, match="quote q1 holds 1 cpus"):
        a.check_claim("mad", res(2), NOW, quote=quote)
    with pytest.raises(QuoteExpired, match="expired"):
        a.check_claim("mad", res(1), NOW + 10, quote=quote)
    released = HeldQuote("q1", "web", res(1), NOW + 10, QuoteState.RELEASED)
    with pytest.raises(QuoteExpired, match="released"):
        a.check_claim("mad", res(1), NOW, quote=released)
    used = HeldQuote("q1", "web", res(1), NOW + 10, QuoteState.USED, machine_id="m1")
    with pytest.raises(QuoteUsed, match="m1"):
        a.check_claim("mad", res(1), NOW, quote=used)
    with pytest.raises(NotFound, match="not found in app api"):
        a.check_quote_app(quote, "q1", "api")


def test_every_change_of_what_is_promised_moves_the_version() -> None:
    a = admission()
    versions = [a.version]
    a.reserve(res(1))
    versions.append(a.version)
    a.hold("q", res(1), NOW + 5)
    versions.append(a.version)
    a.end_hold("q")
    versions.append(a.version)
    a.release(res(1))
    versions.append(a.version)
    a.set_flags(cordoned=True, draining=False)
    versions.append(a.version)
    a.set_flags(cordoned=True, draining=False)  # no change, no new version
    versions.append(a.version)
    assert versions == [0, 1, 2, 3, 4, 5, 5]
    usage = a.usage(NOW)
    assert (usage.version, usage.allocated, usage.capacity.cpus) == (5, Resources.zero(), 4)


def test_offers_say_why_not() -> None:
    a = admission(reserved=res(3.5))
    assert a.offer_refusal(res(0.5), NOW) is None
    reason, detail = a.offer_refusal(res(1), NOW) or ("", "")
    assert reason == "insufficient_cpu" and "0.5 of 4 free" in detail
    a.set_flags(cordoned=True, draining=False)
    assert (a.offer_refusal(res(0.5), NOW) or ("",))[0] == "cordoned"


def test_a_failed_machine_gives_its_reservation_back_until_it_starts() -> None:
    m = MachineState
    assert reserves(True, m.STARTED) and reserves(True, m.STOPPED)  # a stopped one keeps it
    assert not reserves(True, m.FAILED) and not reserves(True, m.DESTROYED)
    assert not reserves(False, m.STOPPED) and not reserves(False, m.DESTROYING)
    assert reserves(False, m.STARTING)  # only a start takes it again
    assert not reserves(False, m.FAILED)
