"""Resident memory and CPU time of processes, read from ``/proc`` (Linux), for the benchmarks."""

from __future__ import annotations

import math
import os

__all__ = ["cpu_seconds", "descendants", "rss_mb"]

_TICKS = os.sysconf("SC_CLK_TCK")


def rss_mb(pid: int) -> float:
    """Resident set size of ``pid`` in MB (10**6 bytes); NaN when it is gone or unreadable."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024 / 1e6
    except (OSError, ValueError):
        pass
    return math.nan


def descendants(pid: int) -> list[int]:
    """Every live descendant of ``pid`` (children first), from ``/proc/<pid>/task/*/children``."""
    found: list[int] = []
    frontier = [pid]
    while frontier:
        current = frontier.pop()
        try:
            tasks = os.listdir(f"/proc/{current}/task")
        except OSError:
            continue
        for tid in tasks:
            try:
                with open(f"/proc/{current}/task/{tid}/children") as f:
                    kids = [int(k) for k in f.read().split()]
            except (OSError, ValueError):
                continue
            found.extend(kids)
            frontier.extend(kids)
    return found


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of ``pid`` and its live descendants so far."""
    total = 0
    for each in (pid, *descendants(pid)):
        try:
            with open(f"/proc/{each}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])  # utime, stime
        except (OSError, ValueError, IndexError):
            continue
    return total / _TICKS
