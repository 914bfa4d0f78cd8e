"""The routes that move a machine through its states: ``DELETE`` (destroy), ``.../start``,
``.../stop``, ``.../restart`` and ``.../wait``, each in Souq's form and in
Fly's (``?kill=true``, a stop body ``{"id", "signal", "timeout": "5s"}``, a restart's
``force_stop``, ``timeout`` and ``signal`` query, a wait for several states and a
``version``, a start's ``previous_state``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any, TypeVar

from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import Response

from souq.broker.bodies import MACHINE, AppName, LeaseNonce, body_schema, json_response, parse_body
from souq.broker.schemas import ErrorBody, StopRequest, fly_stop_timeout
from souq.broker.service import BrokerService
from souq.errors import InvalidInput
from souq.model import Machine, MachineState, StopCommand, WaitCommand, normalise_signal

__all__ = ["fly_restart", "lifecycle_router"]

T = TypeVar("T")


async def _stop_command(
    app: AppName, machine_id: str, request: Request, nonce: LeaseNonce = None
) -> StopCommand:
    """Stop and restart take the same optional body: the signal, the grace before SIGKILL."""
    body = await parse_body(request, StopRequest, optional=True)
    return StopCommand(app=app, machine_id=machine_id, lease_nonce=nonce, **body.model_dump())


StopCmd = Annotated[StopCommand, Depends(_stop_command)]


def _read_query(field: str, value: str, read: Callable[[str], T]) -> T:
    try:
        return read(value)
    except ValueError as exc:
        raise InvalidInput(f"{field}: {exc}", hint="e.g. ?signal=SIGTERM&timeout=5s") from None


def fly_restart(
    cmd: StopCommand, force_stop: bool, timeout: str | None, signal: str | None
) -> StopCommand:
    """A restart's stop, with Fly's query parameters over its body's."""
    update: dict[str, Any] = {}
    if signal:
        update["signal"] = _read_query("signal", signal, normalise_signal)
    if timeout and (seconds := _read_query("timeout", timeout, fly_stop_timeout)) is not None:
        update["timeout_s"] = seconds
    if force_stop:
        update["signal"] = "SIGKILL"
    return cmd.model_copy(update=update) if update else cmd


def lifecycle_router(service: BrokerService) -> APIRouter:
    router = APIRouter(tags=["machines"])

    @router.delete(MACHINE, response_model=Machine)
    async def destroy_machine(
        app: AppName,
        machine_id: str,
        *,
        nonce: LeaseNonce = None,
        force: Annotated[bool, Query(description="kill it first if it runs")] = False,
        kill: Annotated[bool, Query(description="Fly's name for `force`")] = False,
        graceful: Annotated[
            bool,
            Query(description="stop it first if it runs (its stop config), answer at once"),
        ] = False,
    ) -> Response:
        machine = await service.destroy_machine(
            app, machine_id, force=force or kill, graceful=graceful, nonce=nonce
        )
        return json_response(machine)

    @router.post(MACHINE + "/start", response_model=Machine)
    async def start_machine(app: AppName, machine_id: str, nonce: LeaseNonce = None) -> Response:
        """Start a stopped machine, or resume a suspended one. The answer is the machine, with
        Fly's `previous_state` (what it was) and `status` too."""
        before = await service.get_machine(app, machine_id)
        machine = await service.start_machine(app, machine_id, nonce=nonce)
        return json_response(
            machine, extra={"previous_state": before.state.value, "status": "success"}
        )

    # Stop and restart take the same optional body: the signal and the grace before SIGKILL.
    stop_route: dict[str, Any] = {
        "response_model": Machine,
        "openapi_extra": body_schema(StopRequest, required=False),
    }

    @router.post(MACHINE + "/stop", **stop_route)
    async def stop_machine(cmd: StopCmd) -> Response:
        return json_response(await service.stop_machine(cmd))

    @router.post(MACHINE + "/restart", **stop_route)
    async def restart_machine(
        cmd: StopCmd,
        force_stop: Annotated[
            bool, Query(description="Fly's: kill it (SIGKILL) instead of its stop signal")
        ] = False,
        timeout: Annotated[
            str | None, Query(description="Fly's: the grace before SIGKILL, e.g. 5s")
        ] = None,
        signal: Annotated[str | None, Query(description="Fly's: the stop signal")] = None,
    ) -> Response:
        """Stop the machine (its stop config, or the body's or the query's signal and grace)
        and start it again."""
        return json_response(
            await service.restart_machine(fly_restart(cmd, force_stop, timeout, signal))
        )

    @router.get(
        MACHINE + "/wait",
        response_model=Machine,
        responses={408: {"model": ErrorBody, "description": "not reached in time (`timeout`)"}},
    )
    async def wait_machine(
        app: AppName,
        machine_id: str,
        *,
        state: Annotated[
            list[MachineState],
            Query(description="the state to wait for (several: any of them)"),
        ] = [MachineState.STARTED],  # noqa: B006 (FastAPI's form for a repeated parameter)
        timeout: Annotated[float, Query(ge=0, le=3600, description="seconds")] = 60.0,
        healthy: Annotated[
            bool, Query(description="and every health check of it passing (`checks`)")
        ] = False,
        version: Annotated[
            str | None, Query(description="and at this `instance_id` (the config's version)")
        ] = None,
        from_event_id: Annotated[str | None, Query(description="Fly's; not supported")] = None,
    ) -> Response:
        """The machine once it is in one of the states (`started` when none is given); `408
        timeout` if it is not within `timeout` seconds."""
        if from_event_id:
            raise InvalidInput(
                "from_event_id: not supported by Souq (machine events have no ids)",
                hint="wait for a `version` (the machine's instance_id) instead",
            )
        first, *more = state
        cmd = WaitCommand(
            app=app,
            machine_id=machine_id,
            state=first,
            timeout_s=timeout,
            healthy=healthy,
            states=more,
            instance_id=version,
        )
        machine = await service.wait(cmd)
        return json_response(machine)

    return router
