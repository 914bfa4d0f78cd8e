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
    data_plane = ("relay", "downstream", "upstream", "exchange", "table", "admission", "tunnel")
    for name in (*data_plane, "core", "tcp", "sides", "dispatch"):
        assert len((PROXY / f"{name}.py").read_text().splitlines()) <= 440, name


# The package's modules from the top down, as its docstring lists them: each imports (even for
# types alone) only modules below it, so the relay has no import circle and no arrow back up.
LAYERS = [
    "relay",
    "deadlines",
    "downstream",
    "flycast",
    "dispatch",
    "tcp",
    "core",
    "upstream",
    "sides",
    "admission",
    "exchange",
    "hooks",
    "tunnel",
    "table",
    "metrics",
    "errors",
    "config",
]


def _proxy_imports(name: str) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse((PROXY / f"{name}.py").read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            if node.module == "souq.proxy":
                found.update(alias.name for alias in node.names)
            elif node.module.startswith("souq.proxy."):
                found.add(node.module.split(".")[2])
        elif isinstance(node, ast.Import):
            found.update(
                a.name.split(".")[2] for a in node.names if a.name.startswith("souq.proxy.")
            )
    return found


def test_the_data_plane_stands_in_layers() -> None:
    for at, name in enumerate(LAYERS):
        above = set(LAYERS[: at + 1]) & _proxy_imports(name)
        assert not above, f"{name} imports {sorted(above)}, which stand above it (or are it)"


def test_the_package_docstring_lists_the_layers_in_their_order() -> None:
    doc = souq.proxy.__doc__ or ""
    listed = [
        line.split()[0] for line in doc.splitlines() if line.startswith("    ") and line[4] != " "
    ]
    assert listed == LAYERS
