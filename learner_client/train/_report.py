"""What a training run shows and leaves behind: progress, summary, weights, learning curve.

Progress is a tqdm bar (frames, frames/s, recent return, policy lag) on a
terminal when tqdm is installed, and a log line every few batches otherwise. At
the end the run writes, under its output directory, ``policy.safetensors``
(the policy's state dict through :func:`common.weights.encode_weights`),
``summary.json`` and ``learning_curve.png``; matplotlib and tqdm come with the
optional ``train`` extra, and their absence only costs the picture or the bar.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
import sys
import time
from collections.abc import Mapping
from typing import Any, TextIO

from torch import nn

from common.weights import encode_weights

__all__ = ["Progress", "TrainSummary", "plot_learning_curve", "save_run"]

POLICY_FILE = "policy.safetensors"
SUMMARY_FILE = "summary.json"
CURVE_FILE = "learning_curve.png"


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
        policy_version: Weight pushes made (the actors' policy version at the end).
        out_dir: Where the outputs were written.
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

    def to_text(self) -> str:
        """A short human-readable summary."""
        ret = "n/a" if self.final_return is None else f"{self.final_return:.1f}"
        if self.target_return is None:
            target = "no target"
        else:
            verdict = "reached" if self.reached_target else "not reached"
            target = f"target {self.target_return:g} {verdict}"
        return (
            f"{self.env} ({'sync' if self.sync else 'async'}, seed {self.seed}): "
            f"{self.frames} frames in {self.wall_time_s:.1f}s ({self.fps:.0f} frames/s), "
            f"{self.episodes} episodes, final return {ret}, {target}; outputs in {self.out_dir}"
        )


class Progress:
    """A progress bar over the frame budget, or log lines when off, not a terminal or no tqdm.

    Args:
        total_frames: The frame budget (or of whatever ``unit`` counts).
        enabled: Whether to draw a tqdm bar when ``stream`` is a terminal.
        stream: Where the bar or the lines go.
        unit: What is counted (``"frame"``; ``"step"`` for updates).
    """

    def __init__(
        self,
        total_frames: int,
        *,
        enabled: bool = True,
        stream: TextIO | None = None,
        unit: str = "frame",
    ) -> None:
        self._unit = unit
        self._stream = stream or sys.stderr
        self._start = time.monotonic()
        self._frames = 0
        self._bar: Any = None
        # A bar in a log file is noise: only draw one on a terminal.
        if enabled and self._stream.isatty():
            try:
                from tqdm import tqdm
            except ImportError:
                self.write(
                    "tqdm is not installed (pip install 'rlfleet[train]'): "
                    "logging progress lines instead"
                )
            else:
                self._bar = tqdm(
                    total=total_frames,
                    unit=unit,
                    unit_scale=unit == "frame",
                    dynamic_ncols=True,
                    file=self._stream,
                )

    def update(self, frames: int, fields: Mapping[str, object]) -> None:
        """Advance to ``frames`` collected in total and show ``fields`` (e.g. return, lag)."""
        delta, self._frames = frames - self._frames, frames
        if self._bar is not None:
            self._bar.set_postfix(dict(fields), refresh=False)
            self._bar.update(delta)
            return
        rate = self._frames / max(time.monotonic() - self._start, 1e-9)
        parts = " ".join(f"{k}={v}" for k, v in fields.items())
        if self._unit == "frame":
            self.write(f"frames={self._frames} fps={rate:.0f} {parts}")
        else:
            self.write(f"{self._unit}s={self._frames} {parts}")

    def write(self, message: str) -> None:
        """Print a message without breaking the bar."""
        if self._bar is not None:
            self._bar.write(message, file=self._stream)
        else:
            print(message, file=self._stream, flush=True)

    def close(self) -> None:
        """Close the bar (idempotent)."""
        if self._bar is not None:
            self._bar.close()
            self._bar = None


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
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print(
            "matplotlib is not installed (pip install 'rlfleet[train]'): no learning curve",
            file=sys.stderr,
        )
        return False
    running = [
        sum(returns[max(0, i + 1 - window) : i + 1]) / (i + 1 - max(0, i + 1 - window))
        for i in range(len(returns))
    ]
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(end_frames, returns, ".", alpha=0.3, label="episode return")
    ax.plot(end_frames, running, "-", label=f"mean of last {window}")
    if target is not None:
        ax.axhline(target, color="grey", linestyle="--", label=f"target {target:g}")
    ax.set_xlabel("frames")
    ax.set_ylabel("return")
    ax.set_title(title)
    ax.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
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
    out_dir.mkdir(parents=True, exist_ok=True)
    metadata = {
        "env": summary.env,
        "frames": str(summary.frames),
        "policy_version": str(summary.policy_version),
    }
    (out_dir / POLICY_FILE).write_bytes(encode_weights(policy, metadata=metadata))
    record = {**dataclasses.asdict(summary), "settings": dict(settings)}
    (out_dir / SUMMARY_FILE).write_text(json.dumps(record, indent=2, default=list) + "\n")
    plot_learning_curve(
        out_dir / CURVE_FILE,
        *curve,
        window=window,
        target=summary.target_return,
        title=f"PPO on {summary.env}",
    )
