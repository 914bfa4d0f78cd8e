"""The bus between brokers and workers: subjects, codec and transports."""

from souq.bus import subjects
from souq.bus.codec import (
    decode,
    encode,
    error_reply,
    ok_reply,
    unwrap,
    unwrap_as,
    unwrap_list_as,
)
from souq.bus.memory import MemoryTransport, subject_matches
from souq.bus.transport import Handler, Subscription, Transport, bus_unavailable

__all__ = [
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
]
