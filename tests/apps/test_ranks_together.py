"""Two learner ranks (gloo on loopback, real processes) stop together after a signal to one.

Each rank runs :meth:`DataParallel.run_together` over batches whose step all-reduces, as
DDP's does. Rank 1 is sent SIGTERM while it waits for a batch: it must not leave alone
(rank 0 would fail in the step's all-reduce, "Connection closed by peer"); both stop
after the same step, and rank 1 leaves only once rank 0 wrote its outputs.
"""

from __future__ import annotations

import json
import os
import pathlib
import socket
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]

_RANK = """
import json, os, signal, sys, time
import torch, torch.distributed as dist
from apps._job.cli import SignalsHeld
from apps._job.ranks import DataParallel

signal_at, steps, record = int(sys.argv[1]), [], {}

def batches():
    for index in range(1000):
        if ranks.rank == 1 and index == signal_at:  # signalled while its batch is coming
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.2)
        yield index

def step(index):
    total = torch.ones(1)
    dist.all_reduce(total)  # every rank steps together, as in DDP's backward
    steps.append(index)
    return False

with DataParallel() as ranks:
    try:
        with SignalsHeld("test") as signals:
            ranks.run_together(batches(), step, signals)
    except KeyboardInterrupt:
        record["interrupted_after"] = steps[-1]
    if ranks.rank == 0:  # the outputs take a while to write
        time.sleep(2.0)
        record["written_at"] = time.time()
record["left_at"] = time.time()
print(json.dumps(record))
"""


# Both ranks finish after step 2; rank 0's last evaluation then fails while rank 1 waits in it.
_FAILING_LAST_COLLECTIVE = """
import sys
import torch, torch.distributed as dist
from apps._job.cli import SignalsHeld
from apps._job.ranks import DataParallel

with DataParallel() as ranks:
    with SignalsHeld("test") as signals:
        ranks.run_together(range(1000), lambda index: index == 2, signals)
    with ranks.collective_after_stop():
        if ranks.rank == 0:
            raise RuntimeError("the last evaluation failed")
        dist.all_reduce(torch.ones(1))
"""


# Rank 1's step fails (its actor gone) while rank 0 waits for it in the step's agreement.
_FAILING_PEER = """
import sys
from apps._job.cli import SignalsHeld, run_job
from apps._job.ranks import DataParallel

class Done:
    def to_text(self):
        return "done"

def train(settings):
    with DataParallel() as ranks:
        def step(index):
            if ranks.rank == 1 and index == 2:
                raise OSError("rank 1 lost its actor")
            return False

        with SignalsHeld("test") as signals:
            ranks.run_together(range(1000), step, signals)
    return Done()

sys.exit(run_job("test", None, train, (OSError,)))
"""


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _run_ranks(script: str, *args: str, timeout: float) -> tuple[list, list[tuple[str, str]]]:
    """Two ranks running ``script``: the processes and their (stdout, stderr)."""
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_free_port())}
    env |= {"WORLD_SIZE": "2", "PYTHONPATH": str(ROOT)}
    ranks = [
        subprocess.Popen(
            [sys.executable, "-c", script, *args],
            env=env | {"RANK": str(rank), "LOCAL_RANK": str(rank)},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for rank in (0, 1)
    ]
    try:
        return ranks, [rank.communicate(timeout=timeout) for rank in ranks]
    finally:
        for rank in ranks:
            rank.kill()


def test_a_signal_to_one_rank_waiting_for_its_batch_stops_both_after_the_same_step() -> None:
    ranks, outputs = _run_ranks(_RANK, "3", timeout=120)
    for rank, (_, err) in zip(ranks, outputs, strict=True):
        assert rank.returncode == 0, err[-3000:]
    assert "test: stopping after this update" in outputs[1][1]  # rank 1 held its signal
    rank0, rank1 = (json.loads(out.splitlines()[-1]) for out, _ in outputs)
    # Rank 1 waited out its batch (index 3) and its step: both stopped after it.
    assert rank0["interrupted_after"] == rank1["interrupted_after"] == 3
    assert rank1["left_at"] >= rank0["written_at"]  # torchrun would have cut rank 0 short


def test_a_last_collective_failing_on_one_rank_ends_both_without_waiting_in_a_barrier() -> None:
    """Rank 0 must not wait in the last barrier while rank 1 waits in the failed collective:
    both would hang until the process group's timeout (300 s)."""
    ranks, outputs = _run_ranks(_FAILING_LAST_COLLECTIVE, timeout=60)
    assert [rank.returncode for rank in ranks] == [1, 1]
    assert "RuntimeError: the last evaluation failed" in outputs[0][1]


def test_a_rank_whose_peer_failed_ends_with_one_line_and_exit_1() -> None:
    ranks, outputs = _run_ranks(_FAILING_PEER, timeout=60)
    assert [rank.returncode for rank in ranks] == [1, 1]
    assert outputs[1][1].strip() == "test: error: rank 1 lost its actor"
    # Rank 0 names what happened in one line, not with gloo's traceback.
    lines = outputs[0][1].strip().splitlines()
    assert len(lines) == 1, outputs[0][1][-3000:]
    assert lines[0].startswith("test: error: another learner rank failed or left"), lines
