"""A NATS cluster on "real hosts", from the configurations `souq cluster nats-node` writes:
three nats-server nodes (loopback, their own ports and store directories) run with `-c
DIR/nats-NODE.conf` and nothing else, with the auth directory's users, with and without TLS.
They form one cluster (every node routed to the two others, a key-value bucket kept in three
copies), and a node that does not hold the route secret is refused by all of them."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import nats
import pytest

from souq.auth.bus import credential, init_bus
from souq.auth.files import AuthDir
from souq.bus.subjects import PREFIX
from souq.natsserver import free_port, nats_server_binary
from souq.procs import terminate
from souq.testing import wait_until

NODES = ("n1", "n2", "n3")
SUBJECT = f"{PREFIX}.hb.rogue-test"  # one the fleet publishes and the broker reads


class Node:
    def __init__(
        self, auth: AuthDir, name: str, routes: str, root: Path, route_port: int = 0
    ) -> None:
        self.name = name
        self.client_port, self.monitor_port = free_port(), free_port()
        self.route_port = route_port or free_port()
        self.args = [
            "--name",
            name,
            "--routes",
            routes,
            "--listen",
            f"127.0.0.1:{self.route_port}",
            "--client-listen",
            f"127.0.0.1:{self.client_port}",
            "--monitor",
            f"127.0.0.1:{self.monitor_port}",
            "--store-dir",
            str(root / name),
        ]
        self.auth = auth
        self.conf = auth.path / f"nats-{name}.conf"
        self.process: subprocess.Popen[bytes] | None = None

    def write(self, *extra: str) -> subprocess.CompletedProcess[str]:
        return souq("cluster", "nats-node", str(self.auth.path), *self.args, *extra)

    def start(self, log: Path | None = None) -> None:
        out = log.open("wb") if log is not None else subprocess.DEVNULL
        self.process = subprocess.Popen(
            [str(nats_server_binary()), "-c", str(self.conf)],
            stdout=out,
            stderr=out,
        )
        if log is not None:
            out.close()  # type: ignore[union-attr]

    def stop(self) -> None:
        if self.process is not None:
            terminate(self.process, timeout=5)

    def monitor(self, path: str) -> dict[str, object]:
        r = httpx.get(f"http://127.0.0.1:{self.monitor_port}/{path}", timeout=2)
        body: dict[str, object] = r.json()
        return body

    def routed_to(self) -> set[str]:
        """The names of the nodes this one has a route with."""
        try:
            routes = self.monitor("routez")["routes"]
        except httpx.HTTPError:
            return set()
        assert isinstance(routes, list)
        return {str(r.get("remote_name", "")) for r in routes}


def souq(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "souq", *args],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
    )


def nodes_of(root: Path, *, tls: bool) -> tuple[AuthDir, list[Node]]:
    auth = AuthDir.create(root / "auth")
    init_bus(auth, tls_hosts=[] if tls else None)
    route_ports = [free_port() for _ in NODES]
    routes = ",".join(f"nats://127.0.0.1:{p}" for p in route_ports)
    nodes = [
        Node(auth, name, routes, root, port) for name, port in zip(NODES, route_ports, strict=True)
    ]
    return auth, nodes


@pytest.fixture(scope="module", params=["plain", "tls"])
def cluster(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[AuthDir, list[Node], bool]]:
    tls = request.param == "tls"
    auth, nodes = nodes_of(tmp_path_factory.mktemp(f"nodes-{request.param}"), tls=tls)
    try:
        for node in nodes:
            done = node.write()
            assert done.returncode == 0, done.stderr
            node.start()
        for node in nodes:
            others = set(NODES) - {node.name}
            wait_until(
                lambda n=node, o=others: n.routed_to() >= o,  # type: ignore[misc]
                timeout=20,
                message=f"{node.name} routed to {others}",
            )
        yield auth, nodes, tls
    finally:
        for node in nodes:
            node.stop()


def test_the_nodes_form_one_cluster_with_authenticated_routes(
    cluster: tuple[AuthDir, list[Node], bool],
) -> None:
    auth, nodes, tls = cluster
    for node in nodes:
        assert node.conf.stat().st_mode & 0o777 == 0o600
        assert (auth.nats_dir / "route.secret").stat().st_mode & 0o777 == 0o600
        assert node.routed_to() == set(NODES) - {node.name}
        varz = node.monitor("varz")
        cluster_info = varz["cluster"]
        assert isinstance(cluster_info, dict)
        assert cluster_info["name"] == "souq"
        assert cluster_info.get("tls_required", False) is tls
        # each node wrote its own pid file, beside nats.conf (add-agent reloads every one)
        pid = (auth.path / f"nats-server-{node.name}.pid").read_text().strip()
        assert node.process is not None and int(pid) == node.process.pid


def test_a_bucket_keeps_three_copies(cluster: tuple[AuthDir, list[Node], bool]) -> None:
    auth, nodes, tls = cluster
    scheme = "tls" if tls else "nats"
    servers = [f"{scheme}://127.0.0.1:{n.client_port}" for n in nodes]

    async def put_and_read() -> tuple[int, bytes]:
        nc = await nats.connect(servers=servers, **credential(auth, "broker").options())
        try:
            js = nc.jetstream()
            kv = await js.create_key_value(bucket="souq-ops-test", replicas=3)
            await kv.put("k", b"v")
            info = await js.stream_info("KV_souq-ops-test")
            assert info.cluster is not None
            copies = 1 + len(info.cluster.replicas or [])
            return copies, (await kv.get("k")).value or b""
        finally:
            await nc.close()

    copies, value = wait_until(
        lambda: _retrying(put_and_read), timeout=30, message="a bucket in three copies"
    )
    assert (copies, value) == (3, b"v")


def _retrying(step: object) -> object:
    """One try of an async step; None while JetStream has no leader yet."""
    try:
        return asyncio.run(step())  # type: ignore[operator]
    except (nats.errors.Error, nats.js.errors.Error, OSError):
        return None


def test_a_node_without_the_route_secret_is_refused(
    cluster: tuple[AuthDir, list[Node], bool], tmp_path: Path
) -> None:
    auth, nodes, tls = cluster
    routes = ",".join(f"nats://127.0.0.1:{n.route_port}" for n in nodes)
    rogue = Node(auth, "n9", routes, tmp_path)
    done = rogue.write()
    assert done.returncode == 0, done.stderr
    secret = (auth.nats_dir / "route.secret").read_text().strip()
    rogue.conf.write_text(rogue.conf.read_text().replace(secret, "not-the-secret"))
    rogue.start(log=tmp_path / "n9.log")
    try:
        wait_until(lambda: _serving(rogue), timeout=10, message="the rogue node serving")

        # each node's refusal shows in the rogue's log; until then, and after, no node of the
        # cluster ever lists the rogue as a route
        def refused() -> bool:
            for node in nodes:
                assert "n9" not in node.routed_to()
            return "authorization violation" in (tmp_path / "n9.log").read_text().lower()

        wait_until(refused, timeout=20, message="the rogue's routes refused")
        servers = [f"{'tls' if tls else 'nats'}://127.0.0.1:{n.client_port}" for n in nodes]
        rogue_url = f"{'tls' if tls else 'nats'}://127.0.0.1:{rogue.client_port}"
        assert asyncio.run(_crosses(auth, servers, rogue_url)) == (True, False)
        for node in nodes:
            assert "n9" not in node.routed_to()
    finally:
        rogue.stop()


async def _crosses(auth: AuthDir, servers: list[str], rogue_url: str) -> tuple[bool, bool]:
    """Whether a message published on n1 reaches a subscriber on n2, and one on the rogue:
    n2's copy arrives first, so the rogue had as long to receive its own."""
    options = credential(auth, "broker").options()  # may read what the fleet publishes
    pub = await nats.connect(servers=servers[:1], **credential(auth, "fleet").options())
    member = await nats.connect(servers=servers[1:2], **options)
    rogue = await nats.connect(servers=[rogue_url], **options)
    try:
        at_member, at_rogue = await member.subscribe(SUBJECT), await rogue.subscribe(SUBJECT)
        await member.flush()
        await rogue.flush()
        reached = False
        for _ in range(50):  # interest in n2 spreads to n1 over the route: publish until seen
            await pub.publish(SUBJECT, b"x")
            await pub.flush()
            try:
                await at_member.next_msg(timeout=0.2)
            except nats.errors.TimeoutError:
                continue
            reached = True
            break
        await rogue.flush()
        return reached, bool(at_rogue.pending_msgs)
    finally:
        for nc in (pub, member, rogue):
            await nc.close()


