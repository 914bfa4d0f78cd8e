"""The locked-down bus, on a real nats-server run from `souq cluster init`'s nats.conf: who may
connect, publish and subscribe where, JetStream included, and TLS."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path

import nats.errors
import nats.js.errors
import nkeys
import pytest
from nats.aio.client import Client
from nats.aio.msg import Msg

from souq.auth.bus import NatsCredential, add_agent, credential, init_bus
from souq.auth.files import AuthDir
from souq.bus.nats import connect, flush_subscriptions
from souq.dev import start_agent_process
from souq.errors import Unauthorized, Unavailable
from souq.images.store import ImageStore
from souq.natsserver import NatsServer
from souq.procs import terminate
from souq.testing import eventually, wait_until

SETTLE_S = 0.3  # for a message that should not arrive, or for a refusal the server sends


@dataclass
class Server:
    auth: AuthDir
    nats: NatsServer
    workers: tuple[str, str]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    root = tmp_path_factory.mktemp("bus")
    auth = AuthDir.create(root / "auth")
    init_bus(auth)
    a = add_agent(auth, "wa")
    b = add_agent(auth)
    with NatsServer(store_dir=root / "nats", config=auth.nats_conf) as nats_server:
        yield Server(auth, nats_server, (a, b))


@dataclass
class Conn:
    nc: Client
    errors: list[str] = field(default_factory=list)

    def violations(self) -> list[str]:
        return [e for e in self.errors if "permissions violation" in e.lower()]

    async def collect(self, subject: str) -> list[Msg]:
        got: list[Msg] = []

        async def on(msg: Msg) -> None:
            got.append(msg)

        await self.nc.subscribe(subject, cb=on)
        await flush_subscriptions(self.nc)
        return got


async def settle(*expected: tuple[Conn, int]) -> None:
    """Until each connection was told of its expected number of refusals (they come apart
    from the calls that caused them), then a moment for anything else that should not come."""
    await eventually(
        lambda: all(len(c.violations()) >= n for c, n in expected),
        timeout=5,
        message=f"the refusals {[n for _, n in expected]}",
    )
    await asyncio.sleep(SETTLE_S)


@asynccontextmanager
async def conn(server: Server, user: str) -> AsyncIterator[Conn]:
    c = Conn(nc=Client())

    async def on_error(exc: Exception) -> None:
        c.errors.append(str(exc))

    cred = credential(server.auth, user)
    await c.nc.connect(server.nats.url, error_cb=on_error, allow_reconnect=False, **cred.options())
    try:
        yield c
    finally:
        await c.nc.close()


def agent(server: Server, i: int) -> str:
    return f"agent-{server.workers[i]}"


def test_a_client_without_credentials_is_refused(server: Server) -> None:
    async def main() -> None:
        with pytest.raises(Unauthorized, match="without one"):
            await connect(server.nats.url, name="anonymous", connect_timeout=2)

    asyncio.run(main())


def test_an_nkey_the_server_does_not_know_is_refused(server: Server) -> None:
    seed = nkeys.encode_seed(os.urandom(32), nkeys.PREFIX_BYTE_USER).decode()
    stranger = NatsCredential(user="broker", seed=seed)

    async def main() -> None:
        with pytest.raises(Unauthorized, match="broker credential"):
            await connect(server.nats.url, name="stranger", connect_timeout=2, credential=stranger)

    asyncio.run(main())


def test_a_role_connects_with_its_credential(server: Server) -> None:
    async def main() -> None:
        t = await connect(server.nats.url, name="b", credential=credential(server.auth, "broker"))
        assert t.connected
        await t.close()

    asyncio.run(main())


def test_an_agent_cannot_command_workers_nor_speak_as_another(server: Server) -> None:
    a, b = server.workers

    async def main() -> None:
        async with (
            conn(server, agent(server, 0)) as mallory,
            conn(server, agent(server, 1)) as other,
            conn(server, "broker") as broker,
        ):
            to_other = await other.collect("souq.worker.*.*")
            broadcasts = await other.collect("souq.all.*")
            beats = await broker.collect("souq.hb.>")
            events = await broker.collect("souq.evt.>")
            usage = await broker.collect("souq.use.>")
            for subject in (
                "souq.all.list",
                f"souq.worker.{b}.destroy",
                f"souq.hb.mad.{b}",
                f"souq.evt.mad.{b}",
                f"souq.use.mad.{b}",
                "souq.discover",
                "$KV.souq-images.x",
                "$JS.API.STREAM.DELETE.KV_souq-images",
            ):
                await mallory.nc.publish(subject, b"{}")
            await mallory.nc.publish(f"souq.hb.mad.{a}", b"{}")  # its own: allowed
            await flush_subscriptions(mallory.nc)
            await settle((mallory, 8))
            assert to_other == [] and broadcasts == [] and events == [] and usage == []
            assert [m.subject for m in beats] == [f"souq.hb.mad.{a}"]
            assert len(mallory.violations()) == 8, mallory.errors

    asyncio.run(main())


def test_an_agent_cannot_listen_beyond_its_own_verbs(server: Server) -> None:
    b = server.workers[1]

    async def main() -> None:
        async with conn(server, agent(server, 0)) as mallory:
            for subject in (f"souq.worker.{b}.*", "souq.>", "souq.evt.>", "_INBOX.broker.>", ">"):
                await mallory.nc.subscribe(subject)
            await flush_subscriptions(mallory.nc)
            await settle((mallory, 5))
            assert len(mallory.violations()) == 5, mallory.errors

    asyncio.run(main())


def test_replies_reach_only_the_requester(server: Server) -> None:
    a = server.workers[0]

    async def main() -> None:
        async with (
            conn(server, agent(server, 0)) as worker,
            conn(server, agent(server, 1)) as snoop,
            conn(server, "broker") as broker,
            conn(server, "proxy") as proxy,
        ):

            async def answer(msg: Msg) -> None:
                await worker.nc.publish(msg.reply, b"config of " + msg.subject.encode())

            await worker.nc.subscribe(f"souq.worker.{a}.*", cb=answer)
            await flush_subscriptions(worker.nc)
            await snoop.nc.subscribe("_INBOX.>")
            reply = await broker.nc.request(f"souq.worker.{a}.get", b"{}", timeout=2)
            assert reply.data == f"config of souq.worker.{a}.get".encode()
            reply = await proxy.nc.request(f"souq.worker.{a}.start", b"{}", timeout=2)
            assert reply.data.endswith(b".start")
            # the proxy may wake and stop machines, not destroy them
            with pytest.raises(nats.errors.TimeoutError):
                await proxy.nc.request(f"souq.worker.{a}.destroy", b"{}", timeout=SETTLE_S)
            # a reply only answers a request received: the worker cannot publish to inboxes
            await worker.nc.publish("_INBOX.broker.x", b"unasked")
            await flush_subscriptions(worker.nc)
            await settle((snoop, 1), (worker, 1), (proxy, 1))
            assert len(snoop.violations()) == 1, snoop.errors
            assert len(worker.violations()) == 1, worker.errors
            assert len(proxy.violations()) == 1, proxy.errors
            assert broker.violations() == []

    asyncio.run(main())


def test_a_workers_names_read_the_view_and_nothing_more(server: Server) -> None:
    """``names-<W>`` (made with the agent): heartbeats, events and the view's sync verbs; not
    usage, not a command, not another bucket, not another user's inbox."""
    a, b = server.workers

    async def main() -> None:
        async with (
            conn(server, f"names-{a}") as names,
            conn(server, agent(server, 1)) as worker,
        ):
            beats = await names.collect("souq.hb.>")
            events = await names.collect("souq.evt.>")

            async def answer(msg: Msg) -> None:
                await worker.nc.publish(msg.reply, b"the list")

            await worker.nc.subscribe(f"souq.worker.{b}.*", cb=answer)
            await flush_subscriptions(worker.nc)
            await worker.nc.publish(f"souq.hb.mad.{b}", b"{}")
            await worker.nc.publish(f"souq.evt.mad.{b}", b"{}")
            reply = await names.nc.request(f"souq.worker.{b}.list", b"{}", timeout=2)
            assert reply.data == b"the list"
            await eventually(lambda: len(beats) == len(events) == 1, timeout=5, message="both")
            for subject in ("souq.use.>", "souq.worker.*.*", "_INBOX.broker.>"):
                await names.nc.subscribe(subject)
            for subject in (
                f"souq.worker.{b}.start",
                f"souq.worker.{b}.destroy",
                f"souq.hb.mad.{b}",
                "$JS.API.STREAM.INFO.KV_souq-secrets",
            ):
                await names.nc.publish(subject, b"{}")
            await flush_subscriptions(names.nc)
            await settle((names, 7))
            assert len(names.violations()) == 7, names.errors

    asyncio.run(main())


