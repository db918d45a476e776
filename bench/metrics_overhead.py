"""What Prometheus metrics cost the collection loop: CartPole frames/s with metrics on vs off.

Two one-actor fleets run side by side (``python -m actor_service`` subprocesses,
8 CartPole envs, the ``"mlp"`` policy, one torch thread): one with
``--metrics-port``, one without. Only one collects at a time (an actor without a
session steps nothing); each repetition measures both back to back, off first
in even repetitions and on first in odd ones. While the metrics actor collects, a thread
scrapes its ``/metrics`` every ``--scrape-interval`` seconds (Prometheus
scrapes every 5-15 s; 1 s is harsher), and the learner of that window serves
its own metrics too (``serve_metrics(collector, 0)``), scraped as often.

The end-to-end windows carry the noise of a shared machine (other processes,
gRPC, the learner). A second figure isolates the collection loop: the cores of
two in-process actor servers, one with a metrics port and one without, collect
alternately batch by batch, so both see the same load; the loop's frames/s of
each is summed over all its batches.

Target: on/off >= 0.97 (the median of the per-pair ratios), i.e. no cost the
noise of this machine lets us see.

Usage: ``python -m bench.metrics_overhead [--quick] [--reps 5] [--window 4]``.
"""

from __future__ import annotations

import argparse
import socket
import threading
import time
import urllib.request
from collections.abc import Sequence
from typing import Any

from bench._common import Report, base_parser, parse, reps_of, set_single_thread, time_batches

__all__ = ["main"]


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = base_parser(__doc__.splitlines()[0], num_envs=8)
    parser.add_argument("--frames-per-batch", type=int, default=1024, help="frames per batch")
    parser.add_argument("--window", type=float, default=None, help="seconds per timed window")
    parser.add_argument("--scrape-interval", type=float, default=1.0, help="seconds per scrape")
    args = parse(parser, argv)
    if args.window is None:
        args.window = 0.5 if args.quick else 4.0
    return args


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class _Scraper:
    """Scrapes ``urls`` every ``interval`` seconds on a thread until stopped."""

    def __init__(self, urls: list[str], interval: float) -> None:
        self._urls, self._interval = urls, interval
        self._stop = threading.Event()
        self.scrapes = 0
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            for url in self._urls:
                with urllib.request.urlopen(url, timeout=10) as reply:
                    reply.read()
                self.scrapes += 1

    def stop(self) -> int:
        self._stop.set()
        self._thread.join(timeout=30)
        return self.scrapes


def _window(address: str, args: argparse.Namespace, metrics_port: int | None) -> float:
    from bench import _rlfleet
    from learner_client import serve_metrics

    with _rlfleet.collector([address], sync=True, frames_per_batch=args.frames_per_batch) as coll:
        scraper = None
        if metrics_port is not None:
            learner = serve_metrics(coll, 0, host="127.0.0.1").port
            urls = [f"http://127.0.0.1:{port}/metrics" for port in (metrics_port, learner)]
            scraper = _Scraper(urls, args.scrape_interval)
        try:
            fps, _ = time_batches(iter(coll), seconds=args.window, min_batches=2, warmup=2)
        finally:
            if scraper is not None and not args.quick:
                assert scraper.stop() > 0, "the metrics window was never scraped"
            elif scraper is not None:
                scraper.stop()
    return fps


def _loop_pair(args: argparse.Namespace) -> tuple[float, float]:
    """Frames/s of the collection core without and with metrics, batches interleaved.

    The cores are those of two in-process actor servers (one with a metrics port), driven
    directly: no session is open, so nothing else touches them.
    """
    from actor_service import ActorConfig, create_server
    from common.config import CollectSettings

    settings = CollectSettings(frames_per_batch=args.frames_per_batch)
    elapsed = {"off": 0.0, "on": 0.0}
    frames = {"off": 0, "on": 0}
    configs = {
        name: ActorConfig(port=0, num_envs=args.num_envs, seed=1, metrics_port=port)
        for name, port in (("off", None), ("on", 0))
    }
    with (
        create_server(configs["off"]).run_in_thread() as off,
        create_server(configs["on"]).run_in_thread() as on,
    ):
        assert off.server.metrics is None
        assert on.server.metrics is not None
        workers = {"off": off.server.runtime.core, "on": on.server.runtime.core}
        for worker in workers.values():
            worker.configure(settings)
            worker.collect_batch()  # warm-up
        deadline = time.perf_counter() + 2 * args.window
        while time.perf_counter() < deadline:
            for name, worker in workers.items():
                start = time.perf_counter()
                frames[name] += int(worker.collect_batch().numel())
                elapsed[name] += time.perf_counter() - start
    return frames["off"] / elapsed["off"], frames["on"] / elapsed["on"]


def run(args: argparse.Namespace, report: Report) -> None:
    """Alternate windows off / on and record both figures and their pairwise ratio."""
    from bench import _rlfleet

    port = _free_port()
    samples: dict[str, list[float]] = {"metrics off": [], "metrics on": []}
    common = {"env": "CartPole-v1", "num_envs": args.num_envs, "policy": "mlp"}
    with (
        _rlfleet.fleet(1, **common) as off,
        _rlfleet.fleet(1, extra_args=["--metrics-port", str(port)], **common) as on,
    ):
        for rep in range(reps_of(args)):
            # Which goes first alternates, so an order effect cancels over the pairs.
            order = [("metrics off", off, None), ("metrics on", on, port)]
            for name, fleet, metrics_port in order if rep % 2 == 0 else order[::-1]:
                samples[name].append(_window(fleet.addresses[0], args, metrics_port))
            print(
                f"rep {rep}: off {samples['metrics off'][-1]:,.0f} frames/s, "
                f"on {samples['metrics on'][-1]:,.0f} frames/s",
                flush=True,
            )
    for rep in range(reps_of(args)):
        loop_off, loop_on = _loop_pair(args)
        samples.setdefault("loop metrics off", []).append(loop_off)
        samples.setdefault("loop metrics on", []).append(loop_on)
        print(f"loop rep {rep}: off {loop_off:,.0f} frames/s, on {loop_on:,.0f} frames/s")
    for name, values in samples.items():
        report.figure(name, "frames/s", values)
    ratio = report.ratio("metrics on/off", "metrics on", "metrics off")
    report.target("metrics on >= 0.97 x metrics off", ratio, 0.97)
    loop = report.ratio("loop metrics on/off", "loop metrics on", "loop metrics off")
    report.target("collection loop: metrics on >= 0.97 x off", loop, 0.97)


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Run the benchmark; prints the table and the final JSON line; returns the payload."""
    args = parse_args(argv)
    set_single_thread()
    report = Report("metrics", quick=args.quick)
    report.note(
        f"1 actor x {args.num_envs} envs, {args.frames_per_batch} frames per batch, "
        f"{args.window:g} s windows, a scrape of the actor and of the learner every "
        f"{args.scrape_interval:g} s in the metrics windows"
    )
    run(args, report)
    return report.emit()


if __name__ == "__main__":
    main()
