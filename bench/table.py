"""The figures of one ``python -m bench`` run as one table of ratios.

Every suite writes its results to ``bench/results/<suite>.json``, each figure beside the floor
(or peer) it was measured against in the same run, as a ratio. After the suites ran, this
collects every ratio of the files they wrote in this run (a number whose key path names a
ratio: ``ratio``, ``ratios``, ``..._ratio``, ``..._vs_...``, `` / ``) into one table, printed and
written to ``bench/results/table.md`` with the machine and the date.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from bench.stats import machine_line

RESULTS = Path("bench/results")
_RATIO = re.compile(r"(^|_)ratios?($|_)|_vs_|\s/\s")


def ratios(data: Any, path: tuple[str, ...] = ()) -> Iterator[tuple[str, float]]:
    """Each ratio in a suite's results, with the key path that names it (``a.b.c``)."""
    if isinstance(data, dict):
        for key, value in data.items():
            yield from ratios(value, (*path, str(key)))
    elif isinstance(data, list):
        for i, value in enumerate(data):
            yield from ratios(value, (*path, str(i)))
    elif isinstance(data, int | float) and not isinstance(data, bool) and _names_a_ratio(path):
        yield ".".join(path), float(data)


def _names_a_ratio(path: tuple[str, ...]) -> bool:
    return any(_RATIO.search(part) for part in path)


def rows(suites: list[str], since: float) -> list[tuple[str, str, float]]:
    """``(suite, figure, ratio)`` for the suites whose results were written at ``since`` or
    later (a suite that failed, or wrote under another name, has none)."""
    out = []
    for suite in suites:
        for file in sorted(RESULTS.glob(f"{suite}*.json")):
            if file.stat().st_mtime < since:
                continue
            for figure, value in ratios(json.loads(file.read_text())):
                out.append((file.stem, figure, value))
    return out


def render(found: list[tuple[str, str, float]], command: str) -> str:
    lines = [f"`{command}` — {machine_line()}", "", "| suite | figure | ratio |"]
    lines.append("|---|---|---:|")
    lines += [f"| {suite} | {figure} | {value:g} |" for suite, figure, value in found]
    return "\n".join(lines) + "\n"


def report(suites: list[str], since: float, command: str) -> None:
    text = render(rows(suites, since), command)
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "table.md").write_text(text)
    print("\n# ratios of this run (bench/results/table.md)\n")
    print(text)
