"""A fleet of actor servers placed on a Ray cluster, one Ray actor each.

:class:`RayFleet` asks Ray to place ``num_actors`` Ray actors with the resources each
needs (``remote_configs``); each Ray actor starts the actor server as a child process on
its node, ``python -m actor_service`` as :class:`LocalFleet` does (``actor_service`` is
never imported here), bound to the node's IP on a free port, and reports its address.
Ray places and restarts; the data path stays gRPC, never Ray's object store.

Given the script's own callables instead (``create_env_fn``: lambdas, closures, TorchRL env
objects; ``policy``: a ``TensorDictModuleBase``), each Ray actor serves the actor server
in-process instead (:class:`_InProcessHost`): Ray ships the callables to it with its own
serialisation (Ray's channel between the learner and its Ray actors; the gRPC wire stays
free of pickles), and the Ray actor builds a ``torchrl``-kind server from them. The actor
code is named there, inside the Ray worker, never imported by ``learner_client``.

Ray is imported inside the methods only (the ``rlfleet[ray]`` extra), so ``learner_client``
loads without it; a fleet that needs it and does not find it raises an ``ImportError``
naming the extra. The child dies with its Ray actor: it is started through
:class:`LocalFleet`'s launcher, which sets ``PR_SET_PDEATHSIG`` before ``exec``, so the kernel
kills the server when the Ray worker process dies, even by SIGKILL; a Ray actor restarted
by Ray (``max_restarts``) starts a new server, on a new port, maybe on another node; a
collector given the fleet itself follows it there (:meth:`RayFleet.live_addresses`).
"""

from __future__ import annotations

import contextlib
import importlib
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from types import TracebackType
from typing import IO, Any

from common.config import WILDCARD_HOSTS, check_token, host_port
from common.errors import ActorUnavailableError, DeadlineError, SessionStateError
from learner_client._local_fleet import (
    _DEFAULT_POLICY,
    _EXIT_MARGIN,
    _LAUNCHER,
    _POLL_INTERVAL,
    _TAIL_BYTES,
    _check_fleet_args,
    _env_flags,
    _inherited_token,
    _tail,
    _worker_ids,
    actor_args,
    check_int,
    fleet_seed,
    kwargs_json,
    ready_port,
    restart_seed,
    task_flags,
)
from learner_client._ray_runtime import RayLease, ray_session

__all__ = ["RayFleet", "check_ray_args"]

#: The options a Ray actor takes from ``remote_configs`` when none are given.
_DEFAULT_REMOTE_CONFIG: dict[str, Any] = {"num_cpus": 1}
#: Seconds between asking again an actor that Ray is restarting.
_RESTART_POLL = 0.2
#: Seconds allowed for a Ray actor's own calls (stop, address) beyond the server's timeouts.
_CALL_MARGIN = 10.0
#: Seconds :meth:`RayFleet.live_addresses` waits for the actors to answer.
_LIVE_TIMEOUT = 2.0
#: The actor side's package, which an in-process Ray actor imports by name on its node.
_ACTOR_PACKAGE = "actor_service"


def _incarnation_seed(ray: Any, seed: int | None) -> int | None:
    """``seed``, or a fresh one for a Ray actor that Ray restarted (its envs must not replay)."""
    if seed is not None and ray.get_runtime_context().was_current_actor_reconstructed:
        return restart_seed()
    return seed


