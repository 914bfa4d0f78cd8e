"""Priority classes in the simulator (the cluster engine): the trace's classes, the broker's and
the workers' preemption chooser on virtual time, displaced tasks placed again, and what each
class saw."""

from __future__ import annotations

import random

import pytest

from souq.errors import TraceInvalid
from souq.model.policy import PlacementDefaults
from souq.placement import build_pipeline
from souq.sim.classes import class_of_qos
from souq.sim.departures import parse_workers, replay
from souq.sim.fleet import Settings, replay_fleet
from souq.sim.preemption_compare import ARMS, compare
from souq.sim.traces import Task, parse_pods, parse_tasks, tasks_from_pods, trace_window


def task(
    name: str,
    at: float,
    duration: float | None,
    cpus: float,
    klass: str,
    *,
    price: float | None = None,
    memory_mib: int = 256,
) -> Task:
    return Task(
        name, at, duration, int(cpus * 1000), memory_mib, priority_class=klass, max_price=price
    )


def test_the_traces_qos_classes_map_to_priority_classes() -> None:
    assert [class_of_qos(q) for q in ("LS", "Guaranteed", "Burstable", "BE", "be", "?")] == [
        "reserved",
        "reserved",
        "standard",
        "spot",
        "spot",
        None,
    ]
    pods = parse_pods(
        "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,creation_time,deletion_time\n"
        "a,1000,512,0,0,,LS,0,10\n"
        "b,1000,512,0,0,,BE,1,10\n"
        "c,1000,512,0,0,,Burstable,2,10\n"
        "d,1000,512,0,0,,,3,10\n"
    )
    assert [t.priority_class for t in tasks_from_pods(pods)] == [
        "reserved",
        "spot",
        "standard",
        "standard",
    ]


def test_a_generic_trace_names_the_class_and_the_bid() -> None:
    tasks = parse_tasks(
        "name,arrival_s,cpus,memory_mib,priority_class,qos,max_price\n"
        "a,0,1,512,spot,,0.02\n"
        "b,0,1,512,,LS,\n"
        "c,0,1,512,,,\n"
    )
    assert [(t.priority_class, t.max_price) for t in tasks] == [
        ("spot", 0.02),
        ("reserved", None),
        ("standard", None),
    ]
    with pytest.raises(TraceInvalid, match=r"line 2, column 5 \(priority_class\): 'gold'"):
        parse_tasks("name,arrival_s,cpus,memory_mib,priority_class\na,0,1,512,gold\n")
    with pytest.raises(TraceInvalid, match=r"\(qos\): 'XX' is not a QoS class"):
        parse_tasks("name,arrival_s,cpus,memory_mib,qos\na,0,1,512,XX\n")
    with pytest.raises(TraceInvalid, match=r"\(max_price\): -1 is out of range"):
        parse_tasks("name,arrival_s,cpus,memory_mib,max_price\na,0,1,512,-1\n")


def test_a_reserved_task_is_never_preempted() -> None:
    # The worker is full of reserved work; a reserved and a standard create come: neither
    # displaces it, both are refused.
    tasks = [
        task("r1", 0, 100, 4, "reserved"),
        task("r2", 10, 50, 4, "reserved"),
        task("s1", 20, 50, 4, "standard"),
    ]
    report = replay(parse_workers("1x4/4G"), tasks)
    reserved, standard = report.classes["reserved"], report.classes["standard"]
    assert (reserved["placed"], reserved["refused"], reserved["preempted"]) == (1, 1, 0)
    assert (standard["placed"], standard["refused"]) == (0, 1)
    assert report.preemptions == 0
    assert report.failed_by_reason == {"insufficient_cpu": 2}


