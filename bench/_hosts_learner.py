"""The learner side of :mod:`bench.hosts`: run inside the learner host, driven by JSON lines.

``python -m bench._hosts_learner`` reads one JSON command per line on stdin and
answers each with one JSON line on stdout (so the driver can change link rates
between measurements while this process, with torch imported, lives on):

- ``{"op": "collect", "targets": [...], "sync": bool, "frames_per_batch": n,
  "prefetch": p | null, "seconds": s, "warmup": k}``: open a ``GrpcCollector``,
  pull ``k`` untimed batches, time batches for ``s`` seconds, close it. Answers
  ``{"frames_per_s", "rx_bytes_per_s", "tx_bytes_per_s", "cpu_busy"}``: the bytes counted
  by this host's ``eth0`` (its whole link, headers included) over the timed window, and
  the share of the whole machine's CPU time that was busy meanwhile (every process);
- ``{"op": "push", "targets": [...], "hidden": h, "counts": [1, 2, ...], "relay": [false,
  true]}``: for each route (each actor sent the bytes, or relayed down a chain), one timed
  ``update_policy_weights_`` of the ``"mlp"`` CartPole policy (two hidden layers of
  ``h``) to the first ``c`` actors, for every ``c`` (after one untimed warm-up push to
  all). Answers ``{"bytes", "direct" | "relayed": {"seconds": {c: s}, "tx_bytes": {c: n},
  "cpu_busy": {c: share of the machine's CPU busy during the push}, "fallbacks": n}}``;
- ``{"op": "quit"}``.
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any

__all__ = ["collect", "cpu_times", "link_bytes", "main", "push"]

_STATS = "/sys/class/net/eth0/statistics/"


def link_bytes() -> tuple[int, int]:
    """``(rx_bytes, tx_bytes)`` of this host's link so far."""
    with open(_STATS + "rx_bytes") as rx, open(_STATS + "tx_bytes") as tx:
        return int(rx.read()), int(tx.read())


def cpu_times() -> tuple[int, int]:
    """``(busy, total)`` jiffies of the whole machine so far (``/proc/stat`` is not per host)."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:9]]
    idle = fields[3] + fields[4]  # idle, iowait
    return sum(fields) - idle, sum(fields)


def collect(cmd: dict[str, Any]) -> dict[str, float]:
    """Time one collection window (see the module docstring)."""
    from learner_client import GrpcCollector

    extra: dict[str, Any] = (
        {} if cmd.get("prefetch") is None else {"prefetch": int(cmd["prefetch"])}
    )
    with GrpcCollector(
        list(cmd["targets"]),
        frames_per_batch=int(cmd["frames_per_batch"]),
        total_frames=-1,
        sync=bool(cmd["sync"]),
        connect_timeout=60.0,
        call_timeout=120.0,
        batch_timeout=120.0,
        **extra,
    ) as coll:
        batches = iter(coll)
        for _ in range(int(cmd.get("warmup", 2))):
            next(batches)
        frames, count = 0, 0
        rx0, tx0 = link_bytes()
        busy0, total0 = cpu_times()
        start = time.perf_counter()
        while True:
            batch = next(batches)
            assert batch is not None  # an endless collector yields batches, never None
            frames += int(batch.numel())
            count += 1
            elapsed = time.perf_counter() - start
            if elapsed >= float(cmd["seconds"]) and count >= 2:
                break
        rx1, tx1 = link_bytes()
        busy1, total1 = cpu_times()
    return {
        "cpu_busy": (busy1 - busy0) / max(1, total1 - total0),
        "frames_per_s": frames / elapsed,
        "rx_bytes_per_s": (rx1 - rx0) / elapsed,
        "tx_bytes_per_s": (tx1 - tx0) / elapsed,
    }


def push(cmd: dict[str, Any]) -> dict[str, Any]:
    """Time pushes of a 2-layer MLP to the first ``c`` actors (see the module docstring)."""
    import gymnasium

    from common.policies import make_policy

    env = gymnasium.make("CartPole-v1")
    hidden = int(cmd["hidden"])
    policy = make_policy("mlp", env.observation_space, env.action_space, hidden=(hidden, hidden))
    nbytes = sum(p.numel() * p.element_size() for p in policy.state_dict().values())
    out: dict[str, Any] = {"bytes": nbytes}
    for relay in cmd.get("relay", [False]):
        out[_route(relay)] = _timed_pushes(policy, list(cmd["targets"]), cmd["counts"], relay)
    return out


def _route(relay: bool) -> str:
    return "relayed" if relay else "direct"


def _timed_pushes(policy: Any, targets: list[str], counts: list[int], relay: bool) -> dict:
    """Seconds and learner bytes sent per push to the first ``c`` actors, for each ``c``."""
    import torch

    from learner_client import GrpcCollector, WeightPushSettings

    out: dict[str, Any] = {"seconds": {}, "tx_bytes": {}, "cpu_busy": {}, "fallbacks": 0}
    with GrpcCollector(
        targets,
        frames_per_batch=2 * len(targets),
        total_frames=-1,
        call_timeout=600.0,
        # Each host of the bed has a name of its own: rlfleet finds no actor local, as on
        # real hosts, so every push crosses the links.
        weight_push=WeightPushSettings(relay=relay),
    ) as coll:
        coll.update_policy_weights_(policy)  # warm-up, not timed: channels, buffers
        for count in counts:
            with torch.no_grad():
                next(policy.parameters()).add_(1e-3)  # a push nobody may skip
            _, tx0 = link_bytes()
            busy0, total0 = cpu_times()
            start = time.perf_counter()
            coll.update_policy_weights_(policy, worker_ids=coll.worker_ids[: int(count)])
            out["seconds"][str(count)] = time.perf_counter() - start
            out["tx_bytes"][str(count)] = link_bytes()[1] - tx0
            busy1, total1 = cpu_times()
            out["cpu_busy"][str(count)] = (busy1 - busy0) / max(1, total1 - total0)
        out["fallbacks"] = coll.stats()["relay_fallbacks"]
    return out


def main() -> None:
    """Answer commands until ``quit`` or the end of stdin."""
    import torch

    torch.set_num_threads(1)
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        cmd = json.loads(line)
        if cmd["op"] == "quit":
            break
        try:
            answer: dict[str, Any] = collect(cmd) if cmd["op"] == "collect" else push(cmd)
        except Exception as exc:  # reported to the driver, which records the skip
            answer = {"error": f"{type(exc).__name__}: {exc}"}
        print(json.dumps(answer), flush=True)


if __name__ == "__main__":
    main()
