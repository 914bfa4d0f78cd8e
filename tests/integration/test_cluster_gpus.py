"""GPUs end to end: agents that offer GPUs of a model (``--gpus``, ``--gpu-model``), machines
that ask for whole GPUs, shares of one, or a model; each lands on GPUs with room, knows which
(``SOUQ_GPUS``), gives them back when destroyed, and a request nobody can hold is refused naming
the GPU reason."""

from __future__ import annotations

import uuid

import pytest

from souq.errors import InsufficientCapacity
from souq.testing import Cluster, wait_until
from tests.clusters import ClusterSpec, agent

# Region `gpu`: one worker with 2 V100M16 GPUs, one with 1 T4.
CLUSTER = ClusterSpec(
    "gpus",
    regions={"gpu": 0},
    cpus=4,
    memory_mb=2048,
    agents=(
        agent("gpu", extra_args=["--gpus", "2", "--gpu-model", "V100M16"]),
        agent("gpu", extra_args=["--gpus", "1", "--gpu-model", "T4"]),
    ),
)


def config(**guest: object) -> dict[str, object]:
    cmd = ["sh", "-c", 'echo "gpus=$SOUQ_GPUS milli=$SOUQ_GPU_MILLI"; exec sleep 600']
    return {"cmd": cmd, "guest": {"cpus": 0.5, "memory_mb": 64, **guest}}


def test_gpu_machines_land_where_they_fit(cluster: Cluster) -> None:
    client = cluster.client()
    v100, t4 = (a.worker_id for a in cluster.agents)
    app = "gpu" + uuid.uuid4().hex[:8]

    whole = client.create_machine(app, "gpu", config(gpus=2))
    assert (whole.worker_id, whole.gpu_ids) == (v100, [0, 1])
    wait_until(
        lambda: "gpus=0,1 milli=1000" in client.logs(app, whole.id), message="SOUQ_GPUS in env"
    )

    # The V100 worker is full: shares go to the T4 and gather on its one GPU.
    shares = [client.create_machine(app, "gpu", config(gpu_milli=400)) for _ in range(2)]
    assert [(m.worker_id, m.gpu_ids) for m in shares] == [(t4, [0]), (t4, [0])]
    free = {w.id: w.gpu_free for w in client.workers()}
    assert free == {v100: [0, 0], t4: [200]}

    # No GPU anywhere has 400 thousandths left.
    with pytest.raises(InsufficientCapacity) as err:
        client.create_machine(app, "gpu", config(gpu_milli=400))
    assert err.value.http_status == 409
    placement = err.value.details["placement"]
    assert set(placement["rejections"]) == {"insufficient_gpu_share"}
    seen = {o["worker_id"]: o["gpu_free"] for o in placement["offers"]}
    assert seen == {v100: [0, 0], t4: [200]}
    assert "insufficient_gpu_share" in err.value.message

    # A model nobody has is named as such.
    with pytest.raises(InsufficientCapacity) as err:
        client.create_machine(app, "gpu", config(gpus=1, gpu_model="A10"))
    placement = err.value.details["placement"]
    assert placement["rejections"] == {"wrong_gpu_model": 2}
    assert placement["unmet"] == {"wrong_gpu_model": ["gpu_model A10"]}

    # Destroy gives the GPUs back; a share of the V100 model now lands there.
    client.destroy(app, whole.id, force=True)
    share = client.create_machine(app, "gpu", config(gpu_milli=400, gpu_model="V100M16"))
    assert (share.worker_id, share.gpu_ids) == (v100, [0])
    for m in [*shares, share]:
        client.destroy(app, m.id, force=True)
    assert {w.id: w.gpu_free for w in client.workers()} == {v100: [1000, 1000], t4: [1000]}
