"""The machine config the preemption and spot price tests create: a one-cpu ``sleep`` of a
priority class, with a short stop grace and, optionally, a bid."""

from __future__ import annotations

from typing import Any


def config(klass: str, price: float | None = None, **more: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "cmd": ["sleep", "600"],
        "guest": {"cpus": 1, "memory_mb": 64},
        "priority_class": klass,
        "stop_config": {"signal": "SIGTERM", "timeout_s": 2},
        **more,
    }
    if price is not None:
        body["max_price"] = price
    return body
