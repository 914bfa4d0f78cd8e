"""App secrets where the cluster keeps state: JetStream's key-value bucket ``souq-secrets``, one
key per secret, ``<app>.<NAME>``, each value a :class:`~souq.secrets.sealed.Sealed` record (the
value encrypted; never in clear). Brokers set, list and unset them (:class:`SecretStore`);
agents read them when a machine starts (:mod:`souq.agent.machines.secrets`).
"""

from __future__ import annotations

from collections.abc import Callable

import nats.errors
import nats.js.errors
from nats.aio.client import Client
from nats.js.kv import KeyValue
from pydantic import ValidationError

from souq.auth.files import AuthDir
from souq.bus.jetstream import key_value, live_keys, unavailable
from souq.clock import Clock, SystemClock, iso_from_ms
from souq.errors import InvalidInput, NotFound, SecretsUnavailable
from souq.model.secrets import SecretInfo
from souq.secrets.sealed import MAX_SECRETS, Sealed, SecretsKey, check_name

__all__ = ["BUCKET", "SecretStore", "decode", "key_of", "open_bucket", "secrets_key", "split_key"]

BUCKET = "souq-secrets"
_ERRORS = (nats.errors.Error, nats.js.errors.Error)


def secrets_key(auth: AuthDir | None) -> SecretsKey:
    """The cluster's secrets key from the daemon's auth directory; :class:`SecretsUnavailable`
    naming what is missing."""
    if auth is None:
        raise SecretsUnavailable(
            "app secrets need the cluster's secrets key, and this daemon has no auth directory",
            hint="start the broker and the agents with --auth-dir DIR (or SOUQ_AUTH_DIR), the "
            "directory `souq cluster init DIR` made",
        )
    try:
        return SecretsKey(auth.secrets_cipher_key())
    except InvalidInput as exc:
        raise SecretsUnavailable(exc.message, hint=exc.hint) from None
    except ValueError:
        raise SecretsUnavailable(
            f"{auth.secrets_key} does not hold a key", hint="it holds 64 hexadecimal digits"
        ) from None


async def open_bucket(nc: Client, *, make: bool = True) -> KeyValue:
    """The secrets bucket, made on first use (without ``make``: the one a broker made, as an
    agent does; :class:`souq.errors.NotFound` while none has been made)."""
    try:
        return await key_value(
            nc.jetstream(), BUCKET, "souq app secrets: sealed, one per app and name", make=make
        )
    except nats.js.errors.BucketNotFoundError as exc:
        raise NotFound(
            "no secrets store yet: no app has secrets",
            hint="a broker makes it when it starts",
        ) from exc
    except _ERRORS as exc:
        raise unavailable("the secrets store", exc) from exc


def key_of(app: str, name: str) -> str:
    return f"{app}.{name}"


def split_key(key: str) -> tuple[str, str] | None:
    app, sep, name = key.partition(".")
    return (app, name) if sep and app and name else None


def decode(raw: bytes | None) -> Sealed | None:
    if not raw:
        return None
    try:
        return Sealed.model_validate_json(raw)
    except ValidationError:
        return None


class SecretStore:
    def __init__(
        self,
        kv: KeyValue,
        key: SecretsKey,
        clock: Clock | None = None,
        *,
        on_write: Callable[[int], None] | None = None,
    ) -> None:
        self._kv = kv
        self._key = key
        self._clock = clock or SystemClock()
        self._on_write = on_write  # told the version each set or unset made

    async def set(self, app: str, values: dict[str, str]) -> list[SecretInfo]:
        """Seal and keep each value (checked already, see ``check_values``)."""
        have = {i.name for i in await self.of_app(app)}
        if len(have | set(values)) > MAX_SECRETS:
            raise InvalidInput(f"app {app} would have over {MAX_SECRETS} secrets")
        now = iso_from_ms(self._clock.now_ms())
        out = []
        for name, value in values.items():
            sealed = self._key.seal(app, name, value, set_at=now)
            try:
                version = await self._kv.put(key_of(app, name), sealed.model_dump_json().encode())
            except _ERRORS as exc:
                raise unavailable("the secrets store", exc) from exc
            out.append(sealed.info(name))
            if self._on_write is not None:
                self._on_write(version)
        return out

    async def of_app(self, app: str) -> list[SecretInfo]:
        """The app's secrets (names, digests, when set), by name."""
        return sorted(
            (sealed.info(name) for name, sealed in (await self._sealed(app)).items()),
            key=lambda i: i.name,
        )

    async def info(self, app: str, name: str) -> SecretInfo | None:
        """One secret's name, digest and when it was set (None: the app has no such secret),
        read by its own key."""
        try:
            entry = await self._kv.get(key_of(app, check_name(name)))
        except nats.js.errors.KeyNotFoundError:
            return None
        except _ERRORS as exc:
            raise unavailable("the secrets store", exc) from exc
        sealed = decode(entry.value)
        return None if sealed is None else sealed.info(name)

    async def unset(self, app: str, name: str, *, missing_ok: bool = False) -> None:
        check_name(name)
        try:
            await self._kv.get(key_of(app, name))
        except nats.js.errors.KeyNotFoundError:
            if missing_ok:
                return
            raise NotFound(
                f"app {app} has no secret {name}", hint=f"see `souq secrets list --app {app}`"
            ) from None
        except _ERRORS as exc:
            raise unavailable("the secrets store", exc) from exc
        try:
            await self._kv.delete(key_of(app, name))
        except _ERRORS as exc:
            raise unavailable("the secrets store", exc) from exc
        if self._on_write is not None:
            self._on_write(await self.version())

    async def version(self) -> int:
        """A number that grows with every change to any secret: Fly's ``version`` (the last
        sequence of the bucket's stream)."""
        try:
            status = await self._kv.status()
        except _ERRORS as exc:
            raise unavailable("the secrets store", exc) from exc
        return int(status.stream_info.state.last_seq)

    async def values(self, app: str) -> dict[str, str]:
        """The app's secrets opened (:class:`SecretsUnreadable` if one does not open)."""
        return {name: self._key.open(app, name, s) for name, s in (await self._sealed(app)).items()}

    async def _sealed(self, app: str) -> dict[str, Sealed]:
        # Every key, filtered here (see souq.broker.releases: a few thousand keys at most).
        try:
            keys = await live_keys(self._kv)
        except _ERRORS as exc:
            raise unavailable("the secrets store", exc) from exc
        out: dict[str, Sealed] = {}
        for key in keys:
            parts = split_key(key)
            if parts is None or parts[0] != app:
                continue
            try:
                entry = await self._kv.get(key)
            except nats.js.errors.KeyNotFoundError:
                continue  # unset meanwhile
            except _ERRORS as exc:
                raise unavailable("the secrets store", exc) from exc
            sealed = decode(entry.value)
            if sealed is not None:
                out[parts[1]] = sealed
        return out
