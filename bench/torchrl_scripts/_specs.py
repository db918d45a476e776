"""The ported scripts: where each comes from, its fleet, its budgets and what it returns.

Budgets are hydra overrides (tutorials: edits of their constants) applied alike to the
original and to the port: ``smoke`` is a few batches (the fast suite), ``bench`` the budget
of the comparison in ``bench/RESULTS.md``. ``metric`` is the logged scalar read as the
final return (its last value); a tutorial's is an expression over its globals.
"""

from __future__ import annotations

import dataclasses

__all__ = ["SPECS", "ScriptSpec"]

_FLEETS = "bench.torchrl_scripts.fleets"


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


def _fleet(name: str, num_envs: str, seed: str, env_kwargs: str = "") -> str:
    """``LocalFleet`` arguments after the count: TorchRL-env actors on ``fleets.<name>``."""
    env_kwargs = env_kwargs or '{"cfg": cfg}'
    return (
        f'kind="torchrl", env_factory="{_FLEETS}.{name}:make_env", '
        f'policy="{_FLEETS}.{name}:make_policy", env_kwargs={env_kwargs}, '
        f'policy_kwargs={{"cfg": cfg}}, num_envs={num_envs}, seed={seed}'
    )


def _two_actors(name: str) -> str:
    """Fleet arguments of a script batching ``env_per_collector`` envs: two actors share them."""
    return _fleet(name, "max(1, cfg.collector.env_per_collector // 2)", "cfg.env.seed")


def _off_policy_smoke(*extra: str) -> tuple[str, ...]:
    """A few batches of 100 frames of an off-policy script, no evaluation."""
    return (
        "collector.total_frames=200",
        "collector.init_random_frames=100",
        "collector.frames_per_batch=100",
        "optim.batch_size=32",
        *extra,
    )


_DQN = ScriptSpec(
    name="dqn_cartpole",
    folder="sota-implementations/dqn",
    script="dqn_cartpole.py",
    helpers=("utils_cartpole.py",),
    collector_file="dqn_cartpole.py",
    actors=1,
    fleet=_fleet("dqn_cartpole", "1", "0"),
    config="config_cartpole",
    smoke=(
        "collector.total_frames=400",
        "collector.frames_per_batch=200",
        "collector.init_random_frames=200",
        "loss.num_updates=2",
        "buffer.batch_size=32",
        "logger.num_test_episodes=1",
    ),
    bench=(
        "collector.total_frames=40000",
        "collector.frames_per_batch=1000",
        "collector.init_random_frames=5000",
        "collector.annealing_frames=20000",
        "loss.num_updates=100",
        "logger.test_interval=13000",  # evaluates after the last batch (i = 39)
    ),
    frames=40_000,
    metric="eval/reward",
    threshold=475.0,  # CartPole-v1's reward threshold
)

_PPO = ScriptSpec(
    name="ppo_mujoco",
    folder="sota-implementations/ppo",
    script="ppo_mujoco.py",
    helpers=("utils_mujoco.py",),
    collector_file="ppo_mujoco.py",
    actors=1,
    fleet=_fleet("ppo_mujoco", "1", "0"),
    config="config_mujoco",
    smoke=(
        "collector.total_frames=256",
        "collector.frames_per_batch=128",
        "loss.mini_batch_size=64",
        "loss.ppo_epochs=1",
        "logger.num_test_episodes=1",
        "env.max_episode_steps=100",
    ),
    bench=(
        "env.env_name=InvertedDoublePendulum-v4",
        "collector.total_frames=40960",
        "collector.frames_per_batch=2048",
    ),
    frames=40_960,
    # The script's eval env normalises with a VecNorm of its own, not the training envs'
    # statistics (on both sides), so its eval return says little: the training episodes' does.
    metric="train/reward",
    threshold=9100.0,  # InvertedDoublePendulum's reward threshold
)

