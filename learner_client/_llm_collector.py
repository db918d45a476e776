"""``GrpcLLMCollector``: TorchRL's ``LLMCollector`` API over a fleet of rlfleet LLM actors.

The class is a facade over :class:`~learner_client.GrpcCollector` (same sessions,
credits, exactly-once batches, weight pushes, deadlines, TLS and tokens): it turns
TorchRL's LLM knobs into :class:`common.llm.LLMSettings` and a turn budget. Each batch's
padded wire form is checked as it arrives (``learner_client._batch_bounds``: a hostile one
is a :class:`~common.errors.ProtocolError` that ends its actor's stream, nothing of it
yielded), and every yielded batch goes through :class:`_Shaper`: count turns and tokens,
rebuild TorchRL's layout, flatten, then the user's ``postproc``. A ``queue`` is wrapped in
:class:`_QueueSink` so the inner collector stores into it like into a replay buffer.
"""

from __future__ import annotations

import contextlib
import queue as queue_module
import threading
import time
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from tensordict import TensorDictBase

from common.config import DEFAULT_MODEL_ID, as_int
from common.llm import GenerationSettings, LLMSettings, to_torchrl
from learner_client._collector import GrpcCollector
from learner_client._fleet import RemoteActor
from learner_client._given_fleet import ActorFleet
from learner_client._settings import positive_int, shutdown_limit
from learner_client._torchrl_compat import NOT_OFFERED, TorchRLFixedFlags, refuse_attribute

__all__ = ["LLM_NOT_OFFERED", "GrpcLLMCollector"]

_LAYOUTS = ("torchrl", "padded")
_OVERFLOW = ("block", "drop_oldest")
_PUT_POLL_S = 0.05  # how soon a put waiting for room sees the collector shut down
_TOKENS = "_response_tokens"  # a batch's response lengths, from its layout to its count

_MODEL = (
    "the model lives in the LLM actors (--policy): build the same one in the learner with "
    "common.llm.build_policy(spec, **kwargs) and push it with update_policy_weights_(model)"
)
_STATES = (
    "the tasks and models run in the LLM actors: stats(workers='per_worker') and state_dict() "
    "read their counters and states"
)
_WHOLE = "yield_completed_trajectories=True yields whole dialogs, dialog_turns_per_batch turns"
_MODEL_DEVICE = (
    "the model runs on each LLM actor's --device; batches are delivered on storing_device"
)

#: TorchRL's ``LLMCollector`` and ``RayLLMCollector`` names ``GrpcLLMCollector`` does not
#: offer, and why: the env collectors' (:data:`NOT_OFFERED`), where the LLM actors' reason
#: differs, and the LLM collectors' own.
LLM_NOT_OFFERED: dict[str, str] = {
    **NOT_OFFERED,
    "get_model": _MODEL,
    "local_policy": _MODEL,
    "get_policy_model": _MODEL,
    "getattr_policy": _MODEL,
    "getattr_env": "the chat tasks are the LLM actors' envs (--task, LocalFleet(task=...)): "
    "each batch carries what they gave",
    "map_fn": _STATES,
    "cascade_execute": _STATES,
    "get_distant_attr": _STATES,
    "set_weight_updater": NOT_OFFERED["init_updater"],  # pushes, as every updater's call
    "as_remote": "the collector runs in the learner's process and the LLM actors in their "
    "own (LocalFleet, rlfleet-actor --kind llm, Kubernetes): no Ray actor is needed",
    "trajs_per_batch": _WHOLE,
    "trajs_per_write": _WHOLE,
    "traj_format": _WHOLE,
    # A built LLMCollector's instance attributes (``vars(collector)``):
    "env": "the chat tasks are the LLM actors' envs (--task, LocalFleet(task=...))",
    "n_env": "each LLM actor runs its own chat slots (--num-envs, LocalFleet(num_envs=...))",
    "async_envs": "each LLM actor decodes all its chat slots in one batched loop",
    "policy": _MODEL,
    "policy_weights": _MODEL,
    "get_weights_fn": NOT_OFFERED["init_updater"],
    "policy_version_tracker": "the actors record the versions pushes set: policy_version, "
    "get_policy_version(), and track_policy_version=True keeps them in batches",
    "exploration_type": "the actors sample as generation= says (temperature 0 is greedy)",
    "max_frames_per_traj": "a dialog's turn limit is max_turns= (or the task's)",
    "set_truncated": "a dialog cut at max_turns or a full context ends truncated",
    "split_trajs": _WHOLE,
    **dict.fromkeys(("device", "policy_device", "env_device"), _MODEL_DEVICE),
    **dict.fromkeys(
        (
            "compiled_policy",
            "compiled_policy_kwargs",
            "cudagraphed_policy",
            "cudagraphed_policy_kwargs",
        ),
        "the actors compile their decode loop (--decode compiled)",
    ),
}


