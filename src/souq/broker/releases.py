"""Releases kept where the cluster keeps state safely: JetStream's key-value bucket
``souq-releases`` (replicated as its stream is), one key per release, ``<app>.<version>``.

A new release takes the next version with a create that fails if the key exists: two deploys
at once never get the same version, with no broker remembering anything.
"""

from __future__ import annotations

import nats.errors
import nats.js.errors

from souq.bus.jetstream import BucketStore, unavailable
from souq.clock import iso_from_ms
from souq.errors import Conflict, NotFound
from souq.model.base import copy_fields
from souq.model.release import NewRelease, Release, ReleaseState, ReleaseUpdate

__all__ = ["BUCKET", "ReleaseStore"]

BUCKET = "souq-releases"
_WHAT = "the release store"
_TRIES = 64  # versions tried by one create, racing other deploys of the same app


class ReleaseStore(BucketStore):
    BUCKET = BUCKET
    DESCRIPTION = "souq releases: one record per app and version"
    WHAT = _WHAT

    async def create(self, app: str, new: NewRelease) -> Release:
        """A new release of ``app``, at the next version."""
        now = iso_from_ms(self._clock.now_ms())
        version = (await self._latest_version(app)) + 1
        for _ in range(_TRIES):
            release = copy_fields(
                Release,
                new,
                app=app,
                version=version,
                state=ReleaseState.PENDING,
                created_at=now,
                updated_at=now,
            )
            try:
                await self._kv.create(_key(app, version), release.model_dump_json().encode())
            except nats.js.errors.KeyWrongLastSequenceError:
                version += 1  # another deploy took it
                continue
            except (nats.errors.Error, nats.js.errors.Error) as exc:
                raise unavailable(_WHAT, exc) from exc
            return release
        raise Conflict(f"app {app}: too many releases made at once", hint="retry the deploy")

    async def get(self, app: str, version: int) -> Release:
        try:
            entry = await self._kv.get(_key(app, version))
        except nats.js.errors.KeyNotFoundError:
            raise NotFound(
                f"app {app} has no release {version}", hint=f"see `souq releases --app {app}`"
            ) from None
        except (nats.errors.Error, nats.js.errors.Error) as exc:
            raise unavailable(_WHAT, exc) from exc
        if entry.value is None:
            raise NotFound(f"app {app} has no release {version}")
        return Release.model_validate_json(entry.value)

    async def update(self, app: str, version: int, change: ReleaseUpdate) -> Release:
        release = await self.get(app, version)
        updated = release.model_copy(
            update={
                "state": change.state,
                "reason": change.reason or release.reason,
                "updated_at": iso_from_ms(self._clock.now_ms()),
            }
        )
        try:
            await self._kv.put(_key(app, version), updated.model_dump_json().encode())
        except (nats.errors.Error, nats.js.errors.Error) as exc:
            raise unavailable(_WHAT, exc) from exc
        return updated

    async def of_app(self, app: str) -> list[Release]:
        """The app's releases, newest first."""
        out = []
        for version in await self._versions(app):
            try:
                out.append(await self.get(app, version))
            except NotFound:
                continue
        return sorted(out, key=lambda r: -r.version)

    async def _latest_version(self, app: str) -> int:
        return max(await self._versions(app), default=0)

    async def _versions(self, app: str) -> list[int]:
        # Every key, filtered here: the client's subject filters answered nothing from
        # nats-server 2.15 (one key per release: a few thousand at most).
        keys = await self._keys()
        prefix = app + "."
        return [
            int(k[len(prefix) :])
            for k in keys
            if k.startswith(prefix) and k[len(prefix) :].isdigit()
        ]


def _key(app: str, version: int) -> str:
    return f"{app}.{version}"
