"""The broker's and the client's public surfaces are pinned, and the client never needs the
server side (the CLI starts fast and a client-only install stays small)."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest

PUBLIC = {
    "souq.broker": {"BrokerConfig", "BrokerService", "Liveness", "Market", "create_app"},
    "souq.client": {"DEFAULT_API", "SouqClient"},
    "souq.client.cli": {"app", "main", "make_client"},
}


@pytest.mark.parametrize("module", sorted(PUBLIC))
def test_public_surface_is_pinned(module: str) -> None:
    mod = importlib.import_module(module)
    assert set(mod.__all__) == PUBLIC[module]
    for name in mod.__all__:
        assert hasattr(mod, name)


def test_the_cli_imports_no_server_side_module() -> None:
    code = (
        "import sys, souq.client.cli\n"
        "heavy = ('fastapi', 'starlette', 'uvicorn', 'nats', 'souq.broker', 'souq.agent')\n"
        "print(sorted(m for m in sys.modules if m.startswith(heavy)))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert out.strip() == "[]"


def test_broker_config_rejects_unknown_keys() -> None:
    from pydantic import ValidationError

    from souq.broker import BrokerConfig

    config = BrokerConfig(nats_url="nats://127.0.0.1:4222")
    assert (config.listen_host, config.listen_port) == ("127.0.0.1", 4280)
    assert (config.offer_timeout_s, config.claim_timeout_s) == (0.3, 5.0)
    assert (config.max_claim_attempts, config.down_after_missed) == (3, 3)
    with pytest.raises(ValidationError):
        BrokerConfig(nats_url="x", listen_prot=1)  # type: ignore[call-arg]