def test_a_displaced_spot_task_waits_and_is_placed_again() -> None:
    # s1 (spot) runs from 0; r1 (reserved) comes at 10 and displaces it; s1 waits until r1
    # leaves at 60, then starts over (its 10 s of 4 cores lost) and runs its 100 s again.
    tasks = [task("s1", 0, 100, 4, "spot"), task("r1", 10, 50, 4, "reserved")]
    report = replay(parse_workers("1x4/4G"), tasks)
    spot, reserved = report.classes["spot"], report.classes["reserved"]
    assert (reserved["placed"], reserved["refused"], reserved["lost_core_s"]) == (1, 0, 0)
    assert (spot["preempted"], spot["placed_again"], spot["waiting_at_end"]) == (1, 1, 0)
    assert spot["preempted_wait_s"]["max"] == pytest.approx(50, abs=0.01)
    assert spot["lost_core_s"] == pytest.approx(40, abs=0.01)
    # Busy all along but for the instants of the moves: 0 to 160 s, the last departure.
    assert report.samples[-1].t == pytest.approx(160, abs=0.01)
    assert report.samples[-1].running == 0
    # Without preemption the reserved task is refused.
    off = replay(parse_workers("1x4/4G"), tasks, preempt=0)
    assert off.classes["reserved"]["refused"] == 1
    assert off.preemptions == 0


def test_the_cheapest_bid_goes_first_and_standard_displaces_only_spot() -> None:
    # Two spot tasks of 2 cores bid 0.5 and 0.1; a standard one of 2 cores displaces the
    # cheaper one (the broker's chooser: cheapest victims first); a second standard one the
    # other; a third finds only standard work and is refused.
    tasks = [
        task("dear", 0, None, 2, "spot", price=0.5),
        task("cheap", 1, None, 2, "spot", price=0.1),
        task("std1", 10, None, 2, "standard"),
        task("std2", 20, None, 2, "standard"),
        task("std3", 30, None, 2, "standard"),
    ]
    report = replay(parse_workers("1x4/4G"), tasks)
    spot, standard = report.classes["spot"], report.classes["standard"]
    assert (standard["placed"], standard["refused"]) == (2, 1)
    assert (spot["preempted"], spot["waiting_at_end"]) == (2, 2)
    # The cheap one ran 9 s (2 cores), the dear one 20 s: so the cheap one went first.
    assert spot["lost_core_s"] == pytest.approx(2 * 9 + 2 * 20, abs=0.01)


def _mix(seed: int, count: int) -> list[Task]:
    """A production/batch mix: reserved services and spot batch tasks of random sizes."""
    rng = random.Random(seed)
    out = []
    for i in range(count):
        klass = "reserved" if rng.random() < 0.4 else "spot"
        out.append(
            task(
                f"t{i}",
                at=i * 5.0,
                duration=float(rng.choice((60, 120, 300, 600))),
                cpus=rng.choice((1, 2, 4, 8)),
                klass=klass,
            )
        )
    return out


def test_preemption_keeps_reserved_refusals_and_uses_more_capacity() -> None:
    workers = parse_workers("4x16/64G")
    tasks = _mix(4, 160)
    on = replay(workers, tasks, sample_every_s=10)
    off = replay(workers, tasks, preempt=0, sample_every_s=10)
    alone = replay(workers, [t for t in tasks if t.priority_class == "reserved"], sample_every_s=10)
    refused_on, refused_off, refused_alone = (
        r.classes["reserved"]["refused"] for r in (on, off, alone)
    )
    # Reserved refusals do not rise with preemption (here they fall), and reserved work
    # loses nothing.
    assert refused_on < refused_off
    assert on.classes["reserved"]["preempted"] == 0
    assert on.classes["reserved"]["lost_core_s"] == 0
    # The same refusals as if the spot work were not there at all (on this trace; the
    # reserved tasks land elsewhere when spot work is there, so on others it is a few more
    # or fewer) ...
    assert refused_on == refused_alone
    # ... with more of the cluster used, and not less than without preemption.
    assert on.window_utilisation["cpu"] > alone.window_utilisation["cpu"]
    assert on.window_utilisation["cpu"] >= off.window_utilisation["cpu"]
    assert on.preemptions > 0
    spot = on.classes["spot"]
    assert spot["placed_again"] + spot["waiting_at_end"] == spot["preempted"]
    assert spot["preempted_wait_s"]["max"] > 0


