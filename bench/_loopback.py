"""The raw loopback TCP anchor: plain sockets moving the same bytes rlfleet moves.

:class:`LoopbackReceivers` starts receiver processes (plain Python, no imports
of ours) that each accept one connection and then, for every message, read an
8-byte length and that many bytes into a reused buffer and answer one ack byte.
:meth:`LoopbackReceivers.transfer` sends one payload to every receiver at once
and returns the time until every ack arrived: the floor for a weight push to
that many actors. :func:`loopback_bandwidth` turns one receiver's transfer time
into MB/s (10**6 bytes), the ceiling for streaming observations.
"""

from __future__ import annotations

import socket
import struct
import subprocess
import sys
import threading
import time
from types import TracebackType

__all__ = ["LoopbackReceivers", "loopback_bandwidth"]

_RECEIVER = r"""
import socket, struct, sys
srv = socket.socket()
srv.bind(("127.0.0.1", 0))
srv.listen(1)
print(srv.getsockname()[1], flush=True)
conn, _ = srv.accept()
conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
buf = bytearray(0)
def read_exact(view, n):
    got = 0
    while got < n:
        k = conn.recv_into(view[got:n], n - got)
        if k == 0:
            sys.exit(0)
        got += k
head = bytearray(8)
while True:
    read_exact(memoryview(head), 8)
    n = struct.unpack("!Q", head)[0]
    if len(buf) < n:
        buf = bytearray(n)
    read_exact(memoryview(buf), n)
    conn.sendall(b"\x01")
"""


class LoopbackReceivers:
    """``count`` receiver processes on 127.0.0.1, each with one open connection.

    Args:
        count: Receivers (one per actor the anchor stands for).
        timeout: Seconds any one transfer may take.

    Example::

        with LoopbackReceivers(2) as rx:
            seconds = rx.transfer(memoryview(bytearray(100_000_000)))
    """

    def __init__(self, count: int = 1, *, timeout: float = 120.0) -> None:
        if count < 1:
            raise ValueError(f"count must be >= 1, got {count}")
        self._count = count
        self._timeout = timeout
        self._procs: list[subprocess.Popen[bytes]] = []
        self._socks: list[socket.socket] = []

    def __enter__(self) -> LoopbackReceivers:
        try:
            for _ in range(self._count):
                proc = subprocess.Popen(
                    [sys.executable, "-c", _RECEIVER],
                    stdout=subprocess.PIPE,
                    stdin=subprocess.DEVNULL,
                )
                self._procs.append(proc)
                port = int(proc.stdout.readline())  # type: ignore[union-attr]
                sock = socket.create_connection(("127.0.0.1", port), timeout=self._timeout)
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                self._socks.append(sock)
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def transfer(self, payload: memoryview) -> float:
        """Send ``payload`` to every receiver in parallel; seconds until all acked."""
        header = struct.pack("!Q", payload.nbytes)
        errors: list[BaseException] = []

        def one(sock: socket.socket) -> None:
            try:
                sock.sendall(header)
                sock.sendall(payload)
                if sock.recv(1) != b"\x01":
                    raise ConnectionError("loopback receiver closed without an ack")
            except BaseException as exc:  # re-raised in the caller's thread
                errors.append(exc)

        start = time.perf_counter()
        if len(self._socks) == 1:
            one(self._socks[0])
        else:
            threads = [threading.Thread(target=one, args=(s,)) for s in self._socks]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
        elapsed = time.perf_counter() - start
        if errors:
            raise errors[0]
        return elapsed

    def close(self) -> None:
        """Close the connections (receivers then exit) and reap the processes; idempotent."""
        for sock in self._socks:
            sock.close()
        self._socks.clear()
        for proc in self._procs:
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            if proc.stdout is not None:
                proc.stdout.close()
        self._procs.clear()


def loopback_bandwidth(nbytes: int, reps: int) -> list[float]:
    """MB/s (10**6 bytes) of ``reps`` transfers of ``nbytes`` to one receiver process."""
    payload = memoryview(bytearray(nbytes))
    with LoopbackReceivers(1) as rx:
        rx.transfer(payload)  # the receiver allocates its buffer on the first message
        return [nbytes / 1e6 / rx.transfer(payload) for _ in range(reps)]