def test_brokers_own_the_stores_and_agents_read_images(server: Server) -> None:
    data = os.urandom(300_000)
    digest = "sha256:" + __import__("hashlib").sha256(data).hexdigest()

    async def main() -> None:
        async with conn(server, "broker") as broker, conn(server, agent(server, 0)) as worker:
            store = await ImageStore.open(broker.nc)
            await store.blobs.put(digest.replace(":", "/"), data)
            await store.records.put("k", b"v")
            js = broker.nc.jetstream()
            releases = await js.create_key_value(bucket="souq-releases")
            await releases.put("app.1", b"a machine config")
            secrets = await js.create_key_value(bucket="souq-secrets")
            await secrets.put("app.KEY", b"sealed")

            mine = await ImageStore.open(worker.nc, make=False)  # as an agent opens it
            assert await mine.blob(digest) == data
            assert (await mine.records.get("k")).value == b"v"
            sealed = await worker.nc.jetstream().key_value("souq-secrets")
            assert (await sealed.get("app.KEY")).value == b"sealed"
            assert worker.violations() == [], worker.errors
            with pytest.raises((nats.errors.Error, nats.js.errors.Error)):
                await mine.records.put("k", b"overwritten")
            with pytest.raises((nats.errors.Error, nats.js.errors.Error, TimeoutError)):
                await worker.nc.jetstream(timeout=1).key_value("souq-releases")
            assert (await store.records.get("k")).value == b"v"
            assert broker.violations() == [], broker.errors

    asyncio.run(main())