_A2C = ScriptSpec(
    name="a2c_mujoco",
    folder="sota-implementations/a2c",
    script="a2c_mujoco.py",
    helpers=("utils_mujoco.py",),
    collector_file="a2c_mujoco.py",
    actors=1,
    fleet=_fleet("a2c_mujoco", "1", "0"),
    config="config_mujoco",
    smoke=(
        "env.env_name=InvertedPendulum-v4",
        "collector.total_frames=128",
        "collector.frames_per_batch=64",
        "loss.mini_batch_size=32",
        "logger.num_test_episodes=1",
    ),
    bench=(
        "env.env_name=InvertedPendulum-v4",
        "collector.total_frames=64000",
        "collector.frames_per_batch=640",
    ),
    frames=64_000,
    metric="train/reward",  # as ppo_mujoco: its test env's VecNorm is its own
    threshold=950.0,  # InvertedPendulum's reward threshold
)

_SAC = ScriptSpec(
    name="sac",
    folder="sota-implementations/sac",
    script="sac.py",
    helpers=("utils.py",),
    collector_file="utils.py",
    actors=2,
    fleet=_two_actors("sac"),
    config="config",
    smoke=_off_policy_smoke(
        "env.max_episode_steps=50",
        "collector.env_per_collector=1",
        "network.hidden_sizes=[32,32]",
        "optim.utd_ratio=0.1",
        "logger.eval_iter=1000000",
    ),
    bench=(
        "env.name=InvertedPendulum-v4",
        "collector.total_frames=12000",
        "collector.init_random_frames=2000",
        "collector.frames_per_batch=1000",
        "collector.env_per_collector=2",
        "logger.eval_iter=12000",
    ),
    frames=12_000,
    metric="eval/reward",
    threshold=950.0,
    seed_key="env.seed",
)

_DDPG = ScriptSpec(
    name="ddpg",
    folder="sota-implementations/ddpg",
    script="ddpg.py",
    helpers=("utils.py",),
    collector_file="utils.py",
    actors=1,
    fleet=_fleet("ddpg", "1", "cfg.env.seed"),
    config="config",
    smoke=_off_policy_smoke(
        "env.max_episode_steps=50",
        "network.hidden_sizes=[32,32]",
        "logger.eval_iter=1000000",
    ),
    # Pendulum-v1 at 30,000 frames: with TorchRL's defaults (OU noise, lr 3e-4) the script
    # learns it in ~20,000 frames (InvertedPendulum-v4 at 12,000 it learns on neither side:
    # every episode 4 steps). Evaluations at 10, 20 and 30 thousand frames, each the mean of
    # 10 episodes (the default's one episode from one start swings by 2x between evaluations).
    bench=(
        "env.name=Pendulum-v1",
        "env.max_episode_steps=200",
        "collector.total_frames=30000",
        "collector.init_random_frames=2000",
        "collector.frames_per_batch=1000",
        "logger.eval_iter=10000",
        "logger.num_eval_envs=10",
    ),
    frames=30_000,
    metric="eval/reward",
    # Pendulum-v1 registers no threshold; -200 is the usual "swung up and held" level.
    threshold=-200.0,
    seed_key="env.seed",
)

_MAPPO = ScriptSpec(
    name="mappo_ippo",
    folder="sota-implementations/multiagent",
    script="mappo_ippo.py",
    helpers=("utils",),
    collector_file="mappo_ippo.py",
    actors=2,
    fleet=_fleet(
        "mappo_ippo",
        "cfg.env.vmas_envs // 2",
        "cfg.seed",
        env_kwargs='{"cfg": cfg, "num_envs": cfg.env.vmas_envs // 2}',
    ),
    config="mappo_ippo",
    smoke=(
        "env.max_steps=20",
        "collector.frames_per_batch=40",
        "collector.n_iters=2",
        "train.num_epochs=1",
        "train.minibatch_size=20",
        "eval.evaluation_episodes=1",
    ),
    # 300,000 frames: at 60,000 the returns are still near 0 on both sides (around -3 to +8
    # at the last evaluation), where a relative criterion says nothing; at 300,000 both reach
    # ~37. The last evaluation (iteration 49) over 200 episodes, not 10 (less noise).
    bench=(
        "collector.frames_per_batch=6000",
        "collector.n_iters=50",
        "train.num_epochs=10",
        "train.minibatch_size=400",
        "train.lr=3e-4",
        "eval.evaluation_episodes=200",
        "eval.evaluation_interval=49",
    ),
    frames=300_000,
    metric="eval_episode_reward_mean",  # its logger writes "/" as "_"
    seed_key="seed",
)

