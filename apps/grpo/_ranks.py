"""How ``rlfleet-grpo`` pushes from several learner ranks, and what it checks at the end.

Under ``--nproc-per-node N`` every rank holds the same weights after each step (DDP) and
pushes them under one agreed version, ``base + 1 + step`` (``base``: the highest version an
actor held at the start): :class:`RankPusher`. Replicated (the default), each rank pushes
the whole model to the actors it owns. With ``--shard-pushes`` each rank pushes only its
part, the sorted keys ``[rank::N]``, with ``part=(rank, N)`` to every actor of the fleet;
each actor stages the parts and swaps the version in whole once all ``N`` arrived. This is
the push of sharded training (FSDP2, tensor parallel), where a rank holds only some
parameters; here the model is replicated and each rank sends its share, dividing each
rank's upload by N.

At the end each rank reads its own actors back (GetState) and records, beside the outcomes
of its pushes, whether they hold its weights at its version: :func:`rank_record`.
"""

from __future__ import annotations

import collections
import json
import pathlib
from typing import Any

import torch
from torch import nn

from apps._job.ranks import DataParallel
from common.actor_state import decode_state
from learner_client import GrpcLLMCollector, PartResult

__all__ = ["RankPusher", "rank_record", "write_rank_record"]


class RankPusher:
    """Push a rank's weights under the agreed version, whole or as this rank's part.

    Args:
        collector: This rank's collector (``rank=``, ``world_size=``; it knows every actor).
        ranks: This rank's place in the job.
        shard: Push this rank's part of the keys to every actor instead of the whole model.
        model_id: The model pushed.
    """

    def __init__(
        self, collector: GrpcLLMCollector, ranks: DataParallel, shard: bool, model_id: str
    ) -> None:
        self.collector, self.ranks, self.shard = collector, ranks, shard
        held = collector.policy_version if ranks.active else 0
        #: The last version pushed; the next push is ``version + 1`` on every rank.
        self.version = ranks.agreed_max(held)
        self.model_id = model_id
        #: How many actor answers each outcome had (``APPLIED``, ``STAGED``, ``COMPLETED``).
        self.outcomes: collections.Counter[str] = collections.Counter()

    def push(self, model: nn.Module) -> None:
        """Push ``model``'s weights under the next version (plainly when there is one rank)."""
        if not self.ranks.active:
            self.collector.update_policy_weights_(model)
            self.version = self.collector.policy_version
            self.outcomes["APPLIED"] += 1
            return
        self.version += 1  # every rank took the same step: the same version
        if not self.shard:
            applied = self.collector.update_policy_weights_(model, version=self.version)
            self.outcomes["APPLIED"] += len(applied)
            return
        state = model.state_dict()
        keys = sorted(state)[self.ranks.rank :: self.ranks.world_size]
        results: dict[int, PartResult] = self.collector.update_policy_weights_(
            {key: state[key] for key in keys},
            version=self.version,
            part=(self.ranks.rank, self.ranks.world_size),
        )
        self.outcomes.update(result.outcome.name for result in results.values())


def rank_record(collector: GrpcLLMCollector, pusher: RankPusher, model: nn.Module) -> dict:
    """This rank's pushes and, per actor it owns, the version and weights it holds.

    ``weights_equal`` is True when every tensor the actor holds for the pushed model
    equals the learner's tensor of that name.
    """
    mine = model.state_dict()
    workers = collector.state_dict()["workers"]
    actors: dict[str, dict[str, Any]] = {}
    for worker_id, blob in sorted(workers.items()):
        held = decode_state(blob.numpy().tobytes())["models"][pusher.model_id]
        weights = held["weights"]
        equal = bool(weights) and all(
            key in mine and torch.equal(value, mine[key].to(value.device, value.dtype))
            for key, value in weights.items()
        )
        actors[str(worker_id)] = {"version": int(held["version"]), "weights_equal": equal}
    return {
        "rank": pusher.ranks.rank,
        "world_size": pusher.ranks.world_size,
        "shard_pushes": pusher.shard,
        "version": pusher.version,
        "push_outcomes": dict(sorted(pusher.outcomes.items())),
        "actors": actors,
    }


def write_rank_record(out_dir: pathlib.Path, record: dict) -> pathlib.Path:
    """Write ``record`` as ``ranks/rank<r>.json`` under the output directory."""
    path = out_dir / "ranks" / f"rank{record['rank']}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=2) + "\n")
    return path
