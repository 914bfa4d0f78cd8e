"""Who a machine of an image runs as inside its sandbox: the image's ``User``, in Docker's
forms, looked up in the image's own /etc/passwd and /etc/group (never the host's)."""

from __future__ import annotations

from pathlib import Path

import pytest

from souq.drivers.base import SpawnError
from souq.drivers.sandbox import inner_ids


@pytest.fixture
def image(tmp_path: Path) -> Path:
    (tmp_path / "etc").mkdir()
    (tmp_path / "etc" / "passwd").write_text(
        "root:x:0:0:root:/root:/bin/sh\nwww:x:1000:1001:web:/www:/bin/sh\n"
    )
    (tmp_path / "etc" / "group").write_text("root:x:0:\nweb:x:1001:\nstaff:x:50:\n")
    return tmp_path


@pytest.mark.parametrize(
    ("user", "ids"),
    [
        ("", (0, 0)),
        ("www", (1000, 1001)),
        ("1000", (1000, 1001)),  # a uid the image names: its group
        ("4242", (4242, 4242)),  # a uid it does not: a group of the same number
        ("www:staff", (1000, 50)),
        ("www:7", (1000, 7)),
        ("0:0", (0, 0)),
    ],
)
def test_the_image_user_is_looked_up_in_the_image(
    image: Path, user: str, ids: tuple[int, int]
) -> None:
    assert inner_ids(image, user) == ids


def test_a_name_the_image_does_not_have_is_a_spawn_error(image: Path) -> None:
    with pytest.raises(SpawnError, match="no user 'nginx'"):
        inner_ids(image, "nginx")
    with pytest.raises(SpawnError, match="no group 'wheel'"):
        inner_ids(image, "www:wheel")


def test_a_passwd_that_is_a_link_is_not_followed_to_the_host(tmp_path: Path) -> None:
    (tmp_path / "etc").mkdir()
    (tmp_path / "etc" / "passwd").symlink_to("/etc/passwd")  # the image's own: itself
    with pytest.raises(SpawnError):
        inner_ids(tmp_path, "root")
    other = tmp_path / "other"
    other.mkdir()
    (other / "etc").symlink_to("/etc")  # the image's /etc, which it does not have
    with pytest.raises(SpawnError):
        inner_ids(other, "root")


def test_absolute_links_are_followed_within_the_image(tmp_path: Path) -> None:
    (tmp_path / "usr" / "share" / "base").mkdir(parents=True)
    (tmp_path / "usr" / "share" / "base" / "passwd").write_text("app:x:77:78::/:/bin/sh\n")
    (tmp_path / "etc").symlink_to("/usr/share/base")
    assert inner_ids(tmp_path, "app") == (77, 78)
