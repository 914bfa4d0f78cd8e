"""`souq dev`'s own rules: each worker's share of the host, one `souq dev` per data directory."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from souq.dev import LOCK_FILE, lock_data_dir, worker_share
from souq.errors import Conflict


@pytest.mark.parametrize(
    ("cpus", "memory_mb", "workers", "share"),
    [
        (8, 32768, 4, (2.0, 8192)),  # four workers never offer more than the host has
        (2, 24105, 4, (1.0, 6026)),  # fewer cores than workers: one each, a default machine fits
        (6, 1000, 4, (1.5, 250)),
        (8, 3000, 3, (2.66, 1000)),  # rounded down: together, never past the host
        (4, 4096, 1, (4.0, 4096)),
    ],
)
def test_each_worker_offers_its_share_of_the_host(
    cpus: float, memory_mb: int, workers: int, share: tuple[float, int]
) -> None:
    assert worker_share(cpus, memory_mb, workers) == share
    assert worker_share(cpus, memory_mb, workers)[1] * workers <= memory_mb


def test_a_second_lock_on_a_data_directory_names_the_holder(tmp_path: Path) -> None:
    data = tmp_path / "dev"
    held = lock_data_dir(data)
    try:
        assert (data / LOCK_FILE).read_text().strip() == str(os.getpid())
        with pytest.raises(Conflict) as caught:
            lock_data_dir(data)
        assert f"already running on {data} (pid {os.getpid()})" in caught.value.message
        assert sorted(p.name for p in data.iterdir()) == [LOCK_FILE]  # nothing else touched
    finally:
        os.close(held)
    os.close(lock_data_dir(data))  # released: the next one takes it
