"""Image names read as Docker reads them: one normal form for every spelling of a name."""

from __future__ import annotations

import pytest

from souq.errors import InvalidInput
from souq.images.names import image_name

DIGEST = "sha256:" + "ab" * 32
HUB = "registry-1.docker.io"  # Docker Hub's API


@pytest.mark.parametrize(
    "text",
    [
        "busybox",
        "busybox:latest",
        "library/busybox",
        "docker.io/busybox",
        "docker.io/library/busybox:latest",
        "index.docker.io/library/busybox",
        "registry-1.docker.io/library/busybox:latest",
    ],
)
def test_every_spelling_of_docker_hubs_busybox_is_one_name(text: str) -> None:
    assert image_name(text).canonical == "docker.io/library/busybox:latest"


@pytest.mark.parametrize(
    ("text", "canonical", "registry_given", "api_host"),
    [
        ("web:v1", "docker.io/library/web:v1", False, HUB),
        ("team/web", "docker.io/team/web:latest", False, HUB),
        ("127.0.0.1:5000/web:v1", "127.0.0.1:5000/web:v1", True, "127.0.0.1:5000"),
        ("localhost/team/web", "localhost/team/web:latest", True, "localhost"),
        ("ghcr.io/org/app", "ghcr.io/org/app:latest", True, "ghcr.io"),
        (f"ghcr.io/org/app@{DIGEST}", f"ghcr.io/org/app@{DIGEST}", True, "ghcr.io"),
        (f"nginx:1.27@{DIGEST}", f"docker.io/library/nginx:1.27@{DIGEST}", False, HUB),
        ("[::1]:5000/web", "[::1]:5000/web:latest", True, "[::1]:5000"),
        ("my_app__x/web-1.2", "docker.io/my_app__x/web-1.2:latest", False, HUB),
    ],
)  # fmt: skip
def test_names_normalise_as_dockers_do(
    text: str, canonical: str, registry_given: bool, api_host: str
) -> None:
    name = image_name(text)
    assert (name.canonical, name.registry_given, name.api_host) == (
        canonical,
        registry_given,
        api_host,
    )


def test_a_digest_leaves_the_tag_unset() -> None:
    name = image_name(f"busybox@{DIGEST}")
    assert (name.tag, name.digest) == (None, DIGEST)


@pytest.mark.parametrize(
    "text",
    ["", "Web:v1", "web:", "web:-x", "web@sha256:12", "a..b", "-web", "team//web", "x" * 300],
)
def test_what_docker_refuses_is_refused_naming_the_field(text: str) -> None:
    with pytest.raises(InvalidInput, match="is not an image name") as caught:
        image_name(text, field="name")
    assert caught.value.details == {"field": "name"}
