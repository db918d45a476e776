"""A fleet of actor servers started as local subprocesses, for training on one machine.

:class:`LocalFleet` runs ``python -m actor_service`` once per actor and never imports
``actor_service``: the actors are separate programs, as in a real deployment (what it
promises: ``docs/collector.md``, LocalFleet). Two choices need their reason here. Each
actor starts through a tiny launcher that sets ``PR_SET_PDEATHSIG`` before ``exec``
(which survives ``exec``), so the kernel kills the actors when the learner dies, even by
SIGKILL; unlike ``preexec_fn`` this is safe while gRPC threads run. Their stdout and
stderr go to anonymous temporary files, so no pipe can fill up and block an actor.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import re
import secrets
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from types import TracebackType
from typing import IO, Any

from common.config import (
    MAX_NUM_ENVS,
    MAX_SEED,
    MAX_WORKER_ID,
    WILDCARD_HOSTS,
    as_int,
    as_real,
    check_bind_host,
    check_token,
    host_port,
    positive_timeout,
)
from common.errors import (
    ActorUnavailableError,
    DeadlineError,
    SessionStateError,
    UnknownWorkerError,
)
from common.plain_config import to_plain

__all__ = ["LocalFleet", "check_int", "restart_seed"]

# Its line's end, not its start: a factory's own output without a newline may come before it.
_READY_RE = re.compile(rb"rlfleet-actor ready worker_id=(\d+) port=(\d+)\s*$", re.MULTILINE)
# Time an actor gets beyond its own grace period to finish exiting before SIGKILL.
_EXIT_MARGIN = 2.0
_POLL_INTERVAL = 0.02
_TAIL_BYTES = 4000

# Runs as `python -c _LAUNCHER <learner pid> <argv...>`: ask the kernel to SIGKILL us
# when the learner dies, check it has not died already, then become the actor.
_LAUNCHER = (
    "import ctypes, os, signal, sys\n"
    "ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL, 0, 0, 0)\n"
    "if os.getppid() != int(sys.argv[1]):\n"
    "    sys.exit(1)\n"
    "os.execv(sys.argv[2], sys.argv[2:])\n"
)


@dataclasses.dataclass
class _Actor:
    worker_id: int
    process: subprocess.Popen[bytes]
    stdout: IO[bytes]
    stderr: IO[bytes]
    port: int | None = None
    # The stderr tail, kept when the temporary files are closed.
    final_tail: str = ""


#: Bits of the seed a restarted actor draws (envs' seeds stay within a C int).
_RESTART_SEED_BITS = 30


def restart_seed() -> int:
    """A fresh random seed for an actor started again in a worker's place.

    With its first seed a restarted actor's envs would replay their trajectories, and the
    learner would take the experience it already had again, under new trajectory ids.
    """
    return secrets.randbits(_RESTART_SEED_BITS)


#: The longest value of an actor's flag (a factory's kwargs as JSON): Linux takes one
#: command-line argument of at most 128 KiB, its final NUL included (MAX_ARG_STRLEN).
MAX_ARGUMENT_BYTES = 128 * 1024 - 1

#: The policy of each kind of actor when none is given.
_DEFAULT_POLICY = {"env": "mlp", "torchrl": "random", "llm": "rlfleet:tiny-qwen2"}


def _env_flags(
    env: str | None,
    env_kwargs: Mapping[str, Any] | None,
    env_factory: str,
    *,
    callables: bool = False,
) -> dict[str, str]:
    """The ``rlfleet-actor`` flags of an env (gymnasium or TorchRL) actor's env.

    ``env`` may be None where it is not used: with an ``env_factory``, or ``callables``
    (a fleet whose envs come from the script's callables).

    Raises:
        TypeError: ``env`` or ``env_factory`` is not a string (an env object: each actor
            builds its own envs from a name).
    """
    if not isinstance(env_factory, str):
        raise TypeError(
            f"env_factory must be a string 'package.module:function', got a "
            f"{type(env_factory).__name__}"
        )
    if not isinstance(env, str) and not (env is None and (env_factory or callables)):
        raise TypeError(
            f"env must be a gymnasium id (a string), got a {type(env).__name__}: each actor "
            "builds its own envs; name a function that builds one with "
            "env_factory='package.module:function' (kind='torchrl' for a TorchRL env), or "
            "give RayFleet the script's create_env_fn="
        )
    flags = {"--env-kwargs": kwargs_json("env_kwargs", env_kwargs)}
    if env is not None:
        flags["--env"] = env
    if env_factory:
        flags["--env-factory"] = env_factory
    return flags


def kwargs_json(name: str, kwargs: Mapping[str, Any] | None) -> str:
    """A factory's keyword arguments as the JSON object an actor's flag takes (None: ``{}``).

    Configs (OmegaConf's) travel as plain data the actor rebuilds
    (:func:`~common.plain_config.to_plain`).

    Raises:
        TypeError: ``kwargs`` is not a mapping (a list of pairs, a string), or holds what
            JSON does not carry as it is (:func:`~common.plain_config.to_plain`).
        ValueError: Nested too deeply (:data:`~common.plain_config.MAX_DEPTH`).
    """
    if kwargs is None:
        return "{}"
    if not isinstance(kwargs, Mapping):
        raise TypeError(f"{name} must be a mapping of keyword arguments, got {kwargs!r:.80}")
    return json.dumps(to_plain(kwargs, name))


def actor_args(flags: Mapping[str, object], *, command_line: bool = True) -> list[str]:
    """``flags`` (each flag and its value) as an actor's arguments, ``--flag value`` pairs.

    Args:
        flags: The flags and their values.
        command_line: Whether the arguments go on a process's command line (False: parsed
            in the process, as RayFleet's actors of the script's callables do).

    Raises:
        ValueError: On a command line, a value longer than one argument holds
            (:data:`MAX_ARGUMENT_BYTES`), naming it: the actor's start would fail with
            ``Argument list too long``.
    """
    args = [str(part) for flag in flags.items() for part in flag]
    for flag, value in zip(args[::2], args[1::2], strict=True):
        size = len(value.encode())
        if command_line and size > MAX_ARGUMENT_BYTES:
            raise ValueError(
                f"{flag[2:].replace('-', '_')} is {size:,} bytes on the actor's command line "
                f"({flag}), more than the {MAX_ARGUMENT_BYTES:,} one argument holds: give the "
                "factory a path to a file of the large data (arrays, tables) instead"
            )
    return args


def task_flags(task: str, task_kwargs: Mapping[str, Any] | None) -> dict[str, str]:
    """The ``rlfleet-actor`` flags of an LLM actor's task (configs as for :func:`kwargs_json`)."""
    return {"--task": task, "--task-kwargs": kwargs_json("task_kwargs", task_kwargs)}


class LocalFleet:
    """Start ``num_actors`` actor servers on this machine and stop them on exit.

    Args:
        num_actors: Actors to start; their worker ids are ``0..num_actors-1`` unless
            ``worker_ids`` names them.
        env: Gymnasium id each actor runs (env and TorchRL-env actors; the latter wrap it
            in TorchRL's ``GymEnv``); None (or unused) with ``env_factory``.
        num_envs: Size of each actor's env pool (LLM actors: chat slots).
        policy: Policy factory of each actor (``"mlp"``, ``"random"`` or
            ``"package.module:function"``); TorchRL-env actors: ``"random"`` (the default)
            or a function called ``(env, **policy_kwargs)``; LLM actors: a model spec
            (``"rlfleet:tiny-qwen2"``, the default, or ``"hf:DIR"``).
        policy_kwargs: Keyword arguments of the policy factory (sent as JSON; a Hydra
            ``DictConfig`` among them, or as all of them, is sent as its plain data and is
            a ``DictConfig`` again for the factory where the actor has omegaconf).
        env_kwargs: Keyword arguments of ``gymnasium.make``, ``GymEnv`` or the env factory
            (sent as JSON, configs as for ``policy_kwargs``; env and TorchRL-env actors).
        env_factory: ``"package.module:function"`` building each actor's env instead of
            ``env`` (a gymnasium ``Env``, or a TorchRL ``EnvBase`` for ``kind="torchrl"``);
            the module must be importable by the actors (on their ``PYTHONPATH``).
        seed: Actor ``i`` is seeded with ``seed + i`` (at most 2**64 - 1); None: each draws one.
        host: Address the actors bind (addresses use loopback for ``0.0.0.0``).
        extra_args: More ``rlfleet-actor`` flags, appended last; not those the fleet sets
            (``--worker-id``, ``--port``, ``--host``, ``--seed``, ``--kind``, ``--token``:
            ``ValueError`` naming the argument to use).
        start_timeout: Seconds to wait for the next actor to report ready: the start fails
            when none became ready for that long (so a large fleet on a few cores, each
            actor's imports costing seconds of CPU, may take longer than it in all).
        grace_period: Seconds an actor may drain after SIGTERM; it is SIGKILLed when it
            has not exited ``2`` seconds after that.
        python: Interpreter that runs ``-m actor_service``.
        kind: ``"env"`` (gymnasium envs), ``"torchrl"`` (TorchRL envs and TensorDict
            policies; needs the ``torchrl`` extra) or ``"llm"`` (chat slots, a task and a
            language model).
        task: LLM actors: ``arith``, ``reverse``, ``countdown``, ``jsonl:PATH`` or
            ``package.module:factory``.
        task_kwargs: LLM actors: keyword arguments of the task (sent as JSON, configs as for
            ``policy_kwargs``).
        worker_ids: The actors' worker ids, ``num_actors`` distinct ints >= 0 (e.g. one
            learner rank's share of a fleet: ``range(rank, num_actors * world_size,
            world_size)``); None: ``0..num_actors-1``.
        token: A bearer token the actors require (given in their environment, never on
            their command line); a collector given the fleet sends it. None: the learner's
            ``RLFLEET_TOKEN``, which the actors inherit (no token when it is unset or empty).
            On a machine other users share, any of them can reach the actors' loopback ports.

    Start and restart actors from a thread that outlives the fleet (normally the
    main thread): Linux delivers the parent-death signal when that thread exits.

    Given to a collector (``GrpcCollector(fleet, ...)``) instead of its addresses, the
    fleet is the collector's: started if it was not, stopped by the collector's
    ``shutdown()``, also where a helper built the collector and returned it.

    Example::

        with LocalFleet(2, "CartPole-v1", num_envs=8, seed=1) as fleet:
            with GrpcCollector(fleet.addresses, frames_per_batch=1024) as collector:
                ...

        def make_collector() -> GrpcCollector:  # the fleet stops with the collector
            return GrpcCollector(LocalFleet(2, "CartPole-v1"), frames_per_batch=1024)

        with LocalFleet(2, kind="torchrl", env_factory="my_envs:make_env",
                        policy="my_envs:make_policy", num_envs=4, seed=0) as fleet:
            ...  # GrpcCollector(fleet.addresses, ...): TorchRL's batches

        with LocalFleet(2, kind="llm", task="arith", num_envs=8, seed=0) as fleet:
            ...  # GrpcLLMCollector(fleet.addresses, ...)
    """

    def __init__(
        self,
        num_actors: int,
        env: str | None = "CartPole-v1",
        num_envs: int = 8,
        policy: str | None = None,
        *,
        policy_kwargs: Mapping[str, Any] | None = None,
        env_kwargs: Mapping[str, Any] | None = None,
        seed: int | None = None,
        host: str = "127.0.0.1",
        extra_args: Sequence[str] = (),
        start_timeout: float = 60.0,
        grace_period: float = 5.0,
        python: str = sys.executable,
        kind: str = "env",
        task: str = "arith",
        task_kwargs: Mapping[str, Any] | None = None,
        env_factory: str = "",
        worker_ids: Sequence[int] | None = None,
        token: str | None = None,
    ) -> None:
        num_actors = check_int("num_actors", num_actors, 1)
        self.token = check_token(token if token is not None else _inherited_token())
        self.worker_ids = _worker_ids(num_actors, worker_ids)
        _check_fleet_args(num_envs, seed, start_timeout, grace_period, kind, extra_args)
        num_envs, seed = check_int("num_envs", num_envs, 1), fleet_seed(seed, self.worker_ids)
        if not isinstance(policy, str | None):
            raise TypeError(
                f"policy must name a factory the actors call ('mlp', 'random' or "
                f"'package.module:function'), got a {type(policy).__name__}; the learner's "
                "module goes to GrpcCollector(policy=...), which pushes its weights"
            )
        policy = policy or _DEFAULT_POLICY[kind]
        check_bind_host(host)
        self.num_actors = num_actors
        self.host = host
        self.start_timeout = float(start_timeout)
        self.grace_period = float(grace_period)
        self._python = python
        self._seed = seed
        flags = {
            "--host": host,
            "--num-envs": num_envs,
            "--policy": policy,
            "--policy-kwargs": kwargs_json("policy_kwargs", policy_kwargs),
            "--grace-period": grace_period,
        }
        if kind == "llm":  # chat slots, a task and a language model
            flags |= task_flags(task, task_kwargs)
        else:
            flags |= _env_flags(env, env_kwargs, env_factory)
        flags["--kind"] = kind
        self._common_args = actor_args(flags)
        self._extra_args = list(extra_args)
        self._actors: dict[int, _Actor] = {}
        self._state = "new"
        self._lock = threading.RLock()  # _state, _actors; reentrant: a signal handler's stop()
        self._pid = os.getpid()  # the process whose children the actors are (set by start())

    # ------------------------------------------------------------- lifecycle

    def start(self) -> LocalFleet:
        """Start every actor concurrently and wait until all report ready.

        Returns:
            The fleet itself.

        Raises:
            ActorUnavailableError: An actor exited before it was ready (the message
                names it and quotes its stderr); every other actor is stopped.
            DeadlineError: Actors still pending when none had become ready for
                ``start_timeout`` seconds.
            SessionStateError: The fleet was already started or stopped, or was stopped by
                another thread or a signal handler while it started (no actor is left
                running).
        """
        with self._lock:
            if self._state != "new":
                raise SessionStateError(f"LocalFleet.start() called on a {self._state} fleet")
            self._state, self._pid = "running", os.getpid()  # the actors: its children
        try:
            with self._said_when_stopped():
                for worker_id in self.worker_ids:
                    seed = None if self._seed is None else self._seed + worker_id
                    self._adopt(self._spawn(worker_id, port=0, seed=seed))
                self._wait_ready(list(self._actors.values()))
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """Stop every actor: SIGTERM, then SIGKILL after the grace period. Idempotent.

        Also from another thread, while one starts or restarts actors: every actor is
        reaped when it returns (a second call waits for the first), and the start fails.
        In a process forked from the one that started them (a child leaving a ``with``
        block), the fleet is only marked stopped: its actors serve the parent.
        """
        if os.getpid() != self._pid:  # the lock may be held by a thread the fork left behind
            self._state = "stopped"
            return
        with self._lock:
            if self._state == "stopped":
                return
            self._state = "stopped"
            self._stop_actors(list(self._actors.values()))

    def close(self) -> None:
        """:meth:`stop` under the name every fleet has (``learner_client.ActorFleet``)."""
        self.stop()

    @property
    def started(self) -> bool:
        """Whether :meth:`start` was called (the fleet may have been stopped since)."""
        return self._state != "new"

    def __enter__(self) -> LocalFleet:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # ----------------------------------------------------------- inspection

    @property
    def addresses(self) -> list[str]:
        """``host:port`` of every actor, in worker-id order."""
        self._check_running()
        return [self._address(actor) for actor in self._actors.values()]

    @property
    def pids(self) -> list[int]:
        """Process id of every actor, in worker-id order."""
        return [actor.process.pid for actor in self._actors.values()]

    def is_alive(self, worker_id: int) -> bool:
        """Whether the actor with ``worker_id`` is still running."""
        return self._actor(worker_id).process.poll() is None

    def stderr_tail(self, worker_id: int, max_bytes: int = _TAIL_BYTES) -> str:
        """What the actor last wrote on stderr (its log): ``max_bytes``, 4000 once stopped."""
        with self._lock:  # not while stop() closes the file
            actor = self._actor(worker_id)
            return actor.final_tail if actor.stderr.closed else _tail(actor.stderr, max_bytes)

    # -------------------------------------------------------- fault helpers

    def kill(self, worker_id: int, sig: int = signal.SIGKILL) -> int:
        """Send ``sig`` to one actor and wait for it to exit (for fault tests).

        With SIGKILL the actor dies at once, as on a crash; with SIGTERM it drains.
        It stays down until :meth:`restart`.

        Args:
            worker_id: The actor to signal.
            sig: The signal; SIGKILL by default.

        Returns:
            The actor's exit code (negative: killed by that signal).

        Raises:
            DeadlineError: It did not exit within the grace period (plus a margin).
        """
        self._check_running()
        actor = self._actor(worker_id)
        with contextlib.suppress(ProcessLookupError):
            actor.process.send_signal(sig)
        try:
            return actor.process.wait(timeout=self.grace_period + _EXIT_MARGIN)
        except subprocess.TimeoutExpired:
            raise DeadlineError(
                f"actor worker_id={worker_id} (pid {actor.process.pid}) did not exit within "
                f"{self.grace_period + _EXIT_MARGIN:.1f}s of signal {sig}"
            ) from None

    def restart(self, worker_id: int) -> str:
        """Stop one actor (if running) and start a fresh one in its place.

        The new actor has the same worker id and port, so a collector that reconnects to
        the old address finds it; it has a new epoch, initial weights and, when the fleet
        was seeded, a fresh seed (:func:`restart_seed`): with its first one its envs would
        replay, and the learner would take the trajectories it already sent again.

        Args:
            worker_id: The actor to replace.

        Returns:
            The actor's address (unchanged).

        Raises:
            ActorUnavailableError: The new actor exited before it was ready.
            DeadlineError: It was not ready within ``start_timeout``.
            SessionStateError: The fleet was stopped (also meanwhile, by another thread or a
                signal handler).
        """
        with self._lock:
            self._check_running()
            old = self._actor(worker_id)
            self._stop_actors([old])
        seed = None if self._seed is None else restart_seed()
        with self._said_when_stopped():
            new = self._spawn(worker_id, port=old.port or 0, seed=seed)
            self._adopt(new)
            self._wait_ready([new])
        return self._address(new)

    # ------------------------------------------------------------ internals

    @contextlib.contextmanager
    def _said_when_stopped(self) -> Iterator[None]:
        """A start or restart step failing once the fleet was stopped meanwhile: SessionStateError.

        Stopped by another thread, or by a signal handler on this one (the lock is
        reentrant) while the step read the files the stop closed.
        """
        try:
            yield
        except Exception as exc:
            if self._state != "stopped" or isinstance(exc, SessionStateError):
                raise
            raise SessionStateError("the fleet was stopped while its actors started") from exc

    def _spawn(self, worker_id: int, *, port: int, seed: int | None) -> _Actor:
        argv = [
            self._python,
            "-m",
            "actor_service",
            *self._common_args,
            "--port",
            str(port),
            "--worker-id",
            str(worker_id),
        ]
        if seed is not None:
            argv += ["--seed", str(seed)]
        argv += self._extra_args
        if sys.platform.startswith("linux"):
            argv = [self._python, "-c", _LAUNCHER, str(os.getpid()), *argv]
        stdout = tempfile.TemporaryFile()  # noqa: SIM115 - closed in _stop_actors
        stderr = tempfile.TemporaryFile()  # noqa: SIM115 - closed in _stop_actors
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        if self.token is not None:
            env["RLFLEET_TOKEN"] = self.token
        try:
            process = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=stdout,
                stderr=stderr,
                env=env,
                start_new_session=True,
            )
        except BaseException:
            stdout.close()
            stderr.close()
            raise
        return _Actor(worker_id, process, stdout, stderr)

    def _adopt(self, actor: _Actor) -> None:
        """Make a started ``actor`` the fleet's, unless another thread stopped the fleet.

        Raises:
            SessionStateError: The fleet was stopped meanwhile (``actor`` is stopped too).
        """
        with self._lock:
            if self._state == "running":
                self._actors[actor.worker_id] = actor
                return
        self._stop_actors([actor])
        raise SessionStateError(
            f"the fleet was stopped while actor worker_id={actor.worker_id} started"
        )

    def _wait_ready(self, actors: list[_Actor]) -> None:
        # start_timeout bounds a wait without progress: a large fleet on a few cores
        # (each actor's imports cost seconds of CPU) may take longer than it in all.
        deadline = time.monotonic() + self.start_timeout
        pending = list(actors)
        while pending:
            with self._lock:  # stop() closes the actors' files under it
                if self._state != "running":
                    raise SessionStateError("the fleet was stopped while its actors started")
                if self._found_ready(pending):
                    deadline = time.monotonic() + self.start_timeout
                if pending and time.monotonic() > deadline:
                    names = ", ".join(f"worker_id={a.worker_id}" for a in pending)
                    tails = "\n".join(
                        f"--- worker_id={a.worker_id} stderr tail:\n{_tail(a.stderr, _TAIL_BYTES)}"
                        for a in pending
                    )
                    raise DeadlineError(
                        f"no actor became ready for {self.start_timeout:.1f}s (start_timeout); "
                        f"not ready: {names}\n{tails}"
                    )
            if pending:
                time.sleep(_POLL_INTERVAL)

    def _found_ready(self, pending: list[_Actor]) -> bool:
        """Take the actors of ``pending`` that reported ready out of it; whether any did.

        Raises:
            ActorUnavailableError: One exited before it was ready.
        """
        found = False
        for actor in list(pending):
            who = f"actor worker_id={actor.worker_id}"
            actor.port = ready_port(who, actor.process, actor.stdout, actor.stderr)
            if actor.port is not None:
                pending.remove(actor)
                found = True
        return found

    def _stop_actors(self, actors: list[_Actor]) -> None:
        try:
            for actor in actors:
                if actor.process.poll() is None:
                    with contextlib.suppress(ProcessLookupError):
                        actor.process.send_signal(signal.SIGTERM)
            deadline = time.monotonic() + self.grace_period + _EXIT_MARGIN
            for actor in actors:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    actor.process.wait(timeout=max(0.0, deadline - time.monotonic()))
        finally:
            # Also reached on Ctrl-C or an error while waiting: nothing may outlive us.
            for actor in actors:
                if actor.process.poll() is None:
                    with contextlib.suppress(ProcessLookupError):
                        actor.process.kill()
                    actor.process.wait()
                if not actor.stderr.closed:
                    actor.final_tail = _tail(actor.stderr, _TAIL_BYTES)
                actor.stdout.close()
                actor.stderr.close()

    def _actor(self, worker_id: int) -> _Actor:
        try:
            return self._actors[worker_id]
        except KeyError:
            raise UnknownWorkerError(
                f"no actor with worker_id={worker_id!r}; this fleet has {self.worker_ids}"
            ) from None

    def _check_running(self) -> None:
        if self._state == "new":
            raise SessionStateError(
                "the fleet is not started; use it inside `with` or after start()"
            )
        if self._state != "running":
            raise SessionStateError(
                f"the fleet is {self._state}: stopped by stop(), by leaving its `with`, or by "
                "the shutdown of a collector it was given (a collector given the fleet object "
                "owns it; give it `fleet.addresses` to use the fleet after that collector)"
            )

    def _address(self, actor: _Actor) -> str:
        if actor.port is None:  # only a ready actor's address is given out
            raise SessionStateError(f"actor worker_id={actor.worker_id} is not ready")
        if self.host in WILDCARD_HOSTS:  # dialed at this machine's loopback of its family
            return host_port("127.0.0.1" if self.host == "0.0.0.0" else "::1", actor.port)
        return host_port(self.host, actor.port)


