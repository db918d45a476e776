"""A TCP proxy for fault tests: pass traffic, cut connections, refuse new ones, flip bits.

One proxy stands in front of one actor (``address`` is what the learner dials). ``reset()``
cuts every open connection; ``refusing`` closes new ones at once (an actor that looks
down); ``corrupt_after(n)`` flips one bit of the actor→learner bytes once ``n`` more bytes
have passed (a bit flip the transport must not hide).
"""

from __future__ import annotations

import contextlib
import socket
import threading


class FaultProxy:
    """A TCP proxy to one actor whose connections can be cut, refused or corrupted."""

    def __init__(self, target: tuple[str, int]) -> None:
        self._target = target
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.address = f"127.0.0.1:{self._listener.getsockname()[1]}"
        self._lock = threading.Lock()
        self._sockets: list[socket.socket] = []
        self._threads: list[threading.Thread] = []
        self.refusing = False  # while True, new connections are closed at once
        self._corrupt_in: int | None = None
        self.corrupted = 0
        self._spawn(self._accept)

    def _spawn(self, target, *args) -> None:
        thread = threading.Thread(target=target, args=args, daemon=True)
        self._threads.append(thread)
        thread.start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            if self.refusing:
                client.close()
                continue
            upstream = socket.create_connection(self._target)
            with self._lock:
                self._sockets += [client, upstream]
            self._spawn(self._pipe, client, upstream, False)
            self._spawn(self._pipe, upstream, client, True)

    def corrupt_after(self, nbytes: int) -> None:
        """Flip one bit of the actor→learner stream once ``nbytes`` more bytes have passed."""
        with self._lock:
            self._corrupt_in = nbytes

    def _maybe_corrupt(self, data: bytes) -> bytes:
        with self._lock:
            if self._corrupt_in is None:
                return data
            if self._corrupt_in >= len(data):
                self._corrupt_in -= len(data)
                return data
            at, self._corrupt_in = self._corrupt_in, None
            self.corrupted += 1
        flipped = bytearray(data)
        flipped[at] ^= 0x10
        return bytes(flipped)

    def _pipe(self, source: socket.socket, sink: socket.socket, downstream: bool) -> None:
        with contextlib.suppress(OSError):
            while data := source.recv(65536):
                sink.sendall(self._maybe_corrupt(data) if downstream else data)
        for sock in (source, sink):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    def reset(self) -> None:
        """Cut every open connection (the learner sees its stream break)."""
        with self._lock:
            sockets, self._sockets = self._sockets, []
        for sock in sockets:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)  # wakes the pipe threads blocked in recv()
            sock.close()

    def close(self) -> None:
        """Stop accepting, cut every connection and join the pipe threads."""
        with contextlib.suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)  # wakes accept()
        self._listener.close()
        self.reset()
        for thread in self._threads:
            thread.join(5)
