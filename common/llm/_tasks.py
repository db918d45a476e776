"""LLM tasks: what an env is to an env actor — prompts, a verifiable reward, dialog turns.

A task is any object with this small protocol (:class:`Task`)::

    max_turns: int                                  # turn limit: a dialog still going is truncated
    sample(rng: random.Random) -> Problem           # a new problem (query, answer, system prompt)
    score(problem, response: str, turn: int) -> Outcome   # reward, terminated, next user message

``turn`` counts the responses of the dialog so far (1 after the first). A dialog
ends *terminated* when ``score`` says so, *truncated* when it reaches ``max_turns``
(or the model's context) first — TorchRL's ``("next", "done")`` / ``terminated`` /
``truncated`` meaning.

Built in (procedural, seeded, offline): ``arith`` (``a op b`` modulo ``modulus``),
``reverse`` (reverse a short string), ``countdown`` (TorchRL's ``CountdownEnv``
problems, system prompt and ``CountdownRewardParser`` rewards, without ``eval``),
``jsonl:PATH`` (one ``{"prompt", "answer"}`` object per line, exact-match reward)
and ``package.module:factory`` (called with the task kwargs, returns a task).
"""

from __future__ import annotations

import ast
import dataclasses
import json
import os
import random
import re
from typing import Any, Protocol, runtime_checkable

from common.import_paths import IMPORT_PATH_RE, load_callable
from common.plain_config import from_plain

__all__ = [
    "TASK_NAMES",
    "Outcome",
    "Problem",
    "Task",
    "TaskSpecError",
    "build_task",
    "check_task_spec",
    "countdown_reward",
]

#: Built-in task names; ``jsonl:PATH`` and ``package.module:factory`` are also accepted.
TASK_NAMES = ("arith", "reverse", "countdown")
_MAX_JSONL_BYTES = 64 << 20


class TaskSpecError(ValueError):
    """A task spec or task kwargs that name nothing usable."""


@dataclasses.dataclass(frozen=True)
class Problem:
    """One problem a dialog starts from.

    Attributes:
        query: The first user message (TorchRL's ``query``).
        answer: The reference answer the reward checks against.
        system: An optional system prompt put before the query.
    """

    query: str
    answer: str
    system: str | None = None


@dataclasses.dataclass(frozen=True)
class Outcome:
    """What a task says about one response.

    Attributes:
        reward: The turn's reward.
        terminated: The task ended the dialog.
        reply: The next user message when the dialog goes on (None: the prompt
            of the next turn is the history so far).
        success: Whether the response solved the problem.
    """

    reward: float
    terminated: bool
    reply: str | None = None
    success: bool = False


@runtime_checkable
class Task(Protocol):
    """The task protocol (see the module docstring)."""

    max_turns: int

    def sample(self, rng: random.Random) -> Problem:
        """A new problem."""
        ...

    def score(self, problem: Problem, response: str, turn: int) -> Outcome:
        """Reward one response; say whether the dialog ends."""
        ...


def _positive(name: str, value: Any, low: int = 1, high: int = 1 << 20) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        raise TaskSpecError(f"task kwarg {name}={value!r} must be an int in [{low}, {high}]")
    return value


class _ExactMatch:
    """Shared scoring: reward 1 on an exact match; optional retries as extra turns.

    Spaces at either end of the response and of the answer are ignored (a ``reverse``
    alphabet with a space, a jsonl answer ``" 7"``).
    """

    def __init__(self, retries: int) -> None:
        self.retries = _positive("retries", retries, low=0, high=1000)
        self.max_turns = self.retries + 1

    def score(self, problem: Problem, response: str, turn: int) -> Outcome:
        """1.0 and terminated when right; else a retry message while retries remain."""
        right = response.strip() == problem.answer.strip()
        if right or turn > self.retries:
            return Outcome(float(right), terminated=True, success=right)
        return Outcome(0.0, terminated=False, reply="No. Try again.")


