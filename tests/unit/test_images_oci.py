"""OCI images: a packed directory round-trips through the image layout (as a tar and as a
directory) with the same reference; packing is deterministic; blobs are verified; layers unpack
safely and apply whiteouts; Docker media types and nested indexes read."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import stat
import tarfile
from pathlib import Path
from typing import Any

import pytest

import souq.images
from souq.errors import ImageInvalid, ImageNotFound
from souq.images import (
    Descriptor,
    Image,
    RunConfig,
    layout_tar,
    pack_directory,
    read_layout,
    read_layout_bytes,
    unpack_layer,
    verify_blob,
    write_layout,
)
from souq.images.layers import check_layer
from souq.images.manifest import host_architecture

GZIP = "application/vnd.oci.image.layer.v1.tar+gzip"
TAR = "application/vnd.oci.image.layer.v1.tar"
INDEX = "application/vnd.oci.image.index.v1+json"
MANIFEST = "application/vnd.oci.image.manifest.v1+json"
CONFIG = "application/vnd.oci.image.config.v1+json"
DOCKER_MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"
DOCKER_CONFIG = "application/vnd.docker.container.image.v1+json"
DOCKER_LAYER = "application/vnd.docker.image.rootfs.diff.tar.gzip"


def _tree(root: Path) -> Path:
    """A directory with files, a subdirectory, an empty directory, a symlink and an executable."""
    (root / "app" / "data").mkdir(parents=True)
    (root / "app" / "run.sh").write_text("#!/bin/sh\necho hello\n")
    (root / "app" / "run.sh").chmod(0o755)
    (root / "app" / "data" / "table.csv").write_text("a,b\n1,2\n")
    (root / "README").write_text("read me\n")
    (root / "README").chmod(0o640)
    (root / "empty").mkdir()
    (root / "current").symlink_to("app/run.sh")
    return root


def _pack(tmp_path: Path, **kwargs: Any) -> Image:
    return pack_directory(
        _tree(tmp_path / "src"),
        cmd=["./app/run.sh", "--port", "8080"],
        env={"B": "2", "A": "1=one"},
        **kwargs,
    )


def _sha(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def _layer(*entries: tuple[str, str, str], gz: bool = True) -> bytes:
    """A layer from (name, kind, payload) entries: kind is file (payload = content), dir,
    symlink / hardlink (payload = target), chr or fifo."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as tar:
        for name, kind, payload in entries:
            info = tarfile.TarInfo(name)
            info.mode = 0o755 if kind == "dir" else 0o644
            data = payload.encode()
            info.type = {
                "file": tarfile.REGTYPE,
                "dir": tarfile.DIRTYPE,
                "symlink": tarfile.SYMTYPE,
                "hardlink": tarfile.LNKTYPE,
                "chr": tarfile.CHRTYPE,
                "fifo": tarfile.FIFOTYPE,
            }[kind]
            if kind in ("symlink", "hardlink"):
                info.linkname = payload
            if kind == "file":
                info.size = len(data)
            tar.addfile(info, io.BytesIO(data) if kind == "file" else None)
    return gzip.compress(out.getvalue(), mtime=0) if gz else out.getvalue()


def _blob(layout: Path, data: bytes) -> str:
    digest = _sha(data)
    path = layout / "blobs" / "sha256" / digest.removeprefix("sha256:")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return digest


def _desc(layout: Path, media_type: str, data: bytes, **extra: Any) -> dict[str, Any]:
    return {"mediaType": media_type, "digest": _blob(layout, data), "size": len(data), **extra}