class _ServerHost:
    """The body of each Ray actor: runs one actor server as a child process on its node.

    Created by Ray on the node it places the actor on (and again there or elsewhere when
    Ray restarts it): ``argv`` is the server's command line without ``--host`` and
    ``--seed``, which this adds (the node's IP unless ``host`` names one; ``seed``). A Ray
    actor that Ray restarted draws a fresh seed instead: with the first one its envs would
    replay the trajectories they already sent (the learner would train on them twice).
    """

    def __init__(
        self, argv: list[str], host: str | None, seed: int | None = None, token: str | None = None
    ) -> None:
        import ray

        self.node_ip = ray.util.get_node_ip_address()
        self.host = host or self.node_ip
        self.dialed = _dialed_host(self.host, self.node_ip)
        self.seed = seed = _incarnation_seed(ray, seed)
        if seed is not None:
            argv = [*argv, "--seed", str(seed)]
        python = argv[0] or sys.executable
        argv = [python, "-c", _LAUNCHER, str(os.getpid()), python, *argv[1:], "--host", self.host]
        self.stdout: IO[bytes] = tempfile.TemporaryFile()  # noqa: SIM115 - closed in stop
        self.stderr: IO[bytes] = tempfile.TemporaryFile()  # noqa: SIM115 - closed in stop
        env = {**_server_environ(token), "PYTHONUNBUFFERED": "1"}
        self.process = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=self.stdout,
            stderr=self.stderr,
            env=env,
            start_new_session=True,
        )
        self.port: int | None = None

    def ready(self, timeout: float) -> tuple[str, int, int, int]:
        """Wait for the server's ready line: ``(host, port, server pid, Ray worker pid)``."""
        deadline = time.monotonic() + timeout
        who = f"actor server on {self.node_ip}"
        while self.port is None:
            self.port = ready_port(who, self.process, self.stdout, self.stderr)
            if self.port is None and time.monotonic() > deadline:
                raise DeadlineError(
                    f"{who} not ready after {timeout:.1f}s; "
                    f"stderr tail:\n{_tail(self.stderr, _TAIL_BYTES)}"
                )
            if self.port is None:
                time.sleep(_POLL_INTERVAL)
        return self.dialed, self.port, self.process.pid, os.getpid()

    def is_alive(self) -> bool:
        """Whether the server process is still running."""
        return self.process.poll() is None

    def stderr_tail(self, max_bytes: int) -> str:
        """What the server last wrote on stderr (its log)."""
        return "" if self.stderr.closed else _tail(self.stderr, max_bytes)

    def stop(self, grace_period: float) -> int:
        """SIGTERM the server, SIGKILL it ``2`` s after its grace period; its exit code."""
        if self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=grace_period + _EXIT_MARGIN)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.stdout.close()
        self.stderr.close()
        return self.process.returncode


class _InProcessHost:
    """The body of each Ray actor of a fleet given callables: the actor server in-process.

    ``argv`` is the server's command line as :class:`_ServerHost` takes it; its flags are
    read by the actor side's own parser, then the env factory and the policy are set to the
    objects Ray shipped here (``env_fn``: a callable or a TorchRL env; ``policy``: a
    ``TensorDictModuleBase``, or ``policy_factory``, TorchRL's, called here to build it, or
    neither, for the flags' policy). The actor side is imported
    by name, here in the Ray worker. A server that fails to start is reported by
    :meth:`ready`, with the traceback it raised on this node.
    """

    def __init__(
        self,
        argv: list[str],
        host: str | None,
        seed: int | None,
        env_fn: Callable[..., Any],
        policy: Any = None,
        policy_factory: Callable[[], Any] | None = None,
        token: str | None = None,
    ) -> None:
        import ray

        self.node_ip = ray.util.get_node_ip_address()
        self.host = host or self.node_ip
        self.dialed = _dialed_host(self.host, self.node_ip)
        self.seed = seed = _incarnation_seed(ray, seed)
        flags = [*argv[3:], "--host", self.host]
        if seed is not None:
            flags += ["--seed", str(seed)]
        self.server: Any = None
        self.failure = ""
        try:
            self.server = _serve_in_process(flags, env_fn, policy, policy_factory, token)
        except BaseException as exc:  # reported by ready(), with this node's traceback
            self.failure = (
                f"{type(exc).__name__}: {exc}\nthe actor's traceback (on {self.node_ip}):\n"
                f"{traceback.format_exc()}"
            )

    def ready(self, timeout: float) -> tuple[str, int, int, int]:
        """``(host, port, pid, pid)``: the server and its Ray actor are one process."""
        del timeout  # the server was started (or failed) in __init__
        if self.server is None:
            raise ActorUnavailableError(
                f"actor server on {self.node_ip} failed to start: {self.failure}"
            )
        return self.dialed, int(self.server.port), os.getpid(), os.getpid()

    def is_alive(self) -> bool:
        """Whether the server was started and not stopped."""
        return self.server is not None

    def stderr_tail(self, max_bytes: int) -> str:
        """Why the server failed to start, if it did (its log goes to the Ray worker's)."""
        return self.failure[-max_bytes:]

    def stop(self, grace_period: float) -> int:
        """Stop the server (drain within ``grace_period``); 0."""
        server, self.server = self.server, None
        if server is not None:
            server.stop(grace_period)
        return 0


