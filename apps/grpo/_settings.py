"""The settings of one ``rlfleet-grpo`` run, which are also its command line.

:class:`GRPOSettings` is a frozen dataclass with one documented field per flag;
:func:`parse_args` builds the parser from its fields (as ``rlfleet-train`` does),
so the command line and the settings cannot drift apart. Values are validated in
``__post_init__``, whether they come from the command line or from code.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Sequence
from typing import Any

from apps._job.device import (
    LEARNER_DEVICE_HELP,
    check_learner_device,
    cuda_device_count,
    ranks_per_node,
)
from apps._job.ranks import job_ranks
from apps._job.settings import check_positive_ints, check_rank_shares, opt, parse_settings
from common.config import MAX_NUM_ENVS, MAX_WORKER_ID
from common.llm import (
    DEFAULT_MAX_NEW_TOKENS_CAP,
    VOCABS,
    GenerationSettings,
    build_task,
    check_policy_spec,
)

__all__ = ["LOSSES", "MAX_EVAL_PROBLEMS", "MODEL_SPEC", "PROG", "GRPOSettings", "parse_args"]

#: The program's name, which prefixes its messages.
PROG = "rlfleet-grpo"

#: The model both sides build: the learner's copy and the actors' are the same architecture.
MODEL_SPEC = "rlfleet:tiny-qwen2"
#: ``builtin``: the plain-torch loss of this package; ``torchrl``: TorchRL's GRPOLoss.
LOSSES = ("builtin", "torchrl")
#: The tiny Qwen2's context when the task needs no more (``--max-positions 0``).
DEFAULT_CONTEXT = 512
ENGINES = ("transformers", "vllm")
#: The most held-out problems: each is drawn up to 50 times to find distinct ones (10^9 of a
#: 100-problem task drew for days before the fleet started), then decoded at every evaluation.
MAX_EVAL_PROBLEMS = 10_000


@dataclasses.dataclass(frozen=True)
class GRPOSettings:
    """Everything a GRPO run needs; each field is one command-line flag.

    The defaults are the best measured so far for the built-in tiny Qwen2 on one-digit
    ``arith`` (``a+b=``, the answer modulo 10) with 2 local actors: the 24-token
    ``arith`` vocabulary and weights redrawn at 0.1 reach 0.9 greedy accuracy in about
    120-370 updates, 66-164 s on a loaded 2-core VM (``docs/grpo.md``).

    Attributes:
        task: The actors' task (``arith``, ``reverse``, ``countdown``, ``jsonl:PATH``, ...).
        task_kwargs: The task's keyword arguments, as JSON.
        num_actors: LLM actor servers to start on loopback (every rank's together).
        nproc_per_node: Learner ranks to start on this machine (data-parallel GRPO through
            torchrun, ``docs/grpo.md``); each starts and owns ``num_actors / nproc_per_node``
            actors and updates on ``prompts_per_step`` problems of its own per step.
        learner_device: Where the learner's model, optimiser and update run: ``cpu``,
            ``cuda`` (each rank on ``cuda:LOCAL_RANK``, NCCL between ranks: one GPU per
            rank) or ``cuda:N`` (one rank); the built-in loss only. Checked before
            anything starts.
        shard_pushes: Each rank pushes only its part of the weights (sorted keys
            ``[rank::nproc_per_node]``) to every actor, which swaps a version in when all
            parts arrived; without it each rank pushes the whole model to its own actors.
        engine: What decodes on the actors: ``transformers`` (rlfleet's decode loop) or
            ``vllm`` (a vLLM engine per actor; docs/llm.md, "Choosing an engine").
        hidden: Width of the tiny Qwen2 (``rlfleet:tiny-qwen2``).
        layers: Decoder layers of the tiny Qwen2.
        heads: Attention heads of the tiny Qwen2.
        vocab: Tokenizer of the tiny Qwen2: ``arith`` (the arith task's alphabet, 24
            tokens), ``compact`` (the built-in tasks' alphabet, 60 tokens), ``bytes``
            (260 byte-level tokens) or ``auto``: ``arith`` for the arith task,
            ``compact`` for the others.
        init_std: Standard deviation every weight matrix and embedding of the learner's
            copy is redrawn with before the first push (which gives them to the
            actors); biases are zeroed. 0 keeps the model's own initialisation (0.2).
        embedding_std: Standard deviation of the learner's initial token embeddings (tied
            with the output layer; drawn after ``init_std``); 0 leaves them as they are.
        prompts_per_step: Distinct problems per update; each is answered ``group_size``
            times, so an update sees ``prompts_per_step * group_size`` dialog turns.
        group_size: GRPO's G: answers per problem (>= 2), normalised against each other.
        max_new_tokens: Most tokens per answer.
        temperature: Sampling temperature of the actors (the loss uses the same); None
            is 1.5 with the built-in loss and 1 with ``torchrl`` (TorchRL's wrapper
            scores raw logits, so its ratio is exact at temperature 1 only).
        sync: One batch from every actor per update (on-policy) or the first ready
            actor's batch (``--async``; batches may lag a push or two behind).
        lr: Adam learning rate.
        epochs: Gradient steps on each batch.
        clip_eps: Clipping range of the probability ratio.
        ent_coef: Weight of the entropy bonus (keeps exploration alive).
        entropy_floor: Nats per response token below which the bonus acts (built-in
            loss); above it the policy may sharpen freely.
        max_grad_norm: Gradient-norm clip.
        loss: ``builtin`` (plain torch) or ``torchrl`` (TorchRL's ``GRPOLoss`` and
            ``MCAdvantage``; needs torchrl installed).
        target_accuracy: Stop once greedy accuracy on the held-out problems reaches it.
        eval_problems: Held-out problems evaluated (distinct; fewer when the task has fewer),
            at most :data:`MAX_EVAL_PROBLEMS`.
        eval_every: Updates between evaluations.
        max_steps: Update budget; training stops there if the target is not met.
        max_seconds: Wall-clock budget in seconds; 0 is none.
        seed: Seeds the learner; actor ``i`` gets ``seed + i``.
        out: Output directory (default ``runs/grpo-<task>-seed<seed>``).
        progress: Show a tqdm progress bar (log lines instead when off or not installed).
    """

    task: str = opt("arith", "the actors' task")
    task_kwargs: str = opt("{}", "the task's keyword arguments, as JSON")
    num_actors: int = opt(2, "LLM actor servers to start on loopback")
    nproc_per_node: int = opt(1, "learner ranks (DDP) to start on this machine")
    shard_pushes: bool = opt(False, "each rank pushes its part of the weights to every actor")
    learner_device: str = opt("cpu", LEARNER_DEVICE_HELP)
    engine: str = opt("transformers", "the actors' engine: transformers or vllm")
    hidden: int = opt(128, "width of the tiny Qwen2")
    layers: int = opt(2, "decoder layers of the tiny Qwen2")
    heads: int = opt(4, "attention heads of the tiny Qwen2")
    max_positions: int = opt(0, "context of the tiny Qwen2 in tokens (0: fit to the task)")
    vocab: str = opt("auto", "tokenizer of the tiny Qwen2: auto, arith, compact or bytes")
    init_std: float = opt(0.1, "std every initial weight is redrawn with (0: the model's own)")
    embedding_std: float = opt(0.0, "std of the initial token embeddings (0: as they are)")
    prompts_per_step: int = opt(32, "distinct problems per update")
    group_size: int = opt(8, "answers per problem (GRPO's G)")
    max_new_tokens: int = opt(1, "most tokens per answer")
    temperature: float | None = opt(
        None, "sampling temperature, > 0: GRPO scores samples (default 1.5; 1 with torchrl)"
    )
    sync: bool = opt(True, "sync (on-policy) or async collection", negative="async")
    lr: float = opt(5e-4, "Adam learning rate")
    epochs: int = opt(1, "gradient steps per batch")
    clip_eps: float = opt(0.2, "clipping range of the probability ratio")
    ent_coef: float = opt(0.05, "entropy bonus weight")
    entropy_floor: float = opt(0.5, "entropy (nats per token) below which the bonus acts")
    max_grad_norm: float = opt(1.0, "gradient norm clip")
    loss: str = opt("builtin", "builtin (plain torch) or torchrl (GRPOLoss + MCAdvantage)")
    target_accuracy: float = opt(0.9, "stop at this greedy accuracy on held-out problems")
    eval_problems: int = opt(100, "held-out problems evaluated")
    eval_every: int = opt(1, "updates between evaluations")
    max_steps: int = opt(1000, "update budget of the run")
    max_seconds: float = opt(0.0, "wall-clock budget in seconds (0: none)")
    seed: int = opt(0, "seed of the learner; actor i gets seed + i")
    out: str = opt("", "output directory (default runs/grpo-<task>-seed<seed>)")
    progress: bool = opt(True, "show a tqdm progress bar")

    def __post_init__(self) -> None:
        check_positive_ints(
            self,
            (
                "num_actors",
                "nproc_per_node",
                "hidden",
                "layers",
                "heads",
                "prompts_per_step",
                "group_size",
                "max_new_tokens",
                "epochs",
                "eval_problems",
                "eval_every",
                "max_steps",
            ),
        )
        if self.eval_problems > MAX_EVAL_PROBLEMS:
            raise ValueError(
                f"eval_problems must be at most {MAX_EVAL_PROBLEMS}, got {self.eval_problems}"
            )
        for name in ("lr", "clip_eps", "max_grad_norm", "temperature"):
            value = getattr(self, name)
            if value is not None and not (math.isfinite(value) and value > 0):
                raise ValueError(f"{name} must be finite and > 0, got {value!r}")
        if self.max_new_tokens > DEFAULT_MAX_NEW_TOKENS_CAP:
            raise ValueError(
                f"max_new_tokens must be at most {DEFAULT_MAX_NEW_TOKENS_CAP} (the LLM actors' "
                f"cap), got {self.max_new_tokens}"
            )
        GenerationSettings(temperature=self.sampling_temperature)  # the actors' sampling rule
        for name in ("ent_coef", "entropy_floor", "init_std", "embedding_std", "max_positions"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"{name} must be finite and >= 0, got {value!r}")
        if not (math.isfinite(self.max_seconds) and self.max_seconds >= 0):
            raise ValueError(f"max_seconds must be finite and >= 0, got {self.max_seconds!r}")
        if not 0.0 < self.target_accuracy <= 1.0:
            raise ValueError(f"target_accuracy must be in (0, 1], got {self.target_accuracy!r}")
        if self.vocab not in ("auto", *VOCABS):
            raise ValueError(f"vocab must be auto or one of {VOCABS}, got {self.vocab!r}")
        if self.engine not in ENGINES:
            raise ValueError(f"engine must be one of {ENGINES}, got {self.engine!r}")
        self._check_update()
        self._check_model()
        self._check_ranks()
        self._check_fleet()
        if self.prompts_per_step % self.actors_per_rank and self.sync:
            raise ValueError(
                f"prompts_per_step ({self.prompts_per_step}) must be a multiple of "
                f"num_actors / nproc_per_node ({self.actors_per_rank}) in sync mode"
            )
        # The task as the actors will build it: a bad spec or kwargs is refused here.
        build_task(self.task, **self.task_kwargs_dict)

    def _check_update(self) -> None:
        """The GRPO update's own rules: a known loss, groups to compare, TorchRL's sampling."""
        if self.loss not in LOSSES:
            raise ValueError(f"loss must be one of {LOSSES}, got {self.loss!r}")
        if self.loss == "torchrl" and self.sampling_temperature != 1.0:
            # TorchRL's wrapper scores raw logits: the ratio is exact at temperature 1 only.
            raise ValueError(
                f"--loss torchrl needs temperature 1 (TorchRL scores raw logits), "
                f"got {self.temperature!r}"
            )
        if self.group_size < 2:
            # One answer per problem has no group to be normalised against: zero advantages
            # (built-in loss) or NaN weights (MCAdvantage divides by a one-sample std).
            raise ValueError(
                f"group_size must be >= 2 (GRPO compares answers), got {self.group_size}"
            )

    def _check_model(self) -> None:
        """The model as both sides will build it: a size or seed past its ints is refused here."""
        if self.seed < 0:
            raise ValueError(f"seed must be >= 0, got {self.seed!r}")
        if self.hidden % (2 * self.heads):
            raise ValueError(
                f"hidden ({self.hidden}) must be a multiple of 2 * heads ({self.heads})"
            )
        check_policy_spec(MODEL_SPEC, **self.model_kwargs)

    def _check_ranks(self) -> None:
        ranks = self.ranks
        if self.shard_pushes and ranks < 2:
            raise ValueError(
                f"--shard-pushes needs --nproc-per-node 2 or more (each rank pushes its part "
                f"of the weights), got nproc_per_node={ranks}"
            )
        check_rank_shares(self.num_actors, ranks)
        if ranks > 1 and self.loss != "builtin":
            raise ValueError(f"--nproc-per-node {ranks} needs --loss builtin, got {self.loss!r}")
        if self.learner_device != "cpu":  # the CPU needs no look at the GPUs
            if self.loss != "builtin":
                raise ValueError(
                    f"--learner-device {self.learner_device} needs --loss builtin (TorchRL's "
                    f"loss runs on the CPU), got {self.loss!r}"
                )
            check_learner_device(self.learner_device, ranks_per_node(ranks), cuda_device_count())

    def _check_fleet(self) -> None:
        """The local fleet as the actors will take it: worker ids and chat slots in range."""
        if self.num_actors > MAX_WORKER_ID + 1:
            raise ValueError(
                f"num_actors must be at most {MAX_WORKER_ID + 1} (worker ids 0..{MAX_WORKER_ID}), "
                f"got {self.num_actors}"
            )
        if self.slots_per_actor > MAX_NUM_ENVS:
            share = "an actor's share of " if self.sync else ""
            raise ValueError(
                f"{share}prompts_per_step * group_size ({self.prompts_per_step} * "
                f"{self.group_size}) is {self.slots_per_actor} chat slots per actor, over an "
                f"actor's {MAX_NUM_ENVS}: ask for fewer turns per update or start more actors"
            )

    @property
    def ranks(self) -> int:
        """The learner ranks: ``nproc_per_node``, or torchrun's world size under it."""
        return job_ranks(self.nproc_per_node)

    @property
    def actors_per_rank(self) -> int:
        """The actors each learner rank starts and owns."""
        return self.num_actors // self.ranks

    @property
    def task_kwargs_dict(self) -> dict[str, Any]:
        """``task_kwargs`` parsed (ValueError unless it is a JSON object)."""
        try:
            value = json.loads(self.task_kwargs)
        except json.JSONDecodeError as exc:
            raise ValueError(f"task_kwargs is not JSON: {exc}") from None
        if not isinstance(value, dict):
            raise ValueError(f"task_kwargs must be a JSON object, got {self.task_kwargs!r}")
        return value

    @property
    def sampling_temperature(self) -> float:
        """The temperature in force: ``temperature``, or 1.5 (built-in loss) / 1 (torchrl)."""
        if self.temperature is not None:
            return self.temperature
        return 1.0 if self.loss == "torchrl" else 1.5

    @property
    def model_vocab(self) -> str:
        """The vocabulary in force: ``vocab``; ``auto`` is ``arith`` for arith, else ``compact``."""
        if self.vocab != "auto":
            return self.vocab
        return "arith" if self.task == "arith" else "compact"

    @property
    def model_kwargs(self) -> dict[str, int | str]:
        """The ``rlfleet:tiny-qwen2`` kwargs learner and actors build the model with."""
        return {
            "hidden": self.hidden,
            "layers": self.layers,
            "heads": self.heads,
            "max_positions": self.max_positions or DEFAULT_CONTEXT,
            "vocab": self.model_vocab,
            "seed": self.seed,
        }

    @property
    def slots_per_actor(self) -> int:
        """Chat slots of each actor: its share of an update's dialog turns."""
        turns = self.prompts_per_step * self.group_size
        return turns // self.actors_per_rank if self.sync else turns

    @property
    def out_dir(self) -> str:
        """The output directory: ``out``, or ``runs/grpo-<task>-seed<seed>``."""
        name = self.task.replace(":", "_").replace("/", "_")
        return self.out or f"runs/grpo-{name}-seed{self.seed}"


def parse_args(argv: Sequence[str] | None = None) -> GRPOSettings:
    """Parse a command line into validated settings (SystemExit, from argparse, if invalid).

    Args:
        argv: The arguments without the program name; None reads ``sys.argv``.
    """
    return parse_settings(
        GRPOSettings,
        PROG,
        "GRPO on a language-model task against 2 local LLM actors it starts itself.",
        argv,
    )