def _hand_layout(
    layout: Path,
    config: dict[str, Any],
    layer: bytes,
    *,
    types: tuple[str, str, str] = (MANIFEST, CONFIG, GZIP),
) -> dict[str, Any]:
    """Blobs of one image written by hand (not by souq) into ``layout``; its manifest's
    descriptor is returned, for an index to point at."""
    manifest_type, config_type, layer_type = types
    config.setdefault("rootfs", {"type": "layers", "diff_ids": ["sha256:" + "0" * 64]})
    manifest = {
        "schemaVersion": 2,
        "mediaType": manifest_type,
        "config": _desc(layout, config_type, json.dumps(config).encode()),
        "layers": [_desc(layout, layer_type, layer)],
    }
    (layout / "oci-layout").write_text('{"imageLayoutVersion": "1.0.0"}')
    return _desc(layout, manifest_type, json.dumps(manifest, indent=2).encode())


def _write_index(layout: Path, *manifests: dict[str, Any]) -> None:
    index = {"schemaVersion": 2, "mediaType": INDEX, "manifests": list(manifests)}
    (layout / "index.json").write_text(json.dumps(index))


# -- round trips and determinism --------------------------------------------------------------


def test_a_packed_directory_reads_back_the_same_through_a_tar_and_a_directory(
    tmp_path: Path,
) -> None:
    image = _pack(tmp_path, name="demo")
    assert image.run == RunConfig(
        cmd=("./app/run.sh", "--port", "8080"),
        env=(("A", "1=one"), ("B", "2")),
        workdir="/",
        args=("./app/run.sh", "--port", "8080"),  # packed as the image's Cmd
    )
    assert image.reference == image.manifest.digest
    assert image.manifest.to_json() == {
        "mediaType": MANIFEST,
        "digest": image.reference,
        "size": len(image.blobs[image.reference]),
    }
    assert Descriptor.from_json(image.manifest.to_json(), "here") == image.manifest
    assert image.layers_size == sum(len(image.blobs[d.digest]) for d in image.layers)

    from_tar = read_layout_bytes(layout_tar(image))
    write_layout(image, tmp_path / "layout")
    from_dir = read_layout(tmp_path / "layout")
    (tmp_path / "image.tar").write_bytes(layout_tar(image))
    (tmp_path / "image.tar.gz").write_bytes(gzip.compress(layout_tar(image)))
    from_files = [read_layout(tmp_path / "image.tar"), read_layout(tmp_path / "image.tar.gz")]

    for again in [from_tar, from_dir, *from_files]:
        assert again == image  # reference, descriptors, run config and name
        assert again.name == "demo"
        assert (
            set(again.blobs)
            == set(image.blobs)
            == {
                image.manifest.digest,
                image.config.digest,
                image.layers[0].digest,
            }
        )
        for digest, data in again.blobs.items():
            verify_blob(digest, data)
            assert data == image.blobs[digest]


def test_the_same_directory_packs_to_the_same_reference(tmp_path: Path) -> None:
    first = _pack(tmp_path)
    for path in [tmp_path / "src", *(tmp_path / "src").rglob("*")]:
        os.utime(path, (1_000_000, 1_000_000), follow_symlinks=False)
    second = pack_directory(
        tmp_path / "src", cmd=["./app/run.sh", "--port", "8080"], env={"A": "1=one", "B": "2"}
    )
    assert second.reference == first.reference
    assert second.blobs[second.layers[0].digest] == first.blobs[first.layers[0].digest]

    (tmp_path / "src" / "README").write_text("read me!\n")
    assert pack_directory(tmp_path / "src").layers != first.layers
    (tmp_path / "src" / "README").write_text("read me\n")
    (tmp_path / "src" / "README").chmod(0o644)  # a mode is part of the image too
    assert pack_directory(tmp_path / "src").layers != first.layers