class _Shaper:
    """Per-batch work on the learner: lay out and flatten as taken; rate, user postproc as given.

    :meth:`lay_out` runs inside the take (``Placement.layout``), so an interrupt (Ctrl-C)
    during it keeps the batch for the next take, counted once; :meth:`__call__` is the
    inner collector's ``postproc``, run once per batch handed over. The counts a checkpoint
    keeps (``yielded_turns``, ``tokens``) are the inner collector's ledger's, counted with
    its frames as a batch is taken; the shaper keeps only the token rate of this run.
    """

    def __init__(
        self,
        layout: str,
        flatten: bool,
        track_policy_version: bool,
        postproc: Callable[[TensorDictBase], TensorDictBase] | None,
    ) -> None:
        self.layout, self.flatten, self.track = layout, flatten, track_policy_version
        self.postproc = postproc
        self.started: float | None = None
        self._tokens = 0  # handed out since ``started``: the rate's
        self._lock = threading.Lock()

    def lay_out(self, batch: TensorDictBase) -> TensorDictBase:
        """The checked padded ``batch`` (check_padded, as it arrived) in the chosen layout."""
        tokens = batch.get("response_len")  # counted when handed over, not if interrupted
        out: TensorDictBase = to_torchrl(batch) if self.layout == "torchrl" else batch
        if not self.track:
            out = out.exclude("policy_version", ("next", "policy_version"))
        out.set(_TOKENS, tokens)
        return out.reshape(-1) if self.flatten and out.ndim > 1 else out

    def __call__(self, batch: TensorDictBase) -> TensorDictBase:
        tokens = int(batch.get(_TOKENS).sum())
        batch = batch.exclude(_TOKENS)
        with self._lock:
            if self.started is None:
                self.started = time.monotonic()
            self._tokens += tokens
        return self.postproc(batch) if self.postproc is not None else batch

    def tokens_per_s(self) -> float:
        """Response tokens per second since the first batch (of this run, or since a restore)."""
        with self._lock:  # one side of a restart (``stats()`` may run beside it), never a mix
            started, tokens = self.started, self._tokens
        if started is None:
            return 0.0
        return tokens / max(time.monotonic() - started, 1e-9)

    def restart_rate(self) -> None:
        """Count the rate from the next batch on (after a restore)."""
        with self._lock:
            self.started, self._tokens = None, 0


class _QueueSink:
    """A queue seen as a replay buffer: ``extend`` puts each element of a batch.

    ``"block"`` waits for room (the actors are paced by credits, nothing is lost);
    ``"drop_oldest"`` is TorchRL's behaviour: the oldest item makes room, and the
    drop is counted.
    """

    def __init__(self, target: Any, overflow: str) -> None:
        needs = ("put",) if overflow == "block" else ("put", "put_nowait", "get_nowait")
        lacks = [name for name in needs if not callable(getattr(target, name, None))]
        if lacks:  # else the first batch, taken and counted, is lost to an AttributeError
            raise TypeError(
                f"queue must have {', '.join(f'{n}()' for n in needs)} for "
                f"queue_overflow={overflow!r} (as queue.Queue); {type(target).__name__} lacks "
                f"{', '.join(lacks)}"
            )
        self.target, self.overflow, self.dropped = target, overflow, 0
        self._closed = threading.Event()

    def close(self) -> None:
        """Stop putting: a put waiting for room gives up, and nothing is put from now on."""
        self._closed.set()

    def extend(self, batch: TensorDictBase) -> None:
        """Put every element of ``batch`` (dim 0) into the queue (nothing once closed)."""
        for item in batch.unbind(0):
            if self._closed.is_set():
                return
            if self.overflow == "block":
                if not self._put_waiting(item):
                    return
                continue
            while True:
                try:
                    self.target.put_nowait(item)
                    break
                except queue_module.Full:
                    with contextlib.suppress(queue_module.Empty):
                        self.target.get_nowait()
                        self.dropped += 1

    def _put_waiting(self, item: TensorDictBase) -> bool:
        """Wait for room (``put(item, timeout=)``, as ``queue.Queue``); False once closed."""
        while not self._closed.is_set():
            try:
                self.target.put(item, timeout=_PUT_POLL_S)
                return True
            except queue_module.Full:
                continue
        return False


