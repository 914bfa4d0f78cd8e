"""The edge proxy's data plane: a request with ``Host: APP.<domain>`` reaches a machine of APP.

Modules, one concept each, in layers: of these, each imports only ones listed below it, so
there is no import circle (``tests/unit/test_proxy_surface.py`` holds the order)::

    relay       the data plane of one process: a RelayCore with its listeners (SO_REUSEPORT),
                the sweeper, serve()
    deadlines   when a client's request is late (the sweeper asks)
    downstream  a client's connection: HTTP/1.1 keep-alive, pipelining, the fast path
    flycast     machines' connections to an app's private address
    dispatch    the slow path (waiting, connecting), retries, souq-replay
    tcp         a raw TCP service's connection, piped to a machine
    core        what the connections of one relay share: table, admission, pool, metrics, clock
    upstream    a connection to a machine (the answer, streamed back) and the keep-alive pool
    sides       the client's connection as the machine's connection sees it
    admission   the queue at the hard limit, shared wake-ups, drains
    exchange    one request: its state and the head sent to the machine
    hooks       what the relay asks of the control plane (wake, on_request_done)
    tunnel      two sockets piped: upgraded connections and raw TCP services
    table       the routing table: machines per app, their load, the balancing (pure)
    metrics     per-app counters, exposed to Prometheus when scraped
    errors      the proxy's errors and their JSON answers
    config      the relay's settings

The control plane that keeps the table true (``daemon`` and the modules it names) is described
with the rest in docs/proxy.md. The modules a request runs through are compiled with mypyc where
a C compiler is at hand (:mod:`souq.compiled`); importing this package refuses a stale build.
"""

from souq.compiled import refuse_stale

refuse_stale()

# ruff: noqa: E402 - the check above must come before the compiled modules are imported
from souq.proxy.config import RelayConfig
from souq.proxy.errors import (
    AppNotFound,
    BadRequest,
    HeadersTooLarge,
    MachineError,
    NoMachines,
    RequestTimeout,
)
from souq.proxy.hooks import NoHooks, ProxyHooks
from souq.proxy.metrics import CONTENT_TYPE, ProxyStats, metrics_text
from souq.proxy.relay import Relay, reuse_port_socket, serve
from souq.proxy.table import (
    DEFAULT_HARD_LIMIT,
    DEFAULT_SOFT_LIMIT,
    Availability,
    Backend,
    RoutingTable,
    Slot,
)

__all__ = [
    "CONTENT_TYPE",
    "DEFAULT_HARD_LIMIT",
    "DEFAULT_SOFT_LIMIT",
    "AppNotFound",
    "Availability",
    "Backend",
    "BadRequest",
    "HeadersTooLarge",
    "MachineError",
    "NoHooks",
    "NoMachines",
    "ProxyHooks",
    "ProxyStats",
    "Relay",
    "RelayConfig",
    "RequestTimeout",
    "RoutingTable",
    "Slot",
    "metrics_text",
    "reuse_port_socket",
    "serve",
]
