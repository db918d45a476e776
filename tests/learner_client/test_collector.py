"""GrpcCollector against real actor subprocesses: layouts, budgets, checks, lifecycle."""

from __future__ import annotations

import operator
import shutil
import socket
import subprocess
import sys
import threading
import time
from concurrent import futures

import grpc
import pytest
import torch
from grpc_health.v1 import health, health_pb2_grpc
from helpers import free_port, poll_until, self_signed_cert, start_actor
from learner_fleet import StuckBuffer, live_threads
from torchrl.data import LazyTensorStorage, ReplayBuffer

from common.errors import ActorUnavailableError, ClosedError, ProtocolError, SessionStateError
from learner_client import GrpcCollector, RemoteActor


def addresses(fleet, *worker_ids):
    return [fleet[w].address for w in worker_ids]


@pytest.mark.long
def test_collector_sync_stacks_workers_envs_time(fleet):
    with GrpcCollector(
        addresses(fleet, 0, 1, 2), frames_per_batch=12, total_frames=36, sync=True
    ) as collector:
        assert len(collector) == 3
        batches = list(collector)
        stats = collector.stats()
    assert len(batches) == 3
    for batch in batches:
        assert batch.batch_size == torch.Size([3, 2, 2])
        assert batch.names == [None, None, "time"]
        ids = batch["collector", "worker_id"]
        assert ids.dtype == torch.int64
        assert ids.shape == batch["collector", "traj_ids"].shape
        assert ids[:, 0, 0].tolist() == [0, 1, 2]
        assert batch["next", "policy_version"].dtype == torch.int64
        assert batch["action"].shape == torch.Size([3, 2, 2, 2])  # one-hot CartPole actions
    assert stats["frames"] == 36
    assert stats["batches"] == 3
    assert stats["completed"]
    assert stats["worker_frames"] == 36
    assert stats["gaps"] == 0
    assert stats["duplicates"] == 0


def test_collector_sync_cat_results_0_concatenates_on_dim_0(fleet):
    with GrpcCollector(
        addresses(fleet, 0, 2), frames_per_batch=8, total_frames=8, sync=True, cat_results=0
    ) as collector:
        (batch,) = list(collector)
    assert batch.batch_size == torch.Size([4, 2])
    assert batch.names == [None, "time"]
    assert batch["collector", "worker_id"][:, 0].tolist() == [0, 0, 2, 2]


def test_collector_sync_split_trajs_pads_and_concatenates_trajectories(fleet):
    with GrpcCollector(
        addresses(fleet, 0, 1, 2),
        frames_per_batch=24,
        total_frames=24,
        sync=True,
        split_trajs=True,
        max_frames_per_traj=3,
    ) as collector:
        (batch,) = list(collector)
    mask = batch["collector", "mask"]
    assert batch.batch_dims == 2
    assert batch.names == [None, "time"]
    assert int(mask.sum()) == 24  # padding is masked out
    assert batch.batch_size[-1] <= 3
    rows = batch["collector", "worker_id"][:, 0]
    assert rows.tolist() == sorted(rows.tolist())
    assert set(rows.tolist()) == {0, 1, 2}


def test_collector_split_trajs_counts_real_frames_and_keeps_batches_after_each_push(fleet):
    import gymnasium as gym

    from common.policies import make_policy

    env = gym.make("CartPole-v1")
    policy = make_policy("mlp", env.observation_space, env.action_space)
    with GrpcCollector(
        addresses(fleet, 0, 2),
        frames_per_batch=40,
        total_frames=200,
        sync=True,
        split_trajs=True,
        max_frames_per_traj=3,  # trajectories of 1-3 steps: every batch is padded
        batch_timeout=20,
    ) as collector:
        batches, pushed = [], []
        for batch in collector:
            batches.append(batch)
            collector.update_policy_weights_(policy)  # the next batch acts with it, or waits
            pushed.append(collector.policy_version)
        stats = collector.stats()
    assert len(batches) == len(collector) == 5  # frames are real frames, not padded ones
    for batch in batches:
        mask = batch["collector", "mask"]
        assert int(mask.sum()) == 40 < mask.numel()
    for batch, version in zip(batches[1:], pushed, strict=False):
        real = batch["policy_version"][batch["collector", "mask"]]
        assert real.unique().tolist() == [version]  # padding (version 0) does not count
    assert stats["frames"] == 200
    assert stats["discarded"] == 0


