"""Pushes striped over parallel streams, against real actor processes.

With ``WeightPushSettings(streams=K)`` a full push of a large model to a remote actor travels
as up to K parts of its version, each on a TCP connection of its own; the actor applies the
version whole when the last part arrives. Each actor here gets exactly the pushed weights,
its audit log shows the parts arriving from distinct connections, and a push one of whose
parts is refused leaves the actor with the version before, whole.
"""

from __future__ import annotations

import json
import os
import re
import signal
import threading

import pytest
import torch
from learner_fleet import cartpole_policy, start_actors
from tcp_proxy import FaultProxy
from test_collector_relay import restart_actor, versions
from test_collector_shm import actor_policy, same_weights

from common.errors import WeightsTooLargeError
from learner_client import GrpcCollector, WeightPushError, WeightPushSettings

pytestmark = pytest.mark.long  # actor processes holding a 27 MB policy

#: Three 1500 x 1500 layers (9 MB each): a 27 MB policy, striped into three parts.
HIDDEN = (1500, 1500, 1500, 1500)
ARGS = ["--num-envs", "1", "--policy-kwargs", '{"hidden": [1500, 1500, 1500, 1500]}']
PREFIX = "models/policy/weights/"
STRIPED = WeightPushSettings(shared_memory=False, relay=False, streams=4)


@pytest.fixture
def actors():
    started = start_actors([["--worker-id", str(i), "--seed", str(i), *ARGS] for i in range(2)])
    yield started
    for actor in started:
        actor.close()


def push_peers(log: str, version: int) -> list[str]:
    """The peers of the actor's ``weights.push`` audit lines for ``version``, in order."""
    lines = [line for line in log.splitlines() if "weights.push" in line]
    return [
        re.search(r'peer="?([^" ]+)', line).group(1)  # type: ignore[union-attr]
        for line in lines
        if re.search(rf"\bversion={version}\b", line)
    ]


def test_a_striped_push_is_applied_whole_from_parts_on_their_own_connections(actors):
    addresses = [a.address for a in actors]
    with GrpcCollector(addresses, frames_per_batch=4, weight_push=STRIPED) as collector:
        policy = cartpole_policy(hidden=HIDDEN)
        version = collector.update_policy_weights_(policy)[0]
        assert collector.update_policy_weights_(policy)[0] == version + 1
        assert collector.stats()["striped_pushes"] == 4  # two pushes to two actors
        assert collector.stats()["relayed_pushes"] == 0
        for actor in actors:
            assert same_weights(actor_policy(actor.address), policy)
            assert versions(actor) == version + 1
        batch = collector.next()
        assert bool((batch["policy_version"] == version + 1).all())
    for actor in actors:
        peers = push_peers(actor.stderr(), version)
        assert len(peers) == 3, actor.stderr()[-3000:]
        assert len(set(peers)) == 3  # three TCP connections, one per part


def test_one_refused_part_leaves_the_version_before_whole(actors):
    addresses = [a.address for a in actors]
    with GrpcCollector(addresses, frames_per_batch=4, weight_push=STRIPED) as collector:
        old = cartpole_policy(hidden=HIDDEN)
        collector.update_policy_weights_(old)
        before = [versions(a) for a in actors]
        bad = cartpole_policy(hidden=HIDDEN)
        with torch.no_grad():  # only the first part holds a NaN: the others stage
            bad.state_dict()["module.0.module.1.weight"][0, 0] = float("nan")
        with pytest.raises(WeightPushError) as raised:
            collector.update_policy_weights_(bad)
        assert set(raised.value.failed) == {0, 1}
        for actor, version in zip(actors, before, strict=True):
            assert versions(actor) == version
            assert same_weights(actor_policy(actor.address), old)
        new = cartpole_policy(hidden=HIDDEN)  # the next version supersedes the staged parts
        version = collector.update_policy_weights_(new)[0]
        for actor in actors:
            assert versions(actor) == version
            assert same_weights(actor_policy(actor.address), new)


def test_the_weight_cap_refuses_a_striped_push_as_it_refuses_it_whole():
    # Each part was checked against --max-weight-bytes alone: 45 MB in parts passed a 32 MiB
    # cap that refuses the same push as one blob. The cap is on the bytes sent: the push in
    # bfloat16 (22.5 MB, still striped) passes it, as it would whole.
    hidden = [1500] * 6  # five 9 MB layers
    args = ["--num-envs", "1", "--policy-kwargs", json.dumps({"hidden": hidden})]
    capped = ["--max-weight-bytes", str(32 << 20)]
    started = start_actors([["--worker-id", "0", *args, *capped], ["--worker-id", "1", *args]])
    try:
        addresses = [a.address for a in started]
        with GrpcCollector(addresses, frames_per_batch=4, weight_push=STRIPED) as collector:
            policy = cartpole_policy(hidden=tuple(hidden))
            with pytest.raises(WeightPushError) as raised:
                collector.update_policy_weights_(policy)
            assert set(raised.value.failed) == {0}
            assert isinstance(raised.value.failed[0], WeightsTooLargeError)
            assert "exceeds the cap" in str(raised.value.failed[0])
            assert versions(started[0]) == 0
            assert not same_weights(actor_policy(started[0].address), policy)
            assert versions(started[1]) == 1  # the other applies it, as it would whole
            assert same_weights(actor_policy(started[1].address), policy)
            striped = collector.stats()["striped_pushes"]
            version = collector.update_policy_weights_(policy, dtype=torch.bfloat16)[0]
            assert collector.stats()["striped_pushes"] == striped + 2
            assert [versions(a) for a in started] == [version, version]
    finally:
        for actor in started:
            actor.close()


