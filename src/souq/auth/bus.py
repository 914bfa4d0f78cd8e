"""The bus's credentials in an auth directory (:mod:`souq.auth.files`): one nkey per role, one
per agent, nats-server's configuration made from them, and the credential a daemon connects
with. The permissions themselves are :mod:`souq.bus.permissions`.

``DIR/nats/ROLE.nk`` (0600) holds a role's seed: ``broker``, ``proxy``, ``view``, ``fleet``, and
for each worker ``agent-<worker id>`` (the agent) and ``names-<worker id>`` (what its
``.internal`` names read of the cluster view). ``DIR/nats.conf`` is derived from them (and from
``DIR/tls/`` when there): it is written again whenever an agent is added, and a nats-server
running from it on this host is told to reload it (its pid is in ``DIR/nats-server.pid``).
"""

from __future__ import annotations

import hashlib
import os
import signal
import ssl
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import nkeys  # type: ignore[import-untyped]
import psutil

from souq.auth.files import AuthDir, write_private
from souq.auth.tls import client_context, make_tls
from souq.bus.permissions import (
    AGENT_PREFIX,
    NAMES_PREFIX,
    ROLES,
    TlsFiles,
    User,
    agent_user,
    inbox_prefix,
    names_user,
    nats_conf,
    worker_of_user,
)
from souq.errors import InvalidInput
from souq.ids import new_worker_id

__all__ = [
    "NatsCredential",
    "add_agent",
    "agent_credential",
    "agent_dir",
    "agent_ids",
    "choose_worker",
    "credential",
    "daemon_credential",
    "holds",
    "init_bus",
    "reload_server",
    "worker_id_for",
    "write_conf",
]

PID_FILE = "nats-server.pid"


@dataclass(frozen=True)
class NatsCredential:
    """What a daemon connects to NATS with: its user's seed, its own inbox, and the CA that
    signed the server's certificate (when the bus runs TLS)."""

    user: str
    seed: str
    ca: Path | None = None

    @property
    def worker_id(self) -> str | None:
        return worker_of_user(self.user)

    def tls(self) -> ssl.SSLContext | None:
        return client_context(self.ca) if self.ca is not None else None

    def options(self) -> dict[str, Any]:
        """nats-py's ``connect`` options (kept for every reconnect)."""
        options: dict[str, Any] = {
            "nkeys_seed_str": self.seed,
            "inbox_prefix": inbox_prefix(self.user),
        }
        if self.ca is not None:
            options["tls"] = self.tls()
        return options


def _new_seed() -> str:
    seed: bytes = nkeys.encode_seed(os.urandom(32), nkeys.PREFIX_BYTE_USER)
    return seed.decode()


def _public(seed: str) -> str:
    public: bytes = nkeys.from_seed(bytearray(seed.strip().encode())).public_key
    return public.decode()


def _seed_path(auth: AuthDir, user: str) -> Path:
    return auth.nats_dir / f"{user}.nk"


def _tls_dir(auth: AuthDir) -> Path:
    return auth.path / "tls"


def _ca(auth: AuthDir) -> Path | None:
    ca = _tls_dir(auth) / "ca.pem"
    return ca if ca.exists() else None


def init_bus(auth: AuthDir, *, tls_hosts: Sequence[str] | None = None) -> None:
    """The roles' seeds, TLS files when ``tls_hosts`` is given (loopback is always named), and
    nats.conf. What exists already stays."""
    for role in ROLES:
        write_private(_seed_path(auth, role), _new_seed() + "\n")
    if tls_hosts is not None:
        make_tls(_tls_dir(auth), tls_hosts)
    write_conf(auth)


def agent_ids(auth: AuthDir) -> list[str]:
    """The workers that have a credential in the directory."""
    if not auth.nats_dir.is_dir():
        return []
    return sorted(
        p.stem[len(AGENT_PREFIX) :]
        for p in auth.nats_dir.glob(f"{AGENT_PREFIX}*.nk")
        if p.stem != AGENT_PREFIX
    )


def add_agent(auth: AuthDir, worker_id: str | None = None, *, reload: bool = True) -> str:
    """A credential for one more agent, and one for what its names read (``agent-<W>`` and
    ``names-<W>``; its worker id: ``worker_id`` or a new one; existing credentials are kept),
    nats.conf written again and, with ``reload``, a nats-server running from it on this host
    reloaded. Returns the worker id."""
    wid = worker_id or new_worker_id()
    try:
        users = (agent_user(wid), names_user(wid))
    except ValueError:
        raise InvalidInput(
            f"{wid!r} cannot be a worker id", hint="use letters, digits, '-' and '_'"
        ) from None
    missing = [user for user in users if not _seed_path(auth, user).exists()]
    if not missing:
        return wid
    for user in missing:
        write_private(_seed_path(auth, user), _new_seed() + "\n")
    write_conf(auth)
    if reload:
        reload_server(auth)
    return wid