def test_collector_increment_version_is_torchrls_call_after_an_update(fleet):
    import gymnasium as gym

    from common.policies import make_policy

    env = gym.make("CartPole-v1")
    policy = make_policy("mlp", env.observation_space, env.action_space)
    with GrpcCollector(addresses(fleet, 0), frames_per_batch=8, policy=policy) as collector:
        collector.next()
        first = collector.get_policy_version()
        with torch.no_grad():
            next(policy.parameters()).add_(1.0)
        collector.update_policy_weights_()  # dreamer.py's pair: one push, not two
        assert collector.increment_version() == first + 1
        assert collector.increment_version() == first + 1  # nothing changed since
    weights = {k: v.clone() for k, v in policy.state_dict().items()}
    with GrpcCollector(addresses(fleet, 2), frames_per_batch=8) as collector:
        collector.update_policy_weights_(weights)
        pushed, sent = collector.get_policy_version(), collector.stats()["push_bytes"]
        # Push-then-increment (TorchRL's vLLM updaters) sends the weights once.
        assert collector.increment_version() == pushed
        assert collector.stats()["push_bytes"] == sent
        next(iter(weights.values())).add_(1.0)  # changed in place since: the increment pushes
        assert collector.increment_version() == pushed + 1
        assert collector.stats()["push_bytes"] > sent
        batch = collector.next()
        assert batch["policy_version"].min() >= pushed + 1
        # A state_dict() aliases the model: an optimiser step on the model shows.
        collector.update_policy_weights_(policy.state_dict())
        assert collector.increment_version() == pushed + 2
        with torch.no_grad():
            next(policy.parameters()).mul_(0.5)  # what an optimiser step does
        assert collector.increment_version() == pushed + 3
        collector.update_policy_weights_(worker_ids=[2])  # addressed pushes are not followed
        assert collector.increment_version() == pushed + 5


def test_collector_increment_version_follows_per_worker_weights_trained_in_place(fleet):
    """TorchRL's per-worker form ``{worker_id: weights}``: an argument-less push re-sends each
    worker its own, and training those in place is what ``increment_version`` pushes (it sent
    nothing: it followed the shared weights given before them)."""
    import gymnasium as gym

    from common.policies import make_policy

    env = gym.make("CartPole-v1")
    shared, own = (make_policy("mlp", env.observation_space, env.action_space) for _ in "ab")
    with GrpcCollector(addresses(fleet, 0, 2), frames_per_batch=8) as collector:
        collector.update_policy_weights_(shared)
        collector.update_policy_weights_({0: own, 2: own})
        collector.update_policy_weights_()  # each worker is re-sent its own
        version, sent = collector.get_policy_version(), collector.stats()["push_bytes"]
        with torch.no_grad():
            next(own.parameters()).add_(1.0)  # an optimiser step
        assert collector.increment_version() == version + 1
        assert collector.stats()["push_bytes"] > sent


def test_collector_passes_rollout_settings_to_the_actors(fleet):
    with GrpcCollector(
        addresses(fleet, 0),
        frames_per_batch=8,
        total_frames=8,
        set_truncated=True,
        max_frames_per_traj=3,
    ) as collector:
        (batch,) = list(collector)
    assert bool(batch["next", "truncated"][:, -1].all())  # set_truncated: last step of a batch
    assert int(batch["next", "step_count"].max()) <= 3


def test_collector_async_yields_single_actor_batches(fleet):
    with GrpcCollector(addresses(fleet, 0, 1, 2), frames_per_batch=8, total_frames=48) as c:
        batches = list(c)
        stats = c.stats()
    assert len(batches) == 6
    for batch in batches:
        assert batch.batch_size == torch.Size([2, 4])
        assert batch.names == [None, "time"]
        assert batch["collector", "worker_id"].unique().numel() == 1
    assert stats["frames"] == 48
    assert stats["worker_frames"] == 48


def test_collector_endless_iterates_until_broken_and_has_no_length(fleet):
    with GrpcCollector(addresses(fleet, 0), frames_per_batch=4) as collector:
        with pytest.raises(TypeError, match="endless"):
            len(collector)
        with pytest.raises(RuntimeError, match="endless"):  # TorchRL's scripts catch this
            bool(collector)
        assert operator.length_hint(collector, -1) == -1  # as list() and tqdm ask: no length
        for count, batch in enumerate(collector, start=1):
            assert batch.numel() == 4
            if count == 7:
                break
        assert collector.stats()["batches"] == 7
        assert "total_frames" not in collector.stats()


def test_collector_next_returns_none_at_the_end(fleet):
    with GrpcCollector(addresses(fleet, 2), frames_per_batch=4, total_frames=8) as collector:
        assert collector.next().batch_size == torch.Size([2, 2])
        assert collector.next() is not None
        assert collector.next() is None


def test_a_budget_between_two_batches_is_rounded_up_to_a_whole_batch(fleet):
    """TorchRL's rounding: total_frames=10 at 4 a batch collects 3 batches (12 frames)."""
    with pytest.warns(UserWarning, match="2 additional frames will be collected"):
        collector = GrpcCollector(addresses(fleet, 2), frames_per_batch=4, total_frames=10)
    with collector:
        assert len(collector) == 3
        assert [batch.numel() for batch in collector] == [4, 4, 4]


