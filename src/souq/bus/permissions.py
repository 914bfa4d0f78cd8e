"""Who may publish and subscribe where on the bus: one NATS user per role, and nats-server's
configuration for them. Pure: the auth directory (:mod:`souq.auth.bus`) holds the keys and
writes the file.

* ``broker`` publishes every worker verb, ``souq.all.*``, ``souq.offers.*``, ``souq.discover``
  and to JetStream (it owns the stores, the audit log's ``souq.audit.>`` and the batch jobs'
  ``souq.jobs.>`` included); subscribes
  to heartbeats, events and usage, and to the agents' job run events.
* ``proxy`` publishes the verbs of a wake-up, an autostop and the view's sync (start, stop,
  suspend, wait; get, list, digest, locate), ``souq.all.*`` of the view and ``souq.discover``,
  and reads the revoked tokens' bucket (its admin port's check); subscribes to heartbeats,
  events and usage.
* ``view``: the view's sync verbs only; heartbeats, events and usage; reads the apps' bucket
  (an agent's ``.internal`` names scope each app by its network: souq.network).
* ``names-<W>``: what one worker's ``.internal`` names read (``souq cluster add-agent`` makes it
  beside ``agent-<W>``): the view's sync verbs, heartbeats and events (not usage), the apps'
  bucket. Its own key per worker: a worker holds no credential another shares, and one taken
  over is revoked alone.
* ``agent-<W>`` publishes heartbeats, events, usage and job run events *as W* and reads the
  image, secrets and spot prices buckets; runs batch jobs (:func:`_job_runner`): reads and
  changes the ``souq-jobs`` bucket and watches its keys, pulls names from ``souq-jobs-ready``
  through the ``souq-job-runners`` consumer alone (a broker makes it; no agent may create or
  change it), puts a job back with ``souq.jobs.ready`` and writes runs' output to
  ``souq-job-logs``;
  subscribes to ``souq.worker.W.*``, offers, ``souq.all.*`` and ``souq.discover``.
* ``fleet`` (hollow workers, for scale tests only) speaks as any worker: every worker's verbs,
  offers, broadcasts; heartbeats, events and usage of any worker.

Replies go by ``allow_responses``: a user answers only the requests it received, once each, to
the requester's inbox. Every user's inbox is its own (``_INBOX.<user>.…``, set with nats-py's
``inbox_prefix``) and nobody else may subscribe there: a reply carrying a machine's config
reaches the requester alone.

What nats-server does not check, the receivers do (:func:`sent_by_a_role`). A JetStream push
consumer delivers its stream's messages to whatever deliver subject its creator named, and the
server checks that subject against nobody's permissions; nor does it check a stream's
republish subject. Anyone who may create a consumer on a stream it may write (an agent, on the
jobs bucket) could so make the server publish, in its name, on a worker's command subject or a
broker's heartbeats. Every message a daemon's subscription receives is judged by who could have
sent it: never a JetStream delivery (a ``$JS.ACK.…`` reply, a ``Nats-Stream`` header), and on a
locked-down bus a request only from the inbox of a role whose publish permissions cover its
subject (a destroy from the broker's, a start from the proxy's; not a list from an agent's).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from souq.bus import subjects
from souq.bus.memory import subject_matches

__all__ = [
    "AGENT_PREFIX",
    "NAMES_PREFIX",
    "ROLES",
    "Permissions",
    "TlsFiles",
    "User",
    "agent_user",
    "inbox_prefix",
    "names_user",
    "nats_conf",
    "permissions_of",
    "sent_by_a_role",
    "worker_of_user",
]

P = subjects.PREFIX
ROLES = ("broker", "proxy", "view", "fleet")  # and agent-<worker id>, names-<worker id>
AGENT_PREFIX = "agent-"
NAMES_PREFIX = "names-"  # a worker's names: the view as they read it (souq.network)
FLEET_RESPONSES = 1_000_000  # one fleet connection answers a broadcast for every hollow worker

# JetStream streams behind the buckets (nats-py names them KV_<bucket> and OBJ_<bucket>).
IMAGE_STREAMS = ("KV_souq-images", "OBJ_souq-image-blobs")
SECRETS_STREAM = "KV_souq-secrets"
REVOKED_STREAM = "KV_souq-revoked"
APPS_STREAM = "KV_souq-apps"
SPOT_PRICES_STREAM = "KV_souq-spot-prices"  # souq.market.prices.BUCKET's
# Batch jobs (souq.jobs.store, souq.jobs.output): named here, the bus's layer, not imported.
JOBS_BUCKET = "souq-jobs"
JOBS_READY = "souq-jobs-ready"
JOBS_RUNNERS = "souq-job-runners"
JOBS_LOGS = "souq-job-logs"

# The verbs the proxy sends: wake-ups (start, wait), autostop (stop, suspend), the view's sync.
VIEW_VERBS = ("get", "list", "digest", "locate")
PROXY_VERBS = (*VIEW_VERBS, "start", "stop", "suspend", "wait")
OBSERVED = (f"{P}.hb.>", f"{P}.evt.>", f"{P}.use.>")
NAMES_OBSERVED = OBSERVED[:2]


@dataclass(frozen=True)
class Permissions:
    publish: tuple[str, ...]
    subscribe: tuple[str, ...]
    responses: int = 1  # allow_responses: answers per request received


@dataclass(frozen=True)
class User:
    name: str  # broker, proxy, view, fleet, agent-<worker id>
    nkey: str  # the public user nkey (U...)


@dataclass(frozen=True)
class TlsFiles:
    cert: str
    key: str


def agent_user(worker_id: str) -> str:
    return AGENT_PREFIX + subjects._token(worker_id)


def names_user(worker_id: str) -> str:
    return NAMES_PREFIX + subjects._token(worker_id)


def worker_of_user(name: str) -> str | None:
    """The worker an agent user acts as (None for the other roles)."""
    return name[len(AGENT_PREFIX) :] if name.startswith(AGENT_PREFIX) else None


def inbox_prefix(user: str) -> str:
    """The user's own inbox: replies to its requests come here, and only it may subscribe."""
    return f"_INBOX.{user}"