def _server_environ(token: str | None) -> dict[str, str]:
    """The environment an actor server reads: its Ray actor's, with the fleet's token if any.

    The token travels in the Ray actor's arguments and reaches the server through its
    environment, never its command line. A fleet without one leaves the Ray actor's own
    ``RLFLEET_TOKEN`` (a node's, or a ``runtime_env``'s) in force: the servers then require
    a token the collector must be given (``token=``), never none.
    """
    environ = dict(os.environ)
    if token:
        environ["RLFLEET_TOKEN"] = token
    return environ


def _serve_in_process(
    flags: list[str],
    env_fn: Callable[..., Any],
    policy: Any,
    policy_factory: Callable[[], Any] | None = None,
    token: str | None = None,
) -> Any:
    """Start a ``torchrl``-kind server from ``flags`` with in-memory factories; its thread."""
    import dataclasses

    import torch

    actor = importlib.import_module(_ACTOR_PACKAGE)
    config = actor.parse_config(flags, _server_environ(token))
    config = dataclasses.replace(
        config, env_pool=dataclasses.replace(config.env_pool, env_factory=env_fn)
    )
    if policy is not None or policy_factory is not None:
        build = (lambda env: policy) if policy_factory is None else (lambda env: policy_factory())
        spec = actor.ModelSpec(config.models[0].model_id, build)
        config = dataclasses.replace(config, models=(spec, *config.models[1:]))
    torch.set_num_threads(config.torch_threads)
    return actor.create_server(config).run_in_thread()


