"""What a spawn runs: a machine's process spec from its record, its image's files and config
laid under the machine's own, and the pulls that spawns of machines of uncached images wait for.

A machine of an image runs in the image's files (its working directory) with the image's
command unless the machine gives one, and with the image's env under the machine's. Its spawn
waits for the image: :meth:`Pulls.start` runs the pull in a task and reports to a callback on
the event loop, where the executor records it and spawns (or fails the machine: a digest that
does not match is never run).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from pathlib import Path

from souq.agent.capacity.ports import port_env
from souq.agent.machines.images import AgentImages, Pulled
from souq.agent.state.records import MachineRow
from souq.drivers.base import Driver, Limits, MachineSpec, chooses_drivers
from souq.drivers.programs import ProgramNotRunnable
from souq.errors import CommandNotRunnable
from souq.model.image import ImageRecord, ImageRun
from souq.model.machine import MachineConfig, MachineInit
from souq.model.placement import Placement
from souq.placement import gpus

__all__ = [
    "Pulls",
    "check_command",
    "default_driver",
    "image_command",
    "image_workdir",
    "machine_spec",
    "pulled_record",
    "volume_env",
]

log = logging.getLogger(__name__)


def machine_spec(
    row: MachineRow,
    worker_id: str,
    image: tuple[Path, ImageRecord] | None = None,
    secrets: Mapping[str, str] | None = None,
    mounts: tuple[tuple[str, str, str], ...] = (),
) -> MachineSpec:
    """The process a machine runs: its config, over its image's (files, command, env), and its app's
    secrets over both (souq.agent.machines.secrets); ``mounts``: its volumes (the directory on the
    host, the path it mounts it at, the volume's name), each also named in its env as
    ``SOUQ_VOLUME_<NAME>`` (where the process finds it: the path in a sandbox, the host's directory
    for a plain process, which has no mount namespace: docs/volumes.md)."""
    config = row.config
    cmd, env, cwd, user = tuple(config.cmd), dict(config.env), None, ""
    if image is not None:
        rootfs, record = image
        run = record.run
        cmd = cmd or image_command(config.init, run)
        env = {**run.env, **config.env}
        cwd = image_workdir(rootfs, run)
        user = getattr(run, "user", "") or ""
    env.update(secrets or {})
    if row.gpu_ids:  # which of the worker's GPUs are its own, and its share of them
        env["SOUQ_GPUS"] = ",".join(str(i) for i in row.gpu_ids)
        env["SOUQ_GPU_MILLI"] = str(gpus.per_gpu(row.resources))
    driver = config.driver or "exec"
    for host_dir, path, name in mounts:
        env[volume_env(name)] = path if driver == "sandbox" else host_dir
    return MachineSpec(
        machine_id=row.id,
        app=row.app,
        region=row.region,
        worker_id=worker_id,
        cmd=cmd,
        env=port_env(env, row.address),
        driver=driver,
        persist_rootfs=config.rootfs.persist == "always",
        image_user=user,
        limits=Limits(memory_mb=config.guest.memory_mb, cpus=config.guest.cpus),
        network=config.sandbox.network,
        cwd=cwd,
        image_root=None if image is None else str(image[0]),
        mounts=tuple((host_dir, path) for host_dir, path, _ in mounts),
    )


def image_workdir(rootfs: Path, run: ImageRun) -> str:
    """Where a machine of an image runs, on the host: the image's working directory in its
    files (their top when it names none)."""
    return str(rootfs / run.workdir.lstrip("/")) if run.workdir else str(rootfs)


def default_driver(driver: Driver) -> tuple[str, str | None]:
    """The driver a machine whose config names none runs under on this worker (``sandbox``
    where it can isolate), and why not isolated when it cannot."""
    if chooses_drivers(driver):
        return driver.default_driver()
    return "exec", "this worker runs no isolating driver"


def check_command(driver: Driver, config: MachineConfig) -> None:
    """:class:`~souq.errors.CommandNotRunnable` when the machine's program (a host program:
    not an image's) could not be run by the user the machine would run as here, so that the
    create fails at once, naming the program, the path and the user, instead of a machine
    that fails to start."""
    command = config.cmd or config.init.command(image=config.image is not None)
    if not chooses_drivers(driver) or config.image is not None or not command:
        return
    try:
        driver.check_program(command[0], config.env, config.driver or "exec")
    except ProgramNotRunnable as exc:
        if exc.path is None:  # missing altogether: the machine fails to start, as it would
            return
        raise CommandNotRunnable(
            str(exc),
            hint="install the program where the machine's user may run it (e.g. /usr/bin), "
            "name it by a path that user can reach, or run the machine of an image that has it",
            details={"program": exc.program, "path": exc.path, "user": exc.user},
        ) from exc


def volume_env(name: str) -> str:
    """The variable that tells a machine where its volume ``name`` is."""
    return "SOUQ_VOLUME_" + "".join(c if c.isalnum() else "_" for c in name.upper())


def image_command(init: MachineInit, run: ImageRun) -> tuple[str, ...]:
    """What a machine of an image runs when its config names no whole command: the image's
    entrypoint and command, either one replaced by the config's ``init`` (as Docker does, a new
    entrypoint drops the image's command). An image recorded before the two were kept apart
    has only the whole."""
    if not (init.entrypoint or init.cmd):
        return tuple(run.cmd)
    entrypoint = init.entrypoint or (run.entrypoint if run.entrypoint or run.args else run.cmd)
    args = init.cmd or ([] if init.entrypoint else run.args)
    return (*entrypoint, *args)


def pulled_record(row: MachineRow, pulled: Pulled) -> tuple[Placement | None, str]:
    """The machine's placement record once its image is pulled (bytes and time), and the
    pull event's message."""
    message = f"image {pulled.record.reference} pulled: {pulled.bytes_pulled} bytes in "
    message += f"{pulled.ms:.0f} ms"
    placement = row.placement
    if placement is not None and placement.image is not None:
        image = placement.image.model_copy(
            update={"bytes_pulled": pulled.bytes_pulled, "pull_ms": round(pulled.ms, 1)}
        )
        placement = placement.model_copy(update={"image": image})
    return placement, message


Outcome = Pulled | Exception


class Pulls:
    """The pulls machines wait for, one task per machine (the cache shares the work)."""

    def __init__(self, images: AgentImages) -> None:
        self.images = images
        self._tasks: dict[str, asyncio.Task[None]] = {}

    def waiting(self, machine_id: str) -> bool:
        return machine_id in self._tasks

    def start(
        self,
        machine_id: str,
        reference: str,
        then: Callable[[Outcome], None],
        *,
        source: str | None = None,
    ) -> None:
        """Pull ``reference`` (from ``source``, a registry, if given) for ``machine_id``
        (unless already under way), then ``then``."""
        if machine_id in self._tasks:
            return

        async def pull() -> None:
            outcome: Outcome
            try:
                outcome = await self.images.pull(reference, source)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # reported as the machine's failure, not lost
                log.warning(
                    "pulling image %s for machine %s failed: %s", reference, machine_id, exc
                )
                outcome = exc
            finally:
                self._tasks.pop(machine_id, None)
            try:
                then(outcome)
            except Exception:
                log.exception("recording the pull of image %s for %s failed", reference, machine_id)

        self._tasks[machine_id] = asyncio.get_running_loop().create_task(pull())

    async def aclose(self) -> None:
        tasks = list(self._tasks.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
