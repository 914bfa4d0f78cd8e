"""The README says where an agent keeps each machine's output: where the driver writes it."""

from __future__ import annotations

from pathlib import Path

from souq.drivers.exec import RECORDS

README = Path(__file__).resolve().parents[2] / "README.md"


def test_the_readme_names_the_directory_the_output_log_is_in() -> None:
    text = README.read_text()
    assert f"`DIR/machines/{RECORDS}/<id>/output.log`" in text
    assert "`DIR/machines/<id>/output.log`" not in text
