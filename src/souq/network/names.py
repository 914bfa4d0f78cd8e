"""Names under ``.internal``: what each one answers, from an in-memory index of the machines.

Pure: no I/O, no clock, no DNS wire format (:mod:`souq.network.dns` speaks the protocol). The
index is changed one machine at a time (:meth:`NameIndex.put`, :meth:`NameIndex.remove`) and
asked with a lowercased name, a record type and the asker's address (:meth:`NameIndex.resolve`).

Names, as Fly's 6PN DNS has them (every address is the machine's ``private_ip``, IPv6)::

    <app>.internal                      AAAA  the app's started machines, healthy first
    <region>.<app>.internal             AAAA  the same, in that region
    <machine id>.vm.<app>.internal      AAAA  that machine, while it is started
    top<N>.nearest.of.<app>.internal    AAAA  the N nearest: the asker's region first, then the
                                              regions it was told are near, then the rest by name
    vms.<app>.internal                  TXT   "<machine id> <region>" of the started machines
    regions.<app>.internal              TXT   the regions of the app's started machines
    _apps.internal                      TXT   the names of the apps, comma separated
    <app>.flycast                       AAAA  the app's Flycast address (answered by the edge
                                              proxy, which starts a machine if it must)

**Which names exist.** An app exists while it has a machine that is not destroyed; a region
name exists when Souq knows the region (a worker or a machine is in it); a machine name while
the machine is not destroyed. A name that exists but has nothing to give (a stopped app's
``<app>.internal``, an ``A`` query: the network is IPv6 only) is an empty answer (NOERROR);
any other name under ``.internal`` is NXDOMAIN.

**Scope.** Every machine is in one network: its app's organisation and, when the app asked for
one of its own, its network. An asker known by its source address (a machine's private IP)
sees only its own network's apps and machines; an asker the index does not know (the worker
itself, a test) sees every network. The scope comes from the app's record, which reaches the
worker on a watch of its own and may come late; a machine's record names its network too (its
address's, given at its claim: the network the worker's firewall holds it to and the proxy
reads). So an app whose machines' records name another network than the asker's is another
network's whatever the scopes say, and an app's Flycast address is on the network its
machines' records name (its scope's only while none names one): never an address the worker
does not send to the proxy.

**Order.** Within an answer, healthy machines (as the feed tells: no check failing) come
before unhealthy ones, then older before newer (``created_at``, then id): the same order for
the same state, so that a client that takes the first address spreads only as much as the set
changes. An app's answers are computed once after each change of one of its machines and kept
until the next: a query is dict lookups.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from souq.network.addresses import flycast_ip, network_of

__all__ = [
    "DEFAULT_TTL_S",
    "TXT_CHUNK",
    "Answer",
    "NameIndex",
    "NameRow",
    "Rcode",
    "Scope",
    "is_internal",
]

ZONE = "internal"
FLYCAST_ZONE = "flycast"
DEFAULT_TTL_S = 5  # Fly's answers live 5 s or less: a stopped machine is gone from caches soon
TXT_CHUNK = 255  # the longest string one TXT record's part holds
_STARTED = "started"


class Rcode(enum.Enum):
    NOERROR = "NOERROR"
    NXDOMAIN = "NXDOMAIN"


@dataclass(frozen=True, order=True)
class Scope:
    """The private network a machine is on: its app's organisation and network."""

    org: str
    network: str = ""


@dataclass(frozen=True)
class NameRow:
    """What the names need of one machine (not destroyed)."""

    machine_id: str
    app: str
    region: str
    state: str
    healthy: bool
    private_ip: str | None  # IPv6; None: it has no private address (it is in no AAAA answer)
    created_at: str = ""
    scope: Scope = Scope("personal")
    network: str = ""  # the network its record names (its address's); "": none (not private)

    @property
    def answers(self) -> bool:
        return self.state == _STARTED and self.private_ip is not None


@dataclass(frozen=True)
class Answer:
    """What a name answers: ``rdtype`` "AAAA" (``values`` are addresses) or "TXT" (``values``
    are the strings of one record), empty when the name exists but has nothing of that type."""

    rcode: Rcode
    rdtype: str = ""
    values: tuple[str, ...] = ()

    @property
    def empty(self) -> bool:
        return not self.values


NXDOMAIN = Answer(Rcode.NXDOMAIN)
EMPTY = Answer(Rcode.NOERROR)


def is_internal(name: str) -> bool:
    """Whether a name (lowercase, without its final dot) is under ``.internal`` or
    ``.flycast`` (the names answered here)."""
    return any(name == zone or name.endswith("." + zone) for zone in (ZONE, FLYCAST_ZONE))


def _order(row: NameRow) -> tuple[bool, str, str]:
    return (not row.healthy, row.created_at, row.machine_id)


def txt_strings(text: str) -> tuple[str, ...]:
    """A TXT record's strings for ``text``: parts of at most 255 characters."""
    if not text:
        return ()
    return tuple(text[i : i + TXT_CHUNK] for i in range(0, len(text), TXT_CHUNK))