def _check_llm_only(**given: object) -> None:
    """Warn about TorchRL LLM arguments that do nothing over gRPC although a user set them."""
    for name, value in given.items():
        if value is None or value is False:  # not given (their defaults)
            continue
        hint = _LLM_ONLY_HINTS.get(name, "")
        warnings.warn(
            f"GrpcLLMCollector: {name}={value!r:.60} has no effect over gRPC (the actors "
            f"hold the model; push it with update_policy_weights_(model)){hint}",
            UserWarning,
            stacklevel=3,
        )


_LLM_ONLY_HINTS = {
    "policy": (
        "; the actors generate with their own settings: pass generate_kwargs such as "
        "max_new_tokens, temperature, top_p, top_k as generation={...}"
    ),
    "ray_init_config": "; the LLM actors are started apart (LocalFleet, the CLI, Kubernetes)",
    "remote_config": "; the LLM actors are started apart (LocalFleet, the CLI, Kubernetes)",
}


def _sync_mode(sync: bool | None, sync_iter: bool | None) -> bool:
    """``sync``, or ``RayLLMCollector``'s ``sync_iter`` when only it is given; else False.

    ``sync_iter=True`` collects each batch when it is asked for (on-policy): ``sync=True``
    here. ``sync_iter=False`` collects between yields: the async mode.
    """
    _check_flags(sync=sync, sync_iter=sync_iter)
    if sync is not None and sync_iter is not None and sync != sync_iter:
        raise ValueError(
            f"sync={sync} and sync_iter={sync_iter} disagree: sync_iter=True is sync=True (each "
            "batch collected when asked for), sync_iter=False the async mode; pass one"
        )
    chosen = sync if sync is not None else sync_iter
    return bool(chosen)


def _check_frame_names(kwargs: Mapping[str, Any]) -> None:
    """Refuse an env collector's frame counts, naming the dialog-turn knob that counts here."""
    for frames, turns in (("frames_per_batch", "dialog_turns_per_batch"),
                          ("total_frames", "total_dialog_turns")):  # fmt: skip
        if frames in kwargs:
            raise TypeError(
                f"GrpcLLMCollector counts dialog turns: pass {turns}={kwargs[frames]!r:.40}, "
                f"not {frames} (as TorchRL's LLMCollector)"
            )


def _check_postproc(postproc: object) -> None:
    """Refuse a ``postproc`` that is neither callable nor None, before any batch is taken."""
    if postproc is not None and not callable(postproc):
        raise TypeError(f"postproc must be callable or None, got {postproc!r:.60}")


def _check_flags(**given: object) -> None:
    """Refuse a flag that is neither a bool nor None, naming it (``"no"`` is not False)."""
    for name, value in given.items():
        if value is not None and not isinstance(value, bool):
            raise TypeError(f"{name} must be a bool or None, got {value!r:.40}")


def _tracking(track_policy_version: object) -> bool:
    """Whether batches keep ``policy_version``: a bool as given, None False, else True.

    Any other object (TorchRL's ``PolicyVersion``) is taken as True, as the warning says,
    whatever its truth value: it is not the one batches carry versions from.
    """
    if isinstance(track_policy_version, bool | None):
        return bool(track_policy_version)
    warnings.warn(
        f"GrpcLLMCollector: track_policy_version={type(track_policy_version).__name__} is "
        "taken as True: batches carry the versions the actors applied (integers, moved by "
        "update_policy_weights_), and the given tracker is neither read nor updated",
        UserWarning,
        stacklevel=3,
    )
    return True


