"""Free TCP ports for the servers tests start (runserver, metrics endpoints, prometheus, Spark,
private database servers).

The port is chosen below the kernel's ephemeral range, never by binding port 0: the kernel
hands ports of that range to every outgoing connection, and the suites run side by side in
CI (the chaos suite beside the MariaDB suite, the PostgreSQL suite beside the others). A
server that stops and starts again on its port -- the chaos suite restarts its database
server, which is down for seconds -- could otherwise find it taken as the local port of
some other test's connection, and fail to start.
"""

from __future__ import annotations

import random
import socket
from pathlib import Path

#: Where the search starts; the kernel's ephemeral range starts at 32768 by default.
LOWEST = 10_000


def _ephemeral_start() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32_768


def free_port() -> int:
    """A TCP port of 127.0.0.1 nothing listens on or is bound to right now, outside the range
    the kernel gives outgoing connections (a random one: two suites side by side rarely
    pick the same)."""
    top = _ephemeral_start()
    if top - LOWEST < 1_000:  # an unusual ephemeral range: let the kernel choose
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            return int(sock.getsockname()[1])
    chooser = random.SystemRandom()
    for _ in range(1_000):
        port = chooser.randrange(LOWEST, top)
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free TCP port between {LOWEST} and {top}")