def _worker_ids(num_actors: int, worker_ids: Sequence[int] | None) -> list[int]:
    """``worker_ids`` checked, or ``0..num_actors-1``.

    Checked before anything starts: ``num_actors`` distinct ints in ``[0, MAX_WORKER_ID]``
    (an actor refuses a larger id).
    """
    if num_actors > MAX_WORKER_ID + 1:
        raise ValueError(
            f"num_actors must be at most {MAX_WORKER_ID + 1} (worker ids 0..{MAX_WORKER_ID}), "
            f"got {num_actors}"
        )
    if worker_ids is None:
        return list(range(num_actors))
    if not isinstance(worker_ids, Iterable):
        raise TypeError(f"worker_ids must be a sequence of {num_actors} ints, got {worker_ids!r}")
    ids = [check_int("worker_ids[...]", worker_id, 0) for worker_id in worker_ids]
    if len(ids) != num_actors or len(set(ids)) != len(ids):
        raise ValueError(f"worker_ids must be {num_actors} distinct ints, got {ids}")
    if max(ids) > MAX_WORKER_ID:
        raise ValueError(f"worker_ids must be at most {MAX_WORKER_ID}, got {max(ids)}")
    return ids


def _check_fleet_args(
    num_envs: int,
    seed: int | None,
    start_timeout: float,
    grace_period: float,
    kind: str,
    extra_args: Sequence[str],
) -> None:
    """The checks of the arguments every fleet takes (``LocalFleet``'s and ``RayFleet``'s)."""
    check_int("num_envs", num_envs, 1, MAX_NUM_ENVS)
    if seed is not None:
        check_int("seed", seed, 0)  # its top: fleet_seed, which knows the worker ids
    _check_seconds("start_timeout", start_timeout, zero=False, forever=True)
    _check_seconds("grace_period", grace_period, zero=True, forever=False)
    if kind not in _DEFAULT_POLICY:
        raise ValueError(f"kind must be one of {sorted(_DEFAULT_POLICY)}, got {kind!r}")
    if isinstance(extra_args, str) or not isinstance(extra_args, Iterable):
        raise TypeError(f"extra_args must be a sequence of strings, got {extra_args!r:.80}")
    for arg in extra_args:
        _check_extra_arg(arg)


