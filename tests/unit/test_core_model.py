from __future__ import annotations

import pytest
from pydantic import ValidationError

from souq.model import MachineConfig, Resources, RestartPolicy, normalise_signal


def test_defaults_follow_fly() -> None:
    config = MachineConfig(cmd=["sleep", "1"])
    assert config.guest.cpus == 1
    assert config.guest.memory_mb == 256
    assert config.stop_config.signal == "SIGINT"
    assert config.stop_config.timeout_s == 5
    assert config.restart.policy is RestartPolicy.ON_FAILURE


@pytest.mark.parametrize(
    "raw",
    [
        b'{"cmd": []}',
        b'{"cmd": "sleep 1"}',
        b'{"cmd": [""]}',
        b'{"cmd": ["x"], "gust": {}}',
        b'{"cmd": ["x"], "guest": {"cpus": 0}}',
        b'{"cmd": ["x"], "guest": {"memory_mb": -1}}',
        b'{"cmd": ["x"], "guest": {"cpus": "2"}}',
        b'{"cmd": ["x"], "restart": {"policy": "sometimes"}}',
        b'{"cmd": ["x"], "env": {"1BAD": "x"}}',
        b'{"cmd": ["x"], "env": {"SOUQ_APP": "x"}}',
        b'{"cmd": ["x"], "stop_config": {"signal": "SIGNOPE"}}',
    ],
)
def test_bad_configs_are_refused(raw: bytes) -> None:
    with pytest.raises(ValidationError):
        MachineConfig.model_validate_json(raw)


@pytest.mark.parametrize(
    ("given", "name"),
    [("term", "SIGTERM"), ("SIGKILL", "SIGKILL"), (2, "SIGINT"), ("15", "SIGTERM")],
)
def test_signals_are_normalised(given: str | int, name: str) -> None:
    assert normalise_signal(given) == name


def test_resources_are_exact_in_millicores() -> None:
    a = Resources(cpus=0.1, memory_mb=1)
    total = Resources.zero()
    for _ in range(10):
        total = total.plus(a)
    assert total.millicpus == 1000
    assert Resources(cpus=1, memory_mb=10).fits_within(total)
    assert not Resources(cpus=1.001, memory_mb=10).fits_within(total)
