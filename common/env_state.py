"""A TorchRL env's state (its stateful transforms), as both sides read it.

An actor's env and a script's ``create_env_fn`` env hold state in their transforms
(``VecNorm``'s statistics, ``CatFrames``' frames, an ``ObservationNorm``'s ``loc``): the actor
hands it over in its ``state_dict()["env"]``, the learner loads it into the script's env, and
the actor starts its envs anew when its probe step moved it (``actor_service``'s TorchRL
core). Both ask :func:`env_has_state` whether there is any.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator
from typing import Any

__all__ = ["env_has_state", "quiet_fresh_vecnorm"]

#: TorchRL's warnings about a ``VecNorm`` read or loaded before it saw a frame: they concern
#: statistics shared between processes, which the envs read here never share.
_FRESH_VECNORM = ("Querying state_dict on an uninitialized VecNorm", "VecNorm wasn't initialized")


@contextlib.contextmanager
def quiet_fresh_vecnorm() -> Iterator[None]:
    """Hide :data:`_FRESH_VECNORM` (and nothing else) within the block."""
    with warnings.catch_warnings():
        for message in _FRESH_VECNORM:
            warnings.filterwarnings("ignore", message=message, category=UserWarning)
        yield


def env_has_state(env: Any) -> bool:
    """Whether ``env`` has state to follow: stateful transforms, initialised or not yet.

    A transform that builds its buffers at the first step (``CatFrames``'s frames, an
    ``ObservationNorm`` before ``init_stats``) has state too: its ``state_dict()`` raises.
    """
    with quiet_fresh_vecnorm():
        try:
            return bool(env.state_dict())
        except ValueError:  # an uninitialised (lazy) buffer: state, once the env steps
            return True
        except (RuntimeError, AttributeError, TypeError):
            return False
