"""The CLI's start-up (``python -m bench cli``): CPU seconds and wall time of ``souq --help`` and
``souq workers`` against a running cluster (``souq.testing.Cluster``: nats-server, an agent, a
broker), each a new process, against the floor ``python -c pass`` measured in the same run,
interleaved round by round; medians of ``ROUNDS``.

CPU is the child's user + system time (``resource.getrusage(RUSAGE_CHILDREN)`` around each
run). With ``SOUQ_BENCH_BEFORE=DIR`` (a ``src`` directory of another checkout, e.g. one
``git archive`` made of main) the same commands run from that code too, in the same rounds.
"""

from __future__ import annotations

import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.stats import machine_line
from souq.testing import Cluster

ROUNDS = int(os.environ.get("SOUQ_BENCH_ROUNDS", "5"))
HERE = str(Path(__file__).resolve().parents[1] / "src")


def _run(argv: list[str], env: dict[str, str]) -> tuple[float, float]:
    """(CPU seconds, wall seconds) of one run of ``argv``."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return cpu, wall


def main() -> None:
    sources = {"this": HERE}
    if os.environ.get("SOUQ_BENCH_BEFORE"):
        sources["before"] = os.environ["SOUQ_BENCH_BEFORE"]
    commands = {
        "python -c pass": [sys.executable, "-c", "pass"],
        "souq --help": [sys.executable, "-m", "souq", "--help"],
        "souq workers": [sys.executable, "-m", "souq", "workers"],
    }
    with tempfile.TemporaryDirectory() as tmp, Cluster(Path(tmp), regions={"mad": 2}) as cluster:
        base = {**os.environ, "SOUQ_API": cluster.api_url}
        results: dict[tuple[str, str], list[tuple[float, float]]] = {}
        for round_ in range(ROUNDS + 1):  # the first writes the bytecode caches: not counted
            for source, src in sources.items():
                env = {**base, "PYTHONPATH": src}
                for name, argv in commands.items():
                    if name.startswith("python") and source != "this":
                        continue  # the floor is one
                    measured = _run(argv, env)
                    if round_:
                        results.setdefault((name, source), []).append(measured)
    print(f"# {machine_line()}; {ROUNDS} rounds, medians")
    print("| command | code | CPU s | wall s |")
    print("|---|---|---|---|")
    for (name, source), runs in results.items():
        cpu = statistics.median(c for c, _ in runs)
        wall = statistics.median(w for _, w in runs)
        print(f"| `{name}` | {source} | {cpu:.2f} | {wall:.2f} |")


if __name__ == "__main__":
    main()
