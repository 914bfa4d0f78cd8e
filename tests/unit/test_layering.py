"""The public surface of each pure package is pinned, and pure modules never import I/O."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src" / "souq"

PURE = [
    "errors.py",
    "clock.py",
    "ids.py",
    "model",
    "placement",
    "agent/machines/lifecycle.py",
    "agent/state/operations.py",
    "agent/machines/restart.py",
    "agent/capacity/admission.py",
    "agent/jobs/rules.py",
    "jobs/core.py",
    "protocol/verbs.py",
    "protocol/dispatch.py",
    "view/digest.py",
    "jobs/core.py",
    "jobs/changes.py",
    "view/regions.py",
    "market",
    "sim",
    "apps",
    "limits.py",
    "secrets/sealed.py",
    "secrets/redact.py",
    "natsconf.py",
    "images/names.py",
    "network/names.py",
    "network/addresses.py",
    "network/__init__.py",
]

# Anything that touches the network, processes, files or a database.
IO_MODULES = {
    "nats",
    "fastapi",
    "starlette",
    "httpx",
    "uvicorn",
    "sqlite3",
    "subprocess",
    "socket",
    "psutil",
    "asyncio",
    "dns",
    "souq.bus.nats",
    "souq.agent.state.store",
    "souq.agent.service",
    "souq.broker",
    "souq.client",
    "souq.drivers",
    "souq.dev",
    "souq.natsserver",
    "souq.testing",
    "souq.fleet",
    "souq.loop_clock",
    "souq.virtual_loop",
    "souq.protocol.client",
}


def _pure_files() -> list[Path]:
    files: list[Path] = []
    for entry in PURE:
        path = SRC / entry
        files.extend(sorted(path.rglob("*.py")) if path.is_dir() else [path])
    return files


def _imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


@pytest.mark.parametrize("path", _pure_files(), ids=lambda p: str(p.relative_to(SRC)))
def test_pure_modules_import_no_io(path: Path) -> None:
    bad = {
        name
        for name in _imports(path)
        if any(name == io or name.startswith(io + ".") for io in IO_MODULES)
    }
    assert not bad, f"{path.relative_to(SRC)} imports I/O modules: {sorted(bad)}"


PUBLIC = {
    "souq.errors": {
        "BidBelowPrice",
        "ClaimRefused",
        "CommandNotRunnable",
        "Conflict",
        "DeployFailed",
        "DeployNoCapacity",
        "ExecUnavailable",
        "Forbidden",
        "IdempotencyConflict",
        "IllegalTransition",
        "ImageInvalid",
        "ImageNotFound",
        "ImageTooLarge",
        "InsufficientCapacity",
        "InvalidInput",
        "JobExists",
        "JobFailed",
        "JobNotFound",
        "LeaseHeld",
        "MachineNotStarted",
        "MalformedRequest",
        "NameTaken",
        "NobodySubscribed",
        "NoReply",
        "NotFound",
        "PayloadTooLarge",
        "QuotaExceeded",
        "QuoteExpired",
        "QuoteUsed",
        "SecretsUnavailable",
        "SecretsUnreadable",
        "SouqError",
        "StorageError",
        "TooManyRequests",
        "TraceInvalid",
        "Unauthorized",
        "Unavailable",
        "UnknownRegion",
        "UnknownVerb",
        "VolumeAttached",
        "WaitTimeout",
        "error_from_body",
    },
    "souq.placement": {
        "DEFAULT_CURVE",
        "DEFAULT_WEIGHTS",
        "NOMAD_MAX_FIT",
        "NOT_SAMPLED",
        "AntiAffinityScorer",
        "BestFitScorer",
        "BinPackScorer",
        "CacheScorer",
        "ConstraintFilter",
        "Curve",
        "DistinctWorkersFilter",
        "GpuFilter",
        "StandbyFilter",
        "DriverFilter",
        "EligibleFilter",
        "Filter",
        "LoadScorer",
        "Pipeline",
        "PipelineCache",
        "PlacementRequest",
        "Ranking",
        "RegionFilter",
        "Rejection",
        "ResourcesFilter",
        "Scorer",
        "Shortfall",
        "SpreadScorer",
        "StateFilter",
        "WantedImage",
        "attribute_of",
        "build_pipeline",
        "default_pipeline",
        "nomad_binpack",
        "short_digest",
        "shortfall",
        "unmet",
        "utilisation_after",
        "weights_of",
    },
    "souq.view": {
        "AppCount",
        "ClusterEvent",
        "ClusterView",
        "EventLog",
        "RegionSummary",
        "ViewStatus",
        "ViewStore",
        "WorkerSource",
        "fits",
        "machines_digest",
        "summarise_regions",
    },
    "souq.bus": {
        "Handler",
        "MemoryTransport",
        "Subscription",
        "Transport",
        "bus_unavailable",
        "decode",
        "encode",
        "error_reply",
        "ok_reply",
        "subject_matches",
        "subjects",
        "unwrap",
        "unwrap_as",
        "unwrap_list_as",
    },
}


@pytest.mark.parametrize("module", sorted(PUBLIC))
def test_public_surface_is_pinned(module: str) -> None:
    mod = importlib.import_module(module)
    assert set(mod.__all__) == PUBLIC[module]
    for name in mod.__all__:
        assert hasattr(mod, name), f"{module}.{name} is exported but missing"


def test_model_exports_resolve() -> None:
    model = importlib.import_module("souq.model")
    assert {"Machine", "MachineConfig", "Offer", "ClaimRequest", "Placement"} <= set(model.__all__)
    for name in model.__all__:
        assert hasattr(model, name)