def test_an_agent_added_later_connects_after_a_reload(server: Server) -> None:
    added = subprocess.run(
        [sys.executable, "-m", "souq", "cluster", "add-agent", str(server.auth.path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    late = added.stdout.strip()
    assert "reloaded" in added.stderr

    async def main() -> None:
        cred = credential(server.auth, f"agent-{late}")

        async def let_in() -> bool:
            try:
                t = await connect(server.nats.url, name="late", connect_timeout=1, credential=cred)
            except Unauthorized:
                return False
            await t.close()
            return True

        # The reload is a signal: the server reads the file soon after.
        await eventually(let_in, timeout=5, interval=0.1, message="the added agent let in")

    asyncio.run(main())


def test_an_agent_takes_its_id_from_its_credential_and_keeps_to_it(
    server: Server, tmp_path: Path
) -> None:
    a, b = server.workers
    data_dir = tmp_path / "worker"

    def start(worker_id: str) -> subprocess.Popen[bytes]:
        return start_agent_process(
            region="mad",
            nats_url=server.nats.url,
            data_dir=data_dir,
            auth_dir=server.auth.path,
            worker_id=worker_id,
            log_path=tmp_path / "agent.log",
        )

    agent = start(a)
    try:
        wait_until(
            lambda: f"souq agent {a} ready" in (tmp_path / "agent.log").read_text(),
            timeout=30,
            message="the agent to be ready as its credential's worker",
        )
    finally:
        terminate(agent, timeout=10)
    other = start(b)  # the same data dir, another worker's credential: refused
    assert other.wait(timeout=30) != 0
    assert f"belongs to worker {a}" in (tmp_path / "agent.log").read_text()


def test_tls_is_one_flag(tmp_path: Path) -> None:
    auth = AuthDir.create(tmp_path / "auth")
    init_bus(auth, tls_hosts=["nats.example"])
    with NatsServer(store_dir=tmp_path / "nats", config=auth.nats_conf) as nats_server:
        assert nats_server.url.startswith("tls://")

        async def main() -> None:
            cred = credential(auth, "broker")
            assert cred.ca is not None
            t = await connect(nats_server.url, name="tls", credential=cred)
            assert t.connected
            await t.close()
            # without the CA the server's certificate is not trusted
            bare = NatsCredential(user="broker", seed=cred.seed)
            with pytest.raises(Unavailable):
                await connect(nats_server.url, name="no-ca", connect_timeout=2, credential=bare)

        asyncio.run(main())


def test_add_agent_again_gives_an_older_worker_its_names_user(tmp_path: Path) -> None:
    """A worker added before the names' users existed: adding it again keeps its agent's seed
    and adds the names' one, and nats.conf then knows both."""
    auth = AuthDir.create(tmp_path / "auth")
    init_bus(auth)
    add_agent(auth, "old", reload=False)
    seed = credential(auth, "agent-old").seed
    (auth.nats_dir / "names-old.nk").unlink()  # as an earlier Souq left it
    assert add_agent(auth, "old", reload=False) == "old"
    assert credential(auth, "agent-old").seed == seed
    names = credential(auth, "names-old")
    assert names.seed != seed and (auth.nats_dir / "names-old.nk").stat().st_mode & 0o777 == 0o600
    conf = auth.nats_conf.read_text()
    assert "# names-old" in conf and "# agent-old" in conf
