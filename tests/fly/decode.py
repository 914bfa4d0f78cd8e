"""Souq's answers read as Fly's Go client reads them.

Two checks of every answer: the JSON types of each field Fly's Go type has (always; the shapes
below are those types, field by field), and, when a Go toolchain is here, the decode itself:
``fly_decode.go`` puts the body through Go's ``encoding/json`` into Go structs that mirror
Fly's types (``json.NewDecoder(body).Decode(&out)``, as flaps does) and answers what the client
understood, which the tests then read."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import httpx

from tests.fly.flaps import GoStruct

__all__ = ["SHAPES", "GoDecoder", "in_go_order", "type_errors"]

GO_SOURCE = Path(__file__).with_name("fly_decode.go")

# -- the shapes of Fly's types (Go type of each JSON field; unlisted fields are ignored) -----

S, B, F, ANY = "string", "bool", "float64", "any"
INT, INT32, UINT32, UINT64 = "int", "int32", "uint32", "uint64"
TIME, DURATION, AUTOSTOP, PERSIST = "time.Time", "fly.Duration", "MachineAutostop", "persist"
RANGES = {INT: (-(2**63), 2**63 - 1), INT32: (-(2**31), 2**31 - 1)}
RANGES |= {UINT32: (0, 2**32 - 1), UINT64: (0, 2**64 - 1)}


def L(t: Any) -> tuple[str, Any]:  # noqa: N802 (a Go slice)
    return ("list", t)


def M(t: Any) -> tuple[str, Any]:  # noqa: N802 (a Go map of strings to t)
    return ("map", t)


HEADER = {"name": S, "values": L(S)}
EXIT_EVENT = {
    "exit_code": INT,
    "guest_exit_code": INT,
    "guest_signal": INT,
    "oom_killed": B,
    "requested_stop": B,
    "restarting": B,
    "signal": INT,
    "exited_at": TIME,
}
EVENT = {
    "type": S,
    "status": S,
    "request": {
        "exit_event": EXIT_EVENT,
        "MonitorEvent": {"exit_event": EXIT_EVENT},
        "restart_count": INT,
    },
    "source": S,
    "timestamp": INT,
}
CHECK = {
    "port": INT,
    "type": S,
    "kind": S,
    "interval": DURATION,
    "timeout": DURATION,
    "grace_period": DURATION,
    "method": S,
    "path": S,
    "protocol": S,
    "tls_skip_verify": B,
    "tls_server_name": S,
    "headers": L(HEADER),
}
SERVICE_CHECK = {k: v for k, v in CHECK.items() if k != "kind"}
PORT = {
    "port": INT,
    "start_port": INT,
    "end_port": INT,
    "handlers": L(S),
    "force_https": B,
    "tls_options": {"alpn": L(S), "versions": L(S), "default_self_signed": B},
    "http_options": {
        "compress": B,
        "response": {"headers": M(ANY), "pristine": B},
        "h2_backend": B,
        "idle_timeout": UINT32,
        "headers_read_timeout": UINT32,
        "replay_cache": L(
            {"path_prefix": S, "ttl_seconds": INT, "type": S, "name": S, "allow_bypass": B}
        ),
    },
    "proxy_proto_options": {"version": S},
}
SERVICE = {
    "protocol": S,
    "internal_port": INT,
    "autostop": AUTOSTOP,
    "autostart": B,
    "min_machines_running": INT,
    "ports": L(PORT),
    "checks": L(SERVICE_CHECK),
    "concurrency": {"type": S, "hard_limit": INT, "soft_limit": INT},
    "force_instance_key": S,
    "force_instance_description": S,
}
FILE = {"guest_path": S, "raw_value": S, "secret_name": S, "image_config": S, "mode": UINT32}
RESTART = {"policy": S, "max_retries": INT}
STOP = {"timeout": DURATION, "signal": S}
SECRET_REF = {"env_var": S, "name": S}
ENV_FROM = {"env_var": S, "field_ref": S}
PROCESS = {
    "exec": L(S),
    "entrypoint": L(S),
    "cmd": L(S),
    "user": S,
    "env": M(S),
    "secrets": L(SECRET_REF),
    "ignore_app_secrets": B,
    "env_from": L(ENV_FROM),
}
CONTAINER = {
    **{k: v for k, v in PROCESS.items() if k != "ignore_app_secrets"},
    "name": S,
    "image": S,
    "files": L(FILE),
    "restart": RESTART,
    "stop": STOP,
    "depends_on": L({"name": S, "condition": S}),
    "healthchecks": L(
        {
            "name": S,
            "interval": INT,
            "grace_period": INT,
            "success_threshold": INT32,
            "failure_threshold": INT32,
            "timeout": INT,
            "kind": S,
            "unhealthy": S,
            "http": {
                "port": INT32,
                "method": S,
                "path": S,
                "headers": L(HEADER),
                "scheme": S,
                "tls_skip_verify": B,
                "tls_server_name": S,
            },
            "tcp": {"port": INT32},
            "exec": {"command": L(S)},
        }
    ),
    "mounts": L({"name": S, "path": S}),
}
CONFIG = {
    "env": M(S),
    "init": {
        "exec": L(S),
        "entrypoint": L(S),
        "cmd": L(S),
        "tty": B,
        "swap_size_mb": INT,
        "kernel_args": L(S),
    },
    "guest": {
        "cpu_kind": S,
        "cpus": INT,
        "memory_mb": INT,
        "max_memory_mb": INT,
        "gpus": INT,
        "gpu_kind": S,
        "host_dedication_id": S,
        "persist_rootfs": PERSIST,
        "kernel_args": L(S),
    },
    "metadata": M(S),
    "mounts": L(
        {
            "encrypted": B,
            "path": S,
            "size_gb": INT,
            "volume": S,
            "name": S,
            "extend_threshold_percent": INT,
            "add_size_gb": INT,
            "size_gb_limit": INT,
        }
    ),
    "services": L(SERVICE),
    "metrics": {"port": INT, "path": S, "https": B},
    "checks": M(CHECK),
    "statics": L({"guest_path": S, "url_prefix": S, "tigris_bucket": S, "index_document": S}),
    "image": S,
    "files": L(FILE),
    "schedule": S,
    "auto_destroy": B,
    "restart": RESTART,
    "dns": {
        "skip_registration": B,
        "nameservers": L(S),
        "searches": L(S),
        "options": L({"name": S, "value": S}),
        "dns_forward_rules": L({"basename": S, "addr": S}),
        "hostname": S,
        "hostname_fqdn": S,
    },
    "processes": L(PROCESS),
    "standbys": L(S),
    "stop_config": STOP,
    "containers": L(CONTAINER),
    "volumes": L({"name": S, "temp_dir": {"storage_type": S, "size_mb": UINT64}, "image": S}),
    "rootfs": {"persist": PERSIST, "size_gb": UINT64},
    "cache_drive": {"size_mb": UINT64},
    "spot": {"max_price_fraction": F},
    "size": S,
    "disable_machine_autostart": B,
}
MACHINE = {
    "id": S,
    "name": S,
    "state": S,
    "region": S,
    "image_ref": {"registry": S, "repository": S, "tag": S, "digest": S, "labels": M(S)},
    "instance_id": S,
    "version": S,
    "private_ip": S,
    "created_at": S,
    "updated_at": S,
    "config": CONFIG,
    "events": L(EVENT),
    "checks": L({"name": S, "status": S, "output": S, "updated_at": TIME}),
    "nonce": S,
    "host_status": S,
    "cordoned": B,
    "containers": L({"name": S, "state": S}),
    "incomplete_config": CONFIG,
}
APP = {
    "id": S,
    "name": S,
    "internal_numeric_id": INT32,
    "network": S,
    "status": S,
    "machine_count": INT,
    "volume_count": INT,
    "organization": {"name": S, "slug": S, "internal_numeric_id": INT32},
    "cname_target": S,
    "app_role": S,
}
VOLUME = {
    "id": S,
    "name": S,
    "state": S,
    "size_gb": INT,
    "region": S,
    "zone": S,
    "encrypted": B,
    "attached_machine_id": S,
    "attached_alloc_id": S,
    "created_at": TIME,
    "host_dedication_id": S,
    "snapshot_retention": INT,
    "auto_backup_enabled": B,
    "host_status": S,
}
SNAPSHOT = {
    "id": S,
    "size": INT,
    "volume_size": INT,
    "digest": S,
    "created_at": TIME,
    "status": S,
    "retention_days": INT,
}
SECRET = {"name": S, "value": S, "digest": S, "updated_at": S, "created_at": S}
SHAPES: dict[str, Any] = {
    "machine": MACHINE,
    "machines": L(MACHINE),
    "start": {"message": S, "status": S, "previous_state": S},
    "lease": {
        "status": S,
        "data": {"nonce": S, "expires_at": INT, "owner": S, "version": S},
        "message": S,
        "code": S,
    },
    "exec": {"exit_code": INT32, "stdout": S, "stderr": S},
    "ps": L(
        {
            "pid": INT32,
            "stime": UINT64,
            "rtime": UINT64,
            "command": S,
            "directory": S,
            "cpu": UINT64,
            "rss": UINT64,
            "listen_sockets": L({"proto": S, "address": S}),
        }
    ),
    "metadata": M(S),
    "app": APP,
    "apps": {"apps": L(APP)},
    "secrets": {"secrets": L(SECRET)},
    "secret": SECRET,
    "secret_set": {**SECRET, "version": UINT64},
    "secret_delete": {"version": UINT64},
    "secrets_update": {"secrets": L(SECRET), "version": UINT64},
    "volume": VOLUME,
    "volumes": L(VOLUME),
    "volume_extend": {"volume": VOLUME, "needs_restart": B},
    "snapshots": L(SNAPSHOT),
    "flaps_error": {"error": S, "message": S},
    "error_status": {"error": S, "status": S},
}

RFC3339 = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?(Z|[+-]\d\d:\d\d)\Z")
GO_DURATION = re.compile(r"[-+]?(0|((\d+(\.\d*)?|\.\d+)(ns|us|µs|μs|ms|s|m|h))+)\Z")


def _scalar_error(value: Any, go: str) -> str | None:
    is_int = isinstance(value, int) and not isinstance(value, bool)
    if go == ANY:
        return None
    if go == S:
        ok = isinstance(value, str)
    elif go == B:
        ok = isinstance(value, bool)
    elif go in RANGES:
        low, high = RANGES[go]
        ok = is_int and low <= value <= high
    elif go == F:
        ok = is_int or isinstance(value, float)
    elif go == TIME:
        ok = isinstance(value, str) and RFC3339.match(value) is not None
    elif go == DURATION:
        ok = (
            is_int
            or isinstance(value, float)
            or (isinstance(value, str) and GO_DURATION.match(value) is not None)
        )
    elif go == AUTOSTOP:
        ok = isinstance(value, bool) or value in ("off", "stop", "suspend")
    elif go == PERSIST:
        ok = value in ("", "none", "never", "restart", "always") or value in (0, 1, 2, 3)
    else:
        raise ValueError(go)
    return None if ok else f"{json.dumps(value)} is not a Go {go}"


def type_errors(value: Any, shape: Any, path: str = "") -> list[str]:
    """Where ``value`` (parsed JSON) has a JSON type that Go will not put into ``shape``'s
    field (null always goes: it leaves the zero value)."""
    if value is None:
        return []
    if isinstance(shape, dict):
        if not isinstance(value, dict):
            return [f"{path or '.'}: {type(value).__name__} is not an object"]
        return [
            error
            for key, inner in shape.items()
            if key in value
            for error in type_errors(value[key], inner, f"{path}.{key}")
        ]
    if isinstance(shape, tuple):
        kind, inner = shape
        if kind == "list":
            if not isinstance(value, list):
                return [f"{path or '.'}: not an array"]
            return [e for i, v in enumerate(value) for e in type_errors(v, inner, f"{path}[{i}]")]
        if not isinstance(value, dict):
            return [f"{path or '.'}: not an object"]
        return [e for k, v in value.items() for e in type_errors(v, inner, f"{path}.{k}")]
    error = _scalar_error(value, shape)
    return [f"{path or '.'}: {error}"] if error else []


def in_go_order(value: Any, shape: Any) -> Any:
    """``value`` as the client holds it (only the fields of Fly's type), its objects as Go
    structs (fields in declaration order) or maps (keys sorted), ready to be sent back."""
    if value is None:
        return None
    if isinstance(shape, dict):
        return GoStruct((k, in_go_order(value[k], shape[k])) for k in shape if k in value)
    if isinstance(shape, tuple):
        kind, inner = shape
        if kind == "list":
            return [in_go_order(v, inner) for v in value]
        return {k: in_go_order(v, inner) for k, v in value.items()}
    return value


class GoDecoder:
    """``fly_decode.go`` built once (``go build``); None of it when no Go toolchain is here."""

    def __init__(self, build_dir: Path) -> None:
        self.binary: Path | None = None
        self.skip_reason = ""
        go = shutil.which("go")
        if go is None:
            self.skip_reason = "no Go toolchain (`go`): the decode with encoding/json is skipped"
            return
        env = dict(os.environ)
        if not env.get("HOME") and not env.get("GOCACHE"):
            env["GOCACHE"] = str(build_dir / "gocache")
        binary = build_dir / "fly_decode"
        subprocess.run(
            [go, "build", "-o", str(binary), str(GO_SOURCE)],
            check=True,
            env=env,
            capture_output=True,
            timeout=300,
        )
        self.binary = binary

    def run(self, kind: str, body: str) -> str:
        assert self.binary is not None
        line = json.dumps({"kind": kind, "body": body})
        done = subprocess.run(
            [str(self.binary)],
            input=line + "\n",
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        )
        return done.stdout.strip()

    def decode(self, kind: str, response: httpx.Response | str) -> Any:
        """What the client makes of the answer: its JSON types checked against Fly's type for
        ``kind``, then (with Go) decoded by ``encoding/json``; the value the client holds
        (Go's, re-encoded; without Go, the JSON as parsed). Fails the test otherwise."""
        body = response if isinstance(response, str) else response.text
        parsed = json.loads(body)  # an empty or broken body fails here too (Go: EOF)
        errors = type_errors(parsed, SHAPES[kind])
        assert not errors, f"{kind}: {errors}\n{body[:2000]}"
        if self.binary is None:
            return in_go_order(parsed, SHAPES[kind])
        out = self.run(kind, body)
        assert out.startswith("ok "), f"{kind}: Go's decode: {out}\n{body[:2000]}"
        return json.loads(out[3:])
