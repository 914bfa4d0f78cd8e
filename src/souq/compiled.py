"""The modules Souq compiles to C with mypyc, and the guard against running a stale build.

A few modules carry every request or every create: the proxy's relay (each HTTP request runs
through it) and the market's core (each placement). They are plain, fully typed Python, and
mypyc (part of mypy) compiles them into C extensions that run the same code without the
interpreter's dispatch; measured in docs/benchmarks.md. Nothing else changes: where there is no
C compiler, or before a build, the same modules run as Python.

``python -m souq.compiled`` builds them in place (next to their sources, as the editable
install that ``make dev`` and ``make test`` make has them), and only when a source changed since
the last build; ``--status`` says which are compiled; ``--clean`` removes the build.

A compiled module that no longer matches its source would run old code silently, so the
packages that hold compiled modules (``souq.proxy``, ``souq.market``, ``souq.placement``) check
first (:func:`refuse_stale`): a compiled module whose source changed since it was built makes
the import fail, naming the command that rebuilds it.

One difference to keep in mind when writing them: compiled, a generator expression that a ``for``
loop iterates is evaluated whole before the loop's first turn (a loop that ``break``-s early
still paid for every item). Where a loop stops early, iterate a generator *function* instead
(``souq.market.book``'s draw does) or the items themselves.
"""

from __future__ import annotations

import importlib.machinery
import os
import sys
from pathlib import Path

__all__ = ["MODULES", "StaleBuild", "build", "clean", "compiled", "refuse_stale", "status"]

# Paths below the package's parent (``src``); each is its own C extension. The proxy's relay
# (every HTTP request), then the market's core and the placement pipeline (every placement).
MODULES = (
    "souq/proxy/exchange.py",
    "souq/proxy/sides.py",
    "souq/proxy/table.py",
    "souq/proxy/upstream.py",
    "souq/proxy/downstream.py",
    "souq/proxy/admission.py",
    "souq/proxy/metrics.py",
    "souq/proxy/core.py",
    "souq/proxy/relay.py",
    "souq/proxy/hooks.py",
    "souq/market/sampling.py",
    "souq/market/orders.py",
    "souq/market/records.py",
    "souq/market/book.py",
    "souq/market/auction.py",
    "souq/placement/request.py",
    "souq/placement/curves.py",
    "souq/placement/constraints.py",
    "souq/placement/stages.py",
    "souq/placement/filters.py",
    "souq/placement/scorers.py",
    "souq/placement/fragmentation.py",
    "souq/placement/gpu_scorers.py",
    "souq/placement/select.py",
    "souq/placement/pipeline.py",
    "souq/placement/policy.py",
)

ROOT = Path(__file__).resolve().parent.parent  # the directory that holds the package
MANIFEST = Path(__file__).resolve().with_name("compiled.sha256")
_SUFFIX = importlib.machinery.EXTENSION_SUFFIXES[0]
# mypyc's build: one group (its shared runtime is ``souq_native__mypyc<suffix>`` beside the
# package), the generated C and the objects in a temporary directory.
_SETUP = """
from setuptools import setup
from mypyc.build import mypycify
setup(
    name="souq-native",
    ext_modules=mypycify(
        {modules!r}, opt_level="3", group_name="souq_native", target_dir={target!r}
    ),
)
"""


class StaleBuild(ImportError):
    """A compiled module was built from an older version of its source."""


def _extension(source: str) -> Path:
    return ROOT / (source[: -len(".py")] + _SUFFIX)


def _dotted(source: str) -> str:
    """``souq/proxy/relay.py`` → ``souq.proxy.relay``."""
    return source[: -len(".py")].replace("/", ".")


def _digest(path: Path) -> str:
    import hashlib

    return hashlib.sha256(path.read_bytes()).hexdigest()


