"""``python -m souq.agent [OPTIONS]``: the same command as ``souq agent [OPTIONS]``, one entry
point with one set of options (:mod:`souq.client.daemons`)."""

from __future__ import annotations

import sys

from souq.client.cli import app


def main(argv: list[str] | None = None) -> None:
    app(["agent", *(sys.argv[1:] if argv is None else argv)], prog_name="python -m souq")


if __name__ == "__main__":
    main()
