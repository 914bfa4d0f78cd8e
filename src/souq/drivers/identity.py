"""A host uid of each machine's own: what a root agent runs machines as unless told otherwise.

Every machine gets a uid (and a group of the same number) that no other machine on the host
has, from a range of subordinate ids well above any login user's (:data:`BASE` up to
:data:`BASE` + :data:`COUNT`). Its processes run as that uid: under the sandbox, root inside
the machine's user namespace is that uid outside (:mod:`souq.drivers.sandbox`); a plain
process runs as it directly. So a machine cannot read, trace or signal another machine's
processes, and cannot open what the agent keeps (0700, root's).

No coordination is needed between the agents of one host (``souq dev`` runs several): a uid is
taken by creating its file in a registry on the host (``/run/souq/uids/<uid>``, holding the
machine id) with ``O_EXCL``, so two agents never take the same one; the first choice is the
machine id's hash in the range, then the next ones. The uid is also kept with the machine's
records, so that it is the same across restarts, agent restarts and host reboots (the files its
writable layer and volumes hold are that uid's); a reboot empties ``/run``, and the recorded uid
is taken again. Destroying the machine gives the uid back.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import shutil
import zlib
from dataclasses import dataclass
from pathlib import Path

from souq.drivers.base import SpawnError
from souq.drivers.users import MachineUser

__all__ = ["BASE", "COUNT", "REGISTRY", "MachineIds", "own_uids"]

log = logging.getLogger(__name__)

BASE = 1 << 20  # 1048576: above the login users' ids and the usual /etc/subuid ranges
COUNT = 1 << 20
REGISTRY = Path("/run/souq/uids")
_RECORD = "uid"


@dataclass(frozen=True)
class MachineIds:
    """Where uids are taken (``registry``) and from which range."""

    registry: Path = REGISTRY
    base: int = BASE
    count: int = COUNT

    def user(self, machine_id: str, records: Path) -> MachineUser:
        """The machine's own user: the uid recorded in ``records`` (its records directory,
        the agent's), or a new one taken and recorded there. :class:`SpawnError` when none
        can be taken (the registry cannot be written, or the range is full)."""
        uid = self.recorded(records)
        if uid is not None:
            self._hold(machine_id, uid)
        else:
            uid = self._take(machine_id)
            try:
                records.mkdir(parents=True, exist_ok=True, mode=0o700)
                (records / _RECORD).write_text(f"{uid}\n")
            except OSError as exc:
                self._give_back(machine_id, uid)
                raise SpawnError(f"cannot record the machine's uid: {exc}") from exc
        return MachineUser(f"machine {machine_id}", uid, uid)

    def recorded(self, records: Path) -> int | None:
        """The uid recorded for a machine, if it has one."""
        found = self._record(records)
        return None if found is None else found[0]

    def _record(self, records: Path) -> tuple[int, str | None] | None:
        """The recorded uid, and who holds it in the registry when that is not the machine
        itself (a sandbox made ahead whose uid the machine was handed)."""
        try:
            words = (records / _RECORD).read_text().split()
            return int(words[0]), words[1] if len(words) > 1 else None
        except (OSError, ValueError, IndexError):
            return None

    def take_ahead(self, holder: str, records: Path) -> MachineUser:
        """A uid for ``holder``, a sandbox made ahead (:mod:`souq.drivers.warm`), recorded as
        held under that name, so that the machine it is handed to gives it back."""
        user = self.user(holder, records)
        try:
            (records / _RECORD).write_text(f"{user.uid} {holder}\n")
        except OSError as exc:
            self.release(holder, records)
            raise SpawnError(f"cannot record the uid: {exc}") from exc
        return user

    def hand_over(self, holder: str, machine_id: str, records: Path, to: Path) -> MachineUser:
        """Give the uid :meth:`take_ahead` took for ``holder`` to ``machine_id``, which has
        none: the holder's records become the machine's, ``to`` (moved there whole when the
        machine has none yet). The registry's file still names ``holder``, as the record says
        (rewriting that file can wait out the file system's journal: milliseconds)."""
        uid = self.recorded(records)
        if uid is None:
            raise SpawnError(f"no uid recorded for {holder}")
        try:
            try:
                os.rename(records, to)
            except OSError:  # the machine has records already: the uid joins them
                to.mkdir(parents=True, exist_ok=True, mode=0o700)
                (to / _RECORD).write_text(f"{uid} {holder}\n")
                shutil.rmtree(records, ignore_errors=True)
        except OSError as exc:
            raise SpawnError(f"cannot record the machine's uid: {exc}") from exc
        return MachineUser(f"machine {machine_id}", uid, uid)

    def release(self, machine_id: str, records: Path) -> None:
        """Give the machine's uid back (it is destroyed)."""
        found = self._record(records)
        if found is not None:
            self._give_back(machine_id, found[0], also=found[1])

    # -- the registry --------------------------------------------------------------------------

    def _take(self, machine_id: str) -> int:
        self._registry()
        first = zlib.crc32(machine_id.encode()) % self.count
        for step in range(self.count):
            uid = self.base + (first + step) % self.count
            if self._claim(machine_id, uid):
                return uid
        raise SpawnError(f"no free machine uid in {self.base}..{self.base + self.count - 1}")

    def _hold(self, machine_id: str, uid: int) -> None:
        """Take the recorded uid again (after a reboot emptied the registry); if another
        machine holds it meanwhile, say so: both now share a uid."""
        self._registry()
        if not self._claim(machine_id, uid):
            log.warning("machine %s keeps uid %d, which another machine has taken", machine_id, uid)

    def _claim(self, machine_id: str, uid: int) -> bool:
        path = self.registry / str(uid)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        except FileExistsError:
            return self._holder(path) == machine_id
        except OSError as exc:
            raise SpawnError(f"cannot take a machine uid in {self.registry}: {exc}") from exc
        try:
            os.write(fd, machine_id.encode() + b"\n")
        finally:
            os.close(fd)
        return True

    def _give_back(self, machine_id: str, uid: int, also: str | None = None) -> None:
        path = self.registry / str(uid)
        if self._holder(path) in (machine_id, also or machine_id):
            with contextlib.suppress(FileNotFoundError):
                path.unlink()

    @staticmethod
    def _holder(path: Path) -> str | None:
        try:
            return path.read_text().strip()
        except OSError:
            return None

    def _registry(self) -> None:
        try:
            self.registry.mkdir(parents=True, exist_ok=True, mode=0o700)
        except OSError as exc:
            if exc.errno != errno.EEXIST:
                raise SpawnError(f"cannot make the uid registry {self.registry}: {exc}") from exc


def own_uids(machine_user: str | None) -> MachineIds | None:
    """A root agent told no ``--machine-user`` gives each machine a uid of its own; otherwise
    every machine runs as that one user (None)."""
    if machine_user not in (None, "") or os.geteuid() != 0:
        return None
    return MachineIds()
