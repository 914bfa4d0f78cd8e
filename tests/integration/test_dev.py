"""`souq dev` starts a whole cluster and, on SIGINT or SIGTERM, leaves no process behind."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import httpx
import psutil
import pytest

from souq.dev import lock_data_dir
from souq.natsserver import free_port
from souq.testing import wait_until


def _cmdline(proc: psutil.Process) -> list[str]:
    """``proc``'s command line; none for one that has exited meanwhile (a zombie has none)."""
    try:
        return proc.cmdline()
    except psutil.Error:
        return []


def _kill_tree(dev: subprocess.Popen[bytes]) -> None:
    """A test that failed before `souq dev` stopped: kill it and all it started (NATS nodes,
    agents, machines), so that nothing outlives the test."""
    if dev.poll() is not None:
        return
    with contextlib.suppress(psutil.Error):
        tree = psutil.Process(dev.pid).children(recursive=True)
        os.kill(dev.pid, signal.SIGKILL)
        dev.wait()
        for proc in tree:
            with contextlib.suppress(psutil.Error):
                proc.kill()


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _name(p: psutil.Process) -> str:
    """A process's name; "" for one that ended meanwhile (the agents run short-lived programs:
    ``ip``, ``ping``, ``nft``)."""
    try:
        return str(p.name())
    except psutil.Error:
        return ""


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_dev_runs_machines_and_stops_everything(
    tmp_path: Path, sig: int, request: pytest.FixtureRequest
) -> None:
    port, nats_port, proxy_port = free_port(), free_port(), free_port()
    # Machines run as the default user (nobody, this test being root): their data dir must be
    # one that user can reach, as /var/lib/souq/dev is (pytest's own tmp dir is 0700).
    data = Path(tempfile.mkdtemp(prefix="souq-dev-test-", dir="/tmp"))
    data.chmod(0o755)
    request.addfinalizer(lambda: shutil.rmtree(data, ignore_errors=True))
    python = shutil.which("python3", path="/usr/bin:/bin")  # one the machines' user can run
    assert python is not None
    out = tmp_path / "dev.out"
    with open(out, "wb") as sink:
        dev = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "souq",
                "dev",
                "--port",
                str(port),
                "--nats-port",
                str(nats_port),
                "--proxy-port",
                str(proxy_port),
                "--regions",
                "mad,syd",
                "--workers-per-region",
                "1",
                "--data-dir",
                str(data),
            ],
            stdout=sink,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
    api = f"http://127.0.0.1:{port}"
    try:
        wait_until(
            lambda: f"NATS: nats://127.0.0.1:{nats_port}" in out.read_text(),
            timeout=60,
            message="the ready banner",
        )
        assert api in out.read_text()
        token_file = data / "admin.token"
        assert f"token: {token_file}" in out.read_text()
        assert token_file.stat().st_mode & 0o777 == 0o600
        auth = {"Authorization": f"Bearer {token_file.read_text().strip()}"}
        assert httpx.get(f"{api}/v1/workers").status_code == 401  # no token, no answer
        proxy = f"http://127.0.0.1:{proxy_port}"
        assert f"proxy: {proxy} (a request for APP.localhost reaches app APP)" in out.read_text()
        # The quick start's app, through the proxy.
        r = httpx.post(
            f"{api}/v1/apps/hello/machines",
            json={
                "region": "mad",
                "config": {
                    "cmd": ["sh", "-c", f"exec {python} -m http.server $PORT"],
                    "services": [{"internal_port": 8080}],
                },
            },
            headers=auth,
            timeout=30,
        )
        assert r.status_code == 201, r.text
        served = wait_until(
            lambda: (
                (r := httpx.get(proxy, headers={"Host": "hello.localhost"}, timeout=10))
                and r.status_code == 200
                and r
            ),
            message="the app through the proxy",
        )
        assert "Directory listing" in served.text
        httpx.delete(
            f"{api}/v1/apps/hello/machines/{r.json()['id']}",
            params={"force": "true"},
            headers=auth,
        )
        workers = httpx.get(f"{api}/v1/workers", headers=auth).json()
        assert sorted(w["region"] for w in workers) == ["mad", "syd"]
        assert httpx.get(f"{api}/healthz").status_code == 200

        # A machine whose process has a child of its own, in each region.
        for region in ("mad", "syd"):
            r = httpx.post(
                f"{api}/v1/apps/dev/machines",
                json={
                    "region": region,
                    "config": {"cmd": ["sh", "-c", "sleep 600 & exec sleep 601"]},
                },
                headers=auth,
                timeout=30,
            )
            assert r.status_code == 201, r.text
        tree = wait_until(
            lambda: (
                (d := psutil.Process(dev.pid).children(recursive=True))
                and sum(1 for p in d if _name(p) == "sleep") == 4
                and d
            ),
            timeout=10,
            message="both machines and their children",
        )
        pids = [p.pid for p in tree]
        assert any(_name(p) == "nats-server" for p in tree)

        dev.send_signal(sig)
        assert dev.wait(60) == 0
        leftover = [pid for pid in pids if _alive(pid)]
        assert leftover == [], f"processes left behind: {leftover}"
        with pytest.raises(OSError):
            socket.create_connection(("127.0.0.1", nats_port), timeout=0.5).close()
    finally:
        _kill_tree(dev)


