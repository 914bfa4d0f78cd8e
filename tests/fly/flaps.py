"""Requests as Fly's Go client (``flaps`` in ``superfly/fly-go``) builds them, byte for byte.

Each method of :class:`Flaps` is one flaps call: its path (``fmt.Sprintf`` of the machine id
and so on), its query string (built as the call builds it: by hand, with ``url.Values.Encode``
or with go-querystring), its body (Go's ``json.Marshal`` of the call's input type: struct
fields in declaration order, ``omitempty`` as Go applies it, map keys sorted, no spaces) and
its headers (``Authorization: Bearer``, ``User-Agent``, ``Content-Type: application/json``
only with a body, ``fly-machine-lease-nonce`` where the call sends one, ``Accept-Encoding:
gzip`` as Go's transport adds). The builders below (:func:`launch_input` and the rest) are the
input types' fields in Go's order; a value given is put on the wire as Go would put it."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import quote, quote_plus

import httpx

__all__ = [
    "NONCE_HEADER",
    "USER_AGENT",
    "Flaps",
    "GoStruct",
    "create_volume_request",
    "extend_volume_request",
    "go_duration",
    "go_json",
    "launch_input",
    "machine_check",
    "machine_config",
    "machine_guest",
    "machine_init",
    "machine_mount",
    "machine_port",
    "machine_restart",
    "machine_service",
    "stop_config",
    "stop_input",
    "update_volume_request",
]

NONCE_HEADER = "fly-machine-lease-nonce"
USER_AGENT = "fly-go/unknown"  # fly.DefaultUserAgent() when the build carries no version
Query = list[tuple[str, str]]  # a query string's pairs, in order

ALWAYS, OMITEMPTY, POINTER, STRUCT = "always", "omitempty", "pointer", "struct"


class GoStruct(dict[str, Any]):
    """A Go struct's JSON: its keys stay in declaration order (a plain dict is a Go map, whose
    keys Go sorts)."""


def _field(rule: str, value: Any) -> bool:
    """Whether Go's ``json.Marshal`` writes a field of this rule with this value."""
    if rule in (ALWAYS, STRUCT):  # omitempty does nothing on a struct value
        return True
    if rule == POINTER:
        return value is not None
    return value not in (None, False, 0, "", [], {})


def _go_type(*fields: tuple[str, str, Any]) -> Any:
    def build(**values: Any) -> GoStruct:
        unknown = set(values) - {name for name, _, _ in fields}
        if unknown:
            raise TypeError(f"not a field of this type: {sorted(unknown)}")
        out = GoStruct()
        for name, rule, zero in fields:
            value = values.get(name, zero)
            if _field(rule, value):
                out[name] = value
        return out

    return build