@pytest.mark.parametrize("way", ["next", "iterator"])
def test_collector_threads_sharing_it_take_turns_and_all_see_the_end(fleet, way):
    """Two threads calling next() (or each iterating) split the budget exactly; none fails
    with Python's "generator already executing" or waits batch_timeout past the end."""
    taken: list[int] = []
    errors: list[BaseException] = []

    def consume(collector):
        try:
            if way == "next":
                while (batch := collector.next()) is not None:
                    taken.append(batch.numel())
            else:
                taken.extend(batch.numel() for batch in collector)
        except BaseException as exc:
            errors.append(exc)

    with GrpcCollector(
        addresses(fleet, 0, 1), frames_per_batch=8, total_frames=8 * 24, sync=True,
        batch_timeout=30.0,
    ) as collector:  # fmt: skip
        started = time.monotonic()
        with futures.ThreadPoolExecutor(2) as pool:
            list(pool.map(consume, [collector, collector]))
        assert errors == []
        assert time.monotonic() - started < 25
        assert taken == [8] * 24
        assert collector.stats()["frames"] == 8 * 24


def test_collector_stats_read_beside_iteration_agree_with_themselves(fleet):
    """A logger thread's ``stats("both")`` while the script iterates:
    each snapshot's frames, batches and per-worker frames are of one instant."""
    torn: list[tuple[int, int, int]] = []
    done = threading.Event()

    def log(collector):
        while not done.is_set():
            stats = collector.stats("both")
            per_worker = stats["worker_0/frames"] + stats["worker_2/frames"]
            if not stats["frames"] == per_worker == stats["worker_frames"] == 4 * stats["batches"]:
                torn.append((stats["frames"], per_worker, stats["batches"]))

    with GrpcCollector(
        addresses(fleet, 0, 2), frames_per_batch=4, total_frames=4 * 300, batch_timeout=30.0
    ) as collector:
        logger = threading.Thread(target=log, args=(collector,))
        logger.start()
        try:
            taken = sum(1 for _ in collector)
        finally:
            done.set()
            logger.join()
        assert taken == 300
        assert torn == []


def test_collector_postproc_sees_every_batch(fleet):
    """As in TorchRL, keys the postproc names with ``_`` (its scratch) are dropped after it."""

    def mark(batch):
        batch["seen"] = torch.ones(batch.shape)
        batch["_scratch"] = torch.ones(batch.shape)
        batch["next", "_x"] = torch.ones(batch.shape)
        return batch

    with GrpcCollector(
        addresses(fleet, 0), frames_per_batch=4, total_frames=8, postproc=mark
    ) as collector:
        batches = list(collector)
    assert all(bool(b["seen"].all()) for b in batches)
    private = [k for b in batches for k in b.keys(True) if "_scratch" in k or "_x" in k]
    assert private == []


def test_collector_replay_buffer_start_pause_async_shutdown(fleet):
    rb = ReplayBuffer(storage=LazyTensorStorage(100_000))
    collector = GrpcCollector(addresses(fleet, 0, 2), frames_per_batch=4, replay_buffer=rb)
    try:
        collector.start()
        assert collector.is_running()
        poll_until(lambda: len(rb) >= 4, timeout=30, message="replay buffer filled")
        with collector.pause():
            held = len(rb)
            # Nothing may arrive while paused: no credits are out and nothing is handed over.
            assert all(s.outstanding == 0 for s in collector._mailbox.snapshot().values())
            time.sleep(0.3)
            assert len(rb) == held
        poll_until(lambda: len(rb) > held, timeout=30, message="collection resumed")
        with pytest.raises(ValueError, match="timeout"):  # checked before anything closes
            collector.async_shutdown(timeout=-1)
        assert collector.is_running()
    finally:
        collector.async_shutdown(timeout=10)
    assert not collector.is_running()
    with pytest.raises(ClosedError, match="shut down"):
        collector.start()
    assert not collector.is_running()
    assert collector.stats()["background_failed"] is False
    assert rb[0]["collector", "worker_id"].dtype == torch.int64


def test_collector_pause_without_resume_ends_the_background_thread_until_start(fleet):
    rb = ReplayBuffer(storage=LazyTensorStorage(100_000))
    with GrpcCollector(addresses(fleet, 0), frames_per_batch=4, replay_buffer=rb) as collector:
        collector.start()
        poll_until(lambda: len(rb) >= 4, timeout=30, message="replay buffer filled")
        with collector.pause(timeout=None, resume=False):
            held = len(rb)
        assert not collector.is_running()  # RayCollector.pause(resume=False): stays stopped
        time.sleep(0.5)
        assert len(rb) == held
        collector.start()
        poll_until(lambda: len(rb) > held, timeout=30, message="collection started again")
        assert collector.stats()["background_failed"] is False