def test_a_layer_unpacks_to_the_same_files_and_modes(tmp_path: Path) -> None:
    image = _pack(tmp_path)
    dest = tmp_path / "root"
    for layer in image.layers:
        unpack_layer(image.blobs[layer.digest], layer.media_type, dest)

    assert (dest / "app" / "run.sh").read_text() == "#!/bin/sh\necho hello\n"
    assert stat.S_IMODE((dest / "app" / "run.sh").stat().st_mode) == 0o755
    assert stat.S_IMODE((dest / "README").stat().st_mode) == 0o640
    assert (dest / "app" / "data" / "table.csv").read_text() == "a,b\n1,2\n"
    assert (dest / "empty").is_dir()
    assert not any((dest / "empty").iterdir())
    assert os.readlink(dest / "current") == "app/run.sh"
    source = sorted(str(p.relative_to(tmp_path / "src")) for p in (tmp_path / "src").rglob("*"))
    assert sorted(str(p.relative_to(dest)) for p in dest.rglob("*")) == source


def test_the_layout_follows_the_oci_layout_rules(tmp_path: Path) -> None:
    image = _pack(tmp_path, name="demo:1")
    with tarfile.open(fileobj=io.BytesIO(layout_tar(image))) as tar:
        files = {m.name: tar.extractfile(m) for m in tar.getmembers() if m.isfile()}
        contents = {name: f.read() for name, f in files.items() if f is not None}
        assert all(m.mtime == 0 for m in tar.getmembers())

    assert json.loads(contents["oci-layout"]) == {"imageLayoutVersion": "1.0.0"}
    index = json.loads(contents["index.json"])
    assert index["schemaVersion"] == 2
    assert index["mediaType"] == INDEX
    entry = index["manifests"][0]
    assert entry["digest"] == image.reference
    assert entry["mediaType"] == MANIFEST
    assert entry["annotations"] == {"org.opencontainers.image.ref.name": "demo:1"}
    for name, data in contents.items():
        if name.startswith("blobs/"):
            assert name == "blobs/sha256/" + _sha(data).removeprefix("sha256:")

    def blob(digest: str) -> bytes:
        return contents["blobs/sha256/" + digest.removeprefix("sha256:")]

    manifest = json.loads(blob(image.reference))
    assert manifest["schemaVersion"] == 2
    assert manifest["mediaType"] == MANIFEST
    assert manifest["config"] == {
        "mediaType": CONFIG,
        "digest": image.config.digest,
        "size": image.config.size,
    }
    assert [layer["mediaType"] for layer in manifest["layers"]] == [GZIP]
    config = json.loads(blob(image.config.digest))
    assert config["os"] == "linux"
    assert config["architecture"] == host_architecture()
    uncompressed = gzip.decompress(blob(image.layers[0].digest))
    assert config["rootfs"] == {"type": "layers", "diff_ids": [_sha(uncompressed)]}
    assert config["config"] == {
        "Cmd": ["./app/run.sh", "--port", "8080"],
        "Env": ["A=1=one", "B=2"],
        "WorkingDir": "/",
    }
    with tarfile.open(fileobj=io.BytesIO(uncompressed)) as layer:
        members = layer.getmembers()
    names = [m.name for m in members]
    assert names == sorted(names)
    assert all((m.mtime, m.uid, m.gid, m.uname, m.gname) == (0, 0, 0, "", "") for m in members)


def test_pack_refuses_what_is_not_a_directory_or_holds_a_fifo(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    with pytest.raises(ImageInvalid, match="not a directory"):
        pack_directory(tmp_path / "file")
    src = _tree(tmp_path / "src")
    os.mkfifo(src / "app" / "pipe")
    with pytest.raises(ImageInvalid, match=r"pipe is a FIFO"):
        pack_directory(src)


# -- verification -----------------------------------------------------------------------------


@pytest.mark.parametrize("which", ["layer", "config", "manifest"])
def test_a_tampered_blob_is_refused_naming_its_digest(tmp_path: Path, which: str) -> None:
    image = _pack(tmp_path)
    write_layout(image, tmp_path / "layout")
    digest = {
        "layer": image.layers[0].digest,
        "config": image.config.digest,
        "manifest": image.reference,
    }[which]
    path = tmp_path / "layout" / "blobs" / "sha256" / digest.removeprefix("sha256:")
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))
    with pytest.raises(ImageInvalid, match=f"blob {digest} does not match its digest"):
        read_layout(tmp_path / "layout")


