"""The worker's host ports: a resource like memory, given to machines at their claim.

Every machine of a worker shares the host, so two machines cannot both listen on the port their
service names. The worker gives each of a machine's internal ports (its services' and checks')
a host port of its own from a range (``--ports``, default 20000-29999), records the mapping with
the machine in the same transaction as the claim (:class:`~souq.model.MachineAddress`), and the
process reads it from ``PORT``. A port stays the machine's across agent restarts (the pool is
rebuilt from the records) and returns to the pool when the machine is destroyed.

Ports are handed out round-robin from the last one given, so a port just freed is the last to
be given again (a proxy may still hold a connection to its old machine for a moment), and a
port some other process of the host listens on is skipped (``probe``).
"""

from __future__ import annotations

import socket
from collections.abc import Callable, Iterable, Mapping, Sequence

from souq.errors import ClaimRefused
from souq.model.machine import MachineConfig
from souq.model.reasons import Reason
from souq.model.services import MachineAddress

__all__ = ["DEFAULT_RANGE", "PortPool", "can_bind", "edge_ports", "port_env"]

DEFAULT_RANGE = (20000, 29999)


def can_bind(port: int, host: str = "127.0.0.1") -> bool:
    """Whether nothing on the host listens on ``port`` (a bind succeeds)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


class PortPool:
    def __init__(
        self,
        low: int = DEFAULT_RANGE[0],
        high: int = DEFAULT_RANGE[1],
        *,
        probe: Callable[[int], bool] = can_bind,
    ) -> None:
        if not 1 <= low <= high <= 65535:
            raise ValueError(f"a port range is 1-65535, low to high (got {low}-{high})")
        self.low, self.high = low, high
        self._probe = probe
        self._owner: dict[int, str] = {}  # port -> machine id
        self._ports: dict[str, list[int]] = {}  # machine id -> its ports
        self._next = low

    @property
    def size(self) -> int:
        return self.high - self.low + 1

    @property
    def free(self) -> int:
        return self.size - len(self._owner)

    def restore(self, machine_id: str, ports: Iterable[int]) -> None:
        """A machine recorded before (at the agent's start): its ports stay its own."""
        for port in ports:
            self._owner[port] = machine_id
            self._ports.setdefault(machine_id, []).append(port)

    def take(self, machine_id: str, internal_ports: Sequence[int]) -> dict[int, int]:
        """A host port for each internal port, or :class:`ClaimRefused` (``no_ports``) with
        none taken when the range has too few free."""
        given: dict[int, int] = {}
        tried = 0
        while len(given) < len(internal_ports) and tried < self.size:
            port = self._next
            self._next = self.low if port >= self.high else port + 1
            tried += 1
            if port in self._owner or not self._probe(port):
                continue
            given[internal_ports[len(given)]] = port
            self._owner[port] = machine_id
        if len(given) < len(internal_ports):
            for port in given.values():
                del self._owner[port]
            raise ClaimRefused(
                f"no free host port for the machine's {len(internal_ports)} internal port(s) "
                f"in {self.low}-{self.high}",
                hint="try another worker, or give this one a wider --ports range",
                details={"reason": Reason.NO_PORTS},
            )
        if given:
            self._ports[machine_id] = list(given.values())
        return given

    def give_back(self, machine_id: str) -> None:
        """The machine is destroyed (or its claim was not recorded): its ports are free."""
        for port in self._ports.pop(machine_id, []):
            if self._owner.get(port) == machine_id:
                del self._owner[port]

    def owner(self, port: int) -> str | None:
        return self._owner.get(port)


def edge_ports(config: MachineConfig) -> list[int]:
    """The internal ports of a machine's services that the edge routes (those with edge
    ports): on a private network, the ones its worker forwards host ports to, so that a proxy
    on another host reaches it (souq.network.links)."""
    return list(dict.fromkeys(s.internal_port for s in config.services if s.ports))


def port_env(env: Mapping[str, str], address: MachineAddress | None) -> dict[str, str]:
    """A machine's environment with its host ports: ``PORT`` for its first service (or check),
    ``PORT_<internal_port>`` for each. Set by Souq: they win over the config's own."""
    out = dict(env)
    if address is not None and address.ports:
        out["PORT"] = str(next(iter(address.ports.values())))
        out.update({f"PORT_{inner}": str(outer) for inner, outer in address.ports.items()})
    return out
