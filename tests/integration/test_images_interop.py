"""Souq's images are standard OCI images: the tools the container world uses read what Souq
writes (skopeo inspects and copies it, umoci unpacks it), and Souq reads what they write.
Debian packages both; `make test` installs them (as root); without them these tests skip."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from souq.images import pack_directory, read_layout, unpack_layer, write_layout

pytestmark = pytest.mark.skipif(
    shutil.which("skopeo") is None or shutil.which("umoci") is None,
    reason="skopeo and umoci are not installed (`make test` installs them as root)",
)


def run(*args: str, cwd: Path | None = None) -> str:
    done = subprocess.run(args, capture_output=True, text=True, cwd=cwd, timeout=120, check=False)
    assert done.returncode == 0, f"{' '.join(args)}: {done.stderr}"
    return done.stdout


def app_dir(root: Path) -> Path:
    root.mkdir(parents=True)
    (root / "app.py").write_text("print('hello')\n")
    (root / "static").mkdir()
    (root / "static" / "index.html").write_text("<h1>hi</h1>\n")
    (root / "run.sh").write_text("#!/bin/sh\nexec python3 app.py\n")
    (root / "run.sh").chmod(0o755)
    (root / "latest").symlink_to("static/index.html")
    return root


def test_skopeo_and_umoci_read_what_souq_writes(tmp_path: Path) -> None:
    image = pack_directory(
        app_dir(tmp_path / "src"),
        cmd=["./run.sh"],
        env={"GREETING": "hi"},
        workdir="/",
        name="web",
    )
    layout = tmp_path / "layout"
    write_layout(image, layout)

    inspected = json.loads(run("skopeo", "inspect", f"oci:{layout}:web"))
    assert inspected["Digest"] == image.reference
    assert inspected["Layers"] == [d.digest for d in image.layers]
    assert "GREETING=hi" in inspected["Env"]

    # A copy by skopeo keeps the manifest byte for byte: the reference does not change.
    copy = tmp_path / "copy"
    run("skopeo", "copy", f"oci:{layout}:web", f"oci:{copy}:web")
    assert read_layout(copy, name="web").reference == image.reference

    bundle = tmp_path / "bundle"
    run("umoci", "unpack", "--rootless", "--image", f"{layout}:web", str(bundle))
    rootfs = bundle / "rootfs"
    assert (rootfs / "app.py").read_text() == "print('hello')\n"
    assert (rootfs / "static" / "index.html").read_text() == "<h1>hi</h1>\n"
    assert (rootfs / "run.sh").stat().st_mode & 0o111
    assert (rootfs / "latest").is_symlink()
    assert (rootfs / "latest").read_text() == "<h1>hi</h1>\n"
    config = json.loads((bundle / "config.json").read_text())  # the runtime spec umoci made
    assert config["process"]["args"] == ["./run.sh"]
    assert "GREETING=hi" in config["process"]["env"]


def test_souq_reads_what_umoci_writes(tmp_path: Path) -> None:
    layout, bundle = tmp_path / "layout", tmp_path / "bundle"
    run("umoci", "init", "--layout", str(layout))
    run("umoci", "new", "--image", f"{layout}:app")
    run("umoci", "unpack", "--rootless", "--image", f"{layout}:app", str(bundle))
    (bundle / "rootfs" / "srv").mkdir()
    (bundle / "rootfs" / "srv" / "file.txt").write_text("made by umoci\n")
    run("umoci", "repack", "--image", f"{layout}:app", str(bundle))
    run(
        "umoci",
        "config",
        "--image",
        f"{layout}:app",
        "--config.cmd",
        "python3",
        "--config.cmd",
        "-m",
        "--config.cmd",
        "http.server",
        "--config.env",
        "X=2",
        "--config.workingdir",
        "/srv",
    )
    image = read_layout(layout, name="app")
    assert image.run.cmd == ("python3", "-m", "http.server")
    assert ("X", "2") in image.run.env
    assert image.run.workdir == "/srv"
    root = tmp_path / "root"
    root.mkdir()
    for layer in image.layers:
        unpack_layer(image.blobs[layer.digest], layer.media_type, root)
    assert (root / "srv" / "file.txt").read_text() == "made by umoci\n"
    # skopeo agrees on what the image is.
    assert json.loads(run("skopeo", "inspect", f"oci:{layout}:app"))["Digest"] == image.reference
