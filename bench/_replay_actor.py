"""An actor that replays one batch: the learner's side measured without env or policy costs.

``python -m bench._replay_actor <actor flags>`` takes the actor's own flags
(``python -m actor_service --help``), collects one batch when a session opens
and then hands the same batch out again for every credit: no env steps, no
policy; the actor only encodes (one copy) and sends. It prints the actor's
ready line and stops on SIGTERM. Used by ``bench.learner_cost --mode replay``
to find the most frames/s one learner process takes.
"""

from __future__ import annotations

import asyncio
import signal
import sys
import threading
from typing import Any

from actor_service import ActorConfig, create_server, parse_config

__all__ = ["main", "replaying"]


def replaying(worker: Any) -> None:
    """Make ``worker`` hand out its first batch after each ``configure`` again and again.

    Wraps the running actor's collection core (the public server builds it; only
    its two methods are replaced, on this instance).
    """
    collect, configure = worker.collect_batch, worker.configure
    replay: list[Any] = []

    def configure_again(settings: Any) -> None:
        configure(settings)
        replay.clear()

    def collect_again(abandon: threading.Event | None = None) -> Any:
        if not replay:
            replay.append(collect(abandon))
        return replay[0]

    worker.configure, worker.collect_batch = configure_again, collect_again


async def _serve(config: ActorConfig) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    server = create_server(config)
    await server.start()
    assert server.runtime is not None
    replaying(server.runtime.core)
    print(f"rlfleet-actor ready worker_id={config.worker_id} port={server.port}", flush=True)
    await stop.wait()
    await server.stop(1.0)


def main(argv: list[str]) -> int:
    """Run a replaying actor with the actor's command-line flags."""
    asyncio.run(_serve(parse_config(argv)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
