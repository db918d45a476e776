"""``rlfleet-grpo``'s rank flags: ``--nproc-per-node`` and ``--shard-pushes`` combinations."""

from __future__ import annotations

import pytest

from apps.grpo import GRPOSettings, parse_args


def test_grpo_settings_split_the_fleet_and_the_slots_over_the_ranks() -> None:
    settings = parse_args(["--nproc-per-node", "2", "--num-actors", "4", "--shard-pushes"])
    assert (settings.nproc_per_node, settings.shard_pushes) == (2, True)
    assert settings.actors_per_rank == 2
    # Each rank's update: prompts_per_step x group_size turns from its own 2 actors.
    assert settings.slots_per_actor == 32 * 8 // 2


def test_grpo_settings_raises_if_shard_pushes_has_a_single_rank() -> None:
    with pytest.raises(ValueError, match="--shard-pushes needs --nproc-per-node 2 or more"):
        GRPOSettings(shard_pushes=True)


def test_grpo_command_line_refuses_shard_pushes_without_ranks(capsys) -> None:
    with pytest.raises(SystemExit) as exc:
        parse_args(["--shard-pushes", "--nproc-per-node", "1"])
    assert exc.value.code == 2
    assert "--shard-pushes needs --nproc-per-node 2 or more" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"nproc_per_node": 2, "num_actors": 3}, "multiple of nproc_per_node"),
        ({"nproc_per_node": 0}, "nproc_per_node"),
        ({"nproc_per_node": 2, "loss": "torchrl", "temperature": 1.0}, "needs --loss builtin"),
        ({"nproc_per_node": 2, "num_actors": 4, "prompts_per_step": 3}, r"nproc_per_node \(2\)"),
    ],
)
def test_grpo_settings_raises_if_the_ranks_do_not_fit(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        GRPOSettings(**kwargs)


def test_grpo_settings_under_torchrun_split_the_fleet_over_its_world(monkeypatch) -> None:
    # `torchrun --nproc-per-node 2 -m apps.grpo`: two ranks, without our own flag.
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    settings = parse_args([])
    assert (settings.nproc_per_node, settings.ranks, settings.actors_per_rank) == (1, 2, 1)
    assert settings.slots_per_actor == 32 * 8
    with pytest.raises(ValueError, match=r"multiple of nproc_per_node \(2\)"):
        GRPOSettings(num_actors=3)