def _serving(node: Node) -> bool:
    try:
        node.monitor("varz")
    except httpx.HTTPError:
        return False
    return True


def test_bad_input_is_refused_with_a_hint(tmp_path: Path) -> None:
    auth = AuthDir.create(tmp_path / "auth")
    no_conf = souq("cluster", "nats-node", str(auth.path), "--name", "n1", "--routes", "nats://h:1")
    assert no_conf.returncode != 0 and "souq cluster init" in no_conf.stderr
    init_bus(auth)
    for args, said in (
        (["--name", "n 1", "--routes", "nats://h:6222"], "node name"),
        (["--name", "n1", "--routes", "http://h:6222"], "nats://HOST:PORT"),
        (["--name", "n1", "--routes", "nats://u:p@h:6222"], "more than a host"),
        (["--name", "n1", "--routes", "nats://h"], "nats://HOST:PORT"),
        (["--name", "n1", "--routes", "nats://h:6222", "--gateway", "syd"], "NAME=URL"),
        (["--name", "n1", "--routes", "nats://h:6222", "--gateway", "syd=nats://s:7222"], "listen"),
        (["--name", "n1", "--routes", "nats://h:6222", "--listen", "6222"], "HOST:PORT"),
    ):
        done = souq("cluster", "nats-node", str(auth.path), *args)
        assert done.returncode != 0, args
        assert said in done.stderr, (args, done.stderr)
    assert not list(auth.path.glob("nats-n*.conf"))
