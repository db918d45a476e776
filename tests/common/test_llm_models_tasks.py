"""The LLM registry and tasks: tiny models from a config, local checkpoints, procedural tasks."""

from __future__ import annotations

import json
import random
import re
import socket
import sys
import time

import pytest
import torch

from common.llm import (
    PolicySpecError,
    TaskSpecError,
    _tasks,
    build_policy,
    build_task,
    check_policy_spec,
    check_task_spec,
    end_token_ids,
)
from common.llm._tasks import countdown_reward
from common.plain_config import to_plain

pytest.importorskip("transformers")
pytestmark = pytest.mark.usefixtures("loopback_only")


def test_build_policy_same_kwargs_build_identical_weights() -> None:
    a, tok = build_policy("rlfleet:tiny-qwen2", hidden=32, layers=1, seed=5)
    b, _ = build_policy("rlfleet:tiny-qwen2", hidden=32, layers=1, seed=5)
    c, _ = build_policy("rlfleet:tiny-qwen2", hidden=32, layers=1, seed=6)
    sa, sb, sc = a.state_dict(), b.state_dict(), c.state_dict()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    assert not all(torch.equal(sa[k], sc[k]) for k in sa)
    assert a.config.hidden_size == 32
    assert a.config.num_hidden_layers == 1
    assert a.generation_config.top_k is None  # no silent top_k=50
    text = "12+7=19 héllo"
    assert tok.decode(tok(text)["input_ids"]) == text
    prompt = tok.apply_chat_template(
        [{"role": "user", "content": "1+2="}], add_generation_prompt=True, tokenize=False
    )
    assert prompt == "<|im_start|>user\n1+2=<|im_end|>\n<|im_start|>assistant\n"


def test_build_policy_tiny_gpt2_runs() -> None:
    model, tok = build_policy("rlfleet:tiny-gpt2", hidden=32, layers=1, heads=2)
    ids = torch.tensor([tok("abc")["input_ids"]])
    assert model(input_ids=ids).logits.shape == (1, 3, len(tok))


def test_build_policy_loads_a_local_checkpoint_offline(tmp_path) -> None:
    model, tok = build_policy("rlfleet:tiny-qwen2", hidden=32, layers=1)
    model.save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    loaded, tok2 = build_policy(f"hf:{tmp_path}")
    ids = torch.tensor([tok("hello")["input_ids"]])
    with torch.no_grad():
        assert torch.equal(model(input_ids=ids).logits, loaded(input_ids=ids).logits)
    assert tok2.chat_template == tok.chat_template


def test_build_policy_raises_if_the_checkpoint_has_no_chat_template(tmp_path) -> None:
    model, tok = build_policy("rlfleet:tiny-qwen2", hidden=32, layers=1)
    tok.chat_template = None
    model.save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    for name in ("chat_template.jinja", "chat_template.json"):
        (tmp_path / name).unlink(missing_ok=True)
    with pytest.raises(PolicySpecError, match="no chat template"):
        check_policy_spec(f"hf:{tmp_path}")


def _saved(path, model, tok) -> str:
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return f"hf:{path}"


def test_build_policy_refuses_a_checkpoint_whose_ids_do_not_fit_its_model(tmp_path) -> None:
    """Named at start, not as an IndexError in every session (or a response that never ends)."""
    model, tok = build_policy("rlfleet:tiny-qwen2", hidden=32, layers=1, vocab="compact")
    model.resize_token_embeddings(30)  # the tokenizer has 60 ids, its specials below 30
    with pytest.raises(PolicySpecError, match="the tokenizer has 60 ids but the model embeds 30"):
        build_policy(_saved(tmp_path / "small", model, tok))
    model, tok = build_policy("rlfleet:tiny-qwen2", hidden=32, layers=1)
    model.generation_config.eos_token_id = [tok.eos_token_id, 10**6]
    with pytest.raises(PolicySpecError, match="eos_token_id lists 1000000, not an id"):
        build_policy(_saved(tmp_path / "far", model, tok))
    model, tok = build_policy("rlfleet:tiny-qwen2", hidden=32, layers=1)
    tok.eos_token = None
    with pytest.raises(PolicySpecError, match="the tokenizer has no EOS token"):
        build_policy(_saved(tmp_path / "no_eos", model, tok))