OE, P = OMITEMPTY, POINTER
# fly.LaunchMachineInput (create and update; ID and the others tagged "-" are not sent).
launch_input = _go_type(
    ("config", P, None),
    ("region", OE, ""),
    ("name", OE, ""),
    ("skip_launch", OE, False),
    ("skip_service_registration", OE, False),
    ("skip_secrets", ALWAYS, False),
    ("min_secrets_version", P, None),
    ("lease_ttl", OE, 0),
)
# fly.MachineConfig
machine_config = _go_type(
    ("env", OE, None),
    ("init", STRUCT, GoStruct()),
    ("guest", P, None),
    ("metadata", OE, None),
    ("mounts", OE, None),
    ("services", OE, None),
    ("metrics", P, None),
    ("checks", OE, None),
    ("statics", OE, None),
    ("image", OE, ""),
    ("files", OE, None),
    ("schedule", OE, ""),
    ("auto_destroy", OE, False),
    ("restart", P, None),
    ("dns", P, None),
    ("processes", OE, None),
    ("standbys", OE, None),
    ("stop_config", P, None),
    ("containers", OE, None),
    ("volumes", OE, None),
    ("rootfs", P, None),
    ("cache_drive", P, None),
    ("spot", P, None),
    ("size", OE, ""),
    ("disable_machine_autostart", P, None),
)
machine_init = _go_type(
    ("exec", OE, None),
    ("entrypoint", OE, None),
    ("cmd", OE, None),
    ("tty", OE, False),
    ("swap_size_mb", P, None),
    ("kernel_args", OE, None),
)
machine_guest = _go_type(
    ("cpu_kind", OE, ""),
    ("cpus", OE, 0),
    ("memory_mb", OE, 0),
    ("max_memory_mb", OE, 0),
    ("gpus", OE, 0),
    ("gpu_kind", OE, ""),
    ("host_dedication_id", OE, ""),
    ("persist_rootfs", OE, ""),
    ("kernel_args", OE, None),
)
# fly.MachineService: autostop is MachineAutostop, marshalled false (off), true (stop) or
# "suspend"; force_instance_key has no omitempty (null when unset).
machine_service = _go_type(
    ("protocol", OE, ""),
    ("internal_port", OE, 0),
    ("autostop", P, None),
    ("autostart", P, None),
    ("min_machines_running", P, None),
    ("ports", OE, None),
    ("checks", OE, None),
    ("concurrency", P, None),
    ("force_instance_key", ALWAYS, None),
    ("force_instance_description", P, None),
)
machine_port = _go_type(
    ("port", P, None),
    ("start_port", P, None),
    ("end_port", P, None),
    ("handlers", OE, None),
    ("force_https", OE, False),
    ("tls_options", P, None),
    ("http_options", P, None),
    ("proxy_proto_options", P, None),
)
# fly.MachineCheck (durations are *fly.Duration: Go's Duration.String(), e.g. "15s").
machine_check = _go_type(
    ("port", P, None),
    ("type", P, None),
    ("kind", P, None),
    ("interval", P, None),
    ("timeout", P, None),
    ("grace_period", P, None),
    ("method", P, None),
    ("path", P, None),
    ("protocol", P, None),
    ("tls_skip_verify", P, None),
    ("tls_server_name", P, None),
    ("headers", OE, None),
)
# fly.MachineMount
machine_mount = _go_type(
    ("encrypted", OE, False),
    ("path", OE, ""),
    ("size_gb", OE, 0),
    ("volume", OE, ""),
    ("name", OE, ""),
    ("extend_threshold_percent", OE, 0),
    ("add_size_gb", OE, 0),
    ("size_gb_limit", OE, 0),
)
machine_restart = _go_type(("policy", OE, ""), ("max_retries", OE, 0))
stop_config = _go_type(("timeout", P, None), ("signal", P, None))
# fly.StopMachineInput: timeout is a fly.Duration struct, so always sent ("0s" when unset).
stop_input = _go_type(("id", OE, ""), ("signal", OE, ""), ("timeout", STRUCT, "0s"))
exec_request = _go_type(
    ("container", OE, ""),
    ("machine", OE, False),
    ("cmd", OE, ""),
    ("stdin", OE, ""),
    ("timeout", OE, 0),
)
create_app_request = _go_type(
    ("name", ALWAYS, ""),
    ("org_slug", ALWAYS, ""),
    ("network", ALWAYS, ""),
    ("app_role_id", ALWAYS, ""),
)
# fly.CreateVolumeRequest: its pointers carry no omitempty (each sent, null when unset);
# compute is a *MachineGuest (null), compute_image the one omitempty field.
create_volume_request = _go_type(
    ("name", ALWAYS, ""),
    ("region", ALWAYS, ""),
    ("size_gb", ALWAYS, None),
    ("encrypted", ALWAYS, None),
    ("require_unique_zone", ALWAYS, None),
    ("unique_zone_app_wide", ALWAYS, None),
    ("snapshot_retention", ALWAYS, None),
    ("auto_backup_enabled", ALWAYS, None),
    ("fstype", ALWAYS, None),
    ("snapshot_id", ALWAYS, None),
    ("source_volume_id", ALWAYS, None),
    ("compute", ALWAYS, None),
    ("compute_image", OE, ""),
)
# fly.UpdateVolumeRequest, flaps.ExtendVolumeRequest
update_volume_request = _go_type(
    ("snapshot_retention", ALWAYS, None), ("auto_backup_enabled", ALWAYS, None)
)
extend_volume_request = _go_type(("size_gb", ALWAYS, 0))
set_secret_request = _go_type(("value", ALWAYS, ""))
update_secrets_request = _go_type(("values", ALWAYS, None))


