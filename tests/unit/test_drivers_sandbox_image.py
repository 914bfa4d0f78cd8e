"""The sandbox's jail for a machine of an image: the image read-only, as the root when it is a
whole one, else at /app over the host's root; the machine starts in the image's working
directory and its own directory stays writable."""

from __future__ import annotations

from pathlib import Path

from souq.drivers.sandbox import IMAGE_DIR, WORKDIR, Image, bwrap_argv


def _pairs(argv: list[str], flag: str) -> list[tuple[str, str]]:
    return [(argv[i + 1], argv[i + 2]) for i, a in enumerate(argv) if a == flag]


def test_an_app_image_is_mounted_read_only_over_the_hosts_root(tmp_path: Path) -> None:
    rootfs = tmp_path / "images" / "abc" / "rootfs"
    (rootfs / "srv").mkdir(parents=True)
    image = Image.of(str(rootfs), str(rootfs / "srv"))
    assert image is not None and not image.is_root and image.workdir == "srv"
    argv = bwrap_argv(tmp_path / "m1", network=True, machines_root=tmp_path, image=image)
    binds = _pairs(argv, "--ro-bind")
    assert ("/", "/") in binds and (str(rootfs), IMAGE_DIR) in binds
    assert (str(tmp_path / "m1"), WORKDIR) in _pairs(argv, "--bind")  # still writable
    assert argv[argv.index("--chdir") + 1] == f"{IMAGE_DIR}/srv"
    assert argv[-1] == "--"


def test_a_whole_image_is_the_machines_root(tmp_path: Path) -> None:
    rootfs = tmp_path / "rootfs"
    (rootfs / "usr" / "bin").mkdir(parents=True)
    image = Image.of(str(rootfs), str(rootfs))
    assert image is not None and image.is_root and image.workdir == ""
    argv = bwrap_argv(tmp_path / "m1", network=False, machines_root=tmp_path, image=image)
    binds = _pairs(argv, "--ro-bind")
    assert binds == [(str(rootfs), "/")]  # nothing of the host's files
    assert "--tmpfs" in argv and str(tmp_path) not in [
        argv[i + 1] for i, a in enumerate(argv) if a == "--tmpfs"
    ]
    assert argv[argv.index("--chdir") + 1] == "/"
    assert "--unshare-net" in argv


def test_without_an_image_the_machine_starts_in_its_own_directory(tmp_path: Path) -> None:
    argv = bwrap_argv(tmp_path / "m1", network=True, machines_root=tmp_path)
    assert _pairs(argv, "--ro-bind") == [("/", "/")]
    assert argv[argv.index("--chdir") + 1] == WORKDIR
    assert Image.of(None, None) is None
