"""One learner rank of a sharded push, as its own process (``tests/integration/test_sharded_push``).

Builds the CartPole ``mlp`` policy every rank agrees on (seeded), keeps the keys
``sorted(keys)[rank::world]`` (this rank's shard) and pushes them as its part of
``--version`` to every actor given. With ``--hold`` it first prints ``ready`` and waits
for a line on stdin (the test kills it there). Prints one JSON line:
``{worker_id: [outcome, version_in_force, parts_staged]}`` or ``{"error": ..., "failed": [...]}``.
"""

from __future__ import annotations

import argparse
import json
import sys

import gymnasium
import torch

from common.policies import make_policy
from learner_client import GrpcCollector, WeightPushError


def shard(seed: int, rank: int, world: int) -> dict[str, torch.Tensor]:
    """This rank's keys of the seeded policy every rank builds alike."""
    env = gymnasium.make("CartPole-v1")
    torch.manual_seed(seed)
    state = make_policy("mlp", env.observation_space, env.action_space).state_dict()
    keys = sorted(state)[rank::world]
    return {k: state[k] for k in keys}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--actors", required=True)
    parser.add_argument("--rank", type=int, required=True)
    parser.add_argument("--world", type=int, required=True)
    parser.add_argument("--version", type=int, required=True)
    parser.add_argument("--seed", type=int, required=True)
    parser.add_argument("--hold", action="store_true")
    args = parser.parse_args()
    weights = shard(args.seed, args.rank, args.world)
    with GrpcCollector(args.actors.split(","), frames_per_batch=8) as collector:
        if args.hold:
            print("ready", flush=True)
            sys.stdin.readline()
        try:
            results = collector.update_policy_weights_(
                weights, version=args.version, part=(args.rank, args.world)
            )
        except WeightPushError as error:
            print(json.dumps({"error": str(error), "failed": sorted(error.failed)}), flush=True)
            return 1
    out = {w: [r.outcome.name, r.version_in_force, r.parts_staged] for w, r in results.items()}
    print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
