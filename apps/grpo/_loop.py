"""The loop of ``rlfleet-grpo``: collect groups of answers, update GRPO, push, evaluate.

Read :func:`train` top to bottom: seed, build the learner's copy of the model (the
same ``rlfleet:tiny-qwen2``, with the same kwargs and seed, the actors build),
optionally with small token embeddings, start
the local LLM fleet, push the weights so every actor samples from the learner's
policy (whatever it held before), then per batch: update (built-in loss or
TorchRL's), push the new weights to every actor, and evaluate greedy accuracy on the
held-out problems with the learner's copy — until the target accuracy, the step
budget or the time budget. Under ``--nproc-per-node N`` every rank runs this loop on its
own share of the fleet (:mod:`apps.grpo._ranks`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import pathlib
import random
import time
from typing import Any, cast

import torch
from torch import nn

from apps._job.cli import SignalsHeld, learner_token, seed_everything
from apps._job.ranks import DataParallel
from apps._job.report import Progress
from apps.grpo._evaluate import Evaluator, held_out_problems, prompt_ids
from apps.grpo._loss import GRPOConfig, GRPOLearner
from apps.grpo._ranks import RankPusher, rank_record, write_rank_record
from apps.grpo._report import Curve, GRPOSummary, save_run
from apps.grpo._settings import DEFAULT_CONTEXT, MODEL_SPEC, PROG, GRPOSettings
from apps.grpo._torchrl_loss import TorchRLGRPO
from common.llm import GenerationSettings, build_policy, build_task, build_tokenizer
from learner_client import GrpcLLMCollector, LocalFleet

__all__ = ["MODEL_SPEC", "train"]

# The held-out problems are drawn with their own seed, apart from the actors' draws.
_EVAL_SEED_OFFSET = 10_007
# Accuracies travel between ranks as integers (the all-reduce of the agreed versions).
_ACCURACY_SCALE = 10**9
# Problems drawn to size the context, and the tokens a task's reply may add per turn.
_CONTEXT_DRAWS = 256
_REPLY_TOKENS = 32


def train(settings: GRPOSettings) -> GRPOSummary:
    """Train a language model with GRPO against a local LLM fleet and write the outputs.

    Under torchrun (``--nproc-per-node N``) this is one rank: it starts and owns its share
    of the fleet, updates through DDP and pushes under the agreed version (:mod:`._ranks`).

    Args:
        settings: The run's settings.

    Returns:
        The summary also written to ``summary.json`` (by rank 0).
    """
    seed_everything(settings.seed)  # the same on every rank (DDP starts from rank 0's)
    settings = fit_context(settings)
    model, tokenizer = build_policy(MODEL_SPEC, **settings.model_kwargs)
    if settings.init_std > 0:
        _init_weights(model, settings.init_std)
    if settings.embedding_std > 0:
        _init_embeddings(model, settings.embedding_std)
    task = build_task(settings.task, **settings.task_kwargs_dict)
    problems = held_out_problems(task, settings.eval_problems, settings.seed + _EVAL_SEED_OFFSET)
    evaluator = Evaluator(task, problems, tokenizer, settings.max_new_tokens)
    generation = GenerationSettings(
        max_new_tokens=settings.max_new_tokens, temperature=settings.sampling_temperature
    )
    with DataParallel(settings.learner_device) as ranks:
        model.to(ranks.device)  # the actors' copies stay theirs; pushes read from here
        return _run(settings, ranks, model, tokenizer, evaluator, generation)


def _run(
    settings: GRPOSettings,
    ranks: DataParallel,
    model: nn.Module,
    tokenizer: Any,
    evaluator: Evaluator,
    generation: GenerationSettings,
) -> GRPOSummary:
    config = GRPOConfig(
        **{f.name: getattr(settings, f.name) for f in dataclasses.fields(GRPOConfig)}
    )
    torchrl_update = _torchrl_update(settings, model, tokenizer, evaluator.task, config)
    trained = ranks.wrap(model)  # DDP on several ranks: the same weights on every rank
    learner = GRPOLearner(trained, generation, config)
    curve = Curve()
    evaluate = ranks.rank == 0  # rank 0 shows progress and writes the outputs
    vocab_size = int(cast(Any, model).get_input_embeddings().num_embeddings)  # ids it reads

    token = learner_token()  # its actors inherit it: the collector must send it too
    with contextlib.ExitStack() as stack:
        fleet = stack.enter_context(_local_fleet(settings, ranks, token))
        addresses = ranks.gather_strings(fleet.addresses)  # every rank reaches every actor
        collector = stack.enter_context(
            _collector(settings, addresses, generation, torchrl_update, ranks, vocab_size, token)
        )
        progress = stack.enter_context(
            contextlib.closing(
                Progress(settings.max_steps, enabled=settings.progress and evaluate, unit="step")
            )
        )
        pusher = RankPusher(collector, ranks, settings.shard_pushes, collector.model_id)
        updates = _Updates(settings, ranks, model, evaluator, collector, pusher, curve, progress)
        updates.run(learner, torchrl_update)
        final = collector.stats()
        record = rank_record(collector, pusher, model) if ranks.active else None

    summary = GRPOSummary.from_run(
        settings,
        curve,
        final,
        updates.wall,
        version=pusher.version,
        interrupted=updates.interrupted,
    )
    out_dir = pathlib.Path(settings.out_dir)
    if record is not None:
        write_rank_record(out_dir, record)
    if evaluate:  # rank 0 writes the outputs
        save_run(out_dir, model, summary, dataclasses.asdict(settings), curve)
    if updates.interrupted:  # exit 130, the outputs of the updates made written
        raise KeyboardInterrupt(f"outputs of {summary.steps} updates in {out_dir}")
    return summary


@dataclasses.dataclass
class _Updates:
    """The update loop: an update per batch, its push, an evaluation every ``eval_every``."""

    settings: GRPOSettings
    ranks: DataParallel
    model: nn.Module
    evaluator: Evaluator
    collector: GrpcLLMCollector
    pusher: RankPusher
    curve: Curve
    progress: Progress
    start: float = dataclasses.field(default_factory=time.monotonic)
    wall: float = 0.0
    interrupted: bool = False

    def run(self, learner: GRPOLearner, torchrl_update: TorchRLGRPO | None) -> None:
        """Push, then update until a budget or the target; a signal stops between updates.

        SIGINT or SIGTERM sets ``interrupted``: the weights are the last the actors took,
        and their accuracy is the last evaluated (no evaluation after a signal).
        """
        model, ranks, curve = self.model, self.ranks, self.curve
        self.pusher.push(model)  # the actors sample from the learner's policy
        curve.add(0, _shared_accuracy(self.evaluator, model, ranks), None, 0.0)

        def update(numbered: tuple[int, Any]) -> bool:
            step, batch = numbered  # batch is None when the collector fills torchrl's buffer
            stats = torchrl_update.update() if torchrl_update else learner.update(batch)
            return self._step(step, batch, stats)

        try:
            with SignalsHeld(PROG) as signals:
                ranks.run_together(enumerate(self.collector, start=1), update, signals)
        except KeyboardInterrupt:
            self.interrupted = True
        if not self.interrupted and curve.accuracies[-1] is None:  # stopped on time
            with ranks.collective_after_stop():
                curve.accuracies[-1] = _shared_accuracy(self.evaluator, model, ranks)
        self.wall = time.monotonic() - self.start

    def _step(self, step: int, batch: Any, stats: dict[str, float]) -> bool:
        """Push the updated weights, evaluate when due, record; whether this rank is done.

        Every rank stops together (:meth:`DataParallel.run_together`): one leaving alone would
        hang DDP's next all-reduce.
        """
        settings, model, ranks = self.settings, self.model, self.ranks
        reward = _mean_reward(batch, stats)
        self.pusher.push(model)
        collector_stats = self.collector.stats()
        accuracy = None
        if step % settings.eval_every == 0 or step == settings.max_steps:
            accuracy = _shared_accuracy(self.evaluator, model, ranks)
        elapsed = time.monotonic() - self.start
        self.curve.add(step, accuracy, reward, elapsed, stats, collector_stats)
        if ranks.rank == 0:  # one progress line a step, not one per rank
            self.progress.update(step, _fields(self.curve, collector_stats))
        return _finished(settings, self.curve, step, time.monotonic() - self.start)


def _torchrl_update(
    settings: GRPOSettings, model: nn.Module, tokenizer: Any, task: Any, config: GRPOConfig
) -> TorchRLGRPO | None:
    """``--loss torchrl``'s update, its buffer holding the most turns one iteration brings.

    An actor's batch of whole dialogs ends at the first step reaching its share: up to
    every one of its slots finishing a dialog of the task's ``max_turns`` at that step.
    """
    if settings.loss != "torchrl":
        return None
    turns = settings.prompts_per_step * settings.group_size
    capacity = turns + settings.num_actors * settings.slots_per_actor * task.max_turns
    return TorchRLGRPO(model, tokenizer, settings.group_size, capacity, config)


def _shared_accuracy(evaluator: Evaluator, model: nn.Module, ranks: DataParallel) -> float:
    """Rank 0's greedy accuracy, given to every rank (the weights are the same on all)."""
    if not ranks.active:
        return evaluator.accuracy(model)
    mine = evaluator.accuracy(model) if ranks.rank == 0 else -1.0
    return ranks.agreed_max(round(mine * _ACCURACY_SCALE)) / _ACCURACY_SCALE


