"""FGD's fragmentation measure and the baselines' scores on small hand-worked nodes."""

from __future__ import annotations

import random

import numpy as np
import pytest

from souq.sim.frag import Workload, fgd_score, node_frag, squash, task_frag
from souq.sim.gpu_policies import Candidates, best_gpus, fgd, score
from souq.sim.traces import Pod
from souq.sim.workload import PodSpec

SHARE_300 = PodSpec(cpu_milli=1000, gpu_milli=300, num_gpu=1, p=0.5)
ONE_GPU = PodSpec(cpu_milli=1000, gpu_milli=1000, num_gpu=1, p=0.25)
TWO_GPU = PodSpec(cpu_milli=1000, gpu_milli=1000, num_gpu=2, p=0.125)
CPU_ONLY = PodSpec(cpu_milli=1000, gpu_milli=0, num_gpu=0, p=0.125)
M = [SHARE_300, ONE_GPU, TWO_GPU, CPU_ONLY]
NODE = [1000, 500, 200, 0]  # free milli per GPU: 1,700 in all


def test_a_task_that_fits_leaves_the_gpus_too_small_for_it() -> None:
    assert task_frag(10_000, NODE, SHARE_300) == 200 + 0  # the 200 GPU cannot take 300
    assert task_frag(10_000, NODE, ONE_GPU) == 500 + 200  # only the whole free GPU serves


def test_a_task_that_does_not_fit_leaves_all_the_free_milli() -> None:
    assert task_frag(10_000, NODE, TWO_GPU) == 1700  # one fully free GPU, two needed
    assert task_frag(10_000, NODE, CPU_ONLY) == 1700  # a CPU-only task uses no GPU
    assert task_frag(500, NODE, SHARE_300) == 1700  # CPU lacking
    assert task_frag(10_000, NODE, PodSpec(1000, 300, 1, "V100M32")) == 1700
    assert task_frag(10_000, NODE, PodSpec(1000, 300, 1, "V100M32"), model="V100M32") == 200


def test_the_node_measure_weights_tasks_by_their_share() -> None:
    # 0.5*200 + 0.25*700 + 0.125*1700 + 0.125*1700
    assert node_frag(10_000, NODE, M) == pytest.approx(100 + 175 + 425)


def test_fgd_picks_the_gpu_whose_use_grows_fragmentation_least() -> None:
    before = node_frag(10_000, NODE, M)  # 700
    # A 300 share on the 500 GPU leaves [1000, 200, 200, 0]: 0.5*400 + 0.25*400 + 0.25*1400.
    after_on_500 = node_frag(9_000, [1000, 200, 200, 0], M)
    assert after_on_500 == pytest.approx(200 + 100 + 350)
    # On the whole GPU it leaves [700, 500, 200, 0]: the 1-GPU task no longer fits.
    after_on_1000 = node_frag(9_000, [700, 500, 200, 0], M)
    assert after_on_1000 == pytest.approx(0.5 * 200 + 0.5 * 1400)
    result = fgd_score(10_000, NODE, cpu=1000, num_gpu=1, gpu_milli=300, workload=M)
    assert result == (squash(before - after_on_500), (1,))
    assert squash(before - after_on_500) == 51  # ⌊100·sigmoid(0.05)⌋
    assert squash(0) == 50
    assert squash(-1e9) == 0


def test_fgd_on_whole_gpus_takes_the_first_free_ones_or_refuses() -> None:
    result = fgd_score(10_000, NODE, cpu=1000, num_gpu=1, gpu_milli=1000, workload=M)
    assert result is not None
    assert result[1] == (0,)
    assert fgd_score(10_000, NODE, cpu=1000, num_gpu=2, gpu_milli=1000, workload=M) is None


def _random_nodes(rng: random.Random, n: int) -> tuple[np.ndarray, np.ndarray]:
    gpus = np.array(
        [[rng.choice([0, 100, 200, 300, 500, 700, 1000]) for _ in range(4)] for _ in range(n)]
    )
    cpus = np.array([rng.choice([0, 500, 1000, 2000, 8000]) for _ in range(n)])
    return cpus.astype(np.int64), gpus.astype(np.int64)


