"""``souq simulate`` as a user runs it: a real process over the repository's openb trace.

Through Souq's pipeline and workers' admission, the paper's BestFit places exactly as the
reference replay (the paper's scores written over arrays) does, seed for seed; the JSON is the
contract's shape; the figure is a PNG; a bad policy is refused with a message and exit 1."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

TRACES = Path(__file__).resolve().parents[2] / "traces"
TRACE = [
    "--nodes",
    str(TRACES / "alibaba-gpu-v2023_openb_node_list_all_node.csv"),
    "--pods",
    str(TRACES / "alibaba-gpu-v2023_openb_pod_list_default.csv"),
]


def _simulate(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "souq", "simulate", *TRACE, *args],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def test_the_pipeline_replays_bestfit_as_the_reference_does(tmp_path: Path) -> None:
    figure = tmp_path / "fig.png"
    args = ("--policy", "bestfit", "--seeds", "42", "--jobs", "1", "--json")
    done = _simulate(*args, "--plot", str(figure))
    assert done.returncode == 0, done.stderr
    body = json.loads(done.stdout)
    assert set(body) == {"policy", "seeds", "unallocated_gpu_pct_at_100", "curve"}
    assert body["policy"] == "bestfit" and body["seeds"] == [42]
    assert 5.0 < body["unallocated_gpu_pct_at_100"] < 10.0
    xs = [x for x, _ in body["curve"]]
    assert xs == sorted(xs) and xs[0] == 0 and xs[-1] >= 128
    assert figure.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    reference = _simulate(*args, "--reference")
    assert reference.returncode == 0, reference.stderr
    assert json.loads(reference.stdout) == body


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--policy", "worst"), "unknown policy 'worst'"),
        (("--seeds", "a-b"), "is not a list of seeds"),
    ],
)
def test_bad_options_are_refused_with_a_message(args: tuple[str, ...], message: str) -> None:
    done = _simulate(*args)
    assert done.returncode == 1
    assert message in done.stderr


def test_plot_without_matplotlib_is_refused_before_the_run(tmp_path: Path) -> None:
    """Where matplotlib cannot be loaded (a package that fails to import stands in for it
    here), --plot is refused first: before the traces are even read, not after the run."""
    blocker = tmp_path / "no-matplotlib" / "matplotlib"
    blocker.mkdir(parents=True)
    (blocker / "__init__.py").write_text("raise ImportError('matplotlib is not installed')\n")
    env = {**os.environ}
    env["PYTHONPATH"] = os.pathsep.join([str(blocker.parent), env.get("PYTHONPATH", "")])
    missing = tmp_path / "not-a-trace.csv"  # read before the run: the check comes first
    done = subprocess.run(
        [sys.executable, "-m", "souq", "simulate", "--nodes", str(missing), "--pods",
         str(missing), "--plot", str(tmp_path / "fig.png")],
        capture_output=True, text=True, timeout=120, check=False, env=env,
    )  # fmt: skip
    assert done.returncode == 1, done.stderr
    assert "--plot needs matplotlib" in done.stderr
    assert "is not a file" not in done.stderr
    assert not (tmp_path / "fig.png").exists()
