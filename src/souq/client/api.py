"""The Python client of the Machines API and the ``/sched`` API (synchronous, over httpx).

Every error comes back as the typed :class:`souq.errors.SouqError` the broker reported; a broker
that cannot be reached is :class:`souq.errors.Unavailable`.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

import httpx
from pydantic import BaseModel, TypeAdapter

from souq import model as records
from souq.client.sched_api import SchedCalls
from souq.client.session import DEFAULT_API

if TYPE_CHECKING:  # a record loads when a call first reads one (souq.model is lazy)
    from souq.model import (
        Machine,
        MachineConfig,
        MachineEvent,
        MachineState,
        OpRecord,
        Placement,
        Quote,
        WorkerInfo,
    )
    from souq.model.app import App, AppDeleted
    from souq.model.image import ImageRecord
    from souq.model.machine_tools import ExecReply, ProcessStat
    from souq.model.protocol import Lease
    from souq.model.quota import QuotaView
    from souq.model.release import NewRelease, Release, ReleaseState
    from souq.model.secrets import SecretInfo
    from souq.model.tokens import AuditRecord, TokenInfo
    from souq.model.volume import ExtendVolumeResponse, Volume
    from souq.view.regions import RegionSummary

__all__ = ["DEFAULT_API", "SouqClient"]

LEASE_NONCE = "souq-lease-nonce"  # the header that carries a lease's nonce
WAIT_MARGIN_S = 15.0  # a wait's HTTP timeout: the wait's own timeout plus this
# Restart and destroy may wait for the machine's stop timeout (at most an hour); the broker
# bounds them, so the client only needs to outlast the broker.
LONG_CALL_S = 3600.0 + WAIT_MARGIN_S

M = TypeVar("M", bound=BaseModel)


class SouqClient(SchedCalls):
    """``SouqClient()`` talks to ``$SOUQ_API`` (default ``http://127.0.0.1:4280``) with a bearer
    token: ``token``, else ``$SOUQ_TOKEN``, else the admin token ``souq dev`` wrote in its
    default data directory (:func:`souq.auth.locate.locate_token`; a refusal of that one names
    the file). ``transport`` is for tests.
    Batch jobs' calls (``submit_job``, ``job``, ``claim_job``...) are :class:`SchedCalls`'; the
    connection and its errors, :class:`souq.client.session.ApiSession`'s."""

    # -- cluster ---------------------------------------------------------------------------

    def healthz(self) -> dict[str, Any]:
        result: dict[str, Any] = self._call("GET", "/healthz").json()
        return result

    def workers(self) -> list[WorkerInfo]:
        return _many(records.WorkerInfo, self._call("GET", "/v1/workers"))

    def regions(self, *, cpus: float = 1, memory_mb: int = 256) -> list[RegionSummary]:
        """The cluster's regions (``/v1/regions``): workers, room for machines of the size given,
        and the spot price with its recent history."""
        from souq.view.regions import RegionSummary

        params = {"cpus": f"{cpus:g}", "memory_mb": str(memory_mb)}
        return _many(RegionSummary, self._call("GET", "/v1/regions", params=params))

    def region_names(self) -> list[str]:
        """The cluster's regions: every region a worker announced itself in (``/v1/regions``)."""
        return [str(r["name"]) for r in self._call("GET", "/v1/regions").json()]

    # -- images ----------------------------------------------------------------------------

    def push_image(
        self, layout_tar: bytes, *, name: str | None = None, app: str | None = None
    ) -> ImageRecord:
        """Store an image (its OCI layout as a tar) in the cluster: under ``name`` in ``app``'s
        names (an app token's are its app's; a token of every app's are the cluster's unless
        ``app`` is given)."""
        params = {k: v for k, v in {"name": name, "app": app}.items() if v} or None
        return _one(
            records.ImageRecord,
            self._call(
                "POST",
                "/v1/images",
                content=layout_tar,
                params=params,
                headers={"Content-Type": "application/x-tar"},
                timeout=max(self._http.timeout.read or 0, 300.0),
            ),
        )

    def images(self, *, app: str | None = None) -> list[ImageRecord]:
        params = {"app": app} if app else None
        return _many(records.ImageRecord, self._call("GET", "/v1/images", params=params))

    def image(self, ref: str, *, app: str | None = None) -> ImageRecord:
        params = {"app": app} if app else None
        return _one(records.ImageRecord, self._call("GET", f"/v1/images/{ref}", params=params))

    # -- machines --------------------------------------------------------------------------

    def create_machine(
        self,
        app: str,
        region: str,
        config: Mapping[str, Any] | MachineConfig,
        *,
        name: str | None = None,
        skip_launch: bool = False,
        idempotency_key: str | None = None,
        quote: str | None = None,
        placement: Mapping[str, Any] | None = None,
    ) -> Machine:
        """Place a machine (on exactly ``quote``'s hold when given) and return it.
        ``placement`` chooses how offers are ranked (see docs/placement.md)."""
        body = _create_body(
            region, config, name=name, skip_launch=skip_launch, quote=quote, placement=placement
        )
        headers = {"Idempotency-Key": idempotency_key} if idempotency_key else None
        response = self._call("POST", _machines(app), json=body, headers=headers)
        return _one(records.Machine, response)

    def explain_create(
        self,
        app: str,
        region: str,
        config: Mapping[str, Any] | MachineConfig,
        *,
        quote: str | None = None,
        placement: Mapping[str, Any] | None = None,
    ) -> Placement:
        """A dry run: where a machine would go and why; nothing is claimed."""
        body = _create_body(region, config, quote=quote, placement=placement)
        response = self._call("POST", _machines(app), json=body, params={"dry_run": "true"})
        return records.Placement.model_validate(response.json()["placement"])

    # -- quotes ----------------------------------------------------------------------------

    def create_quote(
        self,
        app: str,
        region: str,
        config: Mapping[str, Any] | MachineConfig,
        *,
        ttl_s: float | None = None,
        placement: Mapping[str, Any] | None = None,
    ) -> Quote:
        """Hold capacity for a machine like ``config`` for ``ttl_s`` seconds (default 10)."""
        body = _create_body(region, config, placement=placement)
        if ttl_s is not None:
            body["ttl_s"] = ttl_s
        return _one(records.Quote, self._call("POST", f"/v1/apps/{app}/quotes", json=body))

    def get_quote(self, app: str, quote_id: str) -> Quote:
        return _one(records.Quote, self._call("GET", f"/v1/apps/{app}/quotes/{quote_id}"))

    def release_quote(self, app: str, quote_id: str) -> Quote:
        return _one(records.Quote, self._call("DELETE", f"/v1/apps/{app}/quotes/{quote_id}"))

    # -- workers ---------------------------------------------------------------------------

    def cordon(self, worker_id: str) -> WorkerInfo:
        """The worker makes no offers from now on; its machines keep running."""
        return _one(records.WorkerInfo, self._call("POST", f"/v1/workers/{worker_id}/cordon"))

    def drain(self, worker_id: str) -> WorkerInfo:
        """Cordon the worker and stop its machines gracefully (state ``draining``)."""
        return _one(records.WorkerInfo, self._call("POST", f"/v1/workers/{worker_id}/drain"))

    def uncordon(self, worker_id: str) -> WorkerInfo:
        return _one(records.WorkerInfo, self._call("POST", f"/v1/workers/{worker_id}/uncordon"))

    def list_machines(self, app: str) -> list[Machine]:
        return _many(records.Machine, self._call("GET", _machines(app)))

    def get_machine(self, app: str, machine_id: str) -> Machine:
        return _one(records.Machine, self._call("GET", _machine(app, machine_id)))

    # ``nonce``: of the machine's lease, when it is leased (``lease_held`` without it).

    def start(self, app: str, machine_id: str, *, nonce: str | None = None) -> Machine:
        """Start a stopped machine, or resume a suspended one."""
        path = _machine(app, machine_id, "start")
        return _one(records.Machine, self._call("POST", path, headers=_leased(nonce)))

    def operate(
        self,
        name: str,
        app: str,
        machine_id: str,
        *,
        body: Mapping[str, Any] | None = None,
        nonce: str | None = None,
        **path: str,
    ) -> Any:
        """The operation ``name`` (:mod:`souq.operations`) on one machine, its answer decoded
        as the operation declares it (None for a ``204``). ``path``: the rest of its path's
        parameters (``key`` of ``/metadata/{key}``)."""
        from souq.operations import operation, resolve

        op = operation(name)
        route = op.route_path.format(app=app, machine_id=machine_id, **path)
        response = self._call(op.method, route, json=body, headers=_leased(nonce))
        if op.status_code == 204:
            return None
        return TypeAdapter(resolve(op.answer or op.reply)).validate_json(response.content)

    def suspend(self, app: str, machine_id: str) -> Machine:
        """Freeze a started machine where it stands (:meth:`start` resumes it)."""
        machine: Machine = self.operate("suspend", app, machine_id)
        return machine

    def stop(
        self,
        app: str,
        machine_id: str,
        *,
        signal: str | None = None,
        timeout_s: float | None = None,
        nonce: str | None = None,
    ) -> Machine:
        """Sends the stop signal; the machine is ``stopping`` (see :meth:`wait`)."""
        body = _without_none({"signal": signal, "timeout_s": timeout_s})
        path = _machine(app, machine_id, "stop")
        return _one(records.Machine, self._call("POST", path, json=body, headers=_leased(nonce)))

    def restart(
        self,
        app: str,
        machine_id: str,
        *,
        signal: str | None = None,
        timeout_s: float | None = None,
    ) -> Machine:
        body = _without_none({"signal": signal, "timeout_s": timeout_s})
        timeout = LONG_CALL_S if timeout_s is None else timeout_s + WAIT_MARGIN_S
        path = _machine(app, machine_id, "restart")
        return _one(records.Machine, self._call("POST", path, json=body, timeout=timeout))

    def update(
        self,
        app: str,
        machine_id: str,
        config: Mapping[str, Any] | MachineConfig,
        *,
        skip_launch: bool = False,
        nonce: str | None = None,
    ) -> Machine:
        """Replace a machine's config; a started machine restarts with it (new ``instance_id``)."""
        body = {"config": _config_body(config), "skip_launch": skip_launch}
        path = _machine(app, machine_id)
        response = self._call("POST", path, json=body, headers=_leased(nonce), timeout=LONG_CALL_S)
        return _one(records.Machine, response)

    # -- releases --------------------------------------------------------------------------

    def create_release(self, app: str, new: NewRelease) -> Release:
        body = new.model_dump(mode="json")
        return _one(records.Release, self._call("POST", f"/v1/apps/{app}/releases", json=body))

    def set_secrets(self, app: str, values: Mapping[str, str]) -> list[SecretInfo]:
        """Set secrets of ``app``: what is kept of each (never a value)."""
        return _many(
            records.SecretInfo, self._call("POST", f"/v1/apps/{app}/secrets", json=dict(values))
        )

    def secrets(self, app: str) -> list[SecretInfo]:
        answer = self._call("GET", f"/v1/apps/{app}/secrets").json()
        return [records.SecretInfo.model_validate(s) for s in answer["secrets"]]

    def unset_secret(self, app: str, name: str) -> None:
        self._call("DELETE", f"/v1/apps/{app}/secrets/{name}")

    # -- volumes (Fly's /v1/apps/{app}/volumes) -------------------------------------------

    def create_volume(self, app: str, body: Mapping[str, Any]) -> Volume:
        return _one(records.Volume, self._call("POST", f"/v1/apps/{app}/volumes", json=dict(body)))

    def quota(self, app: str, *, org: bool = False) -> QuotaView:
        """``app``'s quota (``org``: the organization ``app`` names), its limits and use."""
        from souq.model.quota import QuotaView

        return _one(QuotaView, self._call("GET", _quota_path(app, org)))

    def set_quota(
        self, app: str, limits: Mapping[str, Any], *, org: bool = False, line: str | None = None
    ) -> QuotaView:
        """Replace the limits (a key left out: none on it); ``line`` (``all`` or a class):
        only that line's, the others kept."""
        from souq.model.quota import QuotaView

        path = _quota_path(app, org) + ("" if line is None else f"/{line}")
        return _one(QuotaView, self._call("PUT", path, json=dict(limits)))

    def clear_quota(self, app: str, *, org: bool = False, line: str | None = None) -> None:
        """No quota any more (``line``: no limits on that line, the others kept)."""
        self._call("DELETE", _quota_path(app, org) + ("" if line is None else f"/{line}"))

    def volumes(self, app: str) -> list[Volume]:
        return _many(records.Volume, self._call("GET", f"/v1/apps/{app}/volumes"))

    def volume(self, app: str, volume_id: str) -> Volume:
        return _one(records.Volume, self._call("GET", f"/v1/apps/{app}/volumes/{volume_id}"))

    def extend_volume(self, app: str, volume_id: str, size_gb: int) -> ExtendVolumeResponse:
        path = f"/v1/apps/{app}/volumes/{volume_id}/extend"
        return _one(
            records.ExtendVolumeResponse, self._call("PUT", path, json={"size_gb": size_gb})
        )

    def destroy_volume(self, app: str, volume_id: str) -> Volume:
        return _one(records.Volume, self._call("DELETE", f"/v1/apps/{app}/volumes/{volume_id}"))

    def releases(self, app: str) -> list[Release]:
        return _many(records.Release, self._call("GET", f"/v1/apps/{app}/releases"))

    def release(self, app: str, version: int) -> Release:
        return _one(records.Release, self._call("GET", f"/v1/apps/{app}/releases/{version}"))

    def update_release(
        self, app: str, version: int, state: ReleaseState, reason: str = ""
    ) -> Release:
        body = {"state": str(state), "reason": reason}
        return _one(
            records.Release, self._call("POST", f"/v1/apps/{app}/releases/{version}", json=body)
        )

    # -- apps ------------------------------------------------------------------------------

    def create_app(
        self, name: str, *, org_slug: str = "", network: str = "", app_role: str = ""
    ) -> App:
        """Create an app (``name_taken`` when the name is in use)."""
        body = {"name": name, "org_slug": org_slug, "network": network, "app_role_id": app_role}
        return _one(records.App, self._call("POST", "/v1/apps", json=body))

    def get_app(self, name: str) -> App:
        """The app, created or implicit (``not_found`` only when the name is free)."""
        return _one(records.App, self._call("GET", f"/v1/apps/{name}"))

    def list_apps(self, *, org_slug: str = "", app_role: str = "") -> list[App]:
        params = _without_none({"org_slug": org_slug or None, "app_role": app_role or None})
        return _one(records.AppList, self._call("GET", "/v1/apps", params=params)).apps

    def destroy_app(self, name: str) -> AppDeleted:
        """Destroy the app and every machine of it."""
        return _one(
            records.AppDeleted, self._call("DELETE", f"/v1/apps/{name}", timeout=LONG_CALL_S)
        )

    # -- tokens and the audit log -----------------------------------------------------------

    def create_token(
        self, *, app: str = "*", scope: str = "read", ttl_s: float | None = None, name: str = ""
    ) -> TokenInfo:
        new = records.NewToken.model_validate(
            {"app": app, "scope": scope, "ttl_s": ttl_s, "name": name}
        )
        body = new.model_dump(mode="json")
        return _one(records.TokenInfo, self._call("POST", "/v1/tokens", json=body))

    def token_self(self) -> TokenInfo:
        return _one(records.TokenInfo, self._call("GET", "/v1/tokens/self"))

    def token_key(self) -> str:
        return _one(records.TokenKey, self._call("GET", "/v1/tokens/key")).public_key

    def revoke_token(self, token_id: str) -> None:
        self._call("DELETE", f"/v1/tokens/{token_id}")

    def revoked_tokens(self) -> dict[str, Any]:
        return dict(self._call("GET", "/v1/tokens/revoked").json())

    def audit(self, *, app: str | None = None, limit: int = 100) -> list[AuditRecord]:
        params = {"limit": str(limit)} | ({"app": app} if app else {})
        return _many(records.AuditRecord, self._call("GET", "/v1/audit", params=params))

    # -- leases ----------------------------------------------------------------------------

    def take_lease(
        self,
        app: str,
        machine_id: str,
        *,
        ttl_s: float = 30.0,
        description: str = "",
        nonce: str | None = None,
    ) -> Lease:
        """Lease a machine (or, with the lease's ``nonce``, extend it)."""
        body = {"ttl": ttl_s, "description": description}
        path = _machine(app, machine_id, "lease")
        return _one(records.Lease, self._call("POST", path, json=body, headers=_leased(nonce)))

    def lease(self, app: str, machine_id: str) -> Lease:
        return _one(records.Lease, self._call("GET", _machine(app, machine_id, "lease")))

    def release_lease(self, app: str, machine_id: str, nonce: str) -> Lease:
        path = _machine(app, machine_id, "lease")
        return _one(records.Lease, self._call("DELETE", path, headers=_leased(nonce)))

    def exec(
        self, app: str, machine_id: str, argv: list[str], *, stdin: str | None, timeout_s: int
    ) -> ExecReply:
        """Run ``argv`` in the started machine's context; its exit code and output."""
        body = _without_none({"command": argv, "stdin": stdin, "timeout": timeout_s})
        path = _machine(app, machine_id, "exec")
        return _one(
            records.ExecReply, self._call("POST", path, json=body, timeout=timeout_s + 30.0)
        )

    def processes(self, app: str, machine_id: str) -> list[ProcessStat]:
        rows: list[ProcessStat] = self.operate("ps", app, machine_id)
        return rows

    def metadata(self, app: str, machine_id: str) -> dict[str, str]:
        got: dict[str, str] = self._call("GET", _machine(app, machine_id, "metadata")).json()
        return got

    def set_metadata(self, app: str, machine_id: str, key: str, value: str | None) -> None:
        """Set ``key`` (``value`` None: delete it)."""
        path = _machine(app, machine_id, f"metadata/{key}")
        if value is None:
            self._call("DELETE", path)
        else:
            self._call("POST", path, json={"value": value})

    def cordon_machine(self, app: str, machine_id: str, *, cordoned: bool = True) -> Machine:
        machine: Machine = self.operate("cordon" if cordoned else "uncordon", app, machine_id)
        return machine

    def signal(self, app: str, machine_id: str, signal: str) -> Machine:
        machine: Machine = self.operate("signal", app, machine_id, body={"signal": signal})
        return machine

    def destroy(
        self,
        app: str,
        machine_id: str,
        *,
        force: bool = False,
        graceful: bool = False,
        nonce: str | None = None,
    ) -> Machine:
        """Destroy a machine: a running one needs ``force`` (killed) or ``graceful`` (stopped
        with its stop config; the answer comes once it has left rotation)."""
        params = {"force": "true"} if force else {"graceful": "true"} if graceful else None
        path = _machine(app, machine_id)
        response = self._call(
            "DELETE", path, params=params, headers=_leased(nonce), timeout=LONG_CALL_S
        )
        return _one(records.Machine, response)

    def wait(
        self,
        app: str,
        machine_id: str,
        state: MachineState | str | Sequence[MachineState],
        *,
        timeout: float = 60.0,
        healthy: bool = False,
    ) -> Machine:
        """The machine once it is in ``state`` (several: any of them; and, with ``healthy``,
        its checks pass); :class:`souq.errors.WaitTimeout` after ``timeout`` seconds."""
        states = [str(state)] if isinstance(state, str) else [str(s) for s in state]
        params: dict[str, Any] = {"state": states, "timeout": f"{timeout:g}"}
        if healthy:
            params["healthy"] = "true"
        path = _machine(app, machine_id, "wait")
        response = self._call("GET", path, params=params, timeout=timeout + WAIT_MARGIN_S)
        return _one(records.Machine, response)

    def logs(self, app: str, machine_id: str) -> str:
        return self._call("GET", _machine(app, machine_id, "logs")).text

    def follow_logs(self, app: str, machine_id: str) -> Iterator[str]:
        """The output so far, then new output as it comes, until it ends: the machine
        destroyed, or stopped or failed with no restart coming."""
        with self._stream(_machine(app, machine_id, "logs"), {"follow": "true"}) as response:
            yield from response.iter_text()

    def ops(self, app: str, machine_id: str) -> list[OpRecord]:
        """The machine's op log, oldest first."""
        rows: list[OpRecord] = self.operate("ops", app, machine_id)
        return rows

    def events(self, app: str, machine_id: str) -> list[MachineEvent]:
        rows: list[MachineEvent] = self.operate("events", app, machine_id)
        return rows

    # -- the cluster's event stream ---------------------------------------------------------

    def cluster_events(
        self,
        *,
        app: str | None = None,
        worker: str | None = None,
        follow: bool = False,
        since: int | None = None,
    ) -> Iterator[dict[str, Any]]:
        """``GET /v1/events``: machine, worker and job events (plain dicts: ``seq``, ``kind``,
        ``timestamp``, ``worker_id``, ``region``, ``state``, for machines ``machine_id``,
        ``app`` and ``event``, for jobs ``job``), oldest first; with ``follow`` until the
        caller stops. A dict of ``kind`` ``gap`` (``after``, ``resume_from``, ``message``)
        says events were missed."""
        params = {"follow": "true" if follow else "false"}
        params |= {k: str(v) for k, v in (("app", app), ("worker", worker)) if v is not None}
        if since is not None:
            params["since"] = str(since)
        with self._stream("/v1/events", params) as response:
            for text in response.iter_lines():
                if text.startswith("data: "):
                    event: dict[str, Any] = json.loads(text[6:])
                    yield event


def _machines(app: str) -> str:
    return f"/v1/apps/{app}/machines"


def _machine(app: str, machine_id: str, verb: str | None = None) -> str:
    path = f"/v1/apps/{app}/machines/{machine_id}"
    return f"{path}/{verb}" if verb else path


def _leased(nonce: str | None) -> dict[str, str] | None:
    return {LEASE_NONCE: nonce} if nonce else None


def _without_none(values: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in values.items() if v is not None}


def _quota_path(name: str, org: bool) -> str:
    return f"/v1/orgs/{name}/quota" if org else f"/v1/apps/{name}/quota"


def _one(model: type[M], response: httpx.Response) -> M:
    return model.model_validate_json(response.content)


def _many(model: type[M], response: httpx.Response) -> list[M]:
    adapter: TypeAdapter[list[M]] = TypeAdapter(list[model])  # type: ignore[valid-type]
    return adapter.validate_json(response.content)


def _config_body(config: Mapping[str, Any] | MachineConfig) -> dict[str, Any]:
    """A machine config as a request carries it: the record's JSON, or the mapping given."""
    if isinstance(config, records.MachineConfig):
        return config.model_dump(mode="json")
    return dict(config)


def _create_body(
    region: str,
    config: Mapping[str, Any] | MachineConfig,
    *,
    name: str | None = None,
    skip_launch: bool = False,
    quote: str | None = None,
    placement: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    body: dict[str, Any] = {"region": region, "config": _config_body(config)}
    if name is not None:
        body["name"] = name
    if skip_launch:
        body["skip_launch"] = True
    if quote is not None:
        body["quote"] = quote
    if placement is not None:
        body["placement"] = dict(placement)
    return body
