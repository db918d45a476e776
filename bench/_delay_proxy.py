"""A TCP proxy that adds a fixed delay each way without limiting bandwidth (netem's ``delay``).

Every chunk read from one side is written to the other ``delay`` seconds after it
was read; chunks keep their order and are read as fast as they come (so the delay
is added to every byte once, and a stream's rate is not bounded by delay x window:
the proxy holds what is in flight, as a long link does). One process serves any
number of targets: ``python -m bench._delay_proxy --delay-ms 25 host1:5000 host2:5000``
listens on ``127.0.0.1`` once per target and prints one JSON line, the list of its
listening addresses in the targets' order, then serves until killed.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys
from collections.abc import Sequence

__all__ = ["main", "serve"]

_CHUNK = 256 * 1024


async def _pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, delay: float) -> None:
    """Copy ``reader`` to ``writer``, each chunk ``delay`` seconds after it was read."""
    loop = asyncio.get_running_loop()
    chunks: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

    async def deliver() -> None:
        while True:
            due, data = await chunks.get()
            if not data:
                break
            wait = due - loop.time()
            if wait > 0:
                await asyncio.sleep(wait)
            writer.write(data)
            await writer.drain()
        with contextlib.suppress(OSError):
            writer.write_eof()

    sender = asyncio.ensure_future(deliver())
    try:
        while data := await reader.read(_CHUNK):
            chunks.put_nowait((loop.time() + delay, data))
    except OSError:
        pass
    chunks.put_nowait((loop.time() + delay, b""))
    with contextlib.suppress(OSError):
        await sender


async def _connection(
    client_r: asyncio.StreamReader,
    client_w: asyncio.StreamWriter,
    target: tuple[str, int],
    delay: float,
) -> None:
    try:
        up_r, up_w = await asyncio.open_connection(*target)
    except OSError:
        client_w.close()
        return
    try:
        await asyncio.gather(_pump(client_r, up_w, delay), _pump(up_r, client_w, delay))
    finally:
        for writer in (client_w, up_w):
            writer.close()


async def serve(targets: Sequence[str], delay: float) -> None:
    """Listen once per ``host:port`` target, print the listening addresses, serve forever."""
    servers, addresses = [], []
    for text in targets:
        host, _, port = text.rpartition(":")
        target = (host, int(port))

        async def handle(
            r: asyncio.StreamReader, w: asyncio.StreamWriter, target: tuple[str, int] = target
        ) -> None:
            await _connection(r, w, target, delay)

        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        servers.append(server)
        addresses.append(f"127.0.0.1:{server.sockets[0].getsockname()[1]}")
    print(json.dumps(addresses), flush=True)
    await asyncio.gather(*(s.serve_forever() for s in servers))


def main(argv: Sequence[str] | None = None) -> None:
    """Parse ``--delay-ms`` and the targets, then serve until killed."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--delay-ms", type=float, required=True, help="added delay each way")
    parser.add_argument("targets", nargs="+", help="host:port to forward to, one listener each")
    args = parser.parse_args(argv)
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve(args.targets, args.delay_ms / 1000.0))


if __name__ == "__main__":
    main(sys.argv[1:])
