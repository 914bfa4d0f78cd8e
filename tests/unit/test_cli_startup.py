"""What a ``souq`` command loads as it starts: the whole command line is built without any
record (pydantic's models load as a command reads one), and souq.model's lazy exports are the
objects of their modules."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys

import souq.model

BUILD = """
import json, sys
import typer.main
from souq.client.cli import app
typer.main.get_command(app)
print(json.dumps(sorted(m for m in sys.modules if m.startswith(("souq.model.", "pydantic")))))
"""


def test_building_the_command_line_loads_no_record() -> None:
    done = subprocess.run(
        [sys.executable, "-c", BUILD], capture_output=True, text=True, check=True, timeout=60
    )
    assert json.loads(done.stdout) == ["souq.model.choices"]


def test_every_lazy_export_is_its_modules_object() -> None:
    for name in souq.model.__all__:
        module = importlib.import_module(souq.model._WHERE[name])
        assert getattr(souq.model, name) is getattr(module, name), name


def test_the_command_line_runs_as_a_module_too() -> None:
    """``python -m souq.client.cli`` (the file as ``__main__``) has every command, as
    ``python -m souq`` and the ``souq`` script do."""
    for argv in (["-m", "souq.client.cli"], ["-m", "souq"]):
        done = subprocess.run(
            [sys.executable, *argv, "--help"],
            check=False,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, done.stderr[-500:]
        assert "machine" in done.stdout and "agent" in done.stdout, argv