class RayFleet:
    """Place ``num_actors`` actor servers on a Ray cluster and stop them on exit.

    Takes :class:`LocalFleet`'s arguments (``kind``, env and policy factories,
    ``num_envs``, ``seed``, ``worker_ids``; the factories must be importable on every node)
    and those of TorchRL's ``RayCollector`` that say where actors go. Or the script's own
    callables (``create_env_fn``, and ``policy`` as a module), shipped to the nodes by Ray:
    then each Ray actor serves a ``torchrl``-kind actor in-process, built from them.

    Args:
        num_actors: Actors to place; worker ids ``0..num_actors-1`` unless ``worker_ids``.
        env, num_envs, policy, policy_kwargs, env_kwargs, env_factory, seed, kind, task,
            task_kwargs, worker_ids, extra_args, grace_period: As for :class:`LocalFleet`
            (worker ``i`` is seeded ``seed + i``; a Ray actor that Ray restarted draws a
            fresh random seed, so that it does not replay its envs).
        start_timeout: Seconds for every actor to be placed and ready (the cluster's
            nodes start theirs in parallel; ``LocalFleet``'s bounds a stall instead).
        ray_init_config: Keyword arguments of ``ray.init`` when Ray is not initialised in
            this process yet (``{"address": "auto"}`` attaches to a running cluster; none
            starts a local one, without its dashboard). An initialised Ray is reused.
        remote_configs: Ray actor options (``num_cpus``, ``num_gpus``, ``memory``,
            ``resources``, ``scheduling_strategy``, ``max_restarts``, ...): one dict for
            every actor or a sequence of one per actor. Default ``{"num_cpus": 1}``.
        shutdown_ray: Shut Ray down on stop even when no fleet initialised it (when one
            did, the last to stop does). Ray stays up while another fleet (or drop-in
            collector) of this process still uses it, and stops with the last.
        host: Address each server binds; None: its node's IP (``ray.util.get_node_ip_address``).
            A wildcard (``0.0.0.0``, ``::``) binds every interface; its address is the node's IP.
        python: Interpreter that runs ``-m actor_service`` on the nodes; None: the Ray
            worker's own.
        create_env_fn: The callable form: what builds each actor's envs, in memory (a
            lambda, a closure, a TorchRL ``EnvBase`` copied for each env), one for every
            actor or a sequence of one per actor; called with ``env_kwargs``. The actors
            are of kind ``torchrl`` and serve in their Ray actor's process; ``policy`` may
            then be a ``tensordict.nn.TensorDictModuleBase`` object (None: random actions;
            a string: a factory as above). ``env``, ``env_factory`` and ``python`` are not
            used.
        policy_factory: With ``create_env_fn``: TorchRL's callable (or one per actor) that
            returns the policy, called with no argument in each Ray actor's process (in
            place of ``policy``, which must then be None).
        token: A bearer token the actors require, as for :class:`LocalFleet` (a collector
            given the fleet sends it); it reaches each server in its environment, never on
            a command line. None: the learner's ``RLFLEET_TOKEN``; when that is unset or
            empty, a Ray actor's own (its node's, or ``runtime_env``'s) stays in force, and
            the collector must then be given it (``token=``).

    Example::

        with RayFleet(2, "CartPole-v1", num_envs=8, seed=1,
                      ray_init_config={"address": "auto"},
                      remote_configs={"num_cpus": 2, "max_restarts": 3}) as fleet:
            with GrpcCollector(fleet, frames_per_batch=1024) as collector:  # follows restarts
                ...
    """

    #: The Ray connection its actors belong to (:func:`ray_session`, when it takes its lease).
    _session: str | None = None

    def __init__(
        self,
        num_actors: int,
        env: str | None = "CartPole-v1",
        num_envs: int = 8,
        policy: str | Any = None,
        *,
        policy_kwargs: Mapping[str, Any] | None = None,
        env_kwargs: Mapping[str, Any] | None = None,
        seed: int | None = None,
        extra_args: Sequence[str] = (),
        start_timeout: float = 120.0,
        grace_period: float = 5.0,
        kind: str = "env",
        task: str = "arith",
        task_kwargs: Mapping[str, Any] | None = None,
        env_factory: str = "",
        worker_ids: Sequence[int] | None = None,
        ray_init_config: Mapping[str, Any] | None = None,
        remote_configs: Mapping[str, Any] | Sequence[Mapping[str, Any]] | None = None,
        shutdown_ray: bool = False,
        host: str | None = None,
        python: str | None = None,
        create_env_fn: Callable[..., Any] | Sequence[Callable[..., Any]] | None = None,
        policy_factory: Callable[[], Any] | Sequence[Callable[[], Any]] | None = None,
        token: str | None = None,
    ) -> None:
        num_actors = check_int("num_actors", num_actors, 1)
        self.token = check_token(token if token is not None else _inherited_token())
        self._env_fns = _per_actor("create_env_fn", create_env_fn, num_actors)
        self._policy_module = None if isinstance(policy, str | None) else policy
        self._factories = _policy_factories(policy_factory, policy, create_env_fn, num_actors)
        kind = _kind_of(kind, self._env_fns is not None, self._policy_module)
        self.worker_ids = _worker_ids(num_actors, worker_ids)
        _check_fleet_args(num_envs, seed, start_timeout, grace_period, kind, extra_args)
        self.num_actors = num_actors
        self.start_timeout = float(start_timeout)
        self.grace_period = float(grace_period)
        self.host = host
        self.remote_configs = _remote_configs(remote_configs, num_actors)
        check_ray_args(ray_init_config, host, python)
        self._ray_init_config = dict(ray_init_config or {})
        self._shutdown_ray, self._python = shutdown_ray, python
        self._seed = fleet_seed(seed, self.worker_ids)
        flags = {
            "--num-envs": check_int("num_envs", num_envs, 1),
            "--policy": policy if isinstance(policy, str) and policy else _DEFAULT_POLICY[kind],
            "--policy-kwargs": kwargs_json("policy_kwargs", policy_kwargs),
            "--grace-period": grace_period,
        }
        if kind == "llm":
            flags |= task_flags(task, task_kwargs)
        else:
            flags |= _env_flags(env, env_kwargs, env_factory, callables=bool(self._env_fns))
        flags["--kind"] = kind
        self._common_args = actor_args(flags, command_line=self._env_fns is None)
        self._extra_args = list(extra_args)
        self._handles: dict[int, Any] = {}
        self._leased = False  # holds one of this process's leases on Ray (RayLease)
        self._state, self._lock = "new", threading.RLock()  # guards _state, _handles, _leased

    # ------------------------------------------------------------- lifecycle

    def start(self) -> RayFleet:
        """Initialise Ray if needed, place every actor and wait until all report ready.

        Returns:
            The fleet itself.

        Raises:
            ActorUnavailableError: A server exited before it was ready (its stderr
                quoted); every Ray actor is stopped.
            DeadlineError: An actor was not placed and ready within ``start_timeout``.
            SessionStateError: The fleet was already started or stopped, or was stopped by
                another thread while it placed its actors (none is left running).
        """
        with self._lock:
            if self._state != "new":
                raise SessionStateError(f"RayFleet.start() called on a {self._state} fleet")
            self._state = "running"
        try:
            ray = self._init_ray()
            host_class = ray.remote(_ServerHost if self._env_fns is None else _InProcessHost)
            for i, (worker_id, options) in enumerate(
                zip(self.worker_ids, self.remote_configs, strict=True)
            ):
                args: list[Any] = [self._argv(worker_id), self.host, self._seed_of(worker_id)]
                if self._env_fns is not None:
                    args += [self._env_fns[i], self._policy_module, self._factories[i]]
                self._place(worker_id, host_class.options(**options), args)
            self._ready(list(self._handles))
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """Stop every server (SIGTERM, then SIGKILL) and kill its Ray actor. Idempotent.

        Ray itself is shut down by the last fleet of this process to stop, if a fleet
        initialised it or one asked (``shutdown_ray``). After the script's own
        ``ray.shutdown()`` the actors are gone with it: nothing is called on them. Also from
        another thread while one starts the fleet (a second call waits for the first).
        """
        with self._lock:  # start() places no more actors once this ran
            if self._state == "stopped":
                return
            self._state = "stopped"
            if not self._leased:
                return
            import ray

            try:
                if self._ray_up():  # after the script's ray.shutdown() its actors are gone
                    self._stop_handles(ray)
            finally:
                self._leased = False
                RayLease.release(self._shutdown_ray, self._session)

    def _stop_handles(self, ray: Any) -> None:
        """Stop every server, then kill its Ray actor and wait until it answers as dead."""
        handles = list(self._handles.values())
        try:
            with contextlib.suppress(Exception):
                stops = [handle.stop.remote(self.grace_period) for handle in handles]
                ray.wait(stops, num_returns=len(stops), timeout=self.grace_period + _CALL_MARGIN)
        finally:
            for handle in handles:
                with contextlib.suppress(Exception):
                    ray.kill(handle, no_restart=True)
            _await_death(ray, handles, self.grace_period + _CALL_MARGIN)

    def close(self) -> None:
        """Same as :meth:`stop`."""
        self.stop()

    @property
    def started(self) -> bool:
        """Whether :meth:`start` was called (the fleet may have been stopped since)."""
        return self._state != "new"

    def __enter__(self) -> RayFleet:
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
        """``host:port`` of every actor, in worker-id order, asked of the Ray actors now.

        A Ray actor that Ray restarted reports its new server's address (this waits for
        it, up to ``start_timeout``).
        """
        return [host_port(host, port) for host, port, _, _ in self._ready(self.worker_ids)]

    def live_addresses(self, timeout: float = _LIVE_TIMEOUT) -> list[str]:
        """``host:port`` of the actors whose server answers within ``timeout``, as of now.

        What a collector given this fleet polls to follow it: an actor Ray is restarting
        is left out until its new server is ready, then listed at its new address (the
        collector moves that worker's link there). A stopped fleet has none.
        """
        import ray

        if self._state != "running" or not self._ray_up():
            return []
        refs = {h.ready.remote(self.start_timeout): w for w, h in self._handles.items()}
        done, _ = ray.wait(list(refs), num_returns=len(refs), timeout=timeout)
        live: dict[int, str] = {}
        for ref in done:
            with contextlib.suppress(ray.exceptions.RayError):
                host, port, _, _ = ray.get(ref, timeout=0)
                live[refs[ref]] = host_port(host, port)
        return [live[w] for w in sorted(live)]

    @property
    def pids(self) -> list[int]:
        """Process id of every actor server (on its node), in worker-id order."""
        return [server_pid for _, _, server_pid, _ in self._ready(self.worker_ids)]

    @property
    def ray_pids(self) -> list[int]:
        """Process id of every Ray actor (the server's parent), in worker-id order."""
        return [ray_pid for _, _, _, ray_pid in self._ready(self.worker_ids)]

    @property
    def actor_handles(self) -> dict[int, Any]:
        """The Ray actor handle of each worker id (for ``ray.util.state`` and fault tests)."""
        self._check_running()
        return dict(self._handles)

    def is_alive(self, worker_id: int) -> bool:
        """Whether the actor server with ``worker_id`` is running (False if unreachable)."""
        import ray

        if self._leased and not self._ray_up():
            return False  # gone with the script's ray.shutdown()
        self._check_running()
        try:
            return bool(ray.get(self._handles[worker_id].is_alive.remote(), timeout=_CALL_MARGIN))
        except (ray.exceptions.RayError, TimeoutError):
            return False

    def stderr_tail(self, worker_id: int, max_bytes: int = _TAIL_BYTES) -> str:
        """What the actor server last wrote on stderr (its log)."""
        import ray

        self._check_running()
        return str(
            ray.get(self._handles[worker_id].stderr_tail.remote(max_bytes), timeout=_CALL_MARGIN)
        )

    # ------------------------------------------------------------ internals

    def _ray_up(self) -> bool:
        """Whether Ray is up in the connection the actors were placed in (:func:`ray_session`)."""
        return self._session is not None and ray_session() == self._session

    def _init_ray(self) -> Any:
        with self._lock:
            self._check_running()  # not once another thread stopped the fleet
            ray = RayLease.acquire(self._ray_init_config)
            self._leased, self._session = True, ray_session()
        return ray

    def _place(self, worker_id: int, host: Any, args: list[Any]) -> None:
        """Create one Ray actor, the fleet's at once, unless another thread stopped the fleet."""
        with self._lock:
            self._check_running()
            self._handles[worker_id] = host.remote(*args, token=self.token)

    def _argv(self, worker_id: int) -> list[str]:
        argv = [self._python or "", "-m", "actor_service", *self._common_args]
        argv += ["--port", "0", "--worker-id", str(worker_id)]
        return argv + self._extra_args

    def _seed_of(self, worker_id: int) -> int | None:
        return None if self._seed is None else self._seed + worker_id

    def _ready(self, worker_ids: Sequence[int]) -> list[tuple[str, int, int, int]]:
        """Each actor's ``(host, port, server pid, Ray pid)``.

        An actor Ray is restarting is asked again until ``start_timeout`` (Ray answers
        "unavailable" meanwhile); one that died for good raises at once.
        """
        import ray

        self._check_running()
        deadline = time.monotonic() + self.start_timeout + _CALL_MARGIN
        while True:
            refs = [self._handles[w].ready.remote(self.start_timeout) for w in worker_ids]
            try:
                return list(ray.get(refs, timeout=max(0.0, deadline - time.monotonic())))
            except ray.exceptions.GetTimeoutError:
                raise DeadlineError(
                    f"Ray actors not placed and ready after {self.start_timeout:.1f}s "
                    f"(worker ids {list(worker_ids)}): does the cluster have the resources "
                    f"asked ({self.remote_configs})?"
                ) from None
            except ray.exceptions.RayTaskError as error:
                raise error.as_instanceof_cause() from None
            except ray.exceptions.ActorUnavailableError as error:  # restarting
                if time.monotonic() + _RESTART_POLL >= deadline:
                    raise ActorUnavailableError(
                        f"a Ray actor of worker ids {list(worker_ids)} was still restarting "
                        f"after {self.start_timeout:.1f}s: {error}"
                    ) from None
                time.sleep(_RESTART_POLL)
            except ray.exceptions.RayActorError as error:  # died, not to be restarted
                raise ActorUnavailableError(
                    f"a Ray actor of worker ids {list(worker_ids)} died: {error}"
                ) from None

    def _check_running(self) -> None:
        if self._state != "running":
            raise SessionStateError(
                f"the fleet is {self._state}; use it inside `with` or after start()"
            )
        if self._leased and not self._ray_up():
            raise SessionStateError(
                "Ray was shut down (ray.shutdown()) under this fleet: its actors are gone"
            )