def test_dev_on_a_nats_cluster_survives_a_node(
    tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """`souq dev --nats-cluster 3`: three clustered nats-servers, every daemon given all three;
    one killed, the cluster goes on; on SIGTERM nothing is left."""
    port, nats_port, proxy_port = free_port(), free_port(), free_port()
    data = Path(tempfile.mkdtemp(prefix="souq-dev-test-", dir="/tmp"))
    data.chmod(0o755)
    request.addfinalizer(lambda: shutil.rmtree(data, ignore_errors=True))
    out = tmp_path / "dev.out"
    args = ["--port", str(port), "--nats-port", str(nats_port), "--proxy-port", str(proxy_port)]
    args += ["--nats-cluster", "3", "--regions", "mad", "--workers-per-region", "2"]
    with open(out, "wb") as sink:
        dev = subprocess.Popen(
            [sys.executable, "-m", "souq", "dev", *args, "--data-dir", str(data)],
            stdout=sink,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
    api = f"http://127.0.0.1:{port}"
    try:
        banner = wait_until(
            lambda: next(
                (ln for ln in out.read_text().splitlines() if ln.strip().startswith("NATS:")), None
            ),
            timeout=90,
            message="the ready banner",
        )
        urls = banner.split("NATS:", 1)[1].strip().split(",")
        assert len(urls) == 3 and urls[0] == f"nats://127.0.0.1:{nats_port}", banner
        servers = [p for p in psutil.Process(dev.pid).children() if _name(p) == "nats-server"]
        assert len(servers) == 3
        auth = {"Authorization": f"Bearer {(data / 'admin.token').read_text().strip()}"}
        broker_node = httpx.get(f"{api}/healthz", headers=auth).json()["nats_server"]
        assert f"nats://{broker_node}" in urls
        # The node the broker is connected to dies, as a crash would.
        broker_port = int(broker_node.rsplit(":", 1)[1])
        victim = next(
            p
            for p in servers
            if broker_port
            in {c.laddr.port for c in p.net_connections(kind="tcp") if c.status == "LISTEN"}
        )
        victim.kill()

        def created() -> httpx.Response | None:
            r = httpx.post(
                f"{api}/v1/apps/dev/machines",
                json={"region": "mad", "config": {"cmd": ["sleep", "600"]}},
                headers={**auth, "Idempotency-Key": "after-the-node"},
                timeout=30,
            )
            assert r.status_code in (201, 503), r.text  # 503: the broker is moving nodes
            return r if r.status_code == 201 else None

        made = wait_until(created, timeout=60, message="a create with a NATS node dead")
        assert httpx.get(f"{api}/healthz", headers=auth).json()["nats_server"] != broker_node
        listed = httpx.get(f"{api}/v1/apps/dev/machines", headers=auth).json()
        assert [m["id"] for m in listed] == [made.json()["id"]]
        tree = [p.pid for p in psutil.Process(dev.pid).children(recursive=True)]
        dev.send_signal(signal.SIGTERM)
        assert dev.wait(60) == 0
        assert [pid for pid in tree if _alive(pid)] == []
    finally:
        _kill_tree(dev)


def _start_dev(
    data: Path, out: Path, ports: tuple[int, int, int], *extra: str
) -> subprocess.Popen[bytes]:
    port, nats_port, proxy_port = ports
    args = ["--port", str(port), "--nats-port", str(nats_port), "--proxy-port", str(proxy_port)]
    with open(out, "wb") as sink:
        return subprocess.Popen(
            [sys.executable, "-m", "souq", "dev", *args, "--data-dir", str(data), *extra],
            stdout=sink,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )


def _wait_banner(dev: subprocess.Popen[bytes], out: Path) -> str:
    def ready() -> str | None:
        assert dev.poll() is None, out.read_text()
        text = out.read_text()
        return text if "Press Ctrl-C" in text else None

    return wait_until(ready, timeout=90, message="the ready banner")


def _snapshot(data: Path) -> tuple[set[str], bytes]:
    """The paths of the cluster's state (its workers' and NATS's) and its NATS config."""
    paths = {
        str(p.relative_to(data))
        for sub in ("workers", "nats")
        for p in (data / sub).rglob("*")
        if p.suffix not in {".log", ".tmp"}
    }
    return paths, (data / "nats.conf").read_bytes()


def test_a_second_dev_on_the_same_directory_refuses_and_a_restart_keeps_the_cluster(
    tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """The lock on the data directory: a second `souq dev` beside a running one refuses
    before touching anything (exit 1, naming the directory and the pid), the first goes on;
    once the first stops, a new one starts on the same directory and finds its machine."""
    ports = (free_port(), free_port(), free_port())
    data = Path(tempfile.mkdtemp(prefix="souq-dev-test-", dir="/tmp"))
    data.chmod(0o755)
    request.addfinalizer(lambda: shutil.rmtree(data, ignore_errors=True))
    api = f"http://127.0.0.1:{ports[0]}"
    one = "--regions", "mad", "--workers-per-region", "2"
    first = _start_dev(data, tmp_path / "first.out", ports, *one)
    try:
        banner = _wait_banner(first, tmp_path / "first.out")
        auth = {"Authorization": f"Bearer {(data / 'admin.token').read_text().strip()}"}
        made = httpx.post(
            f"{api}/v1/apps/kept/machines",
            json={"region": "mad", "config": {"cmd": ["sleep", "600"]}},
            headers=auth,
            timeout=30,
        )
        assert made.status_code == 201, made.text
        before = _snapshot(data)

        second = subprocess.run(
            [sys.executable, "-m", "souq", "dev", "--data-dir", str(data), "--port",
             str(ports[0]), "--nats-port", str(ports[1]), "--proxy-port", str(ports[2]), *one],
            capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL, check=False,
        )  # fmt: skip
        assert second.returncode == 1, second.stderr
        assert f"already running on {data} (pid {first.pid})" in second.stderr
        assert first.poll() is None
        after = _snapshot(data)
        assert before[0] <= after[0]  # nothing of the cluster's state was removed
        assert after[1] == before[1]  # nor its NATS users rewritten
        workers = httpx.get(f"{api}/v1/workers", headers=auth, timeout=10)
        assert workers.status_code == 200 and len(workers.json()) == 2

        # Each worker offers its share of the host's memory, not all of it.
        total_mb = psutil.virtual_memory().total // (1024 * 1024)
        assert all(w["capacity"]["memory_mb"] == total_mb // 2 for w in workers.json())

        # The banner's CLI is one that runs from here, not a bare `souq` off the PATH.
        souq = banner.split("Try: ", 1)[1].split(" machine run", 1)[0]
        runs = subprocess.run(
            [*souq.split(), "--help"], capture_output=True, timeout=60, check=False
        )
        assert runs.returncode == 0, (souq, runs.stderr)

        first.send_signal(signal.SIGTERM)
        assert first.wait(60) == 0
    finally:
        _kill_tree(first)

    again = _start_dev(data, tmp_path / "again.out", ports, *one)
    try:
        _wait_banner(again, tmp_path / "again.out")
        listed = httpx.get(f"{api}/v1/apps/kept/machines", headers=auth, timeout=10).json()
        assert [m["id"] for m in listed] == [made.json()["id"]]  # the restart kept it
        again.send_signal(signal.SIGTERM)
        assert again.wait(60) == 0
    finally:
        _kill_tree(again)


def test_the_workers_of_a_killed_dev_keep_its_directory_locked(
    tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """`souq dev` killed with -9 leaves its agents running on their files: they inherited the
    lock, so a new `souq dev` there refuses until they are gone, saying so."""
    ports = (free_port(), free_port(), free_port())
    data = Path(tempfile.mkdtemp(prefix="souq-dev-test-", dir="/tmp"))
    data.chmod(0o755)
    request.addfinalizer(lambda: shutil.rmtree(data, ignore_errors=True))
    one = "--regions", "mad", "--workers-per-region", "1"
    dev = _start_dev(data, tmp_path / "dev.out", ports, *one)
    tree: list[psutil.Process] = []
    try:
        _wait_banner(dev, tmp_path / "dev.out")
        tree = psutil.Process(dev.pid).children(recursive=True)
        agents = [p for p in tree if "agent" in _cmdline(p)]
        assert len(agents) == 1
        os.kill(dev.pid, signal.SIGKILL)
        dev.wait()
        second = subprocess.run(
            [sys.executable, "-m", "souq", "dev", "--data-dir", str(data), *one],
            capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL, check=False,
        )  # fmt: skip
        assert second.returncode == 1, second.stderr
        assert f"(pid {dev.pid}, which has exited: a worker agent" in second.stderr
        assert agents[0].is_running()
    finally:
        _kill_tree(dev)
        for proc in tree:
            with contextlib.suppress(psutil.Error):
                proc.kill()
        psutil.wait_procs(tree, timeout=10)
    os.close(lock_data_dir(data))  # the agents gone, the lock is free again
