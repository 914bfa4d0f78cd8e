"""The files a cluster's credentials live in: an *auth directory*.

``souq cluster init DIR`` (and ``souq dev``, in its data directory) writes one; the daemons read
theirs with ``--auth-dir DIR`` (or ``SOUQ_AUTH_DIR``). Every secret file is mode 0600 in a
directory of mode 0700::

    DIR/token.key      the private token key (ed25519): mints tokens; brokers only
    DIR/token.pub      the public token key: checks tokens; brokers and proxies
    DIR/admin.token    a token with admin on every app and the cluster
    DIR/secrets.key    the key app secrets are encrypted with at rest (AES-256-GCM)
    DIR/nats.conf      nats-server's configuration: one user per role, each with its nkey
    DIR/nats/ROLE.nk   each role's nkey seed (broker, proxy, view, fleet, agent-WORKER)
    DIR/tls/           with --tls: the bus's CA and server certificate (souq.auth.tls)
    DIR/nats-NODE.conf one node of a NATS cluster on real hosts (``souq cluster nats-node``)
    DIR/nats/route.secret  the password NATS nodes expect on routes and gateways

A file that exists is never rewritten: running ``init`` again on the same directory keeps the
cluster's keys (and adds what is missing).
"""

from __future__ import annotations

import contextlib
import os
import secrets
from dataclasses import dataclass
from pathlib import Path

from souq.auth.tokens import (
    Scope,
    Verifier,
    generate_key,
    mint,
    private_key_from_text,
    private_key_text,
    public_key_from_text,
    public_key_text,
)
from souq.errors import InvalidInput

__all__ = ["AUTH_DIR_ENV", "AuthDir", "write_private"]

AUTH_DIR_ENV = "SOUQ_AUTH_DIR"


def write_private(path: Path, text: str) -> None:
    """Write a secret file (0600) atomically, unless it exists."""
    if path.exists():
        return
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(tmp, path)


class _Entry:
    """A file of the auth directory, by its name there: ``auth.token_key`` is
    ``auth.path / "token.key"``."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __get__(self, auth: AuthDir, owner: type[AuthDir] | None = None) -> Path:
        return auth.path / self.name


@dataclass(frozen=True)
class AuthDir:
    path: Path

    # What the directory holds (the module's docstring says what each is).
    token_key = _Entry("token.key")
    token_pub = _Entry("token.pub")
    admin_token = _Entry("admin.token")
    secrets_key = _Entry("secrets.key")
    nats_conf = _Entry("nats.conf")
    nats_dir = _Entry("nats")

    @classmethod
    def create(cls, path: Path, *, private: bool = True) -> AuthDir:
        """The token keys, an admin token and the secrets key (what is there already stays).
        ``private``: the directory itself 0700 too (``souq dev`` keeps it 0755: it is the data
        directory its machines' own directories are in; every secret file is 0600 anyway)."""
        path.mkdir(parents=True, exist_ok=True, mode=0o700 if private else 0o755)
        if private:
            with contextlib.suppress(OSError):
                path.chmod(0o700)
        auth = cls(path)
        if not auth.token_key.exists():
            write_private(auth.token_key, private_key_text(generate_key()) + "\n")
        key = private_key_from_text(auth.token_key.read_text())
        if not auth.token_pub.exists():
            auth.token_pub.write_text(public_key_text(key) + "\n")
        if not auth.admin_token.exists():
            token, _ = mint(key, scope=Scope.ADMIN, name="admin")
            write_private(auth.admin_token, token + "\n")
        write_private(auth.secrets_key, secrets.token_hex(32) + "\n")
        return auth

    @classmethod
    def from_env(cls, given: Path | None) -> AuthDir | None:
        """``--auth-dir`` if given, else ``SOUQ_AUTH_DIR``; None when neither is (auth off)."""
        raw = given or (Path(os.environ[AUTH_DIR_ENV]) if os.environ.get(AUTH_DIR_ENV) else None)
        if raw is None:
            return None
        if not raw.is_dir():
            raise InvalidInput(
                f"auth directory {raw} does not exist",
                hint="make one with `souq cluster init DIR`",
            )
        return cls(raw)

    def verifier(self) -> Verifier:
        return Verifier(public_key_from_text(self._read(self.token_pub)))

    def signing_key(self) -> object:
        return private_key_from_text(self._read(self.token_key))

    def admin(self) -> str:
        return self._read(self.admin_token).strip()

    def secrets_cipher_key(self) -> bytes:
        return bytes.fromhex(self._read(self.secrets_key).strip())

    def _read(self, path: Path) -> str:
        try:
            return path.read_text()
        except FileNotFoundError:
            raise InvalidInput(
                f"{path} is missing from the auth directory",
                hint="run `souq cluster init` on that directory again (it keeps what is there)",
            ) from None
