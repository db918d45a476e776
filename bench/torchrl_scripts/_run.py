"""Lay out a TorchRL script, as TorchRL wrote it or ported, in a folder, and run it there.

The originals are read where TorchRL ships them, never copied into this repository: the
``sota-implementations/`` of the installed torchrl wheel (the test extra pins 0.14.1), and
for the tutorials and the scripts of TorchRL main that the wheel lacks, a pytorch/rl
checkout named by ``RLFLEET_TORCHRL_SOURCE``. A run is a
subprocess (``python script.py overrides...``) in its own folder, with the script's folder
and this repository on ``PYTHONPATH`` (the port's actors import the script's helpers and
``bench.torchrl_scripts.fleets``); the final return is the last value of the script's own
logged scalar, from TorchRL's CSV logger. Every process of a run (the script, its actors,
TorchRL's env workers) uses one torch thread.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.metadata
import json
import os
import pathlib
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence

from bench.torchrl_scripts._driver import COLLECTION_FILE
from bench.torchrl_scripts._port import port_source
from bench.torchrl_scripts._specs import ScriptSpec

__all__ = [
    "RunResult",
    "layout",
    "missing_needs",
    "original",
    "originals_root",
    "run_script",
]

ROOT = pathlib.Path(__file__).resolve().parents[2]
CONFIGS = pathlib.Path(__file__).resolve().parent / "configs"
#: Environment variable naming a pytorch/rl checkout (tutorials, main's scripts not in the wheel).
SOURCE_VAR = "RLFLEET_TORCHRL_SOURCE"
_TAIL = 4000


@dataclasses.dataclass(frozen=True)
class RunResult:
    """One run of a script: its final return, frames, wall time and time waiting on batches."""

    script: str
    variant: str
    frames: int
    final_return: float | None
    wall_s: float
    returncode: int
    log_tail: str
    collection_s: float | None = None
    first_batch_s: float | None = None


def missing_needs(spec: ScriptSpec) -> str:
    """Why ``spec`` cannot run here (a module it needs fails to import), or ``""``."""
    for module in spec.needs:
        try:
            importlib.import_module(module)
        except Exception as exc:  # torchvision beside another torch raises RuntimeError
            return f"{spec.script} needs {module}, which does not import here: {exc}"
    return ""


def originals_root(spec: ScriptSpec) -> pathlib.Path | None:
    """The folder holding ``spec``'s original files, or None where they are not here."""
    if spec.tutorial or spec.checkout:
        source = os.environ.get(SOURCE_VAR, "")
        folder = pathlib.Path(source) / spec.folder if source else None
    else:
        wheel = importlib.metadata.distribution("torchrl")
        folder = pathlib.Path(str(wheel.locate_file(spec.folder)))
    return folder if folder is not None and (folder / spec.script).is_file() else None


def original(spec: ScriptSpec, name: str) -> str:
    """The text of ``spec``'s file ``name`` as TorchRL ships it.

    Raises:
        FileNotFoundError: The originals are not on this machine.
    """
    root = originals_root(spec)
    if root is None:
        raise FileNotFoundError(f"{spec.folder}/{spec.script}: not installed here")
    return (root / name).read_text()


def layout(spec: ScriptSpec, variant: str, dest: pathlib.Path, *, actors: int = 0) -> pathlib.Path:
    """Copy ``spec``'s script, helpers and config into ``dest``; port it for ``"fleet"``.

    The port's fleet has ``actors`` actors (``spec.actors`` when 0). Returns the script's
    path in ``dest``.
    """
    if variant not in ("torchrl", "fleet"):
        raise ValueError(f"variant must be 'torchrl' or 'fleet', got {variant!r}")
    root = originals_root(spec)
    if root is None:
        raise FileNotFoundError(f"{spec.folder}/{spec.script}: not installed here")
    dest.mkdir(parents=True, exist_ok=True)
    for name in (spec.script, *spec.helpers):
        source = root / name
        if source.is_dir():
            ignore = shutil.ignore_patterns("__pycache__")
            shutil.copytree(source, dest / name, ignore=ignore, dirs_exist_ok=True)
        else:
            shutil.copyfile(source, dest / name)
    if spec.config:
        config = CONFIGS / spec.name / f"{spec.config}.yaml"
        shutil.copyfile(config, dest / config.name)
    if variant == "fleet":
        target = dest / spec.collector_file
        fleet = spec.fleet_args(actors)
        target.write_text(
            port_source(original(spec, spec.collector_file), fleet, spec.collector_call)
        )
    return dest / spec.script


