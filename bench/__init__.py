"""Souq benchmarks: ``make bench`` (``python -m bench``). Results go into docs/benchmarks.md."""
