"""The ratio table `python -m bench` prints at the end of a run."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from bench import table


def test_every_ratio_is_found_by_its_key_path_and_nothing_else() -> None:
    results = {
        "duration_s": 10,  # "duration" holds "ratio": not a ratio
        "ratio_p50_vs_floor": 2.5,
        "ratios": {"p99": 4.0},
        "cpu_per_create_vs_skeleton": {"broker / skeleton front": 7.5, "note": "text"},
        "runs": [{"throughput_ratio": 0.9, "secured": True}],
        "latency_ms": {"p50": 3.0},
    }
    assert dict(table.ratios(results)) == {
        "ratio_p50_vs_floor": 2.5,
        "ratios.p99": 4.0,
        "cpu_per_create_vs_skeleton.broker / skeleton front": 7.5,
        "runs.0.throughput_ratio": 0.9,
    }


def test_only_the_files_written_in_this_run_make_the_table(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(table, "RESULTS", tmp_path)
    (tmp_path / "spine.json").write_text(json.dumps({"ratio_p50_vs_floor": 3.1}))
    old = tmp_path / "proxy.json"
    old.write_text(json.dumps({"ratios": {"rps": 0.8}}))
    os.utime(old, (1000, 1000))  # written by an earlier run
    found = table.rows(["spine", "proxy"], since=2000)
    assert found == [("spine", "ratio_p50_vs_floor", 3.1)]
    text = table.render(found, "python -m bench spine proxy")
    assert "| spine | ratio_p50_vs_floor | 3.1 |" in text
    assert text.startswith("`python -m bench spine proxy` — ")