# pytorch/rl main at ae9719f17b1517af5c2523a36c4616f003ee55cf holds the same discrete_sac.py
# and utils.py as the torchrl 0.14.1 wheel, from which they are read.
_DISCRETE_SAC = ScriptSpec(
    name="discrete_sac",
    folder="sota-implementations/discrete_sac",
    script="discrete_sac.py",
    helpers=("utils.py",),
    collector_file="utils.py",
    actors=1,
    fleet=_fleet("discrete_sac", "cfg.collector.env_per_collector", "cfg.env.seed"),
    config="config",
    smoke=_off_policy_smoke(
        "env.max_episode_steps=50",
        "network.hidden_sizes=[32,32]",
        "logger.eval_iter=1000000",
    ),
    # 20,000 frames, evaluated after the last batch.
    bench=(
        "collector.total_frames=20000",
        "logger.eval_iter=20000",
    ),
    frames=20_000,
    metric="eval/reward",
    seed_key="env.seed",
)

# The scripts below are pytorch/rl main's at ae9719f17b1517af5c2523a36c4616f003ee55cf, byte for
# byte the torchrl 0.14.1 wheel's (cql's utils.py differs in one line of make_discretecql_model:
# the wheel's is kept); their configs are main's at that commit (the wheel ships none).


#: Pendulum-v1 at 15,000 frames (2,000 random, batches of 1,000), evaluated after the last
#: batch: the off-policy actor-critics' comparison budget (Pendulum's episodes are 200 steps).
#: One update per 4 frames (TorchRL's: one per frame), the same on both sides, so that a run
#: takes minutes on two cores.
_PENDULUM_15K = (
    "env.name=Pendulum-v1",
    "env.max_episode_steps=200",
    "collector.total_frames=15000",
    "collector.init_random_frames=2000",
    "collector.frames_per_batch=1000",
    "optim.utd_ratio=0.25",
)


_TD3 = ScriptSpec(
    name="td3",
    folder="sota-implementations/td3",
    script="td3.py",
    helpers=("utils.py",),
    collector_file="utils.py",
    actors=2,
    fleet=_two_actors("td3"),
    config="config",
    smoke=_off_policy_smoke(
        "env.max_episode_steps=50",
        "collector.env_per_collector=1",
        "network.hidden_sizes=[32,32]",
        "logger.eval_iter=1000000",
    ),
    bench=(*_PENDULUM_15K, "collector.env_per_collector=2", "logger.eval_iter=15000"),
    frames=15_000,
    metric="eval/reward",
    threshold=-200.0,  # as ddpg: Pendulum-v1 registers none
    seed_key="env.seed",
)

_TQC = ScriptSpec(
    name="tqc",
    folder="sota-implementations/tqc",
    script="tqc.py",
    helpers=("utils.py",),
    collector_file="utils.py",
    actors=2,
    fleet=_two_actors("tqc"),
    config="config",
    smoke=_off_policy_smoke(
        "env.max_episode_steps=50",
        "collector.env_per_collector=1",
        "network.actor_hidden_sizes=[32,32]",
        "network.critic_hidden_sizes=[32,32]",
        "optim.utd_ratio=0.1",
        "logger.eval_iter=1000000",
    ),
    # Critics of [256, 256] (TorchRL's: 5 of [512, 512, 512]): the same on both sides.
    bench=(
        *_PENDULUM_15K,
        "collector.env_per_collector=2",
        "network.critic_hidden_sizes=[256,256]",
        "logger.eval_iter=15000",
    ),
    frames=15_000,
    metric="eval/reward",
    threshold=-200.0,
    seed_key="env.seed",
)

_CROSSQ = ScriptSpec(
    name="crossq",
    folder="sota-implementations/crossq",
    script="crossq.py",
    helpers=("utils.py",),
    collector_file="utils.py",
    actors=1,
    fleet=_fleet("crossq", "cfg.collector.env_per_collector", "cfg.env.seed"),
    config="config",
    smoke=_off_policy_smoke(
        "env.max_episode_steps=50",
        "network.actor_hidden_sizes=[32,32]",
        "network.critic_hidden_sizes=[32,32]",
        "logger.eval_iter=1000000",
    ),
    # Critics of [256, 256] (TorchRL's: [2048, 2048]), batch-norm warm-up over 5,000 steps
    # (TorchRL's: 100,000, past this budget): the same on both sides.
    bench=(
        *_PENDULUM_15K,
        "network.critic_hidden_sizes=[256,256]",
        "network.warmup_steps=5000",
        "logger.eval_iter=15000",
    ),
    frames=15_000,
    metric="eval/reward",
    threshold=-200.0,
    seed_key="env.seed",
)

