"""Data-parallel reference learners: several learner ranks, one fleet split between them.

``rlfleet-train --nproc-per-node N`` and ``rlfleet-grpo --nproc-per-node N`` re-run
themselves under ``torch.distributed.run`` (torchrun, standalone c10d rendezvous on this
machine): :func:`launch_ranks`. Under torchrun (``torchrun --nproc-per-node N -m apps.ppo
...``, or many machines with ``--rdzv-backend c10d``) each rank joins the process group
(:class:`DataParallel`): gloo on the CPU, NCCL when the learner runs on CUDA
(``--learner-device cuda``: each rank on ``cuda:LOCAL_RANK``, :mod:`apps._job.device`). Every rank:

* owns the actors with ``worker_id % N == rank`` (``GrpcCollector(rank=, world_size=)``);
  without ``--actors`` it starts its own share of the local fleet (worker_ids ``rank,
  rank + N, ...``), so no rank waits for another's actors and each share dies with its rank;
* trains on its own batches, DDP averaging the gradients, so every rank holds the same
  weights after each step;
* pushes them under one agreed version, ``base + 1 + steps`` where ``base`` is the highest
  version any actor held at the start (so a restarted job never pushes a stale one);
* stops when every rank does (the decision is taken together).
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import signal
import sys
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import TypeVar

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from apps._job.cli import EXIT_ERROR, EXIT_INTERRUPTED, EXIT_OK, RankLostError, SignalsHeld
from apps._job.device import rank_device

__all__ = ["DataParallel", "job_ranks", "launch_ranks", "under_torchrun"]

#: Seconds a collective may wait for the slowest rank (a rank collecting its first batch).
_TIMEOUT = datetime.timedelta(seconds=300)
# What a signalled rank brings to the agreement to stop (a done rank brings 1).
_SIGNALLED = 2


def under_torchrun() -> bool:
    """Whether this process is one rank of a torchrun job (its variables are set)."""
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


def job_ranks(nproc_per_node: int) -> int:
    """The job's learner ranks: torchrun's ``WORLD_SIZE`` under it, else ``nproc_per_node``.

    ``torchrun --nproc-per-node N -m apps.grpo`` (no ``--nproc-per-node`` flag of ours) runs N
    ranks all the same: the fleet is split over them, not over the flag's default of 1.
    """
    world_size = os.environ.get("WORLD_SIZE", "")
    if under_torchrun() and world_size.isdigit() and int(world_size) > 0:
        return int(world_size)
    return nproc_per_node


def launch_ranks(prog: str, module: str, nproc_per_node: int, argv: Sequence[str]) -> int:
    """Run ``python -m MODULE ARGV`` as ``nproc_per_node`` ranks under torchrun.

    Args:
        prog: The program name that prefixes the error message (``rlfleet-train``).
        module: The learner's package (``apps.ppo``).
        nproc_per_node: Ranks to start on this machine.
        argv: The learner's arguments.

    Returns:
        0 when every rank finished; 130 when interrupted (SIGINT, SIGTERM); 1 when a rank
        failed (its own message is above; this names it).
    """
    from torch.distributed import run as torchrun
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

    # Every rank is on this machine: they meet on loopback, whatever the host name resolves to.
    args = ["--standalone", f"--nproc-per-node={nproc_per_node}", "--local-addr=127.0.0.1"]
    args += ["-m", module, *argv]
    # torchrun's own default for several ranks a machine, set here so it prints no banner.
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    try:
        torchrun.main(args)
    except SignalException:  # torchrun stopped the ranks on SIGINT or SIGTERM
        print(f"{prog}: interrupted", file=sys.stderr, flush=True)
        return EXIT_INTERRUPTED
    except ChildFailedError as exc:
        rank, failure = exc.get_first_failure()
        if failure.exitcode == EXIT_INTERRUPTED:
            print(f"{prog}: interrupted", file=sys.stderr, flush=True)
            return EXIT_INTERRUPTED
        print(f"{prog}: error: learner rank {rank} {_failure(failure.exitcode)}", file=sys.stderr)
        return EXIT_ERROR
    return EXIT_OK


def _failure(exitcode: int) -> str:
    """How a rank ended: killed by a signal (no message of its own), or its exit code."""
    if exitcode < 0:
        try:
            name = signal.Signals(-exitcode).name
        except ValueError:
            name = f"signal {-exitcode}"
        return f"was killed by {name} (it wrote no message)"
    return f"exited with code {exitcode} (its message is above)"


@contextlib.contextmanager
def _with_peers() -> Iterator[None]:
    """A collective of this module: a transport failure is :class:`RankLostError`.

    The shapes and dtypes are the same on every rank, so what fails is the other ranks: one
    that failed or was killed closed its connections ("Connection closed by peer"), or one
    that hangs let the process group's timeout pass.
    """
    try:
        yield
    except RuntimeError as exc:
        detail = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise RankLostError(
            f"another learner rank failed or left (its message is above): {detail:.300}"
        ) from None


#: A batch, as the loop's collector yields it.
B = TypeVar("B")


class DataParallel:
    """This process's place in a torchrun job, and the few collectives the loops need.

    Outside torchrun (or with one rank) it is rank 0 of 1 and every method is local.

    Args:
        learner_device: ``--learner-device`` (checked by the settings): ``cuda`` puts this
            rank on ``cuda:LOCAL_RANK`` and the ranks on NCCL; ``cpu`` on gloo.
    """

    def __init__(self, learner_device: str = "cpu") -> None:
        self.rank = int(os.environ.get("RANK", "0")) if under_torchrun() else 0
        self.world_size = int(os.environ.get("WORLD_SIZE", "1")) if under_torchrun() else 1
        #: This rank's index on its machine (torchrun's ``LOCAL_RANK``).
        self.local_rank = int(os.environ.get("LOCAL_RANK", "0")) if under_torchrun() else 0
        #: Where this rank's model, optimiser and batches live.
        self.device = rank_device(learner_device, self.local_rank)
        #: The process group's backend: NCCL between GPUs, gloo between CPUs.
        self.backend = "nccl" if self.device.type == "cuda" else "gloo"
        #: The collector's ``learner_id``: torchrun's run id, the same across a rank's
        #: restarts, so a restarted rank resumes the sessions its last process left open
        #: (empty outside torchrun: a unique one).
        self.learner_id = os.environ.get("TORCHELASTIC_RUN_ID", "") if under_torchrun() else ""
        self._started = False
        self._stopped_together = False  # by :meth:`run_together`'s agreement

    @property
    def active(self) -> bool:
        """Whether several ranks train together."""
        return self.world_size > 1

    def __enter__(self) -> DataParallel:
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)  # NCCL and DDP work on the current device
        if self.active and not dist.is_initialized():
            device_id = self.device if self.device.type == "cuda" else None
            dist.init_process_group(self.backend, timeout=_TIMEOUT, device_id=device_id)
            self._started = True
        return self

    def __exit__(self, *exc_info: object) -> None:
        if not self._started:
            return
        if self._stopped_together:
            # Every rank leaves after rank 0 wrote the outputs (or failed to, with its own
            # message): torchrun stops the ranks left (SIGTERM) once one exits, which would
            # cut rank 0's outputs short. A peer already gone failed on its own.
            with contextlib.suppress(RuntimeError):
                dist.barrier()
        dist.destroy_process_group()
        self._started = False

    def wrap(self, module: nn.Module) -> nn.Module:
        """``module`` (on :attr:`device`) in DDP when several ranks train together, else itself.

        DDP makes every rank start from rank 0's weights and averages each gradient.
        """
        if not self.active:
            return module
        device_ids = [self.device] if self.device.type == "cuda" else None
        return DistributedDataParallel(module, device_ids=device_ids)

    def worker_ids(self, num_actors: int) -> list[int]:
        """The worker_ids of this rank's share of a local fleet of ``num_actors`` actors."""
        return list(range(self.rank, num_actors, self.world_size))

    def agreed_max(self, value: int) -> int:
        """The largest ``value`` over the ranks."""
        if not self.active:
            return value
        tensor = torch.tensor([value], dtype=torch.int64, device=self.device)
        with _with_peers():
            dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
        return int(tensor.item())

    def run_together(
        self, batches: Iterable[B], step: Callable[[B], bool], signals: SignalsHeld
    ) -> None:
        """Call ``step`` on each batch until it returns True; every rank stops after the same one.

        With one rank a signal raises KeyboardInterrupt between two steps (at once while
        waiting for a batch). With several, a signal waits out the rank's batch, step and the
        ranks' agreement on whether any was signalled (KeyboardInterrupt on every rank) or is
        done: a rank that stopped alone (while waiting for its batch, or agreeing) left the
        others in the next step's all-reduce, which failed with "Connection closed by peer".
        The ranks then also leave together (:meth:`__exit__`).
        """
        if not self.active:
            for batch in batches:
                with signals.held():
                    if step(batch):
                        return
            return
        remaining = iter(batches)
        # A signal is read at each agreement, never raised on one rank alone: one that comes
        # during the last agreement (every rank done) is let go, the ranks stop as agreed.
        with signals.held(raise_after=False):
            while True:
                done = _step_next(remaining, step)
                agreed = self.agreed_max(_SIGNALLED if signals.pending is not None else int(done))
                self._stopped_together = agreed > 0
                if agreed == _SIGNALLED:
                    raise KeyboardInterrupt("a rank was signalled")
                if agreed:
                    return

    @contextlib.contextmanager
    def collective_after_stop(self) -> Iterator[None]:
        """A collective after :meth:`run_together`'s agreed stop (a last evaluation).

        If it raises on this rank, the others may wait in it, not in the last barrier: this
        rank then leaves without the barrier (a barrier against their collective would hang
        both until the process group's timeout), and they fail on its closed connection.
        """
        try:
            yield
        except BaseException:
            self._stopped_together = False
            raise

    def gather_strings(self, values: Sequence[str]) -> list[str]:
        """Every rank's ``values``, in rank order (a rank's actor addresses, to reach them all).

        The strings travel as UTF-8 JSON in tensors (never pickled).
        """
        if not self.active:
            return list(values)
        data = torch.tensor(list(json.dumps(list(values)).encode()), dtype=torch.uint8)
        size = self.agreed_max(data.numel())
        padded = torch.zeros(size, dtype=torch.uint8, device=self.device)
        padded[: data.numel()] = data.to(self.device)
        gathered = [torch.empty_like(padded) for _ in range(self.world_size)]
        with _with_peers():
            dist.all_gather(gathered, padded)
        out: list[str] = []
        for tensor in gathered:
            out += json.loads(bytes(tensor.cpu().tolist()).rstrip(b"\0").decode())
        return out

    def any(self, flag: bool) -> bool:
        """Whether ``flag`` holds on some rank (a decision every rank then takes)."""
        return bool(self.agreed_max(int(flag)))

    def mean_and_all(self, value: float | None, flag: bool) -> tuple[float | None, bool]:
        """The mean of ``value`` over the ranks (None if any has none) and whether all flag."""
        if not self.active:
            return value, flag
        tensor = torch.tensor(
            [0.0 if value is None else value, value is None, not flag],
            dtype=torch.float64,
            device=self.device,
        )
        with _with_peers():
            dist.all_reduce(tensor)
        total, missing, unflagged = tensor.tolist()
        mean = None if missing else total / self.world_size
        return mean, not unflagged


def _step_next(batches: Iterator[B], step: Callable[[B], bool]) -> bool:
    """``step`` on the next batch; True when it says so or there is none."""
    try:
        batch = next(batches)
    except StopIteration:
        return True
    return step(batch)