def _vocab_size(vocab_size: object) -> int:
    """``vocab_size`` as ``LLMSettings`` takes it (any integer, numpy's too): None is 0."""
    if vocab_size is None:
        return 0
    size = as_int(vocab_size)
    if size is None or size < 1:
        raise ValueError(f"vocab_size must be an int >= 1 or None, got {vocab_size!r}")
    return size


def _check_sinks(layout: str, overflow: str, queue: Any, replay_buffer: Any) -> None:
    if layout not in _LAYOUTS:
        raise ValueError(f"layout must be one of {_LAYOUTS}, got {layout!r}")
    if overflow not in _OVERFLOW:
        raise ValueError(f"queue_overflow must be one of {_OVERFLOW}, got {overflow!r}")
    if queue is not None and replay_buffer is not None:  # TorchRL's RuntimeError
        raise RuntimeError("pass either replay_buffer or queue, not both")


def _modes(
    yield_completed_trajectories: bool | None,
    yield_only_last_steps: bool | None,
    flatten_data: bool | None,
    reset_at_each_iter: bool,
    has_buffer: bool,
) -> tuple[bool, bool, bool]:
    """TorchRL 0.14.1's rules for the three modes and ``flatten_data``, with its TypeErrors.

    ``yield_only_last_steps=True`` refuses any ``flatten_data`` given, False too, as TorchRL.
    """
    _check_flags(
        yield_completed_trajectories=yield_completed_trajectories,
        yield_only_last_steps=yield_only_last_steps,
        flatten_data=flatten_data,
    )
    last = bool(yield_only_last_steps)
    if last and yield_completed_trajectories is False:
        raise TypeError("yield_only_last_steps=True needs yield_completed_trajectories=True")
    completed = bool(yield_completed_trajectories) or last
    if last and flatten_data is not None:
        raise TypeError(
            f"yield_only_last_steps=True is incompatible with flatten_data={flatten_data} "
            "(given at all, as TorchRL's): leave flatten_data out"
        )
    if last and reset_at_each_iter:
        raise TypeError("yield_only_last_steps=True is incompatible with reset_at_each_iter")
    flatten = has_buffer if flatten_data is None else bool(flatten_data)
    return completed, last, flatten


def _turns_per_batch(given: int | None, completed: bool) -> int:
    """``dialog_turns_per_batch``: required in steps mode, 1 by default with whole dialogs."""
    if given is None and not completed:
        raise ValueError("dialog_turns_per_batch is required in steps mode")
    return 1 if given is None else positive_int("dialog_turns_per_batch", given)