def _manifest() -> dict[str, str]:
    try:
        lines = MANIFEST.read_text().splitlines()
    except FileNotFoundError:
        return {}
    return dict(line.split("  ", 1)[::-1] for line in lines if "  " in line)


def compiled() -> list[str]:
    """The modules (dotted names) that run compiled in this installation."""
    return [_dotted(source) for source in MODULES if _extension(source).exists()]


def stale() -> list[str]:
    """The sources whose compiled module was built from other bytes than they hold now."""
    out: list[str] = []
    manifest: dict[str, str] | None = None
    for source in MODULES:
        ext = _extension(source)
        try:
            built = os.stat(ext).st_mtime
        except FileNotFoundError:
            continue
        if os.stat(ROOT / source).st_mtime <= built:
            continue  # the cheap answer; a newer source may still be the same bytes (a checkout)
        if manifest is None:
            manifest = _manifest()
        if manifest.get(source) != _digest(ROOT / source):
            out.append(source)
    return out


def refuse_stale() -> None:
    """Raise :class:`StaleBuild` if a compiled module would run older code than its source."""
    old = stale()
    if old:
        raise StaleBuild(
            f"{', '.join(old)} changed since it was compiled, and the compiled module would "
            f"run the old code: run `make build` (or `python -m souq.compiled`) to rebuild, "
            f"or `python -m souq.compiled --clean` to run it as Python"
        )


def clean() -> None:
    """Remove every compiled module: the sources run as Python."""
    for source in MODULES:
        _extension(source).unlink(missing_ok=True)
    for path in ROOT.glob(f"*__mypyc{_SUFFIX}"):
        path.unlink()
    MANIFEST.unlink(missing_ok=True)


def build(*, force: bool = False) -> str:
    """Compile :data:`MODULES` in place when a source changed (or ``force``); says what it did.
    Raises RuntimeError if mypyc fails; returns without building where there is no C compiler
    or no mypyc (the ``native`` extra)."""
    import importlib.util
    import shutil
    import subprocess
    import tempfile

    sums = {source: _digest(ROOT / source) for source in MODULES}
    if not force and sums == _manifest() and len(compiled()) == len(MODULES):
        return "the compiled modules are up to date"
    if shutil.which(os.environ.get("CC", "cc")) is None:
        clean()
        return "no C compiler (cc): the modules run as Python"
    if importlib.util.find_spec("mypyc") is None:
        clean()
        return "mypyc is not installed (pip install 'souq[native]'): the modules run as Python"
    clean()
    with tempfile.TemporaryDirectory(prefix="souq-mypyc-") as tmp:
        setup = _SETUP.format(modules=list(MODULES), target=tmp)
        args = ["build_ext", "--inplace", "--build-temp", tmp, "--build-lib", tmp]
        proc = subprocess.run(
            [sys.executable, "-c", setup, *args],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=False,
            env={**os.environ, "MYPY_CACHE_DIR": os.path.join(tmp, "mypy-cache")},
        )
    if proc.returncode != 0:
        clean()
        errors = [line for line in proc.stdout.splitlines() if ": error:" in line]
        raise RuntimeError(
            "mypyc could not compile the modules: "
            + ("\n".join(errors) or (proc.stdout + proc.stderr)[-4000:])
        )
    MANIFEST.write_text("".join(f"{digest}  {source}\n" for source, digest in sums.items()))
    return f"compiled {len(MODULES)} modules with mypyc"


def status() -> str:
    done = compiled()
    if not done:
        return "no module is compiled: everything runs as Python"
    old = {_dotted(source) for source in stale()}
    lines = [f"{name}{' (stale)' if name in old else ''}" for name in done]
    return "compiled with mypyc:\n  " + "\n  ".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if "--status" in args:
        print(status())
        return 0
    if "--clean" in args:
        clean()
        print("removed the compiled modules: everything runs as Python")
        return 0
    try:
        print(build(force="--force" in args))
    except RuntimeError as exc:
        print(exc, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
