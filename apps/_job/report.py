"""What every reference learner shows and leaves behind: a progress bar, weights, summary, plot.

Progress is a tqdm bar on a terminal when tqdm is installed, and a log line per
update otherwise. At the end a run writes, under its output directory,
``policy.safetensors`` (the model's state dict through
:func:`common.weights.encode_weights`), ``summary.json`` and ``learning_curve.png``;
matplotlib and tqdm come with the optional ``train`` extra, and their absence only
costs the picture or the bar. Each file is replaced whole (:func:`write_whole`): a run
killed or out of disk while writing leaves the previous run's file as it was.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import pathlib
import sys
import time
import uuid
from collections.abc import Mapping
from typing import Any, TextIO

from torch import nn

from apps._job.cli import say
from common.weights import encode_weights

__all__ = [
    "CURVE_FILE",
    "POLICY_FILE",
    "SUMMARY_FILE",
    "Progress",
    "new_plot",
    "save_plot",
    "save_weights_and_summary",
    "write_whole",
]

POLICY_FILE = "policy.safetensors"
SUMMARY_FILE = "summary.json"
CURVE_FILE = "learning_curve.png"


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
            say(message, self._stream)

    def close(self) -> None:
        """Close the bar (idempotent)."""
        if self._bar is not None:
            self._bar.close()
            self._bar = None


def new_plot() -> tuple[Any, Any] | None:
    """A 7 x 4 inch figure and its axes, drawn off-screen (Agg).

    Returns:
        ``(figure, axes)``; None if matplotlib is missing (a message says so).
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
        return None
    return plt.subplots(figsize=(7, 4))


def save_plot(figure: Any, axes: Any, path: pathlib.Path, title: str) -> None:
    """Title the axes, put the legend at the lower right, write a 100-dpi PNG, close."""
    import matplotlib.pyplot as plt

    axes.set_title(title)
    axes.legend(loc="lower right")
    figure.tight_layout()
    png = io.BytesIO()
    try:
        figure.savefig(png, format="png", dpi=100)
    finally:
        plt.close(figure)
    write_whole(path, png.getvalue())


def save_weights_and_summary(
    out_dir: pathlib.Path,
    model: nn.Module,
    metadata: Mapping[str, str],
    record: Mapping[str, Any],
) -> None:
    """Write ``model``'s weights and the run's ``record`` as JSON under ``out_dir``.

    Args:
        out_dir: The output directory (created if missing).
        model: The trained model; saved as its safetensors state dict.
        metadata: String metadata stored in the safetensors header.
        record: The summary and whatever goes beside it (settings, curve).
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    write_whole(out_dir / POLICY_FILE, encode_weights(model, metadata=metadata))
    summary = json.dumps(record, indent=2, default=list) + "\n"
    write_whole(out_dir / SUMMARY_FILE, summary.encode())


def write_whole(path: pathlib.Path, data: bytes | memoryview) -> None:
    """Replace ``path`` with ``data`` in one step: it holds the old bytes or the new, whole.

    The bytes go to a new file beside it, flushed to disk, then renamed over it: a write
    that fails (a full disk), a signal or a kill meanwhile leaves the file as it was
    (a previous run's outputs in the same ``--out``) and no temporary file behind
    (but after a kill). Created with the umask's permissions, as ``open()`` would.
    """
    temp = path.with_name(f".{path.name}.{os.getpid()}-{uuid.uuid4().hex[:8]}.tmp")
    try:
        fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        with os.fdopen(fd, "wb") as file:
            file.write(data)
            file.flush()
            os.fsync(file.fileno())
        os.replace(temp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            temp.unlink()
        raise