def _read_streams(streams: Iterable[str]) -> list[str]:
    """The JetStream API a reader of these streams needs: look them up, read messages
    directly, and run its own ordered consumers. Not create (a broker makes them: a stream made
    by an agent would have subjects of its choosing, ``souq.worker.>`` say), delete, purge,
    update, nor write."""
    api = "$JS.API"
    allowed = [f"{api}.INFO", f"{api}.STREAM.NAMES"]
    for s in streams:
        allowed += [
            f"{api}.STREAM.INFO.{s}",
            f"{api}.STREAM.MSG.GET.{s}",
            f"{api}.DIRECT.GET.{s}",
            f"{api}.DIRECT.GET.{s}.>",
            f"{api}.CONSUMER.CREATE.{s}",
            f"{api}.CONSUMER.CREATE.{s}.>",
            f"{api}.CONSUMER.INFO.{s}.*",
            f"{api}.CONSUMER.DELETE.{s}.*",
            f"{api}.CONSUMER.MSG.NEXT.{s}.*",
            f"$JS.FC.{s}.>",  # flow control of its watches (also a response it may send)
        ]
    return allowed


def _job_runner() -> list[str]:
    """What an agent needs to run batch jobs, and no more: the job records (read one, change
    one by compare-and-set, watch one: an ordered consumer of the bucket's stream, with its flow
    control), the agents' one pull consumer on the ready stream (look it up, fetch, ack or nak:
    the broker makes it, so that no agent can give it other settings or a deliver subject), the
    ready subject (a job given back) and the output store (look it up, see whether a run's output
    is there, write it). Not delete, purge or update a stream, nor create one, nor create, change
    or delete any consumer of the ready stream."""
    api = "$JS.API"
    kv, logs, ready, runners = f"KV_{JOBS_BUCKET}", f"OBJ_{JOBS_LOGS}", JOBS_READY, JOBS_RUNNERS
    return [
        f"{api}.STREAM.INFO.{kv}",
        f"{api}.STREAM.MSG.GET.{kv}",
        f"{api}.DIRECT.GET.{kv}",
        f"{api}.DIRECT.GET.{kv}.>",
        f"{api}.CONSUMER.CREATE.{kv}",
        f"{api}.CONSUMER.CREATE.{kv}.>",
        f"{api}.CONSUMER.INFO.{kv}.*",
        f"{api}.CONSUMER.DELETE.{kv}.*",
        f"$JS.FC.{kv}.>",
        f"$KV.{JOBS_BUCKET}.>",
        f"{api}.CONSUMER.INFO.{ready}.{runners}",
        f"{api}.CONSUMER.MSG.NEXT.{ready}.{runners}",
        f"$JS.ACK.{ready}.{runners}.>",
        subjects.JOBS_READY,
        f"{api}.STREAM.INFO.{logs}",
        f"{api}.STREAM.MSG.GET.{logs}",
        f"{api}.DIRECT.GET.{logs}",
        f"{api}.DIRECT.GET.{logs}.>",
        f"$O.{JOBS_LOGS}.>",
    ]


def _verbs(verbs: Iterable[str], *, broadcast: Iterable[str] = ()) -> list[str]:
    return [f"{P}.worker.*.{v}" for v in verbs] + [subjects.all_workers(v) for v in broadcast]


