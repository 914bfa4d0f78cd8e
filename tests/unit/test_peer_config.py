"""A machine config as a peer sends it: the serializer writes Fly's forms beside Souq's (the
command in ``init.exec`` too, the stop timeout as ``timeout`` too), and reading them back takes
the short way for exactly what it wrote, while a user's Fly forms are still read and checked."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from souq.model import MachineConfig
from souq.model.base import FROM_PEER, as_peer


def peer_copy(config: MachineConfig) -> MachineConfig:
    with as_peer():
        return MachineConfig.model_validate_json(config.model_dump_json(), extra=FROM_PEER)


@pytest.mark.parametrize(
    "given",
    [
        {"cmd": ["sleep", "1"]},
        {"cmd": ["sleep", "1"], "stop_config": {"timeout_s": 90.5, "signal": "SIGTERM"}},
        {"init": {"exec": ["sh", "-c", "x"]}, "stop_config": {"timeout": "1m30s"}},
        {"image": "sha256:" + "ab" * 32, "init": {"entrypoint": ["/e"], "cmd": ["c"]}},
    ],
)
def test_a_config_read_back_from_its_json_is_the_same(given: dict[str, object]) -> None:
    config = MachineConfig.model_validate(given)
    sent = json.loads(config.model_dump_json())
    if config.cmd:
        assert sent["init"]["exec"] == config.cmd  # both forms on the wire
    assert sent["stop_config"]["timeout"]
    assert peer_copy(config) == config
    assert peer_copy(config).init.exec == []  # one form kept


def test_a_users_fly_forms_are_still_read_and_checked() -> None:
    assert MachineConfig.model_validate({"init": {"exec": ["a"]}}).cmd == ["a"]
    same = MachineConfig.model_validate({"cmd": ["a"], "init": {"exec": ["a"]}})
    assert same.cmd == ["a"] and same.init.exec == []
    with pytest.raises(ValidationError, match="disagree"):
        MachineConfig.model_validate({"cmd": ["a"], "init": {"exec": ["b"]}})
    stop = {"timeout": "10s", "timeout_s": 10}
    assert (
        MachineConfig.model_validate({"cmd": ["a"], "stop_config": stop}).stop_config.timeout_s
        == 10
    )
    with pytest.raises(ValidationError, match="disagree"):
        MachineConfig.model_validate(
            {"cmd": ["a"], "stop_config": {"timeout": "10s", "timeout_s": 5}}
        )