class ArithTask(_ExactMatch):
    """``a op b`` with ``digits``-digit operands; the answer is the result modulo ``modulus``.

    Args:
        digits: Digits per operand (1 by default).
        ops: Operators to draw from, a subset of ``"+-*"``.
        modulus: The answer is ``result % modulus`` (10: one digit); 0 keeps it whole.
        retries: Extra turns after a wrong answer ("No. Try again.").
    """

    def __init__(
        self, digits: int = 1, ops: str = "+", modulus: int = 10, retries: int = 0
    ) -> None:
        super().__init__(retries)
        self.digits = _positive("digits", digits, high=9)
        if not isinstance(ops, str) or not ops or set(ops) - set("+-*"):
            raise TaskSpecError(f"task kwarg ops={ops!r} must be a non-empty subset of '+-*'")
        self.ops = ops
        self.modulus = _positive("modulus", modulus, low=0, high=10**9)

    def sample(self, rng: random.Random) -> Problem:
        """A problem such as ``"3+5="`` with answer ``"8"``."""
        high = 10**self.digits - 1
        a, b, op = rng.randint(0, high), rng.randint(0, high), rng.choice(self.ops)
        value = a + b if op == "+" else a - b if op == "-" else a * b
        if self.modulus:
            value %= self.modulus
        return Problem(query=f"{a}{op}{b}=", answer=str(value))


class ReverseTask(_ExactMatch):
    """Reverse a string of ``length`` characters drawn from ``alphabet``.

    Args:
        length: Characters to reverse.
        alphabet: Characters to draw from.
        retries: Extra turns after a wrong answer.
    """

    def __init__(self, length: int = 4, alphabet: str = "abcdefgh", retries: int = 0) -> None:
        super().__init__(retries)
        self.length = _positive("length", length, high=1000)
        if not isinstance(alphabet, str) or not alphabet:
            raise TaskSpecError(f"task kwarg alphabet={alphabet!r} must be a non-empty string")
        self.alphabet = alphabet

    def sample(self, rng: random.Random) -> Problem:
        """A problem such as ``"reverse: abcd"`` with answer ``"dcba"``."""
        word = "".join(rng.choice(self.alphabet) for _ in range(self.length))
        return Problem(query=f"reverse: {word}", answer=word[::-1])


#: TorchRL 0.14.1 ``CountdownEnv.SYSTEM_PROMPT``.
COUNTDOWN_SYSTEM_PROMPT = (
    "A conversation between User and Assistant. The user gives a set of "
    "numbers and a target. The Assistant must find an arithmetic expression "
    "using each given number at most once that equals the target.\n"
    "The reasoning process and answer are enclosed within <think></think> "
    "and <answer></answer> tags, respectively.\n"
    "The answer should contain ONLY the arithmetic expression (e.g. "
    "(25 + 3) * 4)."
)


