"""The actors' side of each ported TorchRL script: its env and policy factories.

Each module here is what a port's ``LocalFleet(kind="torchrl", ...)`` names: ``make_env``
and ``make_policy`` build, on an actor, the env and the acting policy the script builds on
the learner, by calling the script's own helpers where it has them (``utils_cartpole``,
``utils_mujoco``, ``utils``: importable on the actors because the script's folder is on
their ``PYTHONPATH``) and by repeating the script's few lines where it builds them inline.
The acting policy must have the learner's structure (its ``state_dict`` keys), since the
learner's policy is pushed onto it. They get the script's Hydra config as the script has it
(``cfg``, a ``DictConfig``): the port passes ``{"cfg": cfg}`` and the fleet carries it as
plain data (``common/plain_config.py``).
"""
