"""``cql/cql_online.py`` on actors: ``utils.env_maker`` under its transforms, and the actor.

``cql_online.py`` is the same file at pytorch/rl main (ae9719f17b1517af5c2523a36c4616f003ee55cf)
as in the torchrl 0.14.1 wheel; its ``utils.py`` differs in one line of the discrete model
(``action_spec_unbatched``), which this script does not build.
"""

from __future__ import annotations

from typing import Any

from bench.torchrl_scripts.fleets.utils_env import make_env_uncut as make_env

__all__ = ["make_env", "make_policy"]


def make_policy(env: Any, cfg: Any) -> Any:
    """The script's collector policy: ``make_cql_model(...)[0]``, the actor."""
    from utils import make_cql_model

    return make_cql_model(cfg, env, env, "cpu")[0]