def test_a_subset_push_and_a_push_under_two_stripes_go_as_one_stream(actors):
    addresses = [a.address for a in actors]
    with GrpcCollector(addresses, frames_per_batch=4, weight_push=STRIPED) as collector:
        policy = cartpole_policy(hidden=HIDDEN)
        collector.update_policy_weights_(policy)
        assert collector.stats()["striped_pushes"] == 2
        some = {k: v for k, v in policy.state_dict().items() if ".module.3." in k}
        collector.update_policy_weights_(some)  # some keys: parts must hold every key
        collector.update_policy_weights_(policy, dtype=torch.bfloat16)  # 13.5 MB: one part
        assert collector.stats()["striped_pushes"] == 2
        rounded = {k: v.to(torch.bfloat16).float() for k, v in policy.state_dict().items()}
        for actor in actors:
            held = actor_policy(actor.address)
            assert all(torch.equal(held[PREFIX + k], v) for k, v in rounded.items())


def test_a_restarted_actor_is_sent_the_weights_striped(actors):
    addresses = [a.address for a in actors]
    with GrpcCollector(
        addresses, frames_per_batch=4, batch_timeout=30, weight_push=STRIPED
    ) as collector:
        policy = cartpole_policy(hidden=HIDDEN)
        version = collector.update_policy_weights_(policy)[0]
        collector.next()
        # Its first batch comes once it holds the weights, sent as the third striped push.
        restart_actor(actors, 1, ARGS, collector, lambda: collector.stats()["striped_pushes"] == 3)
        stats = collector.stats()
        assert stats["striped_pushes"] == 3  # one push to each, then the returning actor's
        assert stats["peer_catch_ups"] == 0
        assert versions(actors[1]) == version
        assert same_weights(actor_policy(actors[1].address), policy)


def test_an_actor_killed_mid_push_is_the_only_failure_and_the_other_applies(actors):
    addresses = [a.address for a in actors]
    with GrpcCollector(
        addresses, frames_per_batch=4, weight_push=STRIPED, call_timeout=8.0
    ) as collector:
        collector.update_policy_weights_(cartpole_policy(hidden=HIDDEN))
        before = versions(actors[0])
        os.kill(actors[1].process.pid, signal.SIGSTOP)  # frozen as its parts arrive
        threading.Timer(1.0, actors[1].kill).start()  # then dies with them half-sent
        new = cartpole_policy(hidden=HIDDEN)
        with pytest.raises(WeightPushError) as raised:
            collector.update_policy_weights_(new)
        assert set(raised.value.failed) == {1}
        assert set(raised.value.succeeded) == {0}
        assert versions(actors[0]) == before + 1
        assert same_weights(actor_policy(actors[0].address), new)


def test_a_striped_push_cut_off_partway_is_re_sent_whole_and_applies(actors, caplog):
    # One part's connection stalls past the call timeout: the parts before it stay staged
    # on the actor. The re-send of that version (the catch-up before the actor's next batch)
    # goes as one stream; striped again, its staged parts would be refused as replays.
    proxy = FaultProxy(("127.0.0.1", actors[0].port))
    proxy.stall_connection(2, after_bytes=1 << 20)  # 0: the session's; 1, 2: the extra stripes
    settings = WeightPushSettings(shared_memory=False, relay=False, streams=3)
    try:
        with GrpcCollector(
            [proxy.address], frames_per_batch=4, call_timeout=8.0, weight_push=settings
        ) as collector:
            policy = cartpole_policy(hidden=HIDDEN)
            with pytest.raises(WeightPushError):
                collector.update_policy_weights_(policy)
            assert versions(actors[0]) == 0
            proxy.release_stall()
            batch = collector.next()
            assert batch["policy_version"].unique().tolist() == [1]
            assert "rejected" not in caplog.text  # striped again: "rejected on re-admission"
            assert collector.stats()["striped_pushes"] == 1  # the re-send went whole
    finally:
        proxy.close()
    assert versions(actors[0]) == 1
    assert same_weights(actor_policy(actors[0].address), policy)


def test_a_large_delta_goes_as_one_stream_and_is_applied(actors):
    """A delta big enough for two parts (half of every tensor changed: 17 MB) is not striped:
    its parts would reach the actors as full pushes of delta bytes."""
    addresses = [a.address for a in actors]
    with GrpcCollector(addresses, frames_per_batch=4, weight_push=STRIPED) as collector:
        policy = cartpole_policy(hidden=HIDDEN)
        version = collector.update_policy_weights_(policy, delta=True)[0]
        striped = collector.stats()["striped_pushes"]
        with torch.no_grad():
            for param in policy.parameters():
                param.view(-1)[::2].add_(1.0)
        assert collector.update_policy_weights_(policy, delta=True) == {
            0: version + 1,
            1: version + 1,
        }
        stats = collector.stats()
        assert stats["last_push_bytes"] > 16 << 20
        assert (stats["delta_pushes"], stats["striped_pushes"]) == (2, striped)
        for actor in actors:
            assert same_weights(actor_policy(actor.address), policy)