class CountdownTask:
    """TorchRL's ``CountdownEnv``: reach a target from numbers with ``+ - * /``.

    Problems follow ``_CountdownProblemGenerator`` (same draws for the same
    ``random.Random`` state); rewards follow ``CountdownRewardParser``:
    ``correct_reward`` for a valid expression in ``<answer>`` tags, ``format_reward``
    for a wrong one, 0 without an answer. One turn per dialog.

    Args:
        num_count: Numbers per problem.
        max_number: Largest number.
        max_target: Largest target.
        format_reward: Reward for a well-formed wrong answer.
        correct_reward: Reward for a right answer.
    """

    max_turns = 1

    def __init__(
        self,
        num_count: int = 4,
        max_number: int = 100,
        max_target: int = 1000,
        format_reward: float = 0.1,
        correct_reward: float = 1.0,
    ) -> None:
        self.num_count = _positive("num_count", num_count, high=16)
        self.max_number = _positive("max_number", max_number, high=10**6)
        self.max_target = _positive("max_target", max_target, high=10**9)
        self.format_reward = float(format_reward)
        self.correct_reward = float(correct_reward)

    def sample(self, rng: random.Random) -> Problem:
        """A problem with TorchRL's query and ``target=..., numbers=...`` answer."""
        numbers = [rng.randint(1, self.max_number) for _ in range(self.num_count)]
        target = self._make_target(numbers, rng)
        query = (
            f"Using the numbers {numbers}, create an arithmetic expression that "
            f"equals {target}. You may use each number at most once. "
            f"Only use +, -, *, / and parentheses."
        )
        answer = f"target={target}, numbers={','.join(str(n) for n in numbers)}"
        return Problem(query=query, answer=answer, system=COUNTDOWN_SYSTEM_PROMPT)

    def _make_target(self, numbers: list[int], rng: random.Random) -> int:
        ops = ("+", "-", "*")
        pool = list(numbers)
        rng.shuffle(pool)
        result = pool[0]
        for n in pool[1:]:
            op = rng.choice(ops)
            result = result + n if op == "+" else result - n if op == "-" else result * n
        result = abs(result)
        if result == 0 or result > self.max_target:
            result = sum(numbers)
        return result

    def score(self, problem: Problem, response: str, turn: int) -> Outcome:
        """``CountdownRewardParser``'s reward; the dialog ends after one response."""
        reward, success = countdown_reward(
            problem.answer, response, self.format_reward, self.correct_reward
        )
        return Outcome(reward, terminated=True, success=success)


def countdown_reward(
    answer: str, response: str, format_reward: float = 0.1, correct_reward: float = 1.0
) -> tuple[float, bool]:
    """``(reward, success)`` of a countdown response, as TorchRL's ``CountdownRewardParser``."""
    response = response.removesuffix("<|im_end|>")
    match = re.search(r"<answer>(.*?)</answer>", response, re.DOTALL)
    expression = match.group(1).strip() if match else ""
    target = int(re.search(r"target\s*=\s*(\d+)", answer).group(1))  # type: ignore[union-attr]
    numbers_text = re.search(r"numbers\s*=\s*([\d,\s]+)", answer).group(1)  # type: ignore[union-attr]
    numbers = [int(n) for n in numbers_text.split(",") if n.strip()]
    if not expression:
        return 0.0, False
    if _valid_expression(expression, target, numbers):
        return correct_reward, True
    return format_reward, False


def _valid_expression(expression: str, target: int, numbers: list[int]) -> bool:
    """TorchRL's check (charset, numbers used at most once, value), evaluated without ``eval``."""
    if len(expression) > 1000 or not re.fullmatch(r"[\d\s\+\-\*/\(\)\.]+", expression):
        return False
    available = list(numbers)
    for n in (int(x) for x in re.findall(r"\d+", expression)):
        if n not in available:
            return False
        available.remove(n)
    try:
        value = _evaluate(ast.parse(expression, mode="eval").body)
    except (SyntaxError, ValueError, ZeroDivisionError, RecursionError, OverflowError):
        return False
    return abs(value - target) < 1e-9


def _evaluate(node: ast.AST) -> float:
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return float(node.value)  # type: ignore[arg-type]  # an int or a float, checked
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.UAdd | ast.USub):
        value = _evaluate(node.operand)
        return -value if isinstance(node.op, ast.USub) else value
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add | ast.Sub | ast.Mult | ast.Div):
        left, right = _evaluate(node.left), _evaluate(node.right)
        if isinstance(node.op, ast.Add):
            return left + right
        if isinstance(node.op, ast.Sub):
            return left - right
        if isinstance(node.op, ast.Mult):
            return left * right
        return left / right
    raise ValueError("only + - * / and parentheses are allowed")


