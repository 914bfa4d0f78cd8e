"""Secrets sealed with AES-256-GCM, bound to their app and name; names checked; values
redacted from output read in chunks."""

from __future__ import annotations

import os

import pytest

from souq.errors import InvalidInput, SecretsUnreadable
from souq.secrets import MARK, SecretsKey, check_values, redact


def test_a_sealed_value_opens_only_with_its_key_app_and_name() -> None:
    key = SecretsKey(os.urandom(32))
    sealed = key.seal("app", "DB", "hunter2-long", set_at="2026-01-01T00:00:00Z")
    assert "hunter2" not in sealed.model_dump_json()
    assert key.open("app", "DB", sealed) == "hunter2-long"
    for app, name in (("other", "DB"), ("app", "DB2")):
        with pytest.raises(SecretsUnreadable):
            key.open(app, name, sealed)
    with pytest.raises(SecretsUnreadable, match="does not open with this secrets key"):
        SecretsKey(os.urandom(32)).open("app", "DB", sealed)
    again = key.seal("app", "DB", "hunter2-long", set_at="2026-01-01T00:00:00Z")
    assert again.nonce != sealed.nonce and again.digest == sealed.digest  # keyed, stable
    assert SecretsKey(os.urandom(32)).digest("hunter2-long") != sealed.digest


@pytest.mark.parametrize(
    "values",
    [
        {},
        {"1A": "x"},
        {"A B": "x"},
        {"A\n": "x"},
        {"SOUQ_X": "x"},
        {"A": "x\0y"},
        {"A": "\ud800"},
        {"A" * 129: "x"},
    ],
)
def test_bad_secrets_are_refused(values: dict[str, str]) -> None:
    with pytest.raises(InvalidInput):
        check_values(values)


def test_values_are_redacted_even_across_chunks() -> None:
    secret = "p4ssw0rd-xyz"
    text = f"a {secret} b {secret}"
    assert redact(text, {secret}) == (f"a {MARK} b {MARK}", 0)
    # Read in every possible pair of chunks, the value never shows.
    for cut in range(len(text) + 1):
        first, held = redact(text[:cut], {secret})
        rest, _ = redact(text[cut - held :], {secret}, final=True)
        assert first + rest == f"a {MARK} b {MARK}"
    assert redact("abc", {"ab"}) == ("abc", 0)  # too short to redact: ordinary output
    assert redact("tail p4ss", {secret}, final=True) == ("tail p4ss", 0)
