"""What follows the view's machine rows into an index of its own (the proxy's routing table,
a worker's names): each time a row changes, the record is read again and handed on."""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import ClassVar

from souq.model import Machine

__all__ = ["RowFollower"]


class RowFollower(ABC):
    """Call :meth:`changed` with a machine's id after its row changed (the view's
    ``on_change``): ``_read`` gives the view's record of it, which :meth:`follow` is handed
    (None: destroyed or unknown). A record this process cannot read (a newer peer's) is
    logged, naming ``reader``, and left as it was."""

    reader: ClassVar[str]  # who reads, as the log names it
    _read: Callable[[str], Machine | None]

    def changed(self, machine_id: str) -> None:
        try:
            machine = self._read(machine_id)
        except ValueError as exc:
            logging.getLogger(type(self).__module__).warning(
                "%s cannot read machine %s: %s", self.reader, machine_id, exc
            )
            return
        self.follow(machine_id, machine)

    @abstractmethod
    def follow(self, machine_id: str, machine: Machine | None) -> None:
        """Take in what the view now has of ``machine_id``."""