def _await_death(ray: Any, handles: Sequence[Any], timeout: float) -> None:
    """Wait until every Ray actor of ``handles`` answers calls as dead (up to ``timeout``).

    ``ray.kill`` only asks: a call made just after it may still run on the actor, so
    :meth:`RayFleet.stop` returns once each actor refuses one.
    """
    deadline = time.monotonic() + timeout
    for handle in handles:
        while (left := deadline - time.monotonic()) > 0:
            try:
                ray.get(handle.is_alive.remote(), timeout=left)
            except (ray.exceptions.RayError, TimeoutError):  # dead, or no answer in time
                break
            time.sleep(_POLL_INTERVAL)


def _policy_factories(
    given: Callable[[], Any] | Sequence[Callable[[], Any]] | None,
    policy: Any,
    create_env_fn: Any,
    num_actors: int,
) -> list[Callable[[], Any] | None]:
    """TorchRL's ``policy_factory`` (called on each actor to build its policy), per actor."""
    if given is None:
        return [None] * num_actors
    if policy is not None:
        raise TypeError("policy_factory cannot be used with policy argument.")  # TorchRL's
    if create_env_fn is None:
        raise TypeError(
            "policy_factory builds the policy in the Ray actor's process: it goes with "
            "create_env_fn (the callable form); otherwise name a factory as policy="
        )
    return list(_per_actor("policy_factory", given, num_actors) or [])


