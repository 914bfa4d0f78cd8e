"""Pulling an image from an OCI registry: the distribution API (``/v2/…``), with httpx.

A reference is ``HOST[:PORT]/REPOSITORY[:TAG|@sha256:…]`` (``docker://`` in front is allowed, as
skopeo writes it), read as Docker reads names (:mod:`souq.images.names`): Docker Hub's
``docker.io/busybox`` is pulled from ``registry-1.docker.io/library/busybox``. HTTPS unless the host
is this machine (``localhost``, ``127.*``, ``::1``, as Docker allows) or the reference starts with
``http://``. Anonymous pulls from registries that want a token (``WWW-Authenticate: Bearer
realm=…``, as Docker Hub and most public registries answer) fetch one for ``repository:REPO:pull``
and retry.

The manifest is asked for in every image media type Souq reads; an index (or a Docker manifest list)
gives the manifest for this host's platform. Every blob is checked against its digest, and so is the
manifest when the reference names a digest.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable
from dataclasses import dataclass

import httpx

from souq.errors import ImageInvalid, ImageNotFound, InvalidInput, Unavailable
from souq.images.manifest import (
    INDEX_TYPES,
    MANIFEST_TYPES,
    Descriptor,
    Image,
    image_from_manifest,
    parse_json,
    record_of,
    verify_blob,
    verify_descriptor,
)
from souq.images.names import ImageName, image_name
from souq.images.oci import choose_entry
from souq.model.image import ImageRecord

__all__ = [
    "RegistryRef",
    "describe",
    "describe_record",
    "is_registry_reference",
    "parse_reference",
    "pull",
    "split_reference",
    "stream_blob",
]

_ACCEPT = ", ".join(sorted(MANIFEST_TYPES | INDEX_TYPES))
_SCHEME = re.compile(r"(?:(?P<scheme>https?)://|docker://)")
_LOCAL = re.compile(r"(localhost|127\.[0-9.]+|\[::1\])(:[0-9]+)?")
_BEARER = re.compile(r'(\w+)="([^"]*)"')


@dataclass(frozen=True)
class RegistryRef:
    base_url: str  # http(s)://host[:port]
    repository: str
    reference: str  # a tag, or a digest

    def __str__(self) -> str:
        sep = "@" if self.reference.startswith("sha256:") else ":"
        return f"{self.base_url.split('://', 1)[1]}/{self.repository}{sep}{self.reference}"


def parse_reference(text: str) -> RegistryRef:
    """``HOST[:PORT]/REPO[:TAG|@DIGEST]`` (the tag ``latest`` when neither is given), read as
    Docker reads it (:func:`souq.images.names.image_name`): ``docker.io/busybox`` is
    ``library/busybox`` at Docker Hub's API, ``registry-1.docker.io``."""
    scheme, name = split_reference(text)
    if name is None or not name.registry_given:
        raise InvalidInput(
            f"{text!r} is not a registry reference",
            hint="write HOST[:PORT]/REPOSITORY[:TAG], e.g. 127.0.0.1:5000/web:v1",
        )
    host = name.api_host
    scheme = scheme or ("http" if _LOCAL.fullmatch(host) else "https")
    return RegistryRef(f"{scheme}://{host}", name.path, name.digest or name.tag or "latest")


def is_registry_reference(text: str) -> bool:
    """Whether ``text`` names an image in a registry (it is written with its registry: its
    first part is a host), not only one of the cluster's store."""
    _, name = split_reference(text)
    return name is not None and name.registry_given


def split_reference(text: str) -> tuple[str | None, ImageName | None]:
    """The scheme written in front of ``text`` (``docker://`` says none), and the name after
    it (None: not an image name)."""
    rest = text.strip()
    scheme = _SCHEME.match(rest)
    if scheme is not None:
        rest = rest[scheme.end() :]
    try:
        name = image_name(rest)
    except InvalidInput:
        name = None
    return (scheme["scheme"] if scheme is not None else None), name


def pull(ref: RegistryRef, *, client: httpx.Client | None = None, timeout: float = 60.0) -> Image:
    """The image ``ref`` names, every blob fetched and checked."""
    return _with_client(ref, client, timeout, layers=True)


def describe(
    ref: RegistryRef, *, client: httpx.Client | None = None, timeout: float = 60.0
) -> Image:
    """The image ``ref`` names, its manifest and config fetched and checked, not its layers
    (each worker pulls those: :func:`stream_blob`)."""
    return _with_client(ref, client, timeout, layers=False)


def describe_record(text: str, *, name: str | None = None) -> ImageRecord:
    """The record of the image ``text`` (a registry reference) names, described as
    :func:`describe` does: its ``source`` is the registry's reference pinned to the image's
    digest, where every worker pulls its layers from."""
    ref = parse_reference(text)
    image = describe(ref)
    source = f"{ref.base_url}/{ref.repository}@{image.reference}"
    return record_of(image, name=name).model_copy(update={"source": source})


def _with_client(
    ref: RegistryRef, client: httpx.Client | None, timeout: float, *, layers: bool
) -> Image:
    http = client or httpx.Client(timeout=timeout, follow_redirects=True)
    try:
        return _Puller(http, ref).image(layers=layers)
    except httpx.TransportError as exc:
        raise Unavailable(
            f"cannot reach the registry at {ref.base_url}: {exc}",
            hint="check the host and port, and whether it speaks HTTPS",
        ) from exc
    finally:
        if client is None:
            http.close()


