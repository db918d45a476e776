"""Run a TorchRL script as ``__main__`` (``python -m bench.torchrl_scripts._driver SCRIPT ...``).

Two things differ from ``python SCRIPT ...``, alike for the original and the port, both in
TorchRL's CSV logger (the runs' logger, read back for the final return): it records the
mean of a scalar given as several values (``sac.py`` logs every episode's reward of a batch
as one tensor, which the wandb logger it defaults to takes and the CSV logger refuses),
and it records no videos (``mappo_ippo.py`` logs one per evaluation, which the CSV logger
would encode with torchcodec, not a dependency here).
"""

from __future__ import annotations

import pathlib
import runpy
import sys
from typing import Any


def _mean_of_many() -> None:
    """Let TorchRL's CSV logger take a tensor or list of values (it records their mean)."""
    import torch
    from torchrl.record.loggers import csv

    add_scalar = csv.CSVExperiment.add_scalar

    def add(self: Any, name: str, value: Any, global_step: int | None = None) -> None:
        if isinstance(value, list | tuple) or (torch.is_tensor(value) and value.numel() != 1):
            value = torch.as_tensor(value, dtype=torch.float64).mean().item()
        add_scalar(self, name, value, global_step)

    csv.CSVExperiment.add_scalar = add
    csv.CSVLogger.log_video = lambda self, *args, **kwargs: None


def main() -> None:
    """Run ``sys.argv[1]`` with the rest of the arguments as its own."""
    script = pathlib.Path(sys.argv[1]).resolve()
    sys.argv = [str(script), *sys.argv[2:]]
    sys.path.insert(0, str(script.parent))
    _mean_of_many()
    runpy.run_path(str(script), run_name="__main__")


if __name__ == "__main__":
    main()
