"""Whole root file systems made from Debian's packages for the tests of machines of images, never
fetched from a hub: busybox (the busybox-static package's /bin/busybox and its applets, serving
HTTP with its httpd)."""

from __future__ import annotations

import shutil
from pathlib import Path

from souq.images import Image, pack_directory

# What the machine of the image serves carries a marker that only the image holds.
BUSYBOX_MARKER = "served by the image's own busybox"
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