@dataclass
class _Puller:
    http: httpx.Client
    ref: RegistryRef
    token: str | None = None

    def image(self, *, layers: bool = True) -> Image:
        body, media_type, digest = self._manifest(self.ref.reference)
        top = Descriptor(media_type, digest, len(body))
        if media_type in INDEX_TYPES:
            entry, _ = choose_entry(
                parse_json(body, f"index {digest}"), str(self.ref), None, platform_of=True
            )
            body, media_type, digest = self._manifest(entry.digest)
            top = Descriptor(media_type, digest, len(body))
            verify_descriptor(entry, body)
        fetched = {top.digest: body}

        def fetch(descriptor: Descriptor) -> bytes:
            data = fetched.get(descriptor.digest)
            if data is None:
                data = self._get(f"blobs/{descriptor.digest}", f"blob {descriptor.digest}").content
            verify_descriptor(descriptor, data)
            return data

        return image_from_manifest(top, fetch, None, layers=layers)

    def _manifest(self, reference: str) -> tuple[bytes, str, str]:
        response = self._get(f"manifests/{reference}", f"manifest {reference!r}", accept=_ACCEPT)
        body = response.content
        media_type = response.headers.get("content-type", "").split(";")[0].strip()
        if not media_type:
            media_type = str(parse_json(body, f"manifest of {self.ref}").get("mediaType", ""))
        if media_type not in MANIFEST_TYPES | INDEX_TYPES:
            raise ImageInvalid(
                f"{self.ref}: the registry answered a manifest of type {media_type!r}",
                hint="Souq reads OCI and Docker schema-2 images",
            )
        digest = "sha256:" + hashlib.sha256(body).hexdigest()
        if reference.startswith("sha256:"):
            verify_blob(reference, body)
        said = response.headers.get("docker-content-digest")
        if said is not None and said.startswith("sha256:") and said != digest:
            raise ImageInvalid(
                f"{self.ref}: the manifest's bytes are {digest}, the registry said {said}"
            )
        return body, media_type, digest

    def _get(self, path: str, what: str, *, accept: str | None = None) -> httpx.Response:
        url = f"{self.ref.base_url}/v2/{self.ref.repository}/{path}"
        headers = {"Accept": accept} if accept else {}
        for attempt in range(2):
            if self.token:
                headers["Authorization"] = f"Bearer {self.token}"
            response = self.http.get(url, headers=headers)
            if response.status_code == 401 and attempt == 0 and self._authorize(response):
                continue
            break
        _check(self.ref, response, what)
        return response

    def _authorize(self, response: httpx.Response) -> bool:
        """Get an anonymous pull token from the challenge's realm; False if there is none."""
        asked = _token_request(self.ref, response)
        if asked is None:
            return False
        self.token = _token_of(self.http.get(asked[0], params=asked[1]))
        return bool(self.token)


def _token_request(ref: RegistryRef, response: httpx.Response) -> tuple[str, dict[str, str]] | None:
    """Where a ``401``'s bearer challenge says to ask for an anonymous pull token: (realm,
    params), or None when it says nothing usable."""
    challenge = response.headers.get("www-authenticate", "")
    if not challenge.lower().startswith("bearer "):
        return None
    params = dict(_BEARER.findall(challenge))
    realm = params.pop("realm", None)
    if not realm:
        return None
    params.setdefault("scope", f"repository:{ref.repository}:pull")
    return realm, params


def _token_of(answer: httpx.Response) -> str | None:
    if answer.is_error:
        return None
    body = answer.json()
    token = body.get("token") or body.get("access_token")
    return str(token) if token else None


def _check(ref: RegistryRef, response: httpx.Response, what: str) -> None:
    if response.status_code == 404:
        raise ImageNotFound(
            f"{ref}: the registry has no {what}", hint="check the repository and the tag"
        )
    if response.is_error:
        raise Unavailable(
            f"{ref}: the registry answered {response.status_code} for {what}",
            hint="check that the registry serves this repository to anonymous pulls",
        )


async def stream_blob(
    ref: RegistryRef, digest: str, sink: Callable[[bytes], None], *, timeout: float = 60.0
) -> None:
    """A blob's bytes from the registry, handed to ``sink`` as they arrive (not checked: the
    caller hashes them). A registry that wants a token for anonymous pulls gets one asked."""
    url = f"{ref.base_url}/v2/{ref.repository}/blobs/{digest}"
    what = f"blob {digest}"
    async with httpx.AsyncClient(timeout=timeout, follow_redirects=True) as http:
        try:
            headers: dict[str, str] = {}
            for attempt in range(2):
                async with http.stream("GET", url, headers=headers) as response:
                    if response.status_code == 401 and attempt == 0:
                        token = await _anonymous_token(http, ref, response)
                        if token:
                            headers["Authorization"] = f"Bearer {token}"
                            continue
                    if response.is_error:
                        await response.aread()
                    _check(ref, response, what)
                    async for chunk in response.aiter_raw(1 << 20):
                        sink(chunk)
                    return
        except httpx.TransportError as exc:
            raise Unavailable(
                f"cannot reach the registry at {ref.base_url}: {exc}",
                hint="check that the worker can reach the registry",
            ) from exc


async def _anonymous_token(
    http: httpx.AsyncClient, ref: RegistryRef, response: httpx.Response
) -> str | None:
    asked = _token_request(ref, response)
    return None if asked is None else _token_of(await http.get(asked[0], params=asked[1]))
