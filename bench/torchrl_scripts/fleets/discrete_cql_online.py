"""``cql/discrete_cql_online.py`` on actors: ``utils.env_maker`` under its transforms, e-greedy Q.

The script is the same file at pytorch/rl main (ae9719f17b1517af5c2523a36c4616f003ee55cf) as
in the torchrl 0.14.1 wheel; its ``utils.py`` is the wheel's (main's reads the batched
``action_spec`` in ``make_discretecql_model``, the wheel's the unbatched one).
"""

from __future__ import annotations

from typing import Any

from bench.torchrl_scripts.fleets.utils_env import make_env_uncut as make_env

__all__ = ["make_env", "make_policy"]


def make_policy(env: Any, cfg: Any) -> Any:
    """The script's collector policy: ``make_discretecql_model``'s Q-actor with ``EGreedyModule``.

    The epsilon the learner anneals is a buffer of that module: it travels with every push.
    """
    from utils import make_discretecql_model

    return make_discretecql_model(cfg, env, env, "cpu")[1]