def test_collector_start_while_collecting_keeps_one_background_thread(fleet):
    def collecting() -> list[threading.Thread]:
        return [t for t in threading.enumerate() if t.name == "rlfleet-collector"]

    rb = ReplayBuffer(storage=LazyTensorStorage(100_000))
    with GrpcCollector(addresses(fleet, 0), frames_per_batch=4, replay_buffer=rb) as collector:
        collector.start()
        collector.start()  # a no-op while it runs
        poll_until(lambda: len(rb) >= 4, timeout=30, message="replay buffer filled")
        assert len(collecting()) == 1
        with collector.pause(timeout=None, resume=False):
            pass
        assert not collector.is_running()
        assert collecting() == []


def test_a_background_thread_that_fails_says_so_in_stats(fleet, caplog):
    class FullBuffer(ReplayBuffer):
        def extend(self, *args, **kwargs):
            raise RuntimeError("the buffer is full")

    rb = FullBuffer(storage=LazyTensorStorage(100))
    with GrpcCollector(addresses(fleet, 0), frames_per_batch=4, replay_buffer=rb) as collector:
        collector.start()
        poll_until(lambda: not collector.is_running(), timeout=30, message="the thread runs on")
        assert collector.stats()["background_failed"] is True
    assert "the buffer is full" in caplog.text


def test_collector_pause_without_resume_and_no_thread_leaves_later_pauses_waiting(fleet):
    """No background thread: a later pause still makes other consumers wait, not spin."""
    with GrpcCollector(addresses(fleet, 0), frames_per_batch=4) as collector:
        with collector.pause(resume=False):
            pass
        got: list[tuple[int, float]] = []

        def consume() -> None:
            began = time.thread_time()
            got.append((collector.next().numel(), time.thread_time() - began))

        with collector.pause():
            consumer = threading.Thread(target=consume)
            consumer.start()
            time.sleep(1.0)
            assert got == []  # held by the pause
        consumer.join(30)
        assert len(got) == 1
        assert got[0][0] == 4
        assert got[0][1] < 0.5  # CPU seconds: it waited on the gate rather than spinning


def test_collector_pause_after_the_thread_ended_without_resume_leaves_other_consumers_waiting(
    fleet,
):
    """The background thread ended by ``pause(resume=False)``: in a later pause, a consumer
    in ``next()`` waits on the gate, asking for a batch once, rather than spinning."""
    rb = ReplayBuffer(storage=LazyTensorStorage(100_000))
    with GrpcCollector(addresses(fleet, 0), frames_per_batch=4, replay_buffer=rb) as collector:
        collector.start()
        poll_until(lambda: len(rb) >= 4, timeout=30, message="replay buffer filled")
        with collector.pause(timeout=None, resume=False):
            pass
        assert not collector.is_running()
        asked, next_batch = [], collector._next_batch

        def counted(*, per_actor: bool):
            asked.append(per_actor)
            return next_batch(per_actor=per_actor)

        collector._next_batch = counted
        with collector.pause():
            consumer = threading.Thread(target=collector.next)
            consumer.start()
            poll_until(lambda: asked, timeout=10, message="the consumer asked")
            time.sleep(0.5)
            during = len(asked)
        consumer.join(30)
        assert during == 1, f"the consumer asked {during} times during the pause"
        assert len(asked) == 2  # once more after it, which stored a batch


def test_collector_pause_raises_timeout_error_when_the_thread_stays_busy_storing(fleet):
    rb = StuckBuffer()
    with GrpcCollector(addresses(fleet, 0), frames_per_batch=4, replay_buffer=rb) as collector:
        collector.start()
        assert rb.entered.wait(30)
        began = time.monotonic()
        with pytest.raises(TimeoutError, match=r"did not park within 0\.5 s"), collector.pause(0.5):
            pass
        assert time.monotonic() - began < 5
        rb.release.set()
        poll_until(lambda: len(rb.inner) >= 8, timeout=30, message="not left paused")
        with collector.pause(timeout=30):  # the gate works again
            held = len(rb.inner)
            time.sleep(0.3)
            assert len(rb.inner) == held
        for bad, error in ((0, ValueError), (-1.0, ValueError), (float("nan"), ValueError)):
            with pytest.raises(error, match="timeout"), collector.pause(bad):
                pass
        with pytest.raises(TypeError, match="timeout"), collector.pause("30"):
            pass


