"""How ``souq machine exec|ps|metadata|cordon`` print (beside :mod:`souq.client.render`, the
printer of everything else, whose helpers it uses)."""

from __future__ import annotations

import sys
from collections.abc import Sequence

from souq.client.render import _json_or, _listing, line
from souq.model import Machine
from souq.model.machine_tools import ExecReply, ProcessStat

__all__ = ["cordon", "exec_reply", "metadata", "processes"]


@_json_or
def exec_reply(reply: ExecReply) -> None:
    """The command's stdout on stdout, its stderr on stderr, as they came."""
    sys.stdout.write(reply.stdout)
    sys.stdout.flush()
    sys.stderr.write(reply.stderr)
    if reply.truncated:
        sys.stderr.write("souq: the output was cut (256 KiB per stream)\n")
    sys.stderr.flush()


@_json_or
def processes(rows: Sequence[ProcessStat]) -> None:
    titles = ("PID", "RSS", "CPU", "RUNNING", "DIRECTORY", "LISTENING", "COMMAND")
    _listing(rows, "processes", titles, _process_row)


def _process_row(p: ProcessStat) -> tuple[str, ...]:
    listening = ",".join(f"{s.proto}/{s.address}" for s in p.listen_sockets) or "-"
    return (
        str(p.pid),
        f"{p.rss // (1024 * 1024)} MiB",
        f"{p.cpu / 1000:.1f}s",
        f"{p.rtime}s",
        p.directory or "-",
        listening,
        p.command,
    )


@_json_or
def metadata(values: dict[str, str]) -> None:
    for key in sorted(values):
        line(f"{key}={values[key]}")


@_json_or
def cordon(m: Machine) -> None:
    line(f"{m.id} {m.state} {'cordoned' if m.cordoned else 'in rotation'}")
