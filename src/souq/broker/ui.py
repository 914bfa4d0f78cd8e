"""The dashboard: a read-only web page at ``/ui`` over the public HTTP API.

The page is static (``static/dashboard.html`` with its script and style beside it); the script
in the browser reads the same endpoints as the CLI, so the page shows nothing the API does not.
No build step, no CDN: the three files ship inside the wheel and are served from here.
"""

from __future__ import annotations

from functools import cache
from importlib.resources import files

from fastapi import APIRouter
from fastapi.responses import Response

from souq.errors import NotFound

__all__ = ["ASSETS", "router"]

# The files the page loads, by URL name, with their media types. Anything else is a 404.
ASSETS = {
    "dashboard.js": "text/javascript; charset=utf-8",
    "dashboard.css": "text/css; charset=utf-8",
}
_NO_CACHE = {"Cache-Control": "no-cache"}

router = APIRouter(include_in_schema=False)


@cache
def _read(name: str) -> bytes:
    return (files("souq.broker") / "static" / name).read_bytes()


@router.get("/ui")
async def dashboard() -> Response:
    html = _read("dashboard.html")
    return Response(html, media_type="text/html; charset=utf-8", headers=_NO_CACHE)


@router.get("/ui/{name}")
async def asset(name: str) -> Response:
    media_type = ASSETS.get(name)
    if media_type is None:
        raise NotFound(f"the dashboard has no file {name!r}", hint="open /ui")
    return Response(_read(name), media_type=media_type, headers=_NO_CACHE)
