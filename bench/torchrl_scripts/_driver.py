"""Run a TorchRL script as ``__main__`` (``python -m bench.torchrl_scripts._driver SCRIPT ...``).

Two things differ from ``python SCRIPT ...``, alike for the original and the port, both in
TorchRL's CSV logger (the runs' logger, read back for the final return): it records the
mean of a scalar given as several values (``sac.py`` logs every episode's reward of a batch
as one tensor, which the wandb logger it defaults to takes and the CSV logger refuses),
and it records no videos (``mappo_ippo.py`` logs one per evaluation, which the CSV logger
would encode with torchcodec, not a dependency here). With ``RLFLEET_SEED`` set, torch,
numpy and random are seeded with it first, alike on both sides. The seconds the script's
loop waits on its collector for batches (``next`` of TorchRL's collectors or of
``GrpcCollector``, the same measure on both sides) are written to ``collection.json``.
"""

from __future__ import annotations

import json
import os
import pathlib
import runpy
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

#: Where the waits on the collector are written, in the run's folder.
COLLECTION_FILE = "collection.json"
#: ``first_batch_s``: the first batch's wait alone (on a fleet, the actors' start-up with it).
_waited = {"collection_s": 0.0, "first_batch_s": 0.0, "batches": 0}


def _mean_of_many() -> None:
    """Let TorchRL's CSV logger take a tensor or list of values (it records their mean).

    A None is not recorded: scripts log tqdm's ``format_dict["rate"]``, which is None until
    tqdm's first refresh (a first batch within its 0.1 s ``mininterval``); the CSV
    logger's ``float(None)`` would end the run on either side.
    """
    import torch
    from torchrl.record.loggers import csv

    add_scalar = csv.CSVExperiment.add_scalar

    def add(self: Any, name: str, value: Any, global_step: int | None = None) -> None:
        if value is None:
            return
        if isinstance(value, list | tuple) or (torch.is_tensor(value) and value.numel() != 1):
            value = torch.as_tensor(value, dtype=torch.float64).mean().item()
        add_scalar(self, name, value, global_step)

    csv.CSVExperiment.add_scalar = add
    csv.CSVLogger.log_video = lambda self, *args, **kwargs: None


def _timed(iterate: Callable[[Any], Iterator[Any]]) -> Callable[[Any], Iterator[Any]]:
    """``__iter__`` that adds the time spent in each ``next`` of ``iterate`` to ``_waited``."""

    def __iter__(self: Any) -> Iterator[Any]:
        inner = iterate(self)
        try:
            while True:
                start = time.perf_counter()
                try:
                    item = next(inner)
                except StopIteration:
                    return
                finally:
                    waited = time.perf_counter() - start
                    _waited["collection_s"] += waited
                    if not _waited["batches"]:
                        _waited["first_batch_s"] = waited
                _waited["batches"] += 1
                yield item
        finally:
            inner.close()  # a script that breaks out of its loop closes the collector's too

    return __iter__


def _time_collection() -> None:
    """Time the waits for batches of TorchRL's collectors and of ``GrpcCollector``."""
    from torchrl.collectors._base import BaseCollector

    from learner_client import GrpcCollector

    for cls in (BaseCollector, GrpcCollector):
        cls.__iter__ = _timed(cls.__iter__)  # type: ignore[method-assign]


def _seed() -> None:
    """Seed torch, numpy and random with ``RLFLEET_SEED`` where it is set.

    Most of TorchRL's scripts seed nothing, so every run starts from torch's default seed:
    a comparison's run ``i`` sets it to ``i`` on both sides, alike, before the script runs.
    """
    seed = os.environ.get("RLFLEET_SEED", "")
    if seed:
        import random

        import numpy as np
        import torch

        random.seed(int(seed))
        np.random.seed(int(seed))
        torch.manual_seed(int(seed))


def main() -> None:
    """Run ``sys.argv[1]`` with the rest of the arguments as its own.

    With ``RLFLEET_RESULT`` set (a tutorial, which logs nothing), that expression over the
    script's globals is its final return, written as the scalar ``result``.
    """
    script = pathlib.Path(sys.argv[1]).resolve()
    sys.argv = [str(script), *sys.argv[2:]]
    sys.path.insert(0, str(script.parent))
    _mean_of_many()
    _seed()
    _time_collection()
    try:
        found = runpy.run_path(str(script), run_name="__main__")
    finally:
        pathlib.Path(COLLECTION_FILE).write_text(json.dumps(_waited))
    expression = os.environ.get("RLFLEET_RESULT", "")
    if expression:
        value = float(eval(expression, dict(found)))  # our own expression (a spec's metric)
        out = pathlib.Path("scalars")
        out.mkdir(exist_ok=True)
        (out / "result.csv").write_text(f"0,{value}\n")


if __name__ == "__main__":
    main()
