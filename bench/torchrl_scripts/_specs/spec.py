"""What a ported script is (:class:`ScriptSpec`) and the fleet its port builds.

Budgets are hydra overrides (tutorials: edits of their constants) applied alike to the
original and to the port: ``smoke`` is a few batches (the fast suite), ``bench`` the budget
of the comparison in ``bench/RESULTS.md``. ``metric`` is the logged scalar read as the
final return (its last value); a tutorial's is an expression over its globals.
"""

from __future__ import annotations

import dataclasses

__all__ = ["FLEETS", "ScriptSpec", "torchrl_fleet"]

FLEETS = "bench.torchrl_scripts.fleets"


@dataclasses.dataclass(frozen=True)
class ScriptSpec:
    """One TorchRL script and how it runs on a fleet.

    Attributes:
        name: Its name here (``dqn_cartpole``).
        folder: Its folder in TorchRL's repository (``sota-implementations/dqn``).
        script: The file that is run.
        helpers: Files and folders of the same folder that it imports.
        collector_file: The file whose ``Collector(...)`` call is ported (the script or
            the helper that builds its collector).
        fleet: Source text of the port's ``LocalFleet`` arguments after the count.
        actors: The fleet's actor count: as many envs as the script's collector steps,
            so one actor for a script with one env (each batch then has TorchRL's
            layout) and two sharing the envs of a script with several.
        config: Its hydra config name (``configs/<name>/<config>.yaml``); empty for a
            tutorial, which has none.
        smoke: Overrides of the fast-suite run.
        bench: Overrides of the comparison run.
        frames: Frames of the comparison run (0: none, the script is not compared).
        metric: The scalar read as the final return.
        threshold: The return at which the task counts as solved at this budget (None:
            none is claimed).
        needs: Modules the script imports that the test extra cannot provide.
        seed_key: The config key of the script's seed (empty: it seeds nothing); run ``i``
            of a comparison sets it to ``i`` on both sides, so seeded runs differ.
        checkout: Read from a pytorch/rl checkout, as the tutorials are: a script of
            TorchRL main that the torchrl wheel does not ship.
        collector_call: The call the port rewrites: ``Collector``, or the name a
            ``torchrl.trainers.helpers`` collector helper is called by (``_port.py``).
    """

    name: str
    folder: str
    script: str
    helpers: tuple[str, ...]
    collector_file: str
    fleet: str
    actors: int
    config: str
    smoke: tuple[str, ...]
    bench: tuple[str, ...]
    frames: int
    metric: str
    threshold: float | None = None
    needs: tuple[str, ...] = ()
    seed_key: str = ""
    checkout: bool = False
    collector_call: str = "Collector"

    def fleet_args(self, actors: int = 0) -> str:
        """The port's ``LocalFleet`` arguments, with ``actors`` actors (``self.actors`` if 0)."""
        return f"{actors or self.actors}, {self.fleet}"

    @property
    def compared(self) -> bool:
        """Whether it has a comparison budget (``frames`` 0: it runs in the smoke suite only)."""
        return self.frames > 0

    @property
    def tutorial(self) -> bool:
        """Whether it is one of TorchRL's tutorials (not shipped in the torchrl wheel)."""
        return not self.config


def torchrl_fleet(name: str, num_envs: str, seed: str, env_kwargs: str = "") -> str:
    """``LocalFleet`` arguments after the count: TorchRL-env actors on ``fleets.<name>``."""
    env_kwargs = env_kwargs or '{"cfg": cfg}'
    return (
        f'kind="torchrl", env_factory="{FLEETS}.{name}:make_env", '
        f'policy="{FLEETS}.{name}:make_policy", env_kwargs={env_kwargs}, '
        f'policy_kwargs={{"cfg": cfg}}, num_envs={num_envs}, seed={seed}'
    )
