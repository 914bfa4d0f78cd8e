"""Fields of Fly's Machines API that Souq does not honour, each with why.

Fly's client sends some of them on every request, empty (``"force_instance_key": null``,
``"init": {}``): an empty one is dropped. A set one is an error that names the field and says
why, never silence and never a bare "unknown field"."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from pydantic import model_validator

from souq.model.base import Input, from_peer

__all__ = [
    "CONFIG_UNSUPPORTED",
    "CREATE_UNSUPPORTED",
    "GUEST_UNSUPPORTED",
    "INIT_UNSUPPORTED",
    "PORT_UNSUPPORTED",
    "ROOTFS_UNSUPPORTED",
    "SERVICE_UNSUPPORTED",
    "FlyInput",
    "drop_unset",
]

# The reasons more than one field is refused for.
_NO_TLS = "Souq's edge proxy serves plain HTTP and TCP; terminate TLS in front of it"
_NO_VM = "machines are processes on the worker's kernel, not VMs"
_NO_ROOTFS_SIZE = "a machine's writable layer is bounded by its worker's disk, not by a size"
_NO_PINNING = "requests cannot be pinned to one machine"
_NO_PORT_RANGE = "port ranges are not supported; give one port"

CONFIG_UNSUPPORTED: Mapping[str, str] = {
    "statics": "the edge proxy serves no static files; serve them from the app",
    "files": "files written into the machine at start are not supported; use env or an image",
    "dns": "per-machine DNS settings are not supported",
    "processes": "extra processes in one machine are not supported; run one machine each",
    "containers": "several containers in one machine are not supported; run one machine each",
    "volumes": "give the machine's volume in `mounts`",
    "cache_drive": "cache drives are not supported",
    "metrics": "scraping a machine's metrics is not supported; expose them on a service",
    "size": "named sizes are not supported; give guest.cpus and guest.memory_mb",
    "disable_machine_autostart": "give each service's autostart instead",
}
GUEST_UNSUPPORTED: Mapping[str, str] = {
    "max_memory_mb": "memory is a hard limit of guest.memory_mb; there is no burst above it",
    "host_dedication_id": "dedicated hosts are not supported; use constraints on labels",
    "persist_rootfs": "give `rootfs.persist` (`never` or `always`)",
    "kernel_args": _NO_VM,
}
ROOTFS_UNSUPPORTED: Mapping[str, str] = {
    "size_gb": _NO_ROOTFS_SIZE,
    "fs_size_gb": _NO_ROOTFS_SIZE,
}
INIT_UNSUPPORTED: Mapping[str, str] = {
    "tty": "machines have no terminal",
    "swap_size_mb": "machines get no swap of their own",
    "kernel_args": _NO_VM,
}
SERVICE_UNSUPPORTED: Mapping[str, str] = {
    "force_instance_key": _NO_PINNING,
    "force_instance_description": _NO_PINNING,
}
PORT_UNSUPPORTED: Mapping[str, str] = {
    "start_port": _NO_PORT_RANGE,
    "end_port": _NO_PORT_RANGE,
    "force_https": _NO_TLS,
    "tls_options": _NO_TLS,
    "http_options": "per-port HTTP options are not supported",
    "proxy_proto_options": "the PROXY protocol is not supported",
}
CREATE_UNSUPPORTED: Mapping[str, str] = {
    "skip_service_registration": "every machine with services is routed by the edge proxy",
    "lsvd": "log-structured volumes are not supported",
}


def _unset(value: Any) -> bool:
    return value is None or value is False or value == 0 or value in ("", [], {})


def drop_unset(data: Any, fields: Mapping[str, str], where: str = "") -> Any:
    """``data`` (a request's JSON object) without the unsupported ``fields`` that are unset;
    :class:`ValueError` naming the first one that is set, and why it is refused. In a peer's
    message (:func:`souq.model.base.from_peer`) they are all dropped, as unknown keys are."""
    if not isinstance(data, dict) or not any(k in data for k in fields):
        return data
    for key, why in fields.items():
        if from_peer():
            break
        if key in data and not _unset(data[key]):
            raise ValueError(f"{where}{key}: not supported by Souq ({why})")
    return {k: v for k, v in data.items() if k not in fields}


class FlyInput(Input):
    """An input in Fly's shape whose :attr:`unsupported` fields (name: why) are dropped when
    unset and refused when set (:func:`drop_unset`)."""

    unsupported: ClassVar[Mapping[str, str]] = {}

    @model_validator(mode="before")
    @classmethod
    def _fly_fields(cls, data: Any) -> Any:
        return drop_unset(data, cls.unsupported)
