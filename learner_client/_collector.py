"""``GrpcCollector``: TorchRL's distributed-collector API over a fleet of rlfleet actors.

This is the public surface a TorchRL user recognises, and nothing more: the constructor
validates and groups its arguments at once (:mod:`learner_client._settings`,
:mod:`learner_client._torchrl_compat`), :mod:`learner_client._wiring` builds the parts (where
their picture is), and each method hands its call to the part that owns it: iteration to
the rounds, weight pushes to the pusher, seeds, checkpoints and the fleet's growth to the
fleet, the replay-buffer thread and ``pause()`` to :mod:`learner_client._background`. An
error raised while iterating leaves the collector usable (unlike TorchRL, which shuts down):
catch it, ``next()`` again or ``shutdown()``.
"""

from __future__ import annotations

import contextlib
import enum
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

from tensordict import TensorDictBase
from torch import nn

from common.config import DEFAULT_MODEL_ID, CollectSettings, ExplorationType, check_seed
from common.errors import ClosedError
from common.llm import LLMSettings
from learner_client._background import Background
from learner_client._discovery import DnsMembership, resolve_actors
from learner_client._fleet import RemoteActor
from learner_client._given_fleet import ActorFleet, FleetOwner, check_positional
from learner_client._handover import Handover
from learner_client._mailbox import Paused
from learner_client._members import Ranks, actor_state_of
from learner_client._metrics import LearnerMetrics
from learner_client._ray_dropin import RAY_ARGUMENTS, RAY_WARNED, RayPlacement, ray_fleet_of
from learner_client._rounds import Placement
from learner_client._script_env import ScriptEnv
from learner_client._settings import (
    DEFAULT_SHUTDOWN_TIMEOUT,
    BatchSettings,
    ConnectionSettings,
    RolloutSettings,
    WeightPushSettings,
    check_addresses,
    check_hooks,
    check_split,
    positive_timeout,
    random_frames_taken,
    shutdown_limit,
)
from learner_client._shared_policy import GivenWeights, SharedPolicy
from learner_client._stats import snapshot
from learner_client._torchrl_compat import (
    ActorPlacement,
    TorchRLAccessors,
    TorchRLOnly,
    check_torchrl_only,
    update_flag,
)
from learner_client._update_args import normalize_update_args, renamed_weights
from learner_client._waits import interrupts_held
from learner_client._weights import PushOptions
from learner_client._wiring import Teardown, assemble, weakly

__all__ = ["GrpcCollector"]


class _State(enum.Enum):
    READY = "ready"  # actors described, no session open yet
    RUNNING = "running"
    CLOSED = "closed"


