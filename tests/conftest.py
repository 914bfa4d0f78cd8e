"""What every test of a run shares, however many processes run them (``pytest -n``, xdist).

Servers the tests start take their ports from one port ledger per user of the host
(:mod:`souq.portledger`), which the run's worker processes, their children (brokers, agents,
``souq dev``) and any other run of the same user share: no two of them are given one port at
once, as the kernel's pick of a free port cannot promise across processes."""

from __future__ import annotations

import importlib.util
import os
import shutil
import signal
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from souq.auth.bus import worker_id_for
from souq.portledger import LEDGER_ENV
from souq.testing import STARTED_WORKERS, Cluster
from souq.testing_host import forget_networks
from tests.clusters import running, spec_of


def pytest_configure(config: pytest.Config) -> None:
    # A run started in the background of a script (`cmd &` without job control) ignores SIGINT,
    # and so would every process it starts: Python then installs no KeyboardInterrupt handler,
    # and the tests that end a CLI's watch with SIGINT (as a terminal's Ctrl-C does) would wait
    # for nothing. The run's processes take SIGINT as a terminal's would.
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    # Set before xdist starts its workers (they inherit it), and kept if the caller set one.
    os.environ.setdefault(LEDGER_ENV, str(Path("/tmp") / f"souq-port-ledger-{os.getuid()}"))
    # `souq dev`'s default data directory, for the suite alone: a dev cluster running on this
    # machine (`make dev`) keeps its own, whose admin token the CLI would otherwise send.
    if "SOUQ_DEV_DIR" not in os.environ or not hasattr(config, "workerinput"):
        dev_dir = Path(tempfile.mkdtemp(prefix="souq-test-dev-", dir="/tmp"))
        dev_dir.chmod(0o755)  # machines' users reach it, as they reach /var/lib/souq/dev
        os.environ["SOUQ_DEV_DIR"] = str(dev_dir)
        config.add_cleanup(lambda: shutil.rmtree(dev_dir, ignore_errors=True))


@pytest.fixture(scope="module")
def cluster(request: pytest.FixtureRequest) -> Iterator[Cluster]:
    """A real cluster, once per module: the module's ``CLUSTER`` recipe (tests/clusters.py), or
    the parametrised one, or nats-server, two agents in ``mad`` and one broker."""
    with running(spec_of(request), request) as c:
        yield c


# Tests that share a package-scoped fixture (the Fly suite's one cluster) run in one process.
PACKAGE_GROUPS = ("tests/fly/",)


def work_unit(nodeid: str) -> str:
    """What xdist gives one worker whole: a test's file, or its package in PACKAGE_GROUPS."""
    path = nodeid.split("::", 1)[0]
    return next((p for p in PACKAGE_GROUPS if path.startswith(p)), path)


if importlib.util.find_spec("xdist") is not None:
    from xdist.scheduler import LoadScopeScheduling

    class FileScheduling(LoadScopeScheduling):
        """xdist's ``loadfile``, with the packages of PACKAGE_GROUPS each one unit."""

        def _split_scope(self, nodeid: str) -> str:
            return work_unit(nodeid)

    def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> FileScheduling:
        """Under ``-n N`` each test file is one unit of work, so that its module-scoped
        fixtures are made once, in one process."""
        return FileScheduling(config, log)


@pytest.fixture(scope="session", autouse=True)
def _no_network_left(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """At the end, what the private networks of this process's workers left on the host
    (an agent killed, or one that left machines running to the test's own clean-up): the
    workers its agents started, and those of the ``souq dev`` clusters under its temporary
    directory."""
    yield
    if os.geteuid() != 0:
        return
    workers = set(STARTED_WORKERS)
    base = tmp_path_factory.getbasetemp()
    workers |= {worker_id_for(d) for d in base.glob("**/workers/*") if d.is_dir()}
    forget_networks(workers)
