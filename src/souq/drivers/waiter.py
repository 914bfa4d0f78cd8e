"""``souq-waiter``: a tiny C program, built once per host, that is the parent of one machine
process, so that the machine's exit status survives a crash of the agent (see ``waiter.c`` and
src/souq/agent/README.md, "Exit codes that outlive the agent").

:func:`waiter_path` returns the binary, building it on first use with the system's C compiler
(``$CC`` or ``cc``) into a cache directory keyed by the source's hash. Without a compiler it
returns None and the exec driver spawns machines directly: a little faster, but the exit status of
a machine adopted after an agent restart is then unknown. ``SOUQ_WAITER=off`` forces that mode;
``SOUQ_WAITER=/path`` names a prebuilt binary.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import shutil
import subprocess
from pathlib import Path
from typing import Literal

__all__ = ["is_static", "parse_exit_file", "waiter_path"]

log = logging.getLogger(__name__)

_PT_INTERP = 3  # an ELF program header naming the loader a dynamic executable needs
_SOURCES = tuple(Path(__file__).with_name(name) for name in ("waiter.c", "waiter_log.c"))
_HEADERS = (Path(__file__).with_name("waiter_log.h"),)


def _cache_dir() -> Path:
    explicit = os.environ.get("SOUQ_CACHE_DIR")
    if explicit:
        return Path(explicit)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "souq"


@functools.cache
def waiter_path() -> Path | None:
    """The ``souq-waiter`` binary, or None when it is turned off or cannot be built."""
    setting = os.environ.get("SOUQ_WAITER", "")
    if setting == "off":
        return None
    if setting:
        return Path(setting)
    try:
        source = b"".join(path.read_bytes() for path in (*_SOURCES, *_HEADERS))
    except OSError:
        return None
    target = _cache_dir() / f"souq-waiter-{hashlib.sha256(source).hexdigest()[:16]}"
    if os.access(target, os.X_OK):
        return target
    return _build(target)


def _build(target: Path) -> Path | None:
    cc = shutil.which(os.environ.get("CC", "cc"))
    if cc is None:
        log.warning("no C compiler: machines run without souq-waiter (see the agent README)")
        return None
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        log.warning("cannot build souq-waiter in %s: %s", target.parent, exc)
        return None
    tmp = target.with_name(f"{target.name}.{os.getpid()}.tmp")
    errors = b""
    # Static when the toolchain can (it starts ~0.2 ms faster); dynamic otherwise.
    for extra in (["-static"], []):
        done = subprocess.run(
            [cc, "-O2", *extra, "-o", str(tmp), *map(str, _SOURCES)],
            capture_output=True,
            timeout=120,
            check=False,
        )
        if done.returncode == 0:
            os.replace(tmp, target)  # atomic: agents building at once all end with one binary
            return target
        errors = done.stderr
    log.warning("cannot build souq-waiter: %s", errors.decode(errors="replace")[-500:])
    return None


def parse_exit_file(text: str) -> int | None:
    """The status a waiter wrote as a ``Popen.returncode`` (negative: killed by that signal)."""
    words = text.split()
    if len(words) != 2 or not words[1].lstrip("-").isdigit():
        return None
    if words[0] == "code":
        return int(words[1])
    if words[0] == "signal":
        return -int(words[1])
    return None


def is_static(binary: Path) -> bool:
    """Whether ``binary`` (an ELF executable) needs no loader: a static souq-waiter can also be
    a sandbox's first program inside an image's root, which has none of the host's libraries
    (see :mod:`souq.drivers.warm`)."""
    try:
        with open(binary, "rb") as f:
            head = f.read(64)
            if head[:5] != b"\x7fELF\x02":  # 64-bit ELF only
                return False
            order: Literal["little", "big"] = "little" if head[5] == 1 else "big"
            phoff = int.from_bytes(head[32:40], order)
            size, count = int.from_bytes(head[54:56], order), int.from_bytes(head[56:58], order)
            f.seek(phoff)
            table = f.read(size * count)
    except OSError:
        return False
    kinds = (int.from_bytes(table[i : i + 4], order) for i in range(0, len(table), size))
    return _PT_INTERP not in kinds
