"""The dashboard is served by the broker: one HTML page and its two assets, outside the API
schema."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest

from souq.broker.app import create_app
from souq.broker.ui import ASSETS
from souq.bus import MemoryTransport

from .broker_fakes import FakeWorker, started_service

pytestmark = pytest.mark.anyio


@pytest.fixture
async def http() -> AsyncIterator[httpx.AsyncClient]:
    bus = MemoryTransport()
    service = await started_service(bus, FakeWorker(bus, "wa"))
    transport = httpx.ASGITransport(app=create_app(service), raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://souq") as client:
        yield client
    await service.close()


async def test_ui_answers_an_html_page(http: httpx.AsyncClient) -> None:
    r = await http.get("/ui")
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/html")
    assert "<title>Souq dashboard</title>" in r.text
    for name in ASSETS:
        assert f'"/ui/{name}"' in r.text


@pytest.mark.parametrize("name", sorted(ASSETS))
async def test_the_page_assets_are_served(http: httpx.AsyncClient, name: str) -> None:
    r = await http.get(f"/ui/{name}")
    assert r.status_code == 200
    assert r.headers["content-type"] == ASSETS[name]
    assert len(r.content) > 100


async def test_other_names_under_ui_are_not_found(http: httpx.AsyncClient) -> None:
    r = await http.get("/ui/..%2Fui.py")
    assert r.status_code == 404
    assert r.json()["status"] == "not_found"


async def test_the_dashboard_is_not_part_of_the_api_schema(http: httpx.AsyncClient) -> None:
    paths = (await http.get("/openapi.json")).json()["paths"]
    assert not [p for p in paths if p.startswith("/ui")]