class GrpcCollector(TorchRLAccessors):
    """Collects batches from remote rlfleet actors, with TorchRL's collector API.

    Knobs carry TorchRL's names and meanings (``RayCollector`` /
    ``MultiSyncCollector``); the actors run the env pools and the policy, the
    collector aggregates their streams and pushes weights back.

    Example::

        with GrpcCollector(["10.0.0.1:50051", "10.0.0.2:50051"], frames_per_batch=512,
                           total_frames=100_000, sync=True, policy=policy) as collector:
            for batch in collector:  # [workers, envs, time]
                train(batch)  # policy's new weights reach the actors before the next batch

    Args:
        actors: ``"host:port"`` addresses, or ``dns:///name:port`` targets standing for
            every address the name resolves to (re-resolved, joiners added); workers are
            known by the worker_id each reports (duplicates are refused). Or a fleet
            object (``LocalFleet``, any :class:`~learner_client.ActorFleet`): the collector
            then owns it, starts it if it was not and stops it at ``shutdown()``. None:
            TorchRL ``RayCollector``'s drop-in form: ``create_env_fn``, ``policy``,
            ``num_collectors``, ``collector_class``, ``collector_kwargs``,
            ``num_workers_per_collector``, ``ray_init_config`` and ``remote_configs``
            place a ``RayFleet`` of the script's callables, owned the same way
            (docs/collector.md, "From RayCollector").
        frames_per_batch: Frames per batch. Sync: the total, split evenly over the actors
            (each share a multiple of that actor's env pool size). Async: each batch's.
        total_frames: Frames after which iteration stops (``len`` = ceil(total/fpb));
            ``-1`` or None iterates forever.
        sync: One batch from every actor per iteration (``[workers, envs, time]``), or
            first ready, first served (``[envs, time]``); None means False (TorchRL's).
        prefetch: Batches each actor collects ahead of the request. None: 0 when sync (on
            policy: the batch after an update runs the new weights, as TorchRL's sync
            collectors) and 1 when async (as ``MultiAsyncCollector``); sync with
            ``prefetch=N`` is faster and off-policy by up to N batches.
        max_frames_per_traj: Steps after which a trajectory is truncated (``<= 0``: none).
        init_random_frames: Random-action frames, split over the actors.
        reset_at_each_iter: Reset every env before each batch.
        reset_when_done: Must be True (as in TorchRL).
        split_trajs: Zero-padded trajectories with ``("collector", "mask")`` (None: False).
        exploration_type: ``ExplorationType`` or tensordict's ``InteractionType``.
        set_truncated: Mark the last frame of each batch truncated.
        postproc: Callable applied to every batch before it is yielded or stored.
        replay_buffer: Anything with ``extend()``, given each actor's batch (iteration: None).
        update_after_each_batch: Push the last weights given before each collection (sync:
            to all workers, each round; async: to the worker whose batch was just yielded).
        max_weight_update_interval: Push to a worker once more than this many of its batches
            were delivered since its last update (``-1``: off).
        cat_results: ``"stack"`` (None) or ``0`` (concatenate sync batches on dim 0).
        connect_timeout: Seconds to reach every actor at construction.
        call_timeout: Deadline of every control call and weight push.
        batch_timeout: Seconds a sync batch waits for an actor (or a stream owing one is silent).
        allow_partial_batches: Sync: yield without the missing actors (``missing_workers``).
        channel_credentials: ``grpc.ssl_channel_credentials(...)`` for TLS.
        token: Bearer token the actors require (default: that of a fleet given, if it has one).
        learner_id: Identity on the actors (empty: unique); a reconnect resumes only its own.
        take_over: End other learners' sessions on the actors (explicit; the actors log it).
        shared_memory_batches: Batches from actors proven on this host through shared memory
            (gRPC carries their control); False: every batch as bytes over gRPC.
        model_id: The model that acts on the actors.
        dns_refresh_interval: Seconds between re-resolutions of ``dns:`` targets.
        rank, world_size: Several learner ranks sharing the fleet: this one owns the actors
            with ``worker_id % world_size == rank`` (sessions, pushes, stats, seeds, state;
            ``frames_per_batch`` and ``total_frames`` are per rank). ``rank="env"`` reads
            both from torch.distributed (or torchrun's ``RANK``/``WORLD_SIZE``). A given
            ``learner_id`` becomes ``<learner_id>/rank<r>``. See docs/collector.md.
        weight_push: How pushes travel (``WeightPushSettings``: checksums, deltas, relays...).
        policy: The learner's module, pushed (buffers too) before the first batch, by
            ``update_policy_weights_()`` and, unless ``push_policy_changes=False``, whenever
            it changed before the next batch (TorchRL's shared policy).
        create_env_fn: Its env's keys, shapes and dtypes are checked against the first batch.
        policy_device, env_device, compile_policy, cudagraph_policy: Sent with each session.
        device, storing_device: Where batches are delivered (``storing_device``, else
            ``device``; default: the host); docs/collector.md says what each copy costs.
    Every other TorchRL argument: docs/collector.md, "Coming from TorchRL".

    Raises:
        ValueError: A bad value or fleet (duplicate worker_ids, indivisible frames).
        TypeError: A bad type; TorchRL's positional ``(create_env_fn, policy)`` (use keywords).
        ActorUnavailableError: An actor unreachable within ``connect_timeout``.
        UnknownModelError: An actor without ``model_id``.
    """

    def __init__(  # TorchRL's signature, by name (docs/collector.md)
        self,
        actors: Sequence[str] | str | ActorFleet | None = None,
        *positional: Any,
        frames_per_batch: int,
        total_frames: int | None = -1,
        sync: bool | None = False,
        max_frames_per_traj: int | None = None,
        init_random_frames: int | None = -1,
        reset_at_each_iter: bool = False,
        reset_when_done: bool = True,
        split_trajs: bool | None = False,
        exploration_type: Any = ExplorationType.RANDOM,
        set_truncated: bool = False,
        postproc: Callable[[TensorDictBase], TensorDictBase] | None = None,
        replay_buffer: Any = None,
        update_after_each_batch: bool = False,
        max_weight_update_interval: int = -1,
        cat_results: str | int | None = None,
        prefetch: int | None = None,
        connect_timeout: float = 10.0,
        call_timeout: float = 30.0,
        batch_timeout: float = 60.0,
        allow_partial_batches: bool = False,
        channel_credentials: Any = None,
        token: str | None = None,
        learner_id: str = "",
        take_over: bool = False,
        shared_memory_batches: bool = True,
        model_id: str = DEFAULT_MODEL_ID,
        dns_refresh_interval: float = 10.0,
        rank: int | str | None = None,
        world_size: int | None = None,
        llm: LLMSettings | None = None,
        weight_push: WeightPushSettings | None = None,
        policy: nn.Module | None = None,
        push_policy_changes: bool = True,
        create_env_fn: Callable[..., Any] | Sequence[Callable[..., Any]] | None = None,
        create_env_kwargs: dict[str, Any] | None = None,
        policy_device: Any = None,
        env_device: Any = None,
        compile_policy: bool | dict[str, Any] | None = None,
        cudagraph_policy: bool | dict[str, Any] | None = None,
        update_at_each_batch: bool = False,
        policy_factory: Any = None,
        backend: str | None = None,
        backend_options: dict[str, Any] | None = None,
        num_collectors: int | None = None,
        num_workers: int | None = None,
        collector_class: Any = None,
        collector_kwargs: Any = None,
        num_workers_per_collector: int = 1,
        ray_init_config: dict[str, Any] | None = None,
        remote_configs: Any = None,
        use_env_creator: bool = False,
        init_fn: Callable[[int], None] | None = None,
        num_threads: int | None = None,
        num_sub_threads: int = 1,
        worker_idx: int | None = None,
        interruptor: Any = None,
        preemptive_threshold: float | None = None,
        return_same_td: bool = False,
        use_buffers: bool | None = None,
        track_traj_ids: bool = True,
        track_policy_version: Any = False,
        trust_policy: bool | None = None,
        no_cuda_sync: bool | None = False,
        extend_buffer: bool = True,
        weight_updater: Any = None,
        weight_sync_schemes: Any = None,
        weight_recv_schemes: Any = None,
        auto_register_policy_transforms: bool | None = None,
        pre_collect_hook: Callable[..., Any] | None = None,
        post_collect_hook: Callable[..., Any] | None = None,
        compact_obs: bool = False,
        trajs_per_batch: int | None = None,
        trajs_per_write: int | None = None,
        traj_format: str | None = None,
        device: Any = None,
        storing_device: Any = None,
    ) -> None:
        check_positional(actors, positional)  # TorchRL's (create_env_fn, policy): keywords
        on_ray = actors is None  # RayCollector's drop-in form: its own fleet, placed on Ray
        if on_ray:
            placed = RayPlacement(
                create_env_fn=create_env_fn,
                create_env_kwargs=create_env_kwargs,
                policy=policy,
                policy_factory=policy_factory,
                num_collectors=num_collectors,
                collector_class=collector_class,
                collector_kwargs=collector_kwargs,
                num_workers_per_collector=num_workers_per_collector,
                ray_init_config=ray_init_config,
                remote_configs=remote_configs,
            )
            actors = ray_fleet_of(placed)
            vars(self).update(placed.acting())  # TorchRL's attributes: they act here
        self._owner = FleetOwner(actors, ends_with_frames=on_ray)  # the collector's from here
        with self._owner.closed_on_error():
            check_torchrl_only(  # refuses trajs_per_batch, warns where it should
                TorchRLOnly(
                    policy_factory=policy_factory,
                    create_env_kwargs=create_env_kwargs,
                    backend=backend,
                    backend_options=backend_options,
                    num_collectors=num_collectors,
                    num_workers=num_workers,
                    collector_class=collector_class,
                    collector_kwargs=collector_kwargs,
                    num_workers_per_collector=num_workers_per_collector,
                    ray_init_config=ray_init_config,
                    remote_configs=remote_configs,
                    use_env_creator=use_env_creator,
                    init_fn=init_fn,
                    num_threads=num_threads,
                    num_sub_threads=num_sub_threads,
                    worker_idx=worker_idx,
                    interruptor=interruptor,
                    preemptive_threshold=preemptive_threshold,
                    return_same_td=return_same_td,
                    use_buffers=use_buffers,
                    track_traj_ids=track_traj_ids,
                    track_policy_version=track_policy_version,
                    trust_policy=trust_policy,
                    no_cuda_sync=no_cuda_sync,
                    extend_buffer=extend_buffer,
                    weight_updater=weight_updater,
                    weight_sync_schemes=weight_sync_schemes,
                    weight_recv_schemes=weight_recv_schemes,
                    auto_register_policy_transforms=auto_register_policy_transforms,
                    pre_collect_hook=pre_collect_hook,
                    post_collect_hook=post_collect_hook,
                    compact_obs=compact_obs,
                    trajs_per_batch=trajs_per_batch,
                    trajs_per_write=trajs_per_write,
                    traj_format=traj_format,
                ),
                with_effect=RAY_ARGUMENTS if on_ray else (),
                warned=RAY_WARNED if on_ray else (),
            )
            on_actors = ActorPlacement.from_torchrl(
                policy_device=policy_device,
                env_device=env_device,
                compile_policy=compile_policy,
                cudagraph_policy=cudagraph_policy,
            )
            update_after_each_batch = update_flag(update_after_each_batch, update_at_each_batch)
            self._ranks = Ranks.given(rank, world_size)
            self._ranks.warn_unowned(self._owner.worker_ids())  # a fleet started per rank
            self._create_env_fn = create_env_fn  # as given (TorchRL's attribute)
            self._env = ScriptEnv.of(create_env_fn, create_env_kwargs, on_ray=on_ray)
            given_env = None if self._env is None else self._env.given
            self._shared = SharedPolicy.of(policy, follow=push_policy_changes, env=given_env)
            self._placement = Placement(device, storing_device)
            self._batch = BatchSettings(
                frames_per_batch=frames_per_batch,
                total_frames=total_frames,
                sync=sync,
                cat_results=cat_results,
                allow_partial_batches=allow_partial_batches,
                batch_timeout=batch_timeout,
                split_trajs=split_trajs,
                update_after_each_batch=update_after_each_batch,
                max_weight_update_interval=max_weight_update_interval,
                prefetch=prefetch,
                llm=llm,
            )
            self._rollout = RolloutSettings(
                max_frames_per_traj=max_frames_per_traj,
                init_random_frames=init_random_frames,
                reset_at_each_iter=reset_at_each_iter,
                reset_when_done=reset_when_done,
                split_trajs=split_trajs,
                exploration_type=exploration_type,
                set_truncated=set_truncated,
                model_id=model_id,
                llm=llm,
                placement=on_actors,
            )
            conn = ConnectionSettings(
                connect_timeout=connect_timeout,
                call_timeout=call_timeout,
                channel_credentials=channel_credentials,
                token=self._owner.token(token),
                learner_id=self._ranks.learner_id(learner_id),
                take_over=take_over,
                shared_memory_batches=shared_memory_batches,
            )
            self.postproc, self.replay_buffer = check_hooks(postproc, replay_buffer, set_truncated)
            if (size := self._owner.unstarted_size()) is not None:  # before placing a fleet
                check_split(self._batch, size, size)
            self._connect(
                self._owner.addresses(),
                conn,
                dns_refresh_interval=positive_timeout("dns_refresh_interval", dns_refresh_interval),
                weight_push=weight_push,
            )

    def _connect(
        self,
        actors: Sequence[str] | str,
        conn: ConnectionSettings,
        *,
        dns_refresh_interval: float,
        weight_push: WeightPushSettings | None,
    ) -> None:
        """Wire the parts, describe and admit the actors, start watching ``dns:`` targets."""
        addresses = check_addresses(resolve_actors(actors))
        self._state = _State.READY
        self._lock = threading.RLock()
        self._taking = threading.RLock()  # one consumer takes at a time (postproc may nest)
        self._handover = Handover()  # postproc, or each actor's part into the replay buffer
        parts = self._parts = assemble(
            self._batch,
            self._rollout.model_id,
            conn,
            weakly(self.stats),
            weight_push,
            pin_memory=self._placement.pin_memory,
            ranks=self._ranks,
        )
        self._mailbox, self._book = parts.mailbox, parts.book
        self._fleet, self._pusher, self._rounds = parts.fleet, parts.pusher, parts.rounds
        self._background = Background(
            self._mailbox, self._batch.batch_timeout, weakly(self.__iter__)
        )
        self._membership = DnsMembership(
            actors,
            weakly(self._add),
            self._fleet.known_addresses,
            interval=dns_refresh_interval,
            follow=self._owner.follow(),
        )
        try:
            links = self._fleet.describe(addresses)
            self._fleet.join(links, self._batch, self._rollout.model_id, self._rollout.placement)
            self._membership.start()
        except BaseException:  # in Teardown's order: a watcher admitting waits on the loop
            self._membership.stop()
            self._parts.close(DEFAULT_SHUTDOWN_TIMEOUT)
            self._membership.close(DEFAULT_SHUTDOWN_TIMEOUT)
            raise
        self._teardown = Teardown(parts, self._membership, self._background, self._owner)
        self._dropped = self._teardown.when_dropped(self, DEFAULT_SHUTDOWN_TIMEOUT)

    def __len__(self) -> int:
        """``ceil(total_frames / frames_per_batch)``; TypeError when endless."""
        return self._batch.num_batches()

    def __iter__(self) -> Iterator[TensorDictBase | None]:
        """Yield batches (None per batch stored: each actor's goes to the replay buffer)."""
        while (parts := self._take()) is not None:
            yield self._handover.deliver(parts, self.replay_buffer, self.postproc)
        self._handover.flush(self.replay_buffer, self.postproc)  # parts an interrupt left
        self._ended()

    def next(self) -> TensorDictBase | None:
        """The next batch, or None at the end (as TorchRL's ``next()``); threads may share it."""
        if (parts := self._take()) is None:
            self._handover.flush(self.replay_buffer, self.postproc)  # parts an interrupt left
            self._ended()
            return None
        return self._handover.deliver(parts, self.replay_buffer, self.postproc)

    def _ended(self) -> None:
        """At ``total_frames`` RayCollector's form shuts down, as RayCollector (not in start())."""
        if self._owner.ends_with_frames and not self._background.is_current():
            self.shutdown()

    def _take(self) -> list[TensorDictBase] | None:
        while True:
            try:
                with self._taking:  # consumers in turn: the end is seen by whoever comes after
                    return self._next_batch(per_actor=self.replay_buffer is not None)
            except Paused:  # waited out of turn: the pausing thread's own take then raises
                self._background.wait_resumed()

    def _next_batch(self, *, per_actor: bool) -> list[TensorDictBase] | None:
        """The next batch (one item), or each actor's part of it; None at the end; ``Paused``.

        An interrupt (Ctrl-C) while it is laid out keeps it for the next take, counted once.
        """
        with self._open_call():
            if self._rounds.exhausted():
                return None
            self._pusher.push_shared(self._shared, self._rollout.model_id)
            if self._env is not None:
                self._env.push_weights(self._pusher.push_shared)
            self._ensure_running()
            # Under the lock, as every push: a user's push from another thread comes before
            # or after it, never between its read of the last weights and its version.
            candidates = self._fleet.worker_ids if self._batch.sync else self._rounds.last_workers
            self._pusher.auto_update(candidates, self._batch.auto_update_interval)
        try:
            parts = self._rounds.take_parts() if per_actor else [self._rounds.take()]
            env = self._env  # create_env_fn: checked, followed, its batch layout taken
            if env is not None:
                with self._lock:  # states read and loaded as one, not across a restore's
                    env.after_batch(parts[0], self.worker_ids, self.actor_state)
                if not self._batch.split_trajs:  # [trajectories, time] whatever the envs
                    parts = [env.shaped(p) for p in parts]
            placed = [self._placement.place(p) for p in parts]
        except Exception:
            self._rounds.handed_out()  # lost with its error, as TorchRL's
            raise
        except BaseException:
            self._rounds.take_again()
            raise
        self._rounds.handed_out()
        return placed

    def _ensure_running(self) -> None:
        if self._state is _State.READY:
            self._rounds.update_budget()
            self._fleet.start(self._session_settings())
            self._check_open()  # a shutdown() that gave up waiting for the lock stays closed
            self._state = _State.RUNNING

    def update_policy_weights_(
        self,
        policy_or_weights: Any = None,
        *,
        weights: Any = None,
        policy: Any = None,
        worker_ids: int | Sequence[int] | None = None,
        model_id: str | None = None,
        weights_dict: dict[str, Any] | None = None,
        dtype: Any = None,
        only_trainable: bool = False,
        delta: bool = False,
        version: int | None = None,
        part: tuple[int, int] | None = None,
        policy_weights: Any = None,
    ) -> dict[Any, Any]:
        """Push weights to the actors, concurrently, and wait until each applied them.

        Args:
            policy_or_weights: An ``nn.Module``, a TensorDict or dict of tensors (any subset of
                the model's keys), TorchRL's ``{worker_id: weights}``, or None (the last given;
                with ``policy=``, that module). With ``policy=`` and nothing else given, a
                module whose parameters and buffers did not change since its last push
                (version counters, small buffers by value) is not sent again: the call
                returns the versions the workers hold, and the version stays.
            weights: Same as ``policy_or_weights`` (not a module).
            policy: Same, as an ``nn.Module``.
            worker_ids: An int or a list of worker_ids; None targets every worker.
            model_id: The model to update (default: the collector's ``model_id``, which acts).
            weights_dict: ``{model_id: weights}`` to update several models at once.
            dtype: Wire dtype of floating tensors (``torch.bfloat16``), cast once (docs/weights.md).
            only_trainable: Send only the module's parameters with ``requires_grad``.
            delta: Send each target only what changed since the weights it holds (docs/weights.md).
            version: The version to push under (ranks: the agreed step count, docs/collector.md).
            part: ``(rank, world_size)``: this rank's part of ``version``; a ``PartResult`` each.
            policy_weights: TorchRL's deprecated name of ``policy_or_weights`` (warned).

        Returns:
            ``{worker_id: version}``; with ``weights_dict``, ``{model_id: {worker_id: version}}``.

        Raises:
            ValueError: Conflicting arguments (TorchRL's rules; a mapping and ``worker_ids``).
            UnknownWorkerError, UnknownModelError: A target not in the fleet or without the model.
            SessionStateError: None given and no weights were given before for that model.
            VersionConflictError: Another rank pushes ``version`` with other weights.
            WeightPushError: Some targets failed; ``.succeeded`` and ``.failed`` say which.
        """
        given = GivenWeights(
            renamed_weights(policy_or_weights, policy_weights), weights, policy, weights_dict
        )
        whole = worker_ids is None and dtype is None and not only_trainable and part is None
        shared, plan = self._shared, None
        with self._open_call():  # the module read, changed and pushed as one, between batches
            if shared is not None:
                plan = shared.planned(
                    given, default_model=model_id is None, whole=whole, version=version
                )
                if plan is None:
                    return self._held_versions()
                given = plan.given
            request = normalize_update_args(
                given.policy_or_weights,
                weights=given.weights,
                policy=given.policy,
                worker_ids=worker_ids,
                model_id=model_id,
                weights_dict=weights_dict,
                delta=delta,
                options=PushOptions.given(dtype, only_trainable),
                version=version,
                part=part,
                default_model_id=self._rollout.model_id,
            )
            if shared is None or plan is None:
                return self._pusher.update(request)
            return shared.carry_out(plan, lambda: self._pusher.update(request))

    def _held_versions(self) -> dict[Any, Any]:
        """``{worker_id: version}`` each worker holds of the acting model (under the lock)."""
        mid = self._rollout.model_id
        return {w: self._book.applied(w).get(mid, 0) for w in self.worker_ids}

    def _learner_metrics(self) -> LearnerMetrics:
        """What :func:`~learner_client.serve_metrics` serves (closed with the collector)."""
        return self._parts.metrics

    def _check_open(self, cause: BaseException | None = None) -> None:
        if self._state is _State.CLOSED:
            raise ClosedError("the collector is shut down") from cause

    @contextlib.contextmanager
    def _open_call(self, *, unlocked: bool = False) -> Iterator[None]:
        """Hold the lock (unless ``unlocked``) for a call to actors; one cut off: ClosedError."""
        with contextlib.nullcontext() if unlocked else self._lock:
            self._check_open()
            try:
                yield
            except BaseException as exc:
                self._check_open(exc)
                raise

    def start(self) -> None:
        """Collect in a background thread into ``replay_buffer`` (RuntimeError if none given)."""
        if self.replay_buffer is None:
            raise RuntimeError("start() needs a replay_buffer (pass replay_buffer=...)")
        self._check_open()
        self._background.start()

    def pause(self, timeout: float | None = 30.0, *, resume: bool = True) -> Any:
        """Context manager: while held, no new credits are granted and nothing is delivered.

        TorchRL's arguments (``RayCollector.pause``): entering waits up to ``timeout``
        seconds (None: no limit) for batches in flight (kept) and for the background
        thread to finish storing, else ``TimeoutError``; with ``resume=False`` that thread
        ends with the context (``start()`` starts it again). ``RuntimeError`` when already
        paused or shut down; ``TypeError``/``ValueError`` for a ``timeout`` not in (0, 1e7].
        """
        self._check_open()
        return self._background.pause(
            None if timeout is None else positive_timeout("timeout", timeout), resume
        )

    def is_running(self) -> bool:
        """Whether the background collection thread runs."""
        return self._background.running

    def shutdown(
        self,
        timeout: float | None = None,
        close_env: bool = True,
        raise_on_error: bool = True,
        *,
        shutdown_ray: bool = False,
    ) -> None:
        """Stop collecting, close every session and channel, join every thread.

        Bounded by ``timeout`` (default 10 s) per phase, idempotent, tolerant of dead actors.
        A fleet object given to the collector is stopped too, in its own bound (a ``LocalFleet``:
        ``grace_period`` + 2 s); with ``shutdown_ray`` (RayCollector's), Ray too, once unused.
        TorchRL's ``close_env`` and ``raise_on_error`` change nothing: the envs are the actors'.
        """
        limit = shutdown_limit(timeout)  # checked before anything closes
        held = self._lock.acquire(timeout=limit)  # a call in flight (a push) fails as we close
        self._state = _State.CLOSED
        if held:
            self._lock.release()
        self._teardown.once(limit, shutdown_ray, self._dropped)  # a fleet given too

    # ------------------------------------------------ the fleet: views, seeds, state

    @property
    def rank(self) -> int:
        """This collector's learner rank (0 for a single learner)."""
        return self._ranks.rank

    @property
    def world_size(self) -> int:
        """Learner ranks sharing the fleet (1 for a single learner)."""
        return self._ranks.world_size

    @property
    def closed(self) -> bool:
        """False until :meth:`shutdown`, then True (TorchRL's flag)."""
        return self._state is _State.CLOSED

    @property
    def member_ids(self) -> list[int]:
        """Every actor of the fleet this collector knows, owned or not, sorted."""
        return self._fleet.member_ids

    @property
    def policy(self) -> nn.Module | None:
        """The learner's policy given as ``policy=`` (what the actors follow), or None."""
        return None if self._shared is None else self._shared.module

    @property
    def missing_workers(self) -> list[int]:
        """Worker_ids absent from the last sync batch (``allow_partial_batches=True``)."""
        return list(self._rounds.missing_workers)

    @property
    def worker_ids(self) -> list[int]:
        """The worker_ids this collector collects from (its rank's own), sorted."""
        return self._fleet.worker_ids

    @property
    def remote_collectors(self) -> list[RemoteActor]:
        """The actors, as ``(address, worker_id)`` records ordered by worker_id."""
        return [RemoteActor(address, w) for w, address in self._fleet.addresses().items()]

    @property
    def policy_version(self) -> int:
        """The acting model's policy version, TorchRL's int (0 before its first push)."""
        return self._book.versions().get(self._rollout.model_id, 0)

    @property
    def policy_versions(self) -> dict[str, int]:
        """The learner's policy version per model_id (never behind any actor's)."""
        return self._book.versions()

    def _session_settings(self, *, grown: bool | None = None) -> CollectSettings:
        """What sessions open with, for the owned actors (``grown``: sync or not, they joined)."""
        frames = self._batch.frames_per_actor(count := len(self._fleet.worker_ids))
        taken = random_frames_taken(self.replay_buffer, self._fleet.ledger.frames)
        if grown is None:
            return self._rollout.for_actor(frames, count, taken=taken)
        return self._rollout.for_grown_fleet(frames, count, sync=grown, taken=taken)

    def add_collectors(self, addresses: Sequence[str]) -> list[RemoteActor]:
        """Grow the fleet, also while collecting; returns the added actors this rank owns.

        Async: new actors contribute at once. Sync: sessions restart with the new split
        (batches of the old split: ``stats()["discarded"]``). Each is given the latest pushes
        first. Other ranks' actors become members only; one with the worker_id of a member
        whose link is down takes its place, as after a restart (docs/reliability.md); a ``dns:``
        target is resolved once. Raises as at construction, ActorUnavailableError too.
        """
        return self._add(resolve_actors(addresses))

    def _add(self, addresses: Sequence[str], gone: Iterable[str] = ()) -> list[RemoteActor]:
        """Admit ``addresses`` (also DNS's joiners; ``gone``: the addresses that left it).

        Reached outside the lock (batches go on), joined and given the latest pushes in it.
        """
        with self._open_call(unlocked=True):  # batches go on meanwhile
            links = self._fleet.describe(check_addresses(addresses))  # up to connect_timeout
        with self._lock:
            if self._state is _State.CLOSED:
                self._fleet.discard(links)
            self._check_open()
            fleet_fits = self._batch, self._rollout.model_id, self._rollout.placement
            fresh = self._fleet.join(links, *fleet_fits, gone=gone)
            self._pusher.address_the_joined([x.worker_id for x in fresh])
            if self._state is _State.RUNNING and fresh:
                sync = bool(self._batch.sync)
                self._fleet.start_joined(fresh, self._session_settings(grown=sync), sync=sync)
                self._rounds.update_budget()
            return [
                RemoteActor(x.address, x.worker_id) for x in links if self._ranks.owns(x.worker_id)
            ]

    def set_seed(self, seed: int, static_seed: bool = False) -> int:
        """Seed every owned actor in worker_id order, each with the seed the previous returned.

        Returns the last actor's (to chain further). Ranks seeding their actors with one seed
        give them equal seeds: seed each rank apart (e.g. ``seed + 10_000 * rank``).
        """
        seed = check_seed(seed)
        with self._open_call():
            return self._fleet.set_seed(seed, bool(static_seed))

    def state_dict(self) -> dict[str, Any]:
        """Learner counters plus each actor's state (GetState), keyed by worker_id.

        An actor coming back (restarted) is waited for within ``call_timeout``, or it fails.

        Returns:
            ``{"frames", "batches", "worker_frames"/"worker_batches": {worker_id: n},
            "policy_version": {model_id: v}, "workers": {worker_id: uint8 tensor}}``
            — plain tensors and ints, so ``torch.save`` and weights-only loading work.
        """
        with self._open_call():
            return self._fleet.state_dict()

    def actor_state(self, worker_id: int) -> dict[str, Any]:
        """One actor's state, decoded (:func:`learner_client._members.actor_state_of`).

        On a TorchRL-env actor, ``"env"`` holds its transforms' state (``VecNorm``'s
        statistics, as an eval env needs them). ``UnknownWorkerError`` for an unknown id.
        """
        with self._open_call():  # that actor alone: another one's GetState never holds it up
            owned, workers = self.worker_ids, self._fleet.state_dict(only={worker_id})["workers"]
        return actor_state_of(workers, worker_id, owned)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned (every worker listed must be in the fleet).

        ``TypeError``/``ValueError`` for a state not of its form, ``UnknownWorkerError`` for a
        worker_id not in it; a Ctrl-C while it loads is raised once the load has ended.
        """
        with self._open_call(), interrupts_held():
            self._fleet.load_state_dict(state_dict)
            self._rounds.update_budget()
            if self._env is not None:  # create_env_fn's env holds the restored env state
                self._env.follow(self.worker_ids, self.actor_state)

    def stats(
        self, workers: str = "aggregate", *, timeout: float | None = 10.0
    ) -> dict[str, int | float | bool]:
        """TorchRL's flat, cheap snapshot of scalars (keys: ``docs/collector.md``, stats).

        ``workers`` is TorchRL's view (``"aggregate"``, ``"per_worker"``, ``"both"``);
        ``timeout`` (None or seconds) never matters: nothing waits on an actor.
        ValueError for an unknown view or a bad timeout.
        """
        return snapshot(
            workers,
            timeout,
            fleet=self._fleet,
            batch=self._batch,
            acting_model=self._rollout.model_id,
            missing=self.missing_workers,
            background_failed=self._background.error is not None,
            completed=self._rounds.exhausted(),
        )

    @property
    def worker_states(self) -> dict[int, str]:
        """Each actor's link state by worker_id (``"streaming"``, ``"down"``, ``"failed"``…)."""
        return self._fleet.states()

    def __enter__(self) -> GrpcCollector:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.shutdown()

    def __repr__(self) -> str:
        mode = "sync" if self._batch.sync else "async"
        shard = f", rank={self.rank}/{self.world_size}" if self.world_size > 1 else ""
        return (
            f"GrpcCollector({mode}{shard}, worker_ids={self.worker_ids}, "
            f"frames_per_batch={self._batch.frames_per_batch}, "
            f"total_frames={self._batch.total_frames}, state={self._state.value})"
        )
