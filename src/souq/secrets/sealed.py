"""App secrets as they are kept: each value sealed with AES-256-GCM under the cluster's secrets
key (``secrets.key`` of the auth directory), the app and the name bound to it as associated
data, so that a sealed value moved to another key (another app, another name) does not open.

Pure: no I/O. What is kept per secret (:class:`Sealed`) holds the ciphertext, the nonce, a
short digest of the value and when it was set; never the value. The digest is keyed (an HMAC
under a key derived from the secrets key), so that it says whether two values differ without
letting anyone who reads it guess a short value offline.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import re

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from pydantic import BaseModel, ConfigDict

from souq.errors import InvalidInput, SecretsUnreadable
from souq.model.secrets import SecretInfo

__all__ = [
    "MAX_NAME",
    "MAX_SECRETS",
    "MAX_VALUE",
    "Sealed",
    "SecretInfo",
    "SecretsKey",
    "check_name",
    "check_values",
]

MAX_NAME = 128  # characters of a secret's name
MAX_VALUE = 64 * 1024  # bytes of one value
MAX_SECRETS = 256  # secrets of one app
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_NONCE = 12  # bytes, AES-GCM's standard nonce
_DIGEST = 12  # hex characters shown


class Sealed(BaseModel):
    """One secret as the cluster keeps it (JSON in the ``souq-secrets`` bucket)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    v: int = 1
    nonce: str  # base64
    ciphertext: str  # base64: the value's bytes and GCM's tag
    digest: str
    set_at: str

    def info(self, name: str) -> SecretInfo:
        return SecretInfo(name=name, digest=self.digest, set_at=self.set_at)


def check_name(name: str) -> str:
    """``name`` if it is an environment variable's name (``invalid_input`` otherwise)."""
    if not _NAME.fullmatch(name) or len(name) > MAX_NAME:
        raise InvalidInput(
            f"secret name {name[:MAX_NAME]!r} is not valid",
            hint=f"use an environment variable's name: letters, digits and '_', not starting "
            f"with a digit, at most {MAX_NAME} characters",
        )
    if name.startswith("SOUQ_"):
        raise InvalidInput(
            f"secret name {name!r} is reserved", hint="SOUQ_* variables are set by Souq itself"
        )
    return name


def check_values(values: dict[str, str]) -> dict[str, str]:
    """The names checked and the values bounded (``invalid_input`` naming the first problem)."""
    if not values:
        raise InvalidInput("no secrets given", hint='send {"NAME": "VALUE", ...}')
    if len(values) > MAX_SECRETS:
        raise InvalidInput(f"{len(values)} secrets at once: at most {MAX_SECRETS}")
    for name, value in values.items():
        check_name(name)
        try:
            size = len(value.encode())
        except UnicodeEncodeError:
            raise InvalidInput(f"secret {name}: the value is not valid text (UTF-8)") from None
        if size > MAX_VALUE:
            raise InvalidInput(f"secret {name}: the value is over {MAX_VALUE} bytes")
        if "\0" in value:
            raise InvalidInput(f"secret {name}: an environment value cannot hold a NUL byte")
    return values


def _aad(app: str, name: str) -> bytes:
    return b"souq-secret\0" + app.encode() + b"\0" + name.encode()


class SecretsKey:
    """The cluster's secrets key (32 bytes): seals and opens values, digests them."""

    def __init__(self, key: bytes) -> None:
        if len(key) != 32:
            raise SecretsUnreadable(
                "the secrets key is not 32 bytes", hint="secrets.key holds 64 hexadecimal digits"
            )
        self._aead = AESGCM(key)
        self._mac = hashlib.sha256(b"souq-secret-digest\0" + key).digest()

    def digest(self, value: str) -> str:
        return hmac.new(self._mac, value.encode(), hashlib.sha256).hexdigest()[:_DIGEST]

    def seal(self, app: str, name: str, value: str, *, set_at: str) -> Sealed:
        nonce = os.urandom(_NONCE)
        ciphertext = self._aead.encrypt(nonce, value.encode(), _aad(app, name))
        return Sealed(
            nonce=base64.b64encode(nonce).decode(),
            ciphertext=base64.b64encode(ciphertext).decode(),
            digest=self.digest(value),
            set_at=set_at,
        )

    def open(self, app: str, name: str, sealed: Sealed) -> str:
        """The value (:class:`SecretsUnreadable` if this key did not seal it for this app and
        name, or it was changed)."""
        try:
            nonce = base64.b64decode(sealed.nonce, validate=True)
            data = base64.b64decode(sealed.ciphertext, validate=True)
            return self._aead.decrypt(nonce, data, _aad(app, name)).decode()
        except (InvalidTag, ValueError) as exc:
            raise SecretsUnreadable(
                f"secret {name} of app {app} does not open with this secrets key",
                hint="every broker and agent must have the cluster's own secrets.key "
                "(the auth directory of `souq cluster init`); set the secret again if the key "
                "was replaced",
            ) from exc
