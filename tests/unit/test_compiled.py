"""The compiled modules: a stale build is refused, and `make test` runs the compiled relay."""

from __future__ import annotations

import importlib.machinery
import os
import shutil
from pathlib import Path

import pytest

from souq import compiled


@pytest.fixture
def tree(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A package with one module and its compiled extension, built from its current bytes."""
    (tmp_path / "pkg").mkdir()
    source = tmp_path / "pkg" / "mod.py"
    source.write_text("X = 1\n")
    monkeypatch.setattr(compiled, "ROOT", tmp_path)
    monkeypatch.setattr(compiled, "MODULES", ("pkg/mod.py",))
    monkeypatch.setattr(compiled, "MANIFEST", tmp_path / "compiled.sha256")
    ext = tmp_path / ("pkg/mod" + importlib.machinery.EXTENSION_SUFFIXES[0])
    ext.write_bytes(b"")
    digest = compiled._digest(source)
    (tmp_path / "compiled.sha256").write_text(f"{digest}  pkg/mod.py\n")
    return tmp_path


def _touch_later(path: Path, than: Path) -> None:
    stat = than.stat()
    os.utime(path, (stat.st_atime + 10, stat.st_mtime + 10))


def test_a_build_of_the_current_source_is_not_stale(tree: Path) -> None:
    assert compiled.compiled() == ["pkg.mod"]
    assert compiled.stale() == []
    compiled.refuse_stale()


def test_a_source_touched_but_unchanged_is_not_stale(tree: Path) -> None:
    ext = next((tree / "pkg").glob("mod.*"))
    _touch_later(tree / "pkg" / "mod.py", than=ext)
    assert compiled.stale() == []


def test_a_changed_source_makes_the_import_fail_naming_the_rebuild(tree: Path) -> None:
    source = tree / "pkg" / "mod.py"
    ext = next((tree / "pkg").glob("mod.*"))
    source.write_text("X = 2\n")
    _touch_later(source, than=ext)
    assert compiled.stale() == ["pkg/mod.py"]
    with pytest.raises(compiled.StaleBuild, match=r"pkg/mod\.py changed.*make build"):
        compiled.refuse_stale()
    assert "pkg.mod (stale)" in compiled.status()


def test_clean_leaves_the_sources_to_run_as_python(tree: Path) -> None:
    compiled.clean()
    assert compiled.compiled() == []
    assert (tree / "pkg" / "mod.py").exists()
    assert "everything runs as Python" in compiled.status()


def test_no_compiled_module_no_check(tree: Path) -> None:
    compiled.clean()
    (tree / "pkg" / "mod.py").write_text("X = 3\n")
    compiled.refuse_stale()


@pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler: the relay runs as Python")
def test_the_suite_runs_the_compiled_modules() -> None:
    # `make test` builds first; a relay that fell back to Python would go unmeasured here.
    assert len(compiled.compiled()) == len(compiled.MODULES), (
        "run `make build` (make test does) before the tests"
    )
    assert compiled.stale() == []
    import souq.proxy.downstream

    assert souq.proxy.downstream.__file__.endswith(importlib.machinery.EXTENSION_SUFFIXES[0])