def test_a_response_ends_on_every_end_id_the_checkpoint_lists(tmp_path) -> None:
    """As transformers' generate: a chat model's ``<end_of_turn>`` beside ``<eos>``."""
    model, tok = build_policy("rlfleet:tiny-qwen2", hidden=32, layers=1)
    other = tok.convert_tokens_to_ids("<|endoftext|>")
    assert end_token_ids(model, tok) == (tok.eos_token_id,)
    model.generation_config.eos_token_id = [tok.eos_token_id, other]
    loaded, tok2 = build_policy(_saved(tmp_path, model, tok))
    assert end_token_ids(loaded, tok2) == (tok.eos_token_id, other)


def test_a_folder_without_a_checkpoint_is_named_as_such(tmp_path) -> None:
    (tmp_path / "notes.txt").write_text("not a model")
    with pytest.raises(PolicySpecError, match=r"is not a checkpoint directory \(no config\.json"):
        check_policy_spec(f"hf:{tmp_path}")


@pytest.mark.parametrize(
    ("spec", "kwargs", "match"),
    [
        ("rlfleet:tiny-llama9", {}, "unknown model spec"),
        ("hf:/no/such/dir", {}, "no such checkpoint directory"),
        ("rlfleet:tiny-qwen2", {"hiden": 8}, "unknown kwargs"),
        ("rlfleet:tiny-qwen2", {"hidden": 2**64 - 1}, "must be an int"),
        ("rlfleet:tiny-qwen2", {"hidden": 30, "heads": 4}, "multiple of"),
        ("rlfleet:tiny-qwen2", {"layers": 0}, r"layers=0 must be an int in \[1, 2\*\*31\)"),
        ("rlfleet:tiny-qwen2", {"heads": 0}, r"heads=0 must be an int in \[1, 2\*\*31\)"),
        ("rlfleet:tiny-qwen2", {"seed": -1}, r"seed=-1 must be an int in \[0, 2\*\*31\)"),
        ("rlfleet:tiny-qwen2", {"seed": 2**31}, r"seed=2147483648 must be an int in \[0, 2"),
        ("rlfleet:tiny-qwen2", {"vocab": "words"}, "vocab='words' must be one of"),
        ("rlfleet:tiny-gpt2", {"vocab": 7}, "vocab=7 must be one of"),
    ],
)
def test_build_policy_raises_if_the_spec_is_bad(spec, kwargs, match) -> None:
    with pytest.raises(PolicySpecError, match=match):
        build_policy(spec, **kwargs)


