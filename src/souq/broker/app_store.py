"""Created apps, kept where the cluster keeps state that belongs to no worker: JetStream's
key-value bucket ``souq-apps`` (replicated as its stream is), one key per app, its name.

A create is a create-if-absent on the key, so two brokers creating the same name at once make
one app and one ``name_taken``. Apps that were never created (they only have machines) are not
here: :mod:`souq.broker.app_routes` finds those in the cluster view.
"""

from __future__ import annotations

import secrets

import nats.errors
import nats.js.errors

from souq.bus.jetstream import BucketStore, unavailable
from souq.clock import iso_from_ms
from souq.errors import NameTaken
from souq.model.app import AppRecord, NewApp

__all__ = ["BUCKET", "AppStore", "new_app_id"]

BUCKET = "souq-apps"
_WHAT = "the app store"


def new_app_id() -> str:
    """16 characters of lowercase letters and digits, as Fly's app ids."""
    alphabet = "abcdefghijklmnopqrstuvwxyz0123456789"
    return "".join(secrets.choice(alphabet) for _ in range(16))


class AppStore(BucketStore):
    BUCKET = BUCKET
    DESCRIPTION = "souq apps: one record per created app"
    WHAT = _WHAT

    async def create(self, body: NewApp, *, taken: bool = False) -> AppRecord:
        """The new app's record; :class:`NameTaken` when the name is in use (``taken``: the
        caller knows it has machines)."""
        if taken:
            raise _taken(body.app, machines=True)
        record = AppRecord.new(
            body, app_id=new_app_id(), created_at=iso_from_ms(self._clock.now_ms())
        )
        try:
            await self._kv.create(body.app, record.model_dump_json().encode())
        except nats.js.errors.KeyWrongLastSequenceError:
            raise _taken(body.app, machines=False) from None
        except (nats.errors.Error, nats.js.errors.Error) as exc:
            raise unavailable(_WHAT, exc) from exc
        return record

    async def get(self, name: str) -> AppRecord | None:
        try:
            entry = await self._kv.get(name)
        except (nats.js.errors.KeyNotFoundError, nats.js.errors.KeyDeletedError):
            return None
        except (nats.errors.Error, nats.js.errors.Error) as exc:
            raise unavailable(_WHAT, exc) from exc
        if not entry.value:
            return None
        return AppRecord.model_validate_json(entry.value)

    async def delete(self, name: str) -> None:
        try:
            await self._kv.delete(name)
        except (nats.errors.Error, nats.js.errors.Error) as exc:
            raise unavailable(_WHAT, exc) from exc

    async def all(self) -> list[AppRecord]:
        """Every created app, by name."""
        keys = sorted(await self._keys())
        return [r for r in [await self.get(k) for k in keys] if r is not None]


def _taken(name: str, *, machines: bool) -> NameTaken:
    how = "it has machines" if machines else "it was created before"
    return NameTaken(
        f"app name {name!r} is taken: an app of that name exists ({how})",
        hint=f"choose another name, or use app {name} as it is (`souq apps show {name}`)",
        details={"app": name},
    )