def write_conf(auth: AuthDir) -> None:
    """nats.conf from the seeds in DIR/nats and the TLS files in DIR/tls."""
    users = [
        User(p.stem, _public(p.read_text()))
        for p in sorted(auth.nats_dir.glob("*.nk"))
        if p.stem in ROLES or p.stem.startswith((AGENT_PREFIX, NAMES_PREFIX))
    ]
    tls_dir = _tls_dir(auth).resolve()
    tls = (
        TlsFiles(cert=str(tls_dir / "server.pem"), key=str(tls_dir / "server.key"))
        if (tls_dir / "server.pem").exists()
        else None
    )
    text = nats_conf(users, tls=tls, pid_file=str((auth.path / PID_FILE).resolve()))
    tmp = auth.nats_conf.with_name("nats.conf.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(tmp, auth.nats_conf)


def reload_server(auth: AuthDir) -> bool:
    """Tell the nats-servers running from this nats.conf on this host to read it again: the one
    whose pid is in ``DIR/nats-server.pid``, and the nodes of a cluster run here (each with its
    ``DIR/nats-server-<node>.pid``). False when none runs here."""
    told = False
    for pid_file in sorted(auth.path.glob("nats-server*.pid")):
        try:
            pid = int(pid_file.read_text().strip())
            if psutil.Process(pid).name() != "nats-server":
                continue
            os.kill(pid, signal.SIGHUP)
        except (OSError, ValueError, psutil.Error):
            continue
        told = True
    return told


def holds(auth: AuthDir, user: str) -> bool:
    """Whether the auth directory holds ``user``'s NATS credential."""
    return _seed_path(auth, user).is_file()


def credential(auth: AuthDir, user: str) -> NatsCredential:
    """The credential of a role (broker, proxy, view, fleet) or of ``agent-<worker id>``."""
    path = _seed_path(auth, user)
    try:
        seed = path.read_text().strip()
    except FileNotFoundError:
        raise InvalidInput(
            f"{path} is missing: the auth directory holds no NATS credential for {user}",
            hint="run `souq cluster init DIR` (roles) or `souq cluster add-agent DIR` (agents)",
        ) from None
    return NatsCredential(user=user, seed=seed, ca=_ca(auth))


def daemon_credential(auth_dir: Path | None, role: str) -> NatsCredential | None:
    """A daemon's credential: its role's, from ``--auth-dir`` or ``SOUQ_AUTH_DIR`` (none: the
    bus is open, as in a test of one component)."""
    auth = AuthDir.from_env(auth_dir)
    return credential(auth, role) if auth is not None else None


def worker_id_for(data_dir: Path) -> str:
    """The worker id ``souq dev`` and the test cluster give the agent of ``data_dir``: the same
    for the same directory, so a restarted agent finds its credential again."""
    digest = hashlib.sha256(str(data_dir.resolve()).encode()).hexdigest()
    return "w" + digest[:12]


def choose_worker(available: Sequence[str], stored: str | None, asked: str | None) -> str:
    """Which agent credential an agent uses: the one asked for (``--worker-id``), else the one
    of the worker id its data dir already has, else the only one there is. An agent whose
    stored id is not the credential's is refused: it would speak as another worker."""
    hint = "add one with `souq cluster add-agent DIR` and copy DIR/nats/agent-ID.nk to this host"
    chosen = asked or (stored if stored in available else None)
    if chosen is None:
        if not available:
            raise InvalidInput("the auth directory holds no agent credential", hint=hint)
        if len(available) > 1:
            raise InvalidInput(
                f"the auth directory holds {len(available)} agent credentials",
                hint="name the worker with --worker-id ID",
            )
        chosen = available[0]
    if chosen not in available:
        raise InvalidInput(f"the auth directory holds no credential for worker {chosen}", hint=hint)
    if stored is not None and stored != chosen:
        raise InvalidInput(
            f"this data dir belongs to worker {stored}, but the credential is worker {chosen}'s",
            hint="use the credential of agent-" + stored + " (or another data dir)",
        )
    return chosen


def agent_dir(auth: AuthDir, worker_id: str, dest: Path) -> AuthDir:
    """An auth directory (0700) holding what one agent needs and nothing more: its own NATS seed
    (``dest/nats/agent-<worker id>.nk``), the bus's CA when it runs TLS, and the secrets key (it
    opens its machines' secrets). Not the token keys, the admin token, nor any other role's or
    agent's seed: another seed found there (one an earlier Souq gave, the ``view``'s say) is
    removed. Its own seed is written as the cluster has it."""
    user = agent_user(worker_id)
    seed = credential(auth, user).seed
    dest.mkdir(parents=True, exist_ok=True, mode=0o700)
    dest.chmod(0o700)
    own = AuthDir(dest)
    for other in own.nats_dir.glob("*.nk") if own.nats_dir.is_dir() else ():
        if other.stem != user:
            other.unlink()
    write_private(_seed_path(own, user), seed + "\n")
    if auth.secrets_key.exists():
        write_private(own.secrets_key, auth.secrets_key.read_text())
    ca = _ca(auth)
    if ca is not None:
        write_private(_tls_dir(own) / "ca.pem", ca.read_text())
    return own


def agent_credential(auth: AuthDir, *, stored: str | None, asked: str | None) -> NatsCredential:
    return credential(auth, agent_user(choose_worker(agent_ids(auth), stored, asked)))