#: The ``rlfleet-actor`` flags a fleet sets from its own arguments, which ``extra_args``
#: may not override: the fleet's worker ids, addresses and seeds would no longer be its
#: actors', and a token on a command line is visible to every user of the host.
_FLEET_FLAGS = {
    "--worker-id": "worker_ids=",
    "--port": "nothing (the fleet picks each actor's port)",
    "--host": "host=",
    "--seed": "seed=",
    "--kind": "kind=",
    "--token": "token= (the actors get it in their environment, never on a command line)",
}


def _check_extra_arg(arg: object) -> None:
    """One of ``extra_args``: a string, not a flag the fleet sets (nor its abbreviation)."""
    if not isinstance(arg, str):
        raise TypeError(f"extra_args must be a sequence of strings, got an item {arg!r}")
    name = arg.split("=", 1)[0]
    if not name.startswith("--") or len(name) < 3:
        return
    for flag, instead in _FLEET_FLAGS.items():
        if flag.startswith(name):  # argparse takes an unambiguous prefix for the flag
            raise ValueError(f"extra_args may not set {flag} (got {arg!r}); pass {instead}")


def ready_port(
    who: str, process: subprocess.Popen[bytes], stdout: IO[bytes], stderr: IO[bytes]
) -> int | None:
    """The port an actor server's ready line gives; None while it starts.

    Raises:
        ActorUnavailableError: It exited before it was ready (:func:`exit_message`).
    """
    match = _READY_RE.search(_head(stdout))
    if match:
        return int(match.group(2))
    if process.poll() is not None:
        raise ActorUnavailableError(
            exit_message(who, process.returncode, _tail(stderr, _TAIL_BYTES))
        )
    return None