@dataclass
class _AppNames:
    """One app's answers, computed from its machines after a change."""

    all: tuple[str, ...]
    by_region: dict[str, tuple[str, ...]]
    by_id: dict[str, tuple[str, ...]]  # every machine not destroyed: () when not started
    vms: tuple[str, ...]
    regions: tuple[str, ...]
    started: tuple[NameRow, ...]  # healthy first, for the nearest
    nearest: dict[str | None, tuple[str, ...]] = field(default_factory=dict)


class NameIndex:
    """The machines by app, by address and by network, and each app's answers.

    ``nearby`` maps a region to the regions nearest it, nearest first (as the proxy's routing
    table is told); ``regions`` are the regions Souq knows beyond those of the machines (the
    workers'), set with :meth:`set_regions`."""

    def __init__(
        self,
        *,
        nearby: Mapping[str, Sequence[str]] | None = None,
        regions: Iterable[str] = (),
    ) -> None:
        self._rows: dict[str, NameRow] = {}
        self._apps: dict[str, dict[str, NameRow]] = {}
        self._by_ip: dict[str, NameRow] = {}
        self._names: dict[str, _AppNames] = {}  # apps whose answers are computed
        self._nearby = {r: tuple(n) for r, n in (nearby or {}).items()}
        self._regions: set[str] = set(regions)
        self._apps_txt: dict[tuple[Scope, str] | None, tuple[str, ...]] = {}
        self._networks: dict[str, str] = {}  # app -> the network its records name ("": none)
        # Counts the changes: an answer made at one version holds until the next (the DNS
        # server keeps its rendered answers this long).
        self.version = 0

    # -- changes -------------------------------------------------------------------------------

    def put(self, row: NameRow) -> None:
        """Add a machine, or replace what the index knows of it."""
        old = self._rows.get(row.machine_id)
        if old == row:
            return
        if old is not None:
            self._unlink(old)
        self._rows[row.machine_id] = row
        self._apps.setdefault(row.app, {})[row.machine_id] = row
        if row.private_ip is not None:
            self._by_ip[row.private_ip] = row
        where = (row.app, row.scope, row.network)
        self._changed(row.app, new_app=old is None or (old.app, old.scope, old.network) != where)

    def remove(self, machine_id: str) -> None:
        """Forget a machine (destroyed, or no longer in the view)."""
        old = self._rows.pop(machine_id, None)
        if old is not None:
            self._unlink(old)
            self._changed(old.app, new_app=True)

    def set_regions(self, regions: Iterable[str]) -> None:
        regions = set(regions)
        if regions != self._regions:
            self._regions = regions
            self.version += 1

    def _unlink(self, row: NameRow) -> None:
        machines = self._apps.get(row.app)
        if machines is not None:
            machines.pop(row.machine_id, None)
            if not machines:
                del self._apps[row.app]
        if row.private_ip is not None and self._by_ip.get(row.private_ip) is row:
            del self._by_ip[row.private_ip]
        self._changed(row.app, new_app=True)

    def _changed(self, app: str, *, new_app: bool) -> None:
        self.version += 1
        self._names.pop(app, None)
        self._networks.pop(app, None)
        if new_app:
            self._apps_txt.clear()

    # -- what anybody reads ----------------------------------------------------------------------

    def machines_of(self, app: str) -> list[NameRow]:
        return list(self._apps.get(app, {}).values())

    def get(self, machine_id: str) -> NameRow | None:
        return self._rows.get(machine_id)

    def __len__(self) -> int:
        return len(self._rows)

    def asker(self, address: str | None) -> NameRow | None:
        """The machine whose private address is ``address`` (None: not a machine's)."""
        return None if address is None else self._by_ip.get(address)

    def resolve(self, name: str, rdtype: str, *, asker: str | None = None) -> Answer:
        """What ``name`` (lowercase, no final dot, under ``.internal``) answers to a query of
        ``rdtype`` ("AAAA", "A", "TXT", "ANY"...) from the address ``asker``."""
        row = self.asker(asker)
        labels = name.split(".")
        if labels[-1] == FLYCAST_ZONE:
            return self._flycast(labels[:-1], rdtype, row)
        if labels[-1] != ZONE:
            return NXDOMAIN
        labels = labels[:-1]
        if not labels:
            return EMPTY  # the zone itself
        if labels == ["_apps"]:
            return self._typed(rdtype, "TXT", self._apps_answer(row))
        app = labels[-1]
        names = self._app_names(app, row)
        if names is None:
            return NXDOMAIN
        return self._under_app(app, names, labels[:-1], rdtype, row)

    def _under_app(
        self, app: str, names: _AppNames, rest: list[str], rdtype: str, asker: NameRow | None
    ) -> Answer:
        """A name under ``<app>.internal`` (``rest``: its labels before the app's)."""
        if not rest:
            return self._typed(rdtype, "AAAA", names.all)
        first = rest[0]
        if len(rest) == 1:
            return self._one_label(app, names, first, rdtype)
        if len(rest) == 2 and rest[1] == "vm":
            found = names.by_id.get(first)
            return NXDOMAIN if found is None else self._typed(rdtype, "AAAA", found)
        count = first.removeprefix("top")
        if rest[1:] == ["nearest", "of"] and first != count and _count(count):
            region = asker.region if asker is not None else None
            return self._typed(rdtype, "AAAA", self._nearest(names, region)[: int(count)])
        return NXDOMAIN

    def _one_label(self, app: str, names: _AppNames, label: str, rdtype: str) -> Answer:
        """``<label>.<app>.internal``: ``vms`` and ``regions`` (TXT), else a region."""
        txt = {"vms": names.vms, "regions": names.regions}.get(label)
        if txt is not None:
            return self._typed(rdtype, "TXT", txt)
        if label in names.by_region:
            return self._typed(rdtype, "AAAA", names.by_region[label])
        if label in self._regions or any(r.region == label for r in self._apps[app].values()):
            return EMPTY  # a region Souq knows, where the app has nothing started
        return NXDOMAIN

    @staticmethod
    def _typed(asked: str, holds: str, values: tuple[str, ...]) -> Answer:
        """A name that exists: its values when asked for their type (or ANY), else empty."""
        if asked not in (holds, "ANY"):
            return EMPTY
        return Answer(Rcode.NOERROR, holds, values)

    def _flycast(self, labels: list[str], rdtype: str, asker: NameRow | None) -> Answer:
        """``<app>.flycast``: the app's Flycast address, whether a machine of it runs or not, on
        the network its machines' records name (where the worker routes it), else its scope's."""
        if not labels:
            return EMPTY
        app = labels[0]
        machines = self._apps.get(app)
        if len(labels) != 1 or not machines or not self._sees(asker, app):
            return NXDOMAIN
        network = self._network(app)
        if not network:
            own = next(iter(machines.values())).scope
            network = network_of(own.org, own.network)
        return self._typed(rdtype, "AAAA", (flycast_ip(network, app),))

    # -- inside ----------------------------------------------------------------------------------

    def _network(self, app: str) -> str:
        """The network the records of ``app``'s machines name ("": none does)."""
        network = self._networks.get(app)
        if network is None:
            machines = self._apps.get(app, {}).values()
            network = self._networks[app] = next((r.network for r in machines if r.network), "")
        return network

    def _sees(self, asker: NameRow | None, app: str) -> bool:
        """Whether ``asker`` (None: no machine's address) sees ``app``, which has machines: the
        same scope and, where both records name a network, the same network."""
        if asker is None:
            return True
        if next(iter(self._apps[app].values())).scope != asker.scope:
            return False
        network = self._network(app)
        return not asker.network or not network or network == asker.network

    def _app_names(self, app: str, asker: NameRow | None) -> _AppNames | None:
        machines = self._apps.get(app)
        if not machines:
            return None
        if not self._sees(asker, app):
            return None  # another network's app: it does not exist for this asker
        names = self._names.get(app)
        if names is None:
            names = self._names[app] = _compute(machines.values())
        return names

    def _apps_answer(self, asker: NameRow | None) -> tuple[str, ...]:
        key = None if asker is None else (asker.scope, asker.network)
        got = self._apps_txt.get(key)
        if got is None:
            apps = sorted(app for app in self._apps if self._sees(asker, app))
            got = self._apps_txt[key] = txt_strings(",".join(apps))
        return got

    def _nearest(self, names: _AppNames, region: str | None) -> tuple[str, ...]:
        got = names.nearest.get(region)
        if got is None:
            ranks: dict[str, int] = {}
            if region is not None:
                for r in (region, *self._nearby.get(region, ())):
                    ranks.setdefault(r, len(ranks))
            far = len(ranks)
            ordered = sorted(
                names.started,
                key=lambda row: (ranks.get(row.region, far), row.region, *_order(row)),
            )
            got = names.nearest[region] = tuple(_addresses(ordered))
        return got


def _count(text: str) -> bool:
    """Whether ``text`` is N of ``top<N>``: a number from 1, written without leading zeros."""
    return text.isdigit() and text == str(int(text)) and int(text) >= 1


def _addresses(rows: Iterable[NameRow]) -> list[str]:
    """The rows' addresses, each once, in order."""
    return list(dict.fromkeys(row.private_ip for row in rows if row.private_ip is not None))


def _compute(machines: Iterable[NameRow]) -> _AppNames:
    rows = sorted(machines, key=_order)
    started = tuple(row for row in rows if row.answers)
    by_region: dict[str, list[NameRow]] = {}
    for row in started:
        by_region.setdefault(row.region, []).append(row)
    regions = sorted(by_region)
    return _AppNames(
        all=tuple(_addresses(started)),
        by_region={r: tuple(_addresses(rs)) for r, rs in by_region.items()},
        by_id={
            row.machine_id: (row.private_ip,) if row.answers and row.private_ip else ()
            for row in rows
        },
        vms=txt_strings(",".join(f"{row.machine_id} {row.region}" for row in started)),
        regions=txt_strings(",".join(regions)),
        started=started,
    )
