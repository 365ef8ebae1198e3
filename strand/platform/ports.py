"""Free ports for a stack's services and a process group's store, from outside the kernel's
ephemeral range.

A port is chosen before its service binds it (the service is another process, started later;
torch.distributed's store is bound by rank 0 after the workers are spawned).
A port that `bind(0)` hands out lies in the ephemeral range, the same range the kernel takes
ports from for outgoing connections: the stages connect to each other and the gateway to them
over loopback while the others are still starting. An engine once found its chosen port taken
("cannot listen on 127.0.0.1:48685", two stacks on one host), most likely by such a connection
(not caught in the act); two `bind(0)` calls may also hand out the same port. Below
the range no outgoing connection takes a port, and the ports chosen together are held until all
are chosen, so no two services of a stack get the same one; the ports handed out lately are
not handed out again (a stack's metrics ports are chosen after its stage ports, by then free).
"""

from __future__ import annotations

import random
import socket
from collections import deque
from contextlib import ExitStack

# Where the chosen ports start; below it lie the well-known services of a typical host.
LOWEST_PORT = 10000
_ATTEMPTS = 200
_recent: deque[int] = deque(maxlen=512)  # this process's latest picks


def ephemeral_range() -> tuple[int, int]:
    """The kernel's range for outgoing connections (Linux's default where it cannot be read)."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            low, high = (int(v) for v in f.read().split())
        return low, high
    except (OSError, ValueError):
        return 32768, 60999


def free_ports(host: str, count: int) -> list[int]:
    """`count` distinct ports free on host, below the ephemeral range when it leaves room."""
    low, _high = ephemeral_range()
    chosen: list[int] = []
    with ExitStack() as held:
        for _ in range(count):
            sock = held.enter_context(socket.socket())
            chosen.append(_bind_one(sock, host, low))
    _recent.extend(chosen)
    return chosen


def _bind_one(sock: socket.socket, host: str, ephemeral_low: int) -> int:
    if ephemeral_low - LOWEST_PORT >= _ATTEMPTS:
        for _ in range(_ATTEMPTS):
            port = random.randrange(LOWEST_PORT, ephemeral_low)
            if port in _recent:
                continue
            try:
                sock.bind((host, port))
            except OSError:  # taken (or reserved): another
                continue
            return port
    sock.bind((host, 0))  # no room below the range, or all tries taken: the kernel's pick
    return int(sock.getsockname()[1])