def exit_message(who: str, code: int | None, tail: str) -> str:
    """Why an actor server exited before it was ready: its own error line first, then its log.

    The log opens with the server's config; the cause is its last error line (argparse's
    ``rlfleet-actor: error:``, or the ``actor.start_failed`` event).
    """
    lines = tail.splitlines()
    causes = [line for line in lines if "rlfleet-actor: error:" in line or "start_failed" in line]
    cause = (causes or [line for line in lines if line.strip()] or ["(no output)"])[-1].strip()
    return f"{who} exited with code {code} before it was ready: {cause}\nstderr tail:\n{tail}"


def _inherited_token() -> str | None:
    """The ``RLFLEET_TOKEN`` the actors would inherit from this process (None: unset or empty)."""
    return os.environ.get("RLFLEET_TOKEN") or None


def fleet_seed(seed: object, worker_ids: Sequence[int]) -> int | None:
    """``seed`` as an int, checked so that every actor's ``seed + worker_id`` is a seed.

    Raises:
        TypeError: Not an integer (Python's, numpy's, a one-element tensor; not a bool).
        ValueError: Below 0, or ``seed + max(worker_ids)`` above ``2**64 - 1``.
    """
    if seed is None:
        return None
    value = check_int("seed", seed, 0)
    if value + max(worker_ids, default=0) > MAX_SEED:
        raise ValueError(
            f"seed {value} + worker_id {max(worker_ids)} is above 2**64 - 1, the largest "
            "seed (actor i is seeded seed + i)"
        )
    return value


