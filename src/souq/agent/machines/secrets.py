"""App secrets as the agent sees them: the ``souq-secrets`` bucket mirrored in memory, sealed
(a watch keeps it current), opened only for a machine's start, into that process's environment.

So a machine's env holds its app's secrets as they were when it (re)started, over its config's
``env`` on a clash; a secret changed later applies on the machine's next start or update. A
claim naming a secrets version (``min_secrets_version``, Fly's; a broker names the last one it
wrote) waits briefly for the mirror to have read that far, so a secret set just before a create
is in the machine it makes. The
state file, the machine's config and every answer hold none of them. A start waits for the
mirror's first full read after the agent connects (like a pull): a machine restarted by its
restart policy while NATS is down uses the last secrets the agent heard.

The values each machine started with are kept in memory too, to redact them from its served
logs (:mod:`souq.secrets.redact`) even after they were changed or unset.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from pathlib import Path

from nats.aio.client import Client
from nats.js.kv import KeyValue

from souq.auth.files import AuthDir
from souq.errors import InvalidInput, NotFound, SecretsUnavailable, SouqError
from souq.secrets.sealed import Sealed, SecretsKey
from souq.secrets.store import decode, open_bucket, secrets_key, split_key

__all__ = ["AgentSecrets"]

log = logging.getLogger(__name__)

_RETRY_S = 1.0
_UNMADE_RETRY_S = 0.25  # the bucket a broker makes as it starts: bound soon after
# How long a claim waits for the mirror to read its secrets version: well inside the broker's
# claim timeout (5 s), so that a version no worker reads is refused, not taken for a lost answer.
_CATCH_UP_S = 2.0


class AgentSecrets:
    """The mirror. :meth:`attach` starts it on a NATS connection; :meth:`for_machine` opens an
    app's secrets at a machine's start (SecretsUnreadable if one does not open)."""

    def __init__(self, auth_dir: Path | None) -> None:
        self._key: SecretsKey | None = None
        self._missing: SouqError | None = None
        try:
            self._key = secrets_key(AuthDir.from_env(auth_dir))
        except (SecretsUnavailable, InvalidInput) as exc:
            self._missing = exc  # machines of apps without secrets run as ever
        self._sealed: dict[str, dict[str, Sealed]] = {}  # app -> name -> sealed
        self._started: dict[str, frozenset[str]] = {}  # machine id -> values it started with
        self._synced = asyncio.Event()
        self._waiting: list[Callable[[], None]] = []
        self._task: asyncio.Task[None] | None = None
        self._revision = 0  # the last stream sequence the mirror has read
        self._moved = asyncio.Event()  # set at each entry read

    @property
    def enabled(self) -> bool:
        return self._key is not None

    @property
    def ready(self) -> bool:
        """Whether the mirror has read the bucket once (always, without a key: no secrets)."""
        return not self.enabled or self._synced.is_set()

    def when_ready(self, then: Callable[[], None]) -> None:
        if self.ready:
            then()
        else:
            self._waiting.append(then)

    async def caught_up(self, version: int) -> bool:
        """Whether the mirror has read the bucket's stream up to ``version`` (Fly's secrets
        version, a create's ``min_secrets_version``), waiting a few seconds for it: a secret
        set just before a create is in the machine it makes. True at once without a key."""
        if not self.enabled:
            return True
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(_CATCH_UP_S):
                await self._synced.wait()
                while self._revision < version:
                    self._moved.clear()
                    await self._moved.wait()
        return self._synced.is_set() and self._revision >= version

    def attach(self, nc: Client) -> None:
        if self._key is None:
            log.info("no auth directory: machines get no app secrets (%s)", self._missing)
            return
        self._task = asyncio.get_running_loop().create_task(self._mirror(nc))

    def for_machine(self, machine_id: str, app: str) -> dict[str, str]:
        """The app's secrets, opened, for a start of ``machine_id`` (remembered for redaction)."""
        sealed = self._sealed.get(app, {})
        if self._key is None or not sealed:
            self._started.pop(machine_id, None)
            return {}
        values = {name: self._key.open(app, name, s) for name, s in sealed.items()}
        self._started[machine_id] = frozenset(values.values())
        return values

    def to_redact(self, machine_id: str, app: str) -> set[str]:
        """Every value the machine may show: its app's secrets now, and what it started with."""
        values = set(self._started.get(machine_id, ()))
        if self._key is not None:
            for name, s in self._sealed.get(app, {}).items():
                with contextlib.suppress(SouqError):
                    values.add(self._key.open(app, name, s))
        return values

    def forget(self, machine_id: str) -> None:
        self._started.pop(machine_id, None)

    async def _mirror(self, nc: Client) -> None:
        while True:
            try:
                kv = await open_bucket(nc, make=False)  # a broker makes it
                await self._follow(kv)
            except asyncio.CancelledError:
                raise
            except NotFound:  # no broker made it yet: no app has secrets, so none wait for them
                if not self._synced.is_set():
                    self._synced_now()
                await asyncio.sleep(_UNMADE_RETRY_S)
                continue
            except Exception as exc:  # NATS away or no JetStream: the mirror stays as it was
                log.warning("reading app secrets failed (%s); trying again", exc)
            await asyncio.sleep(_RETRY_S)

    async def _follow(self, kv: KeyValue) -> None:
        watcher = await kv.watchall()
        fresh: dict[str, dict[str, Sealed]] = {}
        initial = True
        try:
            async for entry in watcher:
                if entry is None:  # the bucket read once: swap it in whole, then go on
                    if initial:
                        self._sealed, initial = fresh, False
                        self._synced_now()
                    continue
                self._revision = max(self._revision, entry.revision or 0)
                self._moved.set()
                into = fresh if initial else self._sealed
                parts = split_key(entry.key)
                if parts is None:
                    continue
                app, name = parts
                sealed = None if entry.operation is not None else decode(entry.value)
                if sealed is None:
                    into.get(app, {}).pop(name, None)
                else:
                    into.setdefault(app, {})[name] = sealed
        finally:
            with contextlib.suppress(Exception):
                await watcher.stop()  # type: ignore[no-untyped-call]

    def _synced_now(self) -> None:
        self._synced.set()
        waiting, self._waiting = self._waiting, []
        for then in waiting:
            try:
                then()
            except Exception:
                log.exception("a start waiting for app secrets failed")

    async def aclose(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
