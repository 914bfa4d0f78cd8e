"""A hostile tenant against the image path's resources (issue 31, point 7), on a real cluster:
a gzip bomb against a worker's bounded cache, unsafe layer entries at import, and large
uploads against a broker's memory. Each used to get through: the bomb unpacked whole past the
cache's bound, import checked only digests, and a broker held every upload in memory."""

from __future__ import annotations

import os
import select
import socket
import tarfile
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import psutil
import pytest

from souq.images import layout_tar, pack_directory
from souq.model.machine import MachineState
from souq.testing import Cluster, wait_until
from tests.clusters import ClusterSpec, agent
from tests.tenancy.image_layouts import (
    add_entry,
    add_file,
    file_chunks,
    gzip_bomb,
    image_of_layer,
    large_layout,
    layer_tar,
)

MiB = 1 << 20
CACHE_MB = 32


CLUSTER = ClusterSpec(
    "tenancy-bounds", regions={}, cpus=16, agents=(agent("mad", image_cache_mb=CACHE_MB),)
)


def _token(cluster: Cluster, app: str, name: str = "") -> str:
    with cluster.client() as admin:
        token = admin.create_token(app=app, scope="deploy", name=name or f"ci of {app}").token
    assert token
    return token


def _http(cluster: Cluster, token: str, timeout: float = 120) -> httpx.Client:
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/x-tar"}
    return httpx.Client(base_url=cluster.api_url, headers=headers, timeout=timeout)


def _tree_bytes(path: Path) -> int:
    total = 0
    for dirpath, _, files in os.walk(path):
        for name in files:
            total += os.lstat(os.path.join(dirpath, name)).st_size
    return total


def test_a_gzip_bomb_stops_at_the_cache_bound_and_leaves_nothing(cluster: Cluster) -> None:
    bomb = gzip_bomb(4 * CACHE_MB * MiB, cmd=["true"])  # some KiB that inflate to 4x the bound
    assert bomb.layers[0].size < 2 * MiB
    token = _token(cluster, "bomber")
    with cluster.client(token=token) as client:
        client.push_image(layout_tar(bomb), name="bomb:1")
        machine = client.create_machine(
            "bomber", "mad", {"image": "bomb:1", "restart": {"policy": "no"}}
        )
        failed = client.wait("bomber", machine.id, MachineState.FAILED, timeout=120)
    said = " ".join(e.message or "" for e in failed.events)
    assert "unpacks to more than" in said, said
    assert "image cache" in said, said
    images = cluster.agents[0].data_dir / "images"
    assert _tree_bytes(images) <= CACHE_MB * MiB
    assert not [p for p in (images / "images").iterdir() if p.name.endswith(".unpacking")]
    assert not list((images / "blobs" / "sha256").iterdir())  # its blob went with it


def _through(tar: tarfile.TarFile, link: str, target: str, written: str) -> None:
    """A symlink, then a file written through it."""
    add_entry(tar, link, tarfile.SYMTYPE, target)
    add_file(tar, written, b"x")


HOSTILE: dict[str, tuple[Callable[[tarfile.TarFile], None], str]] = {
    "dot-dot": (lambda t: add_file(t, "../escape.txt", b"x"), "'../escape.txt'"),
    "absolute": (lambda t: add_file(t, "/etc/cron.d/evil", b"x"), "'/etc/cron.d/evil'"),
    "device": (lambda t: add_entry(t, "dev/sda", tarfile.BLKTYPE), "'dev/sda'"),
    "char-device": (lambda t: add_entry(t, "dev/mem", tarfile.CHRTYPE), "'dev/mem'"),
    "fifo": (lambda t: add_entry(t, "pipe", tarfile.FIFOTYPE), "'pipe'"),
    # A symlink may point anywhere (it resolves in the machine's root), a write through it not.
    "symlink": (
        lambda t: _through(t, "app/up", "../../etc", "app/up/cron.d/evil"),
        "'app/up/cron.d/evil'",
    ),
    "absolute-symlink": (lambda t: _through(t, "etc", "/etc", "etc/shadow"), "'etc/shadow'"),
    "hard-link": (
        lambda t: add_entry(t, "passwd", tarfile.LNKTYPE, "../../etc/passwd"),
        "'passwd'",
    ),
}