def test_collector_pause_waits_for_the_thread_storing_while_another_consumer_waits(fleet):
    """A consumer in ``next()`` held by the pause is not the background thread: pause()
    entered as soon as that consumer waited, while the thread still stored its batch, and
    the replay buffer grew inside the pause."""
    rb = StuckBuffer()
    with GrpcCollector(addresses(fleet, 0), frames_per_batch=4, replay_buffer=rb) as collector:
        collector.start()
        assert rb.entered.wait(30)
        entered, leave, held = threading.Event(), threading.Event(), []

        def pause() -> None:
            with collector.pause(timeout=None):
                held.append(len(rb.inner))
                entered.set()
                leave.wait(30)
                held.append(len(rb.inner))

        pauser = threading.Thread(target=pause)
        pauser.start()
        poll_until(lambda: not collector._background._resumed.is_set(), timeout=10)
        consumer = threading.Thread(target=collector.next)
        consumer.start()
        entered_early = entered.wait(1.0)
        rb.release.set()
        assert entered.wait(30)
        time.sleep(0.3)
        leave.set()
        pauser.join(30)
        consumer.join(30)
        assert not entered_early, "pause() entered while the thread still stored its batch"
        assert held[0] == held[1] > 0  # the thread's batch was stored before the pause


def test_collector_pause_holds_iteration_and_refuses_to_deadlock(fleet):
    with GrpcCollector(addresses(fleet, 0), frames_per_batch=4) as collector:
        collector.next()
        with collector.pause():
            snapshot = collector._mailbox.snapshot()
            assert snapshot[0].outstanding == 0  # no credit outstanding while paused
            with pytest.raises(RuntimeError, match="inside pause"):
                collector.next()
            with pytest.raises(RuntimeError, match="already paused"), collector.pause():
                pass
        assert collector.next().numel() == 4


def test_collector_start_raises_if_there_is_no_replay_buffer(fleet):
    with (
        GrpcCollector(addresses(fleet, 0), frames_per_batch=4) as collector,
        pytest.raises(RuntimeError, match="replay_buffer"),
    ):
        collector.start()


def test_collector_iteration_with_a_replay_buffer_yields_none(fleet):
    rb = ReplayBuffer(storage=LazyTensorStorage(1000))
    with GrpcCollector(
        addresses(fleet, 0), frames_per_batch=4, total_frames=8, replay_buffer=rb
    ) as collector:
        assert list(collector) == [None, None]
    assert len(rb) == 4  # two [2, 2] batches: LazyTensorStorage keeps the env dim as items


def test_collector_raises_if_an_actor_is_unreachable():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        dead = f"127.0.0.1:{sock.getsockname()[1]}"
    start = time.monotonic()
    with pytest.raises(ActorUnavailableError, match=dead) as error:
        GrpcCollector([dead], frames_per_batch=4, connect_timeout=1.0)
    assert time.monotonic() - start < 8
    assert "Connection refused" in str(error.value)  # the reason, not only the deadline


def test_collector_names_hundreds_of_unreachable_actors_in_a_short_message():
    socks = [socket.socket() for _ in range(300)]
    for sock in socks:
        sock.bind(("127.0.0.1", 0))
    dead = [f"127.0.0.1:{sock.getsockname()[1]}" for sock in socks]
    for sock in socks:
        sock.close()
    with pytest.raises(ActorUnavailableError) as error:
        GrpcCollector(dead, frames_per_batch=300, connect_timeout=1.0)
    message = str(error.value)
    assert len(message) < 2000, len(message)
    assert message.startswith("300 actor(s) unreachable")
    assert "and 292 more" in message
    assert "Connection refused" in message
    assert dead[0] in message


#: A learner allowed 32 file descriptors, describing the actors named in argv: what it raised.
_LEARNER_OF_FEW_FDS = r"""
import resource, sys
resource.setrlimit(resource.RLIMIT_NOFILE, (32, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
from learner_client import GrpcCollector
try:
    GrpcCollector(sys.argv[1:], frames_per_batch=len(sys.argv) - 1, connect_timeout=2.0)
except Exception as exc:
    print(type(exc).__name__, exc)
"""


@pytest.mark.long
def test_collector_names_the_file_descriptor_limit_it_runs_out_of():
    """A learner of more actors than its ``ulimit -n`` allows connections used to say only
    that they were unreachable ("socket: Too many open files", in gRPC's words): the error
    names the limit and how to raise it."""
    listeners = [socket.create_server(("127.0.0.1", 0)) for _ in range(40)]
    try:
        names = [f"127.0.0.1:{sock.getsockname()[1]}" for sock in listeners]
        run = subprocess.run(
            [sys.executable, "-c", _LEARNER_OF_FEW_FDS, *names],
            capture_output=True,
            text=True,
            timeout=60,
        )
    finally:
        for sock in listeners:
            sock.close()
    assert run.stdout.startswith("ActorUnavailableError"), run.stdout + run.stderr
    assert "Too many open files" in run.stdout
    assert "all 32 file descriptors" in run.stdout
    assert "ulimit -n" in run.stdout
    assert "other reason" not in run.stdout  # one reason, not one per actor


