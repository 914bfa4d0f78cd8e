"""What ``ps`` shows a process listening on, read from its own network namespace's tables
(souq.agent.machines.listening): this process's own sockets, bound for the test."""

from __future__ import annotations

import os
import socket

from souq.agent.machines.listening import listening


def test_the_sockets_a_process_listens_on_and_not_the_others() -> None:
    tcp4 = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    tcp6 = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
    udp4 = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    bound_only = socket.socket(socket.AF_INET, socket.SOCK_STREAM)  # bound, not listening
    connected = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sockets = (tcp4, tcp6, udp4, bound_only, connected)
    try:
        tcp4.bind(("127.0.0.1", 0))
        tcp4.listen()
        tcp6.bind(("::1", 0))
        tcp6.listen()
        udp4.bind(("127.0.0.1", 0))
        bound_only.bind(("127.0.0.1", 0))
        connected.connect(("127.0.0.1", udp4.getsockname()[1]))
        found = set(listening(os.getpid()))
        assert ("tcp", "127.0.0.1", tcp4.getsockname()[1]) in found
        assert ("tcp6", "::1", tcp6.getsockname()[1]) in found
        assert ("udp", "127.0.0.1", udp4.getsockname()[1]) in found
        ports = {port for _proto, _host, port in found}
        assert bound_only.getsockname()[1] not in ports
        assert connected.getsockname()[1] not in ports
    finally:
        for s in sockets:
            s.close()