class GrpcLLMCollector(TorchRLFixedFlags):
    """Collects dialog turns from rlfleet LLM actors, with TorchRL's ``LLMCollector`` API.

    One *dialog turn* is one response of one chat slot (TorchRL's "frame" of an LLM
    collector). Batches have TorchRL 0.14.1's LLM layout (``layout="torchrl"``:
    ``tokens``, ``masks``, ``log_probs``, ``text``, ``history``, ``policy_version``,
    ``done``/``terminated``, ``("collector", "traj_ids")``, ``next.*``), shaped
    ``[slots, T]`` in steps mode (sync: every actor's slots, concatenated),
    ``[sum T_i]`` with ``yield_completed_trajectories`` and ``[n]`` with
    ``yield_only_last_steps``; or the dense wire form (``layout="padded"``).

    Example::

        fleet = LocalFleet(2, kind="llm", task="arith", policy="rlfleet:tiny-qwen2",
                           num_envs=8, seed=0)
        with fleet, GrpcLLMCollector(fleet.addresses, dialog_turns_per_batch=16,
                                     total_dialog_turns=64, group_size=4,
                                     yield_completed_trajectories=True,
                                     generation={"max_new_tokens": 4}) as collector:
            for batch in collector:            # [16]: 4 groups of 4 dialogs, whole
                loss = grpo_loss(batch)        # torchrl.objectives.llm.GRPOLoss
                collector.update_policy_weights_(model)

    Args:
        actors: Actor addresses (``host:port`` or ``dns:///name:port``), or a fleet object
            (``LocalFleet``) that the collector then owns: started if it was not, stopped
            at ``shutdown()``.
        dialog_turns_per_batch: Turns per batch (sync: in total over the fleet, split
            evenly; steps mode: each share a multiple of the actors' slot count). Defaults
            to 1 with ``yield_completed_trajectories``, else required.
        total_dialog_turns: Turns after which iteration stops; -1 is endless. Every turn
            that ran counts once (with ``yield_only_last_steps`` the dropped
            intermediate turns count too, as in TorchRL 0.14.1).
        yield_completed_trajectories: Batches of whole dialogs.
        yield_only_last_steps: Only the last turn of each dialog (forces the former).
        flatten_data: ``view(-1)`` every batch; defaults to True with a replay buffer.
        replay_buffer: Anything with ``extend()``; iteration then yields None.
        queue: A ``queue.Queue``-like object receiving every element (exclusive with
            ``replay_buffer``).
        queue_overflow: ``"block"`` (default: the actors are paced, nothing is
            discarded) or ``"drop_oldest"`` (TorchRL's behaviour; drops are counted in
            ``stats()["queue_dropped"]``).
        postproc: Applied to every batch after the layout.
        reset_at_each_iter: Restart every slot's dialog at each batch (counted as dropped
            on the actors).
        track_policy_version: Keep ``policy_version`` in batches (TorchRL's default, False,
            leaves it out; the actors always record it, and ``policy_version`` and the
            push counters do not depend on it).
        sync: One batch from every actor per iteration, collected when asked for (a push
            between two batches reaches every turn of the next, as TorchRL's
            ``LLMCollector``), or first ready, first served, each actor one batch ahead
            (off-policy by one). None: ``sync_iter`` if given, else False.
        group_size: GRPO G: each prompt answered G times on one actor, marked by
            ``("collector", "group_id")``; a batch never splits a group.
        generation: ``max_new_tokens``, ``temperature`` (0 greedy), ``top_p``, ``top_k``,
            ``stop_token_ids``; nothing else applies.
        layout: ``"torchrl"`` or ``"padded"``.
        max_turns: Turn limit per dialog; 0 keeps the task's.
        token_versions: Record the policy version of every response token.
        vocab_size: The learner model's vocabulary (its embedding rows,
            ``model.config.vocab_size``): a batch holding a token id at or beyond it is
            refused as it arrives (``ProtocolError``: its actor's stream ends, nothing of
            it counts), and an actor whose
            model draws from more token ids (its output rows, at least its tokenizer's)
            refuses the session (``SettingsRefusedError``: learner and actors load other
            models). Any integer; None checks only that ids are not negative.
        sync_iter: ``RayLLMCollector``'s: True is ``sync=True``, False the async mode
            (``ValueError`` when it disagrees with a ``sync`` given).
        policy, policy_factory, async_envs, weight_updater, verbose, ray_init_config,
            remote_config, num_cpus, num_gpus: ``LLMCollector``'s and
            ``RayLLMCollector``'s, accepted with their defaults; none has an effect over
            gRPC (the actors hold the model and generate with ``generation``; pushes are
            ``update_policy_weights_(model)``): each one given warns, naming what to do
            instead (docs/collector.md).
        **kwargs: ``GrpcCollector``'s connection, credit, deadline, TLS and token
            settings (``prefetch``, ``connect_timeout``, ``call_timeout``,
            ``batch_timeout``, ``allow_partial_batches``, ``channel_credentials``,
            ``token``, ``model_id``, ``dns_refresh_interval``, ...).

    Raises:
        ValueError: Bad generation settings (unknown keys named), or a fleet that does not
            divide the turns.
        TypeError: An argument of the wrong type, or incompatible modes (as TorchRL's).
        RuntimeError: Both a ``replay_buffer`` and a ``queue`` (as TorchRL's).
    """

    def __init__(
        self,
        actors: Sequence[str] | str | ActorFleet,
        *,
        dialog_turns_per_batch: int | None = None,
        total_dialog_turns: int = -1,
        yield_completed_trajectories: bool | None = None,
        yield_only_last_steps: bool | None = None,
        flatten_data: bool | None = None,
        replay_buffer: Any = None,
        queue: Any = None,
        queue_overflow: str = "block",
        postproc: Callable[[TensorDictBase], TensorDictBase] | None = None,
        reset_at_each_iter: bool = False,
        track_policy_version: bool = False,
        sync: bool | None = None,
        group_size: int = 1,
        generation: Mapping[str, Any] | None = None,
        layout: str = "torchrl",
        max_turns: int = 0,
        token_versions: bool = False,
        vocab_size: int | None = None,
        policy: Any = None,
        policy_factory: Any = None,
        async_envs: bool | None = None,
        weight_updater: Any = None,
        verbose: bool = False,
        ray_init_config: dict[str, Any] | None = None,
        remote_config: dict[str, Any] | None = None,
        sync_iter: bool | None = None,
        num_cpus: int | None = None,
        num_gpus: int | None = None,
        **kwargs: Any,
    ) -> None:
        _check_llm_only(
            policy=policy,
            policy_factory=policy_factory,
            weight_updater=weight_updater,
            async_envs=async_envs,
            verbose=verbose,
            ray_init_config=ray_init_config,
            remote_config=remote_config,
            num_cpus=num_cpus,
            num_gpus=num_gpus,
        )
        sync = _sync_mode(sync, sync_iter)
        _check_frame_names(kwargs)
        _check_sinks(layout, queue_overflow, queue, replay_buffer)
        _check_postproc(postproc)
        completed, last, flatten = _modes(
            yield_completed_trajectories,
            yield_only_last_steps,
            flatten_data,
            reset_at_each_iter,
            has_buffer=replay_buffer is not None or queue is not None,
        )
        dialog_turns_per_batch = _turns_per_batch(dialog_turns_per_batch, completed)
        self.llm_settings = LLMSettings(
            generation=GenerationSettings.from_mapping(generation),
            group_size=group_size,
            yield_completed_trajectories=completed,
            yield_only_last_steps=last,
            max_turns=max_turns,
            token_versions=token_versions,
            vocab_size=_vocab_size(vocab_size),
        )
        self._sink = _QueueSink(queue, queue_overflow) if queue is not None else None
        self._shaper = _Shaper(layout, flatten, _tracking(track_policy_version), postproc)
        self.model_id = kwargs.get("model_id", DEFAULT_MODEL_ID)
        self._inner = GrpcCollector(
            actors,
            frames_per_batch=dialog_turns_per_batch,
            total_frames=total_dialog_turns,
            sync=sync,
            reset_at_each_iter=reset_at_each_iter,
            postproc=self._shaper,
            replay_buffer=self._sink if self._sink is not None else replay_buffer,
            cat_results=0,
            llm=self.llm_settings,
            **kwargs,
        )
        self._inner._placement.layout = self._shaper.lay_out
        self.yield_completed_trajectories, self.yield_only_last_steps = completed, last
        self.flatten_data, self.reset_at_each_iter = flatten, reset_at_each_iter
        self.replay_buffer = replay_buffer
        self.queue = queue
        self._connected = True  # the inner collector reached every actor
        self._began = False  # the actors were asked for turns (see ``started``)

    if not TYPE_CHECKING:  # else mypy would take any name read on a collector as valid

        def __getattr__(self, name: str) -> Any:
            """Only for names not found: a TorchRL name not offered says why."""
            return refuse_attribute(self, name, LLM_NOT_OFFERED)

    # ------------------------------------------------------------ iteration

    def set_postproc(self, postproc: Callable[[TensorDictBase], TensorDictBase] | None) -> None:
        """Apply ``postproc`` to every following batch, after the layout (TorchRL's method).

        As in TorchRL, a collector takes one postproc: the one given here or at construction.

        Raises:
            TypeError: ``postproc`` is neither callable nor None.
            RuntimeError: a postproc is already set (TorchRL's "Postproc already set").
        """
        _check_postproc(postproc)
        if self._shaper.postproc is not None:
            raise RuntimeError(
                f"Postproc already set ({self._shaper.postproc!r:.60}); a collector takes one "
                "postproc, as TorchRL's LLMCollector: compose both into one callable"
            )
        self._shaper.postproc = postproc

    @property
    def postproc(self) -> Callable[[TensorDictBase], TensorDictBase] | None:
        """The callable applied to every batch after the layout, or None (TorchRL's attribute)."""
        return self._shaper.postproc

    def __iter__(self) -> Iterator[TensorDictBase | None]:
        """Yield batches (None per batch stored in the buffer or queue) until the budget."""
        self._began = True  # on the first next() of the iterator: the actors are asked
        yield from self._inner

    def __len__(self) -> int:
        """``ceil(total_dialog_turns / dialog_turns_per_batch)``; TypeError when endless."""
        return len(self._inner)

    def next(self) -> TensorDictBase | None:
        """The next batch, or None at the end."""
        self._began = True
        return self._inner.next()

    def iterator(self) -> Iterator[TensorDictBase | None]:
        """TorchRL's name for iterating the collector."""
        return iter(self)

    @property
    def dialog_turns_per_batch(self) -> int:
        """Turns per batch, as resolved (1 by default with whole dialogs), as TorchRL's."""
        return self._inner.frames_per_batch

    @property
    def total_dialog_turns(self) -> int | float:
        """Turns after which iteration stops (``inf``: endless, -1 given), as TorchRL's."""
        return self._inner.total_frames

    @property
    def init_random_frames(self) -> int:
        """0: an LLM collector takes no random turns (``RayLLMCollector``'s, Trainer reads it)."""
        return 0

    @property
    def started(self) -> bool:
        """Whether collection began, and stays so (TorchRL's flag, set as its first step is sent).

        True once the actors were asked for turns: a first ``next()``, iteration or ``start()``.
        """
        return self._began

    @property
    def closed(self) -> bool:
        """False until :meth:`shutdown`, then True (TorchRL's flag)."""
        return not self._connected

    @property
    def storing_device(self) -> Any:
        """Where batches are delivered (``storing_device``, else ``device``; None: the host)."""
        return self._inner.storing_device

    @property
    def frames_per_batch(self) -> int:
        """TorchRL's base-collector name of :attr:`dialog_turns_per_batch` (Trainer reads it)."""
        return self._inner.frames_per_batch

    @property
    def requested_frames_per_batch(self) -> int:
        """The turns per batch asked for (TorchRL's name)."""
        return self._inner.frames_per_batch

    @property
    def total_frames(self) -> int | float:
        """TorchRL's base-collector name of :attr:`total_dialog_turns` (``inf``: endless)."""
        return self._inner.total_frames

    # ---------------------------------------------------------- versions

    @property
    def policy_version(self) -> int:
        """The acting model's policy version (0 before the first push)."""
        return self._inner.policy_version

    def get_policy_version(self) -> int:
        """:attr:`policy_version`, as a method (TorchRL's remote-call form)."""
        return self.policy_version

    def increment_version(self) -> int:
        """TorchRL's bump after a push: pushes the last weights given if they changed since.

        Versions only move with applied pushes, so every actor's batches name the version
        they were generated at; push-then-increment (TorchRL's vLLM updaters) sends once,
        and the version stays; before any weights were given it does nothing (as TorchRL's
        without a version tracker). Returns the version.
        """
        pusher = self._inner._pusher
        given = self.model_id in pusher.book.models_with_sources()
        if given and not pusher.unchanged_since_push(self.model_id):
            self._inner.update_policy_weights_(model_id=self.model_id)
        return self.policy_version

    def update_policy_weights_(self, policy_or_weights: Any = None, **kwargs: Any) -> dict:
        """Push weights to the actors (``worker_ids``, ``model_id``, ``weights_dict``...).

        Returns:
            ``{worker_id: version applied}``. See ``GrpcCollector.update_policy_weights_``.
        """
        return self._inner.update_policy_weights_(policy_or_weights, **kwargs)

    # ------------------------------------------------------------- extras

    def set_seed(self, seed: int, static_seed: bool = False) -> int:
        """Seed every actor's problem and token sampling, chained in worker_id order."""
        return self._inner.set_seed(seed, static_seed)

    def state_dict(self) -> dict[str, Any]:
        """Learner counters (``yielded_turns`` and ``tokens`` too) and every actor's state.

        The counters are of one instant (``frames`` and ``yielded_turns`` count the same
        batches), also while another thread iterates.
        """
        return self._inner.state_dict()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` (dialogs in progress restart).

        Every counter is restored in one step: ``stats()`` beside it reads the counts of
        one side of the restore. A checkpoint without ``yielded_turns`` and ``tokens`` (a
        ``GrpcCollector``'s) counts them from 0 again.
        """
        self._inner.load_state_dict(state_dict)
        self._shaper.restart_rate()

    def getattr_rb(self, attr: str) -> Any:
        """``attr`` of the replay buffer given (``write_count``, say), as TorchRL's."""
        if self.replay_buffer is None:
            given = "its batches go to the queue given" if self.queue is not None else "none given"
            raise AttributeError(
                f"getattr_rb({attr!r}): the collector has no replay_buffer ({given})"
            )
        return getattr(self.replay_buffer, attr)

    @property
    def remote_collectors(self) -> list[RemoteActor]:
        """The actors, as ``(address, worker_id)`` records."""
        return self._inner.remote_collectors

    def add_collectors(self, addresses: Sequence[str]) -> list[RemoteActor]:
        """Grow the fleet, also while collecting."""
        return self._inner.add_collectors(addresses)

    def is_initialized(self) -> bool:
        """Whether the collector is ready to collect (TorchRL's ``LLMCollector`` knob).

        True from construction, which reaches every actor, until :meth:`shutdown`.
        """
        return self._connected

    def stats(
        self, workers: str = "aggregate", *, timeout: float | None = 10.0
    ) -> dict[str, int | float | bool]:
        """Flat scalars: ``turns``, ``tokens``, ``tokens_per_s``, ``dropped_dialogs``, lag...

        Plus ``GrpcCollector.stats``' counters (``workers`` and ``timeout`` as there).
        """
        out = self._inner.stats(workers, timeout=timeout)
        # frames, yielded_turns and tokens: the ledger's counts of one instant
        out["turns"] = out.get("frames", out["yielded_turns"])
        out["tokens_per_s"] = self._shaper.tokens_per_s()
        # Dialogs in progress on actors that died (one per chat slot; groups whole).
        out["dropped_dialogs"] = int(out.get("lost_in_progress", 0))
        if self._sink is not None:
            out["queue_dropped"] = self._sink.dropped
        return out

    # ------------------------------------------------------------ lifecycle

    def start(self) -> None:
        """Collect in a background thread into the replay buffer or queue.

        Raises:
            RuntimeError: Neither a replay buffer nor a queue was given (as TorchRL's).
        """
        if self.replay_buffer is None and self.queue is None:
            raise RuntimeError("start() needs a replay_buffer or a queue (pass one of them)")
        self._began = True
        self._inner.start()

    def pause(self, timeout: float | None = 30.0, *, resume: bool = True) -> Any:
        """Context manager: no new credits while held (``GrpcCollector.pause``'s arguments)."""
        return self._inner.pause(timeout, resume=resume)

    def is_running(self) -> bool:
        """Whether the background collection thread runs."""
        return self._inner.is_running()

    def async_shutdown(self, timeout: float | None = None, close_env: bool = True) -> None:
        """Stop background collection, then shut down (``close_env``: as in ``shutdown``)."""
        self.shutdown(timeout, close_env)

    def shutdown(
        self, timeout: float | None = None, close_env: bool = True, raise_on_error: bool = True
    ) -> None:
        """Close every session and channel (bounded, idempotent; TorchRL's flags change nothing).

        A ``queue`` gets nothing more once this is called: a background put waiting for
        room (``queue_overflow="block"``, a consumer that stopped) gives up at once.
        """
        shutdown_limit(timeout)  # a bad timeout: ValueError before anything closes
        self._connected = False
        if self._sink is not None:
            self._sink.close()
        self._inner.shutdown(timeout, close_env, raise_on_error)

    def __enter__(self) -> GrpcLLMCollector:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.shutdown()

    def __repr__(self) -> str:
        return f"GrpcLLMCollector({self._inner!r}, llm={self.llm_settings})"
