"""After a 500 a keep-alive connection stays usable: the next request on it is answered, not
reset. Served as the broker serves its API (uvicorn with Souq's protocol and error handlers), on
a real port; the 500 is a route that raises what no handler expects, as a bug would."""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Iterator

import httpx
import pytest
from fastapi import FastAPI

from souq.broker.http_errors import install_error_handlers
from souq.http_server import EmbeddedServer, server_config
from souq.natsserver import free_port


@pytest.fixture(scope="module")
def api_url() -> Iterator[str]:
    app = FastAPI()
    install_error_handlers(app)

    @app.get("/broken")
    async def broken() -> dict[str, str]:
        raise RuntimeError("a bug")

    @app.get("/fine")
    async def fine() -> dict[str, str]:
        return {"ok": "yes"}

    port = free_port()
    server = EmbeddedServer(server_config(app, host="127.0.0.1", port=port))
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_until_complete, args=(server.serve(),), daemon=True)
    thread.start()
    ready = threading.Event()
    loop.call_soon_threadsafe(lambda: loop.create_task(_when(server, ready)))
    assert ready.wait(30), "the server did not start listening"
    yield f"http://127.0.0.1:{port}"
    server.should_exit = True
    thread.join(30)


async def _when(server: EmbeddedServer, ready: threading.Event) -> None:
    await server.listening.wait()
    ready.set()


def test_the_connection_after_a_500_answers_the_next_request(
    api_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    connections: list[object] = []

    def note_connection(response: httpx.Response) -> None:
        connections.append(response.extensions.get("network_stream"))

    caplog.set_level(logging.ERROR, logger="souq.broker.http_errors")
    with httpx.Client(
        base_url=api_url, timeout=30, event_hooks={"response": [note_connection]}
    ) as http:
        for _ in range(5):  # a reset is a race with the server's close: try it a few times
            broken = http.get("/broken")
            assert (broken.status_code, broken.json()["status"]) == (500, "internal")
            assert broken.headers.get("connection") != "close"
            after = http.get("/fine")  # on the same connection
            assert after.status_code == 200, after.text
        assert len({id(c) for c in connections}) == 1  # one connection for all of them
    assert "unexpected error on GET /broken" in caplog.text  # still logged, as a bug
