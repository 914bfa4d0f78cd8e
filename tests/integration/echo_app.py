"""A machine's app for the tests: serves on ``PORT`` (127.0.0.1) and answers every request
with JSON saying which machine and port answered, the method, the path and the headers."""

from __future__ import annotations

import json
import os
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class Echo(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def _answer(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        out = json.dumps(
            {
                "machine_id": os.environ.get("SOUQ_MACHINE_ID"),
                "port": os.environ.get("PORT"),
                "method": self.command,
                "path": self.path,
                "headers": dict(self.headers),
                "body": body.decode(errors="replace"),
            }
        ).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)

    def do_GET(self) -> None:
        self._answer()

    def do_POST(self) -> None:
        self._answer()

    def log_message(self, format: str, *args: object) -> None:
        pass


def main() -> None:
    ThreadingHTTPServer(("127.0.0.1", int(os.environ["PORT"])), Echo).serve_forever()


if __name__ == "__main__":
    main()
