"""The TorchRL-env actor's collection core: a TorchRL env pool + TensorDict policies → batches.

A :class:`TorchRLCore` (``ActorConfig.kind="torchrl"``) hosts what a worker of TorchRL's
collector hosts: a ``torchrl.envs.EnvBase`` with its transforms and any
``TensorDictModuleBase`` policy, and collects with the semantics of TorchRL 0.14.1's
``Collector(env, policy, frames_per_batch=..., track_policy_version=True)``, using
TorchRL's own ``env.step_and_maybe_reset`` and ``rand_action``: whatever keys the env,
its transforms and the policy write reach the batch with TorchRL's nesting and dtypes.

The env pool comes from :func:`~actor_service._kinds.torchrl.pool.build_pool` (a
``SerialEnv``/``ParallelEnv`` of ``num_envs`` envs, or an env batched itself);
``max_frames_per_traj`` steps it under a ``StepCounter``, as TorchRL's collector wraps
its env. What rlfleet adds stays: credits and sessions (the serving layer), the weight
swap between steps and the version of the weights that chose each frame
(``policy_version``), fleet-unique ``("collector", "traj_ids")``, ``init_random_frames``
per session, the seed chain, state, metrics and draining.

torchrl is an optional extra (``rlfleet[torchrl]``): it is imported here only, inside
functions, so an actor of another kind never loads it.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import threading
import time
from typing import Any

import numpy as np
import torch
from tensordict import TensorDict, TensorDictBase
from tensordict.nn import set_interaction_type

from actor_service._config import ActorConfig
from actor_service._core._base import CoreBase, check_abandoned
from actor_service._core._frames import interaction_of, split_trajectories
from actor_service._core._protocol import BatchRecorder
from actor_service._core._settings import env_name
from actor_service._kinds.torchrl.batch import (
    FrameStacker,
    flat_state,
    fold_observations,
    nested_state,
    stack_frames,
    stage_env_state,
)
from actor_service._kinds.torchrl.models import TDModel, TDModels, build_td_model
from actor_service._kinds.torchrl.pool import (
    build_pool,
    check_limit,
    counted_reset,
    counter_keys,
    limited,
    pool_envs,
    probe_step,
    spec_layout,
    start_pool,
)
from common.config import MAX_FRAMES_PER_BATCH, CollectSettings
from common.env_state import env_has_state
from common.env_weights import ENV_MODEL_ID, env_parameters, parameters_module, tie_parameters
from common.errors import EnvError, WeightsError
from common.packets import DEFAULT_LIMITS
from common.packets.folding import FoldedBatch

__all__ = ["TorchRLCore"]

_TRAJ_IDS = ("collector", "traj_ids")

log = logging.getLogger(__name__)


class TorchRLCore(CoreBase):
    """A TorchRL env pool + TensorDict policies → batches (see the module docstring).

    Batches are ``[num_envs, T]`` (names ``[None, "time"]``, no device) with exactly
    the keys, nesting and dtypes TorchRL's ``Collector`` yields for the same env and
    policy (its private ``_`` keys left out, as TorchRL leaves them out), plus
    ``policy_version`` and ``("next", "policy_version")`` (``[N, T]`` int64: the version
    of the weights that chose the action) and ``("collector", "traj_ids")`` unique
    across the fleet. Episode ends are reset by ``env.step_and_maybe_reset``.

    Args:
        config: The actor's settings (``kind="torchrl"``).
        metrics: Where to count batches and step latencies; None counts nothing.

    Attributes:
        num_slots: The pool's batch size (``config.num_envs``).
        models: The :class:`~actor_service._kinds.torchrl.models.TDModels` (pushes go through it).
        env: The env policy factories got (specs at hand; closed once the models exist).

    Raises:
        ValueError: torchrl missing, an env or a model that cannot be built, a policy
            that fails on the probe step, or a step whose keys cannot travel.

    Example::

        config = ActorConfig(kind="torchrl", env="CartPole-v1", num_envs=4,
                             models=(ModelSpec(factory="random"),))
        with TorchRLCore(config) as core:
            core.configure(CollectSettings(frames_per_batch=64))
            batch = core.collect_batch()        # [4, 16]
    """

    kind = "torchrl"
    state_sections = frozenset({"env"})  # the env's state (stateful transforms)
    models: TDModels
    _carrier: TensorDictBase  # the envs' current step, set by every reset and step

    def __init__(self, config: ActorConfig, metrics: BatchRecorder | None = None) -> None:
        super().__init__(config, metrics)
        self.env_id = env_name(config.env_pool)
        self.backend = config.env_backend
        self._session_frames = 0
        #: Build the pool anew before its next use (it crashed, or the probe moved its state).
        self._rebuild_pending = self._needs_reset = False
        torch.manual_seed(self._first_seed)  # model initialisation is part of what a seed fixes
        self._base, self.env = build_pool(config)
        self._layout = spec_layout(self._base)  # every rebuild must declare the same
        #: What is stepped: the base pool, or it under the StepCounter of max_frames_per_traj
        #: (one wrapper, kept: a TorchRL env closes what it wraps when collected).
        self._pool, self._limit, self._counted = self._base, 0, None
        self._envs_shape = self._base.batch_size  # the pool's, read once per batch
        self._stacker = FrameStacker()
        try:
            self.models = TDModels(
                {
                    s.model_id: build_td_model(s, self.env, self._rand_action, self.device)
                    for s in config.models
                }
            )
            if self.env is not self._pool:
                self.env.close(raise_if_closed=False)
            self._probe()
            self._env_weights = self._hold_env_weights()
            # The probe's reset and step moved the envs' state (VecNorm's counts, from an
            # unseeded reset): they are built anew, as TorchRL's env before its collector.
            self._rebuild_pending = env_has_state(self._base)
            self.set_seed(self._first_seed)
        except BaseException:
            self._base.close(raise_if_closed=False)
            raise

    def _hold_env_weights(self) -> dict[str, torch.nn.Parameter]:
        """Hold the envs' own weights (their transforms' networks) as the model ``"env"``.

        Every env of the pool is tied to the first one's parameters, so a push of
        :data:`~common.env_weights.ENV_MODEL_ID` reaches all of them, between two steps
        (:meth:`_step` steps under ``_env_guard``, that model's lock). Empty when the envs
        have no weights.

        Raises:
            ValueError: A policy model is named ``"env"``, or the envs build different networks.
        """
        self._env_guard: contextlib.AbstractContextManager[Any] = contextlib.nullcontext()
        envs = pool_envs(self._base)
        if envs is None:
            if held := len(env_parameters(self.env)):
                log.warning(
                    "the env holds weights (%d parameters) that pushes cannot reach in "
                    "env_backend='async' (its envs live in other processes): use 'sync' if "
                    "the learner trains them",
                    held,
                )
            return {}
        named = env_parameters(envs[0])
        if not named:
            return {}
        if ENV_MODEL_ID in self.models.model_ids:
            raise ValueError(
                f"model_id {ENV_MODEL_ID!r} names the env's own weights on this actor (its "
                "transforms hold parameters): give the policy model another id"
            )
        for env in envs[1:]:
            tie_parameters(env, named)
        model = TDModel("env", parameters_module(named), _does_not_act)
        self.models.add(ENV_MODEL_ID, model)
        self._env_guard = model.lock  # a push lands between two steps
        return named

    def _rand_action(self, tensordict: TensorDictBase) -> TensorDictBase:
        """Random actions from the action spec of the pool in use (rebuilt after a crash)."""
        return self._pool.rand_action(tensordict)

    def _probe(self) -> None:
        """One reset and step with every model: it must act and its keys must travel.

        Sets ``_step_bytes``, the largest packet of one step of every env, and
        ``_outputs``, each model's outputs: a random frame holds them as zeros, as
        TorchRL's batches do.
        """
        self._step_bytes = 0
        self._outputs: dict[str, dict[Any, tuple[torch.Size, torch.dtype]]] = {}
        with torch.random.fork_rng(), torch.no_grad():
            for model_id in self.models.model_ids:
                act = functools.partial(self.models.act, model_id)
                outputs, size = probe_step(self._pool, self.env_id, model_id, act)
                self._outputs[model_id] = outputs
                self._step_bytes = max(self._step_bytes, size)

    def configure(self, settings: CollectSettings) -> None:
        """Validate and apply collection settings; a new count for ``init_random_frames``.

        Raises:
            TypeError: ``settings`` is not a ``CollectSettings``.
            ValueError: LLM settings, ``frames_per_batch`` not a multiple of ``num_envs``
                or too large, ``max_frames_per_traj`` on an env that counts steps itself,
                or ``set_truncated`` on an env without a truncated key (and no
                ``max_frames_per_traj``, whose ``StepCounter`` adds one).
            UnknownModelError: ``settings.model_id`` is not registered.
        """
        self._check_settings_type(settings)
        self._check_settings(settings)
        limit = max(settings.max_frames_per_traj, 0)
        with self._lock:
            if limit != self._limit:
                self._limit_steps(limit)
            self._settings = settings
            self._session_frames = 0

    def _check_settings(self, settings: CollectSettings) -> None:
        if settings.llm is not None:
            raise ValueError("this is a TorchRL-env actor: LLM settings need --kind llm")
        largest = self.max_frames_per_batch()
        if settings.frames_per_batch % self.num_slots or settings.frames_per_batch > largest:
            raise ValueError(
                f"frames_per_batch={settings.frames_per_batch} is not a multiple of "
                f"num_envs={self.num_slots} that fits a batch (at most {MAX_FRAMES_PER_BATCH} "
                f"frames in a {DEFAULT_LIMITS.max_packet_bytes}-byte packet): the largest is "
                f"{largest}"
            )
        counted = settings.max_frames_per_traj > 0  # its StepCounter adds truncated keys
        if (
            settings.set_truncated
            and not counted
            and not any(
                (k if isinstance(k, str) else k[-1]) == "truncated" for k in self._base.done_keys
            )
        ):
            raise ValueError(
                "set_truncated: the env has no truncated key (TorchRL refuses it too): add one "
                "in the env factory (env.add_truncated_keys(), a StepCounter) or set "
                "max_frames_per_traj"
            )
        check_limit(self._base, settings.max_frames_per_traj)
        self.models.policy_version(settings.model_id)  # raises UnknownModelError
        if self._env_weights and settings.model_id == ENV_MODEL_ID:
            raise ValueError(f"model_id {ENV_MODEL_ID!r} holds the env's weights: it does not act")

    def start_anew(self) -> None:
        """Envs that stepped since their last reset start new trajectories at the next batch.

        The last session's policy outputs (and recurrent states) go with the carrier.
        """
        with self._lock:
            if not self._fresh:
                self._needs_reset = True

    def _limit_steps(self, limit: int) -> None:
        """Step under ``max_frames_per_traj=limit`` (0: none), as TorchRL's collector does.

        Envs in the middle of a trajectory are reset first; envs just reset count from now.
        """
        self._pool, self._limit = self._pool_for(limit), limit
        if not self._fresh:
            self._needs_reset = True
        elif limit:
            self._carrier = counted_reset(self._counted, self._carrier)
        elif self._counted is not None:
            self._carrier = self._carrier.exclude(*counter_keys(self._counted, self._base))

    def _pool_for(self, limit: int) -> Any:
        """The base pool, or for ``limit`` > 0 the one StepCounter wrapper, set to ``limit``.

        One wrapper serves every limit (its ``max_steps`` is read at each step): a wrapper
        per limit would have to be kept (dropping one closes the base pool), and a learner
        opening sessions with ever new limits would grow the actor without bound.
        """
        if limit <= 0:
            return self._base
        if self._counted is None:
            self._counted = limited(self._base, limit)
        else:
            self._counted.transform.max_steps = limit
        return self._counted

    def max_frames_per_batch(self) -> int:
        """The largest ``frames_per_batch``: at most ``MAX_FRAMES_PER_BATCH``, in a packet.

        The packet cap learners decode by default, for the probe step's size and a quarter more.
        """
        steps = DEFAULT_LIMITS.max_packet_bytes // (self._step_bytes * 5 // 4 + 1)
        return max(0, min(steps, MAX_FRAMES_PER_BATCH // self.num_slots)) * self.num_slots

    def collect_batch(self, abandon: threading.Event | None = None) -> TensorDict | FoldedBatch:
        """Collect one batch (blocking): ``frames_per_batch`` frames as ``[num_envs, T]``.

        Folded when the settings ask for ``fold_observations``, do not ``split_trajs`` and
        the env's observations are at least ``FOLD_MIN_FRAME_BYTES`` a frame.

        Raises:
            SessionStateError: Not configured, or abandoned.
            ClosedError: The core is closed.
            EnvError: The env raised while stepping; the pool is rebuilt on the next call
                (the env factory's failure to rebuild it is an ``EnvError`` too).
            Exception: Whatever the policy raised; the envs are reset on the next call.
        """
        with self._lock:
            settings = self._configured()
            self._ensure_pool()
            if settings.reset_at_each_iter:
                self._reset()
            batch = self._rollout(settings, abandon)
            self.frames += batch.numel()
            self._session_frames += batch.numel()
            self.batches += 1
        if settings.split_trajs:
            return split_trajectories(batch)
        if settings.fold_observations:
            return fold_observations(batch, self._pool.full_observation_spec.keys(True, True))
        return batch

    def _rollout(self, settings: CollectSettings, abandon: threading.Event | None) -> TensorDict:
        steps = settings.frames_per_batch // self.num_slots
        random = self._session_frames < settings.init_random_frames
        timings = None if self._metrics is None else np.empty((steps, 2))
        started = time.perf_counter()
        frames: list[TensorDictBase] = []
        self._envs_shape = self._pool.batch_size  # a property TorchRL computes on each read
        try:
            with torch.no_grad(), set_interaction_type(interaction_of(settings.exploration_type)):
                for t in range(steps):
                    check_abandoned(abandon, t, steps)
                    frames.append(self._step(settings.model_id, random, timings, t))
            done_keys = self._pool.done_keys
            batch = stack_frames(frames, done_keys, settings.set_truncated, self._stacker)
        except EnvError:
            self._rebuild_pending = True
            raise
        except BaseException:
            self._needs_reset = True  # the envs moved on from the carrier's trajectories
            raise
        if self._metrics is not None and timings is not None:
            self._metrics.record_batch(
                settings.frames_per_batch, timings, time.perf_counter() - started
            )
        return batch

    def _step(
        self, model_id: str, random: bool, timings: np.ndarray | None, t: int
    ) -> TensorDictBase:
        """One step of every env as TorchRL's collector takes it; the frame it stores."""
        carrier = self._carrier
        start = time.perf_counter()
        if random:
            version = self.models.policy_version(model_id)
            self._rand_action(carrier)
            for key, (shape, dtype) in self._outputs[model_id].items():
                if key not in carrier.keys(True, True):
                    carrier.set(key, torch.zeros(shape, dtype=dtype))
        else:
            version = self.models.act(model_id, carrier)
        acted = time.perf_counter()
        versions = torch.full(self._envs_shape, version, dtype=torch.int64)
        carrier.set("policy_version", versions)
        try:
            with self._env_guard:
                frame, following = self._pool.step_and_maybe_reset(carrier)
        except BaseException as exc:  # as the env pool's (env/pool.py)
            raise EnvError.of(self.env_id, exc) from exc
        if timings is not None:
            timings[t] = (acted - start, time.perf_counter() - acted)
        frame.set(("next", "policy_version"), versions.clone())
        following.set("collector", frame.get("collector").copy())
        ended = self._end_of_traj(frame.get("next"))
        if ended.any():
            ids = frame.get(_TRAJ_IDS).clone()
            ids[ended] = torch.from_numpy(self._traj.take(int(ended.sum())))
            following.set(_TRAJ_IDS, ids)
        self._carrier, self._fresh = following, False
        return frame

    def _end_of_traj(self, nxt: TensorDictBase) -> torch.Tensor:
        from torchrl.envs.utils import _aggregate_end_of_traj

        return _aggregate_end_of_traj(nxt, done_keys=self._pool.done_keys).reshape(self._envs_shape)

    def _reset(self) -> None:
        """Reset every env: a fresh carrier with new trajectory ids."""
        try:
            carrier = self._pool.reset()
        except BaseException as exc:  # as the env pool's (env/pool.py)
            self._rebuild_pending = True
            raise EnvError.of(self.env_id, exc) from exc
        ids = torch.from_numpy(self._traj.take(self.num_slots)).reshape(self._pool.batch_size)
        carrier.set(_TRAJ_IDS, ids)
        self._carrier, self._fresh = carrier, True
        self._needs_reset = False

    def _ensure_pool(self) -> None:
        """Rebuild a failed pool, or reset the envs a failed batch left mid-way."""
        if self._rebuild_pending:
            self._rebuild_pool()
        if self._needs_reset:
            self._reset()

    def _rebuild_pool(self) -> None:
        """Build the pool anew (after a crash, or a probe that moved its state); not reset."""
        self._close_base()
        try:
            self._base, env = build_pool(self.config)
        except Exception as exc:  # the factory that built the first pool fails now
            raise EnvError.of(self.env_id, exc) from exc
        if env is not self._base:
            env.close(raise_if_closed=False)
        if (layout := spec_layout(self._base)) != self._layout:  # rebuilt on the next call
            raise EnvError.of(self.env_id, ValueError(_changed_layout(self._layout, layout)))
        self._counted = None
        self._pool = self._pool_for(self._limit)
        self._rebuild_pending = False
        self._needs_reset = True
        if self._env_weights:  # its envs (made at its start) built fresh weights
            start_pool(self._base)
            for env in pool_envs(self._base) or ():
                tie_parameters(env, self._env_weights)

    def _seed(self, seed: int, static_seed: bool) -> int:
        """Seed the envs as TorchRL's ``set_seed`` does (``env.set_seed``), torch and numpy.

        Env ``i`` gets the ``i``-th link of TorchRL's seed chain; every env is reset, so
        new trajectories start. Returns the seed for the next actor (``env.set_seed``'s).
        """
        if self._rebuild_pending:
            self._rebuild_pool()  # reset below, once seeded
        following = self._pool.set_seed(seed, static_seed=static_seed)
        torch.manual_seed(seed)
        np.random.seed(seed % 2**32)
        self._reset()
        return int(following)

    def state_dict(self) -> dict[str, Any]:
        """:meth:`CoreBase.state_dict` plus ``"env"``: the env's state (stateful transforms).

        The env's state holds copies of the ``"env"`` model's weights, so it is read under
        that model's lock, and the models are read again when a push of it (another thread)
        landed after they were: both sections hold one version of those weights.
        """
        with self._lock:
            while True:
                state = super().state_dict()
                if not self._env_weights:  # a policy model may be named "env" then
                    state["env"] = nested_state(self._pool_state())
                    return state
                read = state["models"][ENV_MODEL_ID]["version"]
                with self._env_guard:
                    if read == self.models.policy_version(ENV_MODEL_ID):
                        state["env"] = nested_state(self._pool_state())
                        return state

    def state_tensors(self) -> int:
        """:meth:`CoreBase.state_tensors` and the env state's (each env's stateful transforms)."""
        with self._lock:
            return super().state_tensors() + len(flat_state(self._pool_state()))

    def _pool_state(self) -> Any:
        """The pool's ``state_dict()``; one env stepped as it is reads as a pool of one.

        A pool a crash left is built anew first: the next batch steps the new one, so its
        state is the one read and loaded (a state loaded into the old would be dropped).
        """
        if self._rebuild_pending:
            self._rebuild_pool()
        state = self._base.state_dict()
        return {"worker0": state} if self._base.batch_size == () else state

    def load_state_dict(
        self, state: dict[str, Any], *, allow_rollback: bool = False
    ) -> dict[str, tuple[int, int]]:
        """:meth:`CoreBase.load_state_dict`, and the env's state when ``state`` holds one.

        The env's state (``"env"``) is checked in full against the env's own (keys,
        shapes, dtypes, finite values) before anything is applied.

        Raises:
            WeightsError: Also for an env state that does not fit this actor's env.
        """
        env = state.get("env") if isinstance(state, dict) else None
        with self._lock:
            reference = None if env is None else self._pool_state()
            staged = None if env is None else stage_env_state(env, reference)
            if staged is not None:
                self._check_env_weight_copies(state, staged, flat_state(reference))
            changes = super().load_state_dict(state, allow_rollback=allow_rollback)
            if staged is not None:
                self._load_env_state(staged)
            return changes

    def _load_env_state(self, staged: Any) -> None:
        """Load the env's checked state; the ``"env"`` model's weights in force stay as they are.

        The state's copies of those weights are the ones the models' restore just applied, but
        a push of ``"env"`` (another thread) may have landed since: under that model's lock,
        the weights in force are put back after the load, so they still go with its version.
        """
        single = self._base.batch_size == ()
        with self._env_guard:
            held = {name: p.detach().clone() for name, p in self._env_weights.items()}
            self._base.load_state_dict(staged["worker0"] if single else staged)
            for name, parameter in self._env_weights.items():
                parameter.detach().copy_(held[name])

    def _check_env_weight_copies(
        self, state: dict[str, Any], staged: Any, reference: dict[str, torch.Tensor]
    ) -> None:
        """The env state's copies of the ``"env"`` model's weights must be those in force after.

        The env's ``state_dict()`` holds its transforms' networks, which this actor holds as
        the model ``"env"``, under a version. An env section carrying other values would
        change them under that version (or undo the model's own section): refused before
        anything is applied. The copies are found by storage (``reference``: the env's state
        now, flat), whatever the env names them.

        Raises:
            WeightsError: A copy differs from the state's ``models/env`` weights (or, when the
                state has none, from the weights held now).
        """
        if not self._env_weights:
            return
        named = {p.data_ptr(): n for n, p in self._env_weights.items() if p.numel()}
        models = state.get("models")
        carried = models.get(ENV_MODEL_ID) if isinstance(models, dict) else None
        weights = carried.get("weights") if isinstance(carried, dict) else None
        weights = weights if isinstance(weights, dict) else None
        for path, copy in flat_state(staged).items():
            name = named.get(reference[path].data_ptr()) if reference[path].numel() else None
            if name is None:
                continue
            held = self._env_weights[name].detach() if weights is None else weights.get(name)
            if not isinstance(held, torch.Tensor) or held.shape != copy.shape:
                continue  # the models section is refused on its own
            if not torch.equal(copy, held.to(copy.dtype)):
                raise WeightsError(
                    f"the env state's {path!r} is the {ENV_MODEL_ID!r} model's weight {name!r} "
                    f"with other values than the state's {ENV_MODEL_ID!r} model holds: the env's "
                    "weights change only with that model (its version); load them there"
                )

    def _restored(self) -> None:
        self._carrier.set(
            _TRAJ_IDS,
            torch.from_numpy(self._traj.take(self.num_slots)).reshape(self._pool.batch_size),
        )

    def _release_now(self) -> int:
        """Kill a ``ParallelEnv``'s workers (SIGKILL); how many lived."""
        workers = [p for p in getattr(self._base, "_workers", []) if p.is_alive()]
        for process in workers:
            process.kill()
        return len(workers)

    def _release(self) -> None:
        """Close the env pool (and a ``ParallelEnv``'s subprocesses)."""
        self._close_base()

    def _close_base(self) -> None:
        """Close the env pool; a user's env whose ``close()`` raises is closed all the same.

        TorchRL marks an env closed before it closes what it wraps, and a rebuild after a
        crash (or the actor's own close) must go on: such an env would fail every later batch.
        """
        with contextlib.suppress(Exception):  # the user's env: its close, whatever it raises
            self._base.close(raise_if_closed=False)


def _does_not_act(tensordict: TensorDictBase) -> TensorDictBase:
    """What the env's weights do when asked to act (never: :meth:`TorchRLCore.configure`)."""
    raise ValueError(f"model_id {ENV_MODEL_ID!r} holds the env's weights: it does not act")


def _changed_layout(first: dict[Any, Any], rebuilt: dict[Any, Any]) -> str:
    """Why a rebuilt pool is refused: the keys its specs declare differently."""
    changed = sorted(
        str(key) for key in first.keys() | rebuilt.keys() if first.get(key) != rebuilt.get(key)
    )
    return (
        f"the env factory built an env whose specs differ from its first build's at "
        f"{', '.join(changed[:5])}{' ...' if len(changed) > 5 else ''}: an actor's batches "
        "keep one layout, so its factory must build the same specs each time"
    )
