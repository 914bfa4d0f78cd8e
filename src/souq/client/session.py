"""The client's one way to the Souq API: :class:`ApiSession` holds the HTTP connection and
turns every answer into a response or the typed :class:`souq.errors.SouqError` the broker
reported (:class:`souq.errors.Unavailable` for a broker that cannot be reached). The calls
themselves are :class:`souq.client.api.SouqClient`'s and :class:`souq.client.sched_api.SchedCalls`'.
"""

from __future__ import annotations

import json
import os
import ssl
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Self

import httpx

from souq.auth.locate import locate_token
from souq.errors import SouqError, Unavailable, error_from_body

__all__ = ["DEFAULT_API", "ApiSession"]

DEFAULT_API = "http://127.0.0.1:4280"


class ApiSession:
    """A connection to ``base_url`` (else ``$SOUQ_API``, else ``http://127.0.0.1:4280``) with a
    bearer token (``token``, else :func:`souq.auth.locate.locate_token`'s, whose file a refusal
    names); ``transport`` is for tests. A context manager that closes it."""

    def __init__(
        self,
        base_url: str | None = None,
        token: str | None = None,
        timeout: float = 30.0,
        *,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self.base_url = (base_url or os.environ.get("SOUQ_API") or DEFAULT_API).rstrip("/")
        found = locate_token() if token is None else None
        token = found.token if found is not None else token
        self.token_file = None if found is None else found.file  # named when it is refused
        headers = {"Accept": "application/json", "User-Agent": "souq-client"}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        # An API over plain HTTP needs no CA bundle, whose loading is a tenth of a second of
        # every command: its context trusts no certificate (a redirect to HTTPS fails closed).
        verify: ssl.SSLContext | bool = True
        if self.base_url.startswith("http://"):
            verify = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        self._http = httpx.Client(
            base_url=self.base_url,
            headers=headers,
            timeout=timeout,
            transport=transport,
            verify=verify,
        )

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _call(
        self,
        method: str,
        path: str,
        *,
        json: Any = None,
        content: bytes | None = None,
        params: Mapping[str, str] | None = None,
        headers: Mapping[str, str] | None = None,
        timeout: float | None = None,
    ) -> httpx.Response:
        try:
            response = self._http.request(
                method,
                path,
                json=json,
                content=content,
                params=params,
                headers=headers,
                timeout=timeout if timeout is not None else self._http.timeout,
            )
        except httpx.TransportError as exc:
            raise self._unreachable(exc) from exc
        if response.is_error:
            raise self._refused(response)
        return response

    def _refused(self, response: httpx.Response) -> SouqError:
        return _named_file(_error(response), self.token_file)

    @contextmanager
    def _stream(self, path: str, params: Mapping[str, str]) -> Iterator[httpx.Response]:
        """A ``GET`` whose answer is read as it comes (no read timeout); its errors are
        :meth:`_call`'s."""
        timeout = httpx.Timeout(self._http.timeout.connect, read=None)
        try:
            with self._http.stream("GET", path, params=params, timeout=timeout) as response:
                if response.is_error:
                    response.read()
                    raise self._refused(response)
                yield response
        except httpx.TransportError as exc:
            raise self._unreachable(exc) from exc

    def _unreachable(self, exc: httpx.TransportError) -> Unavailable:
        if isinstance(exc, httpx.TimeoutException):
            return Unavailable(
                f"the Souq API at {self.base_url} did not answer in time",
                hint="the broker may be overloaded; try again",
            )
        return Unavailable(
            f"cannot reach the Souq API at {self.base_url}: {exc}",
            hint=f"is `souq dev` or a broker running at {self.base_url}? (set SOUQ_API)",
        )


def _named_file(err: SouqError, token_file: Path | None) -> SouqError:
    """A refused token (401) that was read from a file: the message names the file."""
    if err.http_status != 401 or token_file is None:
        return err
    err.message = f"{err.message} (the token read from {token_file})"
    err.args = (err.message,)
    err.hint = (
        f"the token in {token_file} is not this cluster's (a souq dev that has since made "
        "new keys?): set SOUQ_TOKEN to a token of this cluster, or remove that file"
    )
    return err


def _error(response: httpx.Response) -> SouqError:
    try:
        body = json.loads(response.content)
    except ValueError:
        body = None
    if isinstance(body, dict) and "status" in body:
        return error_from_body(body, response.status_code)
    text = response.text.strip()[:200] or response.reason_phrase
    err = SouqError(f"HTTP {response.status_code}: {text}")
    err.http_status = response.status_code  # type: ignore[misc]
    return err
