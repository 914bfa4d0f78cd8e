"""The broker: the public HTTP API. It places machines through the market (solicit offers →
rank → claim), forwards commands to the worker that owns each machine, and serves the worker
table it learns from heartbeats (:mod:`souq.view.liveness`, which the proxy stands on too).
It holds no state of record.

=================  ===========================================================================
module             holds
=================  ===========================================================================
``config``         :class:`BrokerConfig`
``market``         placement: solicit, rank, claim, explain
``claims``         a claim sent to one worker, patiently; a machine claimed where it was made
``region_choice``  a create's region when it names none, and the next one when that is full
``directory``      which worker owns which machine
``idempotency``    request ids, body hashes, coalescing of identical creates
``key_turns``      an ``Idempotency-Key``'s placements taking turns across brokers (JetStream)
``service``        the use cases (:class:`BrokerService`)
``schemas``        the HTTP request bodies and the error body
``http_errors``    errors → ``{error, status, hint?}`` with their HTTP status
``app``            the FastAPI routes (:func:`create_app`)
``main``           :func:`serve` (embeddable) and :func:`run` (the daemon)
=================  ===========================================================================
"""

from souq.broker.app import create_app
from souq.broker.config import BrokerConfig
from souq.broker.market import Market
from souq.broker.service import BrokerService
from souq.view.liveness import Liveness

__all__ = ["BrokerConfig", "BrokerService", "Liveness", "Market", "create_app"]