def test_a_wrong_size_is_refused(tmp_path: Path) -> None:
    image = _pack(tmp_path)
    write_layout(image, tmp_path / "layout")
    index_path = tmp_path / "layout" / "index.json"
    index = json.loads(index_path.read_text())
    index["manifests"][0]["size"] += 1
    index_path.write_text(json.dumps(index))
    with pytest.raises(ImageInvalid, match=f"blob {image.reference} is .* bytes but"):
        read_layout(tmp_path / "layout")


def test_verify_blob_checks_the_digest_and_its_form() -> None:
    verify_blob(_sha(b"x"), b"x")
    verify_blob("sha512:" + hashlib.sha512(b"x").hexdigest(), b"x")
    with pytest.raises(ImageInvalid, match="does not match"):
        verify_blob(_sha(b"x"), b"y")
    with pytest.raises(ImageInvalid, match="not a sha256"):
        verify_blob("sha256:../../../etc/passwd", b"x")  # never becomes a blob path


def test_unreadable_layouts_say_what_is_wrong(tmp_path: Path) -> None:
    with pytest.raises(ImageNotFound):
        read_layout(tmp_path / "missing")
    (tmp_path / "plain").mkdir()
    with pytest.raises(ImageInvalid, match="no oci-layout"):
        read_layout(tmp_path / "plain")
    with pytest.raises(ImageInvalid, match="not a readable tar"):
        read_layout_bytes(b"certainly not a tar")
    image = _pack(tmp_path)
    write_layout(image, tmp_path / "layout")
    (tmp_path / "layout" / "blobs" / "sha256" / image.config.digest.split(":")[1]).unlink()
    with pytest.raises(ImageInvalid, match=f"blob {image.config.digest} is missing"):
        read_layout(tmp_path / "layout")


# -- unpacking safely -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("entries", "refused", "why"),
    [
        ([("../x", "file", "pwned")], "../x", "has a '..' component"),
        ([("/tmp/x", "file", "pwned")], "/tmp/x", "has an absolute path"),
        ([("a/../../x", "file", "pwned")], "a/../../x", "has a '..' component"),
        # a link may point anywhere (it resolves in the machine's root), a write through it not
        (
            [("out", "symlink", "../outside"), ("out/x", "file", "pwned")],
            "out/x",
            "leads outside the destination through a symlink",
        ),
        (
            [("abs", "symlink", "/tmp"), ("abs/x", "file", "pwned")],
            "abs/x",
            "leads outside the destination through a symlink",
        ),
        # lexically inside ("d1/d2/y/../../.." is "."), but y leads up twice when resolved
        (
            [
                ("d1/d2/y", "symlink", "../../e"),
                ("x", "symlink", "d1/d2/y/../../.."),
                ("x/outside/x", "file", "pwned"),
            ],
            "x/outside/x",
            "leads outside the destination through a symlink",
        ),
        (
            [("link", "hardlink", "../outside/secret")],
            "link",
            "is a hard link to '../outside/secret', outside the image",
        ),
        ([("dev", "chr", "")], "dev", "is a device file or FIFO"),
        ([("pipe", "fifo", "")], "pipe", "is a device file or FIFO"),
    ],
    ids=[
        "dotdot",
        "absolute",
        "nested-dotdot",
        "symlink-out",
        "symlink-abs",
        "symlink-resolved",
        "hardlink-out",
        "device",
        "fifo",
    ],
)
def test_unsafe_layer_entries_are_refused(
    tmp_path: Path, entries: list[tuple[str, str, str]], refused: str, why: str
) -> None:
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "secret").write_text("secret")
    dest = tmp_path / "a" / "b" / "dest"
    with pytest.raises(ImageInvalid) as caught:
        unpack_layer(_layer(*entries), GZIP, dest)
    assert caught.value.message == f"layer entry {refused!r} {why}"
    written = {p.name for p in tmp_path.rglob("*") if not p.is_relative_to(dest)}
    assert written == {"outside", "secret", "a", "b"}
    assert (tmp_path / "outside" / "secret").read_text() == "secret"


