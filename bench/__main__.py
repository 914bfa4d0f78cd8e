"""Run every benchmark, or those named: ``python -m bench [spine ...]``."""

from __future__ import annotations

import sys

from bench import spine

SUITES = {"spine": spine.main}


def main(argv: list[str]) -> None:
    names = argv or list(SUITES)
    unknown = [n for n in names if n not in SUITES]
    if unknown:
        raise SystemExit(f"unknown benchmark(s) {unknown}; choose from {sorted(SUITES)}")
    for name in names:
        SUITES[name]()


if __name__ == "__main__":
    main(sys.argv[1:])
