"""One learner rank of ``bench.sharded_push``, in its own process: its shard, pushed on demand.

Started as ``python -m bench._rank --actors A,B --hidden H --layers L --rank R --world W``:
it builds the tensors of its shard of the CartPole ``mlp`` policy (hidden ``[H] * L``;
the keys are split by bytes, :func:`split_keys`, so each rank sends about as much), opens
a collector on the actors and prints ``ready``. Each ``go VERSION`` line on stdin then
pushes the shard, as part ``(R, W)`` of ``VERSION`` (``W`` 1: one whole push), and prints
``done <time.monotonic() at the end> <longest generation pause> <outcome>``; ``quit`` ends it.
"""

from __future__ import annotations

import argparse
import sys
import time

import gymnasium
import torch

from bench._rlfleet import collector
from common.policies import make_policy

__all__ = ["shapes", "split_keys"]


def shapes(hidden: int, layers: int) -> dict[str, torch.Size]:
    """The state-dict shapes of the actors' ``mlp`` policy (built on the meta device)."""
    env = gymnasium.make("CartPole-v1")
    with torch.device("meta"):
        policy = make_policy(
            "mlp", env.observation_space, env.action_space, hidden=[hidden] * layers
        )
    return {key: value.shape for key, value in policy.state_dict().items()}


def split_keys(sizes: dict[str, torch.Size], world: int) -> list[list[str]]:
    """The keys of each rank: largest first, each to the rank with the fewest elements so far."""
    ranks: list[list[str]] = [[] for _ in range(world)]
    load = [0] * world
    for key in sorted(sizes, key=lambda k: (-sizes[k].numel(), k)):
        lightest = load.index(min(load))
        ranks[lightest].append(key)
        load[lightest] += sizes[key].numel()
    return ranks


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for flag in ("--hidden", "--layers", "--rank", "--world"):
        parser.add_argument(flag, type=int, required=True)
    parser.add_argument("--actors", required=True)
    args = parser.parse_args()
    torch.set_num_threads(1)
    sizes = shapes(args.hidden, args.layers)
    generator = torch.Generator().manual_seed(args.rank)
    mine = split_keys(sizes, args.world)[args.rank]
    shard = {key: torch.randn(sizes[key], generator=generator) * 0.01 for key in mine}
    part = None if args.world == 1 else (args.rank, args.world)
    with collector(args.actors.split(","), sync=False, frames_per_batch=16) as coll:
        print("ready", flush=True)
        for line in sys.stdin:
            command, *rest = line.split()
            if command == "quit":
                break
            results = coll.update_policy_weights_(shard, version=int(rest[0]), part=part)
            end = time.monotonic()
            pause = float(coll.stats()["last_push_pause"])
            outcomes = {getattr(r, "outcome", None) for r in results.values()}
            outcome = "applied" if part is None else "/".join(sorted(o.value for o in outcomes))
            print(f"done {end} {pause} {outcome}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