def _kind_of(kind: str, callable_form: bool, policy_module: Any) -> str:
    """The actors' kind: ``torchrl`` in the callable form, where a policy module may go."""
    if callable_form:
        if kind == "llm":
            raise ValueError("create_env_fn builds TorchRL envs: it cannot serve kind 'llm'")
        return "torchrl"
    if policy_module is not None:
        raise TypeError(
            f"policy is a {type(policy_module).__name__}: a module object is shipped to the "
            "actors with create_env_fn only; otherwise name a factory "
            "('package.module:function')"
        )
    return kind


def _per_actor(
    name: str, given: Callable[..., Any] | Sequence[Callable[..., Any]] | None, num_actors: int
) -> list[Callable[..., Any]] | None:
    """One callable per actor, from one for every actor or a sequence of one per actor."""
    if given is None:
        return None
    listed = list(given) if isinstance(given, Sequence) else [given] * num_actors
    if len(listed) != num_actors:
        raise ValueError(
            f"{name} must be one callable or {num_actors} (one per actor), got {len(listed)}"
        )
    for fn in listed:
        if not callable(fn):
            raise TypeError(f"{name} must hold callables or TorchRL envs, got {fn!r:.60}")
    return listed


def _remote_configs(
    configs: Mapping[str, Any] | Sequence[Mapping[str, Any]] | None, num_actors: int
) -> list[dict[str, Any]]:
    """One dict of Ray actor options per actor, from one dict, one per actor, or none."""
    if configs is None:
        return [dict(_DEFAULT_REMOTE_CONFIG) for _ in range(num_actors)]
    if isinstance(configs, Mapping):
        return [dict(configs) for _ in range(num_actors)]
    if isinstance(configs, str | bytes) or not isinstance(configs, Sequence):
        raise TypeError(
            "remote_configs must be a dict of Ray actor options (e.g. {'num_cpus': 1}) or a "
            f"list of one per actor, got {type(configs).__name__}"
        )
    for config in configs:
        if not isinstance(config, Mapping):
            raise TypeError(
                "remote_configs must be a dict of Ray actor options or a list of dicts, one "
                f"per actor; it holds a {type(config).__name__}: {config!r:.60}"
            )
    listed = [dict(config) for config in configs]
    if len(listed) != num_actors:
        raise ValueError(
            f"remote_configs must be one dict or {num_actors} (one per actor), got {len(listed)}"
        )
    return listed


def check_ray_args(ray_init_config: object, host: object, python: object) -> None:
    """Refuse, before Ray starts, arguments whose type cannot be what they name."""
    if ray_init_config is not None and not isinstance(ray_init_config, Mapping):
        raise TypeError(
            "ray_init_config must be a dict of ray.init keyword arguments (e.g. "
            f"{{'address': 'auto'}}), got {type(ray_init_config).__name__}: "
            f"{ray_init_config!r:.60}"
        )
    for name, value in (("host", host), ("python", python)):
        if value is not None and (not isinstance(value, str) or not value):
            raise TypeError(f"{name} must be a non-empty str or None, got {value!r:.60}")


def _dialed_host(host: str, node_ip: str) -> str:
    """Where a learner dials a server bound to ``host``: a wildcard bind at its node's IP."""
    return node_ip if host in WILDCARD_HOSTS else host
