"""Image names as Docker reads them, in one pure function: :func:`image_name`.

``busybox``, ``library/busybox``, ``docker.io/library/busybox:latest`` and
``registry-1.docker.io/library/busybox:latest`` are one image. The rules are Docker's
(``distribution/reference``'s ``ParseNormalizedNamed``):

* the first part is a registry when it has a ``.`` or a ``:`` (a port), is ``localhost``, or has
  an upper-case letter; else the registry is ``docker.io``;
* ``index.docker.io`` and ``registry-1.docker.io`` are ``docker.io``;
* a name of one part on ``docker.io`` is under ``library/``;
* without a tag or a digest the tag is ``latest``; a digest is ``@sha256:<64 hex>``.

The cluster's store keys every name by its normalised form (:attr:`ImageName.canonical`), and
the broker resolves a machine's ``image`` through it, so that a Fly client's
``registry-1.docker.io/library/nginx:latest`` finds what an operator imported as
``nginx:latest``. Whether the name was written with its registry (:attr:`ImageName.registry_given`)
decides whether the broker may ask that registry when the store does not have it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from souq.errors import InvalidInput

__all__ = ["DOCKER_HUB", "DOCKER_HUB_API", "ImageName", "image_name", "is_digest"]

DOCKER_HUB = "docker.io"
DOCKER_HUB_API = "registry-1.docker.io"  # where docker.io's distribution API answers
_HUB_ALIASES = frozenset({DOCKER_HUB, "index.docker.io", DOCKER_HUB_API})
_DEFAULT_TAG = "latest"

_DOMAIN_PART = r"(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])"
_DOMAIN = re.compile(rf"(?:{_DOMAIN_PART}(?:\.{_DOMAIN_PART})*|\[[0-9a-fA-F:]+\])(?::[0-9]+)?")
_PATH_PART = re.compile(r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*")
_TAG = re.compile(r"[\w][\w.-]{0,127}")
_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")
_MAX_NAME = 255  # Docker's bound on domain/path


@dataclass(frozen=True)
class ImageName:
    """A name in Docker's normal form."""

    domain: str  # docker.io for Docker Hub, whichever alias was written
    path: str  # library/busybox
    tag: str | None  # latest when neither a tag nor a digest was written
    digest: str | None
    registry_given: bool  # the name as written began with its registry

    @property
    def repository(self) -> str:
        """``domain/path``: the image's repository, without tag or digest."""
        return f"{self.domain}/{self.path}"

    @property
    def canonical(self) -> str:
        """``domain/path[:tag][@digest]``: the one spelling of every spelling of the name."""
        tag = f":{self.tag}" if self.tag else ""
        digest = f"@{self.digest}" if self.digest else ""
        return f"{self.repository}{tag}{digest}"

    @property
    def api_host(self) -> str:
        """The host whose distribution API serves the repository (Docker Hub's is not
        ``docker.io``)."""
        return DOCKER_HUB_API if self.domain == DOCKER_HUB else self.domain

    def __str__(self) -> str:
        return self.canonical


def is_digest(text: str) -> bool:
    """Whether ``text`` is an image's own reference, ``sha256:<64 hex>``."""
    return _DIGEST.fullmatch(text) is not None


def image_name(text: str, *, field: str = "image") -> ImageName:
    """``text`` read as Docker reads an image name; :class:`InvalidInput` naming the rule it
    breaks (and ``field``, where the name was given) else."""
    rest, at, digest = text.partition("@")
    if at and not _DIGEST.fullmatch(digest):
        raise _invalid(field, text, f"{digest!r} is not a digest: write @sha256:<64 hex digits>")
    first, slash, after = rest.partition("/")
    registry_given = bool(slash) and (
        "." in first or ":" in first or first == "localhost" or first.lower() != first
    )
    if registry_given:
        if not _DOMAIN.fullmatch(first):
            raise _invalid(field, text, f"{first!r} is not a registry host")
        domain, remainder = first, after
    else:
        domain, remainder = DOCKER_HUB, rest
    path, colon, tag = remainder.rpartition(":") if ":" in remainder else (remainder, "", "")
    if colon and not _TAG.fullmatch(tag):
        raise _invalid(field, text, f"{tag!r} is not a tag (letters, digits, '_', '.', '-')")
    parts = path.split("/")
    if not all(_PATH_PART.fullmatch(part) for part in parts):
        raise _invalid(
            field,
            text,
            "each part of the repository is lower-case letters and digits, joined by "
            "'.', '_', '__' or '-'",
        )
    if domain.lower() in _HUB_ALIASES:
        domain = DOCKER_HUB
        if len(parts) == 1:
            path = f"library/{path}"
    if len(domain) + 1 + len(path) > _MAX_NAME:
        raise _invalid(field, text, f"a repository name is at most {_MAX_NAME} characters")
    return ImageName(
        domain=domain,
        path=path,
        tag=tag if colon else (None if at else _DEFAULT_TAG),
        digest=digest if at else None,
        registry_given=registry_given,
    )


def _invalid(field: str, text: str, why: str) -> InvalidInput:
    return InvalidInput(
        f"{text!r} is not an image name: {why}",
        hint="write [REGISTRY/]REPOSITORY[:TAG][@sha256:…], e.g. web:v1 or "
        "docker.io/library/busybox:latest",
        details={"field": field},
    )
