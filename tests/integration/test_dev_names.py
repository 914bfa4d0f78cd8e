"""Under `souq dev`, as root on a host that can, machines have the private network by default
and find each other by name: a machine of an app resolves ``<app>.internal`` (answered by the
`souq dev` process, at a port of its cluster's own, not by an agent: no agent is given the
view's credential) and connects to another machine of its app on another worker by that
name; a second `souq dev` on the same host answers its own machines' names, not the first's."""

from __future__ import annotations

import contextlib
import shutil
import signal
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from souq.client.api import SouqClient
from souq.model.machine import Machine, MachineState
from souq.natsserver import free_port
from souq.testing import wait_until
from tests.isolated import PRIVATE_NETWORK, PYTHON

_SERVE = (
    "import os,socket\n"
    "s=socket.socket(socket.AF_INET6);s.setsockopt(socket.SOL_SOCKET,socket.SO_REUSEADDR,1)\n"
    "s.bind(('::',int(os.environ['PORT'])));s.listen()\n"
    "print('listening',flush=True)\n"
    "while True:\n"
    "  c,_=s.accept();c.recv(4096);c.sendall(os.environ['SOUQ_MACHINE_ID'].encode());c.close()\n"
)
# Resolve the name through the machine's own resolv.conf, then connect to each address.
_ASK = (
    "import socket,sys\n"
    "try:\n"
    "  found=sorted({a[4][0] for a in socket.getaddrinfo(sys.argv[1],8080,socket.AF_INET6)})\n"
    "except OSError as e:\n"
    "  print('FAIL',e);sys.exit()\n"
    "said=[]\n"
    "for ip in found:\n"
    "  s=socket.create_connection((ip,8080),timeout=5);s.sendall(b'hi')\n"
    "  said.append(ip+'='+s.recv(100).decode())\n"
    "print(' '.join(said))\n"
)

pytestmark = PRIVATE_NETWORK


class _Dev:
    """One `souq dev` process with two workers in ``mad``, and a client of its API."""

    def __init__(self, data: Path, out: Path) -> None:
        self.data, self.out = data, out
        self.port, self.nats_port = free_port(), free_port()
        args = ["--port", str(self.port), "--nats-port", str(self.nats_port)]
        args += ["--proxy-port", str(free_port()), "--regions", "mad"]
        args += ["--workers-per-region", "2", "--data-dir", str(data)]
        with open(out, "wb") as sink:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "souq", "dev", *args],
                stdout=sink,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )

    def ready(self) -> SouqClient:
        wait_until(
            lambda: f"NATS: nats://127.0.0.1:{self.nats_port}" in self.out.read_text(),
            timeout=90,
            message="the ready banner",
        )
        token = (self.data / "admin.token").read_text().strip()
        return SouqClient(f"http://127.0.0.1:{self.port}", token=token, timeout=60)

    def stop(self) -> None:
        if self.process.poll() is not None:
            return
        tree = psutil.Process(self.process.pid).children(recursive=True)
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(60)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        for proc in tree:
            with contextlib.suppress(psutil.Error):
                proc.kill()


@pytest.fixture
def dev_data(request: pytest.FixtureRequest) -> Iterator[Path]:
    # Machines run as uids of their own: the data dir must be one they can reach.
    data = Path(tempfile.mkdtemp(prefix="souq-dev-names-", dir="/tmp"))
    data.chmod(0o755)
    yield data
    shutil.rmtree(data, ignore_errors=True)


def _server(client: SouqClient, app: str) -> Machine:
    config = {
        "guest": {"memory_mb": 64},
        "cmd": [PYTHON, "-c", _SERVE],
        "services": [{"internal_port": 8080}],
    }
    m = client.create_machine(app, "mad", config)
    m = client.wait(app, m.id, MachineState.STARTED, timeout=60)
    wait_until(lambda: "listening" in client.logs(app, m.id), timeout=30, message="listening")
    return m


def _ask(client: SouqClient, app: str, m: Machine, name: str) -> str:
    reply = client.exec(app, m.id, [PYTHON, "-c", _ASK, name], stdin=None, timeout_s=30)
    return reply.stdout.strip()


def test_machines_under_souq_dev_find_each_other_by_name(tmp_path: Path, dev_data: Path) -> None:
    dev = _Dev(dev_data, tmp_path / "dev.out")
    try:
        client = dev.ready()
        app = "names" + uuid.uuid4().hex[:8]
        client.create_app(app)
        a, b = _server(client, app), _server(client, app)
        assert a.private_ip and b.private_ip and a.private_ip != b.private_ip
        workers = {w.id for w in client.workers()}
        assert len(workers) == 2

        want = " ".join(
            f"{m.private_ip}={m.id}" for m in sorted((a, b), key=lambda m: m.private_ip)
        )
        got = wait_until(
            lambda: (said := _ask(client, app, a, f"{app}.internal")) == want and said,
            timeout=30,
            message=f"{app}.internal to answer both machines, each reached by that name",
        )
        assert got == want
        assert _ask(client, app, a, f"{b.id}.vm.{app}.internal") == f"{b.private_ip}={b.id}"
        assert _ask(client, app, a, f"no{uuid.uuid4().hex[:6]}.internal").startswith("FAIL")

        # The names are answered by `souq dev` itself; no agent holds the view's credential.
        for held in (dev_data / "agent-auth").iterdir():
            assert not (held / "nats" / "view.nk").exists()
    finally:
        dev.stop()


def test_two_souq_devs_on_one_host_answer_their_own_names(
    tmp_path: Path, dev_data: Path, request: pytest.FixtureRequest
) -> None:
    other_data = Path(tempfile.mkdtemp(prefix="souq-dev-names-", dir="/tmp"))
    other_data.chmod(0o755)
    request.addfinalizer(lambda: shutil.rmtree(other_data, ignore_errors=True))
    first, second = _Dev(dev_data, tmp_path / "one.out"), _Dev(other_data, tmp_path / "two.out")
    try:
        one, two = first.ready(), second.ready()
        app = "twice" + uuid.uuid4().hex[:8]  # the same app name on both clusters
        one.create_app(app)
        two.create_app(app)
        a, b = _server(one, app), _server(two, app)
        for client, m in ((one, a), (two, b)):
            want = f"{m.private_ip}={m.id}"
            wait_until(
                lambda client=client, m=m, want=want: (
                    _ask(client, app, m, f"{app}.internal") == want
                ),
                timeout=30,
                message=f"{app}.internal of each cluster to answer its own machine alone",
            )
    finally:
        first.stop()
        second.stop()