def check_int(name: str, value: object, low: int, high: int | None = None) -> int:
    """``value`` as an int (any integer a script computes: numpy's, a one-element tensor).

    Raises:
        TypeError: ``value`` is not an integer (naming ``name``).
        ValueError: It is below ``low`` or above ``high``.
    """
    number = as_int(value)
    if number is None:
        raise TypeError(f"{name} must be an int, got {value!r}")
    if number < low or (high is not None and number > high):
        bounds = f">= {low}" if high is None else f"in [{low}, {high}]"
        raise ValueError(f"{name} must be an int {bounds}, got {value!r}")
    return number


def _check_seconds(name: str, value: object, *, zero: bool, forever: bool) -> None:
    """``value`` is seconds above 0 (0 too with ``zero``), at most ``MAX_TIMEOUT_S``.

    With ``forever``, ``float("inf")`` is taken too (no deadline); finite values keep the
    bound of every other timeout (:func:`~common.config.positive_timeout`).
    """
    if forever and value == math.inf:
        return
    if zero and as_real(value) == 0:
        return
    positive_timeout(name, value)


def _head(file: IO[bytes]) -> bytes:
    # The ready line is the actor's first stdout line; it never needs more than this.
    return os.pread(file.fileno(), 4096, 0)


def _tail(file: IO[bytes], max_bytes: int) -> str:
    size = os.fstat(file.fileno()).st_size
    start = max(0, size - max_bytes)
    return os.pread(file.fileno(), size - start, start).decode("utf-8", "replace")
