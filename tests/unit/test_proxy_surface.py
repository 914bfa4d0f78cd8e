"""The proxy package's public surface is pinned, and its table stays pure."""

from __future__ import annotations

import ast
from pathlib import Path

import souq.proxy

PROXY = Path(souq.proxy.__file__).parent

PUBLIC = {
    "CONTENT_TYPE",
    "DEFAULT_HARD_LIMIT",
    "DEFAULT_SOFT_LIMIT",
    "AppNotFound",
    "Availability",
    "Backend",
    "BadRequest",
    "HeadersTooLarge",
    "RequestTimeout",
    "MachineError",
    "NoHooks",
    "NoMachines",
    "ProxyHooks",
    "ProxyStats",
    "Relay",
    "RelayConfig",
    "RoutingTable",
    "Slot",
    "metrics_text",
    "reuse_port_socket",
    "serve",
}

# Pure modules: no network, no processes, no event loop.
PURE = ["table.py", "errors.py", "config.py"]
IO = ("asyncio", "socket", "subprocess", "httptools", "uvloop", "nats", "souq.proxy.relay")


def test_public_surface_is_pinned() -> None:
    assert set(souq.proxy.__all__) == PUBLIC
    for name in souq.proxy.__all__:
        assert hasattr(souq.proxy, name)


def test_pure_modules_import_no_io() -> None:
    for name in PURE:
        tree = ast.parse((PROXY / name).read_text())
        imported: set[str] = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                imported.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module:
                imported.add(node.module)
        bad = {m for m in imported if m.startswith(IO)}
        assert not bad, f"{name} imports {sorted(bad)}"


def test_the_data_plane_s_modules_stay_small() -> None:
    for name in ("relay", "downstream", "upstream", "exchange", "table", "admission", "tunnel"):
        assert len((PROXY / f"{name}.py").read_text().splitlines()) <= 440, name