def fit_context(settings: GRPOSettings) -> GRPOSettings:
    """``settings`` with a model context that holds the task's dialogs (``--max-positions 0``).

    The longest first prompt of 256 drawn problems, plus each turn's answer and a reply of
    up to 32 tokens, rounded up to 64; 512 (the tiny model's default) at least. A prompt
    past the context ends its dialog truncated with an empty answer: a run would train on
    nothing (countdown's prompts pass 512 tokens).
    """
    if settings.max_positions:
        return settings
    task = build_task(settings.task, **settings.task_kwargs_dict)
    tokenizer = build_tokenizer(settings.model_vocab)
    rng = random.Random(settings.seed)
    longest = max(len(prompt_ids(tokenizer, task.sample(rng))) for _ in range(_CONTEXT_DRAWS))
    need = longest + task.max_turns * (settings.max_new_tokens + _REPLY_TOKENS)
    return dataclasses.replace(settings, max_positions=max(DEFAULT_CONTEXT, -(-need // 64) * 64))


def _local_fleet(settings: GRPOSettings, ranks: DataParallel, token: str | None) -> LocalFleet:
    return LocalFleet(
        settings.actors_per_rank,
        num_envs=settings.slots_per_actor,
        kind="llm",
        task=settings.task,
        task_kwargs=settings.task_kwargs_dict,
        policy=MODEL_SPEC,
        policy_kwargs=settings.model_kwargs,
        seed=settings.seed,
        worker_ids=ranks.worker_ids(settings.num_actors),
        extra_args=["--engine", settings.engine],
        # a vLLM engine takes tens of seconds to start on a loaded CPU
        start_timeout=300.0 if settings.engine == "vllm" else 60.0,
        token=token,
    )


def _collector(
    settings: GRPOSettings,
    addresses: list[str],
    generation: GenerationSettings,
    torchrl_update: TorchRLGRPO | None,
    ranks: DataParallel,
    vocab_size: int,
    token: str | None,
) -> GrpcLLMCollector:
    turns = settings.prompts_per_step * settings.group_size
    return GrpcLLMCollector(
        addresses,
        dialog_turns_per_batch=turns,
        # Endless: the loop stops every rank together on its step count (a batch of whole
        # multi-turn dialogs holds more turns than asked, so a turn budget would end early
        # and on one rank before another).
        total_dialog_turns=-1,
        yield_completed_trajectories=True,
        sync=settings.sync,
        group_size=settings.group_size,
        generation=dataclasses.asdict(generation),
        layout="torchrl" if torchrl_update else "padded",
        replay_buffer=torchrl_update.replay_buffer if torchrl_update else None,
        vocab_size=vocab_size,
        rank=ranks.rank,
        world_size=ranks.world_size,
        learner_id=ranks.learner_id,
        token=token,
    )


def _init_weights(model: nn.Module, std: float) -> None:
    """Redraw every weight matrix and embedding from N(0, std) and zero the biases.

    The tiny models are built with a spread of 0.2, so large that their first answers
    are peaked on arbitrary tokens and training plateaus; 0.02 (Hugging Face's usual)
    is so small that attention starts uniform over the ChatML prompt and does not
    find the operands for a long while. 0.1 learns one-digit sums fastest
    (``docs/grpo.md``). The norms keep their weights of 1.
    """
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, nn.Linear | nn.Embedding):
                module.weight.normal_(0.0, std)
                bias = getattr(module, "bias", None)
                if bias is not None:
                    bias.zero_()


def _init_embeddings(model: nn.Module, std: float) -> None:
    """Draw the token embeddings (tied with the output layer) from N(0, std).

    Small embeddings make the first answers near-uniform over the vocabulary, so the
    right one gets sampled; the other weights keep their spread.
    """
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, nn.Embedding):
                module.weight.normal_(0.0, std)


def _mean_reward(batch: Any, stats: dict[str, float]) -> float:
    if batch is not None:
        return float(batch["next", "reward"].float().mean())
    return stats.get("reward", 0.0)


def _finished(settings: GRPOSettings, curve: Curve, step: int, elapsed: float) -> bool:
    if curve.reached(settings.target_accuracy) or step >= settings.max_steps:
        return True
    return settings.max_seconds > 0 and elapsed >= settings.max_seconds


def _fields(curve: Curve, stats: dict[str, Any]) -> dict[str, str]:
    return {
        "acc": f"{curve.last_accuracy:.2f}",
        "reward": f"{curve.rewards[-1] or 0.0:.2f}",
        "tok/s": f"{stats.get('tokens_per_s', 0.0):.0f}",
        # Pushes between the weights that generated the last batch and the learner's.
        "lag": str(stats.get("policy_lag", "n/a")),
    }
