"""``rlfleet-grpo``'s flags: a value the run would refuse later is refused on the command line.

Each one exits 2 with argparse's one-line message naming the value, before any actor starts
(a traceback from ``train()`` after the fleet started is what these used to give).
"""

from __future__ import annotations

import pytest

from apps.grpo import parse_args

REFUSED = {
    "temperature under vLLM's floor": (["--temperature", "0.005"], "at least 0.01"),
    "task kwarg out of range": (["--task-kwargs", '{"digits": 0}'], "digits=0"),
    "task kwarg unknown": (["--task-kwargs", '{"bogus": 1}'], "bogus"),
    "jsonl task missing": (["--task", "jsonl:/nonexistent/t.jsonl"], "no such file"),
    "task factory missing": (["--task", "nosuch.mod:factory"], "No module named 'nosuch'"),
    "task name unknown": (["--task", "algebra"], "algebra"),
    "answers over the actors' cap": (["--max-new-tokens", "100000"], "at most 4096"),
    # numpy refuses the seed in seed_everything, a traceback before the first update
    "negative seed": (["--seed", "-1"], "seed must be >= 0, got -1"),
    # numpy's seeds end at 2**32 and the tiny model's at 2**31: a traceback in train()
    "seed past the model's ints": (["--seed", "4294967296"], "seed=4294967296 must be an int"),
    "context past the model's ints": (
        ["--max-positions", "2147483648"],
        "max_positions=2147483648 must be an int in [1, 2**31)",
    ),
    # the actors refused them with a traceback from train(), after sizing the context
    "slots over an actor's env pool": (
        ["--prompts-per-step", "1024", "--group-size", "16"],
        "(1024 * 16) is 8192 chat slots per actor, over an actor's 4096",
    ),
    "slots over an actor's env pool, async": (
        ["--async", "--group-size", "1000"],
        "prompts_per_step * group_size (32 * 1000) is 32000 chat slots per actor",
    ),
    "more actors than worker ids": (
        ["--async", "--num-actors", "100000"],
        "num_actors must be at most 65536 (worker ids 0..65535), got 100000",
    ),
    # Qwen2's rotary embedding needs an even head size: the model fails to build
    "odd head size": (["--hidden", "100", "--heads", "4"], "must be a multiple of 2 * heads"),
    # an accuracy above 1 is never reached: the target would silently be off
    "target accuracy over 1": (["--target-accuracy", "1.5"], "target_accuracy must be in (0, 1]"),
    # a negative weight or floor turns the entropy bonus into a penalty
    "negative entropy weight": (["--ent-coef", "-0.1"], "ent_coef must be finite and >= 0"),
    "negative entropy floor": (["--entropy-floor", "-1"], "entropy_floor must be finite and >= 0"),
    # drawing 50 x 10^9 problems of arith's 100 took days, before any actor started
    "held-out problems past the cap": (
        ["--eval-problems", "1000000000"],
        "eval_problems must be at most 10000, got 1000000000",
    ),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_grpo_command_line_refuses_what_the_run_would(case: str, capsys) -> None:
    argv, message = REFUSED[case]
    with pytest.raises(SystemExit) as exc:
        parse_args(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert message in err
    assert "Traceback" not in err


def test_grpo_command_line_takes_the_values_at_the_edges() -> None:
    settings = parse_args(
        ["--temperature", "0.01", "--max-new-tokens", "4096", "--task", "reverse"]
    )
    assert (settings.sampling_temperature, settings.max_new_tokens, settings.task) == (
        0.01,
        4096,
        "reverse",
    )
