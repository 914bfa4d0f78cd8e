"""What docs/architecture.md says lives in one place, pinned where a scan of the source can
tell: the bus's subjects are spelled only in ``souq.bus.subjects``, and of the CLI only the
``souq.client.render`` modules print."""

from __future__ import annotations

import ast
import importlib.util
import re
from collections.abc import Iterator
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src" / "souq"
SUBJECTS = SRC / "bus" / "subjects.py"
# The first token after "souq." of every subject the bus carries (souq.bus.subjects' table).
_SUBJECT = re.compile(r"^souq\.(offers|worker|all|hb|evt|use|jobevt|discover|jobs|audit)\b")


def _modules() -> Iterator[tuple[Path, ast.Module]]:
    for path in sorted(SRC.rglob("*.py")):
        yield path, ast.parse(path.read_text(), filename=str(path))


def _is_module_name(text: str) -> bool:
    """A dotted name of one of Souq's modules (an import path or a logger's name), not a
    subject."""
    try:
        return importlib.util.find_spec(text) is not None
    except (ImportError, ValueError):
        return False


def _logger_names(tree: ast.Module) -> set[int]:
    """The ids of the string nodes passed to ``logging.getLogger``."""
    named: set[int] = set()
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "getLogger"
        ):
            named.update(id(a) for a in node.args)
    return named


def _spelled_subjects(tree: ast.Module) -> list[tuple[int, str]]:
    found: list[tuple[int, str]] = []
    loggers = _logger_names(tree)
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr):
            head = node.values[0] if node.values else None
            if isinstance(head, ast.FormattedValue):
                value = ast.unparse(head.value)
                if value in {"PREFIX", "subjects.PREFIX"}:
                    found.append((node.lineno, ast.unparse(node)))
            elif isinstance(head, ast.Constant) and _SUBJECT.match(str(head.value)):
                found.append((node.lineno, ast.unparse(node)))
        elif (
            isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and id(node) not in loggers
            and _SUBJECT.match(node.value)
            and not _is_module_name(node.value)
        ):
            found.append((node.lineno, node.value))
    return found


def test_only_the_subjects_module_spells_a_subject() -> None:
    spelled = {
        f"{path.relative_to(SRC)}:{line}": text
        for path, tree in _modules()
        if path != SUBJECTS
        for line, text in _spelled_subjects(tree)
    }
    assert spelled == {}


def test_the_scan_finds_a_subject_spelled_elsewhere() -> None:
    tree = ast.parse('S = "souq.jobs.ready"\nT = f"{subjects.PREFIX}.worker.*.*"\n')
    assert [line for line, _ in _spelled_subjects(tree)] == [1, 2]
    logger = 'import logging\nlog = logging.getLogger("souq.audit")'
    assert _spelled_subjects(ast.parse(logger)) == []
    assert _spelled_subjects(ast.parse('M = "souq.jobs.core"')) == []


_PRINTS = {"print", "typer.echo", "sys.stdout.write", "sys.stderr.write", "Console"}


def _printing_calls(tree: ast.Module) -> list[int]:
    return [
        node.lineno
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and ast.unparse(node.func) in _PRINTS
    ]


def test_of_the_cli_only_the_render_modules_print() -> None:
    printing = {
        str(path.relative_to(SRC)): lines
        for path, tree in _modules()
        if (path.parent.name == "client" or path.name == "daemon_commands.py")
        and not path.stem.startswith("render")
        if (lines := _printing_calls(tree))
    }
    assert printing == {}


def test_the_scan_finds_a_print() -> None:
    tree = ast.parse('import typer\nprint("x")\ntyper.echo("y")\n')
    assert _printing_calls(tree) == [2, 3]


def test_the_placement_pipeline_is_wired_in_one_function() -> None:
    """docs/placement.md: "The pipeline is wired in one function, ``build_pipeline``"."""
    wired = {
        f"{path.relative_to(SRC)}:{node.lineno}"
        for path, tree in _modules()
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and ast.unparse(node.func) == "Pipeline"
    }
    assert len(wired) == 1
    assert next(iter(wired)).startswith("placement/policy.py:")


def test_the_placement_docs_name_every_reason_once_named() -> None:
    """docs/placement.md's filter table names exactly the reasons of ``souq.model.reasons``
    (but the worker's own: its ports, what it could displace (in docs/placement.md's text), an
    app's network it cannot know (docs/network.md))."""
    from souq.model.reasons import Reason

    doc = (SRC.parents[1] / "docs" / "placement.md").read_text()
    table = doc[doc.index("| order | filter |") : doc.index("### Scorers")]
    named = set(re.findall(r"`([a-z_]+)`", table))
    worker_own = {Reason.NO_PORTS, Reason.NO_PREEMPTIBLE, Reason.DECLINED, Reason.NETWORK_UNKNOWN}
    assert {r.value for r in Reason} - worker_own <= named
    assert named & {r.value for r in Reason} == {r.value for r in Reason} - worker_own


def test_no_reason_is_spelled_outside_its_declaration() -> None:
    from souq.model.reasons import Reason

    codes = {r.value for r in Reason} - {"cordoned", "draining"}  # worker states too
    spelled = {
        f"{path.relative_to(SRC)}:{node.lineno}"
        for path, tree in _modules()
        if path.name != "reasons.py"
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and node.value in codes and id(node) not in _exports(tree)
    }
    assert spelled == set()


def test_no_event_type_is_spelled_where_an_event_is_made_or_read() -> None:
    """An event's ``type`` is made (``type=...``) and read (``.type == ...``, ``.get("type")``)
    by its name in ``souq.model.choices.EventType``, never by its string."""
    from souq.model.choices import EventType

    types = {t.value for t in EventType}

    def spelled(node: ast.AST) -> bool:
        return isinstance(node, ast.Constant) and node.value in types

    def spelled_in(node: ast.AST) -> bool:
        return spelled(node) or (
            isinstance(node, ast.Tuple | ast.List | ast.Set) and any(map(spelled, node.elts))
        )

    def reads_type(node: ast.AST) -> bool:
        return (isinstance(node, ast.Attribute) and node.attr == "type") or (
            isinstance(node, ast.Call)
            and ast.unparse(node.func).endswith(".get")
            and bool(node.args)
            and ast.unparse(node.args[0]) == "'type'"
        )

    found = {
        f"{path.relative_to(SRC)}:{node.lineno}"
        for path, tree in _modules()
        for node in ast.walk(tree)
        if (isinstance(node, ast.keyword) and node.arg == "type" and spelled_in(node.value))
        or (
            isinstance(node, ast.Compare)
            and reads_type(node.left)
            and any(map(spelled_in, node.comparators))
        )
    }
    assert found == set()


def _exports(tree: ast.Module) -> set[int]:
    """The ids of the names in a module's ``__all__`` (a name, not a reason)."""
    return {
        id(item)
        for node in tree.body
        if isinstance(node, ast.Assign) and ast.unparse(node.targets[0]) == "__all__"
        for item in ast.walk(node.value)
    }
