"""What a ``with`` block starts and stops (a test cluster, a set of hosts, a network of
namespaces): :class:`Lifespan`."""

from __future__ import annotations

from typing import Self

__all__ = ["Lifespan"]


class Lifespan:
    """A context manager over :meth:`start` and :meth:`stop`: ``with`` starts it and stops it
    however the block ends, and a start that fails part way is stopped (whatever it had made)
    before its error goes on. :meth:`stop` must be safe on a thing half started."""

    def start(self) -> Self:
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *exc_info: object) -> None:
        self.stop()
