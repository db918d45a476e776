"""TorchRL's collector tutorials, read from a pytorch/rl checkout (``RLFLEET_TORCHRL_SOURCE``)."""

from __future__ import annotations

from bench.torchrl_scripts._specs.spec import FLEETS, ScriptSpec

__all__ = ["SPECS"]


_TUTORIALS = "tutorials/sphinx-tutorials"


def _stats_kwargs(index: int) -> str:
    """Env kwargs carrying the learner's ``ObservationNorm`` (``env.transform[index]``)."""
    norm = f"env.transform[{index}]"
    return f'{{"loc": {norm}.loc.tolist(), "scale": {norm}.scale.tolist()}}'


def _tutorial_fleet(name: str, stats: int) -> str:
    return (
        f'kind="torchrl", env_factory="{FLEETS}.{name}:make_env", '
        f'policy="{FLEETS}.{name}:make_policy", env_kwargs={_stats_kwargs(stats)}, '
        "num_envs=1, seed=0"
    )


_CODING_PPO = ScriptSpec(
    name="coding_ppo",
    folder=_TUTORIALS,
    script="coding_ppo.py",
    helpers=(),
    collector_file="coding_ppo.py",
    actors=1,
    fleet=_tutorial_fleet("coding_ppo", 0),
    config="",
    smoke=(
        "frames_per_batch = 1000=>frames_per_batch = 200",
        "total_frames = 10_000=>total_frames = 400",
        "num_epochs = 10  #=>num_epochs = 1  #",
        "init_stats(num_iter=1000,=>init_stats(num_iter=100,",
    ),
    # 21 batches: the tutorial evaluates every 10th, so the last one is evaluated.
    bench=("total_frames = 10_000=>total_frames = 21_000",),
    frames=21_000,
    metric='logs["eval reward (sum)"][-1]',
)

_DQN_RNN = ScriptSpec(
    name="dqn_with_rnn",
    folder=_TUTORIALS,
    script="dqn_with_rnn.py",
    helpers=(),
    collector_file="dqn_with_rnn.py",
    actors=1,
    fleet=_tutorial_fleet("dqn_with_rnn", 6),
    config="",
    smoke=("init_stats(1000,=>init_stats(100,",),
    # The tutorial's own budget: 200 frames, which it collects without training (it trains
    # once its replay buffer holds 1000 entries); what it stored is compared.
    bench=(),
    frames=200,
    metric="len(rb)",
    # Its Resize transform calls torchvision, which does not import beside torch's CPU
    # wheel that the project pins (no matching torchvision build on PyPI): it runs in the
    # venv of `make test-torchvision` (scripts/torchvision_venv.sh).
    needs=("torchvision",),
)

#: This family's scripts, in the order they run.
SPECS = (
    _CODING_PPO,
    _DQN_RNN,
)
