"""The one ``cluster`` fixture's recipe: what a test module's cluster is made of.

A module says what it needs in one line, ``CLUSTER = ClusterSpec("deploy", regions={"mad": 2,
"syd": 1}, cpus=4, memory_mb=2048)``, and takes the ``cluster`` fixture of tests/conftest.py,
which starts that cluster once for the module and stops it after the module's last test (or
reads the spec from ``request.param``, for ``@pytest.mark.parametrize("cluster", [spec],
indirect=True)``). A module without a ``CLUSTER`` gets :data:`DEFAULT`: nats-server, two agents
in ``mad`` (4 cpus, 4096 MiB each), one broker."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from souq.testing import Cluster, environment


@dataclass(frozen=True)
class AgentSpec:
    """An agent added once the cluster runs (:meth:`souq.testing.Cluster.add_agent`'s
    arguments): for agents the cluster's ``regions`` do not describe."""

    region: str
    options: Mapping[str, Any] = field(default_factory=dict)


def agent(region: str, **options: Any) -> AgentSpec:
    return AgentSpec(region, options)


# The agent of a machines root (tests/isolated.py): root's own defaults, a uid per machine.
ISOLATED_AGENT = agent("mad", machine_user=None, default_driver=None)


@dataclass(frozen=True)
class ClusterSpec:
    """:class:`souq.testing.Cluster`'s arguments, the agents added after it starts, and where it
    lives: under pytest's base (``name``, a directory of ``tmp_path_factory``), or, with
    ``isolated``, under a machines root in /var/tmp (tests/isolated.py), or under the directory
    another fixture gives (``root_fixture``: that fixture's value, plus ``subdir``)."""

    name: str = "cluster"
    regions: Mapping[str, int] = field(default_factory=lambda: {"mad": 2})
    cpus: float = 4
    memory_mb: int = 4096
    brokers: int = 1
    nats_nodes: int = 1
    agents: tuple[AgentSpec, ...] = ()
    isolated: bool = False
    root_fixture: str | None = None
    subdir: str = ""
    # Fixtures to make first (one that skips the module skips it before its cluster starts).
    needs: tuple[str, ...] = ()
    # Variables set in this process once the cluster runs (the agents of ``agents`` inherit them).
    env: Mapping[str, str] = field(default_factory=dict)
    # Run once the cluster is up, before the module's first test (its seed data).
    ready: Callable[[Cluster], None] | None = None

    def cluster(self, root: Path) -> Cluster:
        return Cluster(
            root,
            regions=self.regions,
            cpus=self.cpus,
            memory_mb=self.memory_mb,
            brokers=self.brokers,
            nats_nodes=self.nats_nodes,
        )


DEFAULT = ClusterSpec()


def isolated(prefix: str, **kwargs: Any) -> ClusterSpec:
    """A cluster of one agent in ``mad`` running as root with its own defaults, under a machines
    root (tests/isolated.py): what :func:`tests.isolated.isolated_cluster` starts."""
    return ClusterSpec(prefix, regions={}, agents=(ISOLATED_AGENT,), isolated=True, **kwargs)


def cluster_fixture(spec: ClusterSpec, scope: str = "module") -> Any:
    """A fixture of a cluster besides the module's ``cluster``, named as it is assigned
    (``small = cluster_fixture(ClusterSpec("small", ...))``): a second cluster of other sizes, or
    one of each test's own (``scope="function"``) for a test that takes it down."""

    @pytest.fixture(scope=scope)
    def made(request: pytest.FixtureRequest) -> Iterator[Cluster]:
        with running(spec, request) as c:
            yield c

    return made


def spec_of(request: pytest.FixtureRequest) -> ClusterSpec:
    spec = getattr(request, "param", None) or getattr(request.module, "CLUSTER", DEFAULT)
    assert isinstance(spec, ClusterSpec), f"{request.module.__name__}.CLUSTER is not a ClusterSpec"
    return spec


@contextlib.contextmanager
def running(spec: ClusterSpec, request: pytest.FixtureRequest) -> Iterator[Cluster]:
    """The spec's cluster, running, with its agents listed as up by every broker."""
    from tests.isolated import machines_root

    for name in spec.needs:
        request.getfixturevalue(name)
    with contextlib.ExitStack() as stack:
        if spec.isolated:
            root = stack.enter_context(machines_root(f"souq-{spec.name}-"))
        elif spec.root_fixture is not None:
            root = Path(request.getfixturevalue(spec.root_fixture))
        else:
            factory: pytest.TempPathFactory = request.getfixturevalue("tmp_path_factory")
            root = factory.mktemp(spec.name)
        if spec.subdir:
            root = root / spec.subdir
        cluster = stack.enter_context(spec.cluster(root))
        if spec.env:
            stack.enter_context(environment(**spec.env))
        for added in spec.agents:
            cluster.add_agent(added.region, **dict(added.options))
        if spec.agents:
            cluster.wait_for_workers()
        if spec.ready is not None:
            spec.ready(cluster)
        yield cluster