class JsonlTask(_ExactMatch):
    """Problems read from a JSON-lines file, in order, cycling; exact-match reward.

    Args:
        path: One ``{"prompt": str, "answer": str}`` object per line.
        retries: Extra turns after a wrong answer.
    """

    def __init__(self, path: str, retries: int = 0) -> None:
        super().__init__(retries)
        self.problems = _read_jsonl(path)
        self.cursor = 0

    def sample(self, rng: random.Random) -> Problem:
        """The next line's problem (the file is cycled)."""
        problem = self.problems[self.cursor % len(self.problems)]
        self.cursor += 1
        return problem


def _read_jsonl(path: str) -> list[Problem]:
    if not os.path.isfile(path):
        raise TaskSpecError(f"task jsonl:{path}: no such file")
    if os.path.getsize(path) > _MAX_JSONL_BYTES:
        raise TaskSpecError(f"task jsonl:{path}: larger than {_MAX_JSONL_BYTES} bytes")
    problems = []
    with open(path, encoding="utf-8") as file:
        for number, line in enumerate(file, 1):
            if not line.strip():
                continue
            try:
                item = json.loads(line)
            except ValueError as exc:
                raise TaskSpecError(f"task jsonl:{path}:{number}: not JSON ({exc})") from None
            if (
                not isinstance(item, dict)
                or not isinstance(item.get("prompt"), str)
                or not isinstance(item.get("answer"), str)
            ):
                raise TaskSpecError(
                    f'task jsonl:{path}:{number}: expected {{"prompt": str, "answer": str}}'
                )
            problems.append(Problem(query=item["prompt"], answer=item["answer"]))
    if not problems:
        raise TaskSpecError(f"task jsonl:{path}: no problems in the file")
    return problems


_BUILT_IN: dict[str, Any] = {"arith": ArithTask, "reverse": ReverseTask, "countdown": CountdownTask}


def check_task_spec(spec: str) -> None:
    """Refuse a task spec that cannot name a task (without importing a user module).

    Raises:
        TaskSpecError: Naming the spec and what is wrong.
    """
    if not isinstance(spec, str):
        raise TaskSpecError(f"a task spec must be a string, got {type(spec).__name__}")
    if spec in _BUILT_IN:
        return
    if spec.startswith("jsonl:"):
        if not os.path.isfile(spec[6:]):
            raise TaskSpecError(f"task {spec!r}: no such file {spec[6:]!r}")
        return
    if not IMPORT_PATH_RE.match(spec):
        raise TaskSpecError(
            f"unknown task {spec!r}; expected one of {', '.join(TASK_NAMES)}, jsonl:PATH or "
            "package.module:factory"
        )


def build_task(spec: str, **kwargs: Any) -> Task:
    """Build a task from its spec and kwargs.

    An OmegaConf config among the kwargs that travelled as plain data is a ``DictConfig`` again
    (:func:`~common.plain_config.from_plain`).

    Raises:
        TaskSpecError: An unknown spec, bad kwargs, or a factory that fails or returns
            something without the task protocol.
    """
    check_task_spec(spec)
    kwargs = from_plain(kwargs)
    try:
        if spec in _BUILT_IN:
            task = _BUILT_IN[spec](**kwargs)
        elif spec.startswith("jsonl:"):
            task = JsonlTask(spec[6:], **kwargs)
        else:
            task = load_callable(spec)(**kwargs)
    except TaskSpecError:
        raise
    except (TypeError, ValueError, ImportError, AttributeError) as exc:
        raise TaskSpecError(f"task {spec!r}: {type(exc).__name__}: {exc}") from None
    if not isinstance(task, Task):
        raise TaskSpecError(
            f"task {spec!r} built a {type(task).__name__}, which lacks max_turns/sample/score"
        )
    max_turns = task.max_turns
    if not isinstance(max_turns, int) or isinstance(max_turns, bool) or max_turns < 1:
        raise TaskSpecError(f"task {spec!r}: max_turns must be an int >= 1, got {max_turns!r}")
    return task