_IQL_ONLINE = ScriptSpec(
    name="iql_online",
    folder="sota-implementations/iql",
    script="iql_online.py",
    helpers=("utils.py",),
    collector_file="utils.py",
    actors=1,
    fleet=_fleet("iql_online", "cfg.env.train_num_envs", "cfg.env.seed"),
    config="online_config",
    smoke=_off_policy_smoke(
        "collector.max_frames_per_traj=50",
        "model.hidden_sizes=[32,32]",
        "optim.utd_ratio=0.1",
        "logger.eval_iter=1000000",
    ),
    # TorchRL's own budget (Pendulum-v1 at 20,000 frames) at one update per 4 frames (its:
    # one per frame), evaluated after the last batch.
    bench=("optim.utd_ratio=0.25", "logger.eval_iter=20000"),
    frames=20_000,
    metric="eval/reward",
    threshold=-200.0,
    seed_key="env.seed",
)

_CQL_ONLINE = ScriptSpec(
    name="cql_online",
    folder="sota-implementations/cql",
    script="cql_online.py",
    helpers=("utils.py",),
    collector_file="utils.py",
    actors=1,
    fleet=_fleet("cql_online", "cfg.env.train_num_envs", "cfg.env.seed"),
    config="online_config",
    smoke=_off_policy_smoke(
        "collector.max_frames_per_traj=50",
        "model.hidden_sizes=[32,32]",
        "optim.utd_ratio=0.1",
        "logger.log_interval=1000000",
        "logger.eval_steps=50",
    ),
    # Pendulum-v1 (TorchRL's default env) at 15,000 frames, one update per 4 frames (its: one
    # per frame), evaluated at the last batch: the script evaluates batch i (from 0) when
    # i * frames_per_batch passes a multiple of log_interval (its check of the final batch
    # compares one batch's frames with the total, never true), so 14,000 is the 15th batch.
    bench=(
        "collector.total_frames=15000",
        "collector.init_random_frames=2000",
        "optim.utd_ratio=0.25",
        "logger.log_interval=14000",
        "logger.eval_steps=200",
    ),
    frames=15_000,
    metric="eval/reward",
    threshold=-200.0,
    seed_key="env.seed",
)


_DISCRETE_CQL_ONLINE = ScriptSpec(
    name="discrete_cql_online",
    folder="sota-implementations/cql",
    script="discrete_cql_online.py",
    helpers=("utils.py",),
    collector_file="utils.py",
    actors=1,
    fleet=_fleet("discrete_cql_online", "1", "cfg.env.seed"),
    config="discrete_online_config",
    smoke=_off_policy_smoke(
        "collector.max_frames_per_traj=50",
        "model.hidden_sizes=[32,32]",
        "optim.utd_ratio=0.1",
        "logger.eval_iter=1000000",
    ),
    # CartPole-v1 (TorchRL's default env) at 20,000 frames, one update per 4 frames (its: one
    # per frame), evaluated after the last batch (200 steps at most: 200 is the best return).
    bench=(
        "collector.total_frames=20000",
        "optim.utd_ratio=0.25",
        "logger.eval_iter=20000",
    ),
    frames=20_000,
    metric="eval/reward",
    seed_key="env.seed",
)

