"""What a PPO run leaves behind: its summary, and the learning curve of episode returns.

Under the output directory (through :mod:`apps._job.report`):
``policy.safetensors`` (the policy's state dict), ``summary.json`` (the outcome and
the settings) and ``learning_curve.png`` (episode returns against frames).
"""

from __future__ import annotations

import dataclasses
import pathlib
from collections.abc import Mapping

from torch import nn

from apps._job.report import CURVE_FILE, new_plot, save_plot, save_weights_and_summary

__all__ = ["TrainSummary", "plot_learning_curve", "save_run"]


@dataclasses.dataclass(frozen=True)
class TrainSummary:
    """The outcome of one run, as written to ``summary.json``.

    Attributes:
        env: Gymnasium id trained on.
        sync: Whether collection was sync.
        seed: The learner's seed.
        frames: Frames trained on.
        batches: Batches (one PPO update each).
        episodes: Finished episodes seen.
        wall_time_s: Seconds from the first collection request to the last update.
        fps: ``frames / wall_time_s``.
        final_return: Mean return of the last 20 finished episodes (None if none finished).
        target_return: The target in force (None: train for the whole budget).
        reached_target: Whether ``final_return`` reached the target.
        policy_version: The actors' policy version at the end (with ``--actors``, counted on
            from the highest version the fleet held).
        out_dir: Where the outputs were written.
        ranks: Learner ranks that trained together (``frames`` counts all of theirs;
            ``episodes`` are this rank's own; ``final_return`` is the mean over ranks).
        rank: The rank this summary is from (rank 0 writes the outputs).
        interrupted: SIGINT or SIGTERM stopped the run between two updates (the outputs
            are those of the updates made; the job exits 130).
    """

    env: str
    sync: bool
    seed: int
    frames: int
    batches: int
    episodes: int
    wall_time_s: float
    fps: float
    final_return: float | None
    target_return: float | None
    reached_target: bool
    policy_version: int
    out_dir: str
    ranks: int = 1
    rank: int = 0
    interrupted: bool = False

    def to_text(self) -> str:
        """A short human-readable summary."""
        ret = "n/a" if self.final_return is None else f"{self.final_return:.1f}"
        if self.target_return is None:
            target = "no target"
        else:
            verdict = "reached" if self.reached_target else "not reached"
            target = f"target {self.target_return:g} {verdict}"
        mode = "sync" if self.sync else "async"
        who = f"rank {self.rank} of {self.ranks}: " if self.ranks > 1 else ""
        outputs = f"outputs in {self.out_dir}" if self.rank == 0 else "outputs by rank 0"
        return (
            f"{who}{self.env} ({mode}, seed {self.seed}): "
            f"{self.frames} frames in {self.wall_time_s:.1f}s ({self.fps:.0f} frames/s), "
            f"{self.episodes} episodes, final return {ret}, {target}; {outputs}"
        )


def plot_learning_curve(
    path: pathlib.Path,
    end_frames: list[int],
    returns: list[float],
    *,
    window: int,
    target: float | None,
    title: str,
) -> bool:
    """Draw episode returns against frames, with their running mean, into a PNG.

    Args:
        path: The PNG to write.
        end_frames: Frames collected when each episode was reported.
        returns: The episode returns.
        window: Episodes in the running mean.
        target: A horizontal target line, if any.
        title: The plot title.

    Returns:
        True if written; False if matplotlib is missing (a message says so).
    """
    plot = new_plot()
    if plot is None:
        return False
    fig, ax = plot
    running = [
        sum(returns[max(0, i + 1 - window) : i + 1]) / (i + 1 - max(0, i + 1 - window))
        for i in range(len(returns))
    ]
    ax.plot(end_frames, returns, ".", alpha=0.3, label="episode return")
    ax.plot(end_frames, running, "-", label=f"mean of last {window}")
    if target is not None:
        ax.axhline(target, color="grey", linestyle="--", label=f"target {target:g}")
    ax.set_xlabel("frames")
    ax.set_ylabel("return")
    save_plot(fig, ax, path, title)
    return True


def save_run(
    out_dir: pathlib.Path,
    policy: nn.Module,
    summary: TrainSummary,
    settings: Mapping[str, object],
    curve: tuple[list[int], list[float]],
    window: int,
) -> None:
    """Write the policy weights, ``summary.json`` and the learning curve under ``out_dir``.

    Args:
        out_dir: The output directory (created if missing).
        policy: The trained policy; saved as its safetensors state dict.
        summary: The run's outcome.
        settings: The settings of the run, stored beside the summary.
        curve: ``(end_frames, returns)`` of the finished episodes.
        window: Episodes in the curve's running mean.
    """
    metadata = {
        "env": summary.env,
        "frames": str(summary.frames),
        "policy_version": str(summary.policy_version),
    }
    record = {**dataclasses.asdict(summary), "settings": dict(settings)}
    save_weights_and_summary(out_dir, policy, metadata, record)
    plot_learning_curve(
        out_dir / CURVE_FILE,
        *curve,
        window=window,
        target=summary.target_return,
        title=f"PPO on {summary.env}",
    )