def test_collector_says_a_grpc_server_that_is_no_actor_is_not_one():
    """A health-only gRPC server answers Describe UNIMPLEMENTED: named, not an INTERNAL."""
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    health_pb2_grpc.add_HealthServicer_to_server(health.HealthServicer(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        with pytest.raises(ProtocolError, match=r"not an rlfleet actor.*check the address"):
            GrpcCollector([f"127.0.0.1:{port}"], frames_per_batch=4, connect_timeout=5.0)
    finally:
        server.stop(None)


@pytest.mark.skipif(shutil.which("openssl") is None, reason="openssl not found")
def test_collector_says_when_it_and_the_actor_disagree_on_tls(tmp_path):
    """Plaintext to a TLS server reads "Socket closed", TLS to a plaintext one an SSL error."""
    cert, key = self_signed_cert(tmp_path, "server")
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    health_pb2_grpc.add_HealthServicer_to_server(health.HealthServicer(), server)
    pair = [(key.read_bytes(), cert.read_bytes())]
    tls_port = server.add_secure_port("127.0.0.1:0", grpc.ssl_server_credentials(pair))
    plain_port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    credentials = grpc.ssl_channel_credentials(root_certificates=cert.read_bytes())
    try:
        with pytest.raises(ActorUnavailableError, match=r"serves TLS.*channel_credentials="):
            GrpcCollector([f"127.0.0.1:{tls_port}"], frames_per_batch=4, connect_timeout=2.0)
        with pytest.raises(ActorUnavailableError, match=r"answers in plaintext.*--tls-cert"):
            GrpcCollector(
                [f"127.0.0.1:{plain_port}"],
                frames_per_batch=4,
                connect_timeout=2.0,
                channel_credentials=credentials,
            )
    finally:
        server.stop(None)


@pytest.mark.skipif(shutil.which("openssl") is None, reason="openssl not found")
def test_collector_says_an_actor_may_want_its_client_certificate(tmp_path):
    """An mTLS actor (``--tls-client-ca``) closes a TLS learner without a client certificate
    as "Socket closed": the error names the certificate to give."""
    cert, key = self_signed_cert(tmp_path, "server")
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    health_pb2_grpc.add_HealthServicer_to_server(health.HealthServicer(), server)
    server_credentials = grpc.ssl_server_credentials(
        [(key.read_bytes(), cert.read_bytes())],
        root_certificates=cert.read_bytes(),
        require_client_auth=True,
    )
    port = server.add_secure_port("127.0.0.1:0", server_credentials)
    server.start()
    credentials = grpc.ssl_channel_credentials(root_certificates=cert.read_bytes())
    try:
        with pytest.raises(ActorUnavailableError, match=r"client certificates.*certificate_chain"):
            GrpcCollector(
                [f"127.0.0.1:{port}"],
                frames_per_batch=4,
                connect_timeout=2.0,
                channel_credentials=credentials,
            )
    finally:
        server.stop(None)


def test_collector_raises_if_worker_ids_repeat(fleet):
    port = fleet[0].port
    expected = rf"worker_id 0 at \['127.0.0.1:{port}', 'localhost:{port}'\]"
    with pytest.raises(ValueError, match=expected):
        GrpcCollector([f"127.0.0.1:{port}", f"localhost:{port}"], frames_per_batch=4)


def test_collector_raises_if_frames_do_not_divide(fleet):
    with pytest.raises(ValueError, match="not divisible by 3"):
        GrpcCollector(addresses(fleet, 0, 1, 2), frames_per_batch=8, sync=True)
    with pytest.raises(ValueError, match="num_envs 2"):
        GrpcCollector(addresses(fleet, 0, 1), frames_per_batch=6, sync=True)
    with pytest.raises(ValueError, match="frames_per_batch=3"):
        GrpcCollector(addresses(fleet, 0), frames_per_batch=3)
    with pytest.raises(ValueError, match="frames_per_batch"):
        GrpcCollector(addresses(fleet, 0), frames_per_batch=0)


def test_collector_reports_its_fleet(fleet):
    with GrpcCollector(addresses(fleet, 2, 0), frames_per_batch=4) as collector:
        assert collector.worker_ids == [0, 2]
        assert collector.remote_collectors == [
            RemoteActor(fleet[0].address, 0),
            RemoteActor(fleet[2].address, 2),
        ]
        assert collector.policy_version >= 0


def test_collector_add_collectors_grows_an_async_fleet(fleet):
    with GrpcCollector(addresses(fleet, 0), frames_per_batch=4) as collector:
        collector.next()
        added = collector.add_collectors(addresses(fleet, 2))
        assert added == [RemoteActor(fleet[2].address, 2)]
        seen = set()
        for _ in range(40):
            seen.add(int(collector.next()["collector", "worker_id"][0, 0]))
            if seen == {0, 2}:
                break
        assert seen == {0, 2}
        with pytest.raises(ValueError, match="already in the fleet"):
            collector.add_collectors(addresses(fleet, 2))


def test_add_collectors_takes_the_forms_construction_takes(fleet):
    """A ``dns:`` target is resolved (it was dialled as one address) and entries stripped
    (`` 127.0.0.1:p `` was refused), as at construction."""
    port = fleet[1].address.rpartition(":")[2]
    with GrpcCollector(addresses(fleet, 0), frames_per_batch=4) as collector:
        added = collector.add_collectors([f"dns:///127.0.0.1:{port}"])
        assert added == [RemoteActor(fleet[1].address, 1)]
        added = collector.add_collectors([f" {fleet[2].address} "])
        assert added == [RemoteActor(fleet[2].address, 2)]


def test_batches_go_on_while_a_joiner_is_reached(fleet):
    """Reaching a newcomer takes up to connect_timeout (a dns: name may list one that is
    gone); the collector's batches do not wait for it."""
    with GrpcCollector(addresses(fleet, 0), frames_per_batch=4, connect_timeout=4) as collector:
        collector.next()
        failure: list[BaseException] = []

        def add_a_dead_one() -> None:
            try:
                collector.add_collectors([f"127.0.0.1:{free_port()}"])
            except BaseException as exc:
                failure.append(exc)

        adding = threading.Thread(target=add_a_dead_one)
        adding.start()
        time.sleep(0.5)  # the joiner is being reached
        started = time.monotonic()
        for _ in range(5):
            collector.next()
        took = time.monotonic() - started
        adding.join(timeout=30)
        assert took < 2.0, f"5 batches took {took:.1f} s while a joiner was reached"
        assert isinstance(failure[0], ActorUnavailableError)
        assert collector.worker_ids == [0]


def test_collector_add_collectors_resplits_a_sync_fleet(fleet):
    with GrpcCollector(addresses(fleet, 0), frames_per_batch=8, sync=True) as collector:
        assert collector.next().batch_size == torch.Size([1, 2, 4])
        collector.add_collectors(addresses(fleet, 2))
        batch = collector.next()
        assert batch.batch_size == torch.Size([2, 2, 2])
        assert batch["collector", "worker_id"][:, 0, 0].tolist() == [0, 2]


def test_a_sync_round_begun_while_an_actor_joins_never_meets_it_half_registered(fleet):
    """A sync round reads the fleet's worker_ids while ``add_collectors`` registers a joiner
    on another thread: a worker_id it sees has its place in the mailbox (the round takes
    the fleet as it was, or waits for the joiner; it never raises a KeyError)."""
    with GrpcCollector(addresses(fleet, 0), frames_per_batch=8, sync=True) as collector:
        collector.next()
        in_round, go_round = threading.Event(), threading.Event()
        joining, go_join = threading.Event(), threading.Event()
        take_parts, add_worker = collector._rounds.take_parts, collector._mailbox.add_worker

        def round_held(*args, **kwargs):  # the round, past the collector's lock
            in_round.set()
            assert go_round.wait(30)
            return take_parts(*args, **kwargs)

        def slot_held(*args, **kwargs):  # the joiner, being registered
            joining.set()
            assert go_join.wait(30)
            return add_worker(*args, **kwargs)

        collector._rounds.take_parts, collector._mailbox.add_worker = round_held, slot_held
        outcome: list[object] = []
        taking = threading.Thread(target=lambda: outcome.append(outcome_of(collector.next)))
        adding = threading.Thread(target=collector.add_collectors, args=(addresses(fleet, 2),))
        try:
            taking.start()
            assert in_round.wait(30)
            adding.start()
            assert joining.wait(30)
            go_round.set()
            poll_until(lambda: outcome or not taking.is_alive(), timeout=5)
        finally:
            go_round.set()
            go_join.set()
            taking.join(60)
            adding.join(60)
        assert not isinstance(outcome[0], BaseException), repr(outcome[0])
        assert collector.next()["collector", "worker_id"][:, 0, 0].tolist() == [0, 2]


def outcome_of(call):
    """``call()``'s result, or the exception it raised."""
    try:
        return call()
    except BaseException as exc:
        return exc


@pytest.mark.long
@pytest.mark.parametrize("layout", [{"cat_results": 0}, {"split_trajs": True}])
def test_an_actor_of_another_env_is_refused_where_the_layout_needs_one_env(fleet, layout):
    """cat_results=0 and split_trajs lay out one env's entries: another env's actor is
    refused when it joins (or at the start), and the fleet goes on; a lazy stack takes it.
    Spaces alike are one layout, whatever the env's name (CartPole-v0 beside CartPole-v1)."""
    acrobot = start_actor(["--worker-id", "3", "--num-envs", "2", "--env", "Acrobot-v1"])
    v0 = start_actor(["--worker-id", "4", "--num-envs", "2", "--env", "CartPole-v0"])
    try:
        with GrpcCollector(
            addresses(fleet, 0, 2), frames_per_batch=12, sync=True, **layout
        ) as collector:
            collector.next()
            with pytest.raises(ValueError, match=r"alike.*worker_id 3\) serves 'Acrobot-v1' with"):
                collector.add_collectors([acrobot.address])
            assert collector.worker_ids == [0, 2]
            assert collector.next()["collector", "worker_id"].unique().tolist() == [0, 2]
            collector.add_collectors([v0.address])
            assert collector.next()["collector", "worker_id"].unique().tolist() == [0, 2, 4]
        with pytest.raises(ValueError, match="Acrobot-v1"):
            GrpcCollector(
                [fleet[0].address, acrobot.address], frames_per_batch=12, sync=True, **layout
            )
        with GrpcCollector(addresses(fleet, 0, 2), frames_per_batch=12, sync=True) as stacking:
            stacking.add_collectors([acrobot.address])  # a lazy stack takes other envs
            assert stacking.worker_ids == [0, 2, 3]
    finally:
        acrobot.close()
        v0.close()


def test_collector_shutdown_is_idempotent_and_leaves_no_threads(fleet):
    with GrpcCollector(addresses(fleet, 0), frames_per_batch=4, total_frames=4) as warm:
        list(warm)  # gRPC's process-wide poller thread starts on first use
    baseline = live_threads()
    collector = GrpcCollector(addresses(fleet, 0, 2), frames_per_batch=4)
    collector.next()
    collector.shutdown(timeout=5)
    collector.shutdown(timeout=5)
    poll_until(lambda: live_threads() <= baseline, timeout=10, message="threads back to baseline")
    with pytest.raises(SessionStateError, match="shut down"):
        collector.next()
    with pytest.raises(SessionStateError, match="shut down"):
        collector.update_policy_weights_(weights={"w": torch.ones(1)})


def test_collector_raises_a_bug_on_the_event_loop_at_the_next_batch_instead_of_retrying(
    fleet, monkeypatch
):
    import learner_client._link as link_module

    calls = []

    def broken_tag_worker(batch, worker_id):
        calls.append(worker_id)
        raise KeyError(f"bug while tagging worker_id {worker_id}")

    # A programming error on the learner's loop thread while a real actor streams.
    monkeypatch.setattr(link_module, "tag_worker", broken_tag_worker)
    with GrpcCollector(addresses(fleet, 1), frames_per_batch=4, total_frames=-1) as collector:
        with pytest.raises(KeyError, match="bug while tagging worker_id 1") as info:
            collector.next()
        assert any("worker_id 1" in note for note in info.value.__notes__)
        stats = collector.stats()
        assert collector.worker_states == {1: "failed"}
        assert stats["reconnects"] == 0
        assert stats["failures"] == 0
        time.sleep(0.5)  # a retrying link would have called the broken code again by now
        assert calls == [1]
        assert collector.worker_states == {1: "failed"}


@pytest.mark.parametrize("timeout", [float("nan"), float("inf"), 0, -1])
def test_shutdown_refuses_a_bad_timeout_before_closing_anything(fleet, timeout):
    """NaN used to leave the actor's session open and the loop thread alive for good."""
    collector = GrpcCollector(addresses(fleet, 0), frames_per_batch=4, sync=True)
    with pytest.raises(ValueError, match="timeout"):
        collector.shutdown(timeout=timeout)
    assert collector.next().numel() == 4  # still open, whole
    collector.shutdown()
    with GrpcCollector(addresses(fleet, 0), frames_per_batch=4, sync=True) as after:
        assert after.next().numel() == 4  # the actor's session was released


def test_collector_increment_version_follows_shared_weights_again_after_per_worker_ones(fleet):
    """Shared weights are followed (``increment_version`` sends nothing while unchanged),
    per-worker weights are not, and shared weights given after them are followed again."""
    import gymnasium as gym

    from common.policies import make_policy

    env = gym.make("CartPole-v1")
    shared, own = (make_policy("mlp", env.observation_space, env.action_space) for _ in "ab")
    with GrpcCollector(addresses(fleet, 0, 2), frames_per_batch=8) as collector:
        collector.update_policy_weights_(shared)
        version, sent = collector.get_policy_version(), collector.stats()["push_bytes"]
        assert collector.increment_version() == version  # unchanged: nothing sent
        assert collector.stats()["push_bytes"] == sent
        collector.update_policy_weights_({0: own, 2: own})
        version = collector.get_policy_version()
        assert collector.increment_version() == version + 1  # per-worker: not followed
        collector.update_policy_weights_(shared)  # shared again: followed again
        version, sent = collector.get_policy_version(), collector.stats()["push_bytes"]
        assert collector.increment_version() == version
        assert collector.stats()["push_bytes"] == sent