_DQN_ATARI = ScriptSpec(
    name="dqn_atari",
    folder="sota-implementations/dqn",
    script="dqn_atari.py",
    helpers=("utils_atari.py",),
    collector_file="dqn_atari.py",
    actors=1,
    fleet=_fleet("dqn_atari", "1", "0"),
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
        fleet=_fleet(
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
    fleet=_fleet("impala_single_node", "1", "0"),
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

#: A few VMAS batches of ``multiagent/`` scripts (two iterations of 40 frames).
_VMAS_SMOKE = (
    "env.max_steps=20",
    "collector.frames_per_batch=40",
    "collector.n_iters=2",
    "train.num_epochs=1",
    "train.minibatch_size=20",
    "eval.evaluation_episodes=1",
)

#: VMAS balance at 60,000 frames (10 batches of 6,000), TorchRL's 45 epochs a batch over
#: minibatches of 400; the last iteration (9) evaluated over 200 episodes.
_VMAS_60K = (
    "collector.frames_per_batch=6000",
    "collector.n_iters=10",
    "train.minibatch_size=400",
    "eval.evaluation_episodes=200",
    "eval.evaluation_interval=9",
)


def _vmas_script(name: str, script: str, fleet: str, config: str = "") -> ScriptSpec:
    """A ``multiagent/`` script: two actors share its VMAS envs."""
    return ScriptSpec(
        name=name,
        folder="sota-implementations/multiagent",
        script=script,
        helpers=("utils",),
        collector_file=script,
        actors=2,
        fleet=_fleet(
            fleet,
            "cfg.env.vmas_envs // 2",
            "cfg.seed",
            env_kwargs='{"cfg": cfg, "num_envs": cfg.env.vmas_envs // 2}',
        ),
        config=config or script.removesuffix(".py"),
        smoke=_VMAS_SMOKE,
        bench=_VMAS_60K,
        frames=60_000,
        metric="eval_episode_reward_mean",  # its logger writes "/" as "_"
        seed_key="seed",
    )


_MARL_IQL = _vmas_script("marl_iql", "iql.py", "marl_qnet")
_QMIX_VDN = _vmas_script("qmix_vdn", "qmix_vdn.py", "marl_qnet")
_MADDPG = _vmas_script("maddpg_iddpg", "maddpg_iddpg.py", "maddpg_iddpg")
_MARL_SAC = _vmas_script("marl_sac", "sac.py", "marl_sac")

_DREAMER_V3 = ScriptSpec(
    name="dreamer_v3",
    folder="sota-implementations/dreamer_v3",
    script="dreamer_v3.py",
    helpers=(),
    collector_file="dreamer_v3.py",
    actors=1,
    fleet=_fleet("dreamer_v3", "1", "cfg.env.seed + 2"),
    config="config",
    # Training starts after 512 frames (2 x 16 sequences of 16); 4 batches of 200.
    smoke=(
        "collector.total_frames=800",
        "optimization.updates_per_batch=2",
        "logger.eval_episodes=1",
    ),
    bench=(),  # TorchRL's own budget: 5,000 frames, evaluated every 500 (3 episodes)
    frames=5_000,
    metric="metrics.json:evaluation_returns",
    seed_key="env.seed",
    checkout=True,  # main's DreamerV3; the wheel's dreamer_v3/train.py is an older script
)

_TUTORIALS = "tutorials/sphinx-tutorials"


def _stats_kwargs(index: int) -> str:
    """Env kwargs carrying the learner's ``ObservationNorm`` (``env.transform[index]``)."""
    norm = f"env.transform[{index}]"
    return f'{{"loc": {norm}.loc.tolist(), "scale": {norm}.scale.tolist()}}'


def _tutorial_fleet(name: str, stats: int) -> str:
    return (
        f'kind="torchrl", env_factory="{_FLEETS}.{name}:make_env", '
        f'policy="{_FLEETS}.{name}:make_policy", env_kwargs={_stats_kwargs(stats)}, '
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

SPECS: dict[str, ScriptSpec] = {
    spec.name: spec
    for spec in (
        _DQN,
        _PPO,
        _A2C,
        _SAC,
        _DDPG,
        _DISCRETE_SAC,
        _MAPPO,
        _CODING_PPO,
        _DQN_RNN,
        _TD3,
        _TQC,
        _CROSSQ,
        _IQL_ONLINE,
        _CQL_ONLINE,
        _DISCRETE_CQL_ONLINE,
        _DQN_ATARI,
        _PPO_ATARI,
        _A2C_ATARI,
        _IMPALA,
        _MARL_IQL,
        _QMIX_VDN,
        _MADDPG,
        _MARL_SAC,
        _DREAMER_V3,
    )
}
