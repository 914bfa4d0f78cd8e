"""Registry references as users write them."""

from __future__ import annotations

import pytest

from souq.errors import InvalidInput
from souq.images.registry import parse_reference

DIGEST = "sha256:" + "ab" * 32


@pytest.mark.parametrize(
    ("text", "base", "repo", "ref"),
    [
        ("127.0.0.1:5000/web:v1", "http://127.0.0.1:5000", "web", "v1"),
        ("localhost:5000/team/web", "http://localhost:5000", "team/web", "latest"),
        (
            "registry.example.com/library/python:3.11-slim",
            "https://registry.example.com",
            "library/python",
            "3.11-slim",
        ),
        (f"docker://ghcr.io/org/app@{DIGEST}", "https://ghcr.io", "org/app", DIGEST),
        ("http://10.1.2.3:5000/app:x", "http://10.1.2.3:5000", "app", "x"),
    ],
)
def test_references_parse(text: str, base: str, repo: str, ref: str) -> None:
    parsed = parse_reference(text)
    assert (parsed.base_url, parsed.repository, parsed.reference) == (base, repo, ref)


@pytest.mark.parametrize("text", ["web:v1", "", "127.0.0.1:5000/", "host/UPPER:v1"])
def test_a_bad_reference_names_the_fix(text: str) -> None:
    with pytest.raises(InvalidInput, match="HOST\\[:PORT\\]/REPOSITORY"):
        parse_reference(text)
