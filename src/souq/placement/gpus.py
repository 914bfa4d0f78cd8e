"""GPU fit: which of a worker's GPUs a request would take, and why it cannot.

A worker has ``capacity.gpus`` GPUs of one model (``capacity.gpu_model``), each of
:data:`~souq.model.resources.GPU_MILLI` thousandths, and says how much of each is free
(``WorkerInfo.gpu_free``, by index). A request asks for whole GPUs (``gpus = k``: ``k`` GPUs
wholly free, taken whole) or for a share of one (``gpu_milli = m``: ``m`` thousandths on one GPU
that has that much free), optionally of one model.

:func:`pick` is the one rule for which GPUs a machine gets: the lowest-numbered free GPUs for
whole ones; for a share, the GPU with the least free room that still holds it (the lowest index
on a tie), so shares gather on GPUs already shared and whole GPUs stay free for whole requests.
The worker's admission assigns by it, and the broker's book estimates its own claims with it, so
both agree on where a machine went. A scorer reads the free state with :func:`free_on`.

Pure; the reasons are stable codes (the placement filter names them, admission refuses with
them):

==========================  ===============================================================
``wrong_gpu_model``         the worker's GPUs are not of the model asked for (or it has none)
``insufficient_gpus``       fewer wholly free GPUs than whole GPUs asked for
``insufficient_gpu_share``  no single GPU has the share's thousandths free
==========================  ===============================================================
"""

from __future__ import annotations

from collections.abc import Sequence

from souq.model.reasons import Reason
from souq.model.resources import GPU_MILLI, Resources
from souq.model.worker import WorkerInfo

__all__ = [
    "GPU_REASONS",
    "fits_count",
    "free_of",
    "free_on",
    "give_back",
    "gpu_misfit",
    "gpu_shape",
    "per_gpu",
    "pick",
    "pick_many",
    "take",
]

GPU_REASONS = (Reason.WRONG_GPU_MODEL, Reason.INSUFFICIENT_GPUS, Reason.INSUFFICIENT_GPU_SHARE)


def per_gpu(want: Resources) -> int:
    """Thousandths the request takes on each GPU it gets (0: it asks for no GPU)."""
    return GPU_MILLI if want.gpus > 0 else want.gpu_milli


def gpu_shape(want: Resources) -> str:
    """A GPU machine's shape: ``share``, or its count of whole GPUs; ``""`` for a machine
    without GPUs (``WorkerInfo.gpu_shapes`` counts machines by it)."""
    if want.gpus > 0:
        return str(want.gpus)
    return "share" if want.gpu_milli > 0 else ""


def free_of(capacity: Resources, allocated: Resources, said: Sequence[int]) -> tuple[int, ...]:
    """Free thousandths of each GPU: what the worker ``said``; from a worker that does not say
    (an older peer), an estimate from its sums (whole GPUs first, then the shares packed)."""
    n = capacity.gpus
    if len(said) == n:
        return tuple(said)
    whole, shares = max(allocated.gpus, 0), max(allocated.gpu_milli, 0)
    free: list[int] = []
    for _ in range(n):
        if whole > 0:
            whole -= 1
            free.append(0)
            continue
        used = min(GPU_MILLI, shares)
        shares -= used
        free.append(GPU_MILLI - used)
    return tuple(free)


def free_on(worker: WorkerInfo) -> tuple[int, ...]:
    """The worker's free thousandths per GPU, by index (what scorers read)."""
    return free_of(worker.capacity, worker.allocated, worker.gpu_free)


def pick(want: Resources, free: Sequence[int]) -> tuple[int, ...] | None:
    """The GPUs (indexes) a machine of ``want`` gets on a worker with ``free``; ``()`` when it
    asks for none; None when it does not fit (the model is not checked here)."""
    if want.gpus > 0:
        idle = [i for i, f in enumerate(free) if f >= GPU_MILLI]
        return tuple(idle[: want.gpus]) if len(idle) >= want.gpus else None
    if want.gpu_milli > 0:
        best = -1
        for i, f in enumerate(free):
            if f >= want.gpu_milli and (best < 0 or f < free[best]):
                best = i
        return None if best < 0 else (best,)
    return ()


def take(want: Resources, free: Sequence[int], gpus: Sequence[int]) -> tuple[int, ...]:
    """``free`` after a machine of ``want`` got ``gpus``."""
    out = list(free)
    for i in gpus:
        if 0 <= i < len(out):
            out[i] -= per_gpu(want)
    return tuple(out)


def give_back(want: Resources, free: Sequence[int], gpus: Sequence[int]) -> tuple[int, ...]:
    """``free`` after a machine of ``want`` on ``gpus`` left."""
    out = list(free)
    for i in gpus:
        if 0 <= i < len(out):
            out[i] = min(GPU_MILLI, out[i] + per_gpu(want))
    return tuple(out)


def pick_many(want: Resources, free: Sequence[int], count: int) -> list[tuple[int, ...]] | None:
    """The GPUs each of ``count`` machines of ``want`` gets, one after the other; None when
    they do not all fit."""
    picks: list[tuple[int, ...]] = []
    now = tuple(free)
    for _ in range(count):
        got = pick(want, now)
        if got is None:
            return None
        picks.append(got)
        now = take(want, now, got)
    return picks


def fits_count(want: Resources, free: Sequence[int], limit: int) -> int:
    """How many machines of ``want`` fit one after the other, at most ``limit``."""
    if not want.wants_gpu:
        return limit
    now = tuple(free)
    for n in range(limit):
        got = pick(want, now)
        if got is None:
            return n
        now = take(want, now, got)
    return limit


def gpu_misfit(
    want: Resources, capacity: Resources, free: Sequence[int], count: int = 1
) -> tuple[Reason, str] | None:
    """``(reason, detail)`` when ``count`` machines of ``want`` do not fit the worker's GPUs
    (of ``capacity``, ``free`` per GPU); None when they do, or ask for no GPU."""
    if not want.wants_gpu:
        return None
    model = capacity.gpu_model
    if want.gpu_model is not None and model != want.gpu_model:
        has = (
            "no GPUs"
            if capacity.gpus == 0
            else f"{capacity.gpus} GPUs of model {model or 'unknown'}"
        )
        return Reason.WRONG_GPU_MODEL, f"needs GPUs of model {want.gpu_model}; the worker has {has}"
    if pick_many(want, free, count) is not None:
        return None
    machines = "" if count == 1 else f" for each of {count} machines"
    if want.gpus > 0:
        idle = sum(1 for f in free if f >= GPU_MILLI)
        return (
            Reason.INSUFFICIENT_GPUS,
            f"needs {want.gpus} whole gpus free{machines}; {idle} of {capacity.gpus}",
        )
    most = max(free, default=0)
    return (
        Reason.INSUFFICIENT_GPU_SHARE,
        f"needs {want.gpu_milli}/{GPU_MILLI} of one gpu free{machines}; the freest of its "
        f"{capacity.gpus} gpus has {most}",
    )