@pytest.mark.parametrize("pod", [(1000, 1, 300), (1000, 1, 1000), (2000, 2, 1000), (500, 0, 0)])
def test_the_array_form_agrees_with_the_definition(pod: tuple[int, int, int]) -> None:
    cpu, k, milli = pod
    cpus, gpus = _random_nodes(random.Random(7), 200)
    wl = Workload(M)
    np.testing.assert_allclose(
        wl.frag(cpus, gpus),
        [node_frag(int(c), g.tolist(), M) for c, g in zip(cpus, gpus, strict=True)],
    )
    c = Candidates(cpus, gpus, np.full(200, 4), np.zeros(200, dtype=np.int64))
    scores, choice = fgd(c, Pod("p", cpu, 0, k, milli), wl)
    for i in range(200):
        want = fgd_score(
            int(cpus[i]), gpus[i].tolist(), cpu=cpu, num_gpu=k, gpu_milli=milli, workload=M
        )
        if want is None:
            continue
        assert scores[i] == want[0]
        if k == 1 and milli < 1000:
            assert choice[i] == want[1][0]


def _nodes(*rows: list[int], cpus: list[int] | None = None, classes: list[int] | None = None):
    gpus = np.array([r + [0] * (8 - len(r)) for r in rows], dtype=np.int64)
    n = len(rows)
    return Candidates(
        np.array(cpus or [64_000] * n, dtype=np.int64),
        gpus,
        np.array([len(r) for r in rows], dtype=np.int64),
        np.array(classes or [0] * n, dtype=np.int64),
    )


SHARE = Pod("s", 4000, 0, 1, 400)
WHOLE = Pod("w", 4000, 0, 1, 1000)


def test_bestfit_prefers_the_least_left_after_placement() -> None:
    c = _nodes([1000, 1000], [500, 1000], [400, 0])
    scores, _ = score("bestfit", c, SHARE)
    # leftover = 0.5*(60,000/128,000) + 0.5*(free-400)/8,000
    cpu_left = 0.5 * 60_000 / 128_000
    want = [int(100 * (1 - (cpu_left + 0.5 * (free - 400) / 8000))) for free in (2000, 1500, 400)]
    assert list(scores) == want == [66, 69, 76]


def test_dotprod_prefers_a_small_product_with_what_is_free() -> None:
    c = _nodes([1000, 1000], [400, 0], cpus=[128_000, 0])
    scores, _ = score("dotprod", c, SHARE)
    dot0 = (4000 / 128_000) + (2000 / 8000) * (400 / 8000)
    assert list(scores) == [int(100 * (1 - dot0 / 2)), int(100 * (1 - (400 / 8000) ** 2 / 2))]


def test_gpupacking_fills_used_gpus_then_used_nodes_then_small_idle_ones() -> None:
    c = _nodes([1000] * 8, [1000, 1000], [1000, 500], [1000, 1000, 1000, 600])
    scores, _ = score("gpupacking", c, SHARE)
    assert list(scores) == [25, 31, 100 - 5, 100 - 6]
    scores, _ = score("gpupacking", _nodes([1000, 300], [1000, 1000]), WHOLE)
    assert list(scores) == [49, 31]
    assert list(score("gpupacking", c, Pod("c", 1000, 0, 0, 0))[0]) == [0, 0, 0, 0]


def test_gpuclustering_prefers_nodes_of_the_same_class_and_fuller() -> None:
    share, one = 1, 2
    c = _nodes(
        [500, 1000], [500, 1000], [1000, 1000], [0, 1000], classes=[share, share | one, 0, one]
    )
    scores, _ = score("gpuclustering", c, SHARE)
    assert list(scores) == [
        75 + 25 * 6500 // 8000,
        50 + 25 * 6500 // 8000,
        25 + 25 * 6000 // 8000,
        25 * 7000 // 8000,
    ]


def test_gpu_selection_best_takes_the_tightest_fit_and_random_any_fit() -> None:
    assert best_gpus([1000, 500, 450, 300], SHARE) == (2,)
    assert best_gpus([1000, 0, 1000, 1000], Pod("w", 1, 0, 2, 1000)) == (0, 2)
    rng = random.Random(1)
    picks = {best_gpus([1000, 500, 450, 300], SHARE, rng)[0] for _ in range(50)}
    assert picks == {0, 1, 2}
