"""TorchRL's Atari scripts (they need torchvision and ale-py: ``make test-torchvision``)."""

from __future__ import annotations

from bench.torchrl_scripts._specs.spec import ScriptSpec, torchrl_fleet

__all__ = ["SPECS"]


_DQN_ATARI = ScriptSpec(
    name="dqn_atari",
    folder="sota-implementations/dqn",
    script="dqn_atari.py",
    helpers=("utils_atari.py",),
    collector_file="dqn_atari.py",
    actors=1,
    fleet=torchrl_fleet("dqn_atari", "1", "0"),
    config="config_atari",
    # Frames are the script's (4 env steps each, its frame_skip): 2 batches of 200 steps.
    smoke=(
        "collector.total_frames=1600",
        "collector.frames_per_batch=800",
        "collector.init_random_frames=800",
        "buffer.buffer_size=2000",
        "loss.num_updates=2",
        "logger.test_interval=1000000",
    ),
    # Pong at 200,000 frames learns nothing on either side (TorchRL's budget is 40 M): what
    # is compared is that both run, and their wall and collection times.
    bench=(
        "collector.total_frames=200000",
        "collector.init_random_frames=20000",
        "buffer.buffer_size=50000",
        "logger.test_interval=200000",
        "logger.num_test_episodes=1",
    ),
    frames=200_000,
    metric="eval/reward",
    # Its Resize needs torchvision (the venv of `make test-torchvision`), Pong needs ale-py.
    needs=("torchvision", "ale_py"),
)


def _atari_actor_critic(name: str, folder: str, smoke_batch: str) -> ScriptSpec:
    """``ppo_atari.py`` or ``a2c_atari.py``: two actors share the script's ``env.num_envs``."""
    return ScriptSpec(
        name=name,
        folder=f"sota-implementations/{folder}",
        script=f"{name}.py",
        helpers=("utils_atari.py",),
        collector_file=f"{name}.py",
        actors=2,
        fleet=torchrl_fleet(
            "atari_actor_critic",
            "cfg.env.num_envs // 2",
            "0",
            env_kwargs='{"cfg": cfg, "num_envs": cfg.env.num_envs // 2}',
        ),
        config="config_atari",
        # Frames are the script's (4 env steps each): 2 batches of 2 envs, 1 epoch.
        smoke=(
            "env.num_envs=2",
            f"collector.frames_per_batch={smoke_batch}",
            f"collector.total_frames={2 * int(smoke_batch)}",
            "logger.test_interval=1000000000",
            *(("loss.ppo_epochs=1", "loss.mini_batch_size=64") if name == "ppo_atari" else ()),
        ),
        bench=(),  # TorchRL's 40 M frames are out of reach of two cores: not compared here
        frames=0,
        metric="train/reward",
        # Its Resize needs torchvision (the venv of `make test-torchvision`), Pong ale-py.
        needs=("torchvision", "ale_py"),
    )


_PPO_ATARI = _atari_actor_critic("ppo_atari", "ppo", "256")
_A2C_ATARI = _atari_actor_critic("a2c_atari", "a2c", "160")

_IMPALA = ScriptSpec(
    name="impala_single_node",
    folder="sota-implementations/impala",
    script="impala_single_node.py",
    helpers=("utils.py",),
    collector_file="impala_single_node.py",
    actors=2,  # the script's workers, one env each (it keeps its own sync=False)
    fleet=torchrl_fleet("impala_single_node", "1", "0"),
    config="config_single_node",
    # Frames are the script's (4 env steps each): 4 rollouts of 20 steps, trained 2 at a time.
    smoke=(
        "collector.total_frames=320",
        "collector.num_workers=2",
        "loss.batch_size=2",
        "logger.test_interval=1000000000",
    ),
    bench=(),  # TorchRL's 200 M frames are out of reach of two cores: not compared here
    frames=0,
    metric="train/reward",
    needs=("torchvision", "ale_py"),
)

#: This family's scripts, in the order they run.
SPECS = (
    _DQN_ATARI,
    _PPO_ATARI,
    _A2C_ATARI,
    _IMPALA,
)
