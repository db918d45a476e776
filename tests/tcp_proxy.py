"""A TCP proxy for fault tests: pass traffic, cut connections, refuse new ones, flip bits.

One proxy stands in front of one actor (``address`` is what the learner dials). ``reset()``
cuts every open connection; ``refusing`` closes new ones at once (an actor that looks
down); ``corrupt_after(n)`` flips one bit of the actor→learner bytes once ``n`` more bytes
have passed (a bit flip the transport must not hide); ``stretch_next_message()`` flips one
bit of the next gRPC message's length prefix, found by following the HTTP/2 frames (a bit
flip that leaves the learner waiting, over a whole connection, for bytes that never come);
``stall_connection(i, n)`` holds the i-th connection's learner→actor bytes after ``n`` of
them until ``release_stall()`` (one stream of several stuck, as behind a lossy path).
"""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Callable

_FRAME_HEADER = 9  # HTTP/2: length (3 bytes), type, flags, stream id (4 bytes)
_DATA_FRAME = 0
_PREFIX = 5  # gRPC: compressed flag, then the message length (4 bytes, big-endian)


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
        self._stretch = False
        self.stretched = 0
        self._accepted = 0
        self._stall: tuple[int, int] | None = None  # (connection index, bytes let through)
        self._stall_released = threading.Event()
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
                index, self._accepted = self._accepted, self._accepted + 1
                stall = self._stall[1] if self._stall and self._stall[0] == index else None
            self._spawn(self._pipe, client, upstream, None, stall)
            self._spawn(self._pipe, upstream, client, _GrpcMessages(self._take_stretch))

    def stall_connection(self, index: int, after_bytes: int) -> None:
        """Hold connection ``index``'s learner→actor bytes after ``after_bytes`` of them."""
        with self._lock:
            self._stall = (index, after_bytes)

    def release_stall(self) -> None:
        """Let a stalled connection's bytes flow again."""
        self._stall_released.set()

    def corrupt_after(self, nbytes: int) -> None:
        """Flip one bit of the actor→learner stream once ``nbytes`` more bytes have passed."""
        with self._lock:
            self._corrupt_in = nbytes

    def stretch_next_message(self) -> None:
        """Flip bit 20 of the next actor→learner gRPC message's length (+1 MiB, or -1 MiB)."""
        with self._lock:
            self._stretch = True

    def _take_stretch(self) -> bool:
        with self._lock:
            stretch, self._stretch = self._stretch, False
            self.stretched += stretch
        return stretch

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

    def _pipe(
        self,
        source: socket.socket,
        sink: socket.socket,
        downstream: _GrpcMessages | None,
        stall_after: int | None = None,
    ) -> None:
        passed = 0
        with contextlib.suppress(OSError):
            while data := source.recv(65536):
                if downstream is not None:
                    data = self._maybe_corrupt(downstream.follow(bytearray(data)))
                if stall_after is not None and passed >= stall_after:
                    self._stall_released.wait()
                sink.sendall(data)
                passed += len(data)
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
        self._stall_released.set()
        with contextlib.suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)  # wakes accept()
        self._listener.close()
        self.reset()
        for thread in self._threads:
            thread.join(5)


class _GrpcMessages:
    """Follows one direction's HTTP/2 frames to the gRPC message prefixes in its DATA frames.

    Bytes pass through unbuffered; at the second length byte of a prefix, ``take_stretch()``
    decides whether to flip its bit 4 (bit 20 of the length). gRPC pads no frames, and the
    actor's framing is followed as sent (the flip changes what the learner reads, not this).
    """

    def __init__(self, take_stretch: Callable[[], bool]) -> None:
        self._take_stretch = take_stretch
        self._header = bytearray()  # the frame header read so far
        self._frame_left = 0  # payload bytes left of the frame being read
        self._stream = 0  # the stream id of the DATA frame being read (0: another frame)
        self._prefixes: dict[int, bytearray] = {}  # each stream's message prefix read so far
        self._message_left: dict[int, int] = {}  # each stream's bytes left of its message

    def follow(self, data: bytearray) -> bytearray:
        """Pass ``data`` on (a length byte may be flipped in place)."""
        pos = 0
        while pos < len(data):
            if len(self._header) < _FRAME_HEADER:
                step = min(_FRAME_HEADER - len(self._header), len(data) - pos)
                self._header += data[pos : pos + step]
                pos += step
                if len(self._header) == _FRAME_HEADER:
                    self._frame_left = int.from_bytes(self._header[:3], "big")
                    stream = int.from_bytes(self._header[5:], "big") & 0x7FFFFFFF
                    self._stream = stream if self._header[3] == _DATA_FRAME else 0
            else:
                step = min(self._frame_left, len(data) - pos)
                if self._stream:
                    self._messages(data, pos, pos + step)
                pos += step
                self._frame_left -= step
            if len(self._header) == _FRAME_HEADER and self._frame_left == 0:
                self._header.clear()  # the frame is whole (or had no payload)
        return data

    def _messages(self, data: bytearray, pos: int, end: int) -> None:
        stream = self._stream
        while pos < end:
            left = self._message_left.get(stream, 0)
            if left:
                step = min(left, end - pos)
                self._message_left[stream] = left - step
                pos += step
                continue
            prefix = self._prefixes.setdefault(stream, bytearray())
            prefix.append(data[pos])
            if len(prefix) == 3 and self._take_stretch():
                data[pos] ^= 0x10
            pos += 1
            if len(prefix) == _PREFIX:
                self._message_left[stream] = int.from_bytes(prefix[1:], "big")
                prefix.clear()