def test_a_root_file_system_keeps_its_absolute_and_upward_symlinks(tmp_path: Path) -> None:
    """As a Debian root file system has them: they resolve in the machine's root, not here."""
    entries = (
        ("usr/bin/mawk", "file", "awk"),
        ("etc/alternatives/awk", "symlink", "/usr/bin/mawk"),
        ("usr/lib/os-release", "file", "debian"),
        ("etc/os-release", "symlink", "../usr/lib/os-release"),
        ("var/run", "symlink", "../../../../run"),
    )
    layer = _layer(*entries)
    check_layer(layer, GZIP, "sha256:" + hashlib.sha256(layer).hexdigest(), len(layer))
    dest = tmp_path / "dest"
    unpack_layer(layer, GZIP, dest)
    assert os.readlink(dest / "etc" / "alternatives" / "awk") == "/usr/bin/mawk"
    assert os.readlink(dest / "var" / "run") == "../../../../run"
    assert (dest / "etc" / "os-release").read_text() == "debian"


def test_a_write_through_a_symlink_left_in_the_destination_is_refused(tmp_path: Path) -> None:
    (tmp_path / "outside").mkdir()
    dest = tmp_path / "dest"
    dest.mkdir()
    (dest / "link").symlink_to(tmp_path / "outside")
    with pytest.raises(ImageInvalid, match="outside the destination"):
        unpack_layer(_layer(("link/x", "file", "pwned")), GZIP, dest)
    assert not (tmp_path / "outside" / "x").exists()


def test_whiteouts_hide_what_the_layers_below_left(tmp_path: Path) -> None:
    lower = _layer(
        ("a/f", "file", "f"),
        ("a/g", "file", "g"),
        ("b/h", "file", "h"),
        ("b/sub/i", "file", "i"),
        ("c/keep", "file", "keep"),
        ("d/deep/j", "file", "j"),
    )
    upper = _layer(
        ("a/.wh.f", "file", ""),
        ("b/new", "file", "new"),  # before the opaque marker, and still kept: same layer
        ("b/.wh..wh..opq", "file", ""),
        (".wh.d", "file", ""),
        ("c/keep", "file", "changed"),
        ("c/.wh..wh.plnk", "file", ""),  # reserved for AUFS: ignored
    )
    dest = tmp_path / "root"
    unpack_layer(lower, GZIP, dest)
    unpack_layer(upper, GZIP, dest)
    files = {str(p.relative_to(dest)): p.read_text() for p in dest.rglob("*") if p.is_file()}
    assert files == {"a/g": "g", "b/new": "new", "c/keep": "changed"}
    assert not (dest / "d").exists()


def test_unpack_refuses_an_unknown_media_type_or_a_broken_blob(tmp_path: Path) -> None:
    layer = _layer(("x", "file", "x"))
    with pytest.raises(ImageInvalid, match="not supported"):
        unpack_layer(layer, "application/vnd.oci.image.layer.v1.tar+zstd", tmp_path / "d")
    with pytest.raises(ImageInvalid, match="is not a readable tar"):
        unpack_layer(b"garbage" * 100, GZIP, tmp_path / "d")
    with pytest.raises(ImageInvalid, match="is not a readable tar"):
        unpack_layer(gzip.compress(b"not a tar" * 100), GZIP, tmp_path / "d")
    unpack_layer(_layer(("x", "file", "plain"), gz=False), TAR, tmp_path / "d")
    assert (tmp_path / "d" / "x").read_text() == "plain"


# -- reading what other tools write -----------------------------------------------------------


