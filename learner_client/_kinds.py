"""Which actors a collector accepts: env collectors need env actors, LLM collectors LLM actors.

An actor's kind and its ``max_new_tokens_cap`` come from Describe; checking them when the
fleet is admitted turns a mix-up into a ``ValueError`` naming the actors, instead of a
refused session later.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from common.llm import LLMSettings

if TYPE_CHECKING:
    from learner_client._settings import FleetMember

__all__ = ["check_kinds"]


def check_kinds(members: Sequence[FleetMember], llm: LLMSettings | None) -> None:
    """Env collectors need env actors; LLM collectors LLM actors within their token caps."""
    want = "env" if llm is None else "llm"
    wrong = [m for m in members if m.kind != want]
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
