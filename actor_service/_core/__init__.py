"""The actor's collection cores: their protocol, one shared base, and one module per kind.

The serving layer (runtime, servicer, ``Collect`` stream, server) sits on top and
sees a core only through :class:`CollectionCore` and :class:`CoreModels`; the
cores sit on the helpers below them (env pool, batch buffers, models, swaps,
state) and never import the serving layer:

* ``_protocol``: :class:`CollectionCore`, :class:`CoreModels` and
  :class:`BatchRecorder` (what a core counts its batches into);
* ``_identity``: :class:`ActorIdentity` (what ``Describe`` reports) and the epoch;
* ``_base``: :class:`CoreBase`, what every kind shares (lock, counters,
  trajectory ids, state dict, describe, close);
* ``_env``: :class:`EnvCore`, a gymnasium env pool and its models (``kind="env"``);
* ``_torchrl``: :class:`TorchRLCore`, a TorchRL env pool and TensorDict policies
  (``kind="torchrl"``; the only module that imports torchrl, lazily);
* ``_llm``: :class:`LLMCore`, chat slots, a task and a language model (``kind="llm"``).

The server that assembles an actor picks the core of its ``ActorConfig.kind``
(``actor_service._serve._server.CORES``): a new kind of core is one module here, a
``CoreBase`` subclass, and one line there.
"""

from __future__ import annotations

from actor_service._core._identity import ActorIdentity
from actor_service._core._protocol import BatchRecorder, CollectionCore, CoreModels

__all__ = ["ActorIdentity", "BatchRecorder", "CollectionCore", "CoreModels"]