def test_a_gpu_share_displaces_the_spot_share_that_holds_its_gpu() -> None:
    # One GPU: a spot task holds 600 thousandths; a reserved one of 600 comes and takes them.
    def share(name: str, at: float, klass: str) -> Task:
        return Task(name, at, 100, 1000, 256, 1, 600, priority_class=klass)

    tasks = [share("s", 0, "spot"), share("r", 10, "reserved")]
    for report in (
        replay(parse_workers("1x8/8G/1:T4"), tasks),
        replay_fleet(parse_workers("1x8/8G/1:T4"), tasks, pipeline=PIPELINE),
    ):
        assert report.classes["reserved"]["refused"] == 0
        assert report.classes["spot"]["preempted"] == 1
        assert report.classes["spot"]["placed_again"] == 1


# -- the fleet engine ---------------------------------------------------------------------------

PIPELINE = build_pipeline(None, PlacementDefaults())


def test_the_fleet_never_displaces_reserved_work() -> None:
    tasks = [
        task("r1", 0, 100, 4, "reserved"),
        task("r2", 10, 50, 4, "reserved"),
        task("s1", 20, 50, 4, "standard"),
    ]
    report = replay_fleet(parse_workers("1x4/4G"), tasks, pipeline=PIPELINE)
    assert report.preemptions == 0
    assert report.classes["reserved"]["refused"] == 1
    assert report.classes["standard"]["refused"] == 1


def test_the_fleet_places_a_displaced_task_again_and_counts_its_wait() -> None:
    tasks = [task("s1", 0, 100, 4, "spot"), task("r1", 10, 50, 4, "reserved")]
    report = replay_fleet(parse_workers("1x4/4G"), tasks, pipeline=PIPELINE)
    spot = report.classes["spot"]
    assert (spot["preempted"], spot["placed_again"]) == (1, 1)
    assert spot["preempted_wait_s"]["max"] == pytest.approx(50)
    assert spot["lost_core_s"] == pytest.approx(40)
    assert report.classes["reserved"]["lost_core_s"] == 0
    assert report.span_s == (0.0, 160.0)  # s1 ran again from 60 s to 160 s
    assert report.utilisation["cpu"] == pytest.approx(100)
    off = replay_fleet(
        parse_workers("1x4/4G"), tasks, pipeline=PIPELINE, settings=Settings(preempt=0)
    )
    assert off.classes["reserved"]["refused"] == 1


def test_the_fleet_with_preemption_keeps_reserved_refusals_and_uses_more() -> None:
    workers = parse_workers("4x16/64G")
    tasks = _mix(4, 160)
    window = trace_window(tasks)
    on = replay_fleet(workers, tasks, pipeline=PIPELINE, settings=Settings(window=window))
    off = replay_fleet(
        workers, tasks, pipeline=PIPELINE, settings=Settings(preempt=0, window=window)
    )
    alone = replay_fleet(
        workers,
        [t for t in tasks if t.priority_class == "reserved"],
        pipeline=PIPELINE,
        settings=Settings(window=window),
    )
    refused_on, refused_off, refused_alone = (
        r.classes["reserved"]["refused"] for r in (on, off, alone)
    )
    assert refused_on < refused_off
    assert refused_on <= refused_alone
    assert on.classes["reserved"]["preempted"] == 0
    assert on.window_utilisation["cpu"] > alone.window_utilisation["cpu"]
    assert on.window_utilisation["cpu"] >= off.window_utilisation["cpu"]


def test_the_comparison_runs_the_three_arms() -> None:
    workers = parse_workers("4x16/64G")
    tasks = _mix(4, 160)
    comparison = compare(
        lambda some, most, window: replay(workers, some, preempt=most, window=window),
        tasks,
        preempt=8,
    )
    body = comparison.as_json()
    assert [a["arm"] for a in body["arms"]] == list(ARMS)
    alone, off, on = body["arms"]
    assert (alone["preemptions"], off["preemptions"]) == (0, 0)
    assert on["preemptions"] > 0
    assert on["reserved_refused"] == alone["reserved_refused"] < off["reserved_refused"]
    assert on["window_s"] == alone["window_s"] == off["window_s"]
    assert on["window_utilisation"]["cpu"] > alone["window_utilisation"]["cpu"]
    assert on["window_utilisation"]["cpu"] >= off["window_utilisation"]["cpu"]
    assert on["reserved_lost_core_s"] == 0