def test_a_docker_media_type_image_reads_and_joins_entrypoint_and_cmd(tmp_path: Path) -> None:
    layout = tmp_path / "layout"
    layer = _layer(("srv/hello.txt", "file", "hi"))
    config = {
        "architecture": "amd64",
        "os": "linux",
        "config": {
            "Entrypoint": ["/bin/sh", "-c"],
            "Cmd": ["echo hi"],
            "Env": ["PATH=/usr/bin:/bin", "EMPTY=", "BARE"],
            "WorkingDir": "/srv",
        },
        "rootfs": {"type": "layers", "diff_ids": [_sha(gzip.decompress(layer))]},
    }
    entry = _hand_layout(
        layout, config, layer, types=(DOCKER_MANIFEST, DOCKER_CONFIG, DOCKER_LAYER)
    )
    _write_index(layout, entry)

    image = read_layout(layout)
    assert image.reference == entry["digest"]
    assert image.manifest.media_type == DOCKER_MANIFEST
    assert image.run == RunConfig(
        cmd=("/bin/sh", "-c", "echo hi"),
        env=(("PATH", "/usr/bin:/bin"), ("EMPTY", ""), ("BARE", "")),
        workdir="/srv",
        entrypoint=("/bin/sh", "-c"),  # the two halves, kept apart too
        args=("echo hi",),
    )
    unpack_layer(image.blobs[image.layers[0].digest], image.layers[0].media_type, tmp_path / "r")
    assert (tmp_path / "r" / "srv" / "hello.txt").read_text() == "hi"
    assert read_layout_bytes(layout_tar(image)) == image  # and it writes back the same


def test_a_nested_index_is_followed_to_this_hosts_platform(tmp_path: Path) -> None:
    layout = tmp_path / "layout"
    entry = _hand_layout(layout, {"config": {"Cmd": ["run"]}}, _layer(("x", "file", "x")))
    other = {"mediaType": MANIFEST, "digest": "sha256:" + "1" * 64, "size": 10}  # never read
    nested = {
        "schemaVersion": 2,
        "mediaType": INDEX,
        "manifests": [
            {**other, "platform": {"os": "linux", "architecture": "no-such-arch"}},
            {**entry, "platform": {"os": "linux", "architecture": host_architecture()}},
        ],
    }
    name = {"annotations": {"org.opencontainers.image.ref.name": "multi"}}
    _write_index(layout, _desc(layout, INDEX, json.dumps(nested).encode(), **name))

    image = read_layout(layout)
    assert image.reference == entry["digest"]
    assert image.name == "multi"
    assert image.run.cmd == ("run",)
    assert image.run.workdir == ""
    assert set(image.blobs) == {entry["digest"], image.config.digest, image.layers[0].digest}


def test_several_manifests_take_the_first_or_the_one_named(tmp_path: Path) -> None:
    layout = tmp_path / "layout"
    one = _hand_layout(layout, {"config": {"Cmd": ["one"]}}, _layer(("1", "file", "1")))
    two = _hand_layout(layout, {"config": {"Cmd": ["two"]}}, _layer(("2", "file", "2")))
    ref = "org.opencontainers.image.ref.name"
    _write_index(layout, {**one, "annotations": {ref: "one"}}, {**two, "annotations": {ref: "two"}})

    assert read_layout(layout).run.cmd == ("one",)
    named = read_layout(layout, name="two")
    assert (named.run.cmd, named.name, named.reference) == (("two",), "two", two["digest"])
    with pytest.raises(ImageNotFound, match="no image named 'three'") as caught:
        read_layout(layout, name="three")
    assert caught.value.hint == "names in it: one, two"


def test_the_package_surface_is_pinned() -> None:
    assert set(souq.images.__all__) == {
        "Descriptor",
        "Image",
        "RunConfig",
        "layout_tar",
        "pack_directory",
        "read_layout",
        "read_layout_bytes",
        "unpack_layer",
        "verify_blob",
        "write_layout",
    }
    for name in souq.images.__all__:
        assert hasattr(souq.images, name)
