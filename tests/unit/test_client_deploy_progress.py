"""How a deploy's progress shows: on a terminal, a live table of its machines; elsewhere, a
line an event (JSON with --json)."""

from __future__ import annotations

import io
import json

import pytest
from rich.console import Console

from souq.client import render_deploy

EVENTS = [
    {"kind": "release", "message": "release v4 of shop: sha256:ab", "version": 4},
    {"kind": "phase", "message": "rolling app in mad (1/2): 1 to update", "phase": "rolling"},
    {"kind": "step", "message": "machine m1 updated", "region": "mad", "machine_id": "m1",
     "phase": "rolling app in mad (1/2)"},
    {"kind": "healthy", "message": "machine m1 is healthy", "region": "mad", "machine_id": "m1"},
]  # fmt: skip


def test_a_terminal_gets_a_live_table_of_the_machines() -> None:
    buffer = io.StringIO()
    console = Console(file=buffer, force_terminal=True, width=120, color_system=None)
    with render_deploy.deploy_progress(as_json=False, console=console) as show:
        for event in EVENTS:
            show(event)
    text = buffer.getvalue()
    assert "MACHINE" in text and "m1" in text and "mad" in text
    assert "machine m1 is healthy" in text  # its last event, in its row
    assert "rolling app in mad (1/2)" in text  # the phase it was in
    assert "release v4 of shop" in text


def test_elsewhere_a_line_an_event(capsys: pytest.CaptureFixture[str]) -> None:
    console = Console(file=io.StringIO(), force_terminal=False)
    with render_deploy.deploy_progress(as_json=True, console=console) as show:
        for event in EVENTS:
            show(event)
    lines = capsys.readouterr().out.splitlines()
    assert [json.loads(line)["kind"] for line in lines] == ["release", "phase", "step", "healthy"]


def test_a_failed_deploy_is_said_once_by_its_error_not_by_its_event(
    capsys: pytest.CaptureFixture[str],
) -> None:
    failed = {"kind": "failed", "message": "release v4 failed (phase x): boom; rolled back"}
    for terminal in (False, True):
        console = Console(file=io.StringIO(), force_terminal=terminal, width=120)
        with render_deploy.deploy_progress(as_json=False, console=console) as show:
            show(EVENTS[0])
            show(failed)
        assert "boom" not in console.file.getvalue()  # type: ignore[attr-defined]
    said = capsys.readouterr()
    assert "boom" not in said.out + said.err  # the command's error says it, with its hint
    with render_deploy.deploy_progress(as_json=True, console=Console(file=io.StringIO())) as show:
        show(failed)  # --json keeps every event, the failed one too
    assert json.loads(capsys.readouterr().out)["kind"] == "failed"
