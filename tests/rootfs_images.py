"""Whole root file systems made from Debian's packages for the tests of machines of images, never
fetched from a hub: busybox (the busybox-static package's /bin/busybox and its applets, serving
HTTP with its httpd) and a Debian userland built by mmdebstrap from the host's own apt sources,
whose /usr/bin/python3 serves an app (tests/image_python_app.py).

The Debian image takes about a minute to build, so it is built once and kept, as an OCI layout,
under ``/var/tmp/souq-test-images`` in a directory named by a hash of its recipe: an unchanged
recipe is reused by every later run, a changed one builds afresh (and the stale copies go). A
lock serialises builders, so runs side by side build it once."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import platform
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

from souq.images import Image, pack_directory, read_layout, write_layout

CACHE = Path("/var/tmp/souq-test-images")

# What the machine of each image serves carries a marker that only the image holds.
BUSYBOX_MARKER = "served by the image's own busybox"
DEBIAN_MARKER = "made by mmdebstrap for souq's tests"
BUSYBOX_APPLETS = ("sh", "httpd", "ls", "test", "echo", "printf")
BUSYBOX_CMD = ["sh", "-c", 'exec httpd -f -p "$PORT" -h /www']


def busybox_root(root: Path, busybox: str) -> Path:
    """A root file system of busybox alone, with a page for its httpd under /www and a CGI
    script that lists what the server's root holds."""
    (root / "bin").mkdir(parents=True)
    shutil.copy(busybox, root / "bin" / "busybox")
    for applet in BUSYBOX_APPLETS:
        (root / "bin" / applet).symlink_to("busybox")
    (root / "www" / "cgi-bin").mkdir(parents=True)
    (root / "www" / "index.html").write_text(f"<p>{BUSYBOX_MARKER}</p>\n")
    cgi = root / "www" / "cgi-bin" / "root"
    cgi.write_text(
        "#!/bin/sh\nprintf 'Content-Type: text/plain\\r\\n\\r\\n'\n"
        "ls /\n"
        'test -e "$QUERY_STRING" && echo "visible=$QUERY_STRING"\n'
        "echo done\n"
    )
    cgi.chmod(0o755)
    for empty in ("tmp", "proc", "dev"):
        (root / empty).mkdir()
    return root


def busybox_image(root: Path, busybox: str) -> Image:
    return pack_directory(busybox_root(root, busybox), cmd=BUSYBOX_CMD, env={"PATH": "/bin"})


# -- the Debian image --------------------------------------------------------------------------

APP = Path(__file__).with_name("image_python_app.py")
DEBIAN_CMD = ["/usr/bin/python3", "/srv/app.py"]
DEBIAN_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# Debian's Essential set and python3-minimal (the interpreter and the modules it needs to run):
# no apt, no full standard library, no documentation.
DEBIAN_VARIANT = "essential"
DEBIAN_PACKAGES = ("python3-minimal",)
DPKG_EXCLUDES = ("/usr/share/doc/*", "/usr/share/man/*", "/usr/share/info/*", "/usr/share/locale/*")
# The host's own apt sources (its mirror), as apt on this host reads them.
HOST_SOURCES = (Path("/etc/apt/sources.list.d/debian.sources"), Path("/etc/apt/sources.list"))
RECIPE_VERSION = 1  # bump when what the build does changes in a way the recipe does not show


class ImageBuildFailed(RuntimeError):
    """mmdebstrap could not build the Debian test image (its output says why)."""


def host_suite() -> str:
    for line in Path("/etc/os-release").read_text().splitlines():
        if line.startswith("VERSION_CODENAME="):
            return line.split("=", 1)[1].strip('"')
    return "bookworm"


def host_sources() -> Path | None:
    return next((p for p in HOST_SOURCES if p.is_file() and p.read_text().strip()), None)


def debian_recipe() -> dict[str, object]:
    """Everything the Debian image is made of: a change to any of it builds a new one."""
    sources = host_sources()
    return {
        "version": RECIPE_VERSION,
        "suite": host_suite(),
        "architecture": platform.machine(),
        "variant": DEBIAN_VARIANT,
        "packages": list(DEBIAN_PACKAGES),
        "excludes": list(DPKG_EXCLUDES),
        "sources": sources.read_text() if sources else None,
        "app": APP.read_text(),
        "marker": DEBIAN_MARKER,
        "cmd": DEBIAN_CMD,
        "path": DEBIAN_PATH,
    }


def recipe_key(recipe: dict[str, object]) -> str:
    return hashlib.sha256(json.dumps(recipe, sort_keys=True).encode()).hexdigest()[:16]


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    with open(path, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def debian_python_layout(cache: Path = CACHE) -> Path:
    """The OCI layout of the Debian image (built now if no run built it before)."""
    recipe = debian_recipe()
    dest = cache / f"debian-python-{recipe_key(recipe)}"
    cache.mkdir(mode=0o755, parents=True, exist_ok=True)
    with _locked(cache / ".lock"):
        # What another recipe built, or a build that was killed: no one else builds now.
        for stale in [*cache.glob("debian-python-*"), *cache.glob(".build-*")]:
            if stale != dest:
                shutil.rmtree(stale, ignore_errors=True)
        if not (dest / "index.json").is_file():
            _build(recipe, dest)
    return dest


def debian_python_image(cache: Path = CACHE) -> tuple[Image, Path]:
    layout = debian_python_layout(cache)
    return read_layout(layout), layout


def _build(recipe: dict[str, object], dest: Path) -> None:
    with tempfile.TemporaryDirectory(dir=dest.parent, prefix=".build-") as work:
        root = Path(work) / "rootfs"
        sources = host_sources()
        command = [
            "mmdebstrap", "--mode=root", f"--variant={DEBIAN_VARIANT}",
            f"--include={','.join(DEBIAN_PACKAGES)}",
            *(f"--dpkgopt=path-exclude={pattern}" for pattern in DPKG_EXCLUDES),
            str(recipe["suite"]), str(root),
            *([str(sources)] if sources else []),
        ]  # fmt: skip
        # stdin is no terminal under pytest: mmdebstrap would read its sources from it.
        done = subprocess.run(
            command, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=900,
            check=False,
        )  # fmt: skip
        if done.returncode != 0:
            raise ImageBuildFailed(
                f"{' '.join(command)} exited {done.returncode}:\n{done.stderr[-4000:]}"
            )
        # An image holds no device files: the machine's runtime gives it its own /dev.
        for entry in (root / "dev").iterdir():
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry)
            else:
                entry.unlink()
        (root / "etc" / "souq-test-image").write_text(DEBIAN_MARKER + "\n")
        (root / "srv").mkdir(exist_ok=True)
        shutil.copy(APP, root / "srv" / "app.py")
        image = pack_directory(root, cmd=DEBIAN_CMD, env={"PATH": DEBIAN_PATH})
        shutil.rmtree(root)
        layout = Path(work) / "layout"
        write_layout(image, layout)
        os.chmod(layout, 0o755)
        layout.rename(dest)
