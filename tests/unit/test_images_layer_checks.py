"""The layer checks an upload gets (:func:`souq.images.layers.check_layer`) and the bound an
unpack keeps (:class:`souq.images.layers.Budget`): pure, on layers made here."""

from __future__ import annotations

import hashlib
import io
import tarfile
from pathlib import Path

import pytest

from souq.errors import ImageInvalid, ImageTooLarge
from souq.images.layers import (
    MEDIA_LAYER_TAR,
    Budget,
    Pool,
    check_layer,
    pack_layer,
    unpack_layer,
)


def _tar(*entries: tuple[str, bytes, bytes, str]) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as tar:
        for name, kind, data, link in entries:
            info = tarfile.TarInfo(name)
            info.type, info.linkname, info.size = kind, link, len(data)
            tar.addfile(info, io.BytesIO(data) if data else None)
    return out.getvalue()


def _digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def test_a_safe_layer_passes_and_a_changed_byte_does_not(tmp_path: Path) -> None:
    (tmp_path / "a").write_text("hello")
    layer = pack_layer(tmp_path).data
    check_layer(layer, "application/vnd.oci.image.layer.v1.tar+gzip", _digest(layer), len(layer))
    with pytest.raises(ImageInvalid, match="does not match its descriptor"):
        check_layer(layer, "application/vnd.oci.image.layer.v1.tar+gzip", _digest(b"x"), len(layer))


@pytest.mark.parametrize(
    ("entry", "named"),
    [
        (("../x", tarfile.REGTYPE, b"1", ""), "'../x'"),
        (("/etc/x", tarfile.REGTYPE, b"1", ""), "'/etc/x'"),
        (("null", tarfile.CHRTYPE, b"", ""), "'null'"),
        (("hard", tarfile.LNKTYPE, b"", "/etc/passwd"), "'hard'"),
    ],
)
def test_an_unsafe_entry_is_named_with_its_layer(
    entry: tuple[str, bytes, bytes, str], named: str
) -> None:
    layer = _tar(("ok", tarfile.REGTYPE, b"fine", ""), entry)
    with pytest.raises(ImageInvalid) as caught:
        check_layer(layer, MEDIA_LAYER_TAR, _digest(layer), len(layer))
    assert named in caught.value.message and _digest(layer) in caught.value.message


def test_an_unpack_stops_the_moment_it_passes_its_budget(tmp_path: Path) -> None:
    layer = _tar(
        ("small", tarfile.REGTYPE, b"s" * 10, ""), ("big", tarfile.REGTYPE, b"b" * (5 << 20), "")
    )
    budget = Budget.of(3 << 20, "a test's bound")
    with pytest.raises(ImageTooLarge) as caught:
        unpack_layer(layer, MEDIA_LAYER_TAR, tmp_path / "root", budget=budget)
    assert "'big'" in caught.value.message and "a test's bound" in caught.value.message
    assert caught.value.status == "image_too_large"
    written = (tmp_path / "root" / "big").stat().st_size
    assert written <= 3 << 20  # what was written when it stopped, never past the bound
    roomy = Budget.of(6 << 20, "room")
    unpack_layer(layer, MEDIA_LAYER_TAR, tmp_path / "fits", budget=roomy)
    assert (tmp_path / "fits" / "big").stat().st_size == 5 << 20


def test_unpacks_under_way_at_once_share_their_pool(tmp_path: Path) -> None:
    layer = _tar(("big", tarfile.REGTYPE, b"b" * (3 << 20), ""))
    pool = Pool(5 << 20)
    first = Budget.of(4 << 20, "a cache", pool=pool)
    unpack_layer(layer, MEDIA_LAYER_TAR, tmp_path / "first", budget=first)  # 3 MiB of 5
    second = Budget.of(4 << 20, "a cache", pool=pool)  # alone it would fit
    with pytest.raises(ImageTooLarge, match="beside it"):
        unpack_layer(layer, MEDIA_LAYER_TAR, tmp_path / "second", budget=second)
    pool.give(first.used + second.used)  # both ended
    assert pool.used == 0
    third = Budget.of(4 << 20, "a cache", pool=pool)
    unpack_layer(layer, MEDIA_LAYER_TAR, tmp_path / "third", budget=third)


@pytest.mark.parametrize(
    ("entries", "named"),
    [
        ((("up", tarfile.SYMTYPE, b"", "../.."), ("up/x", tarfile.REGTYPE, b"1", "")), "'up/x'"),
        ((("etc", tarfile.SYMTYPE, b"", "/etc"), ("etc/x", tarfile.REGTYPE, b"1", "")), "'etc/x'"),
        ((("d", tarfile.SYMTYPE, b"", "e"), ("d/.wh..wh..opq", tarfile.REGTYPE, b"", "")), "'d/"),
    ],
    ids=["upward", "absolute", "opaque"],
)
def test_an_entry_under_a_symlink_of_its_layer_is_refused_at_import(
    entries: tuple[tuple[str, bytes, bytes, str], ...], named: str
) -> None:
    layer = _tar(*entries)
    with pytest.raises(ImageInvalid) as caught:
        check_layer(layer, MEDIA_LAYER_TAR, _digest(layer), len(layer))
    assert named in caught.value.message and "through the layer's symlink" in caught.value.message


def test_symlinks_pointing_anywhere_pass_as_a_root_file_system_has_them() -> None:
    layer = _tar(
        ("up", tarfile.SYMTYPE, b"", "../.."),
        ("awk", tarfile.SYMTYPE, b"", "/usr/bin/mawk"),
        ("next", tarfile.REGTYPE, b"1", ""),
    )
    check_layer(layer, MEDIA_LAYER_TAR, _digest(layer), len(layer))