@pytest.mark.parametrize("kind", sorted(HOSTILE))
def test_an_unsafe_layer_is_refused_at_import_naming_its_entry(cluster: Cluster, kind: str) -> None:
    add, entry = HOSTILE[kind]
    image = image_of_layer(
        layer_tar(lambda t: (add_file(t, "ok.txt", b"fine"), add(t))), cmd=["true"]
    )
    with _http(cluster, _token(cluster, "importer")) as http:
        r = http.post("/v1/images", params={"name": f"hostile-{kind}:1"}, content=layout_tar(image))
    assert r.status_code == 422, r.text
    assert r.json()["status"] == "image_invalid"
    assert entry in r.json()["error"] and image.layers[0].digest in r.json()["error"]
    with cluster.client() as admin:
        assert image.reference not in {x.reference for x in admin.images()}


def test_concurrent_large_uploads_do_not_grow_the_brokers_memory(
    cluster: Cluster, tmp_path: Path
) -> None:
    # Four uploads of 100 MiB: a broker that held two of them whole would grow past the bound.
    size = 100 * MiB
    layouts = [
        large_layout(tmp_path / f"big-{i}.tar", size, f"upload {i}".encode()) for i in range(4)
    ]
    tokens = [_token(cluster, f"big{i}") for i in range(4)]
    broker = psutil.Process(cluster.brokers[0].pid)
    before = broker.memory_info().rss
    peak = before
    done = threading.Event()

    def sample() -> None:
        nonlocal peak
        while not done.is_set():
            peak = max(peak, broker.memory_info().rss)
            done.wait(0.05)

    def upload(i: int) -> httpx.Response:
        with _http(cluster, tokens[i], timeout=600) as http:
            length = str(layouts[i].stat().st_size)
            return http.post(
                "/v1/images",
                params={"name": f"big:{i}"},
                content=file_chunks(layouts[i]),
                headers={"Content-Length": length},
            )

    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        with ThreadPoolExecutor(4) as pool:
            answers = list(pool.map(upload, range(4)))
    finally:
        done.set()
        sampler.join()
    for r in answers:
        assert r.status_code == 201, r.text
    grew = (peak - before) / MiB
    bound = 1.5 * size / MiB
    assert grew < bound, f"the broker grew by {grew:.0f} MiB for 4 uploads of {size // MiB} MiB"


class _HeldUpload:
    """An upload whose body stops after its first KiB until :meth:`finish`: a raw socket, so
    that the test sees at once whether the broker answered it already (refused it)."""

    def __init__(self, url: str, token: str, body: bytes) -> None:
        parts = urlsplit(url)
        self.body = body
        self.sock = socket.create_connection((parts.hostname or "", parts.port or 80), timeout=60)
        head = (
            f"POST /v1/images HTTP/1.1\r\nHost: {parts.netloc}\r\n"
            f"Authorization: Bearer {token}\r\nContent-Type: application/x-tar\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
        )
        self.sock.sendall(head.encode() + body[:1024])

    def answered(self) -> bool:
        """Whether the broker answered before the body was in (a refusal)."""
        return bool(select.select([self.sock], [], [], 0)[0])

    def finish(self) -> int:
        """The rest of the body sent; the answer's HTTP status."""
        with self.sock:
            self.sock.sendall(self.body[1024:])
            answer = b""
            while b"\r\n" not in answer:
                chunk = self.sock.recv(4096)
                if not chunk:
                    break
                answer += chunk
        return int(answer.split(b" ", 2)[1])


def test_a_token_past_its_concurrent_uploads_gets_429(cluster: Cluster, tmp_path: Path) -> None:
    token = _token(cluster, "eager")
    root = tmp_path / "small"
    root.mkdir()
    (root / "f").write_text("small\n")
    body = layout_tar(pack_directory(root, cmd=["true"]))
    held = [_HeldUpload(cluster.api_url, token, body) for _ in range(2)]
    refused: list[httpx.Response] = []
    with _http(cluster, token) as http:

        def third_refused() -> bool:
            # A held upload the broker refused (it came while a third one was in) starts over.
            for i, upload in enumerate(held):
                if upload.answered():
                    upload.sock.close()
                    held[i] = _HeldUpload(cluster.api_url, token, body)
            r = http.post("/v1/images", content=body)
            if r.status_code == 429:
                refused.append(r)
                return True
            assert r.status_code == 201, r.text  # before both held ones are in
            return False

        wait_until(third_refused, timeout=60, message="a third upload to be refused")
        assert refused[0].json()["status"] == "too_many_requests"
        assert "image uploads under way" in refused[0].json()["error"]
        assert [upload.finish() for upload in held] == [201, 201]
        # The slots are given back once the uploads end.
        assert http.post("/v1/images", content=body).status_code == 201
    # Another token is not held back by this one's uploads.
    with _http(cluster, _token(cluster, "patient")) as other:
        assert other.post("/v1/images", content=body).status_code == 201
