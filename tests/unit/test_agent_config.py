"""The agent's config: validated once, unknown keys rejected, sensible defaults."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from souq.agent.config import DEFAULT_DATA_DIR, AgentConfig
from souq.agent.machines.restart import Backoff


def test_defaults() -> None:
    config = AgentConfig(region="mad", nats_url="nats://127.0.0.1:4222")
    assert config.data_dir == DEFAULT_DATA_DIR.expanduser()
    assert config.data_dir.is_absolute()
    assert config.cpus is None
    assert config.memory_mb is None
    assert config.stop_machines_on_exit is False
    assert config.backoff == Backoff(base_s=0.1, max_s=30.0, reset_after_s=10.0)


def test_none_data_dir_means_the_default() -> None:
    config = AgentConfig(region="mad", nats_url="nats://x", data_dir=None)  # type: ignore[arg-type]
    assert config.data_dir == DEFAULT_DATA_DIR.expanduser()
    assert AgentConfig(region="mad", nats_url="nats://x", data_dir="/tmp/a").data_dir == Path(  # type: ignore[arg-type]
        "/tmp/a"
    )


def test_unknown_keys_and_bad_values_are_rejected() -> None:
    with pytest.raises(ValidationError):
        AgentConfig(region="mad", nats_url="nats://x", cpu=4)  # type: ignore[call-arg]
    with pytest.raises(ValidationError):
        AgentConfig(region="mad", nats_url="nats://x", cpus=0)
    with pytest.raises(ValidationError, match="region"):
        AgentConfig(region="ma.d", nats_url="nats://x")


def test_frozen() -> None:
    config = AgentConfig(region="mad", nats_url="nats://x")
    with pytest.raises(ValidationError):
        config.region = "syd"  # type: ignore[misc]


def test_dns_takes_address_and_port_ipv6_in_brackets() -> None:
    from souq.agent.config import AgentConfig

    config = AgentConfig(
        region="mad",
        nats_url="nats://x",
        dns="[fdaa::3]:53",
        dns_upstreams=["127.0.0.1:5353", "[::1]:53"],
    )
    assert config.dns == ("fdaa::3", 53)
    assert config.dns_upstreams == (("127.0.0.1", 5353), ("::1", 53))
    assert AgentConfig(region="mad", nats_url="nats://x").dns is None
    for bad in ("fdaa::3", "[fdaa::3]", "fdaa::3:53", ":53", "h:99999"):
        with pytest.raises(ValueError, match="ADDRESS:PORT"):
            AgentConfig(region="mad", nats_url="nats://x", dns=bad)
