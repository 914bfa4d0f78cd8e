"""The bus protocol: every message between brokers, proxies and workers as a typed verb.

* :mod:`~souq.protocol.verbs` — the registry: each verb's name, request and reply types, and the
  protocol version that brought it in (pure);
* :mod:`~souq.protocol.dispatch` — the worker's side: a table of handlers, bytes in, reply
  envelope out (pure);
* :mod:`~souq.protocol.client` — the caller's side: :class:`WorkerClient` over a transport.
"""

from souq.protocol.client import WorkerClient
from souq.protocol.dispatch import Dispatcher, VerbHandler
from souq.protocol.verbs import PROTOCOL_MAJOR, PROTOCOL_MINOR, VERBS, Verb

__all__ = [
    "PROTOCOL_MAJOR",
    "PROTOCOL_MINOR",
    "VERBS",
    "Dispatcher",
    "Verb",
    "VerbHandler",
    "WorkerClient",
]
