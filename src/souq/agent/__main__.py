"""``python -m souq.agent --region R --nats URL [--data-dir DIR] [--cpus N] [--memory-mb N]
[--disk-mb N] [--gpus N] [--label k=v]... [--stop-machines-on-exit]``: the agent without the CLI
package."""

from __future__ import annotations

import argparse
import logging
import sys

from pydantic import ValidationError

from souq.agent.config import DEFAULT_DATA_DIR, AgentConfig
from souq.agent.main import run
from souq.errors import SouqError


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m souq.agent", description="the worker agent")
    parser.add_argument("--region", required=True)
    parser.add_argument("--nats", required=True, help="NATS URL, e.g. nats://127.0.0.1:4222")
    parser.add_argument("--data-dir", default=None, help=f"default {DEFAULT_DATA_DIR}")
    parser.add_argument("--cpus", type=float, default=None)
    parser.add_argument("--memory-mb", type=int, default=None)
    parser.add_argument("--disk-mb", type=int, default=None)
    parser.add_argument("--gpus", type=int, default=None)
    parser.add_argument("--label", action="append", default=[], metavar="K=V")
    parser.add_argument("--stop-machines-on-exit", action="store_true")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(message)s")
    try:
        labels = dict(label.split("=", 1) for label in args.label)
    except ValueError:
        parser.error("--label takes KEY=VALUE")
    try:
        config = AgentConfig(
            region=args.region,
            nats_url=args.nats,
            data_dir=args.data_dir,
            cpus=args.cpus,
            memory_mb=args.memory_mb,
            disk_mb=args.disk_mb,
            gpus=args.gpus,
            labels=labels,
            stop_machines_on_exit=args.stop_machines_on_exit,
        )
        run(config)
    except ValidationError as exc:
        first = exc.errors()[0]
        print(f"error: {first['loc'][0]}: {first['msg']}", file=sys.stderr)
        return 2
    except SouqError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
