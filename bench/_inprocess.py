"""The in-process limit: one process stepping a gymnasium vector env and the policy, no transport.

This is the ceiling of what any collector on one core can do with the same
env and policy: gymnasium's ``SyncVectorEnv`` (the actors' env pool, with the
same ``copy=False`` and ``SAME_STEP`` autoreset) stepped in a loop, actions
from the ``"mlp"`` policy's batched fast path (``act_compact``, the one the
actors use), and each step's observation, action, reward, flags and next
observation written into preallocated ``[T, N]`` buffers, which is the least a
collector must do to hand out a batch.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

import gymnasium
import numpy as np
import torch
from gymnasium.vector import AutoresetMode, SyncVectorEnv
from tensordict.nn import InteractionType, set_interaction_type

from common.policies import make_policy

__all__ = ["CARTPOLE", "in_process_fps", "parallel_in_process_fps"]


def in_process_fps(
    make_env: Callable[[], gymnasium.Env],
    *,
    num_envs: int,
    steps_per_batch: int,
    seconds: float,
    hidden: tuple[int, ...] = (64, 64),
    policy: Any = "mlp",
    seed: int = 0,
) -> float:
    """Frames/s of the env-plus-policy loop over a window of about ``seconds`` (one warm-up batch).

    Args:
        make_env: Builds one env.
        num_envs: Envs in the vector env.
        steps_per_batch: Steps per buffer fill (a batch is ``num_envs * steps_per_batch`` frames).
        seconds: Length of the timed window.
        hidden: Hidden widths of the MLP policy.
        policy: ``"mlp"``, ``"random"`` (uniform actions, no network), or a user's
            ``TensorDictModule`` whose inner module maps observations to one score per
            action (called on the step's observation tensor, as an expert would).
        seed: Seed of the envs and of torch.

    Returns:
        Frames per second.
    """
    torch.manual_seed(seed)
    env = SyncVectorEnv([make_env] * num_envs, copy=False, autoreset_mode=AutoresetMode.SAME_STEP)
    if isinstance(policy, str):
        kwargs = {"hidden": hidden} if policy == "mlp" else {}
        space = env.single_observation_space
        module = make_policy(policy, space, env.single_action_space, **kwargs)
    else:
        module = policy
    space = env.single_observation_space
    buffers = {
        "observation": np.zeros((steps_per_batch, num_envs, *space.shape), space.dtype),
        "next_observation": np.zeros((steps_per_batch, num_envs, *space.shape), space.dtype),
        "action": np.zeros((steps_per_batch, num_envs), np.int64),
        "reward": np.zeros((steps_per_batch, num_envs), np.float32),
        "terminated": np.zeros((steps_per_batch, num_envs), bool),
        "truncated": np.zeros((steps_per_batch, num_envs), bool),
    }
    obs, _ = env.reset(seed=seed)
    state = {"obs": obs}
    try:
        with torch.no_grad(), set_interaction_type(InteractionType.RANDOM):
            _fill(env, module, buffers, state)  # warm-up
            frames, start = 0, time.perf_counter()
            while time.perf_counter() - start < seconds:
                frames += _fill(env, module, buffers, state)
            return frames / (time.perf_counter() - start)
    finally:
        env.close()


def _fill(
    env: SyncVectorEnv, policy: torch.nn.Module, buf: dict[str, np.ndarray], state: dict
) -> int:
    obs = state["obs"]
    steps = buf["action"].shape[0]
    for t in range(steps):
        buf["observation"][t] = obs
        if hasattr(policy, "act_compact"):
            action, _extras = policy.act_compact(torch.from_numpy(buf["observation"][t]))
        elif hasattr(policy, "module"):  # a user's TensorDictModule: its network on tensors
            action = policy.module(torch.from_numpy(buf["observation"][t])).argmax(-1)
        else:
            action = policy.sample_compact(env.num_envs)
        actions = action.numpy()
        obs, reward, terminated, truncated, info = env.step(actions)
        buf["action"][t] = actions
        buf["reward"][t] = reward
        buf["terminated"][t] = terminated
        buf["truncated"][t] = truncated
        buf["next_observation"][t] = obs
        done = terminated | truncated
        if done.any():  # SAME_STEP autoreset: the real next observation is in the info
            buf["next_observation"][t][done] = np.stack(info["final_obs"][done])
    state["obs"] = obs
    return steps * env.num_envs


# One in-process loop in a fresh interpreter: the env and policy factories named, the
# policy called with the env's spaces; prints frames/s.
_LOOP = """
import importlib, sys, torch
torch.set_num_threads(1)
from bench._inprocess import in_process_fps
def load(path):
    module, _, name = path.partition(":")
    return getattr(importlib.import_module(module), name)
make_env, make_policy = load(sys.argv[1]), load(sys.argv[2])
env = make_env()
policy = make_policy(env.observation_space, env.action_space)
num_envs, steps, seconds = int(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5])
print(in_process_fps(make_env, num_envs=num_envs, steps_per_batch=steps, seconds=seconds,
                     policy=policy))
"""

#: CartPole-v1, as ``parallel_in_process_fps`` names an env factory.
CARTPOLE = "bench.envs:make_cartpole"


def parallel_in_process_fps(
    processes: int,
    *,
    num_envs: int,
    steps_per_batch: int,
    seconds: float,
    env_factory: str = CARTPOLE,
    policy: str = "bench.policies:sequential_policy",
) -> float:
    """Frames/s of ``processes`` in-process loops (a user-style policy) run at once.

    The machine's ceiling for a fleet of that many actors of ``num_envs`` envs each:
    what the env and policy alone reach when every process runs all the time, with no
    transport and no learner. The processes import and warm up before their windows
    overlap (each spends the same start-up before timing), so the windows run together.

    Args:
        processes: Loops run at once, one process each.
        num_envs: Envs of each loop's vector env.
        steps_per_batch: Steps per buffer fill.
        seconds: Length of each loop's timed window.
        env_factory: ``"module:function"`` building one env (CartPole by default).
        policy: ``"module:function"`` called with the env's observation and action
            spaces, returning a ``TensorDictModule`` (see :func:`in_process_fps`).
    """
    args = [env_factory, policy, str(num_envs), str(steps_per_batch), str(seconds)]
    procs = [
        subprocess.Popen([sys.executable, "-c", _LOOP, *args], stdout=subprocess.PIPE, text=True)
        for _ in range(processes)
    ]
    outputs = [proc.communicate()[0] for proc in procs]
    if any(proc.returncode for proc in procs):
        raise RuntimeError(f"an in-process loop failed: exit codes {[p.returncode for p in procs]}")
    return sum(float(out.strip().splitlines()[-1]) for out in outputs)