def _edit(script: pathlib.Path, edits: Sequence[str]) -> None:
    """Apply a tutorial's budget edits (``"OLD=>NEW"``, each found exactly once)."""
    text = script.read_text()
    for edit in edits:
        old, new = edit.split("=>", 1)
        if text.count(old) != 1:
            raise ValueError(f"{script.name}: {old!r} occurs {text.count(old)} times, not once")
        text = text.replace(old, new)
    script.write_text(text)


def run_script(
    spec: ScriptSpec,
    variant: str,
    overrides: Sequence[str],
    dest: pathlib.Path,
    *,
    timeout: float,
    frames: int = 0,
    actors: int = 0,
    seed: int | None = None,
) -> RunResult:
    """Run ``spec`` (``"torchrl"`` or ``"fleet"``) in ``dest`` with hydra ``overrides``.

    A port's fleet has ``actors`` actors (``spec.actors`` when 0); ``seed`` seeds torch,
    numpy and random before the script runs (``_driver``), None leaves them unseeded.
    """
    script = layout(spec, variant, dest, actors=actors)
    env = dict(os.environ)
    if spec.tutorial:  # no hydra: its budget is its constants, its return an expression
        _edit(script, overrides)
        overrides = ()
        env["RLFLEET_RESULT"] = spec.metric
    env["PYTHONPATH"] = os.pathsep.join([str(dest), str(ROOT), env.get("PYTHONPATH", "")])
    env.update(MPLBACKEND="Agg", SDL_VIDEODRIVER="dummy", HYDRA_FULL_ERROR="1")
    env.update(WANDB_MODE="disabled", PYTHONWARNINGS="ignore")
    env.setdefault("MUJOCO_GL", "egl")  # redq's evaluation env renders MuJoCo, with no screen
    env.pop("RLFLEET_SEED", None)
    if seed is not None:
        env["RLFLEET_SEED"] = str(seed)
    # One torch thread per process, on both sides: a learner and its actors (or TorchRL's
    # workers) sharing a few cores run small networks far slower with a pool each.
    env.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    start = time.monotonic()
    with open(dest / "run.log", "wb") as log:
        done = subprocess.run(
            [sys.executable, "-m", "bench.torchrl_scripts._driver", script.name, *overrides],
            cwd=dest,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            timeout=timeout,
            check=False,
        )
    wall = time.monotonic() - start
    tail = (dest / "run.log").read_bytes()[-_TAIL:].decode(errors="replace")
    final = last_scalar(dest, "result" if spec.tutorial else spec.metric)
    collection, first = _waits(dest)
    return RunResult(
        spec.name, variant, frames, final, wall, done.returncode, tail, collection, first
    )


def _waits(dest: pathlib.Path) -> tuple[float | None, float | None]:
    """The seconds the run's script waited on its collector, then on its first batch alone.

    Both as ``_driver`` recorded them; None where unknown.
    """
    path = dest / COLLECTION_FILE
    if not path.is_file():
        return None, None
    waited = json.loads(path.read_text())
    return float(waited["collection_s"]), float(waited["first_batch_s"])


def last_scalar(dest: pathlib.Path, metric: str) -> float | None:
    """The last value TorchRL's CSV logger wrote for ``metric`` under ``dest``.

    A ``metric`` of the form ``FILE.json:KEY`` is the last item of the list ``KEY`` of the
    JSON file the script wrote (``dreamer_v3.py``'s ``logger.metrics_json``).
    """
    if ".json:" in metric:
        name, key = metric.split(":", 1)
        written = sorted(dest.rglob(name))
        values = json.loads(written[-1].read_text()).get(key) if written else None
        return float(values[-1]) if values else None
    found = sorted(dest.rglob(f"scalars/{metric}.csv"))
    if not found:
        return None
    lines = [line for line in found[-1].read_text().splitlines() if line.strip()]
    return float(lines[-1].split(",")[1]) if lines else None