def test_importing_common_llm_imports_neither_torch_nor_transformers() -> None:
    import subprocess

    code = (
        "import sys, common.llm, common.config; "
        "from common.llm import LLMSettings, check_task_spec, check_policy_spec; "
        "print('torch' in sys.modules, 'transformers' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]


def test_arith_problems_and_rewards() -> None:
    task = build_task("arith", digits=2, ops="+-*", modulus=10)
    rng = random.Random(0)
    for _ in range(50):
        problem = task.sample(rng)
        value = eval(problem.query[:-1]) % 10  # the reference, on our own strings
        assert problem.answer == str(value)
    outcome = task.score(problem, f" {problem.answer} ", 1)
    assert outcome.reward == 1.0
    assert outcome.terminated
    assert outcome.success
    assert task.score(problem, "x", 1).reward == 0.0


def test_arith_retries_make_a_multi_turn_dialog() -> None:
    task = build_task("arith", retries=2)
    problem = task.sample(random.Random(1))
    first = task.score(problem, "wrong", 1)
    assert not first.terminated
    assert first.reply == "No. Try again."
    assert task.score(problem, "wrong", 3).terminated
    assert task.max_turns == 3


def test_arith_gives_every_retry_and_never_calls_a_wrong_last_answer_a_success() -> None:
    task = build_task("arith", retries=2)
    problem = task.sample(random.Random(1))
    assert not task.score(problem, "wrong", 2).terminated  # the second retry is still owed
    last = task.score(problem, "wrong", 3)
    assert (last.reward, last.terminated, last.success) == (0.0, True, False)


def test_arith_operands_have_the_given_digits_and_modulus_zero_keeps_the_result_whole() -> None:
    task = build_task("arith", digits=1, ops="+-*", modulus=0)
    rng = random.Random(4)
    answers = []
    for _ in range(300):
        problem = task.sample(rng)
        a, op, b = re.fullmatch(r"(\d+)([-+*])(\d+)=", problem.query).groups()  # type: ignore[union-attr]
        assert len(a) == len(b) == 1
        assert problem.answer == str(eval(f"{a}{op}{b}"))  # the reference, on our own strings
        answers.append(int(problem.answer))
    assert min(answers) < 0
    assert max(answers) > 9


@pytest.mark.parametrize(
    ("spec", "kwargs"),
    [
        ("arith", {"digits": 9, "retries": 1000, "modulus": 10**9}),
        ("reverse", {"length": 1000, "alphabet": "a"}),
        ("countdown", {"num_count": 16}),
    ],
)
def test_task_kwargs_at_their_bounds_are_taken(spec, kwargs) -> None:
    task = build_task(spec, **kwargs)
    task.sample(random.Random(0))


@pytest.mark.parametrize(
    ("spec", "kwargs", "match"),
    [
        ("arith", {"digits": 10}, r"digits=10 must be an int in \[1, 9\]"),
        ("arith", {"digits": True}, "digits=True"),
        ("arith", {"retries": -1}, r"retries=-1 must be an int in \[0, 1000\]"),
        ("arith", {"ops": ""}, "ops='' must be a non-empty subset"),
        ("reverse", {"alphabet": ""}, "alphabet='' must be a non-empty string"),
        ("countdown", {"num_count": 17}, r"num_count=17 must be an int in \[1, 16\]"),
    ],
)
def test_task_kwargs_one_past_their_bounds_are_refused_naming_them(spec, kwargs, match) -> None:
    with pytest.raises(TaskSpecError, match=match):
        build_task(spec, **kwargs)


def test_reverse_task() -> None:
    task = build_task("reverse", length=5, alphabet="xy")
    problem = task.sample(random.Random(2))
    word = problem.query.removeprefix("reverse: ")
    assert len(word) == 5
    assert set(word) <= {"x", "y"}
    assert task.score(problem, word[::-1], 1).reward == 1.0


def test_exact_match_tasks_ignore_spaces_at_either_end_of_the_answer_too(tmp_path) -> None:
    """A response is read stripped; so is the answer, else an answer with an end space (a
    ``reverse`` alphabet with a space, a jsonl answer) could never be scored right."""
    reverse = build_task("reverse", length=2, alphabet=" a")
    problem = _tasks.Problem("reverse:  a", "a ")
    assert reverse.score(problem, "a ", 1).success
    assert reverse.score(problem, "a", 1).success
    assert not reverse.score(problem, " ", 1).success
    path = tmp_path / "tasks.jsonl"
    path.write_text(json.dumps({"prompt": "3+4=", "answer": " 7"}))
    task = build_task(f"jsonl:{path}")
    outcome = task.score(task.sample(random.Random(0)), "7\n", 1)
    assert (outcome.reward, outcome.success) == (1.0, True)


def test_countdown_matches_torchrl_problems_and_rewards() -> None:
    from torchrl.envs.llm.datasets.countdown import _CountdownProblemGenerator
    from torchrl.envs.llm.reward.countdown import CountdownRewardParser

    ours, theirs = build_task("countdown"), _CountdownProblemGenerator(seed=3)
    rng = random.Random(3)
    for _ in range(20):
        problem, reference = ours.sample(rng), next(theirs)
        assert (problem.query, problem.answer) == (reference["query"], reference["answer"])
    answer = "target=24, numbers=3,8,1,5"
    for expression in ["3*8", "(3 + 5) * (8 / ...)", "3*8*1", "3*3*8", "8/(1-1)", "24", "3 8"]:
        want = CountdownRewardParser.validate_expression(expression, 24, [3, 8, 1, 5])
        reward, success = countdown_reward(answer, f"<think>t</think><answer>{expression}</answer>")
        assert success == want
        assert reward == (1.0 if want else 0.1)
    assert countdown_reward(answer, "no tags") == (0.0, False)


def test_countdown_problems_match_torchrl_when_the_drawn_target_is_zero() -> None:
    from torchrl.envs.llm.datasets.countdown import _CountdownProblemGenerator

    kwargs = {"num_count": 2, "max_number": 3, "max_target": 1000}
    ours, theirs = build_task("countdown", **kwargs), _CountdownProblemGenerator(seed=5, **kwargs)
    rng = random.Random(5)
    problems = [(ours.sample(rng), next(theirs)) for _ in range(200)]
    assert all((p.query, p.answer) == (r["query"], r["answer"]) for p, r in problems)


@pytest.mark.parametrize(
    ("answer", "expression", "right"),
    [
        ("target=24, numbers=3,8,1,5", "8+8+8", False),  # 8 given once, used three times
        ("target=24, numbers=24,1", "24.0001", False),  # near the target is not the target
        ("target=24, numbers=3,8", "-(3*8)", False),
        ("target=2, numbers=3,5", "-3+5", True),
        ("target=1, numbers=3,2", "3/2", False),  # true division, not floor
        ("target=7, numbers=7,2,2", "7/2*2", True),
        ("target=24, numbers=3,8", " 3 * 8 ", True),
    ],
)
def test_countdown_reward_agrees_with_torchrl_on_tricky_expressions(
    answer, expression, right
) -> None:
    from torchrl.envs.llm.reward.countdown import CountdownRewardParser

    target, numbers = CountdownRewardParser._parse_ground_truth(answer)
    assert CountdownRewardParser.validate_expression(expression.strip(), target, numbers) == right
    reward = countdown_reward(answer, f"<think>t</think><answer>{expression}</answer><|im_end|>")
    assert reward == ((1.0, True) if right else (0.1, False))


def test_countdown_reward_reads_the_first_answer_tag_and_the_task_kwargs() -> None:
    task = build_task("countdown", format_reward=0.25, correct_reward=2.0)
    problem = _tasks.Problem(query="q", answer="target=24, numbers=3,8")
    first_right = task.score(problem, "<answer>3*8</answer> or <answer>3+8</answer>", 1)
    assert (first_right.reward, first_right.success) == (2.0, True)
    assert task.score(problem, "<answer>3+8</answer> or <answer>3*8</answer>", 1).reward == 0.25


def test_countdown_reward_never_evaluates_power() -> None:
    start = time.monotonic()
    assert countdown_reward("target=1, numbers=9,9", "<answer>9**9**9</answer>") == (0.1, False)
    assert time.monotonic() - start < 1.0


def test_jsonl_task_cycles_lines_with_exact_match(tmp_path) -> None:
    path = tmp_path / "tasks.jsonl"
    path.write_text("\n".join(json.dumps({"prompt": f"q{i}", "answer": f"a{i}"}) for i in range(2)))
    task = build_task(f"jsonl:{path}")
    rng = random.Random(0)
    assert [task.sample(rng).query for _ in range(3)] == ["q0", "q1", "q0"]
    assert task.score(task.sample(rng), "a1", 1).reward == 1.0


def test_jsonl_task_skips_blank_lines(tmp_path) -> None:
    path = tmp_path / "tasks.jsonl"
    path.write_text('\n{"prompt": "q", "answer": "a"}\n\n  \n')
    task = build_task(f"jsonl:{path}")
    assert [task.sample(random.Random(0)).query for _ in range(2)] == ["q", "q"]


def test_jsonl_task_raises_if_the_file_is_empty_or_too_large(tmp_path, monkeypatch) -> None:
    path = tmp_path / "tasks.jsonl"
    path.write_text("\n")
    with pytest.raises(TaskSpecError, match="no problems in the file"):
        build_task(f"jsonl:{path}")
    path.write_text('{"prompt": "q", "answer": "a"}\n')
    monkeypatch.setattr(_tasks, "_MAX_JSONL_BYTES", 8)
    with pytest.raises(TaskSpecError, match="larger than 8 bytes"):
        build_task(f"jsonl:{path}")


@pytest.mark.parametrize("line", ['{"prompt": 1, "answer": "x"}', "not json", '["a"]'])
def test_jsonl_task_raises_if_a_line_is_malformed(tmp_path, line) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text(line + "\n")
    with pytest.raises(TaskSpecError, match=":1:"):
        build_task(f"jsonl:{path}")


class _EchoTask:
    max_turns = 2

    def __init__(self, word: str = "hi") -> None:
        self.word = word

    def sample(self, rng):
        from common.llm import Problem

        return Problem(query=self.word, answer=self.word)

    def score(self, problem, response, turn):
        from common.llm import Outcome

        return Outcome(reward=float(turn), terminated=False, reply="again")


def make_echo(**kwargs):
    return _EchoTask(**kwargs)


def make_nothing():
    return object()


def make_turnless():
    task = _EchoTask()
    task.max_turns = 0
    return task


def test_user_task_from_a_factory() -> None:
    task = build_task(f"{__name__}:make_echo", word="yo")
    assert task.sample(random.Random(0)).query == "yo"
    with pytest.raises(TaskSpecError, match="lacks max_turns"):
        build_task(f"{__name__}:make_nothing")
    with pytest.raises(TaskSpecError, match="TypeError"):
        build_task(f"{__name__}:make_echo", nope=1)
    with pytest.raises(TaskSpecError, match="max_turns must be an int >= 1, got 0"):
        build_task(f"{__name__}:make_turnless")


@pytest.mark.parametrize(
    ("spec", "kwargs"),
    [("nope", {}), ("jsonl:/no/such.jsonl", {}), ("arith", {"digits": 0}), ("arith", {"ops": "/"})],
)
def test_build_task_raises_if_the_spec_is_bad(spec, kwargs) -> None:
    with pytest.raises(TaskSpecError):
        build_task(spec, **kwargs)
    if not kwargs:
        with pytest.raises(TaskSpecError):
            check_task_spec(spec)


def test_the_network_guard_refuses_non_loopback_connections() -> None:
    with socket.socket() as sock, pytest.raises(ConnectionRefusedError, match="network guard"):
        sock.connect(("10.255.255.1", 443))


def test_build_policy_takes_ids_up_to_the_last_embedding_row_and_refuses_one_past(
    tmp_path,
) -> None:
    model, tok = build_policy("rlfleet:tiny-qwen2", hidden=32, layers=1, vocab="compact")
    rows = model.get_input_embeddings().num_embeddings
    model.generation_config.eos_token_id = [tok.eos_token_id, rows - 1]
    loaded, tok2 = build_policy(_saved(tmp_path / "last", model, tok))
    assert end_token_ids(loaded, tok2) == (tok.eos_token_id, rows - 1)
    for far in (rows, -1):
        model.generation_config.eos_token_id = [tok.eos_token_id, far]
        match = f"eos_token_id lists {far}, not an id of the model's {rows} embeddings"
        with pytest.raises(PolicySpecError, match=match):
            build_policy(_saved(tmp_path / f"far{far}", model, tok))
    model.generation_config.eos_token_id = tok.eos_token_id
    model.resize_token_embeddings(rows - 1)  # one id of the tokenizer's has no row
    with pytest.raises(PolicySpecError, match=f"has {rows} ids but the model embeds {rows - 1}"):
        build_policy(_saved(tmp_path / "short", model, tok))


def test_tiny_model_seed_is_taken_from_0_up_to_2_31_minus_1() -> None:
    low, _ = build_policy("rlfleet:tiny-qwen2", hidden=32, layers=1, seed=0)
    high, _ = build_policy("rlfleet:tiny-qwen2", hidden=32, layers=1, seed=2**31 - 1)
    assert not torch.equal(low.lm_head.weight, high.lm_head.weight)


def make_echo_from_config(cfg):
    return _EchoTask(word=cfg.task.word)  # attribute access: a DictConfig, not a dict


def test_a_task_factory_gets_back_the_omegaconf_config_sent_as_plain_data() -> None:
    omegaconf = pytest.importorskip("omegaconf")
    cfg = omegaconf.OmegaConf.create({"task": {"word": "${w}"}, "w": "yo"})
    kwargs = json.loads(json.dumps(to_plain({"cfg": cfg})))  # as it travels to an actor
    task = build_task(f"{__name__}:make_echo_from_config", **kwargs)
    assert task.sample(random.Random(0)).query == "yo"
