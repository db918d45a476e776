"""The TorchRL-env actor's env pool: built from a factory or ``GymEnv``, checked, limited.

:func:`build_pool` makes what a :class:`~actor_service._kinds.torchrl.core.TorchRLCore`
steps: ``GymEnv(env, **env_kwargs)`` or the ``env_factory``'s env, ``num_envs`` copies
in a ``SerialEnv`` (``env_backend="sync"``, in-process) or a ``ParallelEnv``
(``"async"``, spawned subprocesses); an env that is batched itself (``VmasEnv``, a
``SerialEnv`` of its own) is the pool as it is. :func:`limited` puts a pool under the
``StepCounter`` of ``max_frames_per_traj``, as TorchRL's collector wraps its env.
:func:`check_torchrl_config` is what the command line runs before it binds a port.

Envs whose agents differ in shape (TorchRL's lazy stacks, ``StackedComposite`` specs)
are refused: a batch is a dense TensorDict, and a lazy stack is not one.

torchrl is an optional extra (``rlfleet[torchrl]``): it is imported inside functions
only, so an actor of another kind never loads it.
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Callable
from typing import Any

import torch
from tensordict import TensorDictBase

from actor_service._config import ActorConfig
from actor_service._core._settings import env_name
from actor_service._kinds.torchrl.models import TDModels, build_td_model, check_td_factory
from common.env_state import dense_refusal
from common.import_paths import load_callable
from common.packets import encode_packet
from common.plain_config import from_plain

__all__ = [
    "TORCHRL_EXTRA",
    "build_pool",
    "check_limit",
    "check_torchrl_config",
    "limited",
    "pool_envs",
    "probe_step",
    "single_env",
    "spec_layout",
    "torchrl_envs",
]

#: What to install for a TorchRL-env actor.
TORCHRL_EXTRA = "pip install 'rlfleet[torchrl]'"


def torchrl_envs() -> Any:
    """``torchrl.envs``, or a ValueError naming the extra to install."""
    try:
        import torchrl.envs
    except ImportError as exc:
        raise ValueError(
            f"kind 'torchrl' needs torchrl, which is not installed ({exc}): {TORCHRL_EXTRA}"
        ) from None
    return torchrl.envs


def _env_maker(config: ActorConfig) -> Callable[[], Any]:
    """What builds one env: the factory (an import path, or in memory), or ``GymEnv``.

    A partial of an importable callable pickles by reference (ParallelEnv's workers); an
    in-memory one by value (TorchRL wraps it in ``EnvCreator``). An env object given as the
    factory (in-process servers) is deep-copied for each env of the pool.
    """
    factory = config.env_factory
    if isinstance(factory, torchrl_envs().EnvBase):
        return functools.partial(copy.deepcopy, factory)
    if callable(factory):
        return functools.partial(factory, **from_plain(config.env_kwargs))
    if factory:
        return functools.partial(load_callable(factory), **from_plain(config.env_kwargs))
    return functools.partial(torchrl_envs().GymEnv, config.env, **from_plain(config.env_kwargs))


def _first_env(config: ActorConfig) -> Any:
    """One env from the factory (or ``GymEnv``), checked to be a ``torchrl.envs.EnvBase``."""
    if torch.device(config.device).type != "cpu":  # the carrier stays on the env's device
        raise ValueError(
            f"kind 'torchrl' runs its policies on the CPU for now, not {config.device!r}"
        )
    envs = torchrl_envs()
    make = _env_maker(config)
    try:
        env = make()
    except Exception as exc:
        raise ValueError(
            f"env factory {env_name(config.env_pool)!r} raised {type(exc).__name__}: {exc}"
        ) from exc
    if not isinstance(env, envs.EnvBase):
        raise ValueError(
            f"env factory {env_name(config.env_pool)!r} returned a {type(env).__name__}, "
            "not a torchrl.envs.EnvBase (kind 'torchrl')"
        )
    _check_dense(env, config)
    if env.batch_dims > 1:
        env.close(raise_if_closed=False)
        raise ValueError(
            f"env factory {env_name(config.env_pool)!r} returned an env batched over "
            f"{env.batch_dims} dims, {list(env.batch_size)}: an actor's envs are batched over "
            "one (num_envs); build it with batch_size [N] (and num_envs N), or unbatched"
        )
    if env.batch_size and env.batch_size[0] != config.num_envs:
        env.close(raise_if_closed=False)
        raise ValueError(
            f"env factory {env_name(config.env_pool)!r} returned an env batched as "
            f"{list(env.batch_size)}: num_envs must be its batch size, got {config.num_envs}"
        )
    return env


def _check_dense(env: Any, config: ActorConfig) -> None:
    """Refuse an env whose specs hold lazy stacks (agents of different shapes) or -1 dims."""
    if refusal := dense_refusal(env, f"env factory {env_name(config.env_pool)!r}"):
        env.close(raise_if_closed=False)
        raise ValueError(refusal)


def check_torchrl_config(config: ActorConfig) -> None:
    """What the command line checks before binding a port: one env and every model on it.

    Raises:
        ValueError: torchrl missing (naming the extra), a device other than the CPU, an env
            factory that raises or returns no TorchRL env, or a model the kind cannot build
            (``mlp``, a policy factory that raises or returns no ``TensorDictModuleBase``).
    """
    for spec in config.models:
        check_td_factory(spec)
    env = _first_env(config)
    # Models see the pool's steps: batched where it batches several envs (a SerialEnv of
    # one here), unbatched where it is one unbatched env, as TorchRL's collector steps it.
    batched = env.batch_size or single_env(config)
    pooled = env if batched else torchrl_envs().SerialEnv(1, lambda: env)
    try:
        models = {  # random actions for the pool's batch, as the core draws them
            spec.model_id: build_td_model(spec, env, pooled.rand_action, torch.device("cpu"))
            for spec in config.models
        }
        book = TDModels(models)
        with torch.random.fork_rng(), torch.no_grad():
            for model_id in models:
                act = functools.partial(book.act, model_id)
                probe_step(pooled, env_name(config.env_pool), model_id, act)
    finally:
        pooled.close(raise_if_closed=False)
        env.close(raise_if_closed=False)


def probe_step(
    env: Any, env_id: str, model_id: str, act: Callable[[Any], object]
) -> tuple[dict[Any, tuple[torch.Size, torch.dtype]], int]:
    """One reset and step of ``env`` with a model: what it must do before collecting.

    Returns:
        The shape and dtype of each tensor the model adds, and the step's packet size.

    Raises:
        ValueError: The model or the env fails on the step, or the step cannot travel
            (a key whose value no packet holds, such as a non-string Python object).
    """
    try:
        carrier = env.reset()
        before = set(carrier.keys(True, True))
        act(carrier)
        outputs = {
            key: (value.shape, value.dtype)
            for key, value in carrier.items(True, True)
            if key not in before and isinstance(value, torch.Tensor)
        }
        stepped = env.step(carrier)
    except Exception as exc:
        raise ValueError(
            f"model {model_id!r} fails on the probe step of {env_id!r}: {type(exc).__name__}: {exc}"
        ) from exc
    try:
        size = encode_packet(stepped.clear_device_()).nbytes
    except (TypeError, ValueError) as exc:
        raise ValueError(
            f"a step of {env_id!r} with model {model_id!r} cannot travel: {exc} (convert the "
            "key with a transform, e.g. torchrl.envs.DTypeCastTransform for a dtype, or leave "
            "it out with ExcludeTransform)"
        ) from exc
    return outputs, size


def build_pool(config: ActorConfig) -> tuple[Any, Any]:
    """The env pool and one env of its kind for the policy factories (the caller closes it).

    ``num_envs`` envs in a ``SerialEnv`` (``sync``) or ``ParallelEnv`` (``async``, spawned);
    an env batched already, or the one env of a sync pool of one (:func:`single_env`), is both.
    """
    env = _first_env(config)
    if env.batch_size or single_env(config):
        return env, env
    envs = torchrl_envs()
    make = _env_maker(config)
    if config.env_backend == "sync":
        return envs.SerialEnv(config.num_envs, make), env
    return envs.ParallelEnv(config.num_envs, make, mp_start_method="spawn"), env


def spec_layout(pool: Any) -> dict[Any, tuple[tuple[int, ...], Any]]:
    """The shape and dtype of every key ``pool``'s specs declare (what its batches carry).

    Bounds are left out: a transform's statistics may move them between two builds.
    """
    layout: dict[Any, tuple[tuple[int, ...], Any]] = {}
    for specs in (pool.output_spec, pool.input_spec):
        for key, spec in specs.items(include_nested=True, leaves_only=True):
            layout[key] = (tuple(spec.shape), spec.dtype)
    return layout


def single_env(config: ActorConfig) -> bool:
    """Whether the pool is one env stepped as it is, in-process (``--num-envs 1``, sync).

    TorchRL's ``Collector`` steps a single env as it is; a ``SerialEnv`` of one around it
    would cost a fifth more per step on a MuJoCo env with transforms, and give its
    policy a batch dimension TorchRL's does not. Batches still travel as ``[1, T]``.
    """
    return config.num_envs == 1 and config.env_backend == "sync"


def pool_envs(pool: Any) -> list[Any] | None:
    """The envs ``pool`` steps in this process (a push reaches their weights); None: ParallelEnv.

    A ``SerialEnv``'s envs exist once it was reset or started (:func:`start_pool`).
    """
    envs = torchrl_envs()
    if isinstance(pool, envs.ParallelEnv):
        return None
    if isinstance(pool, envs.SerialEnv):
        return list(pool._envs)
    return [pool]


def start_pool(pool: Any) -> None:
    """Make a batched pool's envs (a ``SerialEnv`` makes them at its first reset or start)."""
    envs = torchrl_envs()
    if isinstance(pool, envs.SerialEnv | envs.ParallelEnv) and pool.is_closed:
        pool.start()


def check_limit(base: Any, limit: int) -> None:
    """Refuse ``max_frames_per_traj=limit`` on an env that counts steps already.

    Raises:
        ValueError: The env has a ``step_count`` key (TorchRL refuses it alike).
    """
    if limit > 0 and any(
        "step_count" in ((k,) if isinstance(k, str) else k)
        for k in base.output_spec.keys(True, True)
    ):
        raise ValueError(
            "max_frames_per_traj: the env has a 'step_count' key already (a StepCounter); "
            "set its max_steps in the factory instead"
        )


def limited(base: Any, limit: int) -> Any:
    """``base`` as TorchRL's collector steps it for ``max_frames_per_traj=limit``.

    Raises:
        ValueError: As :func:`check_limit`.
    """
    check_limit(base, limit)
    if limit <= 0:
        return base
    envs = torchrl_envs()
    return envs.TransformedEnv(base, envs.StepCounter(max_steps=limit))


def counted_reset(counted: Any, carrier: TensorDictBase) -> TensorDictBase:
    """``carrier`` (the base pool's reset) as :func:`limited`'s ``counted`` would reset it.

    The ``StepCounter``'s own reset writes it: ``step_count`` 0, and the truncated and done
    entries its ``max_steps`` sets (an env without a truncated key gets one from it).
    """
    return counted.transform._reset(carrier.empty(), carrier)


def counter_keys(counted: Any, base: Any) -> list[Any]:
    """The entries :func:`limited`'s ``counted`` adds to what ``base`` steps."""

    def entries(env: Any) -> set[Any]:
        return {*env.observation_spec.keys(True, True), *env.full_done_spec.keys(True, True)}

    return sorted(entries(counted) - entries(base), key=str)