def go_json(value: Any) -> str:
    """Go's ``json.Marshal``: no spaces, map keys sorted, ``<``, ``>``, ``&``, U+2028 and
    U+2029 escaped, other characters as UTF-8."""
    if isinstance(value, GoStruct):
        items = ",".join(f"{go_json(k)}:{go_json(v)}" for k, v in value.items())
        return "{" + items + "}"
    if isinstance(value, Mapping):
        items = ",".join(f"{go_json(k)}:{go_json(value[k])}" for k in sorted(value))
        return "{" + items + "}"
    if isinstance(value, Sequence) and not isinstance(value, str):
        return "[" + ",".join(go_json(v) for v in value) + "]"
    if isinstance(value, float):
        raise TypeError("floats are not sent by these calls")
    text = json.dumps(value, ensure_ascii=False)
    for char, escaped in (("<", "\\u003c"), (">", "\\u003e"), ("&", "\\u0026")):
        text = text.replace(char, escaped)
    return text.replace("\u2028", "\\u2028").replace("\u2029", "\\u2029")


def go_duration(ns: int) -> str:
    """Go's ``time.Duration.String()`` of ``ns`` nanoseconds: ``0s``, ``500ms``, ``1m30s``,
    ``1h0m0s``."""
    if ns == 0:
        return "0s"
    sign, u = ("-" if ns < 0 else ""), abs(ns)

    def fraction(whole: int, part: int, digits: int) -> str:
        text = str(whole)
        if part:
            text += "." + str(part).rjust(digits, "0").rstrip("0")
        return text

    if u < 10**9:
        for unit, size, digits in (("ms", 10**6, 6), ("µs", 10**3, 3), ("ns", 1, 0)):
            if u >= size:
                return sign + fraction(u // size, u % size, digits) + unit
    hours, rest = divmod(u, 3600 * 10**9)
    minutes, rest = divmod(rest, 60 * 10**9)
    text = fraction(rest // 10**9, rest % 10**9, 9) + "s"
    if hours or minutes:
        text = f"{minutes}m" + text
    if hours:
        text = f"{hours}h" + text
    return sign + text


def path_escape(segment: str) -> str:
    """Go's ``url.PathEscape``."""
    return quote(segment, safe="$&+:=@")


def values_encode(pairs: Sequence[tuple[str, str]]) -> str:
    """Go's ``url.Values.Encode()``: keys sorted (each key's values in order), escaped with
    ``url.QueryEscape``."""
    ordered = sorted(enumerate(pairs), key=lambda item: (item[1][0], item[0]))
    return "&".join(f"{quote_plus(k, safe='')}={quote_plus(v, safe='')}" for _, (k, v) in ordered)


class Flaps:
    """One flaps ``Client``: ``FLY_FLAPS_BASE_URL`` pointed at a Souq broker, a Souq token."""

    def __init__(self, base_url: str, token: str, *, timeout: float = 90.0) -> None:
        self.base_url = base_url.rstrip("/")
        self.token = token
        self.http = httpx.Client(timeout=timeout)
        for name in ("Accept", "Connection", "User-Agent"):  # httpx's own defaults
            del self.http.headers[name]
        self.http.headers["Accept-Encoding"] = "gzip"  # what Go's transport adds
        self.sent: list[httpx.Request] = []

    def close(self) -> None:
        self.http.close()

    # -- flaps.Client._sendRequest ---------------------------------------------------------

    def send(self, method: str, endpoint: str, body: Any = None, nonce: str = "") -> httpx.Response:
        headers: dict[str, str] = {}
        if nonce:
            headers[NONCE_HEADER] = nonce
        content = None
        if body is not None:
            content = go_json(body).encode()
            headers["Content-Type"] = "application/json"
        headers["Authorization"] = f"Bearer {self.token}"
        headers["User-Agent"] = USER_AGENT
        request = self.http.build_request(
            method, f"{self.base_url}/v1{endpoint}", content=content, headers=headers
        )
        self.sent.append(request)
        return self.http.send(request)

    def machines(
        self, method: str, app: str, endpoint: str, body: Any = None, nonce: str = ""
    ) -> httpx.Response:
        return self.send(method, f"/apps/{app}/machines{endpoint}", body, nonce)

    # -- machines (flaps_machines.go, flaps_machines_wait.go) -------------------------------

    def launch(self, app: str, builder: GoStruct) -> httpx.Response:
        return self.machines("POST", app, "", builder)

    def update(
        self, app: str, machine_id: str, builder: GoStruct, nonce: str = ""
    ) -> httpx.Response:
        return self.machines("POST", app, f"/{machine_id}", builder, nonce)

    def start(self, app: str, machine_id: str, nonce: str = "") -> httpx.Response:
        return self.machines("POST", app, f"/{machine_id}/start", None, nonce)

    def stop(self, app: str, given: GoStruct, nonce: str = "") -> httpx.Response:
        return self.machines("POST", app, f"/{given.get('id', '')}/stop", given, nonce)

    def restart(
        self,
        app: str,
        machine_id: str,
        *,
        force_stop: bool = False,
        timeout_ns: int = 0,
        signal: str = "",
        nonce: str = "",
    ) -> httpx.Response:
        endpoint = f"/{machine_id}/restart?force_stop={str(force_stop).lower()}"
        if timeout_ns:
            endpoint += f"&timeout={go_duration(timeout_ns)}"
        if signal:
            endpoint += f"&signal={signal}"
        return self.machines("POST", app, endpoint, None, nonce)

    def get(self, app: str, machine_id: str) -> httpx.Response:
        return self.machines("GET", app, f"/{machine_id}" if machine_id else "")

    def list(self, app: str, state: str = "") -> httpx.Response:
        return self.machines("GET", app, f"?{state}" if state else "")

    def destroy(self, app: str, machine_id: str, *, kill: bool, nonce: str = "") -> httpx.Response:
        return self.machines("DELETE", app, f"/{machine_id}?kill={str(kill).lower()}", None, nonce)

    def kill(self, app: str, machine_id: str) -> httpx.Response:
        return self.machines("POST", app, f"/{machine_id}/signal", {"signal": 9})

    def find_lease(self, app: str, machine_id: str) -> httpx.Response:
        return self.machines("GET", app, f"/{machine_id}/lease")

    def acquire_lease(self, app: str, machine_id: str, ttl: int | None) -> httpx.Response:
        endpoint = f"/{machine_id}/lease" + (f"?ttl={ttl}" if ttl is not None else "")
        return self.machines("POST", app, endpoint)

    def refresh_lease(
        self, app: str, machine_id: str, ttl: int | None, nonce: str
    ) -> httpx.Response:
        endpoint = f"/{machine_id}/lease" + (f"?ttl={ttl}" if ttl is not None else "")
        return self.machines("POST", app, endpoint, None, nonce)

    def release_lease(self, app: str, machine_id: str, nonce: str) -> httpx.Response:
        return self.machines("DELETE", app, f"/{machine_id}/lease", None, nonce)

    def exec(self, app: str, machine_id: str, given: GoStruct) -> httpx.Response:
        return self.machines("POST", app, f"/{machine_id}/exec", given)

    def get_processes(self, app: str, machine_id: str) -> httpx.Response:
        return self.machines("GET", app, f"/{machine_id}/ps")

    def cordon(self, app: str, machine_id: str, nonce: str = "") -> httpx.Response:
        return self.machines("POST", app, f"/{machine_id}/cordon", None, nonce)

    def uncordon(self, app: str, machine_id: str, nonce: str = "") -> httpx.Response:
        return self.machines("POST", app, f"/{machine_id}/uncordon", None, nonce)

    def set_metadata(self, app: str, machine_id: str, key: str, value: str) -> httpx.Response:
        return self.machines("POST", app, f"/{machine_id}/metadata/{key}", {"value": value})

    def get_metadata(self, app: str, machine_id: str) -> httpx.Response:
        return self.machines("GET", app, f"/{machine_id}/metadata")

    def delete_metadata(self, app: str, machine_id: str, key: str) -> httpx.Response:
        return self.machines("DELETE", app, f"/{machine_id}/metadata/{key}")

    def suspend(self, app: str, machine_id: str, nonce: str = "") -> httpx.Response:
        return self.machines("POST", app, f"/{machine_id}/suspend", None, nonce)

    def wait(
        self,
        app: str,
        machine_id: str,
        *states: str,
        timeout_s: float = 60,
        version: str = "",
        from_event_id: str = "",
    ) -> httpx.Response:
        """``Wait`` with ``WithWaitStates``, ``WithWaitTimeout`` (clamped to 1-60 s, sent in
        whole seconds), ``WithWaitVersion``, ``WithWaitFromEventID``; go-querystring's
        ``url.Values`` (empty ones omitted, ``state`` repeated), then ``Encode()``."""
        seconds = int(max(1.0, min(timeout_s, 60.0)))
        pairs = [("version", version), ("from_event_id", from_event_id)]
        pairs += [("timeout", str(seconds))] + [("state", s) for s in states or ("started",)]
        query = values_encode([(k, v) for k, v in pairs if v])
        return self.machines("GET", app, f"/{machine_id}/wait?{query}")

    # -- apps (flaps_apps.go) ---------------------------------------------------------------

    def create_app(self, name: str, org: str, network: str = "", role: str = "") -> httpx.Response:
        body = create_app_request(name=name, org_slug=org, network=network, app_role_id=role)
        return self.send("POST", "/apps?wait=true", body)

    def create_app_by_app_name(self, name: str, org: str) -> httpx.Response:
        """The older flaps' ``CreateApp``: a Go map (keys sorted) with Fly's Machines API
        reference's ``app_name``, to ``/apps``."""
        return self.send("POST", "/apps", {"app_name": name, "org_slug": org})

    def get_app(self, name: str) -> httpx.Response:
        return self.send("GET", "/apps/" + path_escape(name))

    def list_apps(self, org_slug: str, app_role: str = "") -> httpx.Response:
        pairs = [("org_slug", org_slug)] + ([("app_role", app_role)] if app_role else [])
        return self.send("GET", "/apps?" + values_encode(pairs))

    def delete_app(self, name: str) -> httpx.Response:
        return self.send("DELETE", "/apps/" + name)

    # -- secrets (flaps_secrets.go) ---------------------------------------------------------

    def _secrets(
        self, method: str, app: str, endpoint: str, body: Any, query: Query
    ) -> httpx.Response:
        path = f"/apps/{path_escape(app)}/secrets{endpoint}"
        if query:
            path += "?" + values_encode(query)
        return self.send(method, path, body)

    @staticmethod
    def _secret_query(version: int | None, show_secrets: bool) -> Query:
        query = [("version", str(version))] if version is not None else []
        return query + ([("show_secrets", "true")] if show_secrets else [])

    def list_app_secrets(
        self, app: str, version: int | None = None, show_secrets: bool = False
    ) -> httpx.Response:
        return self._secrets("GET", app, "", None, self._secret_query(version, show_secrets))

    def get_app_secrets(
        self, app: str, name: str, version: int | None = None, show_secrets: bool = False
    ) -> httpx.Response:
        query = self._secret_query(version, show_secrets)
        return self._secrets("GET", app, "/" + path_escape(name), None, query)

    def set_app_secret(self, app: str, name: str, value: str) -> httpx.Response:
        body = set_secret_request(value=value)
        return self._secrets("POST", app, "/" + path_escape(name), body, [])

    def delete_app_secret(self, app: str, name: str) -> httpx.Response:
        return self._secrets("DELETE", app, "/" + path_escape(name), None, [])

    def update_app_secrets(self, app: str, values: Mapping[str, str | None]) -> httpx.Response:
        return self._secrets("POST", app, "", update_secrets_request(values=dict(values)), [])

    # -- volumes (flaps_volumes.go): "/apps/%s/volumes%s", neither name escaped --------------

    def volumes(self, method: str, app: str, endpoint: str, body: Any = None) -> httpx.Response:
        return self.send(method, f"/apps/{app}/volumes{endpoint}", body)

    def get_all_volumes(self, app: str) -> httpx.Response:
        """``GetAllVolumes``, and ``GetVolumes`` (the same call, filtered by the client)."""
        return self.volumes("GET", app, "")

    def create_volume(self, app: str, given: GoStruct) -> httpx.Response:
        return self.volumes("POST", app, "", given)

    def get_volume(self, app: str, volume_id: str) -> httpx.Response:
        return self.volumes("GET", app, f"/{volume_id}")

    def update_volume(self, app: str, volume_id: str, given: GoStruct) -> httpx.Response:
        return self.volumes("PUT", app, f"/{volume_id}", given)

    def delete_volume(self, app: str, volume_id: str) -> httpx.Response:
        return self.volumes("DELETE", app, f"/{volume_id}")

    def extend_volume(self, app: str, volume_id: str, size_gb: int) -> httpx.Response:
        return self.volumes(
            "PUT", app, f"/{volume_id}/extend", extend_volume_request(size_gb=size_gb)
        )

    def get_volume_snapshots(self, app: str, volume_id: str) -> httpx.Response:
        return self.volumes("GET", app, f"/{volume_id}/snapshots")

    def create_volume_snapshot(self, app: str, volume_id: str) -> httpx.Response:
        return self.volumes("POST", app, f"/{volume_id}/snapshots")
