"""Conversions between the ``rlfleet.v1`` messages and the collection core's Python values.

The servicer stays a thin adapter: collection settings arrive as a
``CollectSettings`` message and leave here as :class:`common.config.CollectSettings`;
the core's description (gymnasium spaces, model parameter tables) leaves here as
a ``DescribeResponse``. Nothing in this module blocks or touches the network.
"""

from __future__ import annotations

from typing import Any

import grpc
import numpy as np

from actor_service._core._identity import ActorIdentity
from common.config import (
    DEFAULT_MODEL_ID,
    MIN_PEER_PROTOCOL,
    PROTOCOL_VERSION,
    CollectSettings,
    CompileSettings,
    ExplorationType,
)
from common.errors import RlfleetError
from common.llm import GenerationSettings, LLMSettings
from common.rlfleet.v1 import actor_service_pb2 as pb

__all__ = [
    "InvalidSettingsError",
    "describe_to_proto",
    "llm_settings_from_proto",
    "settings_from_proto",
    "space_to_proto",
]


class InvalidSettingsError(RlfleetError, ValueError):
    """A session's collection settings are not valid for this actor (INVALID_ARGUMENT)."""

    status_code = grpc.StatusCode.INVALID_ARGUMENT


_EXPLORATION = {
    pb.EXPLORATION_TYPE_UNSPECIFIED: ExplorationType.RANDOM,
    pb.EXPLORATION_TYPE_RANDOM: ExplorationType.RANDOM,
    pb.EXPLORATION_TYPE_DETERMINISTIC: ExplorationType.DETERMINISTIC,
    pb.EXPLORATION_TYPE_MODE: ExplorationType.MODE,
    pb.EXPLORATION_TYPE_MEAN: ExplorationType.MEAN,
}
# Box bounds beyond this many elements are left out of a SpaceSpec (images).
_MAX_BOUNDS = 1024


def settings_from_proto(msg: pb.CollectSettings) -> CollectSettings:
    """Turn the ``open`` message's settings into a :class:`CollectSettings`.

    ``EXPLORATION_TYPE_UNSPECIFIED`` means RANDOM and an empty ``model_id``
    means ``"policy"``.

    Raises:
        InvalidSettingsError: Naming the offending value.
    """
    exploration = _EXPLORATION.get(msg.exploration_type)
    if exploration is None:
        raise InvalidSettingsError(f"unknown exploration_type {msg.exploration_type} in settings")
    try:
        llm = llm_settings_from_proto(msg.llm) if msg.HasField("llm") else None
        return CollectSettings(
            frames_per_batch=int(msg.frames_per_batch),
            max_frames_per_traj=int(msg.max_frames_per_traj),
            init_random_frames=int(msg.init_random_frames),
            reset_at_each_iter=msg.reset_at_each_iter,
            reset_when_done=msg.reset_when_done,
            split_trajs=msg.split_trajs,
            exploration_type=exploration,
            set_truncated=msg.set_truncated,
            total_frames=int(msg.total_frames),
            model_id=msg.model_id or DEFAULT_MODEL_ID,
            llm=llm,
            fold_observations=msg.fold_observations,
            policy_device=msg.policy_device,
            env_device=msg.env_device,
            compile_policy=_compile_from_proto(msg),
            cudagraph_policy=msg.cudagraph_policy,
        )
    except (TypeError, ValueError) as exc:
        raise InvalidSettingsError(f"invalid collect settings: {exc}") from None


def _compile_from_proto(msg: pb.CollectSettings) -> CompileSettings | None:
    """The session's ``torch.compile`` options; None when it asks for none (ValueError if bad)."""
    if not msg.HasField("compile_policy"):
        return None
    wire = msg.compile_policy
    return CompileSettings(
        backend=wire.backend,
        mode=wire.mode,
        fullgraph=wire.fullgraph if wire.HasField("fullgraph") else None,
        dynamic=wire.dynamic if wire.HasField("dynamic") else None,
    )


