"""The kinds of actor, one folder each, and the registry that names them (``registry.py``).

Every kind has the same file roles where the role exists: ``core.py`` (its collection
core, a :class:`~actor_service._core._base.CoreBase`), ``models.py`` (what it holds and
swaps pushes into), ``batch.py``, ``pool.py``, ``check.py`` (what ``rlfleet-actor``
checks before it binds a port) and ``settings.py`` (the settings only that kind has, a
section of ``ActorConfig``); ``llm/`` adds ``turns.py`` and the vLLM engine files.
Kinds share only what ``actor_service._core`` holds; none imports another. This package
imports nothing itself, so a kind's settings load without the cores.
"""
