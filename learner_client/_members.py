"""What the fleet checks know about one actor, and which actors a collector accepts.

A :class:`FleetMember` is an actor as Describe reported it, reduced to what
:func:`learner_client._settings.check_fleet` needs. Env collectors need env actors,
LLM collectors LLM actors within their ``max_new_tokens_cap``: checking the kind when
the fleet is admitted turns a mix-up into a ``ValueError`` naming the actors, instead of
a refused session later.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from common.config import DEFAULT_MODEL_ID, same_device
from common.llm import LLMSettings

__all__ = ["FleetMember", "check_devices", "check_kinds", "check_unique"]


@dataclasses.dataclass(frozen=True)
class FleetMember:
    """What the fleet checks need to know about one actor.

    Attributes:
        address: ``host:port``.
        worker_id: The id the actor reported.
        num_envs: Its env pool size (LLM actors: chat slots).
        models: The model_ids it holds.
        kind: ``"env"``, ``"torchrl"`` (an env actor on a TorchRL env) or ``"llm"``.
        max_new_tokens_cap: An LLM actor's cap on new tokens per turn.
        device: Where its policy runs.
    """

    address: str
    worker_id: int
    num_envs: int
    models: tuple[str, ...] = (DEFAULT_MODEL_ID,)
    kind: str = "env"
    max_new_tokens_cap: int = 0
    device: str = "cpu"


def check_unique(members: Sequence[FleetMember]) -> None:
    """Refuse two actors reporting one worker_id.

    Raises:
        ValueError: Naming each shared worker_id and its addresses.
    """
    by_id: dict[int, list[str]] = {}
    for member in members:
        by_id.setdefault(member.worker_id, []).append(member.address)
    duplicates = {wid: addrs for wid, addrs in by_id.items() if len(addrs) > 1}
    if duplicates:
        detail = "; ".join(
            f"worker_id {wid} at {addrs}" for wid, addrs in sorted(duplicates.items())
        )
        raise ValueError(f"worker_ids must be unique across the fleet: {detail}")


def check_kinds(members: Sequence[FleetMember], llm: LLMSettings | None) -> None:
    """Env collectors need env actors; LLM collectors LLM actors within their token caps."""
    want = "env" if llm is None else "llm"
    # A TorchRL-env actor collects env batches too: an env collector takes it.
    kinds = ("env", "torchrl") if llm is None else ("llm",)
    wrong = [m for m in members if m.kind not in kinds]
    if wrong:
        detail = ", ".join(f"{m.address} (worker_id {m.worker_id}) is {m.kind!r}" for m in wrong)
        use = "GrpcCollector" if llm is None else "GrpcLLMCollector"
        raise ValueError(f"{use} needs {want} actors, but {detail}")
    if llm is None:
        return
    over = [m for m in members if llm.generation.max_new_tokens > m.max_new_tokens_cap]
    if over:
        detail = ", ".join(
            f"{m.address} (worker_id {m.worker_id}) caps it at {m.max_new_tokens_cap}" for m in over
        )
        raise ValueError(
            f"max_new_tokens={llm.generation.max_new_tokens} is above an actor's cap: {detail}"
        )


def check_devices(members: Sequence[FleetMember], policy_device: str, cudagraph: bool) -> None:
    """The actors run their policy on ``policy_device`` (if named), on CUDA for CUDA graphs.

    The actors refuse such sessions themselves (FAILED_PRECONDITION); checking what
    Describe reported turns the mistake into an error at construction.

    Raises:
        ValueError: Naming each actor on another device, its device and the one asked.
    """
    if policy_device:
        wrong = [m for m in members if not same_device(policy_device, m.device)]
        if wrong:
            detail = ", ".join(f"worker_id {m.worker_id} runs it on {m.device}" for m in wrong)
            raise ValueError(
                f"policy_device={policy_device!r}, but {detail}: start the actors with "
                f"--device {policy_device} (an actor never moves its policy)"
            )
    on_cpu = [m.worker_id for m in members if m.device.startswith("cpu")]
    if cudagraph and on_cpu:
        raise ValueError(f"cudagraph_policy needs CUDA actors; worker_ids {on_cpu} run on the CPU")