def llm_settings_from_proto(msg: pb.LLMSettings) -> LLMSettings:
    """Turn an ``LLMSettings`` message into :class:`common.llm.LLMSettings` (unset = default).

    Raises:
        ValueError: A value out of range, naming it.
    """
    gen = msg.generation
    values: dict[str, Any] = {
        name: getattr(gen, name)
        for name in ("max_new_tokens", "temperature", "top_p", "top_k")
        if gen.HasField(name)
    }
    values["stop_token_ids"] = tuple(int(t) for t in gen.stop_token_ids)
    return LLMSettings(
        generation=GenerationSettings.from_mapping(values),
        group_size=int(msg.group_size) or 1,
        yield_completed_trajectories=msg.yield_completed_trajectories,
        yield_only_last_steps=msg.yield_only_last_steps,
        max_turns=int(msg.max_turns),
        token_versions=msg.token_versions,
        vocab_size=int(msg.vocab_size),
    )


def space_to_proto(space: Any) -> pb.SpaceSpec:
    """Flatten a gymnasium space into a ``SpaceSpec`` (kind, shape, dtype, bounds, n, text)."""
    kind = _space_kind(space)
    shape = tuple(getattr(space, "shape", None) or ())
    dtype = getattr(space, "dtype", None)
    spec = pb.SpaceSpec(
        kind=kind,
        shape=[int(d) for d in shape],
        dtype=str(np.dtype(dtype)) if dtype is not None else "",
        text=repr(space),
    )
    if kind == "box" and int(np.prod(shape, dtype=np.int64)) <= _MAX_BOUNDS:
        spec.low.extend(float(v) for v in np.asarray(space.low, dtype=np.float64).ravel())
        spec.high.extend(float(v) for v in np.asarray(space.high, dtype=np.float64).ravel())
    elif kind == "discrete":
        spec.n.append(int(space.n))
    elif kind == "multi_discrete":
        spec.n.extend(int(v) for v in np.asarray(space.nvec).ravel())
    return spec


def _space_kind(space: Any) -> str:
    name = type(space).__name__
    return {
        "Box": "box",
        "Discrete": "discrete",
        "MultiDiscrete": "multi_discrete",
        "MultiBinary": "multi_binary",
    }.get(name, name.lower())


def describe_to_proto(
    description: ActorIdentity, *, max_credits: int, busy: bool, max_new_tokens_cap: int = 0
) -> pb.DescribeResponse:
    """Turn the core's ``ActorIdentity`` into a ``DescribeResponse``.

    The identity's neutral ``num_slots`` and ``backend`` go on the wire as ``num_envs``
    and ``env_backend``.

    Args:
        description: What the collection core's ``describe()`` returned.
        max_credits: The actor's credit cap.
        busy: Whether a learner session is active.
        max_new_tokens_cap: An LLM actor's cap on new tokens per turn.
    """
    models = []
    for model_id, (version, params) in sorted(description.models.items()):
        infos = [
            pb.ParameterInfo(name=name, shape=[int(d) for d in shape], dtype=_dtype_name(dtype))
            for name, (shape, dtype) in params.items()
        ]
        models.append(pb.ModelInfo(model_id=model_id, version=int(version), parameters=infos))
    spaces: dict[str, Any] = {}
    if description.observation_space is not None:  # an LLM actor has no spaces
        spaces = {
            "observation_spec": space_to_proto(description.observation_space),
            "action_spec": space_to_proto(description.action_space),
        }
    return pb.DescribeResponse(
        worker_id=description.worker_id,
        epoch=description.epoch,
        env_id=str(description.env_id),
        models=models,
        kind=description.kind,
        policy=description.policy,
        max_new_tokens_cap=max_new_tokens_cap if description.kind == "llm" else 0,
        **spaces,
        num_envs=description.num_slots,
        env_backend=str(description.backend),
        device=str(description.device),
        software_version=str(description.software_version),
        protocol_version=PROTOCOL_VERSION,
        min_peer_protocol=MIN_PEER_PROTOCOL,
        max_credits=max_credits,
        busy=busy,
    )


def _dtype_name(dtype: Any) -> str:
    return str(dtype).removeprefix("torch.")
