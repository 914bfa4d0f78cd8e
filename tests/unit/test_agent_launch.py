"""What a machine of an image runs: the image's command, env and working directory, under
whatever the machine's own config gives."""

from __future__ import annotations

from pathlib import Path

from souq.agent.machines.images import Pulled
from souq.agent.machines.launch import machine_spec, pulled_record
from souq.agent.state.records import MachineRow
from souq.model.image import ImageLayer, ImageRecord, ImageRun
from souq.model.machine import MachineConfig, MachineState
from souq.model.placement import ImagePull, Placement

RECORD = ImageRecord(
    reference="sha256:" + "a" * 64,
    size=10,
    config_digest="sha256:" + "b" * 64,
    layers=[ImageLayer(digest="sha256:" + "c" * 64, size=10, media_type="x")],
    run=ImageRun(cmd=["./serve", "--fast"], env={"MODE": "image", "KEEP": "1"}, workdir="/srv"),
    created_at="",
)


def row(**config: object) -> MachineRow:
    placement = Placement(
        request_id="r1",
        region="mad",
        image=ImagePull(reference=RECORD.reference, layers=1, layers_cached=0, bytes_to_pull=10),
    )
    return MachineRow(
        id="m1",
        app="web",
        name="m1",
        region="mad",
        request_id="r1",
        body_hash="h",
        state=MachineState.STARTING,
        config=MachineConfig.model_validate({"image": RECORD.reference, **config}),
        placement=placement,
        created_at=1,
        updated_at=1,
    )


def test_the_image_command_env_and_directory_apply(tmp_path: Path) -> None:
    spec = machine_spec(row(), "w1", (tmp_path, RECORD))
    assert spec.cmd == ("./serve", "--fast")
    assert spec.env["MODE"] == "image" and spec.env["KEEP"] == "1"
    assert spec.cwd == str(tmp_path / "srv") and spec.image_root == str(tmp_path)


def test_the_machine_config_wins_over_the_image(tmp_path: Path) -> None:
    spec = machine_spec(
        row(cmd=["sh", "-c", "true"], env={"MODE": "mine"}), "w1", (tmp_path, RECORD)
    )
    assert spec.cmd == ("sh", "-c", "true")
    assert spec.env["MODE"] == "mine" and spec.env["KEEP"] == "1"


def test_a_machine_without_an_image_runs_in_its_own_directory() -> None:
    plain = row(cmd=["true"])
    spec = machine_spec(plain, "w1")
    assert spec.cwd is None and spec.image_root is None and spec.cmd == ("true",)


def test_a_pull_is_recorded_in_the_placement(tmp_path: Path) -> None:
    placement, message = pulled_record(row(), Pulled(tmp_path, RECORD, 10, 12.34))
    assert placement is not None and placement.image is not None
    assert (placement.image.bytes_pulled, placement.image.pull_ms) == (10, 12.3)
    assert RECORD.reference in message and "10 bytes" in message