def permissions_of(user: str) -> Permissions:
    """What ``user`` may do on the bus (:class:`ValueError` for a name that is no role)."""
    inbox = inbox_prefix(user) + ".>"
    worker_id = worker_of_user(user)
    if worker_id is not None:
        w = subjects._token(worker_id)
        return Permissions(
            publish=(
                f"{P}.hb.*.{w}",
                f"{P}.evt.*.{w}",
                f"{P}.use.*.{w}",
                f"{P}.jobevt.*.{w}",
                *_read_streams((*IMAGE_STREAMS, SECRETS_STREAM, SPOT_PRICES_STREAM)),
                *_job_runner(),
            ),
            subscribe=(
                subjects.worker_verbs(w),
                f"{P}.offers.*",
                f"{P}.all.*",
                subjects.DISCOVER,
                inbox,
            ),
        )
    if user == "broker":
        return Permissions(
            publish=(
                f"{P}.worker.*.*",
                f"{P}.all.*",
                f"{P}.offers.*",
                subjects.DISCOVER,
                "$JS.API.>",
                "$KV.>",
                "$O.>",
                "$JS.FC.>",  # flow control of its watches (revoked tokens)
                f"{P}.audit.>",  # the audit log's stream (souq.broker.audit)
                f"{P}.jobs.>",  # the batch jobs' ready stream (souq.jobs.store)
            ),
            subscribe=(*OBSERVED, subjects.ALL_JOB_EVENTS, inbox),
        )
    if user == "proxy":
        return Permissions(
            publish=(
                *_verbs(PROXY_VERBS, broadcast=VIEW_VERBS),
                subjects.DISCOVER,
                *_read_streams((REVOKED_STREAM,)),  # its admin port refuses revoked tokens
            ),
            subscribe=(*OBSERVED, inbox),
        )
    if user == "view" or user.startswith(NAMES_PREFIX):
        if user != "view":
            subjects._token(user[len(NAMES_PREFIX) :])  # a worker id, else ValueError
        return Permissions(
            publish=(
                *_verbs(VIEW_VERBS, broadcast=VIEW_VERBS),
                subjects.DISCOVER,
                *_read_streams((APPS_STREAM,)),  # the apps' networks (the worker's names)
            ),
            # The names follow the workers (heartbeats) and machines (events); usage is not theirs.
            subscribe=(*(OBSERVED if user == "view" else NAMES_OBSERVED), inbox),
        )
    if user == "fleet":
        return Permissions(
            publish=OBSERVED,
            subscribe=(
                f"{P}.worker.*.*",
                f"{P}.offers.*",
                f"{P}.all.*",
                subjects.DISCOVER,
                inbox,
            ),
            responses=FLEET_RESPONSES,
        )
    raise ValueError(
        f"{user!r} is not a role on the bus (one of {', '.join(ROLES)}, agent-ID, names-ID)"
    )


def _inbox_owner(reply: str) -> str | None:
    """The user whose inbox ``reply`` is in (``_INBOX.<user>.…``), None for any other subject."""
    head, _, rest = reply.partition(".")
    user = rest.partition(".")[0]
    return user if head == "_INBOX" and user else None


def sent_by_a_role(
    subject: str, reply: str | None, headers: Mapping[str, str] | None, *, locked: bool
) -> bool:
    """Whether a message received on ``subject`` was published by a client that may publish
    there, as far as the message tells (see the module): a JetStream delivery never is; on a
    ``locked`` bus a request (a message with a reply) is when its reply is the inbox of a role
    whose permissions cover ``subject``. A message without a reply is a plain publish, which the
    publisher's permissions already bound."""
    if reply and reply.startswith("$JS."):
        return False  # a push consumer's delivery (its ack subject)
    if headers and "Nats-Stream" in headers:
        return False  # a stream's republish
    if not locked or not reply:
        return True
    user = _inbox_owner(reply)
    if user is None:
        return False
    try:
        allowed = permissions_of(user).publish
    except ValueError:
        return False
    return any(subject_matches(pattern, subject) for pattern in allowed)


def _quoted(items: Iterable[str]) -> str:
    return "[" + ", ".join(f'"{s}"' for s in items) + "]"


def nats_conf(users: Iterable[User], *, tls: TlsFiles | None = None, pid_file: str = "") -> str:
    """nats-server's configuration: every user by nkey with its role's permissions, nobody
    without one; JetStream on; TLS required when ``tls`` names the server's certificate. The
    listen address and port, and the store directory, come from the command line."""
    lines = [
        "# Written by `souq cluster init` / `souq cluster add-agent`: edits are lost when it",
        "# is written again. One user per role; a client without a user's nkey is refused.",
        "jetstream: enabled",
    ]
    if pid_file:
        lines.append(f'pid_file: "{pid_file}"')
    if tls is not None:
        lines += [
            "tls {",
            f'  cert_file: "{tls.cert}"',
            f'  key_file: "{tls.key}"',
            "  timeout: 5",
            "}",
        ]
    lines += ["authorization {", "  users = ["]
    for user in sorted(users, key=lambda u: u.name):
        perms = permissions_of(user.name)
        lines += [
            f"    # {user.name}",
            f'    {{nkey: "{user.nkey}", permissions: {{',
            f"      publish: {{allow: {_quoted(perms.publish)}}}",
            f"      subscribe: {{allow: {_quoted(perms.subscribe)}}}",
            f"      allow_responses: {{max: {perms.responses}}}",
            "    }}",
        ]
    lines += ["  ]", "}", ""]
    return "\n".join(lines)
