"""The app of the Debian test image (tests/rootfs_images.py), run by the image's own
/usr/bin/python3: an HTTP server of python3-minimal's modules alone (the full standard library's
http.server is not in that image), answering what its interpreter is, the image's marker, and
whether the path in the query string exists where it runs."""

import os
import socket
import sys


def answer(target: str) -> bytes:
    query = target.split("?", 1)[1] if "?" in target else ""
    with open("/etc/souq-test-image") as marker:
        lines = [
            f"executable={sys.executable}",
            f"realpath={os.path.realpath(sys.executable)}",
            f"version={sys.version.split()[0]}",
            f"marker={marker.read().strip()}",
        ]
    if query:
        lines.append(f"exists={os.path.exists(query)}")
    return ("\n".join(lines) + "\n").encode()


def serve(port: int) -> None:
    server = socket.create_server(("127.0.0.1", port))
    while True:
        conn, _ = server.accept()
        with conn:
            head = b""
            while b"\r\n\r\n" not in head:
                chunk = conn.recv(4096)
                if not chunk:
                    break
                head += chunk
            parts = head.split(b" ", 2)
            body = answer(parts[1].decode() if len(parts) == 3 else "/")
            conn.sendall(
                b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nConnection: close\r\n"
                + f"Content-Length: {len(body)}\r\n\r\n".encode()
                + body
            )


if __name__ == "__main__":
    serve(int(os.environ["PORT"]))
